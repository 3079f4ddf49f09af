/* GGUF tokenizer metadata -> tokenizer.json + tokenizer_config.json. See gguf_tokenizer.h. */
#include "model/gguf_tokenizer.h"

#include "base/error.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

enum { TOKEN_NORMAL = 1, TOKEN_UNKNOWN = 2, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4 };

#define SPM_SPACE "\xE2\x96\x81" /* U+2581, SentencePiece's space */

/* Texts llama.cpp treats as end-of-generation control tokens whatever type the file gives them
 * (it overrides the type while loading), so that they are matched whole in a prompt: a GGUF
 * model tokenizes here as it does under llama.cpp. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\234end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", /* \234 = 0x9C: a hex escape would eat "e" */
    "[e~["};

/* The type a token has under llama.cpp: the file's, or CONTROL for the texts above. */
static int64_t token_type(const gguf_kv *types, uint64_t i, gguf_str s) {
    for (size_t k = 0; k < sizeof eog_texts / sizeof *eog_texts; k++)
        if (strlen(eog_texts[k]) == s.len && !memcmp(eog_texts[k], s.ptr, s.len)) return TOKEN_CONTROL;
    return types ? gguf_array_int(types, i) : TOKEN_NORMAL;
}

/* The split regexes of the pre-tokenizers GGUF names (as the models' tokenizer.json have them). */
static const struct {
    const char *names[3];
    const char *regex;
    int nfc, ignore_merges, add_bos;
} pre_table[] = {
    {{"llama-bpe", "llama3", NULL},
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
     "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     0, 1, 1},
    {{"qwen2", NULL, NULL},
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
     "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     1, 0, 0},
    {{"gpt-2", "default", "gpt2"},
     "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", 0, 0, 0},
};

static json_t *byte_level(void) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 0, "use_regex", 0);
}

static json_t *str_json(gguf_str s) { return json_stringn_nocheck(s.ptr, (size_t)s.len); }

