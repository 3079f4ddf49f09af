/* weights — views of a model's weight tensors, resolved by name from the safetensors files and
 * checked against the shapes the config implies. Views first point into the file mapping; then
 * model_weights_place may copy the bytes the views cover into anonymous memory backed by
 * transparent huge pages (decode streams every weight byte once per token: 2 MiB pages keep the
 * TLB and the hardware prefetchers going, where 4 KiB page-cache pages stop them every 4 KiB).
 *
 * A matrix named P is either dense (P.weight in F32/F16/BF16, [rows][cols]) or MLX affine
 * quantized (P.weight U32 [rows][cols*bits/32], P.scales and P.biases [rows][cols/group]); bits
 * and group size are derived from the shapes, so mixed-precision mlx-community models work.
 * MoE experts come either one tensor per expert (HF: mlp.experts.E.gate_proj) or stacked
 * (mlx: mlp.switch_mlp.gate_proj with a leading expert dimension).
 *
 * gpt-oss experts (fused mlp.experts.gate_up_proj with gate and up interleaved, down_proj, their
 * biases) are read as published, dense [E, in, out] or MXFP4 (_blocks U8 [E, out, in/32, 16] and
 * _scales U8 [E, out, in/32]), and become owned [out][in] matrices per expert with gate and up
 * apart: dense ones transposed in their dtype, MXFP4 ones re-expressed exactly as MLX 8-bit affine
 * with group 32 (an E2M1 value v * 2^e is q * 2^(e-1) - 6 * 2^e with q = 2v + 12 in 0..24), which
 * every backend's MLX kernels read (9 bits a weight where MXFP4 has 4.25: the price of no
 * MXFP4 kernel yet).
 * Hybrid checkpoints (Qwen3-Next, Qwen3.5): Qwen3.5's multimodal ones keep the language model
 * under model.language_model.* (found by its embedding; the vision tower is not loaded, a log
 * line says so). The mtp.* head loads apart (model_weights_load_mtp), for the MTP drafter. Rows that transformers splits per head after the
 * projection (the attention output gate inside q_proj, Qwen3-Next's per-key-head qkvz/ba
 * groups) are regrouped at load into owned copies, so the forward pass sees one layout.
 *
 * Only layers [layer_start, layer_end) are resolved; the embedding is resolved for the first
 * stage, the final norm and lm_head (or the tied embedding) for the last. Refuses: anything whose
 * shape disagrees with the config (the error names the tensor and both shapes).
 *
 * Tensor-parallel shards (Megatron split, model_weights_load_shard with tp_size > 1): rank r of N
 * keeps attention heads [r*H/N, (r+1)*H/N) and KV heads likewise (rows of q/k/v and their biases,
 * input columns of o_proj), and 1/N of the FFN hidden dim (rows of gate/up, input columns of down;
 * for MoE, of every expert's hidden dim, so routing stays replicated). Norms, the router and the
 * embedding are whole on every rank; every rank holds the final norm and the lm_head rows of its
 * share of the vocabulary, [vocab_start, vocab_start + lm_head.rows) (the caller gathers the
 * logits; a tied lm_head slice is copied, so the backend may lay it out apart from the embedding).
 * Row slices stay views into the file; column slices are gathered into owned buffers, which for
 * MLX matrices must start and end on a quantization group (refused otherwise, naming the tensor).
 * Slicing happens before the backend's prepare_weight rewrite, which sees only the slice. */
#ifndef EXO_MODEL_WEIGHTS_H
#define EXO_MODEL_WEIGHTS_H

