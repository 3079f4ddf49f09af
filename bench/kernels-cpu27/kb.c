/* kb (bench/kernels-cpu27, issue 25): one thread's matvec throughput on one 16-row interleaved
 * MLX g64 matrix that stays in L2 (default 512 KiB of weights), its CPU clock: how many cycles
 * the kernel itself needs per 64-byte line, apart from DRAM. Configurations alternate rep by rep.
 *   kb BITS ROWS COLS REPS CFG...   CFG = LEVEL[:DIST] (avx512|avx2|avx2vnni; DIST: prefetch bytes, default 2048)
 * Large matrices (2 MiB pages) measure one long DRAM stream instead (beyond the 480 MiB L3).
 * Build: gcc -O2 -Isrc -o kb bench/kernels-cpu27/kb.c build/release/libexo.a -lopenblas -lm -ldl -lpthread */
#define _GNU_SOURCE
#include "compute/cpu/cpu.h"
#include "compute/cpu/cpu_levels.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: kb BITS ROWS COLS REPS LEVEL[:DIST]...\n"); return 2; }
    int bits = atoi(argv[1]), reps = atoi(argv[4]), ncfg = argc - 5;
    int64_t rows = atoll(argv[2]), cols = atoll(argv[3]);
    cpu_set_threads(1);
    weight_matrix w = {.format = WEIGHT_MLX_AFFINE, .rows = rows, .cols = cols, .bits = bits, .group_size = 64, .scale_dtype = DTYPE_BF16};
    size_t q = (size_t)(rows * cols * bits / 8), s = (size_t)(rows * cols / 64) * 2;
    /* 2 MiB pages like the weights arena (model/weights.c): a VM pays a nested page walk per 4 KiB page */
    size_t huge = (size_t)2 << 20, qa = (q + huge - 1) & ~(huge - 1), sa = (s + 64 + huge - 1) & ~(huge - 1);
    uint32_t *d = aligned_alloc(huge, qa); uint16_t *sc = aligned_alloc(huge, sa), *bi = aligned_alloc(huge, sa);
    madvise(d, qa, MADV_HUGEPAGE), madvise(sc, sa, MADV_HUGEPAGE), madvise(bi, sa, MADV_HUGEPAGE);
    for (size_t i = 0; i < q / 4; i++) d[i] = rnd();
    for (size_t i = 0; i < s / 2; i++) sc[i] = 0x3c00 | (rnd() & 0x7f), bi[i] = 0xbc00 | (rnd() & 0x7f);
    w.data = d, w.scales = sc, w.biases = bi;
    if (cpu_weight_repack_rows16(&w)) { fprintf(stderr, "repack failed\n"); return 1; }
    int64_t nt = getenv("TOKENS") ? atoll(getenv("TOKENS")) : 1; /* TOKENS=n: n tokens per call */
    float *x = malloc((size_t)(nt * cols) * 4), *y = malloc((size_t)(nt * rows) * 4);
    for (int64_t i = 0; i < nt * cols; i++) x[i] = (float)(rnd() % 2001) * 0.001f - 1.0f;
    cpu_level lv[16]; int vnni[16], dist[16];
    for (int c = 0; c < ncfg; c++) {
        lv[c] = !strncmp(argv[5 + c], "avx2", 4) ? CPU_LEVEL_AVX2 : CPU_LEVEL_AVX512;
        vnni[c] = !strncmp(argv[5 + c], "avx2vnni", 8);
        const char *p = strchr(argv[5 + c], ':'); dist[c] = p ? atoi(p + 1) : 2048;
    }
    double *gbs = calloc((size_t)ncfg * reps, sizeof(double));
    const int inner = (int)(200e6 / (double)q) + 1;
    for (int r = -1; r < reps; r++)
        for (int c = 0; c < ncfg; c++) {
            cpu_avx2_set_vnni(vnni[c]); cpu_matvec_set_prefetch((size_t)dist[c]);
            double t0 = now();
            for (int i = 0; i < inner; i++) cpu_matmul_with(&w, x, y, nt, lv[c], CPU_GEMM_AUTO, -1);
            double t = now() - t0;
            if (r >= 0) gbs[c * reps + r] = (double)(q + 2 * s) * inner / t * 1e-9;
        }
    printf("%d-bit %lldx%lld (%.0f KiB), %lld token(s), 1 thread CPU clock, %d reps x %d calls (GB/s of weights)\n", bits, (long long)rows, (long long)cols, (q + 2 * s) / 1024.0, (long long)nt, reps, inner);
    for (int c = 0; c < ncfg; c++) {
        qsort(gbs + c * reps, reps, sizeof(double), cmpd);
        printf("  %-14s median %6.2f GB/s (best %6.2f)\n", argv[5 + c], gbs[c * reps + reps / 2], gbs[c * reps + reps - 1]);
    }
    return 0;
}
