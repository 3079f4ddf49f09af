/* gguf_model — a GGUF file as an exo model: its metadata as the config.json a Hugging Face
 * checkpoint of the same model would have, and its tensors under Hugging Face names, so
 * model_config, weights and everything above them read a .gguf like any model directory.
 *
 * Architectures (general.architecture): llama (Llama 2/3, Mistral), qwen2, qwen3, qwen3moe.
 * Names: token_embd -> model.embed_tokens, blk.N.attn_q -> model.layers.N.self_attn.q_proj, ...,
 * output -> lm_head (absent: tied to the embedding), ffn_*_exps -> mlp.switch_mlp.* (stacked
 * experts). llama.cpp stores a llama model's q/k rows permuted for its interleaved RoPE; they are
 * put back in Hugging Face order here (rows are whole blocks, so this is a row copy).
 * Weights: F32/F16/BF16 are views into the mapping; quantized types become MLX groups of 32
 * (gguf_quant.h) when a tensor is first looked up, so a pipeline stage converts only its layers.
 * Llama 3 RoPE scaling, which GGUF stores as a table (rope_freqs.weight), is recognised when the
 * table is the one Llama 3's rope_scaling parameters produce.
 *
 * Refuses (errors naming the key or tensor): other architectures, tokenizer-only files, tensor
 * types gguf_quant cannot run, shapes the config does not imply (checked by weights.c). */
#ifndef EXO_MODEL_GGUF_MODEL_H
#define EXO_MODEL_GGUF_MODEL_H

#include <stddef.h>

#include "model/gguf.h"
#include "model/safetensors.h"

/* The config.json text (malloc'd, NUL-terminated) equivalent to the file's metadata; NULL + err. */
char *gguf_config_json(const gguf_file *f, char *err, size_t errlen);
/* The same from a path (opens and closes the file). */
char *gguf_config_json_path(const char *path, char *err, size_t errlen);

/* A tensor name's base (no ".weight"/".bias") from llama.cpp's naming to Hugging Face's
 * ("blk.3.attn_q" -> "model.layers.3.self_attn.q_proj", "output" -> "lm_head") and back.
 * Returns 0, or -1 for a name not in the table. */
int gguf_name_to_hf(const char *gguf_base, char *out, size_t n);
int gguf_name_from_hf(const char *hf_base, char *out, size_t n);

/* The file's tensors under Hugging Face names (see the top comment). NULL + err. */
safetensors_set *gguf_tensor_set_open(const char *path, char *err, size_t errlen);

#endif
