/* A sample op for the CPU backend in tests: the engine then samples "on the backend" as it does
 * with the CUDA backend (only ids come back), so tests here can check which rows it may send
 * there. Greedy argmax over the unbanned ids, counted in backend_samples. */
#ifndef EXO_TESTS_BACKEND_SAMPLE_H
#define EXO_TESTS_BACKEND_SAMPLE_H

#include "compute/backend.h"

#include <math.h>

static int backend_samples;
static int argmax_sample(compute_backend *b, float *logits, int64_t n_rows, int64_t vocab,
                         const sample_params *params, sample_result *out) {
    (void)b;
    for (int64_t r = 0; r < n_rows; r++) {
        float *l = logits + r * vocab;
        for (int i = 0; i < params[r].n_banned; i++) l[params[r].banned[i]] = -INFINITY;
        int32_t best = 0;
        for (int64_t i = 1; i < vocab; i++)
            if (l[i] > l[best]) best = (int32_t)i;
        out[r] = (sample_result){.token = best};
    }
    backend_samples++;
    return 0;
}

#endif