/* One added_tokens entry, matched whole in the raw text. */
static json_t *added_token(uint64_t id, gguf_str s, int special) {
    return json_pack("{s:I, s:o, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)id, "content", str_json(s),
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", special);
}

/* vocab (normal tokens), added_tokens (control and user-defined ones). */
static int vocabulary(const gguf_file *f, const gguf_kv *tokens, json_t *model, json_t *added,
                      char *err, size_t errlen) {
    const gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    if (types && (types->type != GGUF_ARRAY || types->n_elems != tokens->n_elems)) {
        error_set(err, errlen, "%s: tokenizer.ggml.token_type must be an array as long as the tokens",
                  gguf_path(f));
        return -1;
    }
    json_t *vocab = json_object();
    json_object_set_new(model, "vocab", vocab);
    for (uint64_t i = 0; i < tokens->n_elems; i++) {
        gguf_str s = gguf_array_string(f, tokens, i);
        int64_t type = token_type(types, i, s), file_type = types ? gguf_array_int(types, i) : TOKEN_NORMAL;
        if (type == TOKEN_CONTROL || type == TOKEN_USER_DEFINED)
            json_array_append_new(added, added_token(i, s, type == TOKEN_CONTROL));
        /* a normal token made control by llama.cpp's rule stays one for the merges that make it */
        if (file_type != TOKEN_CONTROL && file_type != TOKEN_USER_DEFINED &&
            !json_object_getn(vocab, s.ptr, (size_t)s.len))
            json_object_setn_new_nocheck(vocab, s.ptr, (size_t)s.len, json_integer((json_int_t)i));
    }
    return 0;
}

static json_t *merges(const gguf_file *f, char *err, size_t errlen) {
    const gguf_kv *m = gguf_find_kv(f, "tokenizer.ggml.merges");
    if (!m || m->type != GGUF_ARRAY || m->elem_type != GGUF_STRING) {
        error_set(err, errlen, "%s: tokenizer.ggml.merges (a string array) is missing", gguf_path(f));
        return NULL;
    }
    json_t *out = json_array();
    for (uint64_t i = 0; i < m->n_elems; i++) json_array_append_new(out, str_json(gguf_array_string(f, m, i)));
    return out;
}

/* The token string of id (NULL if out of range). */
static json_t *token_string(const gguf_file *f, const gguf_kv *tokens, const char *key) {
    int64_t id;
    if (gguf_get_int(f, key, &id, NULL, 0) || id < 0 || (uint64_t)id >= tokens->n_elems) return NULL;
    return str_json(gguf_array_string(f, tokens, (uint64_t)id));
}

static json_t *bos_template(json_t *bos, int64_t bos_id) {
    const char *b = json_string_value(bos);
    json_t *special = json_object();
    json_object_set_new(special, b, json_pack("{s:s, s:[I], s:[s]}", "id", b, "ids", (json_int_t)bos_id,
                                              "tokens", b));
    return json_pack("{s:s, s:[{s:{s:s,s:i}}, {s:{s:s,s:i}}], s:[{s:{s:s,s:i}}, {s:{s:s,s:i}}, "
                     "{s:{s:s,s:i}}, {s:{s:s,s:i}}], s:o}",
                     "type", "TemplateProcessing", "single", "SpecialToken", "id", b, "type_id", 0,
                     "Sequence", "id", "A", "type_id", 0, "pair", "SpecialToken", "id", b, "type_id",
                     0, "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", b, "type_id", 1,
                     "Sequence", "id", "B", "type_id", 1, "special_tokens", special);
}

/* The fields both vocabulary kinds share: BOS template, BOS/EOS, the chat template. */
static int common_fields(const gguf_file *f, const gguf_kv *tokens, int add_bos, json_t *tok, json_t *cfg,
                         json_t *no_bos_processor, char *err, size_t errlen) {
    if (gguf_find_kv(f, "tokenizer.ggml.add_bos_token") &&
        gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, err, errlen)) {
        json_decref(no_bos_processor);
        return -1;
    }
    json_t *bos = token_string(f, tokens, "tokenizer.ggml.bos_token_id");
    json_t *eos = token_string(f, tokens, "tokenizer.ggml.eos_token_id");
    int64_t bos_id = 0;
    gguf_get_int(f, "tokenizer.ggml.bos_token_id", &bos_id, NULL, 0);
    if (add_bos && bos) {
        json_decref(no_bos_processor);
        json_object_set_new(tok, "post_processor", bos_template(bos, bos_id));
    } else {
        json_object_set_new(tok, "post_processor", no_bos_processor);
    }
    json_object_set_new(cfg, "bos_token", bos ? bos : json_null());
    json_object_set_new(cfg, "eos_token", eos ? eos : json_null());
    json_object_set_new(cfg, "add_bos_token", json_boolean(add_bos));
    const gguf_kv *tmpl = gguf_find_kv(f, "tokenizer.chat_template");
    if (tmpl && tmpl->type == GGUF_STRING) json_object_set_new(cfg, "chat_template", str_json(tmpl->str));
    return 0;
}

/* ---- SentencePiece ("llama") vocabularies: llama.cpp's SPM tokenizer as a BPE ---- */

typedef struct spm_merge {
    uint32_t left, right; /* token ids */
    float score;          /* of the merged token */
} spm_merge;

static int by_score(const void *a, const void *b) {
    const spm_merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->left != y->left ? (x->left < y->left ? -1 : 1) : (x->right > y->right) - (x->right < y->right);
}

/* Every way to write a token as two tokens (split at each UTF-8 character boundary), each
 * ranked by the merged token's score: llama.cpp's SPM tokenizer merges, among adjacent symbol
 * pairs whose concatenation is a token, the one whose token scores highest (the leftmost among
 * equal scores) until none is left, which is BPE with these merges when merges of equal score
 * share a rank (model.exo_merge_ranks; text/'s BPE takes the leftmost of equal ranks). */
