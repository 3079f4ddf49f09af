/* The CUDA backend's ops against the CPU backend (exact kernels: EXO_CPU_SIMD=avx2) on random
 * inputs: every op the forward pass uses, every weight format, GEMV and GEMM token counts, paged
 * attention over scattered block tables. Skipped, with a message, where there is no GPU or the
 * binary has no CUDA.
 *
 * Tolerances (max |gpu - cpu| / max |cpu| over the output):
 *   GEMV matmuls (<= 8 tokens, or any count with EXO_CUDA_MATMUL=exact), attention, rmsnorm,
 *   rope, silu, MoE: 1e-5 -- float32 throughout, only the summation order differs;
 *   GEMM matmuls (> 8 tokens): 1e-2 -- activations and dequantized weights rounded to bf16
 *   (2^-9 relative each; measured below 4e-3);
 *   attention over prefill runs of 64+ positions (tensor cores, Q and P in the cache's type):
 *   ATT_GEMM_TOL 1e-2 (f16 measured ~1e-3, bf16 ~5e-3); with EXO_CUDA_MATMUL=exact: 1e-5;
 *   embed, kv_write, gather, add, add_row, routing ids: exact.
 * matmul_fused, norm_matmul and rope_kv_write take the tolerance of the ops they fuse; sample: the host
 * sampler's very tokens and top ids, logprobs within 1e-5; the 4-bit tensor-core GEMM
 * (qgemm4): GEMM_TOL, as the cuBLAS path it replaces; the GatedDeltaNet ops (conv1d_causal,
 * gated_delta_rule with both states, rmsnorm_gated, the sigmoid gates): 1e-5, copy: exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "compute/backend.h"
#include "compute/device.h"
#include "infer/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEMV_TOL 1e-5
#define GEMM_TOL 1e-2
#define ATT_GEMM_TOL 1e-2

static compute_backend *cpu, *gpu, *gpu_exact, *gpu_qgemm;
static uint64_t rng = 0x243f6a8885a308d3ull;

static uint32_t rand32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(void) { return (float)rand32() / 4294967296.0f * 2.0f - 1.0f; }
static float *rand_floats(size_t n, float scale) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

/* GPU copy of host bytes (freed by the caller through gpu->free). */
static void *to_gpu(compute_backend *b, const void *host, size_t bytes) {
    void *d = b->alloc(b, bytes);
    assert_non_null(d);
    b->upload(b, d, host, bytes);
    return d;
}

static float *from_gpu(compute_backend *b, const void *dev, size_t floats) {
    float *h = malloc(floats * sizeof *h);
    b->download(b, h, dev, floats * sizeof *h);
    char err[256];
    if (b->status && b->status(b, err, sizeof err)) fail_msg("GPU error: %s", err);
    return h;
}

static double rel_diff(const float *a, const float *ref, size_t n) {
    double md = 0, mr = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        double d = fabs((double)a[i] - ref[i]);
        md = d > md ? d : md;
        mr = fabs(ref[i]) > mr ? fabs(ref[i]) : mr;
    }
    return md / mr;
}

/* ---- weight matrices of every format ------------------------------------------------------ */

typedef struct test_matrix {
    weight_matrix w;
    void *data, *scales, *biases;
} test_matrix;

static void make_matrix(test_matrix *m, weight_format f, int64_t rows, int64_t cols, int bits,
                        int group, dtype sd) {
    memset(m, 0, sizeof *m);
    m->w = (weight_matrix){.format = f, .rows = rows, .cols = cols, .bits = bits,
                           .group_size = group, .scale_dtype = sd};
    size_t n = (size_t)(rows * cols);
    if (f == WEIGHT_MLX_AFFINE) {
        size_t words = n * (size_t)bits / 32, groups = n / (size_t)group;
        uint32_t *q = malloc(words * 4);
        for (size_t i = 0; i < words; i++) q[i] = rand32() ^ (rand32() << 16);
        uint16_t *s = malloc(groups * 4), *b = malloc(groups * 4);
        float *sf = (float *)s, *bf = (float *)b;
        for (size_t g = 0; g < groups; g++) {
            float sv = 0.01f + 0.02f * (frand() + 1), bv = -0.1f * (frand() + 1);
            if (sd == DTYPE_F32) sf[g] = sv, bf[g] = bv;
            else if (sd == DTYPE_F16) s[g] = f32_to_f16(sv), b[g] = f32_to_f16(bv);
            else s[g] = f32_to_bf16(sv), b[g] = f32_to_bf16(bv);
        }
        m->data = q, m->scales = s, m->biases = b;
    } else {
        size_t es = f == WEIGHT_F32 ? 4 : 2;
        uint8_t *d = malloc(n * es);
        for (size_t i = 0; i < n; i++) {
            float v = frand() * 0.1f;
            if (f == WEIGHT_F32) memcpy(d + i * 4, &v, 4);
            else {
                uint16_t h = f == WEIGHT_F16 ? f32_to_f16(v) : f32_to_bf16(v);
                memcpy(d + i * 2, &h, 2);
            }
        }
        m->data = d;
    }
    m->w.data = m->data, m->w.scales = m->scales, m->w.biases = m->biases;
}

/* Weights must outlive the backend that copied them (backend.h: it may key its copies by the
 * host address), so test matrices are released only after the backends, at exit. */
static void *kept[4096];
static int n_kept;

static void free_matrix(test_matrix *m) {
    void *p[3] = {m->data, m->scales, m->biases};
    for (int i = 0; i < 3; i++)
        if (p[i] && n_kept < (int)(sizeof kept / sizeof *kept)) kept[n_kept++] = p[i];
}

/* One matmul on both backends; returns the relative difference. */
static double matmul_diff(compute_backend *g, const weight_matrix *w, int64_t n) {
    float *x = rand_floats((size_t)(n * w->cols), 1.0f);
    float *ref = malloc(sizeof(float) * (size_t)(n * w->rows));
    cpu->matmul(cpu, w, x, ref, n);
    float *dx = to_gpu(g, x, sizeof(float) * (size_t)(n * w->cols));
    float *dy = g->alloc(g, sizeof(float) * (size_t)(n * w->rows));
    g->matmul(g, w, dx, dy, n);
    float *y = from_gpu(g, dy, (size_t)(n * w->rows));
    double d = rel_diff(y, ref, (size_t)(n * w->rows));
    g->free(g, dx);
    g->free(g, dy);
    free(x);
    free(ref);
    free(y);
    return d;
}

#define SKIP_WITHOUT_GPU()                                                           \
    do {                                                                             \
        if (!gpu) {                                                                  \
            print_message("skipped: %s\n", compute_cuda_built() ? "no CUDA GPU here" \
                                                                : "built without CUDA"); \
            skip();                                                                  \
        }                                                                            \
    } while (0)

typedef struct format_case {
    const char *name;
    weight_format f;
    int bits, group;
    dtype sd;
    int64_t rows, cols;
} format_case;

static const format_case formats[] = {
    {"bf16", WEIGHT_BF16, 0, 0, DTYPE_BF16, 300, 512},
    {"f16", WEIGHT_F16, 0, 0, DTYPE_BF16, 129, 256},
    {"f32", WEIGHT_F32, 0, 0, DTYPE_BF16, 67, 132},
    {"bf16 odd cols", WEIGHT_BF16, 0, 0, DTYPE_BF16, 33, 100},
    {"bf16 wide", WEIGHT_BF16, 0, 0, DTYPE_BF16, 45, 2056},      /* 3 slices of x, one partial */
    {"mlx4 g64 wide", WEIGHT_MLX_AFFINE, 4, 64, DTYPE_F16, 67, 4160},
    {"mlx4 g64", WEIGHT_MLX_AFFINE, 4, 64, DTYPE_BF16, 301, 1024},
    {"mlx4 g32 f16", WEIGHT_MLX_AFFINE, 4, 32, DTYPE_F16, 64, 256},
    {"mlx4 g128 f32", WEIGHT_MLX_AFFINE, 4, 128, DTYPE_F32, 70, 512},
    {"mlx8 g64", WEIGHT_MLX_AFFINE, 8, 64, DTYPE_BF16, 130, 512},
    {"mlx3 g64", WEIGHT_MLX_AFFINE, 3, 64, DTYPE_BF16, 40, 256},
    {"mlx6 g32", WEIGHT_MLX_AFFINE, 6, 32, DTYPE_BF16, 41, 128},
    {"mlx2 g64", WEIGHT_MLX_AFFINE, 2, 64, DTYPE_BF16, 17, 256},
    {"mlx5 g32", WEIGHT_MLX_AFFINE, 5, 32, DTYPE_BF16, 19, 256},
};

