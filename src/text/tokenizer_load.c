/* tokenizer_load — reads a Hugging Face tokenizer.json (+ tokenizer_config.json) into the
 * structs of tokenizer_internal.h, and the small shared helpers (UTF-8, byte-level alphabet,
 * hash maps, regex compilation). Every byte of both files is untrusted: a malformed or
 * unsupported file yields NULL and a message naming the field, never a crash.
 * It refuses models other than BPE, and pipeline components it does not implement (it names
 * them rather than silently tokenizing differently from Hugging Face). */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "text/tokenizer_internal.h"
#include "text/tokenizer_json.h"

/* ------------------------------------------------------------------------------------------ */
/* UTF-8                                                                                       */

int32_t tok_utf8_decode(const uint8_t *s, size_t n, size_t *adv) {
    *adv = 1;
    if (n == 0) return -1;
    uint8_t c = s[0];
    if (c < 0x80) return c;
    int len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07, min = 0x10000;
    else return -1;
    if ((size_t)len > n) return -1;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *adv = (size_t)len;
    return (int32_t)cp;
}

int tok_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The Unicode "maximal subpart of an ill-formed subsequence": the bytes a decoder consumes
 * before it knows the sequence is invalid (what Rust's from_utf8_lossy and WHATWG use). */
size_t tok_utf8_invalid_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    int len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 1;
    size_t i = 1;
    if (i < n && s[i] >= lo && s[i] <= hi) {
        i++;
        while ((int)i < len && i < n && (s[i] & 0xC0) == 0x80) i++;
    }
    return i;
}

void tok_utf8_lossy_append(strbuf *out, const uint8_t *s, size_t n) {
    size_t i = 0, run = 0;
    while (i < n) {
        size_t adv;
        if (s[i] < 0x80 || tok_utf8_decode(s + i, n - i, &adv) >= 0) {
            i += (s[i] < 0x80) ? 1 : adv;
            continue;
        }
        strbuf_append(out, (const char *)s + run, i - run);
        strbuf_append(out, "\xEF\xBF\xBD", 3);
        i += tok_utf8_invalid_len(s + i, n - i);
        run = i;
    }
    strbuf_append(out, (const char *)s + run, n - run);
}

/* Rust's char::is_whitespace (the Unicode White_Space property). */
int tok_is_whitespace(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* ------------------------------------------------------------------------------------------ */
/* Byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes are
 * shifted to U+0100.. in byte order (GPT-2's bytes_to_unicode). */

char tok_byte_char[256][3];
uint8_t tok_byte_char_len[256];
int16_t tok_char_byte[512];
static pthread_once_t byte_level_once = PTHREAD_ONCE_INIT;

static void byte_level_build(void) {
    for (int i = 0; i < 512; i++) tok_char_byte[i] = -1;
    int shifted = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + shifted++);
        tok_byte_char_len[b] = (uint8_t)tok_utf8_encode(cp, tok_byte_char[b]);
        tok_char_byte[cp] = (int16_t)b;
    }
}

void tok_byte_level_init(void) { pthread_once(&byte_level_once, byte_level_build); }

/* ------------------------------------------------------------------------------------------ */
/* Hash maps                                                                                    */

uint64_t tok_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

int tok_strmap_init(tok_strmap *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2 + 2) cap <<= 1;
    m->slots = malloc(cap * sizeof(tok_strmap_slot));
    if (!m->slots) return -1;
    for (size_t i = 0; i < cap; i++) m->slots[i] = (tok_strmap_slot){-1, 0};
    m->mask = (uint32_t)(cap - 1);
    m->count = 0;
    return 0;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

/* Finds the slot of key s (or the empty slot where it would go). eq(i) compares entry i. */
#define STRMAP_FIND(m, s, n, KEY_LEN, KEY_STR)                                                   \
    uint64_t h_ = tok_hash(s, n);                                                                \
    uint32_t tag_ = (uint32_t)(h_ >> 32), i_ = (uint32_t)h_ & (m)->mask;                         \
    for (;; i_ = (i_ + 1) & (m)->mask) {                                                         \
        int32_t v_ = (m)->slots[i_].id;                                                          \
        if (v_ < 0) break;                                                                       \
        if ((m)->slots[i_].hash == tag_ && KEY_LEN(v_) == (n) && memcmp(KEY_STR(v_), s, n) == 0) \
            break;                                                                               \
    }

int32_t tok_strmap_get(const tok_strmap *m, const tok_strtab *tab, const char *s, size_t n) {
    if (!m->slots) return -1;
#define TAB_LEN(v) tab->len[v]
#define TAB_STR(v) tab->str[v]
    STRMAP_FIND(m, s, n, TAB_LEN, TAB_STR)
    return m->slots[i_].id;
}

/* Inserts id (whose string is tab->str[id]); a second id with the same string replaces the
 * first, as a JSON object with duplicate keys keeps the last. */
static void strmap_put(tok_strmap *m, const tok_strtab *tab, int32_t id) {
    const char *s = tab->str[id];
    size_t n = tab->len[id];
    STRMAP_FIND(m, s, n, TAB_LEN, TAB_STR)
    if (m->slots[i_].id < 0) m->count++;
    m->slots[i_] = (tok_strmap_slot){id, tag_};
#undef TAB_LEN
#undef TAB_STR
}

int32_t tok_addedmap_get(const tokenizer *t, const char *s, size_t n) {
    const tok_strmap *m = &t->added_map;
    if (!m->slots) return -1;
#define ADDED_LEN(v) t->added[v].len
#define ADDED_STR(v) t->added[v].content
    STRMAP_FIND(m, s, n, ADDED_LEN, ADDED_STR)
    return m->slots[i_].id;
}

static void addedmap_put(tokenizer *t, int32_t idx) {
    tok_strmap *m = &t->added_map;
    const char *s = t->added[idx].content;
    size_t n = t->added[idx].len;
    STRMAP_FIND(m, s, n, ADDED_LEN, ADDED_STR)
    m->slots[i_] = (tok_strmap_slot){idx, tag_};
#undef ADDED_LEN
#undef ADDED_STR
}

