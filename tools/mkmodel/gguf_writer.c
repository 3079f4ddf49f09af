/* mkmodel's GGUF writer: the plan's matrices under llama.cpp's names, quantized to a ggml type,
 * with llama.cpp's metadata and the tokenizer as tokenizer.ggml.* (see mkmodel.h). The values are
 * the safetensors writer's (mk_matrix_values), so a GGUF and a safetensors model made with the
 * same options hold the same weights up to the GGUF type's rounding. */
#include "mkmodel.h"

#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/gguf_quant.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ALIGN 32

static const char *arch_name(mk_arch a) {
    return a == MK_LLAMA ? "llama" : a == MK_QWEN2 ? "qwen2" : a == MK_QWEN3 ? "qwen3" : "qwen3moe";
}

/* ---- the output stream ---- */

typedef struct out {
    FILE *f;
    int failed;
} out;

static void put(out *o, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, o->f) != n) o->failed = 1;
}
static void put_u32(out *o, uint32_t v) { put(o, &v, 4); }
static void put_u64(out *o, uint64_t v) { put(o, &v, 8); }
static void put_str(out *o, const char *s, size_t n) {
    put_u64(o, n);
    put(o, s, n);
}
static void kv_head(out *o, const char *key, uint32_t type) {
    put_str(o, key, strlen(key));
    put_u32(o, type);
}
static void kv_u32(out *o, const char *key, uint32_t v) { kv_head(o, key, GGUF_U32), put_u32(o, v); }
static void kv_f32(out *o, const char *key, float v) { kv_head(o, key, GGUF_F32), put(o, &v, 4); }
static void kv_bool(out *o, const char *key, int v) {
    uint8_t b = (uint8_t)(v != 0);
    kv_head(o, key, GGUF_BOOL), put(o, &b, 1);
}
static void kv_str(out *o, const char *key, const char *v) {
    kv_head(o, key, GGUF_STRING), put_str(o, v, strlen(v));
}
static void kv_arch_u32(out *o, const char *arch, const char *suffix, uint32_t v) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    kv_u32(o, key, v);
}
static void kv_arch_f32(out *o, const char *arch, const char *suffix, float v) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    kv_f32(o, key, v);
}

/* ---- the tokenizer as metadata ---- */

typedef struct vocab {
    const char **tokens; /* by id; NULL: a padding id */
    int32_t *types;
    int64_t n;
    json_t *tok, *cfg; /* own the strings */
    const char *pre;
    int64_t bos, eos;
    int spm;        /* a SentencePiece vocabulary (byte_fallback): written as llama.cpp's "llama" */
    int64_t unk;    /* spm: the unk_token's id, or -1 */
} vocab;

static int read_vocab(const char *dir, int64_t n_vocab, vocab *v, char *err, size_t errlen) {
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    v->tok = json_load_file(path, 0, &je);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    v->cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je); /* model_max_length: 1e30 */
    json_t *model = json_object_get(v->tok, "model");
    if (!v->tok || !json_is_object(json_object_get(model, "vocab"))) {
        snprintf(err, errlen, "%s: no BPE vocabulary in tokenizer.json", dir);
        return -1;
    }
    v->n = n_vocab;
    v->tokens = calloc((size_t)n_vocab, sizeof *v->tokens);
    v->types = calloc((size_t)n_vocab, sizeof *v->types);
    if (!v->tokens || !v->types) return -1;
    const char *key;
    json_t *val;
    json_object_foreach(json_object_get(model, "vocab"), key, val) {
        int64_t id = json_integer_value(val);
        if (id >= 0 && id < n_vocab) v->tokens[id] = key, v->types[id] = 1;
    }
    size_t i;
    json_array_foreach(json_object_get(v->tok, "added_tokens"), i, val) {
        int64_t id = json_integer_value(json_object_get(val, "id"));
        if (id < 0 || id >= n_vocab) continue;
        v->tokens[id] = json_string_value(json_object_get(val, "content"));
        v->types[id] = json_is_true(json_object_get(val, "special")) ? 3 : 4;
    }
    v->spm = json_is_true(json_object_get(model, "byte_fallback"));
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    v->unk = unk ? json_integer_value(json_object_get(json_object_get(model, "vocab"), unk)) : -1;
    if (v->unk >= 0 && v->unk < n_vocab) v->types[v->unk] = 2; /* UNKNOWN */
    else v->unk = -1;
    for (int64_t id = 0; v->spm && id < n_vocab; id++) /* "<0x0A>": BYTE */
        if (v->tokens[id] && strlen(v->tokens[id]) == 6 && !strncmp(v->tokens[id], "<0x", 3) &&
            v->tokens[id][5] == '>' && v->types[id] == 1)
            v->types[id] = 6;
    const char *dump = json_dumps(json_object_get(v->tok, "pre_tokenizer"), 0);
    v->pre = dump && strstr(dump, "\\\\p{N}{1,3}") ? "llama-bpe" : "qwen2";
    free((void *)dump);
    return 0;
}

