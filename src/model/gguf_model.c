/* A GGUF file as an exo model: metadata -> config.json, tensors -> Hugging Face names. See
 * gguf_model.h. */
#include "model/gguf_model.h"

#include "base/cpus.h"
#include "base/error.h"
#include "base/log.h"
#include "base/threadpool.h"
#include "model/gguf_quant.h"
#include "model/weight_types.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- metadata -> config.json ---- */

static const struct {
    const char *gguf, *hf;
} arch_table[] = {
    {"llama", "LlamaForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},
    {"qwen3moe", "Qwen3MoeForCausalLM"},
};

typedef struct meta {
    const gguf_file *f;
    const char *arch;
    char *err;
    size_t errlen;
} meta;

/* "<arch>.<suffix>" as an integer; absent: def (required: error). */
static int arch_int(meta *m, const char *suffix, int required, int64_t def, int64_t *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    if (!gguf_find_kv(m->f, key) && !required) {
        *out = def;
        return 0;
    }
    return gguf_get_int(m->f, key, out, m->err, m->errlen);
}

static int arch_float(meta *m, const char *suffix, double def, double *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    if (!gguf_find_kv(m->f, key)) {
        *out = def;
        return 0;
    }
    return gguf_get_float(m->f, key, out, m->err, m->errlen);
}

/* Llama 3's rope_scaling as it produces the frequency-factor table GGUF stores: factor is the
 * table's largest entry; low/high_freq_factor are Llama 3.1's (1, 4), the original context
 * <arch>.rope.scaling.original_context_length or Llama 3.1's 8192; accepted only when they
 * reproduce every entry. */
static int llama3_rope_from_table(meta *m, const gguf_tensor *t, int64_t head_dim, double theta,
                                  json_t *cfg) {
    int64_t n = t->ne[0];
    if (t->type != GGML_TYPE_F32 || t->n_dims != 1 || n * 2 != head_dim || n > 512) {
        error_set(m->err, m->errlen, "%s: rope_freqs.weight must be F32 [%lld]", gguf_path(m->f),
                  (long long)(head_dim / 2));
        return -1;
    }
    float table[512];
    memcpy(table, t->data, (size_t)n * sizeof *table);
    double factor = 1;
    for (int64_t i = 0; i < n; i++) factor = table[i] > factor ? table[i] : factor;
    int64_t orig;
    if (arch_int(m, "rope.scaling.original_context_length", 0, 8192, &orig)) return -1;
    const double low = 1, high = 4, old = (double)orig;
    for (int64_t i = 0; i < n; i++) {
        double freq = pow(theta, -2.0 * (double)i / (double)head_dim), wavelen = 2 * M_PI / freq;
        double want = 1;
        if (wavelen > old / low) want = factor;
        else if (wavelen >= old / high) {
            double smooth = (old / wavelen - low) / (high - low);
            want = 1 / ((1 - smooth) / factor + smooth);
        }
        if (fabs(want - table[i]) > 1e-3 * want) {
            error_set(m->err, m->errlen, "%s: rope_freqs.weight is not a Llama 3 RoPE scaling table "
                      "(entry %lld is %g, Llama 3 with factor %g gives %g)", gguf_path(m->f),
                      (long long)i, table[i], factor, want);
            return -1;
        }
    }
    if (factor == 1) return 0;
    json_object_set_new(cfg, "rope_scaling",
                        json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                  factor, "low_freq_factor", low, "high_freq_factor", high,
                                  "original_max_position_embeddings", (int)old));
    return 0;
}

static int rope_scaling(meta *m, int64_t head_dim, double theta, json_t *cfg) {
    const gguf_tensor *table = gguf_find_tensor(m->f, "rope_freqs.weight");
    if (table) return llama3_rope_from_table(m, table, head_dim, theta, cfg);
    char key[160], type[32] = "";
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch);
    if (gguf_find_kv(m->f, key) && gguf_get_string(m->f, key, type, sizeof type, m->err, m->errlen))
        return -1;
    if (!type[0] || !strcmp(type, "none")) return 0;
    double factor;
    int64_t orig;
    if (arch_float(m, "rope.scaling.factor", 1, &factor) ||
        arch_int(m, "rope.scaling.original_context_length", 0, 0, &orig))
        return -1;
    if (strcmp(type, "linear") && strcmp(type, "yarn")) {
        error_set(m->err, m->errlen, "%s: rope scaling '%s' is not supported (linear, yarn)",
                  gguf_path(m->f), type);
        return -1;
    }
    json_t *s = json_pack("{s:s, s:f}", "rope_type", type, "factor", factor);
    if (orig > 0) json_object_set_new(s, "original_max_position_embeddings", json_integer(orig));
    json_object_set_new(cfg, "rope_scaling", s);
    return 0;
}