static void test_matmul_formats(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    static const int64_t tokens[] = {1, 2, 5, 8, 9, 40};
    int failures = 0;
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        const format_case *fc = &formats[i];
        test_matrix m;
        make_matrix(&m, fc->f, fc->rows, fc->cols, fc->bits, fc->group, fc->sd);
        for (size_t k = 0; k < sizeof tokens / sizeof *tokens; k++) {
            int64_t n = tokens[k];
            double d = matmul_diff(gpu, &m.w, n), tol = n > 8 ? GEMM_TOL : GEMV_TOL;
            double de = matmul_diff(gpu_exact, &m.w, n);
            printf("  matmul %-14s %3d x %4d, %2d tokens: %.1e (exact mode %.1e)\n", fc->name,
                   (int)fc->rows, (int)fc->cols, (int)n, d, de);
            if (!(d <= tol) || !(de <= GEMV_TOL)) failures++;
        }
        free_matrix(&m);
    }
    assert_int_equal(failures, 0);
}

/* q/k/v through matmul_multi equal three matmuls. */
static void test_matmul_multi(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    test_matrix m[3];
    for (int i = 0; i < 3; i++) make_matrix(&m[i], WEIGHT_MLX_AFFINE, i ? 64 : 256, 512, 4, 64, DTYPE_BF16);
    for (int n = 1; n <= 12; n += 11) {
        float *x = rand_floats((size_t)n * 512, 1.0f);
        float *dx = to_gpu(gpu, x, sizeof(float) * (size_t)n * 512);
        float *dy[3];
        const weight_matrix *w[3];
        for (int i = 0; i < 3; i++) {
            w[i] = &m[i].w;
            dy[i] = gpu->alloc(gpu, sizeof(float) * (size_t)n * (size_t)m[i].w.rows);
        }
        gpu->matmul_multi(gpu, 3, w, dx, dy, n);
        for (int i = 0; i < 3; i++) {
            size_t cnt = (size_t)n * (size_t)m[i].w.rows;
            float *ref = malloc(cnt * sizeof *ref);
            cpu->matmul(cpu, w[i], x, ref, n);
            float *y = from_gpu(gpu, dy[i], cnt);
            double d = rel_diff(y, ref, cnt);
            printf("  matmul_multi %d of 3, %d tokens: %.1e\n", i, n, d);
            assert_true(d <= (n > 8 ? GEMM_TOL : GEMV_TOL));
            free(ref);
            free(y);
            gpu->free(gpu, dy[i]);
        }
        gpu->free(gpu, dx);
        free(x);
    }
    for (int i = 0; i < 3; i++) free_matrix(&m[i]);
}

static void test_embed(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        const format_case *fc = &formats[i];
        test_matrix m;
        make_matrix(&m, fc->f, fc->rows, fc->cols, fc->bits, fc->group, fc->sd);
        int32_t ids[5] = {0, (int32_t)fc->rows - 1, 3, 3, (int32_t)fc->rows / 2};
        size_t cnt = 5 * (size_t)fc->cols;
        float *ref = malloc(cnt * sizeof *ref);
        cpu->embed(cpu, &m.w, ids, 5, ref);
        int32_t *did = to_gpu(gpu, ids, sizeof ids);
        float *dout = gpu->alloc(gpu, cnt * sizeof(float));
        gpu->embed(gpu, &m.w, did, 5, dout);
        float *out = from_gpu(gpu, dout, cnt);
        double d = rel_diff(out, ref, cnt);
        if (d > 1e-6) printf("  embed %s: %.1e\n", fc->name, d);
        assert_true(d <= 1e-6); /* one multiply-add per value: fma or not */
        gpu->free(gpu, did);
        gpu->free(gpu, dout);
        free(ref);
        free(out);
        free_matrix(&m);
    }
}

/* rmsnorm, add, add_row, silu_mul, rope, gather_rows on one random activation. */
static void test_row_ops(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    int64_t rows = 37, dim = 384, n = rows * dim;
    float *x = rand_floats((size_t)n, 3.0f), *y = rand_floats((size_t)n, 1.0f);
    float *w = rand_floats((size_t)dim, 1.0f), *ref = malloc(sizeof(float) * (size_t)n);
    float *dx = to_gpu(gpu, x, sizeof(float) * (size_t)n), *dy = to_gpu(gpu, y, sizeof(float) * (size_t)n);
    float *dw = to_gpu(gpu, w, sizeof(float) * (size_t)dim);
    float *dout = gpu->alloc(gpu, sizeof(float) * (size_t)n), *out;

    cpu->rmsnorm(cpu, x, w, ref, rows, dim, 1e-6f);
    gpu->rmsnorm(gpu, dx, dw, dout, rows, dim, 1e-6f);
    out = from_gpu(gpu, dout, (size_t)n);
    printf("  rmsnorm: %.1e\n", rel_diff(out, ref, (size_t)n));
    assert_true(rel_diff(out, ref, (size_t)n) <= GEMV_TOL);
    free(out);

    /* per-head norm, as qk_norm calls it: rows of head_dim, in place */
    memcpy(ref, x, sizeof(float) * (size_t)n);
    cpu->rmsnorm(cpu, ref, w, ref, n / 64, 64, 1e-6f);
    float *dxx = to_gpu(gpu, x, sizeof(float) * (size_t)n);
    gpu->rmsnorm(gpu, dxx, dw, dxx, n / 64, 64, 1e-6f);
    out = from_gpu(gpu, dxx, (size_t)n);
    assert_true(rel_diff(out, ref, (size_t)n) <= GEMV_TOL);
    free(out);

    memcpy(ref, x, sizeof(float) * (size_t)n);
    cpu->add(cpu, ref, y, n);
    cpu->add_row(cpu, ref, w, rows, dim);
    gpu->upload(gpu, dxx, x, sizeof(float) * (size_t)n);
    gpu->add(gpu, dxx, dy, n);
    gpu->add_row(gpu, dxx, dw, rows, dim);
    out = from_gpu(gpu, dxx, (size_t)n);
    assert_true(rel_diff(out, ref, (size_t)n) == 0);
    free(out);

    memcpy(ref, x, sizeof(float) * (size_t)n);
    cpu->silu_mul(cpu, ref, y, n);
    gpu->upload(gpu, dxx, x, sizeof(float) * (size_t)n);
    gpu->silu_mul(gpu, dxx, dy, n);
    out = from_gpu(gpu, dxx, (size_t)n);
    printf("  silu_mul: %.1e\n", rel_diff(out, ref, (size_t)n));
    assert_true(rel_diff(out, ref, (size_t)n) <= GEMV_TOL);
    free(out);

    /* rope: 37 tokens of 6 heads of 64 dims, 48 of them rotated, positions up to 40000 */
    int32_t pos[37];
    for (int i = 0; i < 37; i++) pos[i] = (int32_t)(rand32() % 40000);
    float inv[24];
    for (int i = 0; i < 24; i++) inv[i] = powf(10000.0f, -(float)(2 * i) / 48.0f);
    int32_t *dpos = to_gpu(gpu, pos, sizeof pos);
    float *dinv = to_gpu(gpu, inv, sizeof inv);
    memcpy(ref, x, sizeof(float) * (size_t)n);
    cpu->rope(cpu, ref, pos, rows, 6, 64, 48, inv, 1.25f);
    gpu->upload(gpu, dxx, x, sizeof(float) * (size_t)n);
    gpu->rope(gpu, dxx, dpos, rows, 6, 64, 48, dinv, 1.25f);
    out = from_gpu(gpu, dxx, (size_t)n);
    printf("  rope: %.1e\n", rel_diff(out, ref, (size_t)n));
    assert_true(rel_diff(out, ref, (size_t)n) <= GEMV_TOL);
    free(out);

    int32_t sel[4] = {36, 0, 5, 5};
    int32_t *dsel = to_gpu(gpu, sel, sizeof sel);
    cpu->gather_rows(cpu, x, sel, 4, dim, ref);
    gpu->gather_rows(gpu, dx, dsel, 4, dim, dout);
    out = from_gpu(gpu, dout, 4 * (size_t)dim);
    assert_true(rel_diff(out, ref, 4 * (size_t)dim) == 0);
    free(out);

    void *bufs[] = {dx, dy, dw, dout, dxx, dpos, dinv, dsel};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->free(gpu, bufs[i]);
    free(x), free(y), free(w), free(ref);
}