#include "model/weight_types.h"
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
    weight_matrix bo;        /* [1][dim] o_proj bias (gpt-oss), else data == NULL */
    weight_matrix sinks;     /* [1][n_heads] attention sink logits (gpt-oss), else data == NULL */
    weight_matrix ffn_norm;  /* [1][dim] */
    /* dense MLP */
    weight_matrix w_gate, w_up; /* [intermediate][dim] */
    weight_matrix w_down;       /* [dim][intermediate] */
    /* sparse MoE MLP (is_moe) */
    int is_moe;
    weight_matrix router;    /* [n_experts][dim] */
    weight_matrix router_bias; /* [1][n_experts] (gpt-oss), else data == NULL */
    weight_matrix *expert_gate, *expert_up; /* n_experts x [moe_intermediate][dim] */
    weight_matrix *expert_down;             /* n_experts x [dim][moe_intermediate] */
    weight_matrix expert_gate_bias, expert_up_bias; /* [n_experts][moe_intermediate] (gpt-oss) */
    weight_matrix expert_down_bias;                 /* [n_experts][dim] (gpt-oss) */
    /* hybrid MoE: the shared expert, scaled by sigmoid(shared_expert_gate x) */
    weight_matrix shared_gate, shared_up;   /* [shared_intermediate][dim] */
    weight_matrix shared_down;              /* [dim][shared_intermediate] */
    weight_matrix shared_expert_gate;       /* [1][dim] */
    /* hybrid full attention: q_proj's gate rows, gathered apart from wq at load */
    weight_matrix wq_gate;   /* [n_heads*head_dim][dim] */
    /* hybrid GatedDeltaNet layer (is_linear; then wq..wo, q_norm, k_norm are absent). Qwen3-Next's
     * fused in_proj_qkvz / in_proj_ba rows are regrouped at load into this (Qwen3.5) order. */
    int is_linear;
    weight_matrix lin_qkv;   /* [2*key_heads*key_dim + value_heads*value_dim][dim]: q, k, v */
    weight_matrix lin_z;     /* [value_heads*value_dim][dim] output gate of the gated norm */
    weight_matrix lin_b, lin_a; /* [value_heads][dim] beta and decay projections */
    weight_matrix lin_conv;  /* [conv_dim][conv_kernel] depthwise conv taps */
    weight_matrix lin_a_log, lin_dt_bias; /* [1][value_heads] */
    weight_matrix lin_norm;  /* [1][value_dim] gated RMSNorm weight */
    weight_matrix lin_out;   /* [dim][value_heads*value_dim] */
} layer_weights;

typedef struct model_weights {
    int layer_start, layer_end;
    int has_embed;          /* first stage, or tied lm_head */
    weight_matrix embed;    /* [vocab][dim] */
    int has_head;           /* last stage */
    weight_matrix final_norm; /* [1][dim] */
    weight_matrix lm_head;  /* [vocab][dim] (the embedding when tied); tensor parallel: rows of
                               this rank's vocabulary share */
    int64_t vocab_start;    /* first vocabulary row of lm_head (tensor parallel, else 0) */
    layer_weights *layers;  /* layer_end - layer_start, index = layer - layer_start */
    int n_experts;          /* entries of each MoE layer's expert arrays */
    size_t bytes_per_token; /* weight bytes one decode token reads (experts: top-k share) */
    void *arena;            /* owned copy of the viewed bytes (model_weights_place), or NULL */
    size_t arena_len;       /* bytes mapped at arena */
    size_t copied_bytes;    /* weight bytes copied there (0: views point into the mmap) */
    size_t rewritten_bytes; /* of those, bytes the backend rewrote (model_weights_rewrite) */
    int tp_rank, tp_size;   /* tensor-parallel slice held (0, 1 = whole layers) */
    int norm_plus_one;      /* the RMSNorm weights are used as 1 + w (zero-centred norms as
                               transformers stores them; mlx-lm's conversion adds the 1 itself,
                               recognised by its conv1d layout [C, K, 1]) */
    void **owned;           /* column slices gathered at load (freed once copied to the arena) */
    int n_owned, owned_cap;
    /* an MTP head (model_weights_load_mtp), else data NULL */
    weight_matrix mtp_norm_embedding, mtp_norm_hidden; /* [1][dim] */
    weight_matrix mtp_fc;   /* [dim][2 * dim]: input [normed embedding, normed hidden state] */
} model_weights;