/* Layers without a router (blk.N.ffn_gate_inp) are dense in a qwen3moe file. */
static int moe_fields(meta *m, int64_t layers, json_t *cfg) {
    int64_t experts, used, ffn;
    if (arch_int(m, "expert_count", 1, 0, &experts) || arch_int(m, "expert_used_count", 1, 0, &used) ||
        arch_int(m, "expert_feed_forward_length", 1, 0, &ffn))
        return -1;
    json_t *dense = json_array();
    for (int64_t l = 0; l < layers; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%lld.ffn_gate_inp.weight", (long long)l);
        if (!gguf_find_tensor(m->f, name)) json_array_append_new(dense, json_integer(l));
    }
    json_object_set_new(cfg, "num_experts", json_integer(experts));
    json_object_set_new(cfg, "num_experts_per_tok", json_integer(used));
    json_object_set_new(cfg, "moe_intermediate_size", json_integer(ffn));
    json_object_set_new(cfg, "norm_topk_prob", json_true()); /* llama.cpp's qwen3moe normalizes */
    json_object_set_new(cfg, "mlp_only_layers", dense);
    return 0;
}

static int token_ids(meta *m, json_t *cfg) {
    int64_t id;
    if (gguf_find_kv(m->f, "tokenizer.ggml.bos_token_id")) {
        if (gguf_get_int(m->f, "tokenizer.ggml.bos_token_id", &id, m->err, m->errlen)) return -1;
        json_object_set_new(cfg, "bos_token_id", json_integer(id));
    }
    if (gguf_find_kv(m->f, "tokenizer.ggml.eos_token_id")) {
        if (gguf_get_int(m->f, "tokenizer.ggml.eos_token_id", &id, m->err, m->errlen)) return -1;
        json_t *eos = json_array();
        json_array_append_new(eos, json_integer(id));
        /* end-of-turn tokens stop generation too (llama.cpp's EOT/EOG) */
        int64_t eot;
        if (gguf_find_kv(m->f, "tokenizer.ggml.eot_token_id") &&
            gguf_get_int(m->f, "tokenizer.ggml.eot_token_id", &eot, NULL, 0) == 0 && eot != id)
            json_array_append_new(eos, json_integer(eot));
        json_object_set_new(cfg, "eos_token_id", eos);
    }
    return 0;
}

static json_t *config_object(meta *m) {
    const gguf_tensor *embd = gguf_find_tensor(m->f, "token_embd.weight");
    if (!embd || embd->n_dims != 2) {
        error_set(m->err, m->errlen, "%s: no 2-D token_embd.weight: not a language model GGUF",
                  gguf_path(m->f));
        return NULL;
    }
    int64_t dim, layers, ffn = 0, heads, kv_heads, ctx, head_dim;
    double eps, theta;
    int moe = !strcmp(m->arch, "qwen3moe");
    if (arch_int(m, "embedding_length", 1, 0, &dim) || arch_int(m, "block_count", 1, 0, &layers) ||
        arch_int(m, "feed_forward_length", !moe, 0, &ffn) ||
        arch_int(m, "attention.head_count", 1, 0, &heads) ||
        arch_int(m, "attention.head_count_kv", 0, heads, &kv_heads) ||
        arch_int(m, "context_length", 0, 4096, &ctx) ||
        arch_int(m, "attention.key_length", 0, heads > 0 ? dim / heads : 0, &head_dim) ||
        arch_float(m, "attention.layer_norm_rms_epsilon", 1e-6, &eps) ||
        arch_float(m, "rope.freq_base", 10000, &theta))
        return NULL;
    const char *hf = NULL;
    for (size_t i = 0; i < sizeof arch_table / sizeof *arch_table; i++)
        if (!strcmp(arch_table[i].gguf, m->arch)) hf = arch_table[i].hf;
    json_t *cfg = json_pack("{s:[s], s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:b}",
                            "architectures", hf, "vocab_size", (json_int_t)embd->ne[1],
                            "hidden_size", (json_int_t)dim, "num_hidden_layers", (json_int_t)layers,
                            "num_attention_heads", (json_int_t)heads, "num_key_value_heads",
                            (json_int_t)kv_heads, "head_dim", (json_int_t)head_dim,
                            "max_position_embeddings", (json_int_t)ctx, "rms_norm_eps", eps,
                            "rope_theta", theta, "tie_word_embeddings",
                            gguf_find_tensor(m->f, "output.weight") == NULL);
    if (!cfg) {
        error_set(m->err, m->errlen, "out of memory");
        return NULL;
    }
    if (ffn) json_object_set_new(cfg, "intermediate_size", json_integer(ffn));
    if (!strcmp(m->arch, "qwen2"))
        json_object_set_new(cfg, "attention_bias", json_boolean(gguf_find_tensor(m->f, "blk.0.attn_q.bias")));
    if ((moe && moe_fields(m, layers, cfg)) || rope_scaling(m, head_dim, theta, cfg) ||
        token_ids(m, cfg)) {
        json_decref(cfg);
        return NULL;
    }
    return cfg;
}