static inline uint64_t merge_key(int32_t l, int32_t r) { return ((uint64_t)(uint32_t)l << 32) | (uint32_t)r; }
static inline uint64_t merge_slot(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return key;
}

const tok_merge_entry *tok_merges_get(const tok_mergemap *m, int32_t left, int32_t right) {
    if (!m->slots) return NULL;
    uint64_t key = merge_key(left, right);
    uint64_t i = merge_slot(key) & m->mask;
    for (;;) {
        const tok_merge_entry *e = &m->slots[i];
        if (e->key == UINT64_MAX) return NULL;
        if (e->key == key) return e;
        i = (i + 1) & m->mask;
    }
}

static void merges_put(tok_mergemap *m, int32_t l, int32_t r, int32_t rank, int32_t result) {
    uint64_t key = merge_key(l, r);
    uint64_t i = merge_slot(key) & m->mask;
    for (;;) {
        tok_merge_entry *e = &m->slots[i];
        if (e->key == UINT64_MAX || e->key == key) {
            if (e->key == UINT64_MAX) m->count++;
            e->key = key; /* a repeated pair keeps the later rank, as HF's HashMap collect does */
            e->rank = rank;
            e->result = result;
            return;
        }
        i = (i + 1) & m->mask;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                       */

typedef struct load_ctx {
    char *err;
    size_t errlen;
    const char *file;
} load_ctx;

__attribute__((format(printf, 2, 3))) static void fail(load_ctx *c, const char *fmt, ...) {
    if (!c->err || c->errlen == 0) return;
    int k = snprintf(c->err, c->errlen, "%s: ", c->file);
    if (k < 0 || (size_t)k >= c->errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
    va_end(ap);
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* Regex: the files carry Oniguruma patterns (what HF tokenizers runs); PCRE2 with UTF+UCP
 * agrees on everything these patterns use except \s, which in Oniguruma also matches U+0085.
 * We add it so splits agree. */

static int rewrite_regex(const char *src, size_t n, strbuf *out) {
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = src[i];
        if (ch == '\\' && i + 1 < n) {
            char nx = src[i + 1];
            if (nx == 's') {
                strbuf_append_str(out, in_class ? "\\s\\x{85}" : "[\\s\\x{85}]");
            } else if (nx == 'S' && !in_class) {
                strbuf_append_str(out, "[^\\s\\x{85}]");
            } else {
                strbuf_append(out, src + i, 2);
            }
            i++;
            continue;
        }
        if (ch == '[' && !in_class) {
            in_class = 1;
            strbuf_append_char(out, ch);
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && src[i + 1] == '^') strbuf_append_char(out, src[++i]);
            if (i + 1 < n && src[i + 1] == ']') strbuf_append_char(out, src[++i]);
            continue;
        }
        if (ch == ']' && in_class) in_class = 0;
        strbuf_append_char(out, ch);
    }
    return 0;
}

static int pattern_parse(load_ctx *c, json_t *j, tok_pattern *p, const char *where) {
    memset(p, 0, sizeof *p);
    json_t *s = json_object_get(j, "String"), *r = json_object_get(j, "Regex");
    if (json_is_string(s)) {
        p->kind = TOK_PATTERN_STRING;
        p->len = json_string_length(s);
        p->str = dup_bytes(json_string_value(s), p->len);
        if (!p->str) return -1;
        if (p->len == 0) {
            fail(c, "%s: empty String pattern", where);
            return -1;
        }
        return 0;
    }
    if (!json_is_string(r)) {
        fail(c, "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
        return -1;
    }
    p->kind = TOK_PATTERN_REGEX;
    p->len = json_string_length(r);
    p->str = dup_bytes(json_string_value(r), p->len);
    if (!p->str) return -1;
    strbuf rw = {0};
    rewrite_regex(p->str, p->len, &rw);
    int code;
    PCRE2_SIZE off;
    p->re = pcre2_compile((PCRE2_SPTR)(rw.data ? rw.data : ""), rw.len, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    strbuf_free(&rw);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        fail(c, "%s: regex does not compile (%s at offset %zu): %.80s", where, (char *)msg, (size_t)off, p->str);
        return -1;
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* best effort: falls back to the interpreter */
    return 0;
}

static void pattern_free(tok_pattern *p) {
    free(p->str);
    if (p->re) pcre2_code_free(p->re);
}

int tok_pattern_find_all(const tok_pattern *p, const char *s, size_t n, pcre2_match_data *md, tok_match_fn fn,
                         void *ctx) {
    if (p->kind == TOK_PATTERN_STRING) {
        size_t i = 0;
        while (i + p->len <= n) {
            const char *hit = memmem(s + i, n - i, p->str, p->len);
            if (!hit) break;
            size_t at = (size_t)(hit - s);
            if (fn(ctx, at, at + p->len)) return -1;
            i = at + p->len;
        }
        return 0;
    }
    size_t start = 0;
    while (start <= n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return -1; /* match limit etc.: the caller reports an error */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me > ms) {
            if (fn(ctx, ms, me)) return -1;
            start = me;
        } else {
            /* empty match: step over one character */
            if (ms >= n) break;
            size_t adv;
            if (tok_utf8_decode((const uint8_t *)s + ms, n - ms, &adv) < 0) adv = 1;
            start = ms + adv;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* JSON helpers                                                                                 */

static int jbool(json_t *o, const char *k, int dflt) {
    json_t *v = json_object_get(o, k);
    if (json_is_boolean(v)) return json_is_true(v);
    return dflt;
}

static const char *jtype(json_t *o) {
    json_t *v = json_object_get(o, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A single char given as a string (Metaspace replacement, Strip content). */
static int one_char(load_ctx *c, json_t *o, const char *key, const char *dflt, char out[8], uint8_t *len,
                    const char *where) {
    json_t *v = json_object_get(o, key);
    const char *s = dflt;
    size_t n = strlen(dflt);
    if (json_is_string(v)) {
        s = json_string_value(v);
        n = json_string_length(v);
    }
    size_t adv;
    if (n == 0 || n > 4 || tok_utf8_decode((const uint8_t *)s, n, &adv) < 0 || adv != n) {
        fail(c, "%s: \"%s\" must be a single character", where, key);
        return -1;
    }
    memcpy(out, s, n);
    out[n] = 0;
    *len = (uint8_t)n;
    return 0;
}

static enum tok_prepend_scheme prepend_scheme(json_t *o) {
    json_t *ps = json_object_get(o, "prepend_scheme");
    if (json_is_string(ps)) {
        const char *s = json_string_value(ps);
        if (!strcmp(s, "first")) return TOK_PREPEND_FIRST;
        if (!strcmp(s, "never")) return TOK_PREPEND_NEVER;
        return TOK_PREPEND_ALWAYS;
    }
    return jbool(o, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
}

/* ------------------------------------------------------------------------------------------ */
/* Components                                                                                   */

static int grow(void **arr, int *n, size_t elem) {
    void *p = realloc(*arr, (size_t)(*n + 1) * elem);
    if (!p) return -1;
    *arr = p;
    memset((char *)p + (size_t)*n * elem, 0, elem);
    (*n)++;
    return 0;
}

static int parse_normalizer(tokenizer *t, load_ctx *c, json_t *j, int depth) {
    if (json_is_null(j) || !j) return 0;
    const char *type = jtype(j);
    if (!json_is_object(j) || !type) {
        fail(c, "normalizer: expected an object with a \"type\"");
        return -1;
    }
    if (depth > 8) {
        fail(c, "normalizer: nested too deeply");
        return -1;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr)) {
            fail(c, "normalizer Sequence: \"normalizers\" must be an array");
            return -1;
        }
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) if (parse_normalizer(t, c, v, depth + 1)) return -1;
        return 0;
    }
    if (grow((void **)&t->norms, &t->n_norms, sizeof(tok_normalizer))) return -1;
    tok_normalizer *n = &t->norms[t->n_norms - 1];
    if (!strcmp(type, "NFC")) n->kind = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD")) n->kind = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) n->kind = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) n->kind = TOK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) n->kind = TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "StripAccents")) n->kind = TOK_NORM_STRIP_ACCENTS;
    else if (!strcmp(type, "Strip")) {
        n->kind = TOK_NORM_STRIP;
        n->strip_left = (uint8_t)jbool(j, "strip_left", 1);
        n->strip_right = (uint8_t)jbool(j, "strip_right", 1);
    } else if (!strcmp(type, "Prepend") || !strcmp(type, "Replace")) {
        int is_prepend = type[0] == 'P';
        n->kind = is_prepend ? TOK_NORM_PREPEND : TOK_NORM_REPLACE;
        json_t *content = json_object_get(j, is_prepend ? "prepend" : "content");
        if (!json_is_string(content)) {
            fail(c, "normalizer %s: missing string \"%s\"", type, is_prepend ? "prepend" : "content");
            return -1;
        }
        n->content_len = json_string_length(content);
        n->content = dup_bytes(json_string_value(content), n->content_len);
        if (!is_prepend && pattern_parse(c, json_object_get(j, "pattern"), &n->pattern, "normalizer Replace"))
            return -1;
    } else {
        fail(c, "normalizer type \"%s\" is not supported", type);
        return -1;
    }
    return 0;
}

static int split_behavior(load_ctx *c, json_t *j, enum tok_split_behavior dflt, enum tok_split_behavior *out) {
    json_t *b = json_object_get(j, "behavior");
    *out = dflt;
    if (!b) return 0;
    const char *s = json_is_string(b) ? json_string_value(b) : "";
    if (!strcmp(s, "Removed")) *out = TOK_SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated")) *out = TOK_SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *out = TOK_SPLIT_MERGED_WITH_PREVIOUS;
    else if (!strcmp(s, "MergedWithNext")) *out = TOK_SPLIT_MERGED_WITH_NEXT;
    else if (!strcmp(s, "Contiguous")) *out = TOK_SPLIT_CONTIGUOUS;
    else {
        fail(c, "pre_tokenizer: unknown split behavior \"%s\"", s);
        return -1;
    }
    return 0;
}

static int parse_pretokenizer(tokenizer *t, load_ctx *c, json_t *j, int depth) {
    if (json_is_null(j) || !j) return 0;
    const char *type = jtype(j);
    if (!json_is_object(j) || !type) {
        fail(c, "pre_tokenizer: expected an object with a \"type\"");
        return -1;
    }
    if (depth > 8) {
        fail(c, "pre_tokenizer: nested too deeply");
        return -1;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr)) {
            fail(c, "pre_tokenizer Sequence: \"pretokenizers\" must be an array");
            return -1;
        }
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) if (parse_pretokenizer(t, c, v, depth + 1)) return -1;
        return 0;
    }
    if (grow((void **)&t->pres, &t->n_pres, sizeof(tok_pretokenizer))) return -1;
    tok_pretokenizer *p = &t->pres[t->n_pres - 1];
    if (!strcmp(type, "Split")) {
        p->kind = TOK_PRE_SPLIT;
        if (pattern_parse(c, json_object_get(j, "pattern"), &p->pattern, "pre_tokenizer Split")) return -1;
        if (split_behavior(c, j, TOK_SPLIT_ISOLATED, &p->behavior)) return -1;
        p->invert = (uint8_t)jbool(j, "invert", 0);
    } else if (!strcmp(type, "ByteLevel")) {
        p->kind = TOK_PRE_BYTE_LEVEL;
        p->add_prefix_space = (uint8_t)jbool(j, "add_prefix_space", 1);
        p->use_regex = (uint8_t)jbool(j, "use_regex", 1);
        if (p->use_regex) {
            json_t *re = json_pack("{s:s}", "Regex",
                                   "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
            int rc = pattern_parse(c, re, &p->pattern, "pre_tokenizer ByteLevel");
            json_decref(re);
            if (rc) return -1;
        }
    } else if (!strcmp(type, "Metaspace")) {
        p->kind = TOK_PRE_METASPACE;
        if (one_char(c, j, "replacement", "\xE2\x96\x81", p->replacement, &p->replacement_len, "pre_tokenizer Metaspace"))
            return -1;
        p->prepend = prepend_scheme(j);
        p->split = (uint8_t)jbool(j, "split", 1);
    } else if (!strcmp(type, "Digits")) {
        p->kind = TOK_PRE_DIGITS;
        p->individual_digits = (uint8_t)jbool(j, "individual_digits", 0);
    } else if (!strcmp(type, "Punctuation")) {
        p->kind = TOK_PRE_PUNCTUATION;
        if (split_behavior(c, j, TOK_SPLIT_ISOLATED, &p->behavior)) return -1;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->kind = TOK_PRE_WHITESPACE_SPLIT;
    } else if (!strcmp(type, "Whitespace")) {
        p->kind = TOK_PRE_WHITESPACE;
        json_t *re = json_pack("{s:s}", "Regex", "\\w+|[^\\w\\s]+");
        int rc = pattern_parse(c, re, &p->pattern, "pre_tokenizer Whitespace");
        json_decref(re);
        if (rc) return -1;
    } else {
        fail(c, "pre_tokenizer type \"%s\" is not supported", type);
        return -1;
    }
    return 0;
}

static int parse_decoder(tokenizer *t, load_ctx *c, json_t *j, int depth) {
    if (json_is_null(j) || !j) return 0;
    const char *type = jtype(j);
    if (!json_is_object(j) || !type) {
        fail(c, "decoder: expected an object with a \"type\"");
        return -1;
    }
    if (depth > 8) {
        fail(c, "decoder: nested too deeply");
        return -1;
    }
    t->has_decoder = 1;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr)) {
            fail(c, "decoder Sequence: \"decoders\" must be an array");
            return -1;
        }
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) if (parse_decoder(t, c, v, depth + 1)) return -1;
        return 0;
    }
    if (grow((void **)&t->decs, &t->n_decs, sizeof(tok_decoder))) return -1;
    tok_decoder *d = &t->decs[t->n_decs - 1];
    if (!strcmp(type, "ByteLevel")) d->kind = TOK_DEC_BYTE_LEVEL;
    else if (!strcmp(type, "ByteFallback")) d->kind = TOK_DEC_BYTE_FALLBACK;
    else if (!strcmp(type, "Fuse")) d->kind = TOK_DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->kind = TOK_DEC_METASPACE;
        if (one_char(c, j, "replacement", "\xE2\x96\x81", d->replacement, &d->replacement_len, "decoder Metaspace"))
            return -1;
        d->prepend = prepend_scheme(j);
    } else if (!strcmp(type, "Replace")) {
        d->kind = TOK_DEC_REPLACE;
        json_t *content = json_object_get(j, "content");
        if (!json_is_string(content)) {
            fail(c, "decoder Replace: missing string \"content\"");
            return -1;
        }
        d->content_len = json_string_length(content);
        d->content = dup_bytes(json_string_value(content), d->content_len);
        if (pattern_parse(c, json_object_get(j, "pattern"), &d->pattern, "decoder Replace")) return -1;
    } else if (!strcmp(type, "Strip")) {
        d->kind = TOK_DEC_STRIP;
        char ch[8];
        uint8_t n;
        if (one_char(c, j, "content", " ", ch, &n, "decoder Strip")) return -1;
        d->content = dup_bytes(ch, n);
        d->content_len = n;
        json_t *st = json_object_get(j, "start"), *sp = json_object_get(j, "stop");
        d->start = json_is_integer(st) ? (int)(json_integer_value(st) < 0 ? 0 : json_integer_value(st) > 1000 ? 1000 : json_integer_value(st)) : 0;
        d->stop = json_is_integer(sp) ? (int)(json_integer_value(sp) < 0 ? 0 : json_integer_value(sp) > 1000 ? 1000 : json_integer_value(sp)) : 0;
    } else {
        fail(c, "decoder type \"%s\" is not supported", type);
        return -1;
    }
    return 0;
}

