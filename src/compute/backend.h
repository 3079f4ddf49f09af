/* backend — the ops the forward pass (arch/) is written in, as one struct of function pointers
 * per backend (ggml-style). Small and boring on purpose.
 *
 * Memory: every float/int pointer an op takes is backend memory, made by alloc() and filled by
 * upload(); arch code never dereferences it (on CUDA it is device memory). Weights are
 * weight_matrix views (model/weight_types.h); a backend may keep them where they are (CPU: the mmap).
 * Activations are row-major float32 [n_tokens][dim].
 *
 * The KV cache is paged: each layer's K and V are arrays of slots [n_slots][n_kv_heads*head_dim]
 * (slot = block * block_size + offset in block); a sequence's block table lists its blocks in
 * order, so position p of a sequence lives in slot table[p / block_size] * block_size +
 * p % block_size.
 *
 * This interface refuses: graphs, autograd, activation dtypes other than f32, ops no forward
 * pass uses. */
#ifndef EXO_COMPUTE_BACKEND_H
#define EXO_COMPUTE_BACKEND_H

#include "model/weight_types.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA backend (.cu) includes these */
extern "C" {
#endif

/* One layer's paged KV storage (backend memory). */
typedef struct kv_layer {
    void *k;      /* [n_slots][kv_dim] of `type` */
    void *v;      /* [n_slots][kv_dim] */
    dtype type;   /* DTYPE_F32, DTYPE_F16 or DTYPE_BF16 */
} kv_layer;

/* Which cache slots each token of a flat batch attends to (all arrays backend memory). Token t
 * of sequence s = seq_of_token[t] attends to positions 0..positions[t] of s (causal), through
 * block_tables[block_table_start[s] ...]. */
typedef struct attention_batch {
    int64_t n_tokens;
    const int32_t *positions;         /* [n_tokens] */
    const int32_t *seq_of_token;      /* [n_tokens] */
    const int32_t *block_table_start; /* [n_seqs] offsets into block_tables */
    const int32_t *block_tables;      /* flat block ids */
    int block_size;
    int n_heads, n_kv_heads, head_dim;
    float scale;                      /* usually 1/sqrt(head_dim) */
    int window;                       /* > 0: token at position p sees positions p-window+1..p only */
    const float *sinks;               /* [n_heads] or NULL: per-head logit that joins each softmax
                                         with a zero value (gpt-oss), so weights may sum below 1 */
    /* Host copies of positions, seq_of_token and block_table_start (NULL when the caller has
     * none): a backend may plan per sequence from them (CUDA: prefill runs as GEMMs). */
    const int32_t *host_positions, *host_seq_of_token, *host_block_table_start;
} attention_batch;

/* A sparse MoE MLP's experts: n_experts SwiGLU FFNs. With biases and a limit (gpt-oss):
 * g = min(gate x + gate_bias, limit), u = clamp(up x + up_bias, -limit, limit),
 * h = (u + 1) * g * sigmoid(alpha * g), out = down h + down_bias; else h = silu(gate x) * up x. */
typedef struct moe_experts {
    int n_experts;
    int64_t dim, inter;
    const weight_matrix *gate, *up; /* [n_experts], each [inter][dim] */
    const weight_matrix *down;      /* [n_experts], each [dim][inter] */
    const float *gate_bias, *up_bias; /* [n_experts][inter] backend memory, or NULL */
    const float *down_bias;           /* [n_experts][dim], or NULL */
    float swiglu_limit;               /* > 0: the clamped gpt-oss activation above */
    float swiglu_alpha;
} moe_experts;

/* What a backend's ops can do beyond the plain transformer (compute_backend.features). */
enum {
    BACKEND_FEATURE_ATTENTION_SINKS_WINDOW = 1, /* attention_batch.sinks and .window */
    BACKEND_FEATURE_MOE_BIAS_CLAMP = 2,         /* moe_experts biases and swiglu_limit */
};
/* One GatedDeltaNet (linear attention) layer as its ops see it: the shapes, the small weights as
 * f32 backend memory, and the recurrent state of every sequence slot (backend memory, zeroed by
 * alloc). The projections in front of it write qkv [n_tokens][conv_dim] with conv_dim =
 * 2 * n_k_heads * key_dim + n_v_heads * value_dim: all query heads, then all key heads, then all
 * value heads. Value head h reads query/key head h / (n_v_heads / n_k_heads). */
typedef struct linear_attention_layer {
    int n_k_heads, n_v_heads, key_dim, value_dim, conv_kernel;
    int64_t conv_dim;
    const float *conv_weight;   /* [conv_dim][conv_kernel] depthwise causal taps */
    const float *a_log;         /* [n_v_heads] A = exp(a_log) */
    const float *dt_bias;       /* [n_v_heads] */
    float *conv_state;          /* [n_slots][conv_kernel - 1][conv_dim] last inputs, oldest first */
    float *recurrent_state;     /* [n_slots][n_v_heads][key_dim][value_dim] */
} linear_attention_layer;

/* Which state slot each token continues. The tokens of one sequence are consecutive in the batch
 * and in position order; a sequence whose first token here has position 0 starts from a zero
 * state (a new or recomputed sequence), any other continues from its slot's state. Backend
 * memory, like the rest of a step's inputs: a backend finds the runs of sequences itself (on a
 * GPU, without a trip to the host, and a recorded step replays with the next step's batch). */
typedef struct linear_attention_batch {
    int64_t n_tokens;
    const int32_t *positions;    /* [n_tokens] */
    const int32_t *seq_of_token; /* [n_tokens] */
    const int32_t *state_slots;  /* [n_seqs] */
} linear_attention_batch;

/* Sampling on the backend (the sample op): one logits row's parameters, as infer/sampler.h
 * describes them, less the penalties (a caller with penalties samples on the host). */
#define COMPUTE_MAX_TOP_LOGPROBS 20
typedef struct sample_params {
    float temperature;      /* <= 0: greedy */
    int top_k;              /* 0: off */
    float top_p;            /* 1: off */
    float min_p;            /* 0: off */
    int logprob;            /* the sampled token's logprob is wanted */
    int n_top;              /* alternatives wanted, 0..COMPUTE_MAX_TOP_LOGPROBS */
    double uniform;         /* the draw in [0, 1) that picks the token (non-greedy rows) */
    const int32_t *banned;  /* host memory: ids never sampled (may be NULL) */
    int n_banned;
} sample_params;

typedef struct sample_result {
    int32_t token;
    float logprob; /* 0 unless a logprob was computed (wanted, or any non-greedy row) */
    int n_top;
    int32_t top_ids[COMPUTE_MAX_TOP_LOGPROBS];
    float top_logprobs[COMPUTE_MAX_TOP_LOGPROBS];
} sample_result;

typedef struct compute_backend compute_backend;
struct compute_backend {
    const char *name;
    void *ctx; /* the backend's own state */
    unsigned features; /* BACKEND_FEATURE_* it implements; the forward refuses models needing more */

    /* Zeroed backend memory; NULL when out of memory. */
    void *(*alloc)(compute_backend *b, size_t bytes);
    void (*free)(compute_backend *b, void *p);
    void (*upload)(compute_backend *b, void *dst, const void *host_src, size_t bytes);
    void (*download)(compute_backend *b, void *host_dst, const void *src, size_t bytes);
    /* Offered once per weight matrix at load while its bytes are a private, writable copy (see
     * model_weights_rewrite): the backend may rewrite them in place into an order its kernels
     * read faster, recording it in w->layout (CPU with AVX-512: 4-bit matrices interleaved in
     * blocks of 16 rows). Returns 1 if it rewrote w. NULL: weights are used as loaded. */
    int (*prepare_weight)(compute_backend *b, weight_matrix *w);
    /* Offered every weight view once at load (the embedding and norms too), wherever its bytes
     * are: a backend with memory of its own copies the matrix there (CUDA), and ops given a view
     * with the same host data later use that copy. Returns 0, or -1 with err (out of memory, a
     * layout it cannot read). The host bytes must outlive the backend and stay unchanged (a
     * backend may also copy a view on its first use). NULL: the backend reads weights where
     * they are. */
    int (*load_weight)(compute_backend *b, const weight_matrix *w, char *err, size_t errlen);
    /* Free and total bytes of the backend's memory. NULL: host memory (/proc/meminfo). */
    int (*memory_info)(compute_backend *b, size_t *free_bytes, size_t *total_bytes);
    /* 0, or -1 with err when an earlier op failed (asynchronous backends report kernel and
     * allocation errors here, after the download that waited for them). NULL: ops cannot fail. */
    int (*status)(compute_backend *b, char *err, size_t errlen);
    /* Bracket the ops of one forward step of n_tokens tokens (after its uploads, before its
     * download), so a backend can record them once and replay them (CUDA graphs: one launch
     * instead of hundreds). step_begin returns 1 when it replayed the ops recorded under `key`
     * (the caller skips them), else 0 (the caller issues them). step_end returns 1 when the ops
     * just issued did not run (a recording failed): the caller issues them again. Steps with
     * equal keys must issue the same ops with the same arguments; only memory contents differ.
     * NULL: ops run as called. */
    int (*step_begin)(compute_backend *b, uint64_t key, int64_t n_tokens);
    int (*step_end)(compute_backend *b);

    /* y[t][r] = sum_c x[t][c] * W[r][c] */
    void (*matmul)(compute_backend *b, const weight_matrix *w, const float *x, float *y,
                   int64_t n_tokens);
    /* ys[i] = the matmul of w[i] with the same x, for n (<= 4) matrices of equal cols (q/k/v,
     * gate/up); may run them as one job. NULL: the forward pass calls matmul n times. */
    void (*matmul_multi)(compute_backend *b, int n, const weight_matrix *const *w, const float *x,
                         float *const *ys, int64_t n_tokens);
    /* out[t] = row ids[t] of the table, dequantized */
    void (*embed)(compute_backend *b, const weight_matrix *table, const int32_t *ids,
                  int64_t n_tokens, float *out);
    /* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, over rows of `dim`; y may be x */
    void (*rmsnorm)(compute_backend *b, const float *x, const float *weight, float *y,
                    int64_t rows, int64_t dim, float eps);
    /* x[i] += y[i] */
    void (*add)(compute_backend *b, float *x, const float *y, int64_t n);
    /* x[r][c] += row[c] (biases) */
    void (*add_row)(compute_backend *b, float *x, const float *row, int64_t rows, int64_t dim);
    /* gate[i] = silu(gate[i]) * up[i] */
    void (*silu_mul)(compute_backend *b, float *gate, const float *up, int64_t n);
    /* Rotary embedding, rotate-half (GPT-NeoX / HF) layout, on x [n_tokens][n_heads][head_dim]:
     * the first rot_dims dims of each head rotate by angle positions[t] * inv_freq[i]
     * (i < rot_dims/2), cos and sin scaled by attn_factor. */
    void (*rope)(compute_backend *b, float *x, const int32_t *positions, int64_t n_tokens,
                 int n_heads, int head_dim, int rot_dims, const float *inv_freq,
                 float attn_factor);
    /* Stores k, v [n_tokens][kv_dim] into the cache at slots[t]. */
    void (*kv_write)(compute_backend *b, const kv_layer *kv, const float *k, const float *v,
                     const int32_t *slots, int64_t n_tokens, int64_t kv_dim);
    /* out [n_tokens][n_heads*head_dim] = softmax(q k^T * scale) v over the paged cache. */
    void (*attention)(compute_backend *b, const float *q, const kv_layer *kv,
                      const attention_batch *ab, float *out);
    /* out[i] = x[rows[i]] for i < n */
    void (*gather_rows)(compute_backend *b, const float *x, const int32_t *rows, int64_t n,
                        int64_t dim, float *out);
    /* Router: softmax over n_experts logits per token, keep the top k (ids descending by
     * weight), renormalise them to sum 1 when norm_topk. */
    void (*moe_route)(compute_backend *b, const float *logits, int64_t n_tokens, int n_experts,
                      int k, int norm_topk, int32_t *ids, float *weights);
    /* out[t] = sum_j weights[t][j] * expert_{ids[t][j]}(x[t]) */
    void (*moe_ffn)(compute_backend *b, const moe_experts *ex, const float *x, int64_t n_tokens,
                    const int32_t *ids, const float *weights, int k, float *out);
    /* Hybrid models (NULL where a backend has none: such models are refused on it; the CPU and
     * CUDA backends have them). */
    /* qkv [n_tokens][conv_dim] in place: silu of the causal depthwise convolution over each
     * sequence's inputs (its conv state, then these tokens), whose last conv_kernel - 1 inputs
     * become the new conv state. */
    void (*conv1d_causal)(compute_backend *b, const linear_attention_layer *l,
                          const linear_attention_batch *lb, float *qkv);
    /* The gated delta rule over the convolved qkv: per value head, with L2-normalised q and k
     * (q scaled by 1/sqrt(key_dim)), beta = sigmoid(beta_logits), decay = exp(-exp(a_log) *
     * softplus(a + dt_bias)): S = decay * S; S += k (beta (v - k^T S))^T; out = q^T S.
     * out [n_tokens][n_v_heads * value_dim]; each sequence's S is read from and left in its slot. */
    void (*gated_delta_rule)(compute_backend *b, const linear_attention_layer *l,
                             const linear_attention_batch *lb, const float *qkv,
                             const float *beta_logits, const float *a, float *out);
    /* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight * silu(z[r]), rows of `dim`; y may be x */
    void (*rmsnorm_gated)(compute_backend *b, const float *x, const float *weight, const float *z,
                          float *y, int64_t rows, int64_t dim, float eps);
    /* x[i] *= sigmoid(gate[i]) */
    void (*mul_sigmoid)(compute_backend *b, float *x, const float *gate, int64_t n);
    /* bytes from src to dst, both backend memory (recurrent-state snapshots) */
    void (*copy)(compute_backend *b, void *dst, const void *src, size_t bytes);
    /* x[r][c] *= sigmoid(gate[r]) (a per-row gate, e.g. the shared expert's) */
    void (*mul_sigmoid_rows)(compute_backend *b, float *x, const float *gate, int64_t rows,
                             int64_t dim);

    /* Optional fusions (NULL: the forward pass calls the plain ops instead). A GPU runs each
     * as one kernel where the plain ops take two or three, and at one token a step's time is
     * as much kernel boundaries as work. */
    /* y = W x' (accumulate: y += W x') where x' = silu(x) * x_up when x_up is given (x may be
     * overwritten with x'), else x' = x: the residual stream's updates (o_proj + add, the MLP's
     * silu_mul + down projection + add) as one job. */
    void (*matmul_fused)(compute_backend *b, const weight_matrix *w, float *x, const float *x_up,
                         float *y, int64_t n_tokens, int accumulate);
    /* ys[i] = W_i rmsnorm(x) for n (<= 4) matrices of equal cols (q/k/v, gate/up), the norm
     * with weight norm_w and eps as rmsnorm computes it: the norm before attention and MLP fused
     * into the matmuls that read it. xn [n_tokens][cols] is scratch the backend may use. */
    void (*norm_matmul)(compute_backend *b, const float *x, const float *norm_w, float eps,
                        float *xn, int n, const weight_matrix *const *w, float *const *ys,
                        int64_t n_tokens);
    /* rope of q ([n_tokens][n_heads][head_dim]) and k ([n_tokens][n_kv_heads][head_dim]) as
     * rope does, then kv_write of k and v (kv_dim = n_kv_heads * head_dim) at slots. */
    void (*rope_kv_write)(compute_backend *b, float *q, float *k, const float *v,
                          const int32_t *positions, int64_t n_tokens, int n_heads, int n_kv_heads,
                          int head_dim, int rot_dims, const float *inv_freq, float attn_factor,
                          const kv_layer *kv, const int32_t *slots);
    /* Samples every row of logits [n_rows][vocab] (backend memory; banned entries are
     * overwritten with -inf) into out[row] (host memory), with params[row] (host memory), as
     * sampler_sample does: the same candidates, order (probability descending, lower id first)
     * and draw, so only the ids and the requested logprobs cross to the host. Returns 0, or -1
     * when the backend failed (status says why). NULL: the caller downloads logits. */
    int (*sample)(compute_backend *b, float *logits, int64_t n_rows, int64_t vocab,
                  const sample_params *params, sample_result *out);
    void (*destroy)(compute_backend *b);
};

/* The CPU backend (compute/cpu/backend_cpu.c). n_threads 0 = all cores. */
compute_backend *compute_backend_cpu(int n_threads);

#ifdef __cplusplus
}
#endif

#endif