char *gguf_config_json(const gguf_file *f, char *err, size_t errlen) {
    char arch[64];
    if (gguf_get_string(f, "general.architecture", arch, sizeof arch, err, errlen)) return NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof arch_table / sizeof *arch_table; i++)
        known |= !strcmp(arch_table[i].gguf, arch);
    if (!known) {
        error_set(err, errlen, "%s: architecture '%s' is not supported (llama, qwen2, qwen3, qwen3moe)",
                  gguf_path(f), arch);
        return NULL;
    }
    meta m = {.f = f, .arch = arch, .err = err, .errlen = errlen};
    json_t *cfg = config_object(&m);
    if (!cfg) return NULL;
    char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(cfg);
    if (!text) error_set(err, errlen, "out of memory");
    return text;
}

char *gguf_config_json_path(const char *path, char *err, size_t errlen) {
    gguf_file *f = gguf_open(path, err, errlen);
    if (!f) return NULL;
    char *text = gguf_config_json(f, err, errlen);
    gguf_close(f);
    return text;
}

/* ---- tensors under Hugging Face names ---- */

/* llama.cpp's tensor names and Hugging Face's: per layer ("blk.N." / "model.layers.N.") and
 * top-level. The one table both directions read (the reader here, mkmodel's GGUF writer). */
