/* libFuzzer target: the GGUF reader on arbitrary file images, then everything that interprets a
 * parsed file (config, tokenizer, the Hugging Face view's dequantization of every tensor). Every
 * input must either be rejected with a message or yield tensors whose bytes lie inside the input,
 * metadata strings inside the input, and conversions that stay inside their buffers. */
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/gguf_quant.h"
#include "model/gguf_tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void inside(const void *p, size_t n, const uint8_t *data, size_t size) {
    const uint8_t *b = p;
    if (n && (b < data || b + n > data + size)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    gguf_file *f = gguf_parse(data, size, "fuzz.gguf", err, sizeof err);
    if (!f) return 0;
    for (int i = 0; i < gguf_kv_count(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        inside(kv->key.ptr, kv->key.len, data, size);
        if (kv->type == GGUF_STRING) inside(kv->str.ptr, kv->str.len, data, size);
        if (kv->type == GGUF_ARRAY && kv->elem_type == GGUF_STRING)
            for (uint64_t j = 0; j < kv->n_elems; j++) {
                gguf_str s = gguf_array_string(f, kv, j);
                inside(s.ptr, s.len, data, size);
            }
    }
    for (int i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        inside(t->data, t->nbytes, data, size);
        if (gguf_find_tensor(f, t->name) != t) abort();
        int64_t rows = t->ne[1] * t->ne[2] * t->ne[3], cols = t->ne[0];
        if (gguf_mlx_bits(t->type) > 0 && cols <= 4096) { /* the first row, converted */
            uint32_t *w = calloc((size_t)(cols * 8 / 32 + 1), 4);
            float *sb = calloc((size_t)(cols / 32 + 1) * 2, sizeof *sb), *row = calloc((size_t)cols, 4);
            if (rows > 0 && gguf_row_to_mlx(t->type, t->data, cols, w, sb, sb + cols / 32)) abort();
            if (rows > 0 && gguf_dequantize_row(t->type, t->data, cols, row)) abort();
            free(w), free(sb), free(row);
        }
    }
    char *cfg = gguf_config_json(f, err, sizeof err), *tj = NULL, *tc = NULL;
    free(cfg);
    if (gguf_tokenizer_json(f, &tj, &tc, err, sizeof err) == 0) free(tj), free(tc);
    gguf_close(f);
    return 0;
}
