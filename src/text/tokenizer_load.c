/* tokenizer_load — reads a Hugging Face tokenizer.json (+ tokenizer_config.json) into the
 * structs of tokenizer_internal.h: the BPE model (vocabulary, merges), added tokens and their
 * trie, the special tokens and chat template of the config, and the public queries over a
 * loaded tokenizer. The pipeline components are read by tokenizer_pipeline.c, the hash maps
 * and UTF-8 helpers live in tokenizer_tables.c. Every byte of both files is untrusted: a
 * malformed or unsupported file yields NULL and a message naming the field, never a crash.
 * It refuses models other than BPE. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "text/tokenizer_internal.h"
#include "text/tokenizer_json.h"

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

static int load_vocab(tokenizer *t, tok_load_ctx *c, const char *json, const tok_json_spans *sp) {
    if (!sp->vocab_len) {
        tok_load_fail(c, "model.vocab must be an object of token -> id");
        return -1;
    }
    vocab_collect vc = {.max_id = -1};
    int rc = tok_json_vocab(json + sp->vocab, sp->vocab_len, collect_vocab, &vc);
    if (rc) {
        if (vc.bad)
            tok_load_fail(c, "model.vocab: id %lld is not in [0, %d)", vc.bad_id, TOK_MAX_ID);
        else if (rc == -2)
            tok_load_fail(c, "model.vocab: every value must be an integer id");
        else
            tok_load_fail(c, "model.vocab: out of memory");
        goto fail;
    }
    if ((size_t)vc.max_id + 1 > 2 * vc.n + 65536) {
        tok_load_fail(c, "model.vocab: ids go up to %d for %zu tokens; ids must be (nearly) dense",
                      vc.max_id, vc.n);
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
            tok_load_fail(c, "model.vocab: id %d is used by two tokens", id);
            goto fail;
        }
        t->vocab.str[id] = t->vocab_arena + vc.v[i].off;
        t->vocab.len[id] = vc.v[i].len;
        tok_strmap_put(&t->vocab_map, &t->vocab, id);
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
    tok_load_ctx *c;
    char *joined;
    size_t cap;
    json_t *ranks; /* model.exo_merge_ranks or NULL: merge i's rank (default: i) */
} merge_collect;

static int collect_merge(void *user, size_t i, const char *a, size_t alen, const char *b, size_t blen) {
    merge_collect *m = user;
    tokenizer *t = m->t;
    if (!a || !b) {
        tok_load_fail(m->c, "model.merges[%zu]: expected \"left right\" or [left, right]", i);
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
        tok_load_fail(m->c, "model.merges[%zu]: \"%.*s\" + \"%.*s\" is not in the vocabulary", i,
                      (int)(alen > 30 ? 30 : alen), a, (int)(blen > 30 ? 30 : blen), b);
        return -1;
    }
    if (i >= INT32_MAX) return -1;
    json_int_t rank = (json_int_t)i;
    if (m->ranks) {
        json_t *r = json_array_get(m->ranks, i);
        if (!json_is_integer(r) || json_integer_value(r) < 0 || json_integer_value(r) >= INT32_MAX) {
            tok_load_fail(m->c, "model.exo_merge_ranks[%zu]: expected a rank in [0, 2^31) for every merge", i);
            return -1;
        }
        rank = json_integer_value(r);
    }
    tok_merges_put(&t->merges, ia, ib, (int32_t)rank, iab);
    return 0;
}

