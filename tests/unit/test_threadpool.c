/* Thread pool: every iteration runs exactly once, on a valid thread index, across many
 * back-to-back dispatches (spinning and sleeping workers), nested jobs and odd pool sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct cover_ctx {
    _Atomic int *hits;
    int n_threads;
    _Atomic int bad_thread;
} cover_ctx;

static void cover(void *p, int64_t begin, int64_t end, int thread_index) {
    cover_ctx *c = p;
    if (thread_index < 0 || thread_index >= c->n_threads || begin >= end) atomic_store(&c->bad_thread, 1);
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void check_cover(threadpool *pool, int64_t n, int dynamic, int64_t chunk) {
    cover_ctx c = {.n_threads = threadpool_size(pool)};
    c.hits = calloc((size_t)(n > 0 ? n : 1), sizeof *c.hits);
    assert_non_null(c.hits);
    if (dynamic) threadpool_parallel_for_dynamic(pool, n, chunk, cover, &c);
    else threadpool_parallel_for(pool, n, cover, &c);
    assert_int_equal(atomic_load(&c.bad_thread), 0);
    for (int64_t i = 0; i < n; i++) {
        if (atomic_load(&c.hits[i]) != 1) fail_msg("n=%lld index %lld ran %d times", (long long)n, (long long)i, atomic_load(&c.hits[i]));
    }
    free(c.hits);
}

static void test_every_index_once(void **state) {
    (void)state;
    int sizes[] = {1, 2, 3, 5, 8};
    int64_t ns[] = {0, 1, 2, 3, 7, 64, 1000, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        threadpool *pool = threadpool_create(sizes[s], -1);
        assert_non_null(pool);
        assert_int_equal(threadpool_size(pool), sizes[s]);
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
            check_cover(pool, ns[k], 0, 0);
            check_cover(pool, ns[k], 1, 1);
            check_cover(pool, ns[k], 1, 17);
        }
        threadpool_destroy(pool);
    }
}

typedef struct sum_ctx {
    _Atomic int64_t total;
    _Atomic int calls[8];
} sum_ctx;

static void add_range(void *p, int64_t begin, int64_t end, int thread_index) {
    sum_ctx *c = p;
    int64_t s = 0;
    for (int64_t i = begin; i < end; i++) s += i;
    atomic_fetch_add(&c->total, s);
    atomic_fetch_add(&c->calls[thread_index], 1);
}

/* Many tiny back-to-back jobs: with spin 0 every job goes through the futex sleep/wake path,
 * with the default spin most go through the spinning path. A lost wake-up hangs this test. */
static void stress(int n_threads, int spin_us, int jobs) {
    threadpool *pool = threadpool_create(n_threads, spin_us);
    assert_non_null(pool);
    sum_ctx c;
    memset(&c, 0, sizeof c);
    const int64_t n = 37;
    for (int j = 0; j < jobs; j++) threadpool_parallel_for(pool, n, add_range, &c);
    assert_int_equal(atomic_load(&c.total), (int64_t)jobs * (n * (n - 1) / 2));
    for (int t = 0; t < n_threads; t++) assert_int_equal(atomic_load(&c.calls[t]), jobs);
    threadpool_destroy(pool);
}

static void test_stress_spinning(void **state) {
    (void)state;
    stress(2, 300, 20000);
}

static void test_stress_sleeping(void **state) {
    (void)state;
    stress(2, 0, 3000);
    stress(3, 0, 2000);
}

typedef struct nested_ctx {
    threadpool *pool;
    _Atomic int64_t total;
} nested_ctx;

static void inner(void *p, int64_t begin, int64_t end, int thread_index) {
    (void)thread_index;
    nested_ctx *c = p;
    atomic_fetch_add(&c->total, end - begin);
}

static void outer(void *p, int64_t begin, int64_t end, int thread_index) {
    (void)thread_index;
    nested_ctx *c = p;
    for (int64_t i = begin; i < end; i++) threadpool_parallel_for(c->pool, 10, inner, c);
}

