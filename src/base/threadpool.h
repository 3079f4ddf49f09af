/* threadpool — a persistent pool of worker threads for data-parallel loops inside one op.
 *
 * Decode at batch 1 calls into the pool about ten times per layer, so a dispatch must cost a few
 * microseconds, not the tens of microseconds of creating threads or waking them through a mutex
 * and condvar each time. Workers therefore spin (with a pause instruction) for a short while after
 * each job, waiting for the next one, and only then sleep on a futex; the caller takes part in
 * every job as thread 0, so a pool of n threads starts n - 1 workers.
 *
 * One job runs at a time per pool (a mutex serializes callers from different threads). A job
 * started from inside a job on the same pool runs inline on the calling thread (no deadlock, no
 * extra parallelism).
 *
 * This module refuses: task graphs, futures, work stealing between jobs, priorities. A job is
 * "call fn on every thread and wait until all return". */
#ifndef EXO_BASE_THREADPOOL_H
#define EXO_BASE_THREADPOOL_H

#include <stdint.h>

typedef struct threadpool threadpool;

/* Called once on each of the pool's threads: thread_index in [0, n_threads). */
typedef void (*threadpool_run_fn)(void *ctx, int thread_index, int n_threads);
/* Called with a half-open range [begin, end) of the loop (never empty). */
typedef void (*threadpool_range_fn)(void *ctx, int64_t begin, int64_t end, int thread_index);

/* Creates a pool of n_threads threads including the caller (n_threads >= 1; 1 = no workers, every
 * job runs inline). Returns NULL if threads cannot be created. spin_us: how long an idle worker
 * spins before sleeping; < 0 = default (EXO_THREADPOOL_SPIN_US or 300 us). */
threadpool *threadpool_create(int n_threads, int spin_us);
/* Stops and joins the workers and frees the pool. NULL is allowed. */
void threadpool_destroy(threadpool *pool);
int threadpool_size(const threadpool *pool);

/* Runs fn(ctx, i, n) on every thread i of the pool (the caller is i = 0) and returns when all
 * have returned. n_threads_max limits how many threads take part (<= 0: all). pool may be NULL
 * (runs fn(ctx, 0, 1) inline). */
void threadpool_run(threadpool *pool, int n_threads_max, threadpool_run_fn fn, void *ctx);

/* Splits [0, n) into one contiguous range per thread, sizes equal within one element, and calls
 * fn on each non-empty range. For loops whose iterations cost the same (matrix rows). */
void threadpool_parallel_for(threadpool *pool, int64_t n, threadpool_range_fn fn, void *ctx);

/* Hands out [0, n) in chunks of `chunk` iterations, first come first served, so threads that
 * finish early take more. For loops whose iterations cost different amounts (attention over
 * sequences of different lengths). */
void threadpool_parallel_for_dynamic(threadpool *pool, int64_t n, int64_t chunk,
                                     threadpool_range_fn fn, void *ctx);

#endif
