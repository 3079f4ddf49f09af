/* weights — views of a model's weight tensors, resolved by name from the safetensors files and
 * checked against the shapes the config implies. Views point into the mmap; nothing is copied.
 *
 * A matrix named P is either dense (P.weight in F32/F16/BF16, [rows][cols]) or MLX affine
 * quantized (P.weight U32 [rows][cols*bits/32], P.scales and P.biases [rows][cols/group]); bits
 * and group size are derived from the shapes, so mixed-precision mlx-community models work.
 * MoE experts come either one tensor per expert (HF: mlp.experts.E.gate_proj) or stacked
 * (mlx: mlp.switch_mlp.gate_proj with a leading expert dimension).
 *
 * Only layers [layer_start, layer_end) are resolved; the embedding is resolved for the first
 * stage, the final norm and lm_head (or the tied embedding) for the last. Refuses: anything whose
 * shape disagrees with the config (the error names the tensor and both shapes). */
#ifndef EXO_MODEL_WEIGHTS_H
#define EXO_MODEL_WEIGHTS_H

#include "compute/compute.h"
#include "model/model_config.h"
#include "model/safetensors.h"

typedef struct layer_weights {
    weight_matrix attn_norm; /* [1][dim] */
    weight_matrix wq;        /* [n_heads*head_dim][dim] */
    weight_matrix wk, wv;    /* [n_kv_heads*head_dim][dim] */
    weight_matrix wo;        /* [dim][n_heads*head_dim] */
    weight_matrix bq;        /* [1][n_heads*head_dim] (attention_bias), else data == NULL */
    weight_matrix bk, bv;    /* [1][n_kv_heads*head_dim] */
    weight_matrix q_norm, k_norm; /* [1][head_dim] (qk_norm) */
    weight_matrix ffn_norm;  /* [1][dim] */
    /* dense MLP */
    weight_matrix w_gate, w_up; /* [intermediate][dim] */
    weight_matrix w_down;       /* [dim][intermediate] */
    /* sparse MoE MLP (is_moe) */
    int is_moe;
    weight_matrix router;    /* [n_experts][dim] */
    weight_matrix *expert_gate, *expert_up; /* n_experts x [moe_intermediate][dim] */
    weight_matrix *expert_down;             /* n_experts x [dim][moe_intermediate] */
} layer_weights;

typedef struct model_weights {
    int layer_start, layer_end;
    int has_embed;          /* first stage, or tied lm_head */
    weight_matrix embed;    /* [vocab][dim] */
    int has_head;           /* last stage */
    weight_matrix final_norm; /* [1][dim] */
    weight_matrix lm_head;  /* [vocab][dim] (the embedding when tied) */
    layer_weights *layers;  /* layer_end - layer_start, index = layer - layer_start */
    size_t bytes_per_token; /* weight bytes one decode token reads (experts: top-k share) */
} model_weights;

int model_weights_load(const safetensors_set *st, const model_config *c, int layer_start,
                       int layer_end, model_weights *out, char *err, size_t errlen);
void model_weights_free(model_weights *w);

#endif