static int spm_merges(const gguf_file *f, const gguf_kv *tokens, const gguf_kv *scores, json_t *vocab,
                      json_t *bpe) {
    size_t n = 0, cap = 1024;
    spm_merge *ms = malloc(cap * sizeof *ms);
    if (!ms) return -1;
    for (uint64_t id = 0; id < tokens->n_elems; id++) {
        gguf_str s = gguf_array_string(f, tokens, id);
        if (json_integer_value(json_object_getn(vocab, s.ptr, (size_t)s.len)) != (json_int_t)id) continue;
        for (uint64_t k = 1; k < s.len; k++) {
            if (((uint8_t)s.ptr[k] & 0xC0) == 0x80) continue; /* inside a character */
            json_t *l = json_object_getn(vocab, s.ptr, (size_t)k);
            json_t *r = json_object_getn(vocab, s.ptr + k, (size_t)(s.len - k));
            if (!l || !r) continue;
            if (n == cap) {
                spm_merge *p = realloc(ms, (cap *= 2) * sizeof *ms);
                if (!p) {
                    free(ms);
                    return -1;
                }
                ms = p;
            }
            ms[n++] = (spm_merge){(uint32_t)json_integer_value(l), (uint32_t)json_integer_value(r),
                                  (float)gguf_array_float(scores, id)};
        }
    }
    qsort(ms, n, sizeof *ms, by_score);
    json_t *merges = json_array(), *ranks = json_array();
    int64_t rank = -1;
    for (size_t i = 0; i < n; i++) {
        gguf_str l = gguf_array_string(f, tokens, ms[i].left), r = gguf_array_string(f, tokens, ms[i].right);
        if (i == 0 || ms[i].score != ms[i - 1].score) rank++;
        json_array_append_new(merges, json_pack("[o, o]", str_json(l), str_json(r)));
        json_array_append_new(ranks, json_integer((json_int_t)rank));
    }
    free(ms);
    json_object_set_new(bpe, "merges", merges);
    json_object_set_new(bpe, "exo_merge_ranks", ranks);
    return 0;
}

static json_t *spm_replace(const char *from, const char *to) {
    return json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", from, "content", to);
}

static int build_spm(const gguf_file *f, const gguf_kv *tokens, json_t *tok, json_t *cfg, char *err,
                     size_t errlen) {
    const gguf_kv *scores = gguf_find_kv(f, "tokenizer.ggml.scores");
    const gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    if (!scores || scores->type != GGUF_ARRAY || scores->elem_type != GGUF_F32 ||
        scores->n_elems != tokens->n_elems) {
        error_set(err, errlen, "%s: a SentencePiece vocabulary needs tokenizer.ggml.scores, one F32 "
                  "per token", gguf_path(f));
        return -1;
    }
    if (types && (types->type != GGUF_ARRAY || types->n_elems != tokens->n_elems)) {
        error_set(err, errlen, "%s: tokenizer.ggml.token_type must be an array as long as the tokens",
                  gguf_path(f));
        return -1;
    }
    json_t *vocab = json_object(), *added = json_array();
    int64_t unk_id = -1;
    gguf_get_int(f, "tokenizer.ggml.unknown_token_id", &unk_id, NULL, 0);
    for (uint64_t i = 0; i < tokens->n_elems; i++) {
        gguf_str s = gguf_array_string(f, tokens, i);
        int64_t type = token_type(types, i, s);
        if (!json_object_getn(vocab, s.ptr, (size_t)s.len))
            json_object_setn_new_nocheck(vocab, s.ptr, (size_t)s.len, json_integer((json_int_t)i));
        if (type == TOKEN_UNKNOWN && unk_id < 0) unk_id = (int64_t)i;
        /* llama.cpp matches these in the text before tokenizing it */
        if (type == TOKEN_CONTROL || type == TOKEN_USER_DEFINED || type == TOKEN_UNKNOWN)
            json_array_append_new(added, added_token(i, s, type != TOKEN_USER_DEFINED));
    }
    json_t *unk = unk_id >= 0 && (uint64_t)unk_id < tokens->n_elems
                      ? str_json(gguf_array_string(f, tokens, (uint64_t)unk_id)) : json_null();
    json_t *bpe = json_pack("{s:s, s:o, s:b, s:b, s:b, s:o}", "type", "BPE", "unk_token", unk, "fuse_unk", 1,
                            "byte_fallback", 1, "ignore_merges", 0, "vocab", vocab);
    json_object_set_new(tok, "model", bpe);
    json_object_set_new(tok, "added_tokens", added);
    if (spm_merges(f, tokens, scores, vocab, bpe)) {
        error_set(err, errlen, "out of memory");
        return -1;
    }
    int space_prefix = 1; /* llama.cpp's default for SentencePiece vocabularies */
    if (gguf_find_kv(f, "tokenizer.ggml.add_space_prefix") &&
        gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &space_prefix, err, errlen))
        return -1;
    /* the text (each piece between added tokens) gets a leading space, then spaces become U+2581 */
    json_t *norm = json_array();
    if (space_prefix) json_array_append_new(norm, json_pack("{s:s, s:s}", "type", "Prepend", "prepend", SPM_SPACE));
    json_array_append_new(norm, spm_replace(" ", SPM_SPACE));
    json_object_set_new(tok, "normalizer", json_pack("{s:s, s:o}", "type", "Sequence", "normalizers", norm));
    json_object_set_new(tok, "pre_tokenizer", json_null());
    json_t *dec = json_pack("[o, {s:s}, {s:s}]", spm_replace(SPM_SPACE, " "), "type", "ByteFallback", "type", "Fuse");
    if (space_prefix) json_array_append_new(dec, json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content", " ",
                                                           "start", 1, "stop", 0));
    json_object_set_new(tok, "decoder", json_pack("{s:s, s:o}", "type", "Sequence", "decoders", dec));
    return common_fields(f, tokens, 1, tok, cfg, json_null(), err, errlen);
}

