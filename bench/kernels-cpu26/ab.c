/* ab (bench/kernels-cpu26, issue 25; cpu27 added: the configurations' order rotated round by
 * round (the first one after the idle wait ran slower), LOCK=file (the shared bench lock, held per
 * WATCH round), FILL=byte (every weight, scale and bias byte that value: layout experiments that
 * read scales from elsewhere stay on normal floats)): a synthetic batch-1 decode step of the Llama-3.2-1B shape
 * (16 layers: q/k/v and gate/up as one job each, o, down; the tied 128256-row lm_head), MLX `bits`
 * g64 weights in one 2 MiB-aligned MADV_HUGEPAGE arena as the model loader places them,
 * repacked to the 16-row interleave; configurations timed in turn step by step (2+ threads: wall
 * clock; 1 thread: its CPU clock), medians of GB/s and of the ratio to the first configuration.
 *   ab BITS REPS THREADS CFG...   CFG = LEVEL:L2:DISTANCE, LEVEL avx512|avx2, L2 1 = prefetcht1
 *                                 (cpu_matvec_set_prefetch_l2), DISTANCE bytes (0 = no prefetch)
 *   MISALIGN=N: every array N bytes past a 64-byte line; WATCH=S: for S seconds, time a round only
 *   after a second with the machine >= 90% idle (a shared machine's quiet moments), print each.
 * Build: gcc -O2 -Isrc -o ab bench/kernels-cpu26/ab.c build/release/libexo.a -lopenblas -lm -ldl -lpthread */
