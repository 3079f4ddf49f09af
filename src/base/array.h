/* array — growing a caller-owned array by doubling: the one realloc step that vectors of
 * tokens, pieces, ranges and heap entries all need. It owns nothing and refuses to abort: a
 * failed allocation leaves the array as it was and says so. */
#ifndef EXO_BASE_ARRAY_H
#define EXO_BASE_ARRAY_H

#include <stddef.h>

/* The slow path: doubles *cap (first when 0) with realloc. NULL when memory is short. */
void *array_grow(void *v, size_t *cap, size_t first, size_t elem);

/* Makes room for one more element in the array v of n elements (elem bytes each) and capacity
 * *cap, doubling it (from first when empty). Returns the array's memory (v itself when there
 * was room), or NULL when memory is short (v and *cap unchanged). */
static inline void *array_reserve_one(void *v, size_t n, size_t *cap, size_t first, size_t elem) {
    return n < *cap ? v : array_grow(v, cap, first, elem); /* the common case stays inline */
}

#endif
