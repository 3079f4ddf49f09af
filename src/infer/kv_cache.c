/* Paged KV cache block pool with reference counts and a prefix cache. See kv_cache.h. */
#include "infer/kv_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t kv_cache_block_bytes(int n_layers, int64_t kv_dim, int block_size, dtype type) {
    return (size_t)n_layers * 2 * (size_t)kv_dim * (size_t)block_size * dtype_size(type);
}

kv_cache *kv_cache_create(compute_backend *be, int n_layers, int64_t kv_dim, int block_size,
                          int n_blocks, dtype type, char *err, size_t errlen) {
    kv_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = (kv_cache){.be = be, .n_layers = n_layers, .kv_dim = kv_dim, .block_size = block_size,
                    .n_blocks = n_blocks, .type = type, .lru_head = -1, .lru_tail = -1};
    size_t nb = (size_t)n_blocks, cap = 16;
    while (cap < nb * 2) cap <<= 1;
    c->table_mask = cap - 1;
    c->layers = calloc((size_t)n_layers, sizeof *c->layers);
    c->free_ids = malloc(nb * sizeof *c->free_ids);
    c->refcount = calloc(nb, sizeof *c->refcount);
    c->hash = calloc(nb, sizeof *c->hash);
    c->parent = calloc(nb, sizeof *c->parent);
    c->tokens = malloc(nb * (size_t)block_size * sizeof *c->tokens);
    c->lru_prev = malloc(nb * sizeof *c->lru_prev);
    c->lru_next = malloc(nb * sizeof *c->lru_next);
    c->table = malloc(cap * sizeof *c->table);
    size_t bytes = nb * (size_t)block_size * (size_t)kv_dim * dtype_size(type);
    int fail = !c->layers || !c->free_ids || !c->refcount || !c->hash || !c->parent ||
               !c->tokens || !c->lru_prev || !c->lru_next || !c->table;
    for (int l = 0; !fail && l < n_layers; l++) {
        c->layers[l].type = type;
        c->layers[l].k = be->alloc(be, bytes);
        c->layers[l].v = be->alloc(be, bytes);
        fail = !c->layers[l].k || !c->layers[l].v;
    }
    if (fail) {
        snprintf(err, errlen, "out of memory for a KV cache of %d blocks (%zu MiB)", n_blocks,
                 kv_cache_block_bytes(n_layers, kv_dim, block_size, type) * nb >> 20);
        kv_cache_destroy(c);
        return NULL;
    }
    memset(c->table, 0xff, cap * sizeof *c->table);
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
    free(c->refcount);
    free(c->hash);
    free(c->parent);
    free(c->tokens);
    free(c->lru_prev);
    free(c->lru_next);
    free(c->table);
    free(c);
}

static void lru_unlink(kv_cache *c, int32_t id) {
    int32_t p = c->lru_prev[id], n = c->lru_next[id];
    if (p >= 0) c->lru_next[p] = n;
    else c->lru_head = n;
    if (n >= 0) c->lru_prev[n] = p;
    else c->lru_tail = p;
    c->n_cached--;
}

static void lru_push(kv_cache *c, int32_t id) {
    c->lru_prev[id] = c->lru_tail;
    c->lru_next[id] = -1;
    if (c->lru_tail >= 0) c->lru_next[c->lru_tail] = id;
    else c->lru_head = id;
    c->lru_tail = id;
    c->n_cached++;
}

/* Removes id from the hash table (backward-shift deletion keeps probe chains intact). */
static void table_remove(kv_cache *c, int32_t id) {
    size_t mask = c->table_mask, i = c->hash[id] & mask;
    while (c->table[i] != id) {
        if (c->table[i] < 0) return;
        i = (i + 1) & mask;
    }
    for (size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
        int32_t b = c->table[j];
        if (b < 0) break;
        size_t home = c->hash[b] & mask;
        /* b may move into the hole at i if its home is not in (i, j] cyclically */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            c->table[i] = b;
            i = j;
        }
    }
    c->table[i] = -1;
    c->hash[id] = 0;
}

int32_t kv_cache_alloc_block(kv_cache *c) {
    int32_t id;
    if (c->n_free) {
        id = c->free_ids[--c->n_free];
    } else if (c->lru_head >= 0) {
        id = c->lru_head;
        lru_unlink(c, id);
        table_remove(c, id);
        c->evictions++;
    } else {
        return -1;
    }
    c->refcount[id] = 1;
    return id;
}

void kv_cache_release_block(kv_cache *c, int32_t id) {
    if (id < 0 || id >= c->n_blocks || c->refcount[id] <= 0) return;
    if (--c->refcount[id]) return;
    if (c->hash[id]) lru_push(c, id);
    else c->free_ids[c->n_free++] = id;
}

int kv_cache_available(const kv_cache *c) {
    return c->n_free + c->n_cached;
}

uint64_t kv_cache_chain_hash(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    h ^= h >> 32;
    return h ? h : 1;
}

int32_t kv_cache_lookup(kv_cache *c, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    size_t bs = (size_t)c->block_size;
    for (size_t i = hash & c->table_mask;; i = (i + 1) & c->table_mask) {
        int32_t b = c->table[i];
        if (b < 0) return -1;
        if (c->hash[b] == hash && c->parent[b] == parent &&
            !memcmp(c->tokens + (size_t)b * bs, tokens, bs * sizeof *tokens)) {
            if (c->refcount[b]++ == 0) lru_unlink(c, b);
            return b;
        }
    }
}

void kv_cache_register(kv_cache *c, int32_t id, uint64_t hash, uint64_t parent,
                       const int32_t *tokens) {
    if (id < 0 || id >= c->n_blocks || c->hash[id]) return;
    size_t bs = (size_t)c->block_size;
    size_t i = hash & c->table_mask;
    for (;; i = (i + 1) & c->table_mask) {
        int32_t b = c->table[i];
        if (b < 0) break;
        if (c->hash[b] == hash && c->parent[b] == parent &&
            !memcmp(c->tokens + (size_t)b * bs, tokens, bs * sizeof *tokens))
            return; /* same content already cached in another block */
    }
    c->table[i] = id;
    c->hash[id] = hash;
    c->parent[id] = parent;
    memcpy(c->tokens + (size_t)id * bs, tokens, bs * sizeof *tokens);
}