#define _GNU_SOURCE
#include "compute/cpu/cpu.h"
#include "compute/cpu/cpu_levels.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <sys/file.h>
#include <fcntl.h>
#include <unistd.h>
static int use_cpu;
static double now(void) { struct timespec t; clock_gettime(use_cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static char *arena; static size_t used;
static size_t misalign;
static void *take(size_t n) { void *p = arena + used + misalign; used += (n + 63 + 64) & ~(size_t)63; return p; }
static weight_matrix mk(int64_t rows, int64_t cols, int bits) {
    weight_matrix w = {.format = WEIGHT_MLX_AFFINE, .rows = rows, .cols = cols, .bits = bits, .group_size = 64, .scale_dtype = DTYPE_BF16};
    size_t q = (size_t)(rows * cols * bits / 8), s = (size_t)(rows * cols / 64) * 2;
    uint32_t *d = take(q); uint16_t *sc = take(s), *bi = take(s);
    for (size_t i = 0; i < q / 4; i++) d[i] = rnd();
    for (size_t i = 0; i < s / 2; i++) sc[i] = 0x3c00 | (rnd() & 0x7f), bi[i] = 0xbc00 | (rnd() & 0x7f);
    if (getenv("FILL")) { /* every byte one value whose bf16 pairs are normal numbers: the fused-layout experiment reads scales from anywhere */
        int f = (int)strtol(getenv("FILL"), NULL, 0);
        memset(d, f, q), memset(sc, f, s), memset(bi, f, s);
    }
    w.data = d, w.scales = sc, w.biases = bi;
    if (cpu_weight_repack_rows16(&w)) { fprintf(stderr, "repack failed\n"); exit(1); }
    return w;
}
static double idle_frac(double secs) {
    unsigned long long a[10] = {0}, b[10] = {0};
    FILE *f = fopen("/proc/stat", "r"); if (!f) return 0;
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7]) != 8) { fclose(f); return 0; } fclose(f);
    struct timespec ts = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)}; nanosleep(&ts, NULL);
    f = fopen("/proc/stat", "r"); if (!f) return 0;
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7]) != 8) { fclose(f); return 0; } fclose(f);
    double tot = 0; for (int i = 0; i < 8; i++) tot += (double)(b[i] - a[i]);
    return tot > 0 ? (double)(b[3] - a[3] + b[4] - a[4]) / tot : 0;
}
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    int bits = argc > 1 ? atoi(argv[1]) : 0, reps = argc > 2 ? atoi(argv[2]) : 0, cap = reps;
    int nth = argc > 3 ? atoi(argv[3]) : 0, ncfg = argc - 4;
    if ((bits != 4 && bits != 8) || reps < 1 || nth < 1 || ncfg < 1 || ncfg > 16) {
        fprintf(stderr, "usage: ab 4|8 REPS THREADS LEVEL:L2:DISTANCE... (1 to 16 configurations)\n");
        return 2;
    }
    cpu_set_threads(nth); use_cpu = nth == 1; if (getenv("MISALIGN")) misalign = (size_t)atoi(getenv("MISALIGN"));
    size_t arena_bytes = (size_t)2 << 30;
    arena = mmap(NULL, arena_bytes + (2 << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED) {
        fprintf(stderr, "ab: no memory for the 2 GiB arena\n");
        return 1;
    }
    arena = (char *)(((uintptr_t)arena + (2 << 20) - 1) & ~(uintptr_t)((2 << 20) - 1));
    madvise(arena, arena_bytes, MADV_HUGEPAGE);
    enum { L = 16 };
    weight_matrix q[L], k[L], v[L], o[L], g[L], u[L], dn[L];
    for (int l = 0; l < L; l++) {
        q[l] = mk(2048, 2048, bits), k[l] = mk(512, 2048, bits), v[l] = mk(512, 2048, bits), o[l] = mk(2048, 2048, bits);
        g[l] = mk(8192, 2048, bits), u[l] = mk(8192, 2048, bits), dn[l] = mk(2048, 8192, bits);
    }
    weight_matrix head = mk(128256, 2048, bits);
    double bytes = (double)used;
    float *x = malloc(8192 * 4), *y = malloc(4 * 128256 * 4);
    for (int i = 0; i < 8192; i++) x[i] = (float)(rnd() % 2001) * 0.001f - 1.0f;
    cpu_level lv[16]; int var[16], dist[16];
    for (int c = 0; c < ncfg; c++) {
        lv[c] = !strncmp(argv[4 + c], "avx2", 4) ? CPU_LEVEL_AVX2 : CPU_LEVEL_AVX512;
        const char *p = strchr(argv[4 + c], ':'); var[c] = p ? atoi(p + 1) : 0; const char *q = p ? strchr(p + 1, ':') : NULL; dist[c] = q ? atoi(q + 1) : 2048;
    }
    double *gbs = calloc((size_t)ncfg * cap, sizeof(double)), *ratio = calloc((size_t)ncfg * cap, sizeof(double));
    double watch = getenv("WATCH") ? atof(getenv("WATCH")) : 0, w0 = 0;
    { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); w0 = t.tv_sec; }
    int quiet_rounds = 0;
    int lockfd = getenv("LOCK") ? open(getenv("LOCK"), O_RDONLY) : -1; /* WATCH: the shared bench lock, held per round */
    for (int r = -2; r < reps; r++) {
        if (watch > 0 && r >= 0) {
            struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - w0 > watch) { reps = r; break; }
            double id = idle_frac(1.0);
            if (id < 0.9) { r--; continue; }
            quiet_rounds++;
            if (lockfd >= 0) flock(lockfd, LOCK_EX);
            printf("quiet round %d idle %.2f\n", r, id); fflush(stdout);
        }
        for (int ci = 0; ci < ncfg; ci++) {
            int c = (ci + (r > 0 ? r : 0)) % ncfg; /* rotating order: no configuration always runs first after the idle wait */
            cpu_matvec_set_prefetch_l2(var[c] == 1); cpu_matvec_set_prefetch((size_t)dist[c]);
            double t0 = now();
            for (int l = 0; l < L; l++) {
                const weight_matrix *qkv[3] = {&q[l], &k[l], &v[l]}, *gu[2] = {&g[l], &u[l]};
                float *yq[3] = {y, y + 2048, y + 2560}, *yg[2] = {y, y + 8192};
                cpu_matmul_multi_with(3, qkv, x, yq, 1, lv[c], CPU_GEMM_AUTO, -1);
                cpu_matmul_with(&o[l], x, y, 1, lv[c], CPU_GEMM_AUTO, -1);
                cpu_matmul_multi_with(2, gu, x, yg, 1, lv[c], CPU_GEMM_AUTO, -1);
                cpu_matmul_with(&dn[l], x, y, 1, lv[c], CPU_GEMM_AUTO, -1);
            }
            cpu_matmul_with(&head, x, y, 1, lv[c], CPU_GEMM_AUTO, -1);
            double t = now() - t0;
            if (r >= 0) gbs[c * cap + r] = bytes / t * 1e-9;
            if (watch > 0 && r >= 0) { printf("  %s %.2f\n", argv[4 + c], bytes / t * 1e-9); fflush(stdout); }
        }
        if (lockfd >= 0 && watch > 0 && r >= 0) flock(lockfd, LOCK_UN);
    }
    if (reps <= 0) { printf("no quiet round\n"); return 0; }
    for (int c = 0; c < ncfg; c++)
        for (int r = 0; r < reps; r++) ratio[c * cap + r] = gbs[c * cap + r] / gbs[r];
    printf("%d-bit step %.0f MB, %d threads (%s), %d reps\n", bits, bytes / 1e6, nth, use_cpu ? "its CPU clock" : "wall clock", reps);
    for (int c = 0; c < ncfg; c++) {
        qsort(gbs + c * cap, reps, sizeof(double), cmpd); qsort(ratio + c * cap, reps, sizeof(double), cmpd);
        printf("  %-12s median %6.2f GB/s (best %6.2f)  ratio to %s: median %.3f [q1 %.3f q3 %.3f]\n", argv[4 + c],
               gbs[c * cap + reps / 2], gbs[c * cap + reps - 1], argv[4], ratio[c * cap + reps / 2], ratio[c * cap + reps / 4], ratio[c * cap + 3 * reps / 4]);
    }
}
