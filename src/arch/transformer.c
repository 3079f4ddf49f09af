/* The shared transformer forward over compute_backend ops. Reads top to bottom like llama2.c:
 * config (model_config), weights (model_weights, views into the mmap), run state (backend
 * buffers below), then one loop over layers. */
#include "arch/transformer.h"

#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Small per-layer vectors converted to f32 backend memory once at load. */
typedef struct layer_vectors {
    float *attn_norm, *ffn_norm; /* [dim] */
    float *q_norm, *k_norm;      /* [head_dim] (qk_norm) */
    float *bq, *bk, *bv;         /* [q_dim], [kv_dim], [kv_dim] (attention_bias) */
} layer_vectors;

struct transformer {
    const model_config *c;
    const model_weights *w;
    compute_backend *be;
    int max_tokens, max_logits;
    int n_local; /* layers held */
    int first, last;
    int64_t dim, q_dim, kv_dim, inter; /* q/kv/inter: this rank's share (tensor parallel) */
    int n_heads, n_kv_heads;           /* held by this rank */
    transformer_allreduce_fn allreduce; /* tensor parallel: sums partial outputs, else NULL */
    void *allreduce_ctx;
    layer_vectors *vec;
    float *final_norm;   /* [dim] */
    float *inv_freq;     /* [head_dim/2] */
    float attn_factor;
    moe_experts *experts; /* per local layer (MoE layers only) */
    /* run state: backend memory, sized for max_tokens */
    float *x;        /* [max_tokens][dim] residual stream */
    float *xn;       /* [max_tokens][dim] normed input / projection output */
    float *ffn_out;  /* [max_tokens][dim] */
    float *q;        /* [max_tokens][q_dim] */
    float *k, *v;    /* [max_tokens][kv_dim] */
    float *att;      /* [max_tokens][q_dim] */
    float *gate, *up; /* [max_tokens][inter] */
    float *router;   /* [max_tokens][n_experts] */
    int32_t *route_ids; /* [max_tokens][k] */
    float *route_w;     /* [max_tokens][k] */
    int32_t *tokens, *positions, *seq_of_token, *slots, *table_start; /* [max_tokens] */
    int32_t *logit_rows; /* [max_logits] */
    float *head_in;      /* [max_logits][dim] */
    float *logits;       /* [max_logits][vocab] */
    int32_t *tables;     /* block tables, grown on demand */
    int tables_cap;
};

/* Uploads a [1][n] weight vector as f32. */
static float *upload_vector(compute_backend *be, const weight_matrix *m) {
    if (!m->data) return NULL;
    float *host = malloc((size_t)m->cols * sizeof *host);
    float *dev = be->alloc(be, (size_t)m->cols * sizeof *dev);
    if (host && dev) {
        weight_matrix_row_to_f32(m, 0, host);
        be->upload(be, dev, host, (size_t)m->cols * sizeof *host);
    } else if (dev) {
        be->free(be, dev);
        dev = NULL;
    }
    free(host);
    return dev;
}

static void *balloc(transformer *t, size_t bytes, int *fail) {
    void *p = t->be->alloc(t->be, bytes ? bytes : 4);
    if (!p) *fail = 1;
    return p;
}

static int create_vectors(transformer *t, int *fail) {
    const model_config *c = t->c;
    for (int i = 0; i < t->n_local; i++) {
        const layer_weights *l = &t->w->layers[i];
        layer_vectors *v = &t->vec[i];
        v->attn_norm = upload_vector(t->be, &l->attn_norm);
        v->ffn_norm = upload_vector(t->be, &l->ffn_norm);
        if (!v->attn_norm || !v->ffn_norm) *fail = 1;
        if (c->qk_norm) {
            v->q_norm = upload_vector(t->be, &l->q_norm);
            v->k_norm = upload_vector(t->be, &l->k_norm);
            if (!v->q_norm || !v->k_norm) *fail = 1;
        }
        if (c->attention_bias) {
            v->bq = upload_vector(t->be, &l->bq);
            v->bk = upload_vector(t->be, &l->bk);
            v->bv = upload_vector(t->be, &l->bv);
            if (!v->bq || !v->bk || !v->bv) *fail = 1;
        }
        if (l->is_moe)
            t->experts[i] = (moe_experts){.n_experts = c->n_experts, .dim = c->hidden_size,
                                          .inter = c->moe_intermediate_size / (t->w->tp_size > 1 ? t->w->tp_size : 1),
                                          .gate = l->expert_gate, .up = l->expert_up,
                                          .down = l->expert_down};
    }
    if (t->last) {
        t->final_norm = upload_vector(t->be, &t->w->final_norm);
        if (!t->final_norm) *fail = 1;
    }
    return *fail ? -1 : 0;
}

