/* tiny_model — test helper: writes small random-weight Hugging Face model directories
 * (config.json + model.safetensors) for every supported family, dense (F32/F16/BF16) or MLX
 * affine-quantized, and computes a naive single-sequence forward straight from the weights
 * (dequantize everything, contiguous KV, textbook loops) as the ground truth the engine is
 * compared against. Included by test files; everything here is static. */
#ifndef EXO_TESTS_TINY_MODEL_H
#define EXO_TESTS_TINY_MODEL_H

#include "arch/transformer.h"
#include "base/paths.h"
#include "base/strbuf.h"
#include "model/weight_types.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/safetensors_write.h"
#include "model/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct tiny_spec {
    const char *arch; /* "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM" */
    int vocab, dim, layers, heads, kv_heads, head_dim, inter;
    int experts, topk, moe_inter, norm_topk, stacked_experts;
    int quant_bits, group_size; /* 0 = dense */
    safetensors_dtype dtype;    /* dense weights: ST_F32, ST_F16, ST_BF16 */
    int tie;
    const char *rope_scaling;   /* JSON object text or NULL */
    int max_pos;
    uint64_t seed;
} tiny_spec;

static uint64_t tiny_rng_state;
static __attribute__((unused)) float tiny_uniform(void) { /* [-1, 1) */
    tiny_rng_state = tiny_rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((tiny_rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static __attribute__((unused)) void tiny_put_dense(safetensors_writer *w, const char *name, safetensors_dtype dt,
                           int n_dims, const int64_t *shape, const float *v, size_t n) {
    size_t es = safetensors_dtype_size(dt);
    void *buf = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        if (dt == ST_F32) ((float *)buf)[i] = v[i];
        else if (dt == ST_F16) ((uint16_t *)buf)[i] = f32_to_f16(v[i]);
        else ((uint16_t *)buf)[i] = f32_to_bf16(v[i]);
    }
    safetensors_writer_add(w, name, dt, n_dims, shape, buf, n * es);
    free(buf);
}

/* MLX affine quantization of [n_mats][rows][cols] into name.weight/.scales/.biases. */
static __attribute__((unused)) void tiny_put_quant(safetensors_writer *w, const char *prefix, int n_mats, int64_t rows,
                           int64_t cols, const float *v, int bits, int gs) {
    int64_t wcols = cols * bits / 32, groups = cols / gs;
    size_t nrows = (size_t)n_mats * (size_t)rows;
    uint32_t *q = calloc(nrows * (size_t)wcols, 4);
    uint16_t *sc = malloc(nrows * (size_t)groups * 2), *bi = malloc(nrows * (size_t)groups * 2);
    uint32_t maxq = (1u << bits) - 1;
    for (size_t r = 0; r < nrows; r++) {
        for (int64_t g = 0; g < groups; g++) {
            const float *x = v + r * (size_t)cols + (size_t)(g * gs);
            float lo = x[0], hi = x[0];
            for (int i = 1; i < gs; i++) {
                lo = x[i] < lo ? x[i] : lo;
                hi = x[i] > hi ? x[i] : hi;
            }
            float scale = bf16_to_f32(f32_to_bf16((hi - lo) / (float)maxq));
            if (scale == 0) scale = 1e-6f;
            float bias = bf16_to_f32(f32_to_bf16(lo));
            sc[r * (size_t)groups + (size_t)g] = f32_to_bf16(scale);
            bi[r * (size_t)groups + (size_t)g] = f32_to_bf16(bias);
            for (int i = 0; i < gs; i++) {
                float fq = roundf((x[i] - bias) / scale);
                uint32_t qi = fq < 0 ? 0 : fq > (float)maxq ? maxq : (uint32_t)fq;
                uint64_t bit = (uint64_t)(g * gs + i) * (uint64_t)bits;
                uint32_t *row = q + r * (size_t)wcols;
                row[bit >> 5] |= qi << (bit & 31);
                if ((bit & 31) + (uint64_t)bits > 32) row[(bit >> 5) + 1] |= qi >> (32 - (bit & 31));
            }
        }
    }
    char name[512];
    int64_t shape[3];
    int nd = 0;
    if (n_mats > 1 || strstr(prefix, "switch_mlp")) shape[nd++] = n_mats;
    shape[nd] = rows;
    shape[nd + 1] = wcols;
    snprintf(name, sizeof name, "%s.weight", prefix);
    safetensors_writer_add(w, name, ST_U32, nd + 2, shape, q, nrows * (size_t)wcols * 4);
    shape[nd + 1] = groups;
    snprintf(name, sizeof name, "%s.scales", prefix);
    safetensors_writer_add(w, name, ST_BF16, nd + 2, shape, sc, nrows * (size_t)groups * 2);
    snprintf(name, sizeof name, "%s.biases", prefix);
    safetensors_writer_add(w, name, ST_BF16, nd + 2, shape, bi, nrows * (size_t)groups * 2);
    free(q);
    free(sc);
    free(bi);
}

/* A random matrix (or stack of n_mats) named prefix, scaled for unit-variance activations. */
static __attribute__((unused)) void tiny_put_matrix(safetensors_writer *w, const tiny_spec *s, const char *prefix,
                            int n_mats, int64_t rows, int64_t cols, int stacked) {
    size_t n = (size_t)n_mats * (size_t)rows * (size_t)cols;
    float *v = malloc(n * sizeof *v);
    float amp = 1.7f / sqrtf((float)cols);
    for (size_t i = 0; i < n; i++) v[i] = tiny_uniform() * amp;
    if (s->quant_bits) {
        tiny_put_quant(w, prefix, n_mats, rows, cols, v, s->quant_bits, s->group_size);
    } else {
        char name[512];
        snprintf(name, sizeof name, "%s.weight", prefix);
        int64_t shape[3] = {n_mats, rows, cols};
        if (stacked) tiny_put_dense(w, name, s->dtype, 3, shape, v, n);
        else tiny_put_dense(w, name, s->dtype, 2, shape + 1, v, n);
    }
    free(v);
}

static __attribute__((unused)) void tiny_put_vector(safetensors_writer *w, const tiny_spec *s, const char *name, int64_t n,
                            float base, float noise) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = base + noise * tiny_uniform();
    safetensors_dtype dt = s->quant_bits ? ST_BF16 : s->dtype;
    tiny_put_dense(w, name, dt, 1, &n, v, (size_t)n);
    free(v);
}

static __attribute__((unused)) int tiny_model_write(const char *dir, const tiny_spec *s) {
    tiny_rng_state = s->seed * 2654435761u + 1;
    if (paths_mkdir_p(dir) != 0) return -1;
    int moe = !strcmp(s->arch, "Qwen3MoeForCausalLM");
    int qk = moe || !strcmp(s->arch, "Qwen3ForCausalLM");
    int bias = !strcmp(s->arch, "Qwen2ForCausalLM");
    strbuf cfg = {0};
    strbuf_appendf(&cfg,
                   "{\"architectures\": [\"%s\"], \"vocab_size\": %d, \"hidden_size\": %d, "
                   "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
                   "\"num_key_value_heads\": %d, \"head_dim\": %d, \"intermediate_size\": %d, "
                   "\"max_position_embeddings\": %d, \"rms_norm_eps\": 1e-06, "
                   "\"rope_theta\": 10000.0, \"tie_word_embeddings\": %s, \"hidden_act\": "
                   "\"silu\", \"bos_token_id\": 1, \"eos_token_id\": [2, 3]",
                   s->arch, s->vocab, s->dim, s->layers, s->heads, s->kv_heads, s->head_dim,
                   s->inter, s->max_pos ? s->max_pos : 512, s->tie ? "true" : "false");
    if (moe)
        strbuf_appendf(&cfg, ", \"num_experts\": %d, \"num_experts_per_tok\": %d, "
                       "\"moe_intermediate_size\": %d, \"norm_topk_prob\": %s, "
                       "\"decoder_sparse_step\": 1, \"mlp_only_layers\": []",
                       s->experts, s->topk, s->moe_inter, s->norm_topk ? "true" : "false");
    if (s->rope_scaling) strbuf_appendf(&cfg, ", \"rope_scaling\": %s", s->rope_scaling);
    if (s->quant_bits)
        strbuf_appendf(&cfg, ", \"quantization\": {\"group_size\": %d, \"bits\": %d}",
                       s->group_size, s->quant_bits);
    strbuf_append_str(&cfg, "}\n");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(cfg.data, f);
    fclose(f);
    strbuf_free(&cfg);

    safetensors_writer *w = safetensors_writer_new();
    int64_t qd = (int64_t)s->heads * s->head_dim, kvd = (int64_t)s->kv_heads * s->head_dim;
    {   /* embeddings: larger values so the first norm sees varied input */
        tiny_spec e = *s;
        tiny_put_matrix(w, &e, "model.embed_tokens", 1, s->vocab, s->dim, 0);
    }
    char n[256];
    for (int l = 0; l < s->layers; l++) {
#define P(x) (snprintf(n, sizeof n, "model.layers.%d.%s", l, x), n)
        tiny_put_vector(w, s, P("input_layernorm.weight"), s->dim, 1.0f, 0.2f);
        tiny_put_vector(w, s, P("post_attention_layernorm.weight"), s->dim, 1.0f, 0.2f);
        tiny_put_matrix(w, s, P("self_attn.q_proj"), 1, qd, s->dim, 0);
        tiny_put_matrix(w, s, P("self_attn.k_proj"), 1, kvd, s->dim, 0);
        tiny_put_matrix(w, s, P("self_attn.v_proj"), 1, kvd, s->dim, 0);
        tiny_put_matrix(w, s, P("self_attn.o_proj"), 1, s->dim, qd, 0);
        if (bias) {
            tiny_put_vector(w, s, P("self_attn.q_proj.bias"), qd, 0.0f, 0.3f);
            tiny_put_vector(w, s, P("self_attn.k_proj.bias"), kvd, 0.0f, 0.3f);
            tiny_put_vector(w, s, P("self_attn.v_proj.bias"), kvd, 0.0f, 0.3f);
        }
        if (qk) {
            tiny_put_vector(w, s, P("self_attn.q_norm.weight"), s->head_dim, 1.0f, 0.2f);
            tiny_put_vector(w, s, P("self_attn.k_norm.weight"), s->head_dim, 1.0f, 0.2f);
        }
        if (moe) {
            tiny_put_matrix(w, s, P("mlp.gate"), 1, s->experts, s->dim, 0);
            if (s->stacked_experts) {
                tiny_put_matrix(w, s, P("mlp.switch_mlp.gate_proj"), s->experts, s->moe_inter, s->dim, 1);
                tiny_put_matrix(w, s, P("mlp.switch_mlp.up_proj"), s->experts, s->moe_inter, s->dim, 1);
                tiny_put_matrix(w, s, P("mlp.switch_mlp.down_proj"), s->experts, s->dim, s->moe_inter, 1);
            } else {
                for (int e = 0; e < s->experts; e++) {
                    char x[128];
                    snprintf(x, sizeof x, "mlp.experts.%d.gate_proj", e);
                    tiny_put_matrix(w, s, P(x), 1, s->moe_inter, s->dim, 0);
                    snprintf(x, sizeof x, "mlp.experts.%d.up_proj", e);
                    tiny_put_matrix(w, s, P(x), 1, s->moe_inter, s->dim, 0);
                    snprintf(x, sizeof x, "mlp.experts.%d.down_proj", e);
                    tiny_put_matrix(w, s, P(x), 1, s->dim, s->moe_inter, 0);
                }
            }
        } else {
            tiny_put_matrix(w, s, P("mlp.gate_proj"), 1, s->inter, s->dim, 0);
            tiny_put_matrix(w, s, P("mlp.up_proj"), 1, s->inter, s->dim, 0);
            tiny_put_matrix(w, s, P("mlp.down_proj"), 1, s->dim, s->inter, 0);
        }
#undef P
    }
    tiny_put_vector(w, s, "model.norm.weight", s->dim, 1.0f, 0.2f);
    if (!s->tie) tiny_put_matrix(w, s, "lm_head", 1, s->vocab, s->dim, 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char err[256];
    int rc = safetensors_writer_save(w, path, err, sizeof err);
    safetensors_writer_free(w);
    return rc;
}

/* ---- naive reference forward: one sequence, all positions, logits for each ---- */

static __attribute__((unused)) float *tiny_dequant(const weight_matrix *m) {
    float *out = malloc((size_t)(m->rows * m->cols) * sizeof *out);
    for (int64_t r = 0; r < m->rows; r++) weight_matrix_row_to_f32(m, r, out + r * m->cols);
    return out;
}

static __attribute__((unused)) void tiny_matvec(const weight_matrix *m, const float *x, float *y) {
    float *w = tiny_dequant(m);
    for (int64_t r = 0; r < m->rows; r++) {
        double acc = 0;
        for (int64_t c = 0; c < m->cols; c++) acc += (double)w[r * m->cols + c] * x[c];
        y[r] = (float)acc;
    }
    free(w);
}

static __attribute__((unused)) void tiny_rmsnorm(float *x, const weight_matrix *wm, int n, float eps) {
    float *w = tiny_dequant(wm);
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) x[i] = x[i] * inv * w[i];
    free(w);
}

static __attribute__((unused)) void tiny_rope(float *x, int heads, int hd, int pos, const float *inv_freq, float af) {
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd / 2; i++) {
            float ang = (float)pos * inv_freq[i];
            double c = cos((double)ang) * af, s = sin((double)ang) * af;
            float *v = x + h * hd;
            float a = v[i], b = v[i + hd / 2];
            v[i] = (float)(a * c - b * s);
            v[i + hd / 2] = (float)(b * c + a * s);
        }
}

