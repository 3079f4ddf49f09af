/* threadpool — see threadpool.h. Dispatch protocol:
 *
 *   caller: write job fields; remaining = workers; generation++ (seq_cst); wake sleepers if any;
 *           run its own share as thread 0; wait (spin, then futex) until `done` == generation.
 *   worker: wait (spin, then futex) until generation != the last one it served; run its share;
 *           remaining--; the last worker to finish publishes done = generation and wakes the
 *           caller if it sleeps.
 *
 * The caller writes the next job only after every worker acknowledged the previous one, so a
 * worker never sees job fields of a generation other than the one it woke for. Sleep/wake use
 * the Dekker pattern on seq_cst atomics (announce "sleeping", then re-check the word; the other
 * side stores the word, then checks "sleeping"), and the futex re-checks the word in the kernel,
 * so a wake-up cannot be lost. */
#include "base/threadpool.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

struct threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t dispatch_lock;
    uint64_t spin_ns;

    /* The current job (written by the caller before generation++). */
    threadpool_run_fn fn;
    void *ctx;
    int job_threads;

    _Atomic uint32_t generation; /* futex word the workers wait on */
    _Atomic uint32_t done;       /* futex word the caller waits on: last finished generation */
    _Atomic int remaining;       /* workers that have not acknowledged the current generation */
    _Atomic int sleepers;        /* workers asleep (or about to sleep) on generation */
    _Atomic int caller_sleeping;
    _Atomic int stop;
};

typedef struct worker_arg {
    threadpool *pool;
    int index;
} worker_arg;

static _Thread_local threadpool *tls_current_pool;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
#else
    (void)word;
    (void)expected;
    sched_yield();
#endif
}

static void futex_wake(_Atomic uint32_t *word) {
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}

/* Spins until *word != value or spin_ns elapse; returns the last value read. */
static uint32_t spin_while_equal(_Atomic uint32_t *word, uint32_t value, uint64_t spin_ns) {
    uint32_t v = atomic_load_explicit(word, memory_order_acquire);
    if (v != value || spin_ns == 0) return v;
    uint64_t start = now_ns();
    for (unsigned i = 1;; i++) {
        cpu_relax();
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v != value) return v;
        if ((i & 63) == 0 && now_ns() - start > spin_ns) return v;
    }
}

static void *worker_main(void *p) {
    worker_arg *arg = p;
    threadpool *pool = arg->pool;
    int index = arg->index;
    free(arg);
    tls_current_pool = pool;
    uint32_t last = 0;
    for (;;) {
        uint32_t gen = spin_while_equal(&pool->generation, last, pool->spin_ns);
        if (gen == last) {
            atomic_fetch_add(&pool->sleepers, 1);
            while ((gen = atomic_load(&pool->generation)) == last) futex_wait(&pool->generation, last);
            atomic_fetch_sub(&pool->sleepers, 1);
        }
        last = gen;
        if (atomic_load_explicit(&pool->stop, memory_order_acquire)) return NULL;
        if (index < pool->job_threads) pool->fn(pool->ctx, index, pool->job_threads);
        if (atomic_fetch_sub_explicit(&pool->remaining, 1, memory_order_acq_rel) == 1) {
            atomic_store(&pool->done, gen);
            if (atomic_load(&pool->caller_sleeping)) futex_wake(&pool->done);
        }
    }
}

threadpool *threadpool_create(int n_threads, int spin_us) {
    if (n_threads < 1) n_threads = 1;
    if (spin_us < 0) {
        const char *env = getenv("EXO_THREADPOOL_SPIN_US");
        spin_us = env ? atoi(env) : 300;
        if (spin_us < 0) spin_us = 0;
    }
    threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    pool->spin_ns = (uint64_t)spin_us * 1000u;
    pthread_mutex_init(&pool->dispatch_lock, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    if (!pool->threads) {
        free(pool);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (!arg || pthread_create(&pool->threads[i], NULL, worker_main,
                                   (*arg = (worker_arg){pool, i}, arg)) != 0) {
            free(arg);
            pool->n_threads = i; /* join the ones that started */
            threadpool_destroy(pool);
            return NULL;
        }
    }
    return pool;
}

void threadpool_destroy(threadpool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, 1);
    atomic_fetch_add(&pool->generation, 1);
    futex_wake(&pool->generation);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->dispatch_lock);
    free(pool->threads);
    free(pool);
}

int threadpool_size(const threadpool *pool) {
    return pool ? pool->n_threads : 1;
}

void threadpool_run(threadpool *pool, int n_threads_max, threadpool_run_fn fn, void *ctx) {
    int n = threadpool_size(pool);
    if (n_threads_max > 0 && n_threads_max < n) n = n_threads_max;
    if (n <= 1 || tls_current_pool == pool) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->dispatch_lock);
    tls_current_pool = pool;
    pool->fn = fn;
    pool->ctx = ctx;
    pool->job_threads = n;
    atomic_store(&pool->remaining, pool->n_threads - 1);
    uint32_t gen = atomic_fetch_add(&pool->generation, 1) + 1;
    if (atomic_load(&pool->sleepers) > 0) futex_wake(&pool->generation);

    fn(ctx, 0, n);

    uint32_t seen = spin_while_equal(&pool->done, gen - 1, pool->spin_ns);
    if (seen != gen) {
        atomic_store(&pool->caller_sleeping, 1);
        while ((seen = atomic_load(&pool->done)) != gen) futex_wait(&pool->done, seen);
        atomic_store(&pool->caller_sleeping, 0);
    }
    tls_current_pool = NULL;
    pthread_mutex_unlock(&pool->dispatch_lock);
}

typedef struct range_job {
    threadpool_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    _Atomic int64_t next;
} range_job;

static void static_range(void *p, int i, int nth) {
    range_job *job = p;
    int64_t begin = job->n * i / nth, end = job->n * (i + 1) / nth;
    if (end > begin) job->fn(job->ctx, begin, end, i);
}

void threadpool_parallel_for(threadpool *pool, int64_t n, threadpool_range_fn fn, void *ctx) {
    if (n <= 0) return;
    range_job job = {.fn = fn, .ctx = ctx, .n = n};
    int nth = threadpool_size(pool);
    threadpool_run(pool, n < nth ? (int)n : nth, static_range, &job);
}

static void dynamic_range(void *p, int i, int nth) {
    (void)nth;
    range_job *job = p;
    for (;;) {
        int64_t begin = atomic_fetch_add_explicit(&job->next, job->chunk, memory_order_relaxed);
        if (begin >= job->n) return;
        int64_t end = begin + job->chunk < job->n ? begin + job->chunk : job->n;
        job->fn(job->ctx, begin, end, i);
    }
}

void threadpool_parallel_for_dynamic(threadpool *pool, int64_t n, int64_t chunk,
                                     threadpool_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    range_job job = {.fn = fn, .ctx = ctx, .n = n, .chunk = chunk};
    atomic_init(&job.next, 0);
    int64_t chunks = (n + chunk - 1) / chunk;
    int nth = threadpool_size(pool);
    threadpool_run(pool, chunks < nth ? (int)chunks : nth, dynamic_range, &job);
}