static const struct {
    const char *gguf, *hf;
} layer_names[] = {
    {"attn_norm", "input_layernorm"},     {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},       {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"},  {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},  {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},        {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},        {"ffn_gate_inp", "mlp.gate"},
    {"ffn_gate_exps", "mlp.switch_mlp.gate_proj"}, {"ffn_up_exps", "mlp.switch_mlp.up_proj"},
    {"ffn_down_exps", "mlp.switch_mlp.down_proj"},
}, top_names[] = {
    {"token_embd", "model.embed_tokens"}, {"output_norm", "model.norm"}, {"output", "lm_head"}};

/* Translates `name` (len bytes, no ".weight" suffix) from one naming to the other: to_hf picks
 * the direction. Returns 0 with out filled, -1 for a name not in the table. */
static int translate(const char *name, size_t len, int to_hf, char *out, size_t n) {
    const char *layer_fmt = to_hf ? "blk.%d.%n" : "model.layers.%d.%n";
    int layer, used = 0;
    size_t count = sizeof layer_names / sizeof *layer_names;
    char head[512];
    if (len >= sizeof head) return -1;
    memcpy(head, name, len);
    head[len] = 0;
    if (sscanf(head, layer_fmt, &layer, &used) == 1 && used > 0) {
        for (size_t i = 0; i < count; i++)
            if (!strcmp(head + used, to_hf ? layer_names[i].gguf : layer_names[i].hf))
                return snprintf(out, n, to_hf ? "model.layers.%d.%s" : "blk.%d.%s", layer,
                                to_hf ? layer_names[i].hf : layer_names[i].gguf) < (int)n ? 0 : -1;
        return -1;
    }
    for (size_t i = 0; i < sizeof top_names / sizeof *top_names; i++)
        if (!strcmp(head, to_hf ? top_names[i].gguf : top_names[i].hf))
            return snprintf(out, n, "%s", to_hf ? top_names[i].hf : top_names[i].gguf) < (int)n ? 0 : -1;
    return -1;
}

int gguf_name_to_hf(const char *gguf_base, char *out, size_t n) {
    return translate(gguf_base, strlen(gguf_base), 1, out, n);
}

int gguf_name_from_hf(const char *hf_base, char *out, size_t n) {
    return translate(hf_base, strlen(hf_base), 0, out, n);
}

/* One GGUF tensor and what it becomes: a dense view (part 0) or MLX weight/scales/biases, and
 * for a symmetric type (gguf_mlx_zero_point) a fourth, "<name>.zero_point": one F32 holding it,
 * which weights.c turns into weight_matrix.zero_point. */
typedef struct conversion {
    const gguf_tensor *src;
    int unpermute_heads; /* llama q/k: heads whose rows llama.cpp interleaved; 0 = none */
    int built;           /* 0 not yet, 1 done, -1 failed */
    void *buf;           /* owned bytes (quantized or row-permuted tensors) */
    size_t buf_bytes;
    float zero_point;    /* part 3's value */
    safetensors_tensor part[4];
} conversion;

typedef struct named {
    char *name;
    int conv, part;
} named;

typedef struct gguf_set {
    gguf_file *f;
    threadpool *pool; /* converts quantized tensors; made on first use */
    conversion *convs;
    int n_convs;
    named *names;
    int n_names;
} gguf_set;

/* "blk.N.attn_q.weight" -> "model.layers.N.self_attn.q_proj" (+ suffix "weight"); 0 if unknown. */
static int hf_name(const char *g, char *base, size_t n, const char **suffix) {
    const char *dot = strrchr(g, '.');
    if (!dot || (strcmp(dot, ".weight") && strcmp(dot, ".bias"))) return 0;
    *suffix = dot + 1;
    return translate(g, (size_t)(dot - g), 1, base, n) == 0;
}

/* Source row of Hugging Face row r: llama.cpp stores head h's rows (a, b) (a in {0,1}, b below
 * head_dim/2) at h*head_dim + 2b + a for its interleaved RoPE. */
static int64_t source_row(const conversion *c, int64_t r, int64_t rows) {
    if (!c->unpermute_heads) return r;
    int64_t hd = rows / c->unpermute_heads, h = r / hd, i = r % hd, half = hd / 2;
    return h * hd + 2 * (i % half) + i / half;
}

static void set_shape(safetensors_tensor *t, const gguf_tensor *src, int64_t last) {
    t->n_dims = src->n_dims;
    for (int d = 0; d < src->n_dims; d++) t->shape[src->n_dims - 1 - d] = src->ne[d];
    t->shape[t->n_dims - 1] = last;
}

static int build_dense(gguf_set *s, conversion *c) {
    const gguf_tensor *g = c->src;
    safetensors_tensor *t = &c->part[0];
    t->dtype = g->type == GGML_TYPE_F32 ? ST_F32 : g->type == GGML_TYPE_F16 ? ST_F16 : ST_BF16;
    set_shape(t, g, g->ne[0]);
    t->data = g->data;
    t->nbytes = g->nbytes;
    t->file = gguf_path(s->f);
    if (!c->unpermute_heads) return 0;
    int64_t rows = g->ne[1] * g->ne[2] * g->ne[3];
    size_t row_bytes = g->nbytes / (size_t)rows;
    if (!(c->buf = malloc(g->nbytes))) return -1;
    c->buf_bytes = g->nbytes;
    for (int64_t r = 0; r < rows; r++)
        memcpy((char *)c->buf + (size_t)r * row_bytes,
               (const char *)g->data + (size_t)source_row(c, r, rows) * row_bytes, row_bytes);
    t->data = c->buf;
    return 0;
}

/* Rows [begin, end) of one conversion job (run on the set's thread pool). */
typedef struct mlx_job {
    const conversion *c;
    int64_t cols, rows, words, groups;
    size_t row_bytes;
    uint32_t *packed;
    uint16_t *scales, *biases;
    _Atomic int failed; /* 1: a type gguf_quant refused, 2: a scale beyond F16 */
} mlx_job;

static void mlx_rows(void *ctx, int64_t begin, int64_t end, int thread_index) {
    (void)thread_index;
    mlx_job *j = ctx;
    const gguf_tensor *g = j->c->src;
    float *sc = malloc((size_t)j->groups * 2 * sizeof *sc);
    if (!sc) {
        j->failed = 1;
        return;
    }
    for (int64_t r = begin; r < end && !j->failed; r++) {
        const char *src = (const char *)g->data + (size_t)source_row(j->c, r, j->rows) * j->row_bytes;
        if (gguf_row_to_mlx(g->type, src, j->cols, j->packed + r * j->words, sc, sc + j->groups)) {
            j->failed = 1;
            break;
        }
        for (int64_t i = 0; i < j->groups; i++) {
            if (!isfinite(sc[i]) || !isfinite(sc[j->groups + i])) j->failed = 2;
            j->scales[r * j->groups + i] = f32_to_f16(sc[i]);
            j->biases[r * j->groups + i] = f32_to_f16(sc[j->groups + i]);
        }
    }
    free(sc);
}

static int build_mlx(gguf_set *s, conversion *c, int bits) {
    const gguf_tensor *g = c->src;
    int64_t cols = g->ne[0], rows = g->ne[1] * g->ne[2] * g->ne[3];
    int64_t words = cols * bits / 32, groups = cols / 32;
    size_t wbytes = (size_t)(rows * words) * 4, gbytes = (size_t)(rows * groups) * 2;
    char *buf = c->buf = malloc(wbytes + 2 * gbytes);
    if (!buf) return -1;
    c->buf_bytes = wbytes + 2 * gbytes;
    if (!s->pool) { /* converting a model's tensors is as parallel as the machine */
        cpus m;
        cpus_detect(&m);
        s->pool = threadpool_create(m.n_usable, 0);
    }
    mlx_job job = {.c = c, .cols = cols, .rows = rows, .words = words, .groups = groups,
                   .row_bytes = g->nbytes / (size_t)rows, .packed = (uint32_t *)buf,
                   .scales = (uint16_t *)(buf + wbytes), .biases = (uint16_t *)(buf + wbytes + gbytes)};
    if (s->pool) threadpool_parallel_for(s->pool, rows, mlx_rows, &job);
    else mlx_rows(&job, 0, rows, 0);
    if (job.failed) {
        log_error("%s: tensor '%s' %s", gguf_path(s->f), g->name,
                  job.failed == 2 ? "has scales beyond F16's range" : "could not be converted");
        return -1;
    }
    const safetensors_tensor base = {.file = gguf_path(s->f)};
    c->part[0] = c->part[1] = c->part[2] = base;
    c->part[0].dtype = ST_U32;
    set_shape(&c->part[0], g, words);
    c->part[0].data = buf;
    c->part[0].nbytes = wbytes;
    for (int p = 1; p < 3; p++) {
        c->part[p].dtype = ST_F16;
        set_shape(&c->part[p], g, groups);
        c->part[p].data = buf + wbytes + (size_t)(p - 1) * gbytes;
        c->part[p].nbytes = gbytes;
    }
    c->zero_point = (float)gguf_mlx_zero_point(g->type);
    c->part[3] = base;
    c->part[3].dtype = ST_F32;
    c->part[3].n_dims = 1;
    c->part[3].shape[0] = 1;
    c->part[3].data = &c->zero_point;
    c->part[3].nbytes = sizeof c->zero_point;
    return 0;
}

static int cmp_named(const void *a, const void *b) {
    return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

static const safetensors_tensor *set_find(void *ctx, const char *name) {
    gguf_set *s = ctx;
    named key = {.name = (char *)name};
    const named *hit = bsearch(&key, s->names, (size_t)s->n_names, sizeof key, cmp_named);
    if (!hit) return NULL;
    conversion *c = &s->convs[hit->conv];
    if (c->built == 0) {
        int bits = gguf_mlx_bits(c->src->type);
        c->built = (bits == 0 ? build_dense(s, c) : build_mlx(s, c, bits)) == 0 ? 1 : -1;
        if (c->built < 0) log_error("%s: cannot prepare tensor '%s'", gguf_path(s->f), c->src->name);
    }
    if (c->built < 0) return NULL;
    c->part[hit->part].name = hit->name;
    return &c->part[hit->part];
}

static int set_count(void *ctx) { return ((gguf_set *)ctx)->n_names; }

static size_t set_built_bytes(void *ctx) {
    gguf_set *s = ctx;
    size_t n = 0;
    for (int i = 0; i < s->n_convs; i++) n += s->convs[i].buf ? s->convs[i].buf_bytes : 0;
    return n;
}

/* The converted tensors' bytes, once copied into the weights' arena: built again if asked for
 * (an MTP head loaded later finds its own tensors). */
static void set_drop_built(void *ctx) {
    gguf_set *s = ctx;
    for (int i = 0; i < s->n_convs; i++) {
        conversion *c = &s->convs[i];
        if (!c->buf) continue;
        free(c->buf);
        c->buf = NULL;
        c->buf_bytes = 0;
        c->built = 0;
    }
}

static void set_close(void *ctx) {
    gguf_set *s = ctx;
    if (s->pool) threadpool_destroy(s->pool);
    for (int i = 0; i < s->n_convs; i++) free(s->convs[i].buf);
    for (int i = 0; i < s->n_names; i++) free(s->names[i].name);
    free(s->convs);
    free(s->names);
    gguf_close(s->f);
    free(s);
}

static int add_name(gguf_set *s, const char *base, const char *suffix, int conv, int part) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", base, suffix);
    char *copy = strdup(name);
    if (!copy) return -1;
    s->names[s->n_names++] = (named){copy, conv, part};
    return 0;
}

/* The heads whose q/k rows llama.cpp permuted (llama architecture only), for tensor g. */
static int permuted_heads(const gguf_file *f, const char *arch, const char *base) {
    if (strcmp(arch, "llama") || !strstr(base, ".self_attn.")) return 0;
    int64_t heads = 0, kv_heads = 0;
    if (gguf_get_int(f, "llama.attention.head_count", &heads, NULL, 0)) return 0;
    if (gguf_get_int(f, "llama.attention.head_count_kv", &kv_heads, NULL, 0)) kv_heads = heads;
    if (strstr(base, "q_proj")) return (int)heads;
    if (strstr(base, "k_proj")) return (int)kv_heads;
    return 0;
}

static int register_tensors(gguf_set *s, const char *arch, char *err, size_t errlen) {
    int n = gguf_tensor_count(s->f);
    s->convs = calloc((size_t)n + 1, sizeof *s->convs);
    s->names = calloc((size_t)n * 4 + 1, sizeof *s->names);
    if (!s->convs || !s->names) {
        error_set(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(s->f, i);
        char base[400];
        const char *suffix;
        if (!hf_name(t->name, base, sizeof base, &suffix)) continue; /* e.g. rope_freqs */
        int bits = gguf_mlx_bits(t->type);
        if (bits < 0) {
            error_set(err, errlen, "%s: tensor '%s' has type %s, which exo does not run (F32, F16, "
                      "BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)", gguf_path(s->f),
                      t->name, ggml_type_name(t->type));
            return -1;
        }
        if (bits && strcmp(suffix, "weight")) {
            error_set(err, errlen, "%s: tensor '%s' is a quantized bias", gguf_path(s->f), t->name);
            return -1;
        }
        conversion *c = &s->convs[s->n_convs];
        c->src = t;
        c->unpermute_heads = permuted_heads(s->f, arch, base);
        if (c->unpermute_heads && (t->ne[1] % c->unpermute_heads || (t->ne[1] / c->unpermute_heads) % 2)) {
            error_set(err, errlen, "%s: tensor '%s' has %lld rows, not %d heads of even size",
                      gguf_path(s->f), t->name, (long long)t->ne[1], c->unpermute_heads);
            return -1;
        }
        if (add_name(s, base, suffix, s->n_convs, 0) ||
            (bits && (add_name(s, base, "scales", s->n_convs, 1) ||
                      add_name(s, base, "biases", s->n_convs, 2))) ||
            (gguf_mlx_zero_point(t->type) && add_name(s, base, "zero_point", s->n_convs, 3))) {
            error_set(err, errlen, "out of memory");
            return -1;
        }
        s->n_convs++;
    }
    qsort(s->names, (size_t)s->n_names, sizeof *s->names, cmp_named);
    for (int i = 1; i < s->n_names; i++)
        if (!strcmp(s->names[i].name, s->names[i - 1].name)) {
            error_set(err, errlen, "%s: two tensors map to '%s'", gguf_path(s->f), s->names[i].name);
            return -1;
        }
    return 0;
}

safetensors_set *gguf_tensor_set_open(const char *path, char *err, size_t errlen) {
    gguf_set *s = calloc(1, sizeof *s);
    if (!s) {
        error_set(err, errlen, "out of memory");
        return NULL;
    }
    char arch[64];
    s->f = gguf_open(path, err, errlen);
    if (!s->f || gguf_get_string(s->f, "general.architecture", arch, sizeof arch, err, errlen) ||
        register_tensors(s, arch, err, errlen)) {
        set_close(s);
        return NULL;
    }
    safetensors_provider p = {.find = set_find, .count = set_count, .close = set_close,
                              .built_bytes = set_built_bytes, .drop_built = set_drop_built, .ctx = s};
    return safetensors_set_from_provider(&p, err, errlen);
}
