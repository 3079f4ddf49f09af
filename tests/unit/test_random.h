/* Deterministic random inputs shared by the kernel tests (test_cpu_matmul, test_cpu_amx): a
 * xorshift64 generator (seed: define TEST_RNG_SEED before including this header to give a test
 * its own sequence) and activations with the outliers real ones have. */
#ifndef EXO_TEST_RANDOM_H
#define EXO_TEST_RANDOM_H

#include <stdint.h>
#include <stdlib.h>

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#endif

static uint64_t rng_state = TEST_RNG_SEED;

static __attribute__((unused)) uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* Uniform in [lo, hi), 24 bits of resolution. */
static __attribute__((unused)) float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)(rng_u32() & 0xffffff) / (float)0x1000000;
}

/* n rows of cols activations in [-2, 2), one 20x outlier per row: stresses per-group activation
 * scaling as real activations do. Freed by the caller. */
static __attribute__((unused)) float *random_x(int64_t n, int64_t cols) {
    float *x = malloc((size_t)(n * cols) * sizeof *x);
    for (int64_t i = 0; i < n * cols; i++) x[i] = rng_uniform(-2, 2);
    for (int64_t t = 0; t < n; t++) x[t * cols + (rng_u32() % cols)] *= 20.0f;
    return x;
}

#endif
