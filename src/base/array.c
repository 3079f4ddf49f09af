/* array — see array.h. */
#include "base/array.h"

#include <stdlib.h>

void *array_grow(void *v, size_t *cap, size_t first, size_t elem) {
    size_t want = *cap ? *cap * 2 : first;
    void *p = realloc(v, want * elem);
    if (p) *cap = want;
    return p;
}
