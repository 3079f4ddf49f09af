/* model_text — the tokenizer of a model on disk, whatever its format: a Hugging Face directory
 * (tokenizer.json + tokenizer_config.json) or a GGUF model (its tokenizer.ggml.* metadata and
 * tokenizer.chat_template, see model/gguf_tokenizer.h). The one place that knows both, so the
 * runner and `exo run` open a model's text side the same way. */
#ifndef EXO_RUNNER_MODEL_TEXT_H
#define EXO_RUNNER_MODEL_TEXT_H

#include <stddef.h>

#include "text/tokenizer.h"

/* NULL with a message naming the file and the problem. */
tokenizer *model_text_tokenizer_load(const char *model_path, char *err, size_t errlen);

#endif