/* A paged cache with blocks in scrambled order; a batch mixing decode tokens of several
 * sequences with a prefill run of one. Compares kv_write (bit for bit) and attention. */
/* window > 0 and sinks: gpt-oss's sliding window and per-head sink logits */
static void attention_case(dtype type, int n_heads, int n_kv, int hd, int n_seqs, int prefill, int window,
                           int sinks) {
    int bs = 16, max_ctx = 300, blocks_per_seq = (max_ctx + bs - 1) / bs;
    int n_blocks = n_seqs * blocks_per_seq;
    int64_t kv_dim = (int64_t)n_kv * hd, slots = (int64_t)n_blocks * bs;
    size_t es = dtype_size(type), cache_bytes = (size_t)slots * (size_t)kv_dim * es;
    /* block tables: a permutation of all blocks */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rand32() % (uint32_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int32_t *start = malloc(sizeof(int32_t) * (size_t)n_seqs);
    for (int s = 0; s < n_seqs; s++) start[s] = s * blocks_per_seq;
    /* the cache holds random history for every sequence (written through kv_write below) */
    int n_tok = (n_seqs - 1) + prefill;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_tok), *seq = malloc(sizeof(int32_t) * (size_t)n_tok);
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)n_tok);
    int t = 0;
    for (int s = 0; s < n_seqs - 1; s++, t++) {
        seq[t] = s;
        pos[t] = (int32_t)(rand32() % (uint32_t)max_ctx);
    }
    int p0 = (int)(rand32() % (uint32_t)(max_ctx - prefill));
    for (int i = 0; i < prefill; i++, t++) seq[t] = n_seqs - 1, pos[t] = p0 + i;
    for (t = 0; t < n_tok; t++)
        slot[t] = perm[start[seq[t]] + pos[t] / bs] * bs + pos[t] % bs;
    /* history: every slot random */
    float *hk = rand_floats((size_t)(slots * kv_dim), 1.0f), *hv = rand_floats((size_t)(slots * kv_dim), 1.0f);
    int32_t *all = malloc(sizeof(int32_t) * (size_t)slots);
    for (int64_t i = 0; i < slots; i++) all[i] = (int32_t)i;
    void *ck = calloc(1, cache_bytes), *cv = calloc(1, cache_bytes);
    kv_layer ckv = {.k = ck, .v = cv, .type = type};
    cpu->kv_write(cpu, &ckv, hk, hv, all, slots, kv_dim);
    void *gk = gpu->alloc(gpu, cache_bytes), *gv = gpu->alloc(gpu, cache_bytes);
    kv_layer gkv = {.k = gk, .v = gv, .type = type};
    float *dhk = to_gpu(gpu, hk, sizeof(float) * (size_t)(slots * kv_dim));
    float *dhv = to_gpu(gpu, hv, sizeof(float) * (size_t)(slots * kv_dim));
    int32_t *dall = to_gpu(gpu, all, sizeof(int32_t) * (size_t)slots);
    gpu->kv_write(gpu, &gkv, dhk, dhv, dall, slots, kv_dim);
    void *back = malloc(cache_bytes);
    gpu->download(gpu, back, gk, cache_bytes);
    assert_memory_equal(back, ck, cache_bytes);
    /* this batch's new K/V at its slots, then attention */
    float *nk = rand_floats((size_t)(n_tok * kv_dim), 1.0f), *nv = rand_floats((size_t)(n_tok * kv_dim), 1.0f);
    float *q = rand_floats((size_t)n_tok * (size_t)(n_heads * hd), 1.0f);
    cpu->kv_write(cpu, &ckv, nk, nv, slot, n_tok, kv_dim);
    float *dnk = to_gpu(gpu, nk, sizeof(float) * (size_t)(n_tok * kv_dim));
    float *dnv = to_gpu(gpu, nv, sizeof(float) * (size_t)(n_tok * kv_dim));
    int32_t *dslot = to_gpu(gpu, slot, sizeof(int32_t) * (size_t)n_tok);
    gpu->kv_write(gpu, &gkv, dnk, dnv, dslot, n_tok, kv_dim);
    gpu->download(gpu, back, gv, cache_bytes);
    assert_memory_equal(back, cv, cache_bytes);
    attention_batch ab = {.n_tokens = n_tok, .positions = pos, .seq_of_token = seq,
                          .block_table_start = start, .block_tables = perm, .block_size = bs,
                          .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd,
                          .scale = 1.0f / sqrtf((float)hd), .window = window,
                          .sinks = sinks ? rand_floats((size_t)n_heads, 3.0f) : NULL};
    size_t out_n = (size_t)n_tok * (size_t)(n_heads * hd);
    float *ref = malloc(out_n * sizeof *ref);
    cpu->attention(cpu, q, &ckv, &ab, ref);
    attention_batch gab = ab;
    gab.positions = to_gpu(gpu, pos, sizeof(int32_t) * (size_t)n_tok);
    gab.seq_of_token = to_gpu(gpu, seq, sizeof(int32_t) * (size_t)n_tok);
    gab.block_table_start = to_gpu(gpu, start, sizeof(int32_t) * (size_t)n_seqs);
    gab.block_tables = to_gpu(gpu, perm, sizeof(int32_t) * (size_t)n_blocks);
    gab.host_positions = pos, gab.host_seq_of_token = seq, gab.host_block_table_start = start;
    gab.sinks = sinks ? to_gpu(gpu, ab.sinks, sizeof(float) * (size_t)n_heads) : NULL;
    float *dq = to_gpu(gpu, q, out_n * sizeof(float));
    float *dout = gpu->alloc(gpu, out_n * sizeof(float));
    gpu->attention(gpu, dq, &gkv, &gab, dout);
    float *out = from_gpu(gpu, dout, out_n);
    double d = rel_diff(out, ref, out_n);
    gpu_exact->attention(gpu_exact, dq, &gkv, &gab, dout); /* the same memory: one stream each, */
    float *out_exact = from_gpu(gpu_exact, dout, out_n);   /* but from_gpu waited for gpu's */
    double de = rel_diff(out_exact, ref, out_n);
    printf("  attention %s heads %d/%d dim %d, %d decode + %d prefill tokens%s: %.1e (exact mode "
           "%.1e)\n", dtype_name(type), n_heads, n_kv, hd, n_seqs - 1, prefill,
           window || sinks ? " (gpt-oss window/sinks)" : "", d, de);
    assert_true(d <= (prefill >= 64 ? ATT_GEMM_TOL : GEMV_TOL));
    assert_true(de <= GEMV_TOL);
    free(out_exact);
    void *bufs[] = {gk, gv, dhk, dhv, dall, dnk, dnv, dslot, (void *)gab.positions,
                    (void *)gab.seq_of_token, (void *)gab.block_table_start,
                    (void *)gab.block_tables, dq, dout, (void *)gab.sinks};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->free(gpu, bufs[i]);
    void *hb[] = {perm, start, pos, seq, slot, hk, hv, all, ck, cv, back, nk, nv, q, ref, out, (void *)ab.sinks};
    for (size_t i = 0; i < sizeof hb / sizeof *hb; i++) free(hb[i]);
}

