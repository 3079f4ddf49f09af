/* A model's tokenizer from tokenizer.json or GGUF metadata. See model_text.h. */
#include "runner/model_text.h"

#include "model/gguf.h"
#include "model/gguf_tokenizer.h"

#include <stdlib.h>
#include <string.h>

tokenizer *model_text_tokenizer_load(const char *model_path, char *err, size_t errlen) {
    char path[4096];
    if (!gguf_model_file(model_path, path, sizeof path)) return tokenizer_load(model_path, err, errlen);
    gguf_file *f = gguf_open(path, err, errlen);
    if (!f) return NULL;
    char *tok_json = NULL, *cfg_json = NULL;
    tokenizer *t = NULL;
    if (gguf_tokenizer_json(f, &tok_json, &cfg_json, err, errlen) == 0)
        t = tokenizer_load_from_json(tok_json, strlen(tok_json), cfg_json, strlen(cfg_json), err, errlen);
    free(tok_json);
    free(cfg_json);
    gguf_close(f);
    return t;
}