/* A SentencePiece vocabulary as llama.cpp's converter writes one: tokens, their scores and types;
 * no merges. The scores are the tokenizer.json's merge order (SentencePiece's BPE scores a piece
 * by the step that made it, and Hugging Face's converter lists merges in that order): the first
 * merge making a token gives it -rank; tokens no merge makes (characters, bytes, control
 * tokens) score below every merged one, by id. */
static void write_spm_tokenizer(out *o, vocab *v) {
    json_t *model = json_object_get(v->tok, "model"), *vmap = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    float *scores = malloc((size_t)v->n * sizeof *scores);
    for (int64_t i = 0; scores && i < v->n; i++) scores[i] = -(float)(json_array_size(merges) + (size_t)i);
    size_t r;
    json_t *m;
    json_array_foreach(merges, r, m) {
        char piece[1024];
        const char *a = json_string_value(json_is_array(m) ? json_array_get(m, 0) : m), *b = NULL;
        if (json_is_array(m)) b = json_string_value(json_array_get(m, 1));
        if (!a || !scores) continue;
        if (b) snprintf(piece, sizeof piece, "%s%s", a, b);
        else { /* "left right" */
            const char *sp = strchr(a, ' ');
            if (!sp) continue;
            snprintf(piece, sizeof piece, "%.*s%s", (int)(sp - a), a, sp + 1);
        }
        json_t *id = json_object_get(vmap, piece);
        int64_t k = json_is_integer(id) ? json_integer_value(id) : -1;
        if (k >= 0 && k < v->n && -(float)r > scores[k]) scores[k] = -(float)r;
    }
    kv_str(o, "tokenizer.ggml.model", "llama");
    kv_head(o, "tokenizer.ggml.scores", GGUF_ARRAY);
    put_u32(o, GGUF_F32);
    put_u64(o, (uint64_t)v->n);
    for (int64_t i = 0; i < v->n; i++) {
        float score = scores ? scores[i] : 0.0f;
        put(o, &score, 4);
    }
    free(scores);
    if (v->unk >= 0) kv_u32(o, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk);
    kv_bool(o, "tokenizer.ggml.add_space_prefix", 1);
}

/* The BPE merges of a gpt2-style vocabulary, as "left right" strings. */
static void write_merges(out *o, vocab *v) {
    json_t *merges = json_object_get(json_object_get(v->tok, "model"), "merges");
    kv_head(o, "tokenizer.ggml.merges", GGUF_ARRAY);
    put_u32(o, GGUF_STRING);
    put_u64(o, json_array_size(merges));
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        char buf[1024];
        if (json_is_array(m))
            snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(m, 0)),
                     json_string_value(json_array_get(m, 1)));
        else
            snprintf(buf, sizeof buf, "%s", json_string_value(m));
        put_str(o, buf, strlen(buf));
    }
}