static void test_attention(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    attention_case(DTYPE_F16, 32, 8, 128, 4, 70, 0, 0);  /* llama-8B heads: decode split + prefill */
    attention_case(DTYPE_BF16, 16, 8, 64, 3, 1, 0, 0);
    attention_case(DTYPE_F32, 4, 2, 16, 2, 33, 0, 0);    /* the tiny models' heads */
    attention_case(DTYPE_F16, 16, 1, 32, 2, 5, 0, 0);    /* 16 query heads per KV head: two passes */
    attention_case(DTYPE_F32, 6, 3, 12, 3, 9, 0, 0);     /* head_dim not a multiple of 8 */
    attention_case(DTYPE_F16, 8, 4, 256, 1, 280, 0, 0);  /* head_dim 256, long prefill */
    attention_case(DTYPE_F32, 4, 2, 256, 3, 9, 0, 0);    /* f32 rows of 1 KB: one tile buffer */
    /* gpt-oss: 64 heads / 8 KV heads of 64 dims, window 128, sinks; decode splits and prefill */
    attention_case(DTYPE_BF16, 64, 8, 64, 4, 100, 128, 1);
    attention_case(DTYPE_F32, 4, 2, 16, 3, 9, 4, 1);     /* the tiny gpt-oss model */
    attention_case(DTYPE_F16, 8, 2, 64, 3, 70, 0, 1);    /* full-attention layers: sinks only */
}

static void test_moe(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    int ne = 8, k = 2;
    int64_t n = 5, dim = 128, inter = 64;
    float *logits = rand_floats((size_t)(n * ne), 2.0f);
    int32_t cid[10], *gid = NULL;
    float cw[10];
    for (int norm = 0; norm < 2; norm++) {
        cpu->moe_route(cpu, logits, n, ne, k, norm, cid, cw);
        float *dl = to_gpu(gpu, logits, sizeof(float) * (size_t)(n * ne));
        int32_t *did = gpu->alloc(gpu, sizeof cid);
        float *dw = gpu->alloc(gpu, sizeof cw);
        gpu->moe_route(gpu, dl, n, ne, k, norm, did, dw);
        float *w = from_gpu(gpu, dw, 10);
        gid = malloc(sizeof cid);
        gpu->download(gpu, gid, did, sizeof cid);
        assert_memory_equal(gid, cid, sizeof cid);
        assert_true(rel_diff(w, cw, 10) <= GEMV_TOL);
        for (int fmt = 0; fmt < 3; fmt++) { /* bf16; MLX 4-bit; gpt-oss (MLX 8-bit g32, biases, clamp) */
            test_matrix g[8], u[8], d[8];
            weight_matrix gw[8], uw[8], dwm[8];
            for (int e = 0; e < ne; e++) {
                if (fmt == 2) {
                    make_matrix(&g[e], WEIGHT_MLX_AFFINE, inter, dim, 8, 32, DTYPE_BF16);
                    make_matrix(&u[e], WEIGHT_MLX_AFFINE, inter, dim, 8, 32, DTYPE_BF16);
                    make_matrix(&d[e], WEIGHT_MLX_AFFINE, dim, inter, 8, 32, DTYPE_BF16);
                } else if (fmt) {
                    make_matrix(&g[e], WEIGHT_MLX_AFFINE, inter, dim, 4, 64, DTYPE_BF16);
                    make_matrix(&u[e], WEIGHT_MLX_AFFINE, inter, dim, 4, 64, DTYPE_BF16);
                    make_matrix(&d[e], WEIGHT_MLX_AFFINE, dim, inter, 4, 64, DTYPE_BF16);
                } else {
                    make_matrix(&g[e], WEIGHT_BF16, inter, dim, 0, 0, DTYPE_BF16);
                    make_matrix(&u[e], WEIGHT_BF16, inter, dim, 0, 0, DTYPE_BF16);
                    make_matrix(&d[e], WEIGHT_BF16, dim, inter, 0, 0, DTYPE_BF16);
                }
                gw[e] = g[e].w, uw[e] = u[e].w, dwm[e] = d[e].w;
            }
            moe_experts ex = {.n_experts = ne, .dim = dim, .inter = inter, .gate = gw, .up = uw,
                              .down = dwm};
            float *bias[3] = {NULL, NULL, NULL};
            moe_experts gex = ex;
            if (fmt == 2) { /* limit 0.5: random weights reach it */
                bias[0] = rand_floats((size_t)(ne * inter), 0.5f), bias[1] = rand_floats((size_t)(ne * inter), 0.5f);
                bias[2] = rand_floats((size_t)(ne * dim), 0.5f);
                ex.gate_bias = bias[0], ex.up_bias = bias[1], ex.down_bias = bias[2];
                ex.swiglu_limit = 0.5f, ex.swiglu_alpha = 1.702f;
                gex = ex;
                gex.gate_bias = to_gpu(gpu, bias[0], sizeof(float) * (size_t)(ne * inter));
                gex.up_bias = to_gpu(gpu, bias[1], sizeof(float) * (size_t)(ne * inter));
                gex.down_bias = to_gpu(gpu, bias[2], sizeof(float) * (size_t)(ne * dim));
            }
            float *x = rand_floats((size_t)(n * dim), 1.0f), *ref = malloc(sizeof(float) * (size_t)(n * dim));
            cpu->moe_ffn(cpu, &ex, x, n, cid, cw, k, ref);
            float *dx = to_gpu(gpu, x, sizeof(float) * (size_t)(n * dim));
            float *dout = gpu->alloc(gpu, sizeof(float) * (size_t)(n * dim));
            gpu->moe_ffn(gpu, &gex, dx, n, did, dw, k, dout);
            float *out = from_gpu(gpu, dout, (size_t)(n * dim));
            double diff = rel_diff(out, ref, (size_t)(n * dim));
            printf("  moe_ffn %s norm %d: %.1e\n", fmt == 2 ? "gpt-oss mlx8" : fmt ? "mlx4" : "bf16", norm, diff);
            if (fmt == 2) {
                gpu->free(gpu, (void *)gex.gate_bias), gpu->free(gpu, (void *)gex.up_bias);
                gpu->free(gpu, (void *)gex.down_bias);
                free(bias[0]), free(bias[1]), free(bias[2]);
            }
            assert_true(diff <= GEMV_TOL);
            gpu->free(gpu, dx);
            gpu->free(gpu, dout);
            free(x), free(ref), free(out);
            for (int e = 0; e < ne; e++) free_matrix(&g[e]), free_matrix(&u[e]), free_matrix(&d[e]);
        }
        gpu->free(gpu, dl);
        gpu->free(gpu, did);
        gpu->free(gpu, dw);
        free(w);
        free(gid);
    }
    free(logits);
}

/* One matmul_fused call on backend g against the plain ops on the CPU: silu_mul (with_up),
 * matmul, add (accumulate). Returns the relative difference. */
static double fused_diff(compute_backend *g, const weight_matrix *w, int64_t n, int with_up,
                         int accumulate) {
    size_t nx = (size_t)(n * w->cols), ny = (size_t)(n * w->rows);
    float *x = rand_floats(nx, 2.0f), *up = rand_floats(nx, 1.0f);
    float *y0 = rand_floats(ny, 1.0f), *ref = malloc(ny * sizeof *ref);
    float *xr = malloc(nx * sizeof *xr);
    memcpy(xr, x, nx * sizeof *xr);
    if (with_up) cpu->silu_mul(cpu, xr, up, (int64_t)nx);
    cpu->matmul(cpu, w, xr, ref, n);
    if (accumulate) cpu->add(cpu, ref, y0, (int64_t)ny);
    float *dx = to_gpu(g, x, nx * sizeof *x), *dup = to_gpu(g, up, nx * sizeof *up);
    float *dy = to_gpu(g, y0, ny * sizeof *y0);
    g->matmul_fused(g, w, dx, with_up ? dup : NULL, dy, n, accumulate);
    float *y = from_gpu(g, dy, ny);
    double d = rel_diff(y, ref, ny);
    g->free(g, dx), g->free(g, dup), g->free(g, dy);
    free(x), free(up), free(y0), free(ref), free(xr), free(y);
    return d;
}

