/* model_config — a model's blueprint from Hugging Face config.json.
 *
 * Supported architectures: LlamaForCausalLM (Llama 2/3/3.1/3.2), MistralForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, GptOssForCausalLM (gpt-oss: attention
 * sinks, sliding-window layers per layer_types, biased router and experts with a clamped SwiGLU),
 * and the hybrids Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM and their
 * ...ForConditionalGeneration checkpoints (fields under "text_config"; the vision tower is not
 * used). rope_scaling types: default, linear, llama3, yarn (with or without truncate);
 * transformers 5's "rope_parameters" (rope_theta, partial_rotary_factor; the multimodal mrope
 * sections reduce to plain RoPE for text). mlx-community's "quantization" block gives the
 * default bits/group size (the loader checks every quantized tensor's shapes against the shapes
 * this config implies); gpt-oss's quantization_config {"quant_method": "mxfp4"} says its experts
 * are MXFP4 (the loader reads them as published).
 *
 * Every field is validated: a missing required field, a wrong type or an absurd value (zero
 * heads, heads not dividing the hidden size, KV heads not dividing heads, sizes past sane
 * limits) is an error that names the field. Refuses: other architectures (named in the error). */
#ifndef EXO_MODEL_MODEL_CONFIG_H
#define EXO_MODEL_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define MODEL_CONFIG_MAX_EOS 8

typedef enum model_family {
    MODEL_FAMILY_LLAMA = 0, /* Llama, Mistral */
    MODEL_FAMILY_QWEN2,     /* q/k/v biases */
    MODEL_FAMILY_QWEN3,     /* q/k RMSNorm per head */
    MODEL_FAMILY_QWEN3_MOE, /* q/k norm + sparse MoE MLP */
    MODEL_FAMILY_GPT_OSS,   /* biases everywhere, attention sinks, sliding/full layers, MoE */
    MODEL_FAMILY_QWEN3_NEXT, /* hybrid: GatedDeltaNet linear attention + gated full attention
                                (Qwen3-Next, Qwen3.5 dense and MoE) */
} model_family;

#define MODEL_CONFIG_MAX_LAYERS_BITSET 256

typedef enum rope_type { ROPE_DEFAULT = 0, ROPE_LINEAR, ROPE_LLAMA3, ROPE_YARN } rope_type;

typedef struct rope_config {
    rope_type type;
    double theta;              /* rope_theta (base) */
    double factor;             /* linear / llama3 / yarn scaling factor */
    double low_freq_factor;    /* llama3 */
    double high_freq_factor;   /* llama3 */
    int original_max_position; /* llama3 / yarn: original_max_position_embeddings */
    double beta_fast, beta_slow; /* yarn (defaults 32, 1) */
    double attention_factor;   /* yarn: cos/sin scale; 0 = derived from factor */
    int partial_dims;          /* rotary dims (= head_dim unless partial_rotary_factor) */
    int truncate;              /* yarn: round the ramp's ends to whole dims (default 1; gpt-oss 0) */
} rope_config;

