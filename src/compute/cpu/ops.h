/* ops — the CPU backend's reference ops (private to compute/cpu). Plain C, the ground truth the
 * SIMD and CUDA paths are tested against. Ranged variants let the backend split work over
 * threads: each computes rows/items [begin, end). */
#ifndef EXO_COMPUTE_CPU_OPS_H
#define EXO_COMPUTE_CPU_OPS_H

#include "compute/backend.h"

void cpu_op_embed(const weight_matrix *table, const int32_t *ids, int64_t n_tokens, float *out);
void cpu_op_rmsnorm(const float *x, const float *weight, float *y, int64_t begin, int64_t end,
                    int64_t dim, float eps);
void cpu_op_add(float *x, const float *y, int64_t n);
void cpu_op_add_row(float *x, const float *row, int64_t rows, int64_t dim);
void cpu_op_silu_mul(float *gate, const float *up, int64_t begin, int64_t end);
/* gpt-oss experts, rows x inter: gate[r][i] = (clamp(up + up_bias) + 1) * g * sigmoid(alpha * g)
 * with g = min(gate + gate_bias, limit) (biases [inter] or NULL). */
void cpu_op_clamped_swiglu(float *gate, const float *up, const float *gate_bias, const float *up_bias,
                           int64_t rows, int64_t inter, float limit, float alpha);
void cpu_op_rope(float *x, const int32_t *positions, int64_t begin, int64_t end, int n_heads,
                 int head_dim, int rot_dims, const float *inv_freq, float attn_factor);
void cpu_op_gather_rows(const float *x, const int32_t *rows, int64_t n, int64_t dim, float *out);

void cpu_op_kv_write(const kv_layer *kv, const float *k, const float *v, const int32_t *slots,
                     int64_t n_tokens, int64_t kv_dim);
/* Work items are (token, head) pairs: item i = t * n_heads + h. */
void cpu_op_attention(const float *q, const kv_layer *kv, const attention_batch *ab, float *out,
                      int64_t begin, int64_t end);

/* SIMD path (AVX2/F16C on x86-64, NEON on aarch64): the query heads of one KV head together;
 * work items are (token, kv head) pairs: item i = t * n_kv_heads + kvh. Only when
 * cpu_op_attention_fast_ok(ab). */
void cpu_op_attention_grouped(const float *q, const kv_layer *kv, const attention_batch *ab,
                              float *out, int64_t begin, int64_t end);
int cpu_op_attention_fast_ok(const attention_batch *ab);

/* AVX-512 path in blocks of 16 cached positions (ops_attention_avx512.c). Work items are
 * (tile, kv head) pairs, item i = tile * n_kv_heads + kvh, where a tile is a run of up to
 * CPU_ATT_TILE_TOKENS consecutive tokens of one sequence: cpu_op_attention_tiles fills
 * tile_start[0..n] (n + 1 entries, room for n_tokens + 1) and returns n. scratch: per thread,
 * cpu_op_attention_avx512_scratch(ab) bytes, 64-byte aligned. Only when
 * cpu_op_attention_avx512_ok(ab). */
#define CPU_ATT_TILE_TOKENS 16
int cpu_op_attention_avx512_ok(const attention_batch *ab);
int64_t cpu_op_attention_tiles(const attention_batch *ab, int32_t *tile_start);
size_t cpu_op_attention_avx512_scratch(const attention_batch *ab);
void cpu_op_attention_avx512(const float *q, const kv_layer *kv, const attention_batch *ab,
                             const int32_t *tile_start, float *out, int64_t begin, int64_t end,
                             float *scratch);

/* GatedDeltaNet ops (ops_linear_attention.c). conv1d: work items are channels. delta rule:
 * items are (sequence, value head) pairs in batch order, cpu_op_gated_delta_items of them;
 * scratch holds 2 * key_dim + value_dim floats. */
void cpu_op_conv1d_causal(const linear_attention_layer *l, const linear_attention_batch *lb,
                          float *qkv, int64_t channel_begin, int64_t channel_end);
int64_t cpu_op_gated_delta_items(const linear_attention_batch *lb, int n_v_heads);
void cpu_op_gated_delta_rule(const linear_attention_layer *l, const linear_attention_batch *lb,
                             const float *qkv, const float *beta_logits, const float *a,
                             float *out, int64_t item_begin, int64_t item_end, float *scratch);
void cpu_op_rmsnorm_gated(const float *x, const float *weight, const float *z, float *y,
                          int64_t begin, int64_t end, int64_t dim, float eps);
void cpu_op_mul_sigmoid(float *x, const float *gate, int64_t n);
void cpu_op_mul_sigmoid_rows(float *x, const float *gate, int64_t rows, int64_t dim);

void cpu_op_moe_route(const float *logits, int64_t n_tokens, int n_experts, int k, int norm_topk,
                      int32_t *ids, float *weights);

#endif