/* matmul_fused against the plain ops on the CPU: silu_mul (when up is given), matmul, add (when
 * accumulating), for every kind of GEMV kernel (the persistent one for 4-bit/bf16/f16/f32 at up
 * to 4 tokens, the older blocks for 8-bit and the per-element path, the GEMM path past 8
 * tokens; 4-bit group 64 at one token: the cp.async pipeline). The first 4-bit matrix has more
 * rows than one pass of either grid covers (264 or 132 blocks x 8 warps x 4 rows on an H200), so
 * warps walk several tiles; 2560 columns leave the pipeline's last round a partial one. */
static void test_matmul_fused(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    static const format_case cases[] = {
        {"mlx4 g64 tall", WEIGHT_MLX_AFFINE, 4, 64, DTYPE_BF16, 9000, 1024},
        {"mlx4 g64 f16", WEIGHT_MLX_AFFINE, 4, 64, DTYPE_F16, 1030, 2560},
        {"mlx4 g32 f16", WEIGHT_MLX_AFFINE, 4, 32, DTYPE_F16, 130, 4096},
        {"bf16", WEIGHT_BF16, 0, 0, DTYPE_BF16, 600, 2048},
        {"f16", WEIGHT_F16, 0, 0, DTYPE_BF16, 70, 512},
        {"f32", WEIGHT_F32, 0, 0, DTYPE_BF16, 67, 256},
        {"mlx8 g64", WEIGHT_MLX_AFFINE, 8, 64, DTYPE_BF16, 130, 512},
        {"mlx3 g64", WEIGHT_MLX_AFFINE, 3, 64, DTYPE_BF16, 40, 256},
    };
    static const int64_t tokens[] = {1, 2, 3, 4, 5, 12};
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const format_case *fc = &cases[i];
        test_matrix m;
        make_matrix(&m, fc->f, fc->rows, fc->cols, fc->bits, fc->group, fc->sd);
        for (size_t k = 0; k < sizeof tokens / sizeof *tokens; k++) {
            int64_t n = tokens[k];
            for (int variant = 0; variant < 3; variant++) { /* up+acc, up alone, acc alone */
                int with_up = variant < 2, accumulate = variant != 1;
                double d = fused_diff(gpu, &m.w, n, with_up, accumulate);
                if (!(d <= (n > 8 ? GEMM_TOL : GEMV_TOL))) {
                    printf("  matmul_fused %-14s %5d x %4d, %2d tokens, up %d acc %d: %.1e FAILED\n",
                           fc->name, (int)fc->rows, (int)fc->cols, (int)n, with_up, accumulate, d);
                    failures++;
                }
            }
        }
        free_matrix(&m);
    }
    assert_int_equal(failures, 0);
}

/* rope_kv_write equals rope on q, rope on k, kv_write of k and v (bit for bit in the cache). */
static void test_rope_kv_write(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    static const dtype types[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    int64_t n = 19, nh = 8, nkv = 2, hd = 64, rot = 48, slots = 64, kv_dim = nkv * hd;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        size_t es = dtype_size(types[ti]), cache_bytes = (size_t)(slots * kv_dim) * es;
        float *q = rand_floats((size_t)(n * nh * hd), 2.0f), *k = rand_floats((size_t)(n * kv_dim), 2.0f);
        float *v = rand_floats((size_t)(n * kv_dim), 2.0f);
        int32_t pos[19], slot[19];
        for (int i = 0; i < 19; i++) pos[i] = (int32_t)(rand32() % 30000), slot[i] = (int32_t)(63 - 3 * i);
        float inv[24];
        for (int i = 0; i < 24; i++) inv[i] = powf(500000.0f, -(float)(2 * i) / 48.0f);
        void *ck = calloc(1, cache_bytes), *cv = calloc(1, cache_bytes);
        kv_layer ckv = {.k = ck, .v = cv, .type = types[ti]};
        float *rq = malloc(sizeof(float) * (size_t)(n * nh * hd)), *rk = malloc(sizeof(float) * (size_t)(n * kv_dim));
        memcpy(rq, q, sizeof(float) * (size_t)(n * nh * hd));
        memcpy(rk, k, sizeof(float) * (size_t)(n * kv_dim));
        cpu->rope(cpu, rq, pos, n, (int)nh, (int)hd, (int)rot, inv, 0.9f);
        cpu->rope(cpu, rk, pos, n, (int)nkv, (int)hd, (int)rot, inv, 0.9f);
        cpu->kv_write(cpu, &ckv, rk, v, slot, n, kv_dim);
        float *dq = to_gpu(gpu, q, sizeof(float) * (size_t)(n * nh * hd));
        float *dk = to_gpu(gpu, k, sizeof(float) * (size_t)(n * kv_dim));
        float *dv = to_gpu(gpu, v, sizeof(float) * (size_t)(n * kv_dim));
        int32_t *dpos = to_gpu(gpu, pos, sizeof pos), *dslot = to_gpu(gpu, slot, sizeof slot);
        float *dinv = to_gpu(gpu, inv, sizeof inv);
        void *gk = gpu->alloc(gpu, cache_bytes), *gv = gpu->alloc(gpu, cache_bytes);
        kv_layer gkv = {.k = gk, .v = gv, .type = types[ti]};
        gpu->rope_kv_write(gpu, dq, dk, dv, dpos, n, (int)nh, (int)nkv, (int)hd, (int)rot, dinv, 0.9f,
                           &gkv, dslot);
        float *oq = from_gpu(gpu, dq, (size_t)(n * nh * hd)), *ok = from_gpu(gpu, dk, (size_t)(n * kv_dim));
        printf("  rope_kv_write %s: q %.1e k %.1e\n", dtype_name(types[ti]),
               rel_diff(oq, rq, (size_t)(n * nh * hd)), rel_diff(ok, rk, (size_t)(n * kv_dim)));
        assert_true(rel_diff(oq, rq, (size_t)(n * nh * hd)) <= GEMV_TOL);
        assert_true(rel_diff(ok, rk, (size_t)(n * kv_dim)) <= GEMV_TOL);
        /* the cache holds what kv_write stores for these very k (the GPU's own roped k) */
        cpu->kv_write(cpu, &ckv, ok, v, slot, n, kv_dim);
        void *back = malloc(cache_bytes);
        gpu->download(gpu, back, gk, cache_bytes);
        assert_memory_equal(back, ck, cache_bytes);
        gpu->download(gpu, back, gv, cache_bytes);
        assert_memory_equal(back, cv, cache_bytes);
        void *bufs[] = {dq, dk, dv, dpos, dslot, dinv, gk, gv};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->free(gpu, bufs[i]);
        free(q), free(k), free(v), free(ck), free(cv), free(rq), free(rk), free(oq), free(ok), free(back);
    }
}

/* The sample op against sampler_sample on the same logits and the same draws: greedy (ties to
 * the lower id, banned ids skipped), logprobs and top alternatives, and temperature with every
 * truncation (top_k, top_p, min_p, none), on rows wide enough for the real vocabulary. */