transformer *transformer_create(const model_config *c, const model_weights *w,
                                compute_backend *be, int max_tokens, int max_logits, char *err,
                                size_t errlen) {
    transformer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->c = c;
    t->w = w;
    t->be = be;
    t->max_tokens = max_tokens;
    t->max_logits = max_logits;
    t->n_local = w->layer_end - w->layer_start;
    t->first = w->layer_start == 0;
    t->last = w->has_head;
    int tp = w->tp_size > 1 ? w->tp_size : 1;
    t->dim = c->hidden_size;
    t->n_heads = c->n_heads / tp;
    t->n_kv_heads = c->n_kv_heads / tp;
    t->q_dim = (int64_t)t->n_heads * c->head_dim;
    t->kv_dim = (int64_t)t->n_kv_heads * c->head_dim;
    t->inter = c->intermediate_size / tp;
    t->vec = calloc((size_t)t->n_local, sizeof *t->vec);
    t->experts = calloc((size_t)t->n_local, sizeof *t->experts);
    int fail = !t->vec || !t->experts;
    if (!fail) create_vectors(t, &fail);
    size_t T = (size_t)max_tokens, F = sizeof(float);
    int64_t inter = t->inter;
    t->x = balloc(t, T * (size_t)t->dim * F, &fail);
    t->xn = balloc(t, T * (size_t)t->dim * F, &fail);
    t->ffn_out = balloc(t, T * (size_t)t->dim * F, &fail);
    t->q = balloc(t, T * (size_t)t->q_dim * F, &fail);
    t->att = balloc(t, T * (size_t)t->q_dim * F, &fail);
    t->k = balloc(t, T * (size_t)t->kv_dim * F, &fail);
    t->v = balloc(t, T * (size_t)t->kv_dim * F, &fail);
    t->gate = balloc(t, T * (size_t)inter * F, &fail);
    t->up = balloc(t, T * (size_t)inter * F, &fail);
    if (c->n_experts) {
        t->router = balloc(t, T * (size_t)c->n_experts * F, &fail);
        t->route_ids = balloc(t, T * (size_t)c->n_experts_per_tok * 4, &fail);
        t->route_w = balloc(t, T * (size_t)c->n_experts_per_tok * F, &fail);
    }
    t->tokens = balloc(t, T * 4, &fail);
    t->positions = balloc(t, T * 4, &fail);
    t->seq_of_token = balloc(t, T * 4, &fail);
    t->slots = balloc(t, T * 4, &fail);
    t->table_start = balloc(t, T * 4, &fail);
    if (t->last) {
        t->logit_rows = balloc(t, (size_t)max_logits * 4, &fail);
        t->head_in = balloc(t, (size_t)max_logits * (size_t)t->dim * F, &fail);
        t->logits = balloc(t, (size_t)max_logits * (size_t)w->lm_head.rows * F, &fail);
    }
    int rot = c->rope.partial_dims ? c->rope.partial_dims : c->head_dim;
    float *host_freq = malloc((size_t)(rot / 2) * sizeof *host_freq);
    t->inv_freq = balloc(t, (size_t)(rot / 2) * F, &fail);
    if (host_freq && !fail) {
        rope_inv_freq(&c->rope, rot, host_freq, &t->attn_factor);
        be->upload(be, t->inv_freq, host_freq, (size_t)(rot / 2) * F);
    }
    free(host_freq);
    if (fail || !host_freq) {
        error_set(err, errlen, "out of memory for the forward pass's buffers (%d tokens)",
                  max_tokens);
        transformer_destroy(t);
        return NULL;
    }
    return t;
}

