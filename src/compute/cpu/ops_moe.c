/* MoE routing, reference path: softmax over the router logits, top-k, optional renormalisation
 * (Qwen3-MoE's norm_topk_prob). Ties keep the lower expert id, as torch.topk does in practice. */
#include "compute/cpu/ops.h"

#include <math.h>

void cpu_op_moe_route(const float *logits, int64_t n_tokens, int n_experts, int k, int norm_topk,
                      int32_t *ids, float *weights) {
    for (int64_t t = 0; t < n_tokens; t++) {
        const float *lg = logits + t * n_experts;
        float m = -INFINITY;
        for (int e = 0; e < n_experts; e++) m = lg[e] > m ? lg[e] : m;
        double sum = 0;
        for (int e = 0; e < n_experts; e++) sum += exp((double)lg[e] - m);
        int32_t *id = ids + t * k;
        float *w = weights + t * k;
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
}
