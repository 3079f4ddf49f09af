/* gguf_tokenizer — a GGUF file's tokenizer (tokenizer.ggml.*) as the tokenizer.json and
 * tokenizer_config.json Hugging Face would ship for it, so text/'s tokenizer loads it unchanged.
 *
 * Supported: tokenizer.ggml.model "gpt2" (byte-level BPE with merges) with pre-tokenizer
 * (tokenizer.ggml.pre) "llama-bpe"/"llama3" (Llama 3), "qwen2" (Qwen 2/2.5/3), "gpt-2"/"default"
 * (GPT-2). Token types CONTROL become special added tokens, USER_DEFINED non-special added
 * tokens; add_bos_token adds the BOS template; tokenizer.chat_template becomes chat_template.
 * Refuses (naming the key): SentencePiece ("llama") and other vocabularies, unknown
 * pre-tokenizers, token arrays that disagree in length. */
#ifndef EXO_MODEL_GGUF_TOKENIZER_H
#define EXO_MODEL_GGUF_TOKENIZER_H

#include <stddef.h>

#include "model/gguf.h"

/* Both texts malloc'd (caller frees). Returns 0, or -1 with err. */
int gguf_tokenizer_json(const gguf_file *f, char **tokenizer_json, char **config_json, char *err,
                        size_t errlen);

#endif