static void test_nested_job_runs_inline(void **state) {
    (void)state;
    nested_ctx c = {.pool = threadpool_create(2, -1)};
    assert_non_null(c.pool);
    threadpool_parallel_for(c.pool, 50, outer, &c);
    assert_int_equal(atomic_load(&c.total), 500);
    threadpool_destroy(c.pool);
}

static void record_threads(void *p, int i, int nth) {
    _Atomic int *seen = p;
    atomic_fetch_add(&seen[i], 1);
    atomic_fetch_add(&seen[7], nth);
}

static void test_run_limits_threads(void **state) {
    (void)state;
    threadpool *pool = threadpool_create(4, -1);
    assert_non_null(pool);
    _Atomic int seen[8] = {0};
    threadpool_run(pool, 2, record_threads, seen);
    assert_int_equal(atomic_load(&seen[0]), 1);
    assert_int_equal(atomic_load(&seen[1]), 1);
    assert_int_equal(atomic_load(&seen[2]), 0);
    assert_int_equal(atomic_load(&seen[3]), 0);
    assert_int_equal(atomic_load(&seen[7]), 4); /* both were told n = 2 */
    threadpool_destroy(pool);
    /* NULL pool: runs inline as thread 0 of 1. */
    _Atomic int seen1[8] = {0};
    threadpool_run(NULL, 0, record_threads, seen1);
    assert_int_equal(atomic_load(&seen1[0]), 1);
    assert_int_equal(atomic_load(&seen1[7]), 1);
}

typedef struct handoff_ctx {
    _Atomic int started[4];
    pthread_t ran_on[4];
} handoff_ctx;

/* Share 0 (always the caller) waits until every other share has started, so the job cannot be
 * closed before the workers claim their shares: they must run on their own threads. */
static void wait_for_others(void *p, int i, int n) {
    handoff_ctx *c = p;
    c->ran_on[i] = pthread_self();
    atomic_store(&c->started[i], 1);
    if (i != 0) return;
    for (int k = 1; k < n; k++)
        while (!atomic_load(&c->started[k])) sched_yield();
}

static void test_workers_run_their_shares(void **state) {
    (void)state;
    int spins[] = {0, 300}; /* sleeping workers (futex wake) and spinning workers */
    for (int s = 0; s < 2; s++) {
        threadpool *pool = threadpool_create(3, spins[s]);
        assert_non_null(pool);
        for (int rep = 0; rep < 50; rep++) {
            handoff_ctx c;
            memset(&c, 0, sizeof c);
            threadpool_run(pool, 0, wait_for_others, &c);
            assert_true(pthread_equal(c.ran_on[0], pthread_self()));
            assert_false(pthread_equal(c.ran_on[1], pthread_self()));
            assert_false(pthread_equal(c.ran_on[2], pthread_self()));
            assert_false(pthread_equal(c.ran_on[1], c.ran_on[2]));
        }
        threadpool_destroy(pool);
    }
}

typedef struct slow_ctx {
    _Atomic int hits[64];
} slow_ctx;

static void slow_share(void *p, int i, int n) {
    (void)n;
    slow_ctx *c = p;
    atomic_fetch_add(&c->hits[i], 1);
}

/* A worker that never gets to its share (asleep, descheduled) does not hold the job up: the
 * caller runs the share itself. With 16 workers on a 2-core machine most arrive late. */
static void test_late_workers_shares_done_by_caller(void **state) {
    (void)state;
    threadpool *pool = threadpool_create(16, 0);
    assert_non_null(pool);
    for (int rep = 0; rep < 500; rep++) {
        slow_ctx c;
        memset(&c, 0, sizeof c);
        threadpool_run(pool, 0, slow_share, &c);
        for (int i = 0; i < 16; i++) assert_int_equal(atomic_load(&c.hits[i]), 1);
    }
    threadpool_destroy(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_index_once),
        cmocka_unit_test(test_stress_spinning),
        cmocka_unit_test(test_stress_sleeping),
        cmocka_unit_test(test_nested_job_runs_inline),
        cmocka_unit_test(test_run_limits_threads),
        cmocka_unit_test(test_workers_run_their_shares),
        cmocka_unit_test(test_late_workers_shares_done_by_caller),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
