/* kv_cache — the paged KV cache: a pool of fixed-size blocks per layer in backend memory, with
 * reference counts and automatic prefix caching (vLLM-style).
 *
 * Sequences own lists of block ids (their block tables). A block that holds a full block of
 * tokens can be registered under the hash chain of its contents (hash of the previous block's
 * hash and its own token ids); a later sequence whose prompt starts with the same tokens finds
 * those blocks and shares them instead of recomputing. A released block whose count drops to 0
 * stays cached (in LRU order) until a new allocation needs it; unregistered ones go straight
 * back to the free list. Lookups compare the stored token ids, so a hash collision can never
 * share wrong data. Refuses: growing after creation (the budget is fixed at open). */
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
    int32_t *free_ids; /* stack of free (unregistered, unused) block ids */
    int n_free;
    /* per block */
    int32_t *refcount;
    uint64_t *hash;        /* 0 = not registered */
    uint64_t *parent;      /* hash of the previous block in the chain (0 for the first) */
    int32_t *tokens;       /* [n_blocks][block_size] contents of registered blocks */
    int32_t *lru_prev, *lru_next; /* registered blocks with refcount 0, oldest at lru_head */
    int32_t lru_head, lru_tail;
    int n_cached;          /* blocks in the LRU list */
    int32_t *table;        /* hash -> block, open addressing, -1 empty */
    size_t table_mask;
    uint64_t evictions;
} kv_cache;

/* Bytes one block takes over all layers (K and V). */
size_t kv_cache_block_bytes(int n_layers, int64_t kv_dim, int block_size, dtype type);
kv_cache *kv_cache_create(compute_backend *be, int n_layers, int64_t kv_dim, int block_size,
                          int n_blocks, dtype type, char *err, size_t errlen);
void kv_cache_destroy(kv_cache *c);
/* A block with refcount 1: a free one, else the least recently used cached one (evicted).
 * -1 when every block is in use. */
int32_t kv_cache_alloc_block(kv_cache *c);
/* Drops one reference; at 0 the block is cached (registered) or freed. */
void kv_cache_release_block(kv_cache *c, int32_t id);
/* Blocks an allocation could get now (free + cached). */
int kv_cache_available(const kv_cache *c);

/* The chain hash of a full block of tokens following a block with hash `parent` (0: first). */
uint64_t kv_cache_chain_hash(uint64_t parent, const int32_t *tokens, int n);
/* The registered block holding exactly these tokens after `parent`, with a reference taken
 * (kv_cache_release_block it later), or -1. */
int32_t kv_cache_lookup(kv_cache *c, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Registers a full, in-use block under `hash`. No-op if that content is already registered. */
void kv_cache_register(kv_cache *c, int32_t id, uint64_t hash, uint64_t parent,
                       const int32_t *tokens);

#endif