static int32_t special_token_id(tokenizer *t, json_t *specials, const char *name, load_ctx *c, int32_t **ids,
                                int *n) {
    json_t *st = json_object_get(specials, name);
    json_t *arr = json_object_get(st, "ids");
    if (!json_is_array(arr)) {
        fail(c, "post_processor: special token \"%.60s\" has no \"ids\"", name);
        return -1;
    }
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_ID) {
            fail(c, "post_processor: bad id for \"%.60s\"", name);
            return -1;
        }
        if (grow((void **)ids, n, sizeof(int32_t))) return -1;
        (*ids)[*n - 1] = (int32_t)json_integer_value(v);
    }
    (void)t;
    return 0;
}

/* Reads a post-processor; wraps the current prefix/suffix (Sequence applies in order). */
static int parse_post(tokenizer *t, load_ctx *c, json_t *j, int depth) {
    if (json_is_null(j) || !j) return 0;
    const char *type = jtype(j);
    if (!json_is_object(j) || !type || depth > 8) {
        fail(c, "post_processor: expected an object with a \"type\"");
        return -1;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "processors");
        if (!json_is_array(arr)) {
            fail(c, "post_processor Sequence: \"processors\" must be an array");
            return -1;
        }
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) if (parse_post(t, c, v, depth + 1)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    int32_t *pre = NULL, *suf = NULL;
    int npre = 0, nsuf = 0;
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
        if (!json_is_array(single)) {
            fail(c, "post_processor TemplateProcessing: \"single\" must be an array");
            return -1;
        }
        int seen_seq = 0;
        size_t i;
        json_t *v;
        json_array_foreach(single, i, v) {
            json_t *sp = json_object_get(v, "SpecialToken"), *sq = json_object_get(v, "Sequence");
            if (json_is_object(sq)) {
                seen_seq = 1;
                continue;
            }
            json_t *id = json_object_get(sp, "id");
            if (!json_is_string(id)) {
                fail(c, "post_processor TemplateProcessing: piece %zu is neither SpecialToken nor Sequence", i);
                free(pre), free(suf);
                return -1;
            }
            if (special_token_id(t, specials, json_string_value(id), c, seen_seq ? &suf : &pre, seen_seq ? &nsuf : &npre)) {
                free(pre), free(suf);
                return -1;
            }
        }
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_array_get(json_object_get(j, "cls"), 1), *sep = json_array_get(json_object_get(j, "sep"), 1);
        if (!json_is_integer(cls) || !json_is_integer(sep) || json_integer_value(cls) < 0 ||
            json_integer_value(sep) < 0 || json_integer_value(cls) >= TOK_MAX_ID || json_integer_value(sep) >= TOK_MAX_ID) {
            fail(c, "post_processor %s: \"cls\" and \"sep\" must be [token, id]", type);
            return -1;
        }
        pre = malloc(sizeof(int32_t));
        suf = malloc(sizeof(int32_t));
        pre[0] = (int32_t)json_integer_value(cls);
        suf[0] = (int32_t)json_integer_value(sep);
        npre = nsuf = 1;
    } else {
        fail(c, "post_processor type \"%s\" is not supported", type);
        return -1;
    }
    /* new prefix = pre + old prefix; new suffix = old suffix + suf */
    int32_t *np = malloc(sizeof(int32_t) * (size_t)(npre + t->n_post_prefix + 1));
    int32_t *ns = malloc(sizeof(int32_t) * (size_t)(nsuf + t->n_post_suffix + 1));
    if (npre) memcpy(np, pre, sizeof(int32_t) * (size_t)npre);
    if (t->n_post_prefix) memcpy(np + npre, t->post_prefix, sizeof(int32_t) * (size_t)t->n_post_prefix);
    if (t->n_post_suffix) memcpy(ns, t->post_suffix, sizeof(int32_t) * (size_t)t->n_post_suffix);
    if (nsuf) memcpy(ns + t->n_post_suffix, suf, sizeof(int32_t) * (size_t)nsuf);
    free(t->post_prefix), free(t->post_suffix), free(pre), free(suf);
    t->post_prefix = np;
    t->post_suffix = ns;
    t->n_post_prefix += npre;
    t->n_post_suffix += nsuf;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Model                                                                                        */

