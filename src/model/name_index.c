/* Name -> index hash of the file readers. See name_index.h. */
#include "model/name_index.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int name_index_init(name_index *ix, size_t n) {
    ix->cap = 16;
    while (ix->cap < n * 2) ix->cap <<= 1;
    ix->slots = malloc(ix->cap * sizeof *ix->slots);
    if (!ix->slots) return -1;
    for (size_t i = 0; i < ix->cap; i++) ix->slots[i] = -1;
    return 0;
}

void name_index_free(name_index *ix) {
    free(ix->slots);
    ix->slots = NULL;
    ix->cap = 0;
}

/* The slot holding name, or the empty slot where it would go. */
static size_t find_slot(const name_index *ix, const char *name, size_t len, name_index_name_fn name_of,
                        const void *ctx) {
    size_t mask = ix->cap - 1;
    for (size_t i = hash_bytes(name, len) & mask;; i = (i + 1) & mask) {
        if (ix->slots[i] < 0) return i;
        size_t l;
        const char *s = name_of(ctx, ix->slots[i], &l);
        if (l == len && !memcmp(s, name, len)) return i;
    }
}

int name_index_put(name_index *ix, const char *name, size_t len, int v, name_index_name_fn name_of,
                   const void *ctx) {
    size_t i = find_slot(ix, name, len, name_of, ctx);
    if (ix->slots[i] >= 0) return ix->slots[i];
    ix->slots[i] = v;
    return -1;
}

int name_index_get(const name_index *ix, const char *name, size_t len, name_index_name_fn name_of,
                   const void *ctx) {
    if (!ix->slots) return -1;
    return ix->slots[find_slot(ix, name, len, name_of, ctx)];
}