void transformer_destroy(transformer *t) {
    if (!t) return;
    compute_backend *be = t->be;
#define BFREE(p) do { if (p) be->free(be, p); } while (0)
    for (int i = 0; t->vec && i < t->n_local; i++) {
        layer_vectors *v = &t->vec[i];
        BFREE(v->attn_norm); BFREE(v->ffn_norm); BFREE(v->q_norm); BFREE(v->k_norm);
        BFREE(v->bq); BFREE(v->bk); BFREE(v->bv);
    }
    BFREE(t->final_norm); BFREE(t->inv_freq);
    BFREE(t->x); BFREE(t->xn); BFREE(t->ffn_out); BFREE(t->q); BFREE(t->att); BFREE(t->k);
    BFREE(t->v); BFREE(t->gate); BFREE(t->up); BFREE(t->router); BFREE(t->route_ids);
    BFREE(t->route_w); BFREE(t->tokens); BFREE(t->positions); BFREE(t->seq_of_token);
    BFREE(t->slots); BFREE(t->table_start); BFREE(t->logit_rows); BFREE(t->head_in);
    BFREE(t->logits); BFREE(t->tables);
#undef BFREE
    free(t->vec);
    free(t->experts);
    free(t);
}

static int check_batch(const transformer *t, const transformer_batch *b, char *err,
                       size_t errlen) {
    if (b->n_tokens < 1 || b->n_tokens > t->max_tokens) {
        error_set(err, errlen, "batch of %d tokens (1..%d allowed)", b->n_tokens, t->max_tokens);
        return -1;
    }
    if (b->n_seqs < 1 || b->n_seqs > b->n_tokens) {
        error_set(err, errlen, "batch has %d sequences for %d tokens", b->n_seqs, b->n_tokens);
        return -1;
    }
    if (t->last && (b->n_logits < 0 || b->n_logits > t->max_logits)) {
        error_set(err, errlen, "%d logit rows requested (at most %d)", b->n_logits, t->max_logits);
        return -1;
    }
    for (int i = 0; t->last && i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens) {
            error_set(err, errlen, "logit row %d is outside the batch", b->logit_rows[i]);
            return -1;
        }
    for (int i = 0; i < b->n_tokens; i++)
        if (b->seq_of_token[i] < 0 || b->seq_of_token[i] >= b->n_seqs || b->positions[i] < 0 ||
            (t->first && (b->tokens[i] < 0 || b->tokens[i] >= t->c->vocab_size))) {
            error_set(err, errlen, "token %d of the batch has a bad id, position or sequence", i);
            return -1;
        }
    if (!t->first && !b->hidden_in) {
        error_set(err, errlen, "a later pipeline stage needs hidden states as input");
        return -1;
    }
    return 0;
}

static int upload_batch(transformer *t, const transformer_batch *b, char *err, size_t errlen) {
    compute_backend *be = t->be;
    size_t n4 = (size_t)b->n_tokens * 4;
    if (b->n_block_entries > t->tables_cap) {
        if (t->tables) be->free(be, t->tables);
        int cap = b->n_block_entries * 2;
        t->tables = be->alloc(be, (size_t)cap * 4);
        t->tables_cap = t->tables ? cap : 0;
        if (!t->tables) {
            error_set(err, errlen, "out of memory for block tables");
            return -1;
        }
    }
    if (t->first) be->upload(be, t->tokens, b->tokens, n4);
    be->upload(be, t->positions, b->positions, n4);
    be->upload(be, t->seq_of_token, b->seq_of_token, n4);
    be->upload(be, t->slots, b->slots, n4);
    be->upload(be, t->table_start, b->block_table_start, (size_t)b->n_seqs * 4);
    be->upload(be, t->tables, b->block_tables, (size_t)b->n_block_entries * 4);
    if (t->last && b->n_logits) be->upload(be, t->logit_rows, b->logit_rows, (size_t)b->n_logits * 4);
    return 0;
}

/* ys[i] = x W_i^T for matrices that share x: one job when the backend can fuse them. */
static void matmul_shared_x(compute_backend *be, int n, const weight_matrix *const *w,
                            const float *x, float *const *ys, int64_t n_tokens) {
    if (be->matmul_multi) {
        be->matmul_multi(be, n, w, x, ys, n_tokens);
        return;
    }
    for (int i = 0; i < n; i++) be->matmul(be, w[i], x, ys[i], n_tokens);
}

void transformer_set_allreduce(transformer *t, transformer_allreduce_fn fn, void *ctx) {
    t->allreduce = fn;
    t->allreduce_ctx = ctx;
}

/* Tensor parallel: y holds this rank's partial sum of a row-parallel projection; make it whole. */
static int sum_across_ranks(transformer *t, float *y, int64_t n, char *err, size_t errlen) {
    if (!t->allreduce) return 0;
    return t->allreduce(t->allreduce_ctx, y, (size_t)(n * t->dim), err, errlen);
}

