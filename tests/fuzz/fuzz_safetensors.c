/* libFuzzer target: the safetensors header parser on arbitrary file images. Every input must
 * either be rejected with a message or yield tensors whose bytes lie inside the input. */
#include "model/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    safetensors_file *f = safetensors_parse(data, size, "fuzz.safetensors", err, sizeof err);
    if (!f) return 0;
    for (int i = 0; i < safetensors_count(f); i++) {
        const safetensors_tensor *t = safetensors_at(f, i);
        const uint8_t *p = t->data;
        if (t->nbytes && (p < data || p + t->nbytes > data + size)) abort();
        volatile uint8_t sink = 0;
        for (size_t j = 0; j < t->nbytes; j += 64) sink ^= p[j];
        (void)sink;
        if (safetensors_find(f, t->name) != t) abort();
    }
    safetensors_close(f);
    return 0;
}
