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
    float *attn_norm, *ffn_norm; /* [dim] (zero-centred norms: 1 + w) */
    float *q_norm, *k_norm;      /* [head_dim] (qk_norm) */
    float *bq, *bk, *bv;         /* [q_dim], [kv_dim], [kv_dim] (attention_bias) */
    /* gpt-oss, else NULL */
    float *bo;                   /* [dim] o_proj bias */
    float *sinks;                /* [n_heads] attention sink logits */
    float *router_bias;          /* [n_experts] */
    float *expert_gate_bias, *expert_up_bias; /* [n_experts][moe_inter] */
    float *expert_down_bias;                  /* [n_experts][dim] */
    int window;                  /* sliding window of this layer, 0 = full attention */
    float *lin_norm;             /* [linear value_dim] gated RMSNorm (linear layers) */
    float *lin_conv;             /* [conv_dim][conv_kernel] */
    float *lin_a_log, *lin_dt_bias; /* [linear value heads] */
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
    linear_attention_layer *lin; /* per local layer (GatedDeltaNet layers only), with its states */
    int hybrid, n_state_slots;
    int state_generation; /* bumped when the state buffers move (a recorded step holds them) */
    int64_t conv_dim, lin_value_dim, shared_inter;
    int32_t *identity_slots; /* host [max_tokens]: slot i for sequence i */
    /* run state: backend memory, sized for max_tokens */
    float *x;        /* [max_tokens][dim] residual stream */
    float *xn;       /* [max_tokens][dim] normed input / projection output */
    float *ffn_out;  /* [max_tokens][dim] */
    float *q;        /* [max_tokens][q_dim] */
    float *k, *v;    /* [max_tokens][kv_dim] */
    float *att;      /* [max_tokens][q_dim] */
    float *gate, *up; /* [max_tokens][inter] */
    float *router;   /* [max_tokens][n_experts] */
    float *q_gate;   /* [max_tokens][q_dim] attention output gate (hybrids) */
    float *lin_qkv;  /* [max_tokens][conv_dim] GatedDeltaNet q, k, v (then convolved) */
    float *lin_z;    /* [max_tokens][lin_value_dim] */
    float *lin_b, *lin_a; /* [max_tokens][linear value heads] */
    float *lin_out;  /* [max_tokens][lin_value_dim] */
    float *shared_out;   /* [max_tokens][dim] shared expert */
    float *shared_logit; /* [max_tokens] its gate */
    int32_t *route_ids; /* [max_tokens][k] */
    float *route_w;     /* [max_tokens][k] */
    int32_t *tokens, *positions, *seq_of_token, *slots, *table_start; /* [max_tokens] */
    int32_t *state_slots; /* [max_tokens] each sequence's recurrent-state slot (hybrids) */
    int32_t *logit_rows; /* [max_logits] */
    float *head_in;      /* [max_logits][dim] */
    float *logits;       /* [max_logits][vocab] */
    int32_t *tables;     /* block tables, grown on demand */
    int tables_cap;
};

/* Uploads a small [rows][cols] weight as f32, plus `offset` on every value (zero-centred norms
 * are used as 1 + w). */