/* x += W in' (in' = silu(in) * up when up is given): the residual stream's update by o_proj or
 * the MLP's down projection, fused where the backend can and no all-reduce sits between the
 * matmul and the add (a tensor-parallel rank holds a partial sum until it is reduced). */
static int residual_update(transformer *t, const weight_matrix *w, float *in, const float *up,
                           int64_t n, char *err, size_t errlen) {
    compute_backend *be = t->be;
    if (be->matmul_fused && !t->allreduce) {
        be->matmul_fused(be, w, in, up, t->x, n, 1);
        return 0;
    }
    float *y = up ? t->ffn_out : t->xn;
    if (be->matmul_fused) {
        be->matmul_fused(be, w, in, up, y, n, 0);
    } else {
        if (up) be->silu_mul(be, in, up, n * t->inter);
        be->matmul(be, w, in, y, n);
    }
    if (sum_across_ranks(t, y, n, err, errlen)) return -1;
    be->add(be, t->x, y, n * t->dim);
    return 0;
}

static int attention_block(transformer *t, int li, const kv_layer *kv,
                           const attention_batch *ab, int64_t n, char *err, size_t errlen) {
    compute_backend *be = t->be;
    const model_config *c = t->c;
    const layer_weights *l = &t->w->layers[li];
    const layer_vectors *v = &t->vec[li];
    be->rmsnorm(be, t->x, v->attn_norm, t->xn, n, t->dim, c->rms_norm_eps);
    const weight_matrix *qkv[3] = {&l->wq, &l->wk, &l->wv};
    float *qkv_out[3] = {t->q, t->k, t->v};
    matmul_shared_x(be, 3, qkv, t->xn, qkv_out, n);
    if (c->attention_bias) {
        be->add_row(be, t->q, v->bq, n, t->q_dim);
        be->add_row(be, t->k, v->bk, n, t->kv_dim);
        be->add_row(be, t->v, v->bv, n, t->kv_dim);
    }
    if (c->qk_norm) {
        be->rmsnorm(be, t->q, v->q_norm, t->q, n * t->n_heads, c->head_dim, c->rms_norm_eps);
        be->rmsnorm(be, t->k, v->k_norm, t->k, n * t->n_kv_heads, c->head_dim, c->rms_norm_eps);
    }
    int rot = c->rope.partial_dims ? c->rope.partial_dims : c->head_dim;
    if (be->rope_kv_write) {
        be->rope_kv_write(be, t->q, t->k, t->v, t->positions, n, t->n_heads, t->n_kv_heads,
                          c->head_dim, rot, t->inv_freq, t->attn_factor, kv, t->slots);
    } else {
        be->rope(be, t->q, t->positions, n, t->n_heads, c->head_dim, rot, t->inv_freq,
                 t->attn_factor);
        be->rope(be, t->k, t->positions, n, t->n_kv_heads, c->head_dim, rot, t->inv_freq,
                 t->attn_factor);
        be->kv_write(be, kv, t->k, t->v, t->slots, n, t->kv_dim);
    }
    be->attention(be, t->q, kv, ab, t->att);
    return residual_update(t, &l->wo, t->att, NULL, n, err, errlen);
}

static int mlp_block(transformer *t, int li, int64_t n, char *err, size_t errlen) {
    compute_backend *be = t->be;
    const model_config *c = t->c;
    const layer_weights *l = &t->w->layers[li];
    be->rmsnorm(be, t->x, t->vec[li].ffn_norm, t->xn, n, t->dim, c->rms_norm_eps);
    if (l->is_moe) {
        be->matmul(be, &l->router, t->xn, t->router, n);
        be->moe_route(be, t->router, n, c->n_experts, c->n_experts_per_tok, c->norm_topk_prob,
                      t->route_ids, t->route_w);
        be->moe_ffn(be, &t->experts[li], t->xn, n, t->route_ids, t->route_w,
                    c->n_experts_per_tok, t->ffn_out);
    } else {
        const weight_matrix *gu[2] = {&l->w_gate, &l->w_up};
        float *gu_out[2] = {t->gate, t->up};
        matmul_shared_x(be, 2, gu, t->xn, gu_out, n);
        return residual_update(t, &l->w_down, t->gate, t->up, n, err, errlen);
    }
    if (sum_across_ranks(t, t->ffn_out, n, err, errlen)) return -1;
    be->add(be, t->x, t->ffn_out, n * t->dim);
    return 0;
}

