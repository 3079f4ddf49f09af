/* exo bench — measures this machine and our kernels side by side, so every number comes with the
 * baseline it is compared against from the same run:
 *   mem     read-only bandwidth (the decode roofline) and STREAM triad, arrays >= 1 GiB, all threads
 *   pool    thread-pool dispatch cost (empty job)
 *   gemm    f32 GEMM: FMA peak (register-only loop), our AVX-512 GEMM, OpenBLAS sgemm (GFLOP/s)
 *   matvec  matmul per weight format on Llama-3.2-1B-shaped matrices: decode (batch 1 and 8) in
 *           GB/s of weights and as a fraction of the read roofline; prefill (512 tokens) in GFLOP/s
 *   model   end-to-end prefill/decode tok/s of a model directory (bench_model.c, the
 *           engine's; this file measures the bandwidth it compares against)
 *
 * Weight sweeps always cover >= 1 GiB (many matrices back to back) so that the 260 MB L3 of the
 * development machine cannot serve them. Timings report the best and the median of the runs: on a
 * shared machine the best is the closest to what the hardware can do.
 * Refuses: to run sections it does not know; it never writes files (bench/run.sh does). */
#include "compute/device.h"
#include "base/clock.h"
#include "base/threadpool.h"
#include "cmd/cmd.h"
#include "compute/cpu/cpu_levels.h"
#include "compute/cpu/matmul_amx.h"
#include "dist/dist_bench.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct bench_options {
    int quick;            /* smaller sweeps and fewer repeats (CI smoke test) */
    size_t mem_bytes;     /* bytes per bandwidth array */
    int reps;
    const char *section;  /* NULL = all kernel sections */
    const char *model_dir;
    size_t sweep_bytes;   /* weight bytes per matvec sweep */
    int cpu_time;         /* time with this thread's CPU clock (kernel cost, immune to sharing) */
    const char *formats;  /* matvec: comma-separated substrings of format names to run (NULL = all) */
    int mv_tokens[8];     /* matvec: decode batch sizes (default 1 and 8) */
    int n_mv_tokens;
    int no_prefill;       /* matvec: skip the 512-token column */
} bench_options;

static int use_cpu_time;