static int trie_add(tok_trie *tr, const char *s, size_t n, int32_t added) {
    if (tr->n == 0) {
        tr->cap = 64;
        tr->nodes = malloc(sizeof(tok_trie_node) * (size_t)tr->cap);
        if (!tr->nodes) return -1;
        tr->nodes[0] = (tok_trie_node){-1, -1, -1, 0};
        tr->n = 1;
    }
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t ch = tr->nodes[cur].first_child;
        while (ch >= 0 && tr->nodes[ch].byte != b) ch = tr->nodes[ch].next_sibling;
        if (ch < 0) {
            if (tr->n == tr->cap) {
                tok_trie_node *p = realloc(tr->nodes, sizeof(tok_trie_node) * (size_t)tr->cap * 2);
                if (!p) return -1;
                tr->nodes = p;
                tr->cap *= 2;
            }
            ch = tr->n++;
            tr->nodes[ch] = (tok_trie_node){-1, tr->nodes[cur].first_child, -1, b};
            tr->nodes[cur].first_child = ch;
        }
        cur = ch;
    }
    tr->nodes[cur].added = added;
    return 0;
}

typedef struct vocab_entry {
    size_t off; /* into the arena */
    uint32_t len;
    int32_t id;
} vocab_entry;

typedef struct vocab_collect {
    strbuf arena;
    vocab_entry *v;
    size_t n, cap;
    int32_t max_id;
    long long bad_id;
    int bad;
} vocab_collect;

