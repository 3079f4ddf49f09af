/* mkmodel — shared declarations of the tiny-model generator (a developer tool, not part of exo).
 *
 * mkmodel.c parses the command line and writes the JSON files; plan.c turns a model shape into
 * the list of tensors a Hugging Face / mlx-community checkpoint of that architecture holds;
 * writer.c fills them with deterministic random values and streams them into safetensors files.
 *
 * Refuses: reading or converting real checkpoints, architectures other than the listed ones. */
#ifndef EXO_TOOLS_MKMODEL_H
#define EXO_TOOLS_MKMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/weight_types.h"

/* The hybrids (mk_arch_is_hybrid: MK_QWEN3_NEXT and later) mix GatedDeltaNet linear-attention
 * layers with gated full attention every full_attention_interval layers; their RMSNorms are
 * zero-centred (1 + w). */
typedef enum mk_arch {
    MK_LLAMA = 0, MK_QWEN2, MK_QWEN3, MK_QWEN3_MOE, MK_GPT_OSS, MK_QWEN3_NEXT, MK_QWEN3_5, MK_QWEN3_5_MOE
} mk_arch;
typedef enum mk_rope { MK_ROPE_NONE = 0, MK_ROPE_LLAMA3, MK_ROPE_LINEAR, MK_ROPE_YARN } mk_rope;

/* The whole blueprint of the model to write. */
typedef struct mk_config {
    mk_arch arch;
    int64_t hidden;          /* hidden_size */
    int64_t layers;          /* num_hidden_layers */
    int64_t heads;           /* num_attention_heads */
    int64_t kv_heads;        /* num_key_value_heads */
    int64_t head_dim;        /* head_dim */
    int64_t intermediate;    /* intermediate_size (dense MLP) */
    int64_t experts;         /* num_experts (qwen3_moe) */
    int64_t experts_per_tok; /* num_experts_per_tok */
    int64_t moe_intermediate;
    int64_t decoder_sparse_step;
    int64_t shared_intermediate; /* hybrids with MoE: shared_expert_intermediate_size */
    /* hybrids: linear-attention (GatedDeltaNet) shape */
    int64_t linear_key_heads, linear_value_heads, linear_key_dim, linear_value_dim;
    int64_t conv_kernel;             /* linear_conv_kernel_dim */
    int64_t full_attention_interval; /* layer l is full attention when (l + 1) % interval == 0 */
    double partial_rotary;           /* partial_rotary_factor */
    int hybrid_mlx;                  /* mlx-lm's conventions: conv1d [C, K, 1], norms stored 1 + w */
    int64_t vocab;           /* vocab_size */
    int64_t max_pos;         /* max_position_embeddings */
    double rope_theta;
    mk_rope rope_scaling;
    double rope_factor;
    int64_t rope_original_max;
    double rms_norm_eps;
    int tie_embeddings;
    dtype dt;           /* DTYPE_BF16, DTYPE_F16 or DTYPE_F32 */
    int quant_bits;     /* 0 = not quantized */
    int group_size;     /* MLX group size */
    int router_bits;    /* qwen3_moe mlp.gate: 0 = same as the rest, -1 = unquantized, else bits */
    int moe_layout_mlx; /* 1: mlp.switch_mlp.* stacked [E, out, in]; 0: mlp.experts.<e>.* */
    int mxfp4;          /* gpt_oss: experts as published by OpenAI (U8 _blocks + _scales) */
    int64_t sliding_window; /* gpt_oss: window of the even (sliding_attention) layers */
    double swiglu_limit;    /* gpt_oss: clamp of the expert gate/up values */
    uint64_t seed;
    int64_t bos_id, eos_id; /* -1 when the tokenizer has none */
    int64_t gguf_row_pool;  /* --gguf-row-pool: 0, or draw this many rows per matrix and repeat them */
    int mtp;                /* hybrids: an MTP head (mtp.*), see mk_mtp */
} mk_config;

/* --mtp: none, a random head, or one that agrees with the model (plan.c, add_mtp). */
typedef enum mk_mtp { MK_MTP_NONE = 0, MK_MTP_RANDOM, MK_MTP_AGREE } mk_mtp;

/* Is MoE used in layer l (qwen3_moe rules: decoder_sparse_step, no mlp_only_layers)? */
int mk_layer_is_moe(const mk_config *c, int64_t layer);
/* Is the architecture a hybrid (Qwen3-Next, Qwen3.5)? Is layer l a linear-attention layer? */
int mk_arch_is_hybrid(mk_arch a);
int mk_layer_is_linear(const mk_config *c, int64_t layer);

