/* GGUF tokenizer metadata -> tokenizer.json + tokenizer_config.json. See gguf_tokenizer.h. */
#include "model/gguf_tokenizer.h"

#include "base/error.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

enum { TOKEN_NORMAL = 1, TOKEN_UNKNOWN = 2, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4 };

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
        int64_t type = types ? gguf_array_int(types, i) : TOKEN_NORMAL;
        char *key = strndup(s.ptr, (size_t)s.len);
        if (!key) return -1;
        if (type == TOKEN_CONTROL || type == TOKEN_USER_DEFINED)
            json_array_append_new(added, json_pack("{s:I, s:o, s:b, s:b, s:b, s:b, s:b}", "id",
                                                   (json_int_t)i, "content", str_json(s), "single_word",
                                                   0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                                   "special", type == TOKEN_CONTROL));
        else if (!json_object_get(vocab, key))
            json_object_set_new(vocab, key, json_integer((json_int_t)i));
        free(key);
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

static int build(const gguf_file *f, json_t *tok, json_t *cfg, char *err, size_t errlen) {
    char model[32], pre[64] = "default";
    if (gguf_get_string(f, "tokenizer.ggml.model", model, sizeof model, err, errlen)) return -1;
    if (strcmp(model, "gpt2")) {
        error_set(err, errlen, "%s: tokenizer.ggml.model '%s' is not supported (gpt2-style BPE only)",
                  gguf_path(f), model);
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
    int add_bos = pre_table[p].add_bos;
    if (gguf_find_kv(f, "tokenizer.ggml.add_bos_token") &&
        gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, err, errlen))
        return -1;
    json_t *bos = token_string(f, tokens, "tokenizer.ggml.bos_token_id");
    json_t *eos = token_string(f, tokens, "tokenizer.ggml.eos_token_id");
    int64_t bos_id = 0;
    gguf_get_int(f, "tokenizer.ggml.bos_token_id", &bos_id, NULL, 0);
    json_object_set_new(tok, "post_processor", add_bos && bos ? bos_template(bos, bos_id) : byte_level());
    json_object_set_new(cfg, "bos_token", bos ? bos : json_null());
    json_object_set_new(cfg, "eos_token", eos ? eos : json_null());
    json_object_set_new(cfg, "add_bos_token", json_boolean(add_bos));
    const gguf_kv *tmpl = gguf_find_kv(f, "tokenizer.chat_template");
    if (tmpl && tmpl->type == GGUF_STRING) json_object_set_new(cfg, "chat_template", str_json(tmpl->str));
    return 0;
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
