/* dist_internal — what src/dist/ shares inside itself and with nothing else: the benchmark's
 * view of a bare Gloo ring on a group's own pairs (so the wrapper's overhead is measured
 * against Gloo on the same connections, in the same run). */
#ifndef EXO_DIST_INTERNAL_H
#define EXO_DIST_INTERNAL_H

#include "dist/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds one gloo::AllreduceRing over buf[n] on g's context (every rank in the same order),
 * runs it `iterations` times and stores the elapsed seconds of the runs (not of the build). */
int dist_bench_bare_ring(dist_group *g, float *buf, size_t n, int iterations, double *seconds,
                         char *err, size_t errlen);

/* The algorithm dist_allreduce_sum uses for n floats on g ("ring", "hd" or "none"). */
const char *dist_allreduce_algorithm(const dist_group *g, size_t n);

#ifdef __cplusplus
}
#endif
#endif