static int load_merges(tokenizer *t, tok_load_ctx *c, const char *json, const tok_json_spans *sp,
                       json_t *model) {
    json_t *m = json_object_get(model, "merges");
    if (!sp->merges_len) {
        if (!m || json_is_null(m)) return 0;
        tok_load_fail(c, "model.merges must be an array");
        return -1;
    }
    /* the span is at least "[]"; an upper bound on the element count sizes the table */
    size_t n = sp->merges_len / 4 + 1, cap = 16;
    while (cap < n * 2 + 2) cap <<= 1;
    t->merges.slots = malloc(cap * sizeof(tok_merge_entry));
    if (!t->merges.slots) return -1;
    for (size_t i = 0; i < cap; i++) t->merges.slots[i].key = UINT64_MAX;
    t->merges.mask = cap - 1;
    /* exo's own extension (model/gguf_tokenizer.c writes it for SentencePiece vocabularies):
     * explicit ranks, equal for merges that must compete by position alone */
    json_t *ranks = json_object_get(model, "exo_merge_ranks");
    if (ranks && !json_is_array(ranks)) {
        tok_load_fail(c, "model.exo_merge_ranks must be an array");
        return -1;
    }
    merge_collect mc = {t, c, NULL, 0, ranks};
    int rc = tok_json_merges(json + sp->merges, sp->merges_len, collect_merge, &mc);
    free(mc.joined);
    if (rc && c->err && !c->err[0]) tok_load_fail(c, "model.merges: malformed");
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

static int load_model(tokenizer *t, tok_load_ctx *c, json_t *model, const char *json,
                      const tok_json_spans *sp) {
    const char *type = tok_json_type(model);
    if (!json_is_object(model)) {
        tok_load_fail(c, "missing \"model\" object");
        return -1;
    }
    if (type && strcmp(type, "BPE") != 0) {
        tok_load_fail(c, "model type \"%s\" is not supported (only BPE)", type);
        return -1;
    }
    if (!type && !json_object_get(model, "merges")) {
        tok_load_fail(c, "model has no \"type\" and no merges: only BPE is supported");
        return -1;
    }
    if (load_vocab(t, c, json, sp)) return -1;
    if (load_merges(t, c, json, sp, model)) return -1;
    t->byte_fallback = (uint8_t)tok_json_bool(model, "byte_fallback", 0);
    t->fuse_unk = (uint8_t)tok_json_bool(model, "fuse_unk", 0);
    t->ignore_merges = (uint8_t)tok_json_bool(model, "ignore_merges", 0);
    json_t *unk = json_object_get(model, "unk_token");
    t->unk_id = -1;
    if (json_is_string(unk)) {
        t->unk_id = tok_strmap_get(&t->vocab_map, &t->vocab, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0) {
            tok_load_fail(c, "model.unk_token \"%.40s\" is not in the vocabulary",
                          json_string_value(unk));
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

static int load_added(tokenizer *t, tok_load_ctx *c, json_t *arr) {
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) {
        tok_load_fail(c, "\"added_tokens\" must be an array");
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
            tok_load_fail(
                c,
                "added_tokens[%zu]: needs an integer \"id\" in [0, %d) and a non-empty \"content\"",
                i, TOK_MAX_ID);
            return -1;
        }
        if (json_integer_value(id) >= (json_int_t)t->vocab.n + 2 * (json_int_t)n + 65536) {
            tok_load_fail(c, "added_tokens[%zu]: id %lld is far beyond the vocabulary (%d tokens)",
                          i, (long long)json_integer_value(id), t->vocab.n);
            return -1;
        }
        tok_added *a = &t->added[t->n_added++];
        a->id = (int32_t)json_integer_value(id);
        a->len = (uint32_t)json_string_length(content);
        a->content = tok_dup_bytes(json_string_value(content), a->len);
        if (!a->content) return -1;
        a->special = (uint8_t)tok_json_bool(v, "special", 0);
        a->lstrip = (uint8_t)tok_json_bool(v, "lstrip", 0);
        a->rstrip = (uint8_t)tok_json_bool(v, "rstrip", 0);
        a->single_word = (uint8_t)tok_json_bool(v, "single_word", 0);
        /* HF default: special tokens are not normalized, others are */
        a->normalized = (uint8_t)tok_json_bool(v, "normalized", !a->special);
        tok_addedmap_put(t, t->n_added - 1);
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

static int load_config(tokenizer *t, tok_load_ctx *c, const char *json, size_t len) {
    json_error_t je;
    /* big integers (model_max_length = 1e30) are common here: read numbers as reals */
    json_t *cfg = json_loadb(json, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg || !json_is_object(cfg)) {
        tok_load_fail(c, "not a JSON object (line %d: %s)", je.line,
                      cfg ? "top level is not an object" : je.text);
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
    tok_load_ctx c = {err, errlen, "tokenizer.json"};
    if (err && errlen) err[0] = 0;
    tok_byte_level_init();
    if (!tokenizer_json) {
        tok_load_fail(&c, "no data");
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
        if (root)
            tok_load_fail(&c, "top level is not a JSON object");
        else if (je.line)
            tok_load_fail(&c, "invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
        else
            tok_load_fail(&c, "invalid JSON: %s", je.text);
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
    if (!rc) rc = tok_parse_normalizer(t, &c, json_object_get(root, "normalizer"), 0);
    if (!rc) rc = tok_parse_pretokenizer(t, &c, json_object_get(root, "pre_tokenizer"), 0);
    if (!rc) rc = tok_parse_decoder(t, &c, json_object_get(root, "decoder"), 0);
    if (!rc) rc = tok_parse_post(t, &c, json_object_get(root, "post_processor"), 0);
    for (int k = 0; !rc && k < t->n_post_prefix + t->n_post_suffix; k++) {
        int32_t id = k < t->n_post_prefix ? t->post_prefix[k] : t->post_suffix[k - t->n_post_prefix];
        if (id >= t->id_table_size) {
            tok_load_fail(&c, "post_processor: id %d is outside the vocabulary", id);
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
    /* chat_template.jinja, where a model ships one (gpt-oss), wins over tokenizer_config.json's
     * chat_template, as in transformers */
    snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
    size_t tlen = 0;
    char *jinja = t ? read_file(path, &tlen, NULL, 0) : NULL;
    if (jinja) {
        free(t->chat_template);
        t->chat_template = jinja;
    }
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
        tok_pattern_free(&t->norms[k].pattern);
        free(t->norms[k].content);
    }
    free(t->norms);
    for (int k = 0; k < t->n_pres; k++)
        tok_pattern_free(&t->pres[k].pattern);
    free(t->pres);
    for (int k = 0; k < t->n_decs; k++) {
        tok_pattern_free(&t->decs[k].pattern);
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