static int collect_vocab(void *user, const char *key, size_t klen, long long id) {
    vocab_collect *vc = user;
    if (id < 0 || id >= TOK_MAX_ID || klen > UINT32_MAX / 2) {
        vc->bad = 1;
        vc->bad_id = id;
        return -1;
    }
    if (vc->n == vc->cap) {
        size_t cap = vc->cap ? vc->cap * 2 : 1024;
        vocab_entry *p = realloc(vc->v, cap * sizeof *p);
        if (!p) return -1;
        vc->v = p;
        vc->cap = cap;
    }
    vc->v[vc->n++] = (vocab_entry){vc->arena.len, (uint32_t)klen, (int32_t)id};
    strbuf_append(&vc->arena, key, klen);
    strbuf_append_char(&vc->arena, 0);
    if (id > vc->max_id) vc->max_id = (int32_t)id;
    return 0;
}

static int load_vocab(tokenizer *t, load_ctx *c, const char *json, const tok_json_spans *sp) {
    if (!sp->vocab_len) {
        fail(c, "model.vocab must be an object of token -> id");
        return -1;
    }
    vocab_collect vc = {.max_id = -1};
    int rc = tok_json_vocab(json + sp->vocab, sp->vocab_len, collect_vocab, &vc);
    if (rc) {
        if (vc.bad) fail(c, "model.vocab: id %lld is not in [0, %d)", vc.bad_id, TOK_MAX_ID);
        else if (rc == -2) fail(c, "model.vocab: every value must be an integer id");
        else fail(c, "model.vocab: out of memory");
        goto fail;
    }
    if ((size_t)vc.max_id + 1 > 2 * vc.n + 65536) {
        fail(c, "model.vocab: ids go up to %d for %zu tokens; ids must be (nearly) dense", vc.max_id, vc.n);
        goto fail;
    }
    t->vocab.n = vc.max_id + 1;
    t->vocab.str = calloc((size_t)t->vocab.n + 1, sizeof(char *));
    t->vocab.len = calloc((size_t)t->vocab.n + 1, sizeof(uint32_t));
    if (!t->vocab.str || !t->vocab.len || tok_strmap_init(&t->vocab_map, (size_t)t->vocab.n)) goto fail;
    t->vocab_arena = strbuf_detach(&vc.arena);
    for (size_t i = 0; i < vc.n; i++) {
        int32_t id = vc.v[i].id;
        if (t->vocab.str[id]) {
            /* two tokens with one id: refuse rather than guess which one decodes */
            fail(c, "model.vocab: id %d is used by two tokens", id);
            goto fail;
        }
        t->vocab.str[id] = t->vocab_arena + vc.v[i].off;
        t->vocab.len[id] = vc.v[i].len;
        strmap_put(&t->vocab_map, &t->vocab, id);
    }
    free(vc.v);
    return 0;
fail:
    strbuf_free(&vc.arena);
    free(vc.v);
    return -1;
}