/* How a logical matrix's values are drawn. */
typedef enum mk_init {
    MK_INIT_NORMAL = 0,
    MK_INIT_AROUND_ONE,
    MK_INIT_IDENTITY, /* 1 where row == column, else 0 (mtp.fc of --mtp agree) */
} mk_init;

/* One logical weight: a Linear/Embedding matrix [out][in] (optionally a stack of `experts` of
 * them), a norm vector or a bias vector (rows = 1). Quantized ones expand to three tensors. */
typedef struct mk_matrix {
    char name[160];   /* tensor name without the ".weight" / ".bias" suffix */
    const char *suffix; /* "weight" or "bias"; "" for tensors named without one (A_log) */
    int64_t stack;    /* 0: plain tensor; >0: stacked experts [stack][out][in] */
    int64_t out, in;  /* rows, cols; a vector has out = 1 and is stored 1-D [in] */
    mk_init init;
    double std;       /* standard deviation of the random values */
    double mean;      /* MK_INIT_NORMAL: added to every value (0 for most) */
    int bits;         /* 0 = dense in cfg.dt */
    int group_size;
    int vector;       /* 1-D tensor */
    int mxfp4;        /* stored as <name>_blocks U8 [stack, out, in/32, 16] + <name>_scales U8 */
    int transposed;   /* stored [stack, in, out] (gpt_oss bf16 experts); values drawn as [out, in] */
    /* Expert e of a stacked matrix is seeded with this name template (printf %lld = e), so the
     * HF and MLX layouts hold identical values. A plain tensor with a seed_fmt is seeded with it
     * as it is; empty: seeded with name + suffix. */
    char seed_fmt[192];
} mk_matrix;

typedef struct mk_plan {
    mk_matrix *items;
    size_t n, cap;
} mk_plan;

/* Builds the tensor list of cfg. Returns 0, or -1 with a message in err. */
int mk_plan_build(const mk_config *cfg, mk_plan *plan, char *err, size_t errlen);
void mk_plan_free(mk_plan *plan);

/* Writes model.safetensors (or shards + model.safetensors.index.json when shard_bytes > 0)
 * into dir. Streams: memory use is a few MB whatever the model size. Returns 0 or -1 + err. */
int mk_write_safetensors(const mk_config *cfg, const mk_plan *plan, const char *dir, uint64_t shard_bytes,
                         char *err, size_t errlen);

/* The generator state of matrix m (expert `expert` of a stacked one), and its next n values in
 * row order: both writers draw the same values, so a GGUF file holds its safetensors twin's
 * (MK_INIT_IDENTITY is the safetensors writer's own: --mtp is not written as GGUF). */
uint64_t mk_matrix_seed(const mk_config *cfg, const mk_matrix *m, int64_t expert);
void mk_matrix_values(const mk_matrix *m, uint64_t *state, float *vals, int64_t n);

/* Writes the model as one GGUF file (llama.cpp's names and metadata; tokenizer.ggml.* from the
 * tokenizer directory tokdir, or none when NULL). type: a ggml type name for every matrix (F32,
 * F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), or Q4_K_M (llama.cpp's mix: Q6_K
 * for output and for attn_v/ffn_down of the layers it gives more bits, Q4_K elsewhere). Norms and
 * biases are F32. llama's q/k rows are permuted as llama.cpp's converter does. Returns 0 or -1. */
int mk_write_gguf(const mk_config *cfg, const mk_plan *plan, const char *tokdir, const char *type,
                  const char *path, char *err, size_t errlen);

/* Deterministic generator: splitmix64, and an approximately normal value (Irwin-Hall of four
 * 16-bit uniforms, scaled to unit variance) computed with exact integer arithmetic and one
 * correctly rounded multiply, so every machine produces the same bytes. */
uint64_t mk_splitmix64(uint64_t *state);
double mk_normal(uint64_t *state);
uint64_t mk_hash_name(uint64_t seed, const char *name);

/* MLX affine quantization of one row of `n` floats (n % group_size == 0): packed uint32 words
 * (n*bits/32), scales and biases (n/group_size) stored in `dt` (as raw 16- or 32-bit words). */
/* MXFP4 (OCP microscaling FP4 E2M1, 32 values share a power-of-two scale) of one row of `n`
 * floats (n % 32 == 0) as the gpt-oss checkpoints store it: n/2 bytes, value 2i in the low
 * nibble of byte i; n/32 scale bytes holding the exponent + 127. */
void mk_quantize_row_mxfp4(const float *w, int64_t n, uint8_t *blocks, uint8_t *scales);

void mk_quantize_row(const float *w, int64_t n, int bits, int group_size, dtype dt, uint32_t *packed,
                     void *scales, void *biases);

#endif
