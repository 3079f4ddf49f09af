/* threadpool — see threadpool.h. Dispatch protocol:
 *
 *   caller: write the job fields; claim = bits of the workers that do not take part (as if
 *           taken); generation++ (seq_cst); wake sleepers if any; run its own share as thread 0;
 *           then close the job (claim |= CLOSED) and run, itself, the share of every worker that
 *           had not claimed it by then; finally wait (spin, then futex) until the workers that
 *           did claim have finished.
 *   worker: wait (spin, then futex) for generation to change; claim its bit with a CAS unless
 *           the job is closed or the bit is taken; run its share; finished++ and wake the caller
 *           if it sleeps.
 *
 * A worker reads the job fields only after winning its claim, and the caller writes the next
 * job only after every claimed share finished, so no worker ever sees another job's fields.
 * Because the caller takes over unclaimed shares, a worker that is asleep or descheduled (a
 * shared machine) costs nothing: the job never waits for a thread that has not started it.
 * Sleep/wake use the Dekker pattern on seq_cst atomics (announce "sleeping", then re-check the
 * word; the other side stores the word, then checks "sleeping"), and the futex re-checks the
 * word in the kernel, so a wake-up cannot be lost. */
#include "base/threadpool.h"

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
    _Atomic uint64_t claim;      /* CLAIM_CLOSED | bit i: worker i took (or may not take) it */
    _Atomic uint32_t finished;   /* futex word the caller waits on: claimed shares done */
    _Atomic int sleepers;        /* workers asleep (or about to sleep) on generation */
    _Atomic int caller_sleeping;
    _Atomic int stop;
};

#define CLAIM_CLOSED (1ull << 63)
#define THREADPOOL_MAX_THREADS 63 /* worker bits 1..62 of claim */

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
        uint64_t bit = 1ull << index, c = atomic_load(&pool->claim);
        int won = 0;
        while (!(c & (CLAIM_CLOSED | bit)))
            if (atomic_compare_exchange_weak(&pool->claim, &c, c | bit)) {
                won = 1;
                break;
            }
        if (!won) continue; /* closed before we came, or not our job */
        pool->fn(pool->ctx, index, pool->job_threads);
        atomic_fetch_add(&pool->finished, 1);
        if (atomic_load(&pool->caller_sleeping)) futex_wake(&pool->finished);
    }
}

threadpool *threadpool_create(int n_threads, int spin_us) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > THREADPOOL_MAX_THREADS) n_threads = THREADPOOL_MAX_THREADS;
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
    uint64_t absent = 0; /* workers n .. n_threads-1 sit this job out */
    for (int i = n; i < pool->n_threads; i++) absent |= 1ull << i;
    atomic_store(&pool->finished, 0);
    atomic_store(&pool->claim, absent);
    atomic_fetch_add(&pool->generation, 1);
    if (atomic_load(&pool->sleepers) > 0) futex_wake(&pool->generation);

    fn(ctx, 0, n);

    uint64_t claimed = atomic_fetch_or(&pool->claim, CLAIM_CLOSED) & ~absent;
    uint32_t target = 0;
    for (int i = 1; i < n; i++) {
        if (claimed & (1ull << i)) target++;
        else fn(ctx, i, n); /* nobody came for share i: do it here */
    }
    uint32_t seen = atomic_load(&pool->finished);
    if (seen != target) {
        uint64_t start = now_ns();
        for (unsigned k = 1; (seen = atomic_load_explicit(&pool->finished, memory_order_acquire)) != target; k++) {
            cpu_relax();
            if ((k & 63) == 0 && now_ns() - start > pool->spin_ns) break;
        }
        if (seen != target) {
            atomic_store(&pool->caller_sleeping, 1);
            while ((seen = atomic_load(&pool->finished)) != target) futex_wait(&pool->finished, seen);
            atomic_store(&pool->caller_sleeping, 0);
        }
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