typedef struct merge_collect {
    tokenizer *t;
    load_ctx *c;
    char *joined;
    size_t cap;
} merge_collect;

static int collect_merge(void *user, size_t i, const char *a, size_t alen, const char *b, size_t blen) {
    merge_collect *m = user;
    tokenizer *t = m->t;
    if (!a || !b) {
        fail(m->c, "model.merges[%zu]: expected \"left right\" or [left, right]", i);
        return -1;
    }
    if (alen + blen > m->cap) {
        size_t cap = (alen + blen) * 2 + 64;
        char *p = realloc(m->joined, cap);
        if (!p) return -1;
        m->joined = p;
        m->cap = cap;
    }
    memcpy(m->joined, a, alen);
    memcpy(m->joined + alen, b, blen);
    int32_t ia = tok_strmap_get(&t->vocab_map, &t->vocab, a, alen);
    int32_t ib = tok_strmap_get(&t->vocab_map, &t->vocab, b, blen);
    int32_t iab = tok_strmap_get(&t->vocab_map, &t->vocab, m->joined, alen + blen);
    if (ia < 0 || ib < 0 || iab < 0) {
        fail(m->c, "model.merges[%zu]: \"%.*s\" + \"%.*s\" is not in the vocabulary", i, (int)(alen > 30 ? 30 : alen), a,
             (int)(blen > 30 ? 30 : blen), b);
        return -1;
    }
    if (i >= INT32_MAX) return -1;
    merges_put(&t->merges, ia, ib, (int32_t)i, iab);
    return 0;
}

static int load_merges(tokenizer *t, load_ctx *c, const char *json, const tok_json_spans *sp, json_t *model) {
    json_t *m = json_object_get(model, "merges");
    if (!sp->merges_len) {
        if (!m || json_is_null(m)) return 0;
        fail(c, "model.merges must be an array");
        return -1;
    }
    /* the span is at least "[]"; an upper bound on the element count sizes the table */
    size_t n = sp->merges_len / 4 + 1, cap = 16;
    while (cap < n * 2 + 2) cap <<= 1;
    t->merges.slots = malloc(cap * sizeof(tok_merge_entry));
    if (!t->merges.slots) return -1;
    for (size_t i = 0; i < cap; i++) t->merges.slots[i].key = UINT64_MAX;
    t->merges.mask = cap - 1;
    merge_collect mc = {t, c, NULL, 0};
    int rc = tok_json_merges(json + sp->merges, sp->merges_len, collect_merge, &mc);
    free(mc.joined);
    if (rc && c->err && !c->err[0]) fail(c, "model.merges: malformed");
    return rc ? -1 : 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int find_meta_blockers(tokenizer *t) {
    static const char META[] = "\xE2\x96\x81";
    if (t->continuing_subword_prefix || t->end_of_word_suffix) return 0;
    if (tok_strmap_get(&t->vocab_map, &t->vocab, META, 3) < 0) return 0;
    int cap = 0;
    for (int32_t id = 0; id < t->vocab.n; id++) {
        const char *s = t->vocab.str[id];
        uint32_t n = t->vocab.len[id];
        if (!s) continue;
        for (uint32_t i = 1; i + 3 <= n; i++) {
            if (memcmp(s + i, META, 3) != 0) continue;
            uint32_t q = i - 1;
            while (q > 0 && ((uint8_t)s[q] & 0xC0) == 0x80) q--;
            size_t adv;
            int32_t cp = tok_utf8_decode((const uint8_t *)s + q, i - q, &adv);
            if (cp == 0x2581) continue;
            if (t->n_meta_blockers == cap) {
                cap = cap ? cap * 2 : 16;
                int32_t *p = realloc(t->meta_blockers, sizeof(int32_t) * (size_t)cap);
                if (!p) return -1;
                t->meta_blockers = p;
            }
            t->meta_blockers[t->n_meta_blockers++] = cp; /* cp < 0 (not UTF-8): blocks nothing useful */
        }
    }
    if (t->n_meta_blockers) qsort(t->meta_blockers, (size_t)t->n_meta_blockers, sizeof(int32_t), cmp_i32);
    t->meta_split = 1;
    return 0;
}

static int load_model(tokenizer *t, load_ctx *c, json_t *model, const char *json, const tok_json_spans *sp) {
    const char *type = jtype(model);
    if (!json_is_object(model)) {
        fail(c, "missing \"model\" object");
        return -1;
    }
    if (type && strcmp(type, "BPE") != 0) {
        fail(c, "model type \"%s\" is not supported (only BPE)", type);
        return -1;
    }
    if (!type && !json_object_get(model, "merges")) {
        fail(c, "model has no \"type\" and no merges: only BPE is supported");
        return -1;
    }
    if (load_vocab(t, c, json, sp)) return -1;
    if (load_merges(t, c, json, sp, model)) return -1;
    t->byte_fallback = (uint8_t)jbool(model, "byte_fallback", 0);
    t->fuse_unk = (uint8_t)jbool(model, "fuse_unk", 0);
    t->ignore_merges = (uint8_t)jbool(model, "ignore_merges", 0);
    json_t *unk = json_object_get(model, "unk_token");
    t->unk_id = -1;
    if (json_is_string(unk)) {
        t->unk_id = tok_strmap_get(&t->vocab_map, &t->vocab, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0) {
            fail(c, "model.unk_token \"%.40s\" is not in the vocabulary", json_string_value(unk));
            return -1;
        }
    }
    json_t *csp = json_object_get(model, "continuing_subword_prefix"), *eows = json_object_get(model, "end_of_word_suffix");
    if (json_is_string(csp) && json_string_length(csp) > 0) t->continuing_subword_prefix = strdup(json_string_value(csp));
    if (json_is_string(eows) && json_string_length(eows) > 0) t->end_of_word_suffix = strdup(json_string_value(eows));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_token[b] = tok_strmap_get(&t->vocab_map, &t->vocab, name, 6);
    }
    return find_meta_blockers(t);
}