/* Where the weights live once loaded:
 *   AUTO: copy when the viewed bytes fit in half of MemAvailable (else keep the mmap, so a model
 *         near the machine's RAM still runs from the page cache); the default.
 *   COPY: always copy (falls back to the mmap, with a warning, if the memory cannot be had).
 *   MMAP: never copy.
 * EXO_WEIGHTS_MEM=auto|copy|mmap overrides what model_weights_load uses. */
typedef enum weights_memory { WEIGHTS_MEM_AUTO = 0, WEIGHTS_MEM_COPY, WEIGHTS_MEM_MMAP } weights_memory;

/* Which part of the model one rank loads: layers [layer_start, layer_end) (0, 0 = all), and
 * tensor-parallel slice tp_rank of tp_size (tp_size 0 or 1 = whole layers); `memory` is the
 * placement used when EXO_WEIGHTS_MEM is unset (AUTO; a GPU backend copies the weights into its
 * own memory, where a host copy first would only cost time and RAM: MMAP). */
typedef struct model_shard {
    int layer_start, layer_end;
    int tp_rank, tp_size;
    weights_memory memory;
} model_shard;

/* Resolves the views of layers [layer_start, layer_end) (0, 0 = all), then places them as
 * EXO_WEIGHTS_MEM says (default AUTO). Returns 0, or -1 with err. */
int model_weights_load(const safetensors_set *st, const model_config *c, int layer_start,
                       int layer_end, model_weights *out, char *err, size_t errlen);
/* The same for any shard (pipeline layer range and/or tensor-parallel slice). Returns 0, or -1
 * with err (a split the model's shapes or quantization groups do not allow names the tensor). */
int model_weights_load_shard(const safetensors_set *st, const model_config *c,
                             const model_shard *shard, model_weights *out, char *err,
                             size_t errlen);
/* Calls fn on every view of the shard (embedding, norms and biases too; views of absent
 * tensors have data == NULL). */
void model_weights_for_each(model_weights *w, void (*fn)(weight_matrix *m, void *ctx), void *ctx);
/* Copies every byte the views cover (only this shard's tensors) into one huge-page-advised
 * anonymous arena and repoints the views there, or leaves them on the mmap (see weights_memory).
 * Returns 1 if the weights were copied, 0 if they stay on the mmap (never fails: the mmap views
 * are always valid). Idempotent: a second call does nothing. */
int model_weights_place(model_weights *w, weights_memory how);
/* Offers every matrix the forward pass multiplies (not an untied embedding, which is only looked
 * up by row; a tied one is the lm_head and follows its layout) to rewrite(m, ctx), which may
 * reorder m's bytes in place and set m->layout (a backend's prepare_weight). Only when the views
 * are in the arena: on the mmap fallback the weights stay as published. Returns the bytes
 * rewritten. */
size_t model_weights_rewrite(model_weights *w, int (*rewrite)(weight_matrix *m, void *ctx), void *ctx);
/* The same with MemAvailable given (bytes, 0 = unknown: never copy) and the bytes of the views'
 * sources the caller frees once they are copied (a GGUF file's converted tensors,
 * safetensors_set_built_bytes; 0 for file mappings): AUTO copies only when the copy fits in
 * MemAvailable and what it adds for good (the copy less those sources) needs at most half of
 * it. For tests of the fallback. */
int model_weights_place_within(model_weights *w, weights_memory how, size_t mem_available,
                               size_t freed_after);
void model_weights_free(model_weights *w);

/* Whether the checkpoint carries a multi-token-prediction head (Qwen3-Next / Qwen3.5: mtp.*). */
int model_weights_has_mtp(const safetensors_set *st);
/* The MTP head as weights of one more layer after the model's (layer_start = the model's
 * n_layers, so the forward takes hidden states in): mtp.layers.0 (full attention, the MLP kind
 * of the model's last layer), final_norm = mtp.norm, and the mtp_* fields. It holds no lm_head:
 * the caller points lm_head at the model's (shared) once both are placed. Placed in memory like
 * the model (model_weights_place). Returns 0, or -1 with err naming what is missing. */
int model_weights_load_mtp(const safetensors_set *st, const model_config *c, model_weights *out,
                           char *err, size_t errlen);

#endif