static uint64_t bench_now_ns(void) {
    if (!use_cpu_time) return clock_now_ns();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int bench_model_main(const char *model_dir, int argc, char **argv, double read_gbs);
double bench_read_gbs(size_t bytes, int reps, double *median_gbs);
double bench_mlx_matmul_gflops(int bits, int group_size, int64_t n, int64_t tokens);

static double seconds(uint64_t ns) {
    return (double)ns * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs fn reps times; returns the best (lowest) time, stores the median in *median. */
static double time_best(void (*fn)(void *), void *ctx, int reps, double *median) {
    double t[64];
    if (reps > 64) reps = 64;
    for (int i = 0; i < reps; i++) {
        uint64_t start = bench_now_ns();
        fn(ctx);
        t[i] = seconds(bench_now_ns() - start);
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    if (median) *median = t[reps / 2];
    return t[0];
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t rng_next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- memory bandwidth ---------------------------------------------------------------------- */

typedef struct mem_job {
    float *a, *b, *c;
    size_t n;
    int plain_loop; /* the compiler's own vectorization of the sum, not the AVX-512 intrinsics */
    double sums[64];
} mem_job;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float sum_avx512(const float *p, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(p + i + 48));
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    for (; i < n; i++) s += p[i];
    return s;
}
#endif

static float sum_scalar(const float *p, size_t n) {
    float s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += p[i + j];
    for (; i < n; i++) s[0] += p[i];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void read_range(void *p, int64_t begin, int64_t end, int thread_index) {
    mem_job *job = p;
#if defined(__x86_64__)
    if (!job->plain_loop && cpu_level_supported(CPU_LEVEL_AVX512)) {
        job->sums[thread_index] += sum_avx512(job->a + begin, (size_t)(end - begin));
        return;
    }
#endif
    job->sums[thread_index] += sum_scalar(job->a + begin, (size_t)(end - begin));
}

static void triad_range(void *p, int64_t begin, int64_t end, int thread_index) {
    (void)thread_index;
    mem_job *job = p;
    float *a = job->a, *b = job->b, *c = job->c;
    for (int64_t i = begin; i < end; i++) a[i] = b[i] + 3.0f * c[i];
}

static void run_read(void *p) {
    mem_job *job = p;
    threadpool_parallel_for(cpu_thread_pool(), (int64_t)job->n, read_range, job);
}

static void run_triad(void *p) {
    mem_job *job = p;
    threadpool_parallel_for(cpu_thread_pool(), (int64_t)job->n, triad_range, job);
}

static void fill_range(void *p, int64_t begin, int64_t end, int thread_index) {
    (void)thread_index;
    mem_job *job = p;
    for (int64_t i = begin; i < end; i++) {
        job->a[i] = (float)(i & 1023) * 0.001f;
        if (job->b) job->b[i] = 1.0f;
        if (job->c) job->c[i] = 2.0f;
    }
}

/* A fresh array of `bytes` of floats for the read probes, first touched by all threads, into
 * job->a and job->n; 0, or -1 when the memory cannot be had. */
static int probe_array(mem_job *job, size_t bytes) {
    size_t n = bytes / sizeof(float);
    /* On 2 MiB pages like the weights arena (model/weights.c): with 4 KiB pages a VM pays a
     * nested page walk every 4 KiB, and the probe would read less than decode can. */
    const size_t huge = (size_t)2 << 20, len = (n * sizeof(float) + huge - 1) & ~(huge - 1);
    int huge_pages = !getenv("EXO_BENCH_SMALL_PAGES");
    job->a = huge_pages ? aligned_alloc(huge, len) : malloc(n * sizeof(float));
    if (!job->a) return -1;
#ifdef MADV_HUGEPAGE
    if (huge_pages) madvise(job->a, len, MADV_HUGEPAGE);
#endif
    job->n = n;
    threadpool_parallel_for(cpu_thread_pool(), (int64_t)n, fill_range, job); /* first touch */
    return 0;
}

/* The read-only bandwidth of all threads over a fresh array of `bytes`: best of reps in GB/s
 * (the median in *median_gbs when not NULL); 0 when the memory cannot be had. The model bench
 * calls it again after its measurements (bench_model.c). */
double bench_read_gbs(size_t bytes, int reps, double *median_gbs) {
    mem_job job = {0};
    if (probe_array(&job, bytes)) return 0;
    size_t n = job.n;
    double med, best = time_best(run_read, &job, reps, &med);
    /* The roofline is what the memory gives, so the faster of two loops counts: on this
     * session's Xeon VM the zmm loop read 32.0-32.6 GB/s and the compiler's (ymm) loop
     * 36.2-36.5 on 2 threads, alternated 3 times. */
    job.plain_loop = 1;
    double med2, best2 = time_best(run_read, &job, reps, &med2);
    if (best2 < best) best = best2, med = med2;
    free(job.a);
    if (median_gbs) *median_gbs = (double)(n * sizeof(float)) / med * 1e-9;
    return (double)(n * sizeof(float)) / best * 1e-9;
}

/* A read probe interleaved with the work it is the ceiling of (the decode lines' "paired"
 * roofline, bench_model.c): on a shared VM the host's bandwidth swings within seconds (the
 * 2-thread probe read 32-57 GB/s from one run to the next here, and one decode ran at 146% of
 * the probe taken after it), so a probe before or after a measurement can be another host.
 * One sweep between decode steps sees the same host as the steps around it. */
typedef struct bench_probe {
    mem_job job;
    size_t bytes;
    double seconds[2]; /* summed per loop: the AVX-512 one, the compiler's */
    int sweeps;
} bench_probe;

/* A probe over a fresh array of `bytes` (probe_array), or NULL. */
bench_probe *bench_probe_open(size_t bytes) {
    bench_probe *p = calloc(1, sizeof *p);
    if (!p || probe_array(&p->job, bytes)) {
        free(p);
        return NULL;
    }
    p->bytes = p->job.n * sizeof(float);
    return p;
}

/* One sweep with each loop, all threads. */
void bench_probe_sweep(bench_probe *p) {
    for (int loop = 0; loop < 2; loop++) {
        p->job.plain_loop = loop;
        uint64_t t0 = bench_now_ns();
        run_read(&p->job);
        p->seconds[loop] += seconds(bench_now_ns() - t0);
    }
    p->sweeps++;
}

/* GB/s of the faster loop over every sweep so far (as bench_read_gbs takes the faster), 0 if none. */
double bench_probe_gbs(const bench_probe *p) {
    double t = p->seconds[0] < p->seconds[1] ? p->seconds[0] : p->seconds[1];
    return p->sweeps && t > 0 ? (double)p->bytes * p->sweeps / t * 1e-9 : 0;
}

void bench_probe_close(bench_probe *p) {
    if (p) free(p->job.a);
    free(p);
}

/* Returns the best read-only bandwidth in GB/s (0 on failure). */
static double bench_memory(const bench_options *o) {
    double med = 0, read_gbs = bench_read_gbs(o->mem_bytes, o->reps, &med);
    if (read_gbs == 0) {
        fprintf(stderr, "exo bench: cannot allocate %zu MiB for the bandwidth test\n", o->mem_bytes >> 20);
        return 0;
    }
    printf("mem   read-only sum   %6zu MiB x %d threads: %6.2f GB/s best, %6.2f GB/s median\n",
           o->mem_bytes >> 20, threadpool_size(cpu_thread_pool()), read_gbs, med);

    size_t tn = o->mem_bytes / sizeof(float) / 2; /* three arrays of half the size: 1.5x the memory of the read test */
    mem_job tj = {.n = tn};
    tj.a = malloc(tn * sizeof(float));
    tj.b = malloc(tn * sizeof(float));
    tj.c = malloc(tn * sizeof(float));
    if (tj.a && tj.b && tj.c) {
        threadpool_parallel_for(cpu_thread_pool(), (int64_t)tn, fill_range, &tj);
        double best = time_best(run_triad, &tj, o->reps, &med);
        double bytes = 3.0 * (double)(tn * sizeof(float));
        printf("mem   triad a=b+s*c   3 x %4zu MiB:           %6.2f GB/s best, %6.2f GB/s median "
               "(3 streams counted, as STREAM)\n",
               (tn * sizeof(float)) >> 20, bytes / best * 1e-9, bytes / med * 1e-9);
    }
    free(tj.a);
    free(tj.b);
    free(tj.c);
    return read_gbs;
}

/* ---- thread pool ---------------------------------------------------------------------------- */

static void empty_job(void *ctx, int i, int n) {
    (void)ctx;
    (void)i;
    (void)n;
}

typedef struct handoff {
    _Atomic int started[64];
} handoff;

/* Share 0 waits until every other share started: the time of a job where the workers really
 * take part (wake or notice, claim, run, report back). */
static void handoff_job(void *ctx, int i, int n) {
    handoff *h = ctx;
    atomic_store_explicit(&h->started[i], 1, memory_order_release);
    if (i != 0) return;
    for (int k = 1; k < n && k < 64; k++)
        while (!atomic_load_explicit(&h->started[k], memory_order_acquire)) {
        }
}

static void bench_pool(const bench_options *o) {
    threadpool *pool = cpu_thread_pool();
    int iters = o->quick ? 20000 : 200000;
    for (int i = 0; i < 1000; i++) threadpool_run(pool, 0, empty_job, NULL);
    uint64_t start = clock_now_ns();
    for (int i = 0; i < iters; i++) threadpool_run(pool, 0, empty_job, NULL);
    double us = seconds(clock_now_ns() - start) / iters * 1e6;
    int hand_iters = iters / 10;
    start = clock_now_ns();
    for (int i = 0; i < hand_iters; i++) {
        handoff h;
        memset(&h, 0, sizeof h);
        threadpool_run(pool, 0, handoff_job, &h);
    }
    double hand_us = seconds(clock_now_ns() - start) / hand_iters * 1e6;
    printf("pool  %d threads: empty job %.2f us (the caller may run a late worker's share itself); "
           "job every worker joins %.2f us (mean of %d)\n",
           threadpool_size(pool), us, hand_us, hand_iters);
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

typedef struct fma_job {
    int64_t iters;
    _Atomic int sink;
} fma_job;

#if defined(__x86_64__)
/* 12 independent FMA chains of 16 floats: enough to cover 4-cycle latency on two FMA ports. */
__attribute__((target("avx512f"))) static void fma_peak_range(void *p, int i, int n) {
    (void)i;
    (void)n;
    fma_job *job = p;
    __m512 a[12];
    for (int k = 0; k < 12; k++) a[k] = _mm512_set1_ps((float)k);
    __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
    for (int64_t it = 0; it < job->iters; it++) {
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++) a[k] = _mm512_fmadd_ps(a[k], m, c);
    }
    __m512 s = a[0];
    for (int k = 1; k < 12; k++) s = _mm512_add_ps(s, a[k]);
    if (_mm512_reduce_add_ps(s) == 12345.0f) atomic_store(&job->sink, 1);
}
#endif

/* One timed matmul: y = x W^T over n_tokens rows, through the given gemm engine and matvec
 * limit (cpu_matmul_with), or OpenBLAS alone (raw_openblas: the GEMM section's baseline). */
typedef struct matmul_case {
    weight_matrix w;
    float *x, *y;
    int64_t n_tokens;
    cpu_gemm_engine engine;
    int raw_openblas;
    int max_matvec;
} matmul_case;

static void run_gemm(void *p) {
    matmul_case *g = p;
    if (g->raw_openblas) { /* OpenBLAS's own threading, whole problem in one call */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->n_tokens, (int)g->w.rows,
                    (int)g->w.cols, 1.0f, g->x, (int)g->w.cols, g->w.data, (int)g->w.cols, 0.0f,
                    g->y, (int)g->w.rows);
        return;
    }
    cpu_matmul_with(&g->w, g->x, g->y, g->n_tokens, CPU_LEVEL_AVX512, g->engine, g->max_matvec);
}

/* Returns the best measured f32 GEMM rate (GFLOP/s). */
static double bench_gemm(const bench_options *o) {
    double best_rate = 0;
#if defined(__x86_64__)
    if (cpu_level_supported(CPU_LEVEL_AVX512)) {
        fma_job fj = {.iters = o->quick ? 2000000 : 10000000};
        double t = 1e30;
        for (int rep = 0; rep < 3; rep++) { /* best of 3: a shared machine only ever slows it */
            uint64_t start = bench_now_ns();
            threadpool_run(cpu_thread_pool(), 0, fma_peak_range, &fj);
            double dt = seconds(bench_now_ns() - start);
            t = dt < t ? dt : t;
        }
        double flops = (double)fj.iters * 12 * 16 * 2 * threadpool_size(cpu_thread_pool());
        printf("gemm  FMA peak (register-only AVX-512 loop, %d threads): %.1f GFLOP/s\n",
               threadpool_size(cpu_thread_pool()), flops / t * 1e-9);
    }
#endif
    int64_t rows = 2048, cols = 2048, n = o->quick ? 128 : 512;
    matmul_case g = {.n_tokens = n};
    float *wdata = malloc((size_t)(rows * cols) * sizeof(float));
    g.x = malloc((size_t)(n * cols) * sizeof(float));
    g.y = malloc((size_t)(n * rows) * sizeof(float));
    if (!wdata || !g.x || !g.y) {
        fprintf(stderr, "exo bench: out of memory\n");
        free(wdata), free(g.x), free(g.y);
        return 0;
    }
    for (int64_t i = 0; i < rows * cols; i++) wdata[i] = (float)(rng_next() % 2001) * 0.001f - 1.0f;
    for (int64_t i = 0; i < n * cols; i++) g.x[i] = (float)(rng_next() % 2001) * 0.001f - 1.0f;
    g.w = (weight_matrix){.format = WEIGHT_F32, .rows = rows, .cols = cols, .data = wdata};
    double flops = 2.0 * (double)rows * (double)cols * (double)n;
    struct { const char *name; cpu_gemm_engine engine; int raw; int needs_avx512; } engines[] = {
        {"own AVX-512 GEMM (exo threads)", CPU_GEMM_OWN, 0, 1},
        {"OpenBLAS sgemm, 1 thread per exo thread", CPU_GEMM_OPENBLAS, 0, 0},
    };
    for (size_t e = 0; e < sizeof engines / sizeof *engines; e++) {
        if (engines[e].needs_avx512 && !cpu_level_supported(CPU_LEVEL_AVX512)) continue;
        g.engine = engines[e].engine;
        g.raw_openblas = engines[e].raw;
        run_gemm(&g);
        double med, best = time_best(run_gemm, &g, o->reps, &med);
        double rate = flops / best * 1e-9;
        if (rate > best_rate) best_rate = rate;
        printf("gemm  f32 %lldx%lld weights x %lld tokens, %-42s %7.1f GFLOP/s best, %7.1f median\n",
               (long long)rows, (long long)cols, (long long)n, engines[e].name, rate, flops / med * 1e-9);
    }
    printf("gemm  OpenBLAS core: %s (set OPENBLAS_CORETYPE=SkylakeX if it does not know this CPU)\n",
           openblas_get_corename());
    free(wdata);
    free(g.x);
    free(g.y);
    return best_rate;
}

/* ---- matmul per weight format ---------------------------------------------------------------- */

typedef struct format_case {
    const char *name;
    weight_format format;
    int bits, group_size;
    int exact; /* weight_matrix.exact_activations: run through cpu_matmul, as the engine does */
    int zero_point; /* weight_matrix.zero_point, F16 scales: what a GGUF Q4_0 / Q8_0 file becomes */
} format_case;

static const format_case bench_formats[] = {
    {"f32", WEIGHT_F32, 0, 0, 0, 0},          {"f16", WEIGHT_F16, 0, 0, 0, 0},
    {"bf16", WEIGHT_BF16, 0, 0, 0, 0},        {"mlx q8 g64", WEIGHT_MLX_AFFINE, 8, 64, 0, 0},
    {"mlx q6 g64", WEIGHT_MLX_AFFINE, 6, 64, 0, 0}, {"mlx q5 g64", WEIGHT_MLX_AFFINE, 5, 64, 0, 0},
    {"mlx q4 g32", WEIGHT_MLX_AFFINE, 4, 32, 0, 0}, {"mlx q4 g64", WEIGHT_MLX_AFFINE, 4, 64, 0, 0},
    {"mlx q4 g128", WEIGHT_MLX_AFFINE, 4, 128, 0, 0}, {"mlx q3 g64", WEIGHT_MLX_AFFINE, 3, 64, 0, 0},
    {"mlx q2 g64", WEIGHT_MLX_AFFINE, 2, 64, 0, 0},
    {"mlx q4 g64 exact", WEIGHT_MLX_AFFINE, 4, 64, 1, 0}, /* the hybrids' GatedDeltaNet projections */
    {"gguf q4_0", WEIGHT_MLX_AFFINE, 4, 32, 0, 8},     {"gguf q8_0", WEIGHT_MLX_AFFINE, 8, 32, 0, 128},
};

/* Many matrices of one shape laid out back to back: matrix i is rows [i*rows, (i+1)*rows). */
typedef struct sweep {
    weight_matrix all; /* the whole tall matrix */
    void *mem;         /* its one allocation: MLX data, scales and biases side by side, as placed
                          weights are (so 8-bit scales go inline as in a model, layout.c) */
    int64_t rows, count;
    float *x, *y;
    int64_t n_tokens;
    int max_matvec;
} sweep;

static void fill_words(void *p, size_t bytes, uint32_t and_mask, uint32_t or_mask) {
    uint32_t *w = p;
    for (size_t i = 0; i < bytes / 4; i++) w[i] = ((uint32_t)rng_next() & and_mask) | or_mask;
}

/* repack: interleave 4-bit matrices as the model loader does when the kernels prefer it. */
static int sweep_alloc(sweep *s, const format_case *f, int64_t rows, int64_t cols, size_t min_bytes,
                       int64_t max_tokens, int repack) {
    memset(s, 0, sizeof *s);
    weight_matrix one = {.format = f->format, .rows = rows, .cols = cols, .bits = f->bits,
                         .group_size = f->group_size, .scale_dtype = f->zero_point ? DTYPE_F16 : DTYPE_BF16,
                         .exact_activations = f->exact, .zero_point = f->zero_point};
    size_t per = weight_matrix_bytes(&one);
    s->count = (int64_t)((min_bytes + per - 1) / per);
    s->rows = rows;
    s->all = one;
    s->all.rows = rows * s->count;
    int64_t total_rows = s->all.rows;
    void *data = NULL, *scales = NULL, *biases = NULL;
    if (f->format == WEIGHT_MLX_AFFINE) {
        size_t qbytes = (size_t)(total_rows * cols * f->bits / 8);
        size_t sbytes = (size_t)(total_rows * (cols / f->group_size)) * 2;
        s->mem = data = malloc(qbytes + 2 * sbytes);
        if (!data) goto fail;
        scales = (uint8_t *)data + qbytes, biases = (uint8_t *)scales + sbytes;
        fill_words(data, qbytes, 0xffffffffu, 0);
        if (f->zero_point) { /* f16 scales in [2^-7, 2^-6), biases -zero_point * scale (exact in f16) */
            fill_words(scales, sbytes, 0x03ff03ffu, 0x20002000u);
            for (size_t i = 0; i < sbytes / 2; i++)
                ((uint16_t *)biases)[i] = f32_to_f16(-(float)f->zero_point * f16_to_f32(((uint16_t *)scales)[i]));
        } else {
            fill_words(scales, sbytes, 0x007f007fu, 0x3c003c00u); /* bf16 pairs in [0.0078, 0.0156) */
            fill_words(biases, sbytes, 0x807f807fu, 0x3c003c00u);
        }
    } else {
        size_t esize = f->format == WEIGHT_F32 ? 4 : 2;
        size_t bytes = (size_t)(total_rows * cols) * esize;
        s->mem = data = malloc(bytes);
        if (!data) goto fail;
        if (f->format == WEIGHT_F32) fill_words(data, bytes, 0x807fffffu, 0x3f000000u);
        else if (f->format == WEIGHT_F16) fill_words(data, bytes, 0x83ff83ffu, 0x38003800u);
        else fill_words(data, bytes, 0x807f807fu, 0x3f003f00u);
    }
    s->all.data = data;
    s->all.scales = scales;
    s->all.biases = biases;
    /* as the model loader does (EXO_Q4_LAYOUT=mlx: no); whole blocks per matrix of the sweep */
    if (repack && rows % 16 == 0 && cpu_weight_prefers_rows16(&s->all)) cpu_weight_repack_rows16(&s->all);
    s->x = malloc((size_t)(max_tokens * cols) * sizeof(float));
    s->y = malloc((size_t)(max_tokens * rows) * sizeof(float));
    if (!s->x || !s->y) goto fail;
    for (int64_t i = 0; i < max_tokens * cols; i++) s->x[i] = (float)(rng_next() % 2001) * 0.001f - 1.0f;
    return 0;
fail:
    free(s->mem), free(s->x), free(s->y);
    memset(s, 0, sizeof *s);
    return -1;
}

static void sweep_free(sweep *s) {
    free(s->mem);
    free(s->x);
    free(s->y);
}

static weight_matrix sweep_matrix(const sweep *s, int64_t i) {
    weight_matrix m = s->all;
    m.rows = s->rows;
    int64_t cols = m.cols;
    if (m.format == WEIGHT_MLX_AFFINE && m.group_stride) { /* whole blocks, each one stream */
        size_t off = (size_t)(i * s->rows / 16 * (cols / m.group_size)) * m.group_stride;
        m.data = (const uint8_t *)m.data + off;
        m.scales = (const uint8_t *)m.scales + off;
        m.biases = (const uint8_t *)m.biases + off;
    } else if (m.format == WEIGHT_MLX_AFFINE) {
        m.data = (const uint8_t *)m.data + (size_t)(i * s->rows * cols * m.bits / 8);
        size_t soff = (size_t)(i * s->rows * (cols / m.group_size)) * 2;
        m.scales = (const uint8_t *)m.scales + soff;
        m.biases = (const uint8_t *)m.biases + soff;
    } else {
        m.data = (const uint8_t *)m.data + (size_t)(i * s->rows * cols) * (m.format == WEIGHT_F32 ? 4 : 2);
    }
    return m;
}

static void run_sweep(void *p) {
    sweep *s = p;
    for (int64_t i = 0; i < s->count; i++) {
        weight_matrix m = sweep_matrix(s, i);
        if (m.exact_activations) { /* only cpu_matmul honours the flag */
            cpu_matmul(&m, s->x, s->y, s->n_tokens);
            continue;
        }
        cpu_matmul_with(&m, s->x, s->y, s->n_tokens, cpu_level_supported(CPU_LEVEL_AVX512) ? CPU_LEVEL_AVX512
                                                   : cpu_level_supported(CPU_LEVEL_AVX2) ? CPU_LEVEL_AVX2
                                                                                          : CPU_LEVEL_GENERIC,
                        CPU_GEMM_AUTO, s->max_matvec);
    }
}

/* GFLOP/s of cpu_matmul (the engine's own path choice) on one n x n MLX matrix of bits and
 * group_size times `tokens` tokens, best of 3 after a warm-up; 0 when memory is short. The model
 * bench's int-gemm ceiling (bench_model.c). */
double bench_mlx_matmul_gflops(int bits, int group_size, int64_t n, int64_t tokens) {
    format_case f = {"mlx", WEIGHT_MLX_AFFINE, bits, group_size, 0, 0};
    sweep s;
    if (sweep_alloc(&s, &f, n, n, 1, tokens, 1)) return 0;
    s.n_tokens = tokens;
    s.max_matvec = -1;
    run_sweep(&s);
    double best = time_best(run_sweep, &s, 3, NULL);
    sweep_free(&s);
    return 2.0 * (double)n * (double)n * (double)tokens / best * 1e-9;
}

static int format_selected(const char *list, const char *name) {
    if (!list) return 1;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        for (const char *h = name; n && *h; h++)
            if (!strncmp(h, p, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static void bench_matvec(const bench_options *o, double read_gbs, double gemm_peak) {
    int64_t shapes[][2] = {{8192, 2048}, {2048, 8192}};
    size_t min_bytes = o->sweep_bytes;
    weight_matrix q4 = {.format = WEIGHT_MLX_AFFINE, .rows = 16, .cols = 128, .data = "", .scales = "",
                        .biases = "", .scale_dtype = DTYPE_BF16, .bits = 4, .group_size = 64};
    printf("matvec weights: sweeps of >= %zu MiB (Llama-3.2-1B shapes); roofline = read-only %.2f GB/s; "
           "4-bit layout %s\n", min_bytes >> 20, read_gbs, cpu_weight_prefers_rows16(&q4) ? "rows16" : "mlx");
    printf("%-12s %-10s", "format", "shape");
    for (int b = 0; b < o->n_mv_tokens; b++) {
        char h[2][16];
        snprintf(h[0], sizeof h[0], "b%d GB/s", o->mv_tokens[b]);
        snprintf(h[1], sizeof h[1], "b%d roof", o->mv_tokens[b]);
        printf(" %9s %8s", h[0], h[1]);
    }
    if (!o->no_prefill) printf(" %12s %8s", "pp512 GFLOP", "of peak");
    printf("\n");
    for (size_t f = 0; f < sizeof bench_formats / sizeof *bench_formats; f++) {
        if (!format_selected(o->formats, bench_formats[f].name)) continue;
        for (size_t sh = 0; sh < 2; sh++) {
            sweep s;
            int64_t rows = shapes[sh][0], cols = shapes[sh][1];
            weight_matrix probe = {.format = bench_formats[f].format, .rows = rows, .cols = cols,
                                   .bits = bench_formats[f].bits, .group_size = bench_formats[f].group_size,
                                   .scale_dtype = DTYPE_BF16, .zero_point = bench_formats[f].zero_point};
            size_t mbytes = weight_matrix_bytes(&probe);
            if (mbytes > min_bytes) { /* a cache-resident sweep: fewer rows, same row length */
                rows = (int64_t)((double)rows * (double)min_bytes / (double)mbytes) & ~(int64_t)15;
                if (rows < 16) rows = 16;
            }
            if (sweep_alloc(&s, &bench_formats[f], rows, cols, min_bytes, 512, 1) != 0) {
                fprintf(stderr, "exo bench: out of memory for %s\n", bench_formats[f].name);
                continue;
            }
            /* Interleaved 4-bit matrices: the same sweep in MLX order too, timed rep by rep in
             * turn with it (an A/B in one process), printed on the next line. */
            sweep m;
            int ab = s.all.layout == WEIGHT_LAYOUT_MLX_ROWS16 &&
                     sweep_alloc(&m, &bench_formats[f], rows, cols, min_bytes, 512, 0) == 0;
            double t_mlx[16] = {0};
            double bytes = (double)weight_matrix_bytes(&s.all);
            char shape[32];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
            printf("%-12s %-10s", bench_formats[f].name, shape);
            for (int b = 0; b < o->n_mv_tokens; b++) {
                s.n_tokens = o->mv_tokens[b];
                s.max_matvec = -1;
                run_sweep(&s);
                double t = 0;
                if (ab) {
                    m.n_tokens = s.n_tokens;
                    m.max_matvec = -1;
                    run_sweep(&m);
                    for (int i = 0; i < o->reps; i++) {
                        double a = time_best(run_sweep, &s, 1, NULL), c = time_best(run_sweep, &m, 1, NULL);
                        t = i == 0 || a < t ? a : t;
                        if (b < 16) t_mlx[b] = i == 0 || c < t_mlx[b] ? c : t_mlx[b];
                    }
                } else {
                    t = time_best(run_sweep, &s, o->reps, NULL);
                }
                double gbs = bytes / t * 1e-9;
                printf(" %9.2f %7.0f%%", gbs, read_gbs > 0 ? 100 * gbs / read_gbs : 0);
            }
            if (!o->no_prefill) {
                /* Prefill: one matrix of the shape, 512 tokens (compute-bound, no need to sweep). */
                s.n_tokens = o->quick ? 64 : 512;
                s.max_matvec = -1;
                sweep one = s;
                one.count = 1;
                run_sweep(&one);
                double t = time_best(run_sweep, &one, o->reps > 3 ? 3 : o->reps, NULL);
                double gflops = 2.0 * (double)s.rows * (double)s.all.cols * (double)s.n_tokens / t * 1e-9;
                printf(" %12.1f %7.0f%%", gflops, gemm_peak > 0 ? 100 * gflops / gemm_peak : 0);
            }
            printf("\n");
            if (ab) {
                printf("%-12s %-10s", " (MLX order)", shape);
                for (int b = 0; b < o->n_mv_tokens && b < 16; b++) {
                    double gbs = bytes / t_mlx[b] * 1e-9;
                    printf(" %9.2f %7.0f%%", gbs, read_gbs > 0 ? 100 * gbs / read_gbs : 0);
                }
                printf("\n");
                sweep_free(&m);
            }
            fflush(stdout);
            sweep_free(&s);
        }
    }
}

/* ---- batched decode: each matmul regime at 8..256 tokens ------------------------------------- */

static void run_batch_case(void *p) {
    matmul_case *c = p;
    cpu_matmul_with(&c->w, c->x, c->y, c->n_tokens, cpu_level_supported(CPU_LEVEL_AVX512) ? CPU_LEVEL_AVX512
                                             : cpu_level_supported(CPU_LEVEL_AVX2) ? CPU_LEVEL_AVX2
                                                                                    : CPU_LEVEL_GENERIC,
                    c->engine, c->max_matvec);
}

/* MLX 4-bit g64 on the two Llama-3.2-1B MLP shapes at the token counts of batched decode: the
 * matvec passes (8 tokens per pass), the f32 gemm (dequantized panels) and the MLX int16 gemm,
 * reps interleaved, median GFLOP/s; "auto" is what cpu_matmul picks. */
static void bench_batch(const bench_options *o) {
    static const format_case q4 = {"mlx q4 g64", WEIGHT_MLX_AFFINE, 4, 64, 0, 0};
    int64_t shapes[][2] = {{8192, 2048}, {2048, 8192}};
    int64_t counts[] = {8, 9, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256};
    struct { const char *name; cpu_gemm_engine gemm; int max_matvec; } regimes[] = {
        {"matvec", CPU_GEMM_AUTO, 1 << 20}, {"gemm f32", CPU_GEMM_OWN, 0},
        {"mlx int16", CPU_GEMM_MLX_INT, 0}, {"auto", CPU_GEMM_AUTO, -1}};
    enum { NREG = 4 };
    printf("batched matmul, %s, GFLOP/s (median of %d, regimes interleaved)\n", q4.name, o->reps);
    for (size_t sh = 0; sh < 2; sh++) {
        sweep s;
        if (sweep_alloc(&s, &q4, shapes[sh][0], shapes[sh][1], 1, 256, 1) != 0) {
            fprintf(stderr, "exo bench: out of memory\n");
            return;
        }
        printf("%lldx%-6lld %6s", (long long)shapes[sh][0], (long long)shapes[sh][1], "tokens");
        for (int r = 0; r < NREG; r++) printf(" %10s", regimes[r].name);
        printf("\n");
        for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
            matmul_case c = {.w = sweep_matrix(&s, 0), .x = s.x, .y = s.y, .n_tokens = counts[ci]};
            double t[NREG][64];
            int reps = o->reps > 64 ? 64 : o->reps;
            for (int k = 0; k < reps; k++)
                for (int r = 0; r < NREG; r++) {
                    c.engine = regimes[r].gemm;
                    c.max_matvec = regimes[r].max_matvec;
                    if (k == 0) run_batch_case(&c); /* warm */
                    uint64_t t0 = bench_now_ns();
                    run_batch_case(&c);
                    t[r][k] = seconds(bench_now_ns() - t0);
                }
            double flop = 2.0 * (double)c.w.rows * (double)c.w.cols * (double)c.n_tokens;
            printf("%-13s %6lld", "", (long long)c.n_tokens);
            for (int r = 0; r < NREG; r++) {
                qsort(t[r], (size_t)reps, sizeof(double), cmp_double);
                printf(" %10.1f", flop / t[r][reps / 2] * 1e-9);
            }
            printf("\n");
            fflush(stdout);
        }
        sweep_free(&s);
    }
}

/* ---- command line ---------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr,
            "usage: exo bench [--section mem|pool|gemm|matvec|batch|dist] [--quick] [--reps N] [--threads N]\n"
            "                 [--mem-mib N] [--sweep-mib N] [--cpu-time]\n"
            "                 [--formats q4,bf16] [--tokens 1,2,4,8] [--no-prefill]   (matvec section)\n"
            "       exo bench --model DIR [model options, see exo bench --model DIR --help]\n"
            "       exo bench --section dist [data-plane options, see exo bench --section dist --help]\n");
}

int cmd_bench_main(int argc, char **argv) {
    /* The data plane's section has its own options (src/dist/dist_bench.c). */
    for (int k = 1; k + 1 < argc; k++)
        if (!strcmp(argv[k], "--section") && !strcmp(argv[k + 1], "dist")) return dist_bench_main(argc, argv);
    bench_options o = {.mem_bytes = (size_t)1024 << 20, .reps = 5};
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            o.quick = 1;
        } else if (!strcmp(a, "--section") && v) {
            o.section = v;
            i++;
        } else if (!strcmp(a, "--reps") && v) {
            o.reps = atoi(v);
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            cpu_set_threads(atoi(v));
            i++;
        } else if (!strcmp(a, "--mem-mib") && v) {
            o.mem_bytes = (size_t)atol(v) << 20;
            i++;
        } else if (!strcmp(a, "--cpu-time")) {
            o.cpu_time = 1;
        } else if (!strcmp(a, "--sweep-mib") && v) {
            o.sweep_bytes = (size_t)atol(v) << 20;
            i++;
        } else if (!strcmp(a, "--formats") && v) {
            o.formats = v;
            i++;
        } else if (!strcmp(a, "--tokens") && v) {
            o.n_mv_tokens = 0;
            for (const char *p = v; *p && o.n_mv_tokens < 8;) {
                char *e;
                long n = strtol(p, &e, 10);
                if (e == p || n < 1 || n > CPU_MATVEC_MAX_TOKENS) {
                    fprintf(stderr, "exo bench: --tokens wants numbers 1..%d, comma-separated\n",
                            CPU_MATVEC_MAX_TOKENS);
                    return 2;
                }
                o.mv_tokens[o.n_mv_tokens++] = (int)n;
                p = *e == ',' ? e + 1 : e;
                if (*e && *e != ',') {
                    fprintf(stderr, "exo bench: --tokens: unexpected '%s'\n", e);
                    return 2;
                }
            }
            i++;
        } else if (!strcmp(a, "--no-prefill")) {
            o.no_prefill = 1;
        } else if (!strcmp(a, "--model") && v) {
            o.model_dir = v;
            i += 2;
            break;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "exo bench: unknown argument '%s'\n", a);
            usage();
            return 2;
        }
    }
    if (!o.n_mv_tokens) {
        o.mv_tokens[0] = 1;
        o.mv_tokens[1] = 8;
        o.n_mv_tokens = 2;
    }
    if (o.reps < 1 || o.reps > 64) {
        fprintf(stderr, "exo bench: --reps must be 1..64\n");
        return 2;
    }
    if (o.mem_bytes < ((size_t)1 << 20)) {
        fprintf(stderr, "exo bench: --mem-mib must be at least 1\n");
        return 2;
    }
    if (o.quick && o.mem_bytes == (size_t)1024 << 20) o.mem_bytes = (size_t)64 << 20;
    if (!o.sweep_bytes) o.sweep_bytes = o.quick ? (size_t)64 << 20 : (size_t)1024 << 20;
    if (o.cpu_time) {
        if (cpu_threads() != 1) {
            fprintf(stderr, "exo bench: --cpu-time needs --threads 1 (it reads this thread's CPU clock)\n");
            return 2;
        }
        use_cpu_time = 1;
    }
    for (int j = i; o.model_dir && j + 1 < argc; j++) { /* refuse a device before measuring */
        compute_device dev;
        char derr[256];
        if (!strcmp(argv[j], "--device") && compute_device_check(argv[j + 1], &dev, derr, sizeof derr)) {
            fprintf(stderr, "exo bench: %s\n", derr);
            return 2;
        }
    }
    const char *sec = o.section;
    if (sec && strcmp(sec, "mem") && strcmp(sec, "pool") && strcmp(sec, "gemm") && strcmp(sec, "matvec") &&
        strcmp(sec, "batch")) {
        fprintf(stderr, "exo bench: unknown section '%s' (mem, pool, gemm, matvec, batch)\n", sec);
        return 2;
    }
    printf("exo bench: %d threads, SIMD %s, AMX tiles %s%s\n", threadpool_size(cpu_thread_pool()), cpu_simd_level(),
           cpu_amx_status(), o.quick ? " (quick: small sweeps, numbers not meaningful)" : "");
    fflush(stdout);
    double read_gbs = 0, peak = 0;
    if (o.model_dir || !sec || !strcmp(sec, "mem") || !strcmp(sec, "matvec")) read_gbs = bench_memory(&o);
    if (o.model_dir) return bench_model_main(o.model_dir, argc - i, argv + i, read_gbs);
    if (!sec || !strcmp(sec, "pool")) bench_pool(&o);
    if (!sec || !strcmp(sec, "gemm") || (!strcmp(sec, "matvec") && !o.no_prefill)) peak = bench_gemm(&o);
    if (!sec || !strcmp(sec, "matvec")) bench_matvec(&o, read_gbs, peak);
    if (sec && !strcmp(sec, "batch")) bench_batch(&o);
    return 0;
}
