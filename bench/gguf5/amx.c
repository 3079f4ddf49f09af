/* amx (bench/gguf5, issue 24): per-core GFLOP/s of the AMX prefill (compute/cpu/matmul_amx.c) on
 * one repacked GGUF-like matrix (16-row interleave, g32, f16 scales), 2 and 3 tile products per
 * block and step alternated rep by rep in one process (cpu_amx_set_products), and the VNNI passes
 * (EXO_AMX=0's path) once. Thread CPU time of 1 thread (a shared VM: what other processes take
 * does not count), best of REPS; also the error of each against cpu_matmul_reference, as the
 * largest |y - ref| / (max|x| * sum|w|) (test_cpu_amx's measure).
 *   amx ROWS COLS BITS TOKENS REPS [KIND]   KIND zp (GGUF Q4_0/Q8_0: zero point) or bias (Q4_K/Q6_K)
 * Build: gcc -O2 -Isrc -o /tmp/amx bench/gguf5/amx.c build/release/libexo.a -lopenblas -lm -ldl -lpthread */
#define _GNU_SOURCE
#include "compute/cpu/cpu.h"
#include "compute/cpu/matmul_amx.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static float unif(float a, float b) { return a + (b - a) * (float)(rnd() >> 8) / 16777216.0f; }

static double err(const weight_matrix *w, const float *x, const float *y, const float *ref, int64_t n) {
    float *row = malloc((size_t)w->cols * sizeof *row);
    double worst = 0;
    for (int64_t r = 0; r < w->rows; r += 7) {
        weight_matrix_row_to_f32(w, r, row);
        double ws = 0;
        for (int64_t c = 0; c < w->cols; c++) ws += fabs(row[c]);
        for (int64_t t = 0; t < n; t++) {
            double xm = 0;
            for (int64_t c = 0; c < w->cols; c++) xm = fmax(xm, fabs(x[t * w->cols + c]));
            double e = fabs((double)y[t * w->rows + r] - ref[t * w->rows + r]) / (xm * ws);
            if (!(e <= worst)) worst = e;
        }
    }
    free(row);
    return worst;
}

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: amx ROWS COLS BITS TOKENS REPS [zp|bias]\n"); return 2; }
    int64_t rows = atoll(argv[1]), cols = atoll(argv[2]), n = atoll(argv[4]);
    int bits = atoi(argv[3]), reps = atoi(argv[5]), zp = argc > 6 && !strcmp(argv[6], "zp");
    cpu_set_threads(1);
    weight_matrix w = {.format = WEIGHT_MLX_AFFINE, .rows = rows, .cols = cols, .bits = bits, .group_size = 32,
                       .scale_dtype = DTYPE_F16, .zero_point = zp ? (bits == 4 ? 8 : 128) : 0};
    size_t words = (size_t)(rows * cols * bits / 32), groups = (size_t)(rows * cols / 32);
    uint32_t *q = malloc(words * 4);
    uint16_t *s = malloc(groups * 2), *b = malloc(groups * 2);
    for (size_t i = 0; i < words; i++) q[i] = rnd();
    for (size_t g = 0; g < groups; g++) {
        float sc = f16_to_f32(f32_to_f16(unif(0.001f, 0.03f)));
        s[g] = f32_to_f16(sc);
        b[g] = f32_to_f16(zp ? -(float)w.zero_point * sc : unif(-0.2f, 0.2f));
    }
    w.data = q, w.scales = s, w.biases = b;
    if (cpu_weight_repack_rows16(&w)) { fprintf(stderr, "repack failed\n"); return 1; }
    float *x = malloc((size_t)(n * cols) * 4), *y = malloc((size_t)(n * rows) * 4), *ref = malloc((size_t)(n * rows) * 4);
    for (int64_t i = 0; i < n * cols; i++) x[i] = unif(-1, 1) * (rnd() % 16 == 0 ? 8 : 1);
    cpu_matmul_reference(&w, x, ref, n);
    enum { K = 3 };
    double flop = 2.0 * rows * cols * n, best[K] = {1e9, 1e9, 1e9}, e[K] = {0};
    const char *name[K] = {"2 products", "3 products", "VNNI passes"};
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < K; k++) {
            if (k == K - 1 && r > 0 && r < reps - 1) continue; /* the passes: first and last rep */
            cpu_amx_set_enabled(k < K - 1);
            cpu_amx_set_products(k == 0 ? 2 : 3);
            double t0 = now();
            cpu_matmul(&w, x, y, n);
            double t = now() - t0;
            if (t < best[k]) best[k] = t;
            if (r == 0) e[k] = err(&w, x, y, ref, n);
        }
    cpu_amx_set_enabled(-1);
    printf("%lldx%lld %d-bit %s, %lld tokens (AMX %s):", (long long)rows, (long long)cols, bits, zp ? "zp" : "bias",
           (long long)n, cpu_amx_status());
    for (int k = 0; k < K; k++) printf("  %s %.0f GFLOP/s (err %.2g A)", name[k], flop / best[k] * 1e-9, e[k]);
    printf("\n");
    return 0;
}