static float *upload_values(compute_backend *be, const weight_matrix *m, float offset) {
    if (!m->data) return NULL;
    size_t n = (size_t)m->rows * (size_t)m->cols;
    float *host = malloc(n * sizeof *host);
    float *dev = be->alloc(be, n * sizeof *dev);
    if (host && dev) {
        for (int64_t r = 0; r < m->rows; r++) weight_matrix_row_to_f32(m, r, host + r * m->cols);
        for (size_t i = 0; i < n; i++) host[i] += offset;
        be->upload(be, dev, host, n * sizeof *host);
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

static float *upload_vector(compute_backend *be, const weight_matrix *m) {
    return upload_values(be, m, 0.0f);
}

/* One slot's state of a GatedDeltaNet layer. */
static size_t conv_state_bytes(const linear_attention_layer *L) {
    return (size_t)(L->conv_kernel - 1) * (size_t)L->conv_dim * sizeof(float);
}

static size_t recurrent_state_bytes(const linear_attention_layer *L) {
    return (size_t)L->n_v_heads * (size_t)L->key_dim * (size_t)L->value_dim * sizeof(float);
}

/* A GatedDeltaNet layer's small weights and its recurrent state for every slot. */
static void create_linear_layer(transformer *t, const layer_weights *l, layer_vectors *v,
                                linear_attention_layer *L, int *fail) {
    const model_config *c = t->c;
    compute_backend *be = t->be;
    v->lin_norm = upload_vector(be, &l->lin_norm);
    v->lin_conv = upload_vector(be, &l->lin_conv);
    v->lin_a_log = upload_vector(be, &l->lin_a_log);
    v->lin_dt_bias = upload_vector(be, &l->lin_dt_bias);
    *L = (linear_attention_layer){
        .n_k_heads = c->linear_key_heads, .n_v_heads = c->linear_value_heads,
        .key_dim = c->linear_key_dim, .value_dim = c->linear_value_dim,
        .conv_kernel = c->linear_conv_kernel, .conv_dim = t->conv_dim,
        .conv_weight = v->lin_conv, .a_log = v->lin_a_log, .dt_bias = v->lin_dt_bias};
    L->conv_state = balloc(t, (size_t)t->n_state_slots * conv_state_bytes(L), fail);
    L->recurrent_state = balloc(t, (size_t)t->n_state_slots * recurrent_state_bytes(L), fail);
    if (!v->lin_norm || !v->lin_conv || !v->lin_a_log || !v->lin_dt_bias) *fail = 1;
}

/* gpt-oss: o_proj bias, sinks, router bias, expert biases. Returns 0, or -1 (out of memory). */
static int create_gpt_oss_vectors(transformer *t, const layer_weights *l, layer_vectors *v) {
    v->bo = upload_vector(t->be, &l->bo);
    v->sinks = upload_vector(t->be, &l->sinks);
    v->router_bias = upload_vector(t->be, &l->router_bias);
    v->expert_gate_bias = upload_vector(t->be, &l->expert_gate_bias);
    v->expert_up_bias = upload_vector(t->be, &l->expert_up_bias);
    v->expert_down_bias = upload_vector(t->be, &l->expert_down_bias);
    return v->bo && v->sinks && v->router_bias && v->expert_gate_bias && v->expert_up_bias && v->expert_down_bias
               ? 0
               : -1;
}

int transformer_backend_check(const model_config *c, const compute_backend *be, char *err, size_t errlen) {
    unsigned need = 0;
    if (c->attention_sinks || c->sliding_window) need |= BACKEND_FEATURE_ATTENTION_SINKS_WINDOW;
    if (c->moe_bias || c->swiglu_limit > 0) need |= BACKEND_FEATURE_MOE_BIAS_CLAMP;
    if ((be->features & need) == need) return 0;
    error_set(err, errlen, "the %s backend cannot run %s yet (attention sinks, sliding-window layers, biased "
              "clamped-SwiGLU experts); use the CPU backend", be->name, c->architecture);
    return -1;
}

static int create_vectors(transformer *t, int *fail) {
    const model_config *c = t->c;
    float norm_offset = t->w->norm_plus_one ? 1.0f : 0.0f;
    for (int i = 0; i < t->n_local; i++) {
        const layer_weights *l = &t->w->layers[i];
        layer_vectors *v = &t->vec[i];
        v->attn_norm = upload_values(t->be, &l->attn_norm, norm_offset);
        v->ffn_norm = upload_values(t->be, &l->ffn_norm, norm_offset);
        if (!v->attn_norm || !v->ffn_norm) *fail = 1;
        if (l->is_linear) create_linear_layer(t, l, v, &t->lin[i], fail);
        if (c->qk_norm && !l->is_linear) {
            v->q_norm = upload_values(t->be, &l->q_norm, norm_offset);
            v->k_norm = upload_values(t->be, &l->k_norm, norm_offset);
            if (!v->q_norm || !v->k_norm) *fail = 1;
        }
        if (c->attention_bias) {
            v->bq = upload_vector(t->be, &l->bq);
            v->bk = upload_vector(t->be, &l->bk);
            v->bv = upload_vector(t->be, &l->bv);
            if (!v->bq || !v->bk || !v->bv) *fail = 1;
        }
        if (c->family == MODEL_FAMILY_GPT_OSS && create_gpt_oss_vectors(t, l, v)) *fail = 1;
        v->window = model_config_layer_window(c, t->w->layer_start + i);
        if (l->is_moe)
            t->experts[i] = (moe_experts){.n_experts = c->n_experts, .dim = c->hidden_size,
                                          .inter = c->moe_intermediate_size / (t->w->tp_size > 1 ? t->w->tp_size : 1),
                                          .gate = l->expert_gate, .up = l->expert_up,
                                          .down = l->expert_down, .gate_bias = v->expert_gate_bias,
                                          .up_bias = v->expert_up_bias, .down_bias = v->expert_down_bias,
                                          .swiglu_limit = c->swiglu_limit, .swiglu_alpha = c->swiglu_alpha};
    }
    if (t->last) {
        t->final_norm = upload_values(t->be, &t->w->final_norm, norm_offset);
        if (!t->final_norm) *fail = 1;
    }
    return *fail ? -1 : 0;
}

transformer *transformer_create(const model_config *c, const model_weights *w,
                                compute_backend *be, int max_tokens, int max_logits, char *err,
                                size_t errlen) {
    if (transformer_backend_check(c, be, err, errlen)) return NULL;
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
    t->hybrid = model_config_is_hybrid(c);
    if (t->hybrid && (!be->conv1d_causal || !be->gated_delta_rule || !be->rmsnorm_gated ||
                      !be->mul_sigmoid || !be->mul_sigmoid_rows || !be->copy)) {
        error_set(err, errlen, "%s is a hybrid linear-attention model, which the %s backend does "
                  "not run yet (use --device cpu)", c->architecture, be->name);
        free(t);
        return NULL;
    }
    t->n_state_slots = max_logits;
    t->conv_dim = 2 * (int64_t)c->linear_key_heads * c->linear_key_dim +
                  (int64_t)c->linear_value_heads * c->linear_value_dim;
    t->lin_value_dim = (int64_t)c->linear_value_heads * c->linear_value_dim;
    t->shared_inter = c->shared_expert_intermediate_size;
    t->vec = calloc((size_t)t->n_local, sizeof *t->vec);
    t->experts = calloc((size_t)t->n_local, sizeof *t->experts);
    t->lin = calloc((size_t)t->n_local, sizeof *t->lin);
    t->identity_slots = malloc((size_t)max_tokens * sizeof *t->identity_slots);
    int fail = !t->vec || !t->experts || !t->lin || !t->identity_slots;
    for (int i = 0; !fail && i < max_tokens; i++) t->identity_slots[i] = i;
    if (!fail) create_vectors(t, &fail);
    size_t T = (size_t)max_tokens, F = sizeof(float);
    int64_t inter = t->inter > t->shared_inter ? t->inter : t->shared_inter;
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
    if (t->hybrid) {
        t->q_gate = balloc(t, T * (size_t)t->q_dim * F, &fail);
        t->lin_qkv = balloc(t, T * (size_t)t->conv_dim * F, &fail);
        t->lin_z = balloc(t, T * (size_t)t->lin_value_dim * F, &fail);
        t->lin_b = balloc(t, T * (size_t)c->linear_value_heads * F, &fail);
        t->lin_a = balloc(t, T * (size_t)c->linear_value_heads * F, &fail);
        t->lin_out = balloc(t, T * (size_t)t->lin_value_dim * F, &fail);
    }
    if (t->shared_inter) {
        t->shared_out = balloc(t, T * (size_t)t->dim * F, &fail);
        t->shared_logit = balloc(t, T * F, &fail);
    }
    t->tokens = balloc(t, T * 4, &fail);
    t->positions = balloc(t, T * 4, &fail);
    t->seq_of_token = balloc(t, T * 4, &fail);
    t->slots = balloc(t, T * 4, &fail);
    t->table_start = balloc(t, T * 4, &fail);
    if (t->hybrid) t->state_slots = balloc(t, T * 4, &fail);
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
        BFREE(v->bq); BFREE(v->bk); BFREE(v->bv); BFREE(v->bo); BFREE(v->sinks); BFREE(v->router_bias);
        BFREE(v->expert_gate_bias); BFREE(v->expert_up_bias); BFREE(v->expert_down_bias);
        BFREE(v->lin_norm); BFREE(v->lin_conv); BFREE(v->lin_a_log); BFREE(v->lin_dt_bias);
        if (t->lin) {
            BFREE(t->lin[i].conv_state);
            BFREE(t->lin[i].recurrent_state);
        }
    }
    BFREE(t->q_gate); BFREE(t->lin_qkv); BFREE(t->lin_z); BFREE(t->lin_b); BFREE(t->lin_a);
    BFREE(t->lin_out); BFREE(t->shared_out); BFREE(t->shared_logit);
    BFREE(t->final_norm); BFREE(t->inv_freq);
    BFREE(t->x); BFREE(t->xn); BFREE(t->ffn_out); BFREE(t->q); BFREE(t->att); BFREE(t->k);
    BFREE(t->v); BFREE(t->gate); BFREE(t->up); BFREE(t->router); BFREE(t->route_ids);
    BFREE(t->route_w); BFREE(t->tokens); BFREE(t->positions); BFREE(t->seq_of_token);
    BFREE(t->slots); BFREE(t->table_start); BFREE(t->state_slots); BFREE(t->logit_rows); BFREE(t->head_in);
    BFREE(t->logits); BFREE(t->tables);
#undef BFREE
    free(t->vec);
    free(t->experts);
    free(t->lin);
    free(t->identity_slots);
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
    if (t->hybrid && !b->state_slots && b->n_seqs > t->n_state_slots) {
        error_set(err, errlen, "batch of %d sequences, but %d recurrent-state slots", b->n_seqs,
                  t->n_state_slots);
        return -1;
    }
    for (int s = 0; t->hybrid && b->state_slots && s < b->n_seqs; s++)
        if (b->state_slots[s] < 0 || b->state_slots[s] >= t->n_state_slots) {
            error_set(err, errlen, "sequence %d of the batch has state slot %d (0..%d)", s,
                      b->state_slots[s], t->n_state_slots - 1);
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
    if (t->hybrid)
        be->upload(be, t->state_slots, b->state_slots ? b->state_slots : t->identity_slots,
                   (size_t)b->n_seqs * 4);
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

/* dst (n_new slots) = the first n_old slots of src, the rest zero; frees src. */
static void *grow_slots(compute_backend *be, void *src, size_t slot_bytes, int n_old, int n_new) {
    void *dst = be->alloc(be, (size_t)n_new * slot_bytes);
    if (!dst) return NULL;
    be->copy(be, dst, src, (size_t)n_old * slot_bytes);
    be->free(be, src);
    return dst;
}

int transformer_reserve_state_slots(transformer *t, int n, char *err, size_t errlen) {
    if (!t->hybrid || n <= t->n_state_slots) return 0;
    for (int li = 0; li < t->n_local; li++) {
        linear_attention_layer *L = &t->lin[li];
        if (!t->w->layers[li].is_linear) continue;
        void *conv = grow_slots(t->be, L->conv_state, conv_state_bytes(L), t->n_state_slots, n);
        if (conv) L->conv_state = conv;
        void *rec = conv ? grow_slots(t->be, L->recurrent_state, recurrent_state_bytes(L),
                                      t->n_state_slots, n)
                         : NULL;
        if (rec) L->recurrent_state = rec;
        if (!conv || !rec) { /* layers grown so far keep their larger buffers: harmless */
            error_set(err, errlen, "out of memory for %d recurrent-state slots", n);
            return -1;
        }
    }
    t->n_state_slots = n;
    t->state_generation++;
    return 0;
}

void transformer_copy_state(transformer *t, int dst_slot, int src_slot) {
    if (!t->hybrid || dst_slot == src_slot) return;
    for (int li = 0; li < t->n_local; li++) {
        const linear_attention_layer *L = &t->lin[li];
        if (!t->w->layers[li].is_linear) continue;
        size_t cb = conv_state_bytes(L), rb = recurrent_state_bytes(L);
        t->be->copy(t->be, (char *)L->conv_state + (size_t)dst_slot * cb,
                    (const char *)L->conv_state + (size_t)src_slot * cb, cb);
        t->be->copy(t->be, (char *)L->recurrent_state + (size_t)dst_slot * rb,
                    (const char *)L->recurrent_state + (size_t)src_slot * rb, rb);
    }
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

/* ys[i] = W_i rmsnorm(x) (weight norm_w): one job where the backend fuses the norm into the
 * matmuls, else the norm into xn and the matmuls of xn. */
static void norm_then_matmul(transformer *t, const float *norm_w, int n,
                             const weight_matrix *const *w, float *const *ys, int64_t n_tokens) {
    compute_backend *be = t->be;
    if (be->norm_matmul) {
        be->norm_matmul(be, t->x, norm_w, t->c->rms_norm_eps, t->xn, n, w, ys, n_tokens);
        return;
    }
    be->rmsnorm(be, t->x, norm_w, t->xn, n_tokens, t->dim, t->c->rms_norm_eps);
    matmul_shared_x(be, n, w, t->xn, ys, n_tokens);
}

/* x += W in' + bias (in' = silu(in) * up when up is given; bias may be NULL): the residual
 * stream's update by o_proj or the MLP's down projection, fused where the backend can and
 * nothing sits between the matmul and the add (a tensor-parallel rank holds a partial sum until
 * it is reduced; a bias, gpt-oss's o_proj, is added once, after the sum). */
static int residual_update(transformer *t, const weight_matrix *w, float *in, const float *up,
                           const float *bias, int64_t n, char *err, size_t errlen) {
    compute_backend *be = t->be;
    if (be->matmul_fused && !t->allreduce && !bias) {
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
    if (bias) be->add_row(be, y, bias, n, t->dim);
    be->add(be, t->x, y, n * t->dim);
    return 0;
}

static int attention_block(transformer *t, int li, const kv_layer *kv,
                           const attention_batch *ab, int64_t n, char *err, size_t errlen) {
    compute_backend *be = t->be;
    const model_config *c = t->c;
    const layer_weights *l = &t->w->layers[li];
    const layer_vectors *v = &t->vec[li];
    const weight_matrix *qkv[4] = {&l->wq, &l->wk, &l->wv, &l->wq_gate};
    float *qkv_out[4] = {t->q, t->k, t->v, t->q_gate};
    norm_then_matmul(t, v->attn_norm, c->attn_output_gate ? 4 : 3, qkv, qkv_out, n);
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
    attention_batch layer_ab; /* gpt-oss: this layer's window and sinks */
    if (v->window || v->sinks) {
        layer_ab = *ab;
        layer_ab.window = v->window;
        layer_ab.sinks = v->sinks;
        ab = &layer_ab;
    }
    be->attention(be, t->q, kv, ab, t->att);
    if (c->attn_output_gate) be->mul_sigmoid(be, t->att, t->q_gate, n * t->q_dim);
    return residual_update(t, &l->wo, t->att, NULL, v->bo, n, err, errlen);
}

/* A GatedDeltaNet layer: projections, causal conv, the gated delta rule against each sequence's
 * recurrent state, the gated RMSNorm per value head, the output projection. */
static void linear_attention_block(transformer *t, int li, const linear_attention_batch *lb,
                                   int64_t n) {
    compute_backend *be = t->be;
    const model_config *c = t->c;
    const layer_weights *l = &t->w->layers[li];
    const layer_vectors *v = &t->vec[li];
    be->rmsnorm(be, t->x, v->attn_norm, t->xn, n, t->dim, c->rms_norm_eps);
    const weight_matrix *proj[4] = {&l->lin_qkv, &l->lin_z, &l->lin_b, &l->lin_a};
    float *proj_out[4] = {t->lin_qkv, t->lin_z, t->lin_b, t->lin_a};
    matmul_shared_x(be, 4, proj, t->xn, proj_out, n);
    be->conv1d_causal(be, &t->lin[li], lb, t->lin_qkv);
    be->gated_delta_rule(be, &t->lin[li], lb, t->lin_qkv, t->lin_b, t->lin_a, t->lin_out);
    be->rmsnorm_gated(be, t->lin_out, v->lin_norm, t->lin_z, t->lin_out,
                      n * c->linear_value_heads, c->linear_value_dim, c->rms_norm_eps);
    be->matmul(be, &l->lin_out, t->lin_out, t->xn, n);
    be->add(be, t->x, t->xn, n * t->dim);
}

/* The hybrids' shared expert, added to the routed experts' output in ffn_out with the weight
 * sigmoid(shared_expert_gate x). */
static void shared_expert(transformer *t, const layer_weights *l, int64_t n) {
    compute_backend *be = t->be;
    const weight_matrix *gu[2] = {&l->shared_gate, &l->shared_up};
    float *gu_out[2] = {t->gate, t->up};
    matmul_shared_x(be, 2, gu, t->xn, gu_out, n);
    be->silu_mul(be, t->gate, t->up, n * t->shared_inter);
    be->matmul(be, &l->shared_down, t->gate, t->shared_out, n);
    be->matmul(be, &l->shared_expert_gate, t->xn, t->shared_logit, n);
    be->mul_sigmoid_rows(be, t->shared_out, t->shared_logit, n, t->dim);
    be->add(be, t->ffn_out, t->shared_out, n * t->dim);
}

static int mlp_block(transformer *t, int li, int64_t n, char *err, size_t errlen) {
    compute_backend *be = t->be;
    const model_config *c = t->c;
    const layer_weights *l = &t->w->layers[li];
    if (l->is_moe) {
        be->rmsnorm(be, t->x, t->vec[li].ffn_norm, t->xn, n, t->dim, c->rms_norm_eps);
        be->matmul(be, &l->router, t->xn, t->router, n);
        if (t->vec[li].router_bias) be->add_row(be, t->router, t->vec[li].router_bias, n, c->n_experts);
        be->moe_route(be, t->router, n, c->n_experts, c->n_experts_per_tok, c->norm_topk_prob,
                      t->route_ids, t->route_w);
        be->moe_ffn(be, &t->experts[li], t->xn, n, t->route_ids, t->route_w,
                    c->n_experts_per_tok, t->ffn_out);
        if (t->shared_inter) shared_expert(t, l, n);
    } else {
        const weight_matrix *gu[2] = {&l->w_gate, &l->w_up};
        float *gu_out[2] = {t->gate, t->up};
        norm_then_matmul(t, t->vec[li].ffn_norm, 2, gu, gu_out, n);
        return residual_update(t, &l->w_down, t->gate, t->up, NULL, n, err, errlen);
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
    linear_attention_batch lb = {.n_tokens = n, .positions = t->positions,
                                 .seq_of_token = t->seq_of_token, .state_slots = t->state_slots};
    if (t->first) be->embed(be, &t->w->embed, t->tokens, n, t->x);
    for (int li = 0; li < t->n_local; li++) {
        if (t->w->layers[li].is_linear) linear_attention_block(t, li, &lb, n);
        else if (attention_block(t, li, &kv[li], ab, n, err, errlen)) return -1;
        if (mlp_block(t, li, n, err, errlen)) return -1;
    }
    if (!t->last || !b->n_logits) return 0;
    be->gather_rows(be, t->x, t->logit_rows, b->n_logits, t->dim, t->head_in);
    be->rmsnorm(be, t->head_in, t->final_norm, t->head_in, b->n_logits, t->dim,
                t->c->rms_norm_eps);
    be->matmul(be, &t->w->lm_head, t->head_in, t->logits, b->n_logits);
    return 0;
}

/* What a step's ops and their arguments depend on besides memory contents (backend.h,
 * step_begin): sizes, and the buffers that can move between steps (block tables, the cache, a
 * hybrid's recurrent states). */
static uint64_t step_key(const transformer *t, const kv_layer *kv, int block_size,
                         const transformer_batch *b) {
    uint64_t v[] = {(uint64_t)b->n_tokens, (uint64_t)b->n_logits, (uint64_t)block_size,
                    (uint64_t)(uintptr_t)t->tables, (uint64_t)(uintptr_t)kv,
                    (uint64_t)(uintptr_t)kv[0].k, (uint64_t)(uintptr_t)kv[0].v,
                    (uint64_t)t->state_generation};
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

void transformer_hidden_rows(transformer *t, int row0, int n, float *out) {
    size_t row = (size_t)t->dim;
    t->be->download(t->be, out, t->x + (size_t)row0 * row, (size_t)n * row * sizeof(float));
}