static int load_added(tokenizer *t, load_ctx *c, json_t *arr) {
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) {
        fail(c, "\"added_tokens\" must be an array");
        return -1;
    }
    size_t n = json_array_size(arr);
    t->added = calloc(n + 1, sizeof(tok_added));
    if (!t->added || tok_strmap_init(&t->added_map, n)) return -1;
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        json_t *id = json_object_get(v, "id"), *content = json_object_get(v, "content");
        if (!json_is_integer(id) || !json_is_string(content) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= TOK_MAX_ID || json_string_length(content) == 0) {
            fail(c, "added_tokens[%zu]: needs an integer \"id\" in [0, %d) and a non-empty \"content\"", i, TOK_MAX_ID);
            return -1;
        }
        if (json_integer_value(id) >= (json_int_t)t->vocab.n + 2 * (json_int_t)n + 65536) {
            fail(c, "added_tokens[%zu]: id %lld is far beyond the vocabulary (%d tokens)", i,
                 (long long)json_integer_value(id), t->vocab.n);
            return -1;
        }
        tok_added *a = &t->added[t->n_added++];
        a->id = (int32_t)json_integer_value(id);
        a->len = (uint32_t)json_string_length(content);
        a->content = dup_bytes(json_string_value(content), a->len);
        if (!a->content) return -1;
        a->special = (uint8_t)jbool(v, "special", 0);
        a->lstrip = (uint8_t)jbool(v, "lstrip", 0);
        a->rstrip = (uint8_t)jbool(v, "rstrip", 0);
        a->single_word = (uint8_t)jbool(v, "single_word", 0);
        /* HF default: special tokens are not normalized, others are */
        a->normalized = (uint8_t)jbool(v, "normalized", !a->special);
        addedmap_put(t, t->n_added - 1);
    }
    /* content -> last index; build tries from the map's survivors so duplicates resolve once */
    for (int k = 0; k < t->n_added; k++) {
        tok_added *a = &t->added[k];
        if (tok_addedmap_get(t, a->content, a->len) != k) continue;
        if (trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, a->content, a->len, k)) return -1;
    }
    tok_trie *tries[2] = {&t->trie_raw, &t->trie_norm};
    for (int k = 0; k < 2; k++) {
        for (int b = 0; b < 256; b++) tries[k]->root[b] = -1;
        if (tries[k]->n == 0) continue;
        for (int32_t ch = tries[k]->nodes[0].first_child; ch >= 0; ch = tries[k]->nodes[ch].next_sibling)
            tries[k]->root[tries[k]->nodes[ch].byte] = ch;
    }
    return 0;
}

static int build_id_table(tokenizer *t) {
    int32_t size = t->vocab.n;
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].id + 1 > size) size = t->added[k].id + 1;
    t->id_table_size = size;
    t->added_by_id = malloc(sizeof(int32_t) * ((size_t)size + 1));
    if (!t->added_by_id) return -1;
    for (int32_t i = 0; i < size; i++) t->added_by_id[i] = -1;
    for (int k = 0; k < t->n_added; k++) t->added_by_id[t->added[k].id] = k;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* tokenizer_config.json                                                                        */

static char *token_field(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

static int load_config(tokenizer *t, load_ctx *c, const char *json, size_t len) {
    json_error_t je;
    /* big integers (model_max_length = 1e30) are common here: read numbers as reals */
    json_t *cfg = json_loadb(json, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg || !json_is_object(cfg)) {
        fail(c, "not a JSON object (line %d: %s)", je.line, cfg ? "top level is not an object" : je.text);
        json_decref(cfg);
        return -1;
    }
    t->bos_token = token_field(cfg, "bos_token");
    t->eos_token = token_field(cfg, "eos_token");
    json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct)) {
        t->chat_template = strdup(json_string_value(ct));
    } else if (json_is_array(ct)) {
        size_t i;
        json_t *v;
        json_t *chosen = NULL;
        json_array_foreach(ct, i, v) {
            json_t *name = json_object_get(v, "name"), *tmpl = json_object_get(v, "template");
            if (!json_is_string(tmpl)) continue;
            if (!chosen) chosen = tmpl;
            if (json_is_string(name) && !strcmp(json_string_value(name), "default")) chosen = tmpl;
        }
        if (chosen) t->chat_template = strdup(json_string_value(chosen));
    }
    json_decref(cfg);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Public: load / free / queries                                                                */

