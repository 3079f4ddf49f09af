/* Paged KV cache block pool. See kv_cache.h. */
#include "infer/kv_cache.h"

#include <stdio.h>
#include <stdlib.h>

size_t kv_cache_block_bytes(int n_layers, int64_t kv_dim, int block_size, dtype type) {
    return (size_t)n_layers * 2 * (size_t)kv_dim * (size_t)block_size * dtype_size(type);
}

kv_cache *kv_cache_create(compute_backend *be, int n_layers, int64_t kv_dim, int block_size,
                          int n_blocks, dtype type, char *err, size_t errlen) {
    kv_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = (kv_cache){.be = be, .n_layers = n_layers, .kv_dim = kv_dim, .block_size = block_size,
                    .n_blocks = n_blocks, .type = type};
    c->layers = calloc((size_t)n_layers, sizeof *c->layers);
    c->free_ids = malloc((size_t)n_blocks * sizeof *c->free_ids);
    size_t bytes = (size_t)n_blocks * (size_t)block_size * (size_t)kv_dim * dtype_size(type);
    int fail = !c->layers || !c->free_ids;
    for (int l = 0; !fail && l < n_layers; l++) {
        c->layers[l].type = type;
        c->layers[l].k = be->alloc(be, bytes);
        c->layers[l].v = be->alloc(be, bytes);
        fail = !c->layers[l].k || !c->layers[l].v;
    }
    if (fail) {
        snprintf(err, errlen, "out of memory for a KV cache of %d blocks (%zu MiB)", n_blocks,
                 kv_cache_block_bytes(n_layers, kv_dim, block_size, type) * (size_t)n_blocks >> 20);
        kv_cache_destroy(c);
        return NULL;
    }
    for (int i = 0; i < n_blocks; i++) c->free_ids[i] = n_blocks - 1 - i; /* pop 0 first */
    c->n_free = n_blocks;
    return c;
}

void kv_cache_destroy(kv_cache *c) {
    if (!c) return;
    for (int l = 0; c->layers && l < c->n_layers; l++) {
        if (c->layers[l].k) c->be->free(c->be, c->layers[l].k);
        if (c->layers[l].v) c->be->free(c->be, c->layers[l].v);
    }
    free(c->layers);
    free(c->free_ids);
    free(c);
}

int32_t kv_cache_alloc_block(kv_cache *c) {
    return c->n_free ? c->free_ids[--c->n_free] : -1;
}

void kv_cache_free_block(kv_cache *c, int32_t id) {
    if (id >= 0 && id < c->n_blocks && c->n_free < c->n_blocks) c->free_ids[c->n_free++] = id;
}
