/* tokenizer_internal — the private shape of a loaded tokenizer, shared by tokenizer_load.c
 * (tokenizer.json -> these structs, with tokenizer_pipeline.c for the pipeline components),
 * tokenizer_tables.c (UTF-8, byte alphabet, hash maps), tokenizer_encode.c (text -> ids) and
 * tokenizer_decode.c (ids -> text, streaming detokenizer). Nothing outside src/text/tokenizer*.c
 * includes this.
 *
 * Only the pieces of the Hugging Face pipeline that real LLM tokenizers use are modelled:
 * a BPE model, and the normalizer / pre-tokenizer / decoder / post-processor kinds listed in
 * the enums below. Anything else is refused at load time with an error naming it. */
#ifndef EXO_TEXT_TOKENIZER_INTERNAL_H
#define EXO_TEXT_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* Upper bound on ids and vocabulary entries accepted from a file (real vocabularies are
 * < 300k); keeps a hostile file from making us allocate gigabytes. */
#define TOK_MAX_ID (1 << 24)

/* ---- string -> id hash map (open addressing; keys live in the owner's string table) ---- */
typedef struct tok_strmap_slot {
    int32_t id;    /* -1 when empty */
    uint32_t hash; /* low bits of the key's hash: most mismatches never touch the string */
} tok_strmap_slot;

typedef struct tok_strmap {
    tok_strmap_slot *slots;
    uint32_t mask;  /* capacity - 1 (power of two) */
    uint32_t count;
} tok_strmap;

/* A string table: id -> bytes. Strings are NUL-terminated copies. */
typedef struct tok_strtab {
    char **str;    /* [n] NULL for holes */
    uint32_t *len; /* [n] */
    int32_t n;
} tok_strtab;

/* ---- (left id, right id) -> merge map for BPE ---- */
typedef struct tok_merge_entry {
    uint64_t key; /* (left << 32) | right; UINT64_MAX when empty */
    int32_t rank;
    int32_t result;
} tok_merge_entry;

typedef struct tok_mergemap {
    tok_merge_entry *slots;
    uint64_t mask;
    size_t count;
} tok_mergemap;

/* ---- added tokens and the byte trie used to find them in text ---- */
typedef struct tok_added {
    char *content;
    uint32_t len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added;

typedef struct tok_trie_node {
    int32_t first_child; /* node index or -1 */
    int32_t next_sibling;
    int32_t added; /* index into added[], or -1 */
    uint8_t byte;
} tok_trie_node;

typedef struct tok_trie {
    tok_trie_node *nodes; /* node 0 is the root */
    int32_t n, cap;
    int32_t root[256]; /* child of the root for each first byte, or -1 (filled after building) */
} tok_trie;

/* ---- pipeline components ---- */
enum tok_pattern_kind { TOK_PATTERN_STRING, TOK_PATTERN_REGEX };
typedef struct tok_pattern {
    enum tok_pattern_kind kind;
    char *str; /* the literal, or the regex source as written in the file */
    size_t len;
    pcre2_code *re; /* TOK_PATTERN_REGEX */
} tok_pattern;

enum tok_norm_kind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_REPLACE,
    TOK_NORM_PREPEND,
    TOK_NORM_STRIP,
    TOK_NORM_STRIP_ACCENTS,
};
typedef struct tok_normalizer {
    enum tok_norm_kind kind;
    tok_pattern pattern; /* REPLACE */
    char *content;       /* REPLACE content, PREPEND text */
    size_t content_len;
    uint8_t strip_left, strip_right;
} tok_normalizer;

enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};
enum tok_pre_kind {
    TOK_PRE_SPLIT,
    TOK_PRE_BYTE_LEVEL,
    TOK_PRE_METASPACE,
    TOK_PRE_DIGITS,
    TOK_PRE_PUNCTUATION,
    TOK_PRE_WHITESPACE_SPLIT,
    TOK_PRE_WHITESPACE,
};
enum tok_prepend_scheme { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };
typedef struct tok_pretokenizer {
    enum tok_pre_kind kind;
    tok_pattern pattern; /* SPLIT (and WHITESPACE, BYTE_LEVEL use_regex: compiled regex) */
    enum tok_split_behavior behavior;
    uint8_t invert;
    uint8_t add_prefix_space; /* BYTE_LEVEL */
    uint8_t use_regex;        /* BYTE_LEVEL */
    uint8_t individual_digits;
    uint8_t split;                     /* METASPACE */
    enum tok_prepend_scheme prepend;   /* METASPACE */
    char replacement[8];               /* METASPACE: UTF-8 of the replacement char */
    uint8_t replacement_len;
} tok_pretokenizer;

enum tok_dec_kind {
    TOK_DEC_BYTE_LEVEL,
    TOK_DEC_BYTE_FALLBACK,
    TOK_DEC_METASPACE,
    TOK_DEC_REPLACE,
    TOK_DEC_STRIP,
    TOK_DEC_FUSE,
};
typedef struct tok_decoder {
    enum tok_dec_kind kind;
    tok_pattern pattern; /* REPLACE */
    char *content;       /* REPLACE content; STRIP char (UTF-8) */
    size_t content_len;
    int start, stop;                 /* STRIP */
    char replacement[8];             /* METASPACE */
    uint8_t replacement_len;
    enum tok_prepend_scheme prepend; /* METASPACE */
} tok_decoder;