static void test_sample(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    typedef struct sample_case {
        const char *name;
        float temperature, top_p, min_p;
        int top_k, logprobs, top_logprobs;
    } sample_case;
    static const sample_case cases[] = {
        {"greedy", 0, 1, 0, 0, 0, 0},           {"greedy+logprobs", 0, 1, 0, 0, 1, 5},
        {"t0.7 min_p (defaults)", 0.7f, 1, 0.05f, 0, 0, 0},
        {"t1 top_k 40", 1, 1, 0, 40, 1, 3},    {"t0.8 top_p 0.9", 0.8f, 0.9f, 0, 0, 1, 0},
        {"t1.3 k50 p0.95 minp", 1.3f, 0.95f, 0.02f, 50, 0, 20},
        {"t2 no truncation", 2, 1, 0, 0, 1, 1}, {"t1 top_p 0", 1, 0, 0, 0, 0, 0},
    };
    const int rows = 6, vocab = 151936;
    int32_t banned[3] = {7, 151935, 12};
    size_t n = (size_t)rows * vocab;
    float *logits = malloc(n * sizeof *logits), *work = malloc((size_t)vocab * sizeof *work);
    sampler_scratch scratch;
    assert_int_equal(sampler_scratch_init(&scratch, vocab), 0);
    int mismatches = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const sample_case *c = &cases[ci];
        for (size_t i = 0; i < n; i++) logits[i] = frand() * 6.0f;
        logits[50] = logits[100] = 9.0f; /* row 0: a tie for the maximum */
        logits[(size_t)vocab + 7] = 20.0f; /* row 1: the maximum is banned */
        float *dl = to_gpu(gpu, logits, n * sizeof *logits);
        sampling_params sp = sampling_params_default();
        sp.temperature = c->temperature, sp.top_p = c->top_p, sp.min_p = c->min_p;
        sp.top_k = c->top_k, sp.logprobs = c->logprobs, sp.top_logprobs = c->top_logprobs;
        sample_params gp[6];
        sample_result gr[6];
        sampler_rng rng_cpu, rng_gpu;
        sampler_rng_seed(&rng_cpu, 1000 + ci);
        sampler_rng_seed(&rng_gpu, 1000 + ci);
        for (int r = 0; r < rows; r++)
            gp[r] = (sample_params){.temperature = c->temperature, .top_k = c->top_k,
                                    .top_p = c->top_p, .min_p = c->min_p, .logprob = c->logprobs,
                                    .n_top = c->top_logprobs,
                                    .uniform = c->temperature > 0 ? sampler_rng_uniform(&rng_gpu) : 0,
                                    .banned = r == 1 ? banned : NULL, .n_banned = r == 1 ? 3 : 0};
        assert_int_equal(gpu->sample(gpu, dl, rows, vocab, gp, gr), 0);
        for (int r = 0; r < rows; r++) {
            memcpy(work, logits + (size_t)r * vocab, (size_t)vocab * sizeof *work);
            sampler_input in = {.params = &sp, .banned = r == 1 ? banned : NULL, .n_banned = r == 1 ? 3 : 0};
            sampler_result cr;
            sampler_sample(&scratch, work, &in, &rng_cpu, &cr);
            int ok = cr.token == gr[r].token && fabsf(cr.logprob - gr[r].logprob) <= 1e-5f &&
                     cr.n_top == gr[r].n_top;
            for (int j = 0; ok && j < cr.n_top; j++)
                ok = cr.top_ids[j] == gr[r].top_ids[j] &&
                     fabsf(cr.top_logprobs[j] - gr[r].top_logprobs[j]) <= 1e-5f;
            if (!ok) {
                printf("  sample %-22s row %d: cpu %d (%.6f, %d top) gpu %d (%.6f, %d top)\n", c->name,
                       r, cr.token, cr.logprob, cr.n_top, gr[r].token, gr[r].logprob, gr[r].n_top);
                mismatches++;
            }
            if (r == 0 && c->temperature <= 0) assert_int_equal(gr[r].token, 50);
            if (r == 1) assert_int_not_equal(gr[r].token, 7);
        }
        gpu->free(gpu, dl);
    }
    sampler_scratch_free(&scratch);
    free(logits), free(work);
    assert_int_equal(mismatches, 0);
}

/* The 4-bit tensor-core GEMM (decode batches of 9..256 tokens; EXO_CUDA_QGEMM=0 turns it off, the
 * backend below has it on explicitly) against the CPU: group sizes 32/64/128 with bf16, f16 and
 * f32 scales, row counts that are not a multiple of its 128-row blocks, one and several row
 * blocks, k split across blocks (partial sums) or not, 9..256 tokens (the 16-, 32- and 64-token
 * tiles, a partial last tile, several tiles), accumulating or not. Matrices are at least 2^22
 * weights (smaller ones take SGEMM, not the tensor cores). The last case has 4160 columns, not
 * a multiple of the kernel's 128-column stages: it must fall back to the cuBLAS copy path. */
static void test_qgemm(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    static const format_case cases[] = {
        {"mlx4 g64", WEIGHT_MLX_AFFINE, 4, 64, DTYPE_BF16, 4096, 1024},
        {"mlx4 g64 tall", WEIGHT_MLX_AFFINE, 4, 64, DTYPE_BF16, 9000, 512},
        {"mlx4 g32 bf16", WEIGHT_MLX_AFFINE, 4, 32, DTYPE_BF16, 1100, 4096},
        {"mlx4 g128 bf16", WEIGHT_MLX_AFFINE, 4, 128, DTYPE_BF16, 1030, 4096},
        {"mlx4 g32 f16", WEIGHT_MLX_AFFINE, 4, 32, DTYPE_F16, 2100, 2048},
        {"mlx4 g128 f32", WEIGHT_MLX_AFFINE, 4, 128, DTYPE_F32, 1037, 4096},
        {"mlx4 g64 f16 4160", WEIGHT_MLX_AFFINE, 4, 64, DTYPE_F16, 1030, 4160},
    };
    static const int64_t tokens[] = {9, 17, 40, 64, 100, 256};
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const format_case *fc = &cases[i];
        test_matrix m;
        make_matrix(&m, fc->f, fc->rows, fc->cols, fc->bits, fc->group, fc->sd);
        for (size_t k = 0; k < sizeof tokens / sizeof *tokens; k++) {
            int64_t n = tokens[k];
            for (int variant = 0; variant < 2; variant++) { /* silu + accumulate, plain */
                double d = fused_diff(gpu_qgemm, &m.w, n, !variant, !variant);
                printf("  qgemm %-17s %5d x %4d, %3d tokens, %s: %.1e\n", fc->name, (int)fc->rows,
                       (int)fc->cols, (int)n, variant ? "plain" : "silu+acc", d);
                if (!(d <= GEMM_TOL)) failures++;
            }
        }
        free_matrix(&m);
    }
    assert_int_equal(failures, 0);
}

/* Several 4-bit matrices in one qgemm4 launch (q/k/v: row blocks of different matrices, split k)
 * equal each matrix on the CPU; a bf16 matrix among them takes cuBLAS beside the launch. */
static void test_qgemm_multi(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    enum { COLS = 4096 };
    static const int64_t rows[4] = {1152, 1030, 1030, 1100};
    test_matrix m[4];
    const weight_matrix *w[4];
    for (int i = 0; i < 4; i++) {
        make_matrix(&m[i], i == 3 ? WEIGHT_BF16 : WEIGHT_MLX_AFFINE, rows[i], COLS, 4, 64, DTYPE_BF16);
        w[i] = &m[i].w;
    }
    int failures = 0;
    for (int n = 17; n <= 100; n += 83) {
        for (int nm = 3; nm <= 4; nm++) {
            float *x = rand_floats((size_t)n * COLS, 1.0f);
            float *dx = to_gpu(gpu_qgemm, x, sizeof(float) * (size_t)n * COLS);
            float *dy[4];
            for (int i = 0; i < nm; i++) dy[i] = gpu_qgemm->alloc(gpu_qgemm, sizeof(float) * (size_t)n * (size_t)rows[i]);
            gpu_qgemm->matmul_multi(gpu_qgemm, nm, w, dx, dy, n);
            for (int i = 0; i < nm; i++) {
                size_t cnt = (size_t)n * (size_t)rows[i];
                float *ref = malloc(cnt * sizeof *ref);
                cpu->matmul(cpu, w[i], x, ref, n);
                float *y = from_gpu(gpu_qgemm, dy[i], cnt);
                double d = rel_diff(y, ref, cnt);
                printf("  qgemm multi %d of %d, %3d tokens: %.1e\n", i, nm, n, d);
                if (!(d <= GEMM_TOL)) failures++;
                free(ref), free(y);
                gpu_qgemm->free(gpu_qgemm, dy[i]);
            }
            gpu_qgemm->free(gpu_qgemm, dx);
            free(x);
        }
    }
    for (int i = 0; i < 4; i++) free_matrix(&m[i]);
    assert_int_equal(failures, 0);
}

