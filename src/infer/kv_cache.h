/* kv_cache — the paged KV cache: a pool of fixed-size blocks per layer in backend memory and a
 * free list. Sequences own lists of block ids (their block tables); the scheduler allocates a
 * block when a sequence crosses into a new one and frees all of them when it ends or is
 * cancelled. Refuses: growing after creation (the budget is fixed at open). */
#ifndef EXO_INFER_KV_CACHE_H
#define EXO_INFER_KV_CACHE_H

#include "compute/backend.h"

typedef struct kv_cache {
    compute_backend *be;
    int n_layers;      /* local layers */
    int64_t kv_dim;    /* n_kv_heads * head_dim */
    int block_size;    /* tokens per block */
    int n_blocks;
    dtype type;
    kv_layer *layers;  /* [n_layers] */
    int32_t *free_ids; /* stack of free block ids */
    int n_free;
} kv_cache;

/* Bytes one block takes over all layers (K and V). */
size_t kv_cache_block_bytes(int n_layers, int64_t kv_dim, int block_size, dtype type);
kv_cache *kv_cache_create(compute_backend *be, int n_layers, int64_t kv_dim, int block_size,
                          int n_blocks, dtype type, char *err, size_t errlen);
void kv_cache_destroy(kv_cache *c);
/* A free block id, or -1 when none is left. */
int32_t kv_cache_alloc_block(kv_cache *c);
void kv_cache_free_block(kv_cache *c, int32_t id);

#endif