typedef struct model_config {
    char architecture[64];
    model_family family;
    int vocab_size;
    int hidden_size;       /* dim */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int intermediate_size; /* dense MLP hidden */
    int max_position_embeddings;
    float rms_norm_eps;
    rope_config rope;
    int tie_word_embeddings;
    int attention_bias;    /* q/k/v projections have biases (Qwen2) */
    int qk_norm;           /* Qwen3 */
    int32_t bos_id;        /* -1 if none */
    int32_t eos_ids[MODEL_CONFIG_MAX_EOS];
    int n_eos;
    /* MoE (n_experts == 0 for dense models) */
    int n_experts;
    int n_experts_per_tok;
    int moe_intermediate_size;
    int norm_topk_prob;
    int decoder_sparse_step;  /* layer i is sparse if (i+1) % step == 0 and not in mlp_only */
    uint64_t mlp_only_layers[4]; /* bitset of layers forced dense (layers < 256) */
    /* gpt-oss */
    int attention_sinks;       /* a learned per-head logit joins each softmax (self_attn.sinks) */
    int sliding_window;        /* window of the sliding layers (0 = none) */
    uint64_t sliding_layers[4]; /* bitset: layer_types[i] == "sliding_attention" (layers < 256) */
    int moe_bias;              /* router and experts have biases; experts are fused gate_up */
    float swiglu_limit;        /* > 0: expert gate clamped to <= limit, up to [-limit, limit] */
    float swiglu_alpha;        /* expert activation: gate * sigmoid(alpha * gate) * (up + 1) */
    int shared_expert_intermediate_size; /* hybrid MoE: sigmoid-gated shared expert (0 = none) */
    /* hybrid (family QWEN3_NEXT): which layers are GatedDeltaNet, and their shape */
    uint64_t linear_layers[4];   /* bitset of linear-attention layers (the rest: full attention) */
    int linear_conv_kernel;      /* causal depthwise conv taps */
    int linear_key_heads, linear_value_heads, linear_key_dim, linear_value_dim;
    int linear_fused_projections; /* Qwen3-Next: in_proj_qkvz / in_proj_ba grouped per key head */
    int attn_output_gate;        /* q_proj yields per head head_dim queries then a sigmoid gate */
    int norm_zero_centred;       /* transformers computes RMSNorms as (1 + w) (model, layer and q/k
                                    norms); checkpoints converted by mlx-lm store 1 + w already
                                    (model_weights.norm_plus_one says which a checkpoint holds) */
    /* mlx-community quantization (0 = not quantized) */
    int quant_bits;
    int quant_group_size;
} model_config;

/* Parses config.json text. Returns 0, or -1 with err naming the bad field. */
int model_config_parse(const char *json, size_t len, model_config *out, char *err, size_t errlen);
/* The config.json text of a model (malloc'd, NUL-terminated, *len its length): <dir>/config.json,
 * or, when dir is a GGUF model (a .gguf file or a directory holding one, see gguf.h), the
 * config.json its metadata amounts to. NULL with err. */
char *model_config_read_json(const char *dir, size_t *len, char *err, size_t errlen);
/* What Ollama's clients show of a model ("details" of /api/tags and /api/show), from its files:
 * format "gguf" or "safetensors"; family: general.architecture or config.json's model_type;
 * quantization: a GGUF's file type as llama.cpp names it (general.file_type, else the type of
 * most of its matrix elements), an MLX checkpoint's "Q<bits>", else its dtype ("BF16", "F16",
 * "F32"); parameter_size ("8.0B", "494M"): a GGUF's tensors' elements (safetensors: ""); size:
 * the bytes of the weight files. Fields it cannot tell stay "" / 0. Returns 0, or -1 when dir is
 * no model (neither a GGUF nor a directory with a config.json). */
typedef struct model_details {
    char format[16];
    char family[48];
    char quantization[16];
    char parameter_size[16];
    int64_t size;
} model_details;
int model_details_read(const char *dir, model_details *out);

/* Reads <dir>/config.json (or a GGUF model's metadata: model_config_read_json). */
int model_config_load(const char *dir, model_config *out, char *err, size_t errlen);
/* The attention window of layer i: 0 = full (causal) attention, else the number of most recent
 * positions (itself included) a token attends to. */
int model_config_layer_window(const model_config *c, int layer);
/* Whether layer i has a sparse MoE MLP. */
int model_config_layer_is_moe(const model_config *c, int layer);
/* Whether layer i is a GatedDeltaNet (linear attention) layer of a hybrid model. */
int model_config_layer_is_linear(const model_config *c, int layer);
/* Whether the model has linear-attention layers (a recurrent state per sequence). */
int model_config_is_hybrid(const model_config *c);
/* Whether a tensor-parallel split n ways is possible (for placement and the loader): attention
 * heads, KV heads, the dense FFN's and every expert's hidden dim divide by n, and for quantized
 * models each rank's share of o_proj's and down_proj's input columns is a whole number of
 * quantization groups (the config's default group; the loader checks each tensor's own).
 * Returns 0, or -1 with err saying what does not divide. n = 1 always fits. */
int model_config_tensor_split_check(const model_config *c, int n, char *err, size_t errlen);

#endif
