/* MoE routing, reference path: softmax over the router logits, top-k, optional renormalisation
 * (Qwen3-MoE's norm_topk_prob). Ties keep the lower expert id, as torch.topk does in practice. */
#include "compute/cpu/ops.h"
#include "compute/ops_shared.h"

#include <math.h>

void cpu_op_moe_route(const float *logits, int64_t n_tokens, int n_experts, int k, int norm_topk,
                      int32_t *ids, float *weights) {
    for (int64_t t = 0; t < n_tokens; t++) {
        ops_moe_route_token(logits + t * n_experts, n_experts, k, norm_topk, ids + t * k,
                            weights + t * k);
    }
}