/* norm_matmul against rmsnorm then matmul on the CPU: q/k/v-like (3 matrices) and gate/up-like
 * (2), fused into the persistent GEMV at 1-4 tokens, the plain ops past that. */
static void test_norm_matmul(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    static const format_case cases[] = {
        {"mlx4 g64", WEIGHT_MLX_AFFINE, 4, 64, DTYPE_BF16, 300, 1024},
        {"bf16", WEIGHT_BF16, 0, 0, DTYPE_BF16, 260, 768},
        /* several 1024-column slices, the last one partial (the one-token kernel's warps) */
        {"mlx4 g64 wide", WEIGHT_MLX_AFFINE, 4, 64, DTYPE_F16, 130, 4160},
        {"bf16 wide", WEIGHT_BF16, 0, 0, DTYPE_BF16, 70, 2056},
    };
    static const int64_t tokens[] = {1, 2, 4, 5, 12};
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const format_case *fc = &cases[i];
        test_matrix m[3];
        const weight_matrix *w[3];
        for (int j = 0; j < 3; j++) {
            make_matrix(&m[j], fc->f, fc->rows / (j ? 2 : 1), fc->cols, fc->bits, fc->group, fc->sd);
            w[j] = &m[j].w;
        }
        float *nw = rand_floats((size_t)fc->cols, 1.0f), *dnw = to_gpu(gpu, nw, sizeof(float) * (size_t)fc->cols);
        for (size_t k = 0; k < sizeof tokens / sizeof *tokens; k++) {
            int64_t n = tokens[k];
            for (int nm = 2; nm <= 3; nm++) {
                size_t nx = (size_t)(n * fc->cols);
                float *x = rand_floats(nx, 3.0f), *xn = malloc(nx * sizeof *xn);
                cpu->rmsnorm(cpu, x, nw, xn, n, fc->cols, 1e-5f);
                float *dx = to_gpu(gpu, x, nx * sizeof *x), *dxn = gpu->alloc(gpu, nx * sizeof *x);
                float *dys[3];
                for (int j = 0; j < nm; j++) dys[j] = gpu->alloc(gpu, sizeof(float) * (size_t)(n * w[j]->rows));
                gpu->norm_matmul(gpu, dx, dnw, 1e-5f, dxn, nm, w, dys, n);
                for (int j = 0; j < nm; j++) {
                    size_t ny = (size_t)(n * w[j]->rows);
                    float *ref = malloc(ny * sizeof *ref);
                    cpu->matmul(cpu, w[j], xn, ref, n);
                    float *y = from_gpu(gpu, dys[j], ny);
                    double d = rel_diff(y, ref, ny), tol = n > 8 ? GEMM_TOL : GEMV_TOL;
                    if (!(d <= tol)) {
                        printf("  norm_matmul %-8s %d of %d, %2d tokens: %.1e FAILED\n", fc->name, j, nm, (int)n, d);
                        failures++;
                    }
                    free(ref), free(y);
                    gpu->free(gpu, dys[j]);
                }
                gpu->free(gpu, dx), gpu->free(gpu, dxn);
                free(x), free(xn);
            }
        }
        gpu->free(gpu, dnw);
        free(nw);
        for (int j = 0; j < 3; j++) free_matrix(&m[j]);
    }
    assert_int_equal(failures, 0);
}

/* A view of a layout the backend cannot read is refused with a message, not misread. */
static void test_refuses_interleaved_layout(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    test_matrix m;
    make_matrix(&m, WEIGHT_MLX_AFFINE, 32, 64, 4, 64, DTYPE_BF16);
    m.w.layout = WEIGHT_LAYOUT_MLX_ROWS16;
    char err[256] = "";
    assert_int_equal(gpu->load_weight(gpu, &m.w, err, sizeof err), -1);
    assert_non_null(strstr(err, "MLX order"));
    free_matrix(&m);
}

/* ---- hybrid models: the GatedDeltaNet ops ---------------------------------------------------- */

/* Host and GPU copies of one linear-attention layer with the same random weights and states. */
typedef struct lin_pair {
    linear_attention_layer h, d;
    size_t conv_state_n, rec_state_n;
} lin_pair;

static void lin_pair_make(lin_pair *p, int nk, int nv, int dk, int dv, int taps, int slots) {
    linear_attention_layer l = {.n_k_heads = nk, .n_v_heads = nv, .key_dim = dk, .value_dim = dv,
                                .conv_kernel = taps};
    l.conv_dim = 2 * (int64_t)nk * dk + (int64_t)nv * dv;
    p->conv_state_n = (size_t)slots * (size_t)(taps - 1) * (size_t)l.conv_dim;
    p->rec_state_n = (size_t)slots * (size_t)nv * (size_t)dk * (size_t)dv;
    float *conv_w = rand_floats((size_t)l.conv_dim * (size_t)taps, 0.5f);
    float *a_log = rand_floats((size_t)nv, 1.0f), *dt_bias = rand_floats((size_t)nv, 1.0f);
    float *conv_state = rand_floats(p->conv_state_n, 1.0f), *rec = rand_floats(p->rec_state_n, 0.3f);
    p->h = l, p->d = l;
    p->h.conv_weight = conv_w, p->h.a_log = a_log, p->h.dt_bias = dt_bias;
    p->h.conv_state = conv_state, p->h.recurrent_state = rec;
    p->d.conv_weight = to_gpu(gpu, conv_w, (size_t)l.conv_dim * (size_t)taps * sizeof(float));
    p->d.a_log = to_gpu(gpu, a_log, (size_t)nv * sizeof(float));
    p->d.dt_bias = to_gpu(gpu, dt_bias, (size_t)nv * sizeof(float));
    p->d.conv_state = to_gpu(gpu, conv_state, p->conv_state_n * sizeof(float));
    p->d.recurrent_state = to_gpu(gpu, rec, p->rec_state_n * sizeof(float));
}

static void lin_pair_free(lin_pair *p) {
    free((void *)p->h.conv_weight), free((void *)p->h.a_log), free((void *)p->h.dt_bias);
    free(p->h.conv_state), free(p->h.recurrent_state);
    gpu->free(gpu, (void *)p->d.conv_weight), gpu->free(gpu, (void *)p->d.a_log);
    gpu->free(gpu, (void *)p->d.dt_bias), gpu->free(gpu, p->d.conv_state);
    gpu->free(gpu, p->d.recurrent_state);
}

/* |gpu - cpu| of n floats at dev against host, within tol (printed under name) */
static void expect_close(const char *name, const void *dev, const float *host, size_t n, double tol) {
    float *got = from_gpu(gpu, dev, n);
    double d = rel_diff(got, host, n);
    printf("  %s: %.1e\n", name, d);
    assert_true(d <= tol);
    free(got);
}

/* One step of a batch of runs through conv1d_causal and gated_delta_rule on both backends:
 * outputs and both states compared. The runs: lens[i] tokens from position pos0[i] (0: a fresh
 * state) continuing slot slots[i]. */
