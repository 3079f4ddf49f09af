/* kv_cache: reference counts, the prefix-cache hash table (registration, lookup by content,
 * LRU eviction with backward-shift deletion) under a randomized workload checked against a
 * plain model of what must be findable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "infer/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#define NB 32
#define BS 4

static void test_refcount_and_lru(void **s) {
    (void)s;
    compute_backend *be = compute_backend_cpu(1);
    char err[128];
    kv_cache *c = kv_cache_create(be, 1, 8, BS, 4, DTYPE_F16, err, sizeof err);
    assert_non_null(c);
    int32_t tok[BS] = {1, 2, 3, 4};
    int32_t a = kv_cache_alloc_block(c);
    uint64_t h = kv_cache_chain_hash(0, tok, BS);
    kv_cache_register(c, a, h, 0, tok);
    assert_int_equal(kv_cache_lookup(c, h, 0, tok), a); /* now 2 references */
    int32_t other[BS] = {1, 2, 3, 5};
    assert_int_equal(kv_cache_lookup(c, kv_cache_chain_hash(0, other, BS), 0, other), -1);
    assert_int_equal(kv_cache_lookup(c, h, 7, tok), -1); /* same tokens, other parent */
    kv_cache_release_block(c, a);
    kv_cache_release_block(c, a);
    assert_int_equal(c->n_cached, 1);
    assert_int_equal(kv_cache_available(c), 4);
    /* the three free blocks go first, then the cached one is evicted */
    for (int i = 0; i < 3; i++) assert_true(kv_cache_alloc_block(c) != a);
    assert_int_equal(kv_cache_alloc_block(c), a);
    assert_int_equal(kv_cache_alloc_block(c), -1);
    assert_int_equal(kv_cache_lookup(c, h, 0, tok), -1);
    kv_cache_destroy(c);
    be->destroy(be);
}

static void test_randomized_table(void **s) {
    (void)s;
    compute_backend *be = compute_backend_cpu(1);
    char err[128];
    kv_cache *c = kv_cache_create(be, 1, 8, BS, NB, DTYPE_F16, err, sizeof err);
    /* content k = tokens {k, k, k, k}; model: which block holds content k (or -1) */
    int holder[200];
    for (int k = 0; k < 200; k++) holder[k] = -1;
    int content_of[NB];
    for (int i = 0; i < NB; i++) content_of[i] = -1;
    uint64_t r = 99;
    for (int step = 0; step < 20000; step++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((r >> 33) % 200);
        int32_t tok[BS] = {k, k, k, k};
        /* force collisions in the table: a few distinct hash values only */
        uint64_t h = (uint64_t)(k % 7) + 1;
        int32_t b = kv_cache_lookup(c, h, 0, tok);
        assert_int_equal(b, holder[k]);
        if (b < 0) {
            b = kv_cache_alloc_block(c);
            assert_true(b >= 0); /* every block is released below: never all in use */
            if (content_of[b] >= 0) holder[content_of[b]] = -1; /* evicted */
            kv_cache_register(c, b, h, 0, tok);
            content_of[b] = k;
            holder[k] = b;
        }
        kv_cache_release_block(c, b);
    }
    assert_int_equal(kv_cache_available(c), NB);
    kv_cache_destroy(c);
    be->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refcount_and_lru),
        cmocka_unit_test(test_randomized_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