static __attribute__((unused)) void tiny_swiglu(const weight_matrix *g, const weight_matrix *u, const weight_matrix *d,
                        const float *x, float *out) {
    int64_t inter = g->rows;
    float *a = malloc((size_t)inter * 4), *b = malloc((size_t)inter * 4);
    tiny_matvec(g, x, a);
    tiny_matvec(u, x, b);
    for (int64_t i = 0; i < inter; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
    tiny_matvec(d, a, out);
    free(a);
    free(b);
}

/* logits [n][vocab] for every position of tokens[0..n). */
static __attribute__((unused)) void tiny_reference_forward(const model_config *c, const model_weights *w,
                                   const int32_t *tokens, int n, float *logits) {
    int dim = c->hidden_size, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int qd = nh * hd, kvd = nkv * hd;
    float inv_freq[512], af;
    rope_inv_freq(&c->rope, hd, inv_freq, &af);
    float *x = malloc((size_t)n * dim * 4), *xn = malloc((size_t)dim * 4);
    float *K = malloc((size_t)c->n_layers * n * kvd * 4), *V = malloc((size_t)c->n_layers * n * kvd * 4);
    float *q = malloc((size_t)qd * 4), *att = malloc((size_t)qd * 4), *o = malloc((size_t)dim * 4);
    float *sc = malloc((size_t)n * 4);
    for (int t = 0; t < n; t++) weight_matrix_row_to_f32(&w->embed, tokens[t], x + t * dim);
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights *L = &w->layers[l];
        float *Kl = K + (size_t)l * n * kvd, *Vl = V + (size_t)l * n * kvd;
        for (int t = 0; t < n; t++) { /* token by token: causal attention over 0..t */
            float *xt = x + t * dim;
            memcpy(xn, xt, (size_t)dim * 4);
            tiny_rmsnorm(xn, &L->attn_norm, dim, c->rms_norm_eps);
            tiny_matvec(&L->wq, xn, q);
            tiny_matvec(&L->wk, xn, Kl + t * kvd);
            tiny_matvec(&L->wv, xn, Vl + t * kvd);
            if (c->attention_bias) {
                float *bq = tiny_dequant(&L->bq), *bk = tiny_dequant(&L->bk), *bv = tiny_dequant(&L->bv);
                for (int i = 0; i < qd; i++) q[i] += bq[i];
                for (int i = 0; i < kvd; i++) Kl[t * kvd + i] += bk[i], Vl[t * kvd + i] += bv[i];
                free(bq); free(bk); free(bv);
            }
            if (c->qk_norm) {
                for (int h = 0; h < nh; h++) tiny_rmsnorm(q + h * hd, &L->q_norm, hd, c->rms_norm_eps);
                for (int h = 0; h < nkv; h++) tiny_rmsnorm(Kl + t * kvd + h * hd, &L->k_norm, hd, c->rms_norm_eps);
            }
            tiny_rope(q, nh, hd, t, inv_freq, af);
            tiny_rope(Kl + t * kvd, nkv, hd, t, inv_freq, af);
            for (int h = 0; h < nh; h++) {
                int kh = h / (nh / nkv);
                double m = -1e30, sum = 0;
                for (int p = 0; p <= t; p++) {
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += (double)q[h * hd + i] * Kl[p * kvd + kh * hd + i];
                    sc[p] = (float)(s / sqrt((double)hd));
                    if (sc[p] > m) m = sc[p];
                }
                for (int p = 0; p <= t; p++) sum += exp(sc[p] - m);
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int p = 0; p <= t; p++) a += exp(sc[p] - m) / sum * Vl[p * kvd + kh * hd + i];
                    att[h * hd + i] = (float)a;
                }
            }
            tiny_matvec(&L->wo, att, o);
            for (int i = 0; i < dim; i++) xt[i] += o[i];
            memcpy(xn, xt, (size_t)dim * 4);
            tiny_rmsnorm(xn, &L->ffn_norm, dim, c->rms_norm_eps);
            if (L->is_moe) {
                float *rl = malloc((size_t)c->n_experts * 4), *eo = malloc((size_t)dim * 4);
                tiny_matvec(&L->router, xn, rl);
                double mx = -1e30, z = 0;
                for (int e = 0; e < c->n_experts; e++) mx = rl[e] > mx ? rl[e] : mx;
                for (int e = 0; e < c->n_experts; e++) z += exp(rl[e] - mx);
                int chosen[64];
                double wsum = 0, wt[64];
                for (int j = 0; j < c->n_experts_per_tok; j++) {
                    int best = -1;
                    for (int e = 0; e < c->n_experts; e++) {
                        int taken = 0;
                        for (int i = 0; i < j; i++) taken |= chosen[i] == e;
                        if (!taken && (best < 0 || rl[e] > rl[best])) best = e;
                    }
                    chosen[j] = best;
                    wt[j] = exp(rl[best] - mx) / z;
                    wsum += wt[j];
                }
                for (int j = 0; j < c->n_experts_per_tok; j++) {
                    double wj = c->norm_topk_prob ? wt[j] / wsum : wt[j];
                    int e = chosen[j];
                    tiny_swiglu(&L->expert_gate[e], &L->expert_up[e], &L->expert_down[e], xn, eo);
                    for (int i = 0; i < dim; i++) xt[i] += (float)(wj * eo[i]);
                }
                free(rl);
                free(eo);
            } else {
                tiny_swiglu(&L->w_gate, &L->w_up, &L->w_down, xn, o);
                for (int i = 0; i < dim; i++) xt[i] += o[i];
            }
        }
    }
    for (int t = 0; t < n; t++) {
        memcpy(xn, x + t * dim, (size_t)dim * 4);
        tiny_rmsnorm(xn, &w->final_norm, dim, c->rms_norm_eps);
        tiny_matvec(&w->lm_head, xn, logits + (size_t)t * c->vocab_size);
    }
    free(x); free(xn); free(K); free(V); free(q); free(att); free(o); free(sc);
}

/* A per-test scratch directory under .cache/ (the unit-test working directory is the repo). */
static __attribute__((unused)) void tiny_dir(char *out, size_t n, const char *name) {
    snprintf(out, n, ".cache/unit/%d/%s", (int)getpid(), name);
}

/* Removes this process's scratch directories. */
static __attribute__((unused)) void tiny_cleanup(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf .cache/unit/%d", (int)getpid());
    if (system(cmd) != 0) fprintf(stderr, "could not remove .cache/unit/%d\n", (int)getpid());
}

#endif