static int build(const gguf_file *f, json_t *tok, json_t *cfg, char *err, size_t errlen) {
    char model[32], pre[64] = "default";
    if (gguf_get_string(f, "tokenizer.ggml.model", model, sizeof model, err, errlen)) return -1;
    if (!strcmp(model, "llama")) {
        const gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
        if (!tokens || tokens->type != GGUF_ARRAY || tokens->elem_type != GGUF_STRING) {
            error_set(err, errlen, "%s: tokenizer.ggml.tokens (a string array) is missing", gguf_path(f));
            return -1;
        }
        return build_spm(f, tokens, tok, cfg, err, errlen);
    }
    if (strcmp(model, "gpt2")) {
        error_set(err, errlen, "%s: tokenizer.ggml.model '%s' is not supported (gpt2-style BPE and "
                  "SentencePiece 'llama' vocabularies)", gguf_path(f), model);
        return -1;
    }
    if (gguf_find_kv(f, "tokenizer.ggml.pre") &&
        gguf_get_string(f, "tokenizer.ggml.pre", pre, sizeof pre, err, errlen))
        return -1;
    int p = -1;
    for (int i = 0; p < 0 && i < (int)(sizeof pre_table / sizeof *pre_table); i++)
        for (int j = 0; j < 3 && pre_table[i].names[j]; j++)
            if (!strcmp(pre, pre_table[i].names[j])) p = i;
    if (p < 0) {
        error_set(err, errlen, "%s: pre-tokenizer '%s' is not supported (llama-bpe, qwen2, gpt-2)",
                  gguf_path(f), pre);
        return -1;
    }
    const gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != GGUF_ARRAY || tokens->elem_type != GGUF_STRING) {
        error_set(err, errlen, "%s: tokenizer.ggml.tokens (a string array) is missing", gguf_path(f));
        return -1;
    }
    json_t *bpe = json_pack("{s:s, s:n, s:b, s:b, s:b}", "type", "BPE", "unk_token", "fuse_unk", 0,
                            "byte_fallback", 0, "ignore_merges", pre_table[p].ignore_merges);
    json_t *added = json_array(), *m = merges(f, err, errlen);
    json_object_set_new(tok, "model", bpe);
    json_object_set_new(tok, "added_tokens", added);
    if (!m || vocabulary(f, tokens, bpe, added, err, errlen)) {
        json_decref(m);
        return -1;
    }
    json_object_set_new(bpe, "merges", m);
    json_object_set_new(tok, "normalizer", pre_table[p].nfc ? json_pack("{s:s}", "type", "NFC") : json_null());
    json_object_set_new(tok, "pre_tokenizer",
                        json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence",
                                  "pretokenizers", "type", "Split", "pattern", "Regex",
                                  pre_table[p].regex, "behavior", "Isolated", "invert", 0, byte_level()));
    json_object_set_new(tok, "decoder", byte_level());
    return common_fields(f, tokens, pre_table[p].add_bos, tok, cfg, byte_level(), err, errlen);
}

int gguf_tokenizer_json(const gguf_file *f, char **tokenizer_json, char **config_json, char *err,
                        size_t errlen) {
    json_t *tok = json_object(), *cfg = json_object();
    int rc = build(f, tok, cfg, err, errlen);
    *tokenizer_json = rc ? NULL : json_dumps(tok, JSON_COMPACT);
    *config_json = rc ? NULL : json_dumps(cfg, JSON_COMPACT);
    json_decref(tok);
    json_decref(cfg);
    if (rc == 0 && (!*tokenizer_json || !*config_json)) {
        free(*tokenizer_json);
        free(*config_json);
        *tokenizer_json = *config_json = NULL;
        error_set(err, errlen, "%s: the tokenizer is not valid UTF-8 or memory ran out", gguf_path(f));
        return -1;
    }
    return rc;
}