struct tokenizer {
    /* model (BPE) */
    tok_strtab vocab; /* model vocabulary, id -> string (strings live in vocab_arena) */
    char *vocab_arena;
    tok_strmap vocab_map;
    tok_mergemap merges;
    int32_t unk_id; /* -1 when none */
    uint8_t byte_fallback, fuse_unk, ignore_merges;
    char *continuing_subword_prefix, *end_of_word_suffix;
    int32_t byte_token[256]; /* id of "<0xXX>" or -1 (byte fallback) */
    /* SentencePiece-style vocabularies (a "\u2581" token exists): no merge can span the point
     * before a U+2581 that follows a char c unless some token contains c + U+2581. Such c are
     * listed here (sorted); BPE then works on the space-separated chunks of a long text
     * independently, with identical results. */
    uint8_t meta_split;
    int32_t *meta_blockers;
    int n_meta_blockers;

    /* added tokens */
    tok_added *added;
    int n_added;
    tok_strmap added_map;      /* content -> index in added[] (stored as index) */
    tok_trie trie_raw;         /* normalized == false: matched in the raw text */
    tok_trie trie_norm;        /* normalized == true: matched after normalization */
    int32_t *added_by_id;      /* [id_table_size] index in added[] or -1 */
    int32_t id_table_size;     /* max id + 1 over vocab and added tokens */

    tok_normalizer *norms;
    int n_norms;
    tok_pretokenizer *pres;
    int n_pres;
    tok_decoder *decs;
    int n_decs;
    uint8_t has_decoder;

    /* post-processor for a single sequence: ids before and after the text */
    int32_t *post_prefix, *post_suffix;
    int n_post_prefix, n_post_suffix;

    /* tokenizer_config.json */
    char *bos_token, *eos_token, *chat_template;
};

/* ---- UTF-8 helpers ---- */
/* Decodes one code point at s[0..n); returns it and sets *adv, or returns -1 (adv = 1) on
 * an invalid or truncated sequence. */
int32_t tok_utf8_decode(const uint8_t *s, size_t n, size_t *adv);
int tok_utf8_encode(uint32_t cp, char out[4]);
/* Length of the maximal invalid subpart at s (Unicode "maximal subpart" rule), >= 1. */
size_t tok_utf8_invalid_len(const uint8_t *s, size_t n);
/* Appends s[0..n) to out, each maximal invalid subpart replaced by U+FFFD. */
struct strbuf;
void tok_utf8_lossy_append(struct strbuf *out, const uint8_t *s, size_t n);
int tok_is_whitespace(uint32_t cp);

/* ---- byte-level alphabet (GPT-2 bytes_to_unicode) ---- */
/* UTF-8 bytes of the char standing for byte b (1 or 2 bytes). */
extern char tok_byte_char[256][3];
extern uint8_t tok_byte_char_len[256];
/* Inverse: code point (< 512) -> byte, -1 if not in the alphabet. */
extern int16_t tok_char_byte[512];
void tok_byte_level_init(void);

/* ---- hash maps ---- */
uint64_t tok_hash(const char *s, size_t n);
int tok_strmap_init(tok_strmap *m, size_t expected);
void tok_strmap_free(tok_strmap *m);
/* Inserts (string of table entry value) -> value; keys are looked up via key_of. */
int32_t tok_strmap_get(const tok_strmap *m, const tok_strtab *tab, const char *s, size_t n);
int32_t tok_addedmap_get(const tokenizer *t, const char *s, size_t n);
const tok_merge_entry *tok_merges_get(const tok_mergemap *m, int32_t left, int32_t right);
/* Inserts id (whose string is tab->str[id]); a second id with the same string replaces it. */
void tok_strmap_put(tok_strmap *m, const tok_strtab *tab, int32_t id);
/* Inserts added token idx of t by its content. */
void tok_addedmap_put(tokenizer *t, int32_t idx);
void tok_merges_put(tok_mergemap *m, int32_t left, int32_t right, int32_t rank, int32_t result);

/* ---- loading (tokenizer_load.c over tokenizer_pipeline.c) ---- */
/* Where a load error goes: "<file>: <message>" into err. */
typedef struct tok_load_ctx {
    char *err;
    size_t errlen;
    const char *file;
} tok_load_ctx;
void tok_load_fail(tok_load_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A NUL-terminated copy of s[0..n), or NULL without memory. */
char *tok_dup_bytes(const char *s, size_t n);
/* o[k] as a boolean, dflt when absent; o["type"] or "". */
struct json_t;
int tok_json_bool(struct json_t *o, const char *k, int dflt);
const char *tok_json_type(struct json_t *o);
/* Each reads one component (and nested Sequences up to a depth) into t; 0, or -1 after
 * tok_load_fail. */
int tok_parse_normalizer(tokenizer *t, tok_load_ctx *c, struct json_t *j, int depth);
int tok_parse_pretokenizer(tokenizer *t, tok_load_ctx *c, struct json_t *j, int depth);
int tok_parse_decoder(tokenizer *t, tok_load_ctx *c, struct json_t *j, int depth);
int tok_parse_post(tokenizer *t, tok_load_ctx *c, struct json_t *j, int depth);
void tok_pattern_free(tok_pattern *p);

/* ---- regex ---- */
/* Runs the pattern over s[0..n) and calls back with each match [start, end). */
typedef int (*tok_match_fn)(void *ctx, size_t start, size_t end);
int tok_pattern_find_all(const tok_pattern *p, const char *s, size_t n, pcre2_match_data *md,
                         tok_match_fn fn, void *ctx);

/* ---- decode internals shared with the detokenizer ---- */
/* Appends the decoder output for ids to out as raw bytes: byte-level bytes are not yet
 * checked as UTF-8 (callers run tok_utf8_lossy_append). at_start says the ids begin the
 * text (first-token rules: Metaspace prefix, Strip after Fuse). */
void tok_decode_raw(const tokenizer *t, const int32_t *ids, size_t n, int skip_special, int at_start,
                    struct strbuf *out);
const char *tok_id_to_string(const tokenizer *t, int32_t id, uint32_t *len);

#endif