static void write_tokenizer(out *o, vocab *v, int64_t bos, int64_t eos) {
    if (v->spm) {
        write_spm_tokenizer(o, v);
    } else {
        kv_str(o, "tokenizer.ggml.model", "gpt2");
        kv_str(o, "tokenizer.ggml.pre", v->pre);
        write_merges(o, v);
    }
    kv_head(o, "tokenizer.ggml.tokens", GGUF_ARRAY);
    put_u32(o, GGUF_STRING);
    put_u64(o, (uint64_t)v->n);
    for (int64_t i = 0; i < v->n; i++) {
        char pad[48];
        const char *t = v->tokens[i];
        if (!t) snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i), t = pad;
        put_str(o, t, strlen(t));
    }
    kv_head(o, "tokenizer.ggml.token_type", GGUF_ARRAY);
    put_u32(o, GGUF_I32);
    put_u64(o, (uint64_t)v->n);
    for (int64_t i = 0; i < v->n; i++) put_u32(o, (uint32_t)(v->tokens[i] ? v->types[i] : 5));
    if (bos >= 0) kv_u32(o, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (eos >= 0) kv_u32(o, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    kv_bool(o, "tokenizer.ggml.add_bos_token", v->spm || !strcmp(v->pre, "llama-bpe"));
    const char *tmpl = json_string_value(json_object_get(v->cfg, "chat_template"));
    if (tmpl) kv_str(o, "tokenizer.chat_template", tmpl);
}

static int count_tokenizer_kvs(const vocab *v, int64_t bos, int64_t eos) {
    /* gpt2: model, pre, merges, tokens, types, add_bos; spm: model, scores, add_space_prefix,
     * tokens, types, add_bos, and the unknown token's id */
    return 6 + (v->spm && v->unk >= 0) + (bos >= 0) + (eos >= 0) +
           (json_string_value(json_object_get(v->cfg, "chat_template")) != NULL);
}

/* ---- tensors ---- */

typedef struct gtensor {
    const mk_matrix *m; /* NULL: the rope_freqs table */
    char name[192];
    uint32_t type;
    int64_t ne[3];
    int n_dims;
    int permute_heads; /* llama q/k */
    size_t bytes;
    uint64_t offset;
} gtensor;

/* The GGUF name of a plan matrix (gguf_model's table) and its layer (-1 for top-level ones). */
static int gguf_name(const mk_matrix *m, char *out, size_t n, int *layer) {
    char base[160];
    if (gguf_name_from_hf(m->name, base, sizeof base)) return -1;
    if (sscanf(base, "blk.%d.", layer) != 1) *layer = -1;
    return snprintf(out, n, "%s.%s", base, m->suffix) < (int)n ? 0 : -1;
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third between. */
static int more_bits(int layer, int n) {
    return layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2;
}

static uint32_t tensor_type(const mk_config *c, const gtensor *t, int layer, int q4_k_m, uint32_t base) {
    if (t->m->vector || !strcmp(t->m->suffix, "bias") || strstr(t->name, ".ffn_gate_inp."))
        return GGML_TYPE_F32;
    if (!q4_k_m) return base;
    /* the output matrix (a tied model's embedding is it) */
    if (strstr(t->name, "output.weight") == t->name ||
        (c->tie_embeddings && strstr(t->name, "token_embd.weight") == t->name))
        return GGML_TYPE_Q6_K;
    if ((strstr(t->name, ".attn_v.") || strstr(t->name, ".ffn_down")) && more_bits(layer, (int)c->layers))
        return GGML_TYPE_Q6_K;
    return GGML_TYPE_Q4_K;
}

/* --gguf-row-pool: the first `pool` rows of the matrix's values, quantized once, then row r of
 * every stacked matrix is pool row (r * 7919 + e) % pool, written in chunks of ~4 MiB. The writer
 * runs at copy speed (an 8B-shaped Q8_0 file in seconds instead of minutes of drawing and
 * quantizing 8e9 values); kernels and memory see a real file of real blocks. */
static int write_pooled(out *o, const mk_config *c, const gtensor *t, size_t row_bytes) {
    const mk_matrix *m = t->m;
    int64_t stack = m->stack ? m->stack : 1, cols = m->in, rows = m->out, pool = c->gguf_row_pool;
    int64_t chunk = (int64_t)((4u << 20) / row_bytes) + 1;
    float *vals = malloc((size_t)(pool * cols) * sizeof *vals);
    uint8_t *rows_q = malloc((size_t)pool * row_bytes), *buf = malloc((size_t)chunk * row_bytes);
    int rc = vals && rows_q && buf ? 0 : -1;
    uint64_t st = mk_matrix_seed(c, m, 0);
    if (rc == 0) mk_matrix_values(m, &st, vals, pool * cols);
    for (int64_t r = 0; r < pool && rc == 0; r++)
        rc = gguf_quantize_row(t->type, vals + r * cols, cols, rows_q + (size_t)r * row_bytes);
    for (int64_t e = 0; e < stack && rc == 0; e++)
        for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
            int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
            for (int64_t r = 0; r < nr; r++)
                memcpy(buf + (size_t)r * row_bytes, rows_q + (size_t)(((r0 + r) * 7919 + e) % pool) * row_bytes,
                       row_bytes);
            put(o, buf, (size_t)nr * row_bytes);
        }
    free(vals);
    free(rows_q);
    free(buf);
    return rc || o->failed ? -1 : 0;
}

/* Writes one matrix's data: values drawn row-chunk by row-chunk, q/k rows permuted for llama. */
static int write_data(out *o, const mk_config *c, const gtensor *t) {
    const mk_matrix *m = t->m;
    int64_t stack = m->stack ? m->stack : 1, cols = m->in, rows = m->out;
    size_t row_bytes = t->bytes / (size_t)(stack * rows);
    if (c->gguf_row_pool && rows > c->gguf_row_pool) return write_pooled(o, c, t, row_bytes);
    int64_t chunk = t->permute_heads ? rows : (int64_t)((4u << 20) / ((uint64_t)cols * 4));
    chunk = chunk < 1 ? 1 : chunk > rows ? rows : chunk;
    float *vals = malloc((size_t)(chunk * cols) * sizeof *vals);
    uint8_t *buf = malloc((size_t)chunk * row_bytes);
    int rc = vals && buf ? 0 : -1;
    for (int64_t e = 0; e < stack && rc == 0; e++) {
        uint64_t st = mk_matrix_seed(c, m, e);
        for (int64_t r0 = 0; r0 < rows && rc == 0; r0 += chunk) {
            int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
            mk_matrix_values(m, &st, vals, nr * cols);
            for (int64_t r = 0; r < nr && rc == 0; r++) {
                int64_t dst = r;
                if (t->permute_heads) { /* HF row (h, a, b) -> GGUF row h*hd + 2b + a */
                    int64_t hd = rows / t->permute_heads, h = r / hd, i = r % hd, half = hd / 2;
                    dst = h * hd + 2 * (i % half) + i / half;
                }
                rc = gguf_quantize_row(t->type, vals + r * cols, cols, buf + (size_t)dst * row_bytes);
            }
            put(o, buf, (size_t)nr * row_bytes);
        }
    }
    free(vals);
    free(buf);
    return rc || o->failed ? -1 : 0;
}

static void rope_table(const mk_config *c, float *table) {
    double lo = 1, hi = 4, old = (double)c->rope_original_max, factor = c->rope_factor;
    for (int64_t i = 0; i < c->head_dim / 2; i++) {
        double freq = pow(c->rope_theta, -2.0 * (double)i / (double)c->head_dim), wl = 2 * M_PI / freq;
        double v = 1;
        if (wl > old / lo) v = factor;
        else if (wl >= old / hi) {
            double smooth = (old / wl - lo) / (hi - lo);
            v = 1 / ((1 - smooth) / factor + smooth);
        }
        table[i] = (float)v;
    }
}

static int write_all(out *o, const mk_config *c, const mk_plan *plan, vocab *v, const char *type,
                     char *err, size_t errlen) {
    int q4_k_m = !strcasecmp(type, "Q4_K_M");
    int base = q4_k_m ? GGML_TYPE_Q4_K : ggml_type_from_name(type);
    if (base < 0 || (gguf_mlx_bits((uint32_t)base) < 0)) {
        snprintf(err, errlen, "unknown GGUF type '%s' (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K "
                 "Q4_K Q5_K Q6_K Q4_K_M)", type);
        return -1;
    }
    if (c->arch != MK_LLAMA && c->arch != MK_QWEN2 && c->arch != MK_QWEN3 && c->arch != MK_QWEN3_MOE) {
        snprintf(err, errlen, "--gguf writes llama, qwen2, qwen3 and qwen3_moe models only");
        return -1;
    }
    const char *arch = arch_name(c->arch);
    int rope_freqs = c->arch == MK_LLAMA && c->rope_scaling == MK_ROPE_LLAMA3;
    gtensor *ts = calloc(plan->n + 1, sizeof *ts);
    if (!ts) return -1;
    size_t n = 0;
    uint64_t off = 0;
    for (size_t i = 0; i < plan->n; i++) {
        gtensor *t = &ts[n];
        int layer;
        t->m = &plan->items[i];
        if (gguf_name(t->m, t->name, sizeof t->name, &layer)) continue;
        t->type = tensor_type(c, t, layer, q4_k_m, (uint32_t)base);
        t->n_dims = t->m->vector ? 1 : t->m->stack ? 3 : 2;
        t->ne[0] = t->m->in, t->ne[1] = t->m->out, t->ne[2] = t->m->stack;
        if (t->m->in % ggml_type_block_elems(t->type)) {
            snprintf(err, errlen, "%s has rows of %lld values, not a multiple of %s's block of %lld",
                     t->name, (long long)t->m->in, ggml_type_name(t->type),
                     (long long)ggml_type_block_elems(t->type));
            free(ts);
            return -1;
        }
        if (c->arch == MK_LLAMA && (strstr(t->name, ".attn_q.weight") || strstr(t->name, ".attn_k.weight")))
            t->permute_heads = (int)(strstr(t->name, ".attn_q.") ? c->heads : c->kv_heads);
        int64_t count = t->m->in * t->m->out * (t->m->stack ? t->m->stack : 1);
        t->bytes = (size_t)(count / ggml_type_block_elems(t->type)) * ggml_type_block_bytes(t->type);
        t->offset = off;
        off += (t->bytes + ALIGN - 1) / ALIGN * ALIGN;
        n++;
    }
    if (rope_freqs) {
        gtensor *t = &ts[n++];
        snprintf(t->name, sizeof t->name, "rope_freqs.weight");
        t->type = GGML_TYPE_F32, t->n_dims = 1, t->ne[0] = c->head_dim / 2;
        t->bytes = (size_t)t->ne[0] * 4, t->offset = off;
        off += (t->bytes + ALIGN - 1) / ALIGN * ALIGN;
    }
    int moe = c->arch == MK_QWEN3_MOE;
    int n_kv = 14 + (moe ? 3 : 0) + (v ? count_tokenizer_kvs(v, c->bos_id, c->eos_id) : 2) +
               (c->rope_scaling == MK_ROPE_LINEAR || c->rope_scaling == MK_ROPE_YARN ? 3 : 0) +
               rope_freqs;
    put(o, "GGUF", 4);
    put_u32(o, 3);
    put_u64(o, n);
    put_u64(o, (uint64_t)n_kv);
    kv_str(o, "general.architecture", arch);
    kv_str(o, "general.name", "mkmodel random weights");
    kv_u32(o, "general.alignment", ALIGN);
    /* what llama-quantize records: the mix's name, or the pure type's (Q3_K/Q4_K/Q5_K alone are
     * its _S mixes' nearest names) */
    static const struct { const char *type, *file_type; } pure[] = {
        {"Q3_K", "Q3_K_S"}, {"Q4_K", "Q4_K_S"}, {"Q5_K", "Q5_K_S"}};
    const char *ftname = type;
    for (size_t i = 0; i < sizeof pure / sizeof *pure; i++)
        if (!strcasecmp(type, pure[i].type)) ftname = pure[i].file_type;
    kv_u32(o, "general.file_type", (uint32_t)gguf_file_type_from_name(ftname));
    kv_arch_u32(o, arch, "block_count", (uint32_t)c->layers);
    kv_arch_u32(o, arch, "context_length", (uint32_t)c->max_pos);
    kv_arch_u32(o, arch, "embedding_length", (uint32_t)c->hidden);
    kv_arch_u32(o, arch, "feed_forward_length", (uint32_t)c->intermediate);
    kv_arch_u32(o, arch, "attention.head_count", (uint32_t)c->heads);
    kv_arch_u32(o, arch, "attention.head_count_kv", (uint32_t)c->kv_heads);
    kv_arch_u32(o, arch, "attention.key_length", (uint32_t)c->head_dim);
    kv_arch_u32(o, arch, "attention.value_length", (uint32_t)c->head_dim);
    kv_arch_f32(o, arch, "attention.layer_norm_rms_epsilon", (float)c->rms_norm_eps);
    kv_arch_f32(o, arch, "rope.freq_base", (float)c->rope_theta);
    if (moe) {
        kv_arch_u32(o, arch, "expert_count", (uint32_t)c->experts);
        kv_arch_u32(o, arch, "expert_used_count", (uint32_t)c->experts_per_tok);
        kv_arch_u32(o, arch, "expert_feed_forward_length", (uint32_t)c->moe_intermediate);
    }
    if (c->rope_scaling == MK_ROPE_LINEAR || c->rope_scaling == MK_ROPE_YARN) {
        char key[128];
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        kv_str(o, key, c->rope_scaling == MK_ROPE_LINEAR ? "linear" : "yarn");
        kv_arch_f32(o, arch, "rope.scaling.factor", (float)c->rope_factor);
        kv_arch_u32(o, arch, "rope.scaling.original_context_length", (uint32_t)c->rope_original_max);
    }
    if (rope_freqs) /* the table's original context (llama.cpp's converter assumes 8192) */
        kv_arch_u32(o, arch, "rope.scaling.original_context_length", (uint32_t)c->rope_original_max);
    if (v) write_tokenizer(o, v, c->bos_id, c->eos_id);
    else { /* no tokenizer: llama.cpp's "none" vocabulary of vocab_size dummy tokens */
        kv_str(o, "tokenizer.ggml.model", "none");
        kv_arch_u32(o, arch, "vocab_size", (uint32_t)c->vocab);
    }
    for (size_t i = 0; i < n; i++) {
        put_str(o, ts[i].name, strlen(ts[i].name));
        put_u32(o, (uint32_t)ts[i].n_dims);
        for (int d = 0; d < ts[i].n_dims; d++) put_u64(o, (uint64_t)ts[i].ne[d]);
        put_u32(o, ts[i].type);
        put_u64(o, ts[i].offset);
    }
    static const uint8_t zeros[ALIGN];
    long pos = ftell(o->f);
    put(o, zeros, (size_t)((ALIGN - pos % ALIGN) % ALIGN));
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0 && !o->failed; i++) {
        if (ts[i].m) rc = write_data(o, c, &ts[i]);
        else {
            float table[1024];
            rope_table(c, table);
            put(o, table, ts[i].bytes);
        }
        put(o, zeros, (size_t)((ALIGN - ts[i].bytes % ALIGN) % ALIGN));
    }
    free(ts);
    if (rc || o->failed) snprintf(err, errlen, "writing the GGUF file failed");
    return rc || o->failed ? -1 : 0;
}

int mk_write_gguf(const mk_config *cfg, const mk_plan *plan, const char *tokdir, const char *type,
                  const char *path, char *err, size_t errlen) {
    vocab v = {0};
    if (tokdir && read_vocab(tokdir, cfg->vocab, &v, err, errlen)) {
        json_decref(v.tok), json_decref(v.cfg), free(v.tokens), free(v.types);
        return -1;
    }
    out o = {.f = fopen(path, "wb")};
    int rc = -1;
    if (!o.f) snprintf(err, errlen, "cannot create %s", path);
    else {
        rc = write_all(&o, cfg, plan, tokdir ? &v : NULL, type, err, errlen);
        if (fclose(o.f) && rc == 0) {
            snprintf(err, errlen, "writing %s failed", path);
            rc = -1;
        }
    }
    json_decref(v.tok), json_decref(v.cfg), free(v.tokens), free(v.types);
    return rc;
}