tokenizer *tokenizer_load_from_json(const char *tokenizer_json, size_t len, const char *config_json,
                                    size_t config_len, char *err, size_t errlen) {
    load_ctx c = {err, errlen, "tokenizer.json"};
    if (err && errlen) err[0] = 0;
    tok_byte_level_init();
    if (!tokenizer_json) {
        fail(&c, "no data");
        return NULL;
    }
    json_error_t je;
    tok_json_spans sp;
    size_t bad_at = 0;
    json_t *root = NULL;
    if (tok_json_find_spans(tokenizer_json, len, &sp, &bad_at) == 0) {
        /* the same document with model.vocab and model.merges emptied: jansson reads the rest */
        strbuf small = {0};
        size_t a = sp.vocab_len ? sp.vocab : len, b = sp.merges_len ? sp.merges : len;
        size_t first = a < b ? a : b, second = a < b ? b : a;
        size_t first_len = first == a ? sp.vocab_len : sp.merges_len, second_len = first == a ? sp.merges_len : sp.vocab_len;
        strbuf_append(&small, tokenizer_json, first);
        if (first < len) {
            strbuf_append_str(&small, tokenizer_json[first] == '{' ? "{}" : "[]");
            strbuf_append(&small, tokenizer_json + first + first_len, second - first - first_len);
            if (second < len) {
                strbuf_append_str(&small, tokenizer_json[second] == '{' ? "{}" : "[]");
                strbuf_append(&small, tokenizer_json + second + second_len, len - second - second_len);
            }
        }
        root = json_loadb(small.data ? small.data : "", small.len, JSON_ALLOW_NUL, &je);
        strbuf_free(&small);
    } else {
        root = json_loadb(tokenizer_json, len, JSON_ALLOW_NUL, &je); /* for its error message */
        if (root && json_is_object(root)) { /* jansson accepted what the scanner did not */
            json_decref(root);
            root = NULL;
            snprintf(je.text, sizeof je.text, "malformed JSON near byte %zu", bad_at);
            je.line = je.column = 0;
        }
    }
    if (!root || !json_is_object(root)) {
        if (root) fail(&c, "top level is not a JSON object");
        else if (je.line) fail(&c, "invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
        else fail(&c, "invalid JSON: %s", je.text);
        json_decref(root);
        return NULL;
    }
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return NULL;
    }
    t->unk_id = -1;
    for (int b = 0; b < 256; b++) t->trie_raw.root[b] = t->trie_norm.root[b] = -1;
    int rc = load_model(t, &c, json_object_get(root, "model"), tokenizer_json, &sp);
    if (!rc) rc = load_added(t, &c, json_object_get(root, "added_tokens"));
    if (!rc) rc = build_id_table(t);
    if (!rc) rc = parse_normalizer(t, &c, json_object_get(root, "normalizer"), 0);
    if (!rc) rc = parse_pretokenizer(t, &c, json_object_get(root, "pre_tokenizer"), 0);
    if (!rc) rc = parse_decoder(t, &c, json_object_get(root, "decoder"), 0);
    if (!rc) rc = parse_post(t, &c, json_object_get(root, "post_processor"), 0);
    for (int k = 0; !rc && k < t->n_post_prefix + t->n_post_suffix; k++) {
        int32_t id = k < t->n_post_prefix ? t->post_prefix[k] : t->post_suffix[k - t->n_post_prefix];
        if (id >= t->id_table_size) {
            fail(&c, "post_processor: id %d is outside the vocabulary", id);
            rc = -1;
        }
    }
    json_decref(root);
    if (!rc && config_json) {
        c.file = "tokenizer_config.json";
        rc = load_config(t, &c, config_json, config_len);
    }
    if (rc) {
        if (err && errlen && !err[0]) snprintf(err, errlen, "%s: out of memory", c.file);
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

static char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (err) snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    strbuf sb = {0};
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) strbuf_append(&sb, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        if (err) snprintf(err, errlen, "%s: read error", path);
        strbuf_free(&sb);
        return NULL;
    }
    *len = sb.len;
    return strbuf_detach(&sb);
}

tokenizer *tokenizer_load(const char *model_dir, char *err, size_t errlen) {
    char path[4096];
    size_t len = 0, clen = 0;
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    char *json = read_file(path, &len, err, errlen);
    if (!json) return NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    char *cfg = read_file(path, &clen, NULL, 0);
    char inner[512];
    tokenizer *t = tokenizer_load_from_json(json, len, cfg, clen, inner, sizeof inner);
    if (!t && err) snprintf(err, errlen, "%s/%s", model_dir, inner);
    free(json);
    free(cfg);
    return t;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->vocab_arena);
    free(t->vocab.str);
    free(t->vocab.len);
    tok_strmap_free(&t->vocab_map);
    free(t->merges.slots);
    free(t->meta_blockers);
    free(t->continuing_subword_prefix);
    free(t->end_of_word_suffix);
    for (int k = 0; k < t->n_added; k++) free(t->added[k].content);
    free(t->added);
    tok_strmap_free(&t->added_map);
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    free(t->added_by_id);
    for (int k = 0; k < t->n_norms; k++) {
        pattern_free(&t->norms[k].pattern);
        free(t->norms[k].content);
    }
    free(t->norms);
    for (int k = 0; k < t->n_pres; k++) pattern_free(&t->pres[k].pattern);
    free(t->pres);
    for (int k = 0; k < t->n_decs; k++) {
        pattern_free(&t->decs[k].pattern);
        free(t->decs[k].content);
    }
    free(t->decs);
    free(t->post_prefix);
    free(t->post_suffix);
    free(t->bos_token);
    free(t->eos_token);
    free(t->chat_template);
    free(t);
}

const char *tok_id_to_string(const tokenizer *t, int32_t id, uint32_t *len) {
    if (id < 0 || id >= t->id_table_size) return NULL;
    int32_t a = t->added_by_id[id];
    if (a >= 0) {
        if (len) *len = t->added[a].len;
        return t->added[a].content;
    }
    if (id < t->vocab.n && t->vocab.str[id]) {
        if (len) *len = t->vocab.len[id];
        return t->vocab.str[id];
    }
    return NULL;
}

const char *tokenizer_token_string(const tokenizer *t, int32_t id) { return tok_id_to_string(t, id, NULL); }

int32_t tokenizer_token_id(const tokenizer *t, const char *token) {
    size_t n = strlen(token);
    int32_t a = tok_addedmap_get(t, token, n);
    if (a >= 0) return t->added[a].id;
    return tok_strmap_get(&t->vocab_map, &t->vocab, token, n);
}

int tokenizer_vocab_size(const tokenizer *t) { return t->id_table_size; }

int tokenizer_is_special(const tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->id_table_size) return 0;
    int32_t a = t->added_by_id[id];
    return a >= 0 && t->added[a].special;
}

const char *tokenizer_bos_token(const tokenizer *t) { return t->bos_token; }
const char *tokenizer_eos_token(const tokenizer *t) { return t->eos_token; }
const char *tokenizer_chat_template(const tokenizer *t) { return t->chat_template; }
