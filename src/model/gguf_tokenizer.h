/* gguf_tokenizer — a GGUF file's tokenizer (tokenizer.ggml.*) as the tokenizer.json and
 * tokenizer_config.json Hugging Face would ship for it, so text/'s tokenizer loads it unchanged.
 *
 * Supported: tokenizer.ggml.model "gpt2" (byte-level BPE with merges) with pre-tokenizer
 * (tokenizer.ggml.pre) "llama-bpe"/"llama3" (Llama 3), "qwen2" (Qwen 2/2.5/3), "gpt-2"/"default"
 * (GPT-2); and "llama", SentencePiece vocabularies (Llama 1/2, Mistral, ...) tokenized as
 * llama.cpp does: a leading space (add_space_prefix, default on) and spaces as U+2581, then the
 * adjacent pair whose concatenation is the best-scoring token (tokenizer.ggml.scores) merged
 * first, characters outside the vocabulary as their <0xXX> byte tokens; written as a BPE whose
 * merges are every two-token split of every token, ranked by score (exo_merge_ranks, see
 * text/tokenizer_load.c). Token types CONTROL (and a SentencePiece vocabulary's UNKNOWN) become
 * special added tokens, USER_DEFINED non-special added tokens (and, as llama.cpp loads them, the
 * end-of-generation texts "</s>", "<|im_end|>", ... are control tokens whatever their type);
 * add_bos_token adds the BOS template; tokenizer.chat_template becomes chat_template.
 * Refuses (naming the key): other vocabularies, unknown pre-tokenizers, token or score arrays
 * that disagree in length. */
#ifndef EXO_MODEL_GGUF_TOKENIZER_H
#define EXO_MODEL_GGUF_TOKENIZER_H

#include <stddef.h>

#include "model/gguf.h"

/* Both texts malloc'd (caller frees). Returns 0, or -1 with err. */
int gguf_tokenizer_json(const gguf_file *f, char **tokenizer_json, char **config_json, char *err,
                        size_t errlen);

#endif