static void lin_step(lin_pair *p, int n_seqs, const int *lens, const int *pos0, const int32_t *slots) {
    int64_t n = 0;
    for (int i = 0; i < n_seqs; i++) n += lens[i];
    int32_t *pos = malloc((size_t)n * 4), *seq = malloc((size_t)n * 4);
    for (int i = 0, t = 0; i < n_seqs; i++)
        for (int j = 0; j < lens[i]; j++, t++) pos[t] = pos0[i] + j, seq[t] = i;
    linear_attention_batch hb = {.n_tokens = n, .positions = pos, .seq_of_token = seq, .state_slots = slots};
    linear_attention_batch db = {.n_tokens = n, .positions = to_gpu(gpu, pos, (size_t)n * 4),
                                 .seq_of_token = to_gpu(gpu, seq, (size_t)n * 4),
                                 .state_slots = to_gpu(gpu, slots, (size_t)n_seqs * 4)};
    int64_t C = p->h.conv_dim, nv = p->h.n_v_heads, outw = nv * p->h.value_dim;
    float *qkv = rand_floats((size_t)(n * C), 2.0f), *beta = rand_floats((size_t)(n * nv), 3.0f);
    float *a = rand_floats((size_t)(n * nv), 3.0f), *out = malloc((size_t)(n * outw) * sizeof(float));
    float *dqkv = to_gpu(gpu, qkv, (size_t)(n * C) * sizeof(float));
    float *dbeta = to_gpu(gpu, beta, (size_t)(n * nv) * sizeof(float));
    float *da = to_gpu(gpu, a, (size_t)(n * nv) * sizeof(float));
    float *dout = gpu->alloc(gpu, (size_t)(n * outw) * sizeof(float));

    cpu->conv1d_causal(cpu, &p->h, &hb, qkv);
    gpu->conv1d_causal(gpu, &p->d, &db, dqkv);
    expect_close("conv1d_causal", dqkv, qkv, (size_t)(n * C), GEMV_TOL);
    expect_close("conv state", p->d.conv_state, p->h.conv_state, p->conv_state_n, GEMV_TOL);
    gpu->upload(gpu, dqkv, qkv, (size_t)(n * C) * sizeof(float)); /* the same input for both */
    cpu->gated_delta_rule(cpu, &p->h, &hb, qkv, beta, a, out);
    gpu->gated_delta_rule(gpu, &p->d, &db, dqkv, dbeta, da, dout);
    expect_close("gated_delta_rule", dout, out, (size_t)(n * outw), GEMV_TOL);
    expect_close("recurrent state", p->d.recurrent_state, p->h.recurrent_state, p->rec_state_n, GEMV_TOL);
    /* the CPU's states carry on into the next step on both sides */
    gpu->upload(gpu, p->d.conv_state, p->h.conv_state, p->conv_state_n * sizeof(float));
    gpu->upload(gpu, p->d.recurrent_state, p->h.recurrent_state, p->rec_state_n * sizeof(float));

    void *bufs[] = {(void *)db.positions, (void *)db.seq_of_token, (void *)db.state_slots, dqkv, dbeta, da, dout};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->free(gpu, bufs[i]);
    free(pos), free(seq), free(qkv), free(beta), free(a), free(out);
}

static void test_linear_attention(void **s) {
    (void)s;
    SKIP_WITHOUT_GPU();
    /* value heads sharing key heads (4 over 2), value_dim under and over the block's 128
     * threads, a 4-tap conv and a 1-tap one (no state) */
    const int shapes[][5] = {{2, 4, 32, 48, 4}, {1, 2, 64, 160, 4}, {2, 2, 16, 16, 1}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const int *sh = shapes[k];
        printf(" %d key heads, %d value heads, key_dim %d, value_dim %d, %d taps\n", sh[0], sh[1],
               sh[2], sh[3], sh[4]);
        lin_pair p;
        lin_pair_make(&p, sh[0], sh[1], sh[2], sh[3], sh[4], 6);
        /* a prefill mix: fresh runs and continued ones, slots out of order */
        const int lens[] = {3, 1, 5, 1}, pos0[] = {0, 7, 4, 0};
        const int32_t slots[] = {3, 0, 5, 1};
        lin_step(&p, 4, lens, pos0, slots);
        /* then a decode step of the same sequences: one token each */
        const int lens1[] = {1, 1, 1, 1}, pos1[] = {3, 8, 9, 1};
        lin_step(&p, 4, lens1, pos1, slots);
        lin_pair_free(&p);
    }

    /* the gated RMSNorm (in place, as the forward pass calls it) and the sigmoid gates */
    int64_t rows = 13, dim = 96, n = rows * dim;
    float *x = rand_floats((size_t)n, 3.0f), *z = rand_floats((size_t)n, 3.0f);
    float *w = rand_floats((size_t)dim, 1.0f), *g = rand_floats((size_t)rows, 4.0f);
    float *dx = to_gpu(gpu, x, (size_t)n * 4), *dz = to_gpu(gpu, z, (size_t)n * 4);
    float *dw = to_gpu(gpu, w, (size_t)dim * 4), *dg = to_gpu(gpu, g, (size_t)rows * 4);
    float *ref = malloc((size_t)n * 4);
    memcpy(ref, x, (size_t)n * 4);
    cpu->rmsnorm_gated(cpu, ref, w, z, ref, rows, dim, 1e-6f);
    gpu->rmsnorm_gated(gpu, dx, dw, dz, dx, rows, dim, 1e-6f);
    expect_close("rmsnorm_gated", dx, ref, (size_t)n, GEMV_TOL);
    memcpy(ref, x, (size_t)n * 4);
    cpu->mul_sigmoid(cpu, ref, z, n);
    gpu->upload(gpu, dx, x, (size_t)n * 4);
    gpu->mul_sigmoid(gpu, dx, dz, n);
    expect_close("mul_sigmoid", dx, ref, (size_t)n, GEMV_TOL);
    memcpy(ref, x, (size_t)n * 4);
    cpu->mul_sigmoid_rows(cpu, ref, g, rows, dim);
    gpu->upload(gpu, dx, x, (size_t)n * 4);
    gpu->mul_sigmoid_rows(gpu, dx, dg, rows, dim);
    expect_close("mul_sigmoid_rows", dx, ref, (size_t)n, GEMV_TOL);
    gpu->copy(gpu, dx, dz, (size_t)n * 4);
    expect_close("copy", dx, z, (size_t)n, 0);
    void *bufs[] = {dx, dz, dw, dg};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->free(gpu, bufs[i]);
    free(x), free(z), free(w), free(g), free(ref);
}

int main(void) {
    setenv("EXO_CPU_SIMD", "avx2", 0); /* the exact CPU kernels are the reference */
    cpu = compute_backend_cpu(0);
    char err[256];
    if (compute_gpu_count() > 0) {
        gpu = compute_backend_open(COMPUTE_DEVICE_CUDA, 0, err, sizeof err);
        if (!gpu) fprintf(stderr, "CUDA backend: %s\n", err);
        setenv("EXO_CUDA_MATMUL", "exact", 1);
        gpu_exact = compute_backend_open(COMPUTE_DEVICE_CUDA, 0, err, sizeof err);
        unsetenv("EXO_CUDA_MATMUL");
        setenv("EXO_CUDA_QGEMM", "1", 1);
        gpu_qgemm = compute_backend_open(COMPUTE_DEVICE_CUDA, 0, err, sizeof err);
        unsetenv("EXO_CUDA_QGEMM");
        if (!gpu || !gpu_exact || !gpu_qgemm) return 1;
    } else {
        printf("test_cuda_ops: every test skipped: %s\n",
               compute_cuda_built() ? "no CUDA GPU on this machine" : "this build has no CUDA (make CUDA=1)");
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_formats), cmocka_unit_test(test_matmul_multi),
        cmocka_unit_test(test_embed),          cmocka_unit_test(test_row_ops),
        cmocka_unit_test(test_attention),      cmocka_unit_test(test_moe),
        cmocka_unit_test(test_matmul_fused),   cmocka_unit_test(test_rope_kv_write),
        cmocka_unit_test(test_sample),         cmocka_unit_test(test_qgemm),
        cmocka_unit_test(test_qgemm_multi),    cmocka_unit_test(test_norm_matmul),
        cmocka_unit_test(test_linear_attention),
        cmocka_unit_test(test_refuses_interleaved_layout),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (gpu) gpu->destroy(gpu);
    if (gpu_exact) gpu_exact->destroy(gpu_exact);
    if (gpu_qgemm) gpu_qgemm->destroy(gpu_qgemm);
    cpu->destroy(cpu);
    for (int i = 0; i < n_kept; i++) free(kept[i]);
    return failed;
}