/* The ops of one step, from the embedding to the logits (no host memory touched, except by a
 * tensor-parallel all-reduce). Returns 0, or -1 with err (a failed all-reduce). */
static int run_layers(transformer *t, const kv_layer *kv, const attention_batch *ab,
                      const transformer_batch *b, char *err, size_t errlen) {
    compute_backend *be = t->be;
    int64_t n = b->n_tokens;
    if (t->first) be->embed(be, &t->w->embed, t->tokens, n, t->x);
    for (int li = 0; li < t->n_local; li++)
        if (attention_block(t, li, &kv[li], ab, n, err, errlen) ||
            mlp_block(t, li, n, err, errlen))
            return -1;
    if (!t->last || !b->n_logits) return 0;
    be->gather_rows(be, t->x, t->logit_rows, b->n_logits, t->dim, t->head_in);
    be->rmsnorm(be, t->head_in, t->final_norm, t->head_in, b->n_logits, t->dim,
                t->c->rms_norm_eps);
    be->matmul(be, &t->w->lm_head, t->head_in, t->logits, b->n_logits);
    return 0;
}

/* What a step's ops and their arguments depend on besides memory contents (backend.h,
 * step_begin): sizes, and the buffers that can move between steps (block tables, the cache). */
static uint64_t step_key(const transformer *t, const kv_layer *kv, int block_size,
                         const transformer_batch *b) {
    uint64_t v[] = {(uint64_t)b->n_tokens, (uint64_t)b->n_logits, (uint64_t)block_size,
                    (uint64_t)(uintptr_t)t->tables, (uint64_t)(uintptr_t)kv,
                    (uint64_t)(uintptr_t)kv[0].k, (uint64_t)(uintptr_t)kv[0].v};
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) h = (h ^ v[i]) * 0x100000001b3ull;
    return h;
}

int transformer_forward(transformer *t, const kv_layer *kv, int block_size,
                        const transformer_batch *b, float *out, char *err, size_t errlen) {
    if (check_batch(t, b, err, errlen) || upload_batch(t, b, err, errlen)) return -1;
    compute_backend *be = t->be;
    const model_config *c = t->c;
    int64_t n = b->n_tokens;
    if (!t->first) be->upload(be, t->x, b->hidden_in, (size_t)(n * t->dim) * sizeof(float));
    attention_batch ab = {.n_tokens = n, .positions = t->positions,
                          .seq_of_token = t->seq_of_token, .block_table_start = t->table_start,
                          .block_tables = t->tables, .block_size = block_size,
                          .n_heads = t->n_heads, .n_kv_heads = t->n_kv_heads,
                          .head_dim = c->head_dim, .scale = 1.0f / sqrtf((float)c->head_dim),
                          .host_positions = b->positions, .host_seq_of_token = b->seq_of_token,
                          .host_block_table_start = b->block_table_start};
    /* A recorded step replays backend ops only: an all-reduce is a call between them that a
     * recording cannot hold, so a tensor-parallel step always runs as called. Only decode steps
     * (one token per sequence) are offered: a backend may plan a prefill chunk from where its
     * runs of positions fall (attention_batch's host copies), which the key does not hold. */
    int record = be->step_begin && be->step_end && !t->allreduce && b->n_seqs == b->n_tokens;
    uint64_t key = record ? step_key(t, kv, block_size, b) : 0;
    for (int attempt = 0; attempt < 2; attempt++) { /* a second time only if recording failed */
        if (attempt == 0 && record && be->step_begin(be, key, n)) break;
        /* only an all-reduce fails here, and steps with one are never recorded */
        if (run_layers(t, kv, &ab, b, err, errlen)) return -1;
        if (attempt == 0 && record && be->step_end(be)) continue;
        break;
    }
    if (!t->last) {
        if (out) be->download(be, out, t->x, (size_t)(n * t->dim) * sizeof(float));
    } else if (b->n_logits && out) {
        be->download(be, out, t->logits,
                     (size_t)b->n_logits * (size_t)t->w->lm_head.rows * sizeof(float));
    }
    return be->status ? be->status(be, err, errlen) : 0;
}

float *transformer_logits(transformer *t) { return t->logits; }
