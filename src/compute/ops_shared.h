/* ops_shared — the per-token and per-pair math that the CPU reference ops (compute/cpu/) and the
 * CUDA kernels (compute/cuda/) must compute identically, written once and compiled for both
 * (host and device under nvcc). Each function is what one thread of the GPU kernel does and
 * what one iteration of the CPU loop does, so the GPU is tested against the very same formula.
 *
 * Refuses: loops over tokens or heads (the callers own their parallel decomposition). */
#ifndef EXO_COMPUTE_OPS_SHARED_H
#define EXO_COMPUTE_OPS_SHARED_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define OPS_SHARED __host__ __device__ static inline
#else
#define OPS_SHARED static inline
#endif

/* Rotary pair (p, p + half) of every head of one token, rotated by cos c and sin s (rotate-half
 * layout: x is [n_heads][head_dim]). */
OPS_SHARED void ops_rope_rotate_pair(float *x, int n_heads, int head_dim, int p, int half,
                                     float c, float s) {
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (int64_t)h * head_dim;
        float a = xh[p], b = xh[p + half];
        xh[p] = a * c - b * s;
        xh[p + half] = b * c + a * s;
    }
}

/* One token's MoE router: softmax over n_experts logits (in double), the top k by selection
 * (ties keep the lower expert id, as torch.topk does in practice), renormalised to sum 1 when
 * norm_topk (Qwen3-MoE's norm_topk_prob). */
OPS_SHARED void ops_moe_route_token(const float *lg, int n_experts, int k, int norm_topk,
                                    int32_t *id, float *w) {
    float m = -INFINITY;
    for (int e = 0; e < n_experts; e++) m = lg[e] > m ? lg[e] : m;
    double sum = 0;
    for (int e = 0; e < n_experts; e++) sum += exp((double)lg[e] - m);
    for (int j = 0; j < k; j++) { /* selection: k is small */
        int best = -1;
        for (int e = 0; e < n_experts; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= id[i] == e;
            if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
        }
        id[j] = best;
        w[j] = (float)(exp((double)lg[best] - m) / sum);
    }
    if (norm_topk) {
        float s = 0;
        for (int j = 0; j < k; j++) s += w[j];
        for (int j = 0; j < k; j++) w[j] /= s;
    }
}

#endif
