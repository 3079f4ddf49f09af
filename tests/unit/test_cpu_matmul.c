/* CPU matmul: every SIMD level this machine supports, in both regimes (matvec and gemm, own
 * micro-kernel and OpenBLAS), against cpu_matmul_reference (dequantize + f64 accumulation) on
 * random weights of every format, including odd shapes: rows that are not a multiple of any tile,
 * columns that are not a multiple of the vector width, n_tokens 1..17 and one larger batch, every
 * MLX bits/group/scale-dtype combination.
 *
 * Tolerance, per output element y[t][r]:
 *     |y - ref| <= 4e-5 * A + 1e-6,  A = max_c |x[t][c]| * sum_c (|W[r][c]| + |bias_g(c)|)
 * Justification: (1) f32 accumulation of n products in a few independent chains loses at most a
 * few ulps per partial sum, relative error << 1e-5 of sum |w x| <= A for the sizes tested.
 * (2) The AVX-512 MLX path quantizes activations per group to int16 with step max|x_g|/32767, an
 * error of at most max|x|/65534 per element, multiplied by |scale * q| <= |w| + |bias|: in total
 * <= 1.53e-5 * A. The bound 4e-5 * A leaves 2x margin; a wrong index, bit offset, scale or group
 * shows up as an error of order A itself (random data), so the check cannot pass by accident. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "compute/cpu/cpu_levels.h"
#include "compute/cpu/matmul_amx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_random.h"

typedef struct test_weight {
    weight_matrix w;
    void *data, *scales, *biases;
    void *span;   /* MLX: one allocation holding data, scales and biases side by side, or NULL */
} test_weight;

/* Where the next MLX matrix's data, scales and biases go: 0-5 side by side in one allocation, in
 * each of their 6 orders (as a placed checkpoint has them: what cpu_weight_repack_rows16 moves
 * 8-bit scales inline from), 6 in three allocations (as slices of stacked experts: it must not). */
static int next_placement;

/* Fills t's data, scales and biases with copies of the given bytes, placed by next_placement
 * (side by side only when every part keeps 64-byte alignment). */
static void place_mlx(test_weight *t, const void *data, size_t db, const void *scales, const void *biases, size_t sb) {
    int p = next_placement++ % 7;
    t->span = NULL;
    if (p == 6 || db % 64 || sb % 64) {
        t->data = malloc(db), t->scales = malloc(sb + 64), t->biases = malloc(sb + 64);
    } else {
        static const char orders[6][3] = {"dsb", "dbs", "sdb", "bds", "sbd", "bsd"};
        t->span = aligned_alloc(64, db + 2 * sb + 64);
        size_t off = 0;
        for (int i = 0; i < 3; i++) {
            char c = orders[p][i];
            void **part = c == 'd' ? &t->data : c == 's' ? &t->scales : &t->biases;
            *part = (char *)t->span + off;
            off += c == 'd' ? db : sb;
        }
    }
    memcpy(t->data, data, db), memcpy(t->scales, scales, sb), memcpy(t->biases, biases, sb);
    t->w.data = t->data, t->w.scales = t->scales, t->w.biases = t->biases;
}

static void store_scalar(dtype t, void *p, int64_t i, float v) {
    if (t == DTYPE_BF16) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else if (t == DTYPE_F16) ((uint16_t *)p)[i] = f32_to_f16(v);
    else ((float *)p)[i] = v;
}

static test_weight make_weight(weight_format f, int64_t rows, int64_t cols, int bits, int gs, dtype sdt) {
    test_weight t = {0};
    t.w.format = f;
    t.w.rows = rows;
    t.w.cols = cols;
    if (f == WEIGHT_MLX_AFFINE) {
        size_t words = (size_t)(rows * cols * bits / 32);
        uint32_t *q = malloc(words * 4);
        for (size_t i = 0; i < words; i++) q[i] = rng_u32() ^ (rng_u32() << 16);
        int64_t groups = rows * cols / gs;
        void *scales = malloc((size_t)groups * 4), *biases = malloc((size_t)groups * 4);
        for (int64_t g = 0; g < groups; g++) {
            store_scalar(sdt, scales, g, rng_uniform(0.001f, 0.03f));
            store_scalar(sdt, biases, g, rng_uniform(-0.2f, 0.2f));
        }
        t.w.bits = bits;
        t.w.group_size = gs;
        t.w.scale_dtype = sdt;
        place_mlx(&t, q, words * 4, scales, biases, (size_t)groups * dtype_size(sdt));
        free(q), free(scales), free(biases);
        return t;
    } else {
        size_t n = (size_t)(rows * cols);
        dtype dt = f == WEIGHT_F32 ? DTYPE_F32 : f == WEIGHT_F16 ? DTYPE_F16 : DTYPE_BF16;
        t.data = malloc(n * 4);
        for (size_t i = 0; i < n; i++) store_scalar(dt, t.data, (int64_t)i, rng_uniform(-1, 1));
    }
    t.w.data = t.data;
    return t;
}

static void free_weight(test_weight *t) {
    if (t->span) {
        free(t->span);
        return;
    }
    free(t->data);
    free(t->scales);
    free(t->biases);
}

/* A[t][r] of the tolerance formula. */
static double tolerance_scale(const weight_matrix *w, const float *x, int64_t t, int64_t r) {
    float *row = malloc((size_t)w->cols * sizeof *row);
    weight_matrix_row_to_f32(w, r, row);
    double xmax = 0, wsum = 0;
    for (int64_t c = 0; c < w->cols; c++) {
        double a = fabs(x[t * w->cols + c]);
        xmax = a > xmax ? a : xmax;
        double bias = 0;
        if (w->format == WEIGHT_MLX_AFFINE) {
            int64_t g = weight_mlx_group(w, r, c / w->group_size);
            bias = w->scale_dtype == DTYPE_F32 ? ((const float *)w->biases)[g]
                   : w->scale_dtype == DTYPE_BF16 ? bf16_to_f32(((const uint16_t *)w->biases)[g])
                                                  : f16_to_f32(((const uint16_t *)w->biases)[g]);
        }
        wsum += fabs(row[c]) + fabs(bias);
    }
    free(row);
    return xmax * wsum;
}

static const char *format_label(const weight_matrix *w, char *buf, size_t n) {
    static const char *names[] = {"f32", "f16", "bf16", "mlx"};
    if (w->format == WEIGHT_MLX_AFFINE)
        snprintf(buf, n, "mlx bits=%d gs=%d scales=%s", w->bits, w->group_size, dtype_name(w->scale_dtype));
    else
        snprintf(buf, n, "%s", names[w->format]);
    return buf;
}

static int checks_run;

/* Runs every supported level and regime on (w, n_tokens) and compares with the reference. */
static void check_all_paths(const weight_matrix *w, int64_t n_tokens) {
    float *x = random_x(n_tokens, w->cols);
    size_t ysize = (size_t)(n_tokens * w->rows);
    float *ref = malloc(ysize * sizeof *ref), *y = malloc(ysize * sizeof *y);
    cpu_matmul_reference(w, x, ref, n_tokens);
    double *tol = malloc(ysize * sizeof *tol);
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t r = 0; r < w->rows; r++)
            tol[t * w->rows + r] = 4e-5 * tolerance_scale(w, x, t, r) + 1e-6;

    struct { cpu_gemm_engine gemm; int max_matvec; const char *what; } regimes[] = {
        {CPU_GEMM_AUTO, -1, "default"},
        {CPU_GEMM_OWN, 0, "gemm-own"},
        {CPU_GEMM_OPENBLAS, 0, "gemm-openblas"},
        {CPU_GEMM_AUTO, 1 << 20, "matvec-passes"},
        {CPU_GEMM_MLX_INT, 0, "mlx-int-gemm"}, /* AVX-512 + MLX only; the others fall through */
    };
    for (int level = 0; level < CPU_LEVEL_COUNT; level++) {
        if (!cpu_kernels_for((cpu_level)level)) continue;
        if (w->layout != WEIGHT_LAYOUT_MLX && !(cpu_kernels_for((cpu_level)level)->rows16_bits & (1u << w->bits)))
            continue; /* levels that read the interleaved layout at this width */
        for (size_t g = 0; g < sizeof regimes / sizeof *regimes; g++) {
            for (size_t i = 0; i < ysize; i++) y[i] = NAN;
            assert_int_equal(cpu_matmul_with(w, x, y, n_tokens, (cpu_level)level, regimes[g].gemm,
                                             regimes[g].max_matvec), 0);
            for (size_t i = 0; i < ysize; i++) {
                double err = fabs((double)y[i] - (double)ref[i]);
                if (!(err <= tol[i])) {
                    char label[64];
                    fail_msg("%s %s, %s: rows=%lld cols=%lld n=%lld at t=%lld r=%lld: got %.7g, "
                             "reference %.7g (err %.3g > tol %.3g)",
                             cpu_kernels_for((cpu_level)level)->name, regimes[g].what,
                             format_label(w, label, sizeof label), (long long)w->rows,
                             (long long)w->cols, (long long)n_tokens, (long long)(i / w->rows),
                             (long long)(i % w->rows), y[i], ref[i], err, tol[i]);
                }
            }
            checks_run++;
        }
    }
    free(x);
    free(ref);
    free(y);
    free(tol);
}

static void test_dense_formats(void **state) {
    (void)state;
    weight_format formats[] = {WEIGHT_F32, WEIGHT_F16, WEIGHT_BF16};
    int64_t shapes[][2] = {{1, 1}, {5, 7}, {33, 31}, {70, 100}, {45, 257}, {3, 1040}};
    for (size_t f = 0; f < 3; f++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            test_weight tw = make_weight(formats[f], shapes[s][0], shapes[s][1], 0, 0, DTYPE_F32);
            for (int64_t n = 1; n <= 17; n += (s & 1) ? 3 : 2) check_all_paths(&tw.w, n);
            free_weight(&tw);
        }
}

static void test_mlx_every_bits_and_group(void **state) {
    (void)state;
    int bits[] = {2, 3, 4, 5, 6, 8};
    int groups[] = {32, 64, 128};
    dtype sdts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    int k = 0;
    for (size_t b = 0; b < 6; b++)
        for (size_t g = 0; g < 3; g++) {
            k++;
            int64_t rows = 1 + (int64_t)(rng_u32() % 50), cols = groups[g] * (1 + (int64_t)(rng_u32() % 5));
            test_weight tw = make_weight(WEIGHT_MLX_AFFINE, rows, cols, bits[b], groups[g], sdts[k % 3]);
            /* Every n_tokens 1..17 over the whole loop, two or three per combination. */
            for (int64_t n = 1 + k % 6; n <= 17; n += 6) check_all_paths(&tw.w, n);
            free_weight(&tw);
        }
}

/* The batched-decode sizes (9..130 tokens: one to nine 16-token vectors, partial last vectors,
 * row counts that are not a multiple of any tile height) for every MLX bits/group: the MLX int16
 * gemm (forced, and by default where it applies) against the reference. */
static void test_mlx_batched_decode_sizes(void **state) {
    (void)state;
    int bits[] = {2, 3, 4, 5, 6, 8};
    int groups[] = {32, 64, 128};
    int64_t counts[] = {9, 16, 17, 31, 33, 48, 64, 65, 100, 130};
    dtype sdts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    int k = 0;
    for (size_t b = 0; b < 6; b++)
        for (size_t g = 0; g < 3; g++) {
            k++;
            int64_t rows = 1 + (int64_t)(rng_u32() % 40), cols = groups[g] * (1 + (int64_t)(rng_u32() % 4));
            test_weight tw = make_weight(WEIGHT_MLX_AFFINE, rows, cols, bits[b], groups[g], sdts[k % 3]);
            check_all_paths(&tw.w, counts[k % 10]);
            check_all_paths(&tw.w, counts[(k + 5) % 10]);
            free_weight(&tw);
        }
    /* One job over matrices whose activations must be laid out differently (4-bit pair order,
     * 8-bit, another group size) or can be shared (the two 4-bit g64). */
    test_weight tw[4] = {
        make_weight(WEIGHT_MLX_AFFINE, 29, 256, 4, 64, DTYPE_BF16),
        make_weight(WEIGHT_MLX_AFFINE, 13, 256, 8, 64, DTYPE_F16),
        make_weight(WEIGHT_MLX_AFFINE, 40, 256, 4, 64, DTYPE_BF16),
        make_weight(WEIGHT_MLX_AFFINE, 7, 256, 4, 128, DTYPE_F32),
    };
    const weight_matrix *ws[4] = {&tw[0].w, &tw[1].w, &tw[2].w, &tw[3].w};
    for (int64_t n = 37; n <= 77; n += 40) { /* with and without the 4-bit pair order */
        float *x = random_x(n, 256), *ys[4], *ref = malloc(sizeof(float) * (size_t)(n * 40));
        for (int i = 0; i < 4; i++) ys[i] = malloc(sizeof(float) * (size_t)(n * ws[i]->rows));
        if (cpu_kernels_for(CPU_LEVEL_AVX512)) {
            assert_int_equal(cpu_matmul_multi_with(4, ws, x, ys, n, CPU_LEVEL_AVX512, CPU_GEMM_AUTO, -1), 0);
            for (int i = 0; i < 4; i++) {
                cpu_matmul_reference(ws[i], x, ref, n);
                for (int64_t j = 0; j < n * ws[i]->rows; j++) {
                    double tol = 4e-5 * tolerance_scale(ws[i], x, j / ws[i]->rows, j % ws[i]->rows) + 1e-6;
                    if (!(fabs((double)ys[i][j] - (double)ref[j]) <= tol))
                        fail_msg("mlx gemm multi: matrix %d element %lld: got %.7g, reference %.7g", i,
                                 (long long)j, ys[i][j], ref[j]);
                }
                checks_run++;
            }
        }
        for (int i = 0; i < 4; i++) free(ys[i]);
        free(x);
        free(ref);
    }
    for (int i = 0; i < 4; i++) free_weight(&tw[i]);
}

/* Wider rows (accumulation over thousands of columns) and a batch spanning several token tiles. */
static void test_large_shapes(void **state) {
    (void)state;
    test_weight bf = make_weight(WEIGHT_BF16, 67, 2048, 0, 0, DTYPE_F32);
    check_all_paths(&bf.w, 1);
    check_all_paths(&bf.w, 40);
    free_weight(&bf);
    test_weight q4 = make_weight(WEIGHT_MLX_AFFINE, 67, 4096, 4, 64, DTYPE_BF16);
    check_all_paths(&q4.w, 1);
    check_all_paths(&q4.w, 8);
    check_all_paths(&q4.w, 40);
    check_all_paths(&q4.w, 64);
    free_weight(&q4);
    test_weight q3 = make_weight(WEIGHT_MLX_AFFINE, 35, 1536, 3, 128, DTYPE_F16);
    check_all_paths(&q3.w, 3);
    check_all_paths(&q3.w, 29);
    free_weight(&q3);
}

static void test_public_entry_and_level(void **state) {
    (void)state;
    const char *level = cpu_simd_level();
    assert_true(strcmp(level, "generic") == 0 || strcmp(level, "avx2") == 0 ||
                strcmp(level, "avx512") == 0 || strcmp(level, "neon") == 0 ||
                strcmp(level, "neon-dotprod") == 0);
    assert_non_null(cpu_kernels_for(CPU_LEVEL_GENERIC));
    test_weight tw = make_weight(WEIGHT_MLX_AFFINE, 20, 256, 5, 32, DTYPE_BF16);
    float *x = random_x(3, 256), y[60], ref[60];
    cpu_matmul(&tw.w, x, y, 3);
    cpu_matmul_reference(&tw.w, x, ref, 3);
    for (int i = 0; i < 60; i++) assert_true(fabs(y[i] - ref[i]) <= 4e-5 * tolerance_scale(&tw.w, x, i / 20, i % 20) + 1e-6);
    free(x);
    free_weight(&tw);
}

static void test_rejects_unsupported_views(void **state) {
    (void)state;
    test_weight tw = make_weight(WEIGHT_MLX_AFFINE, 4, 64, 4, 32, DTYPE_BF16);
    assert_true(cpu_weight_supported(&tw.w));
    weight_matrix bad = tw.w;
    bad.bits = 7;
    assert_false(cpu_weight_supported(&bad));
    bad = tw.w;
    bad.group_size = 48;
    assert_false(cpu_weight_supported(&bad));
    bad = tw.w;
    bad.cols = 80; /* not a multiple of the group size */
    assert_false(cpu_weight_supported(&bad));
    bad = tw.w;
    bad.scales = NULL;
    assert_false(cpu_weight_supported(&bad));
    /* cpu_matmul never reads through such a view: it answers zeros. */
    float x[2 * 64], y[2 * 4];
    for (int i = 0; i < 2 * 64; i++) x[i] = 1.0f;
    for (int i = 0; i < 8; i++) y[i] = 42.0f;
    cpu_matmul(&bad, x, y, 2);
    for (int i = 0; i < 8; i++) assert_true(y[i] == 0.0f);
    bad = tw.w;
    bad.data = NULL;
    assert_int_equal(cpu_matmul_with(&bad, x, y, 2, CPU_LEVEL_GENERIC, CPU_GEMM_AUTO, -1), -1);
    free_weight(&tw);
}

/* cpu_matmul_multi: matrices of different rows and formats that share x, in one job, both ways
 * of splitting rows over threads, every level, one pass / several passes / gemm: each output must
 * match the reference of its own matrix. Same-quantization parts share prepared activations;
 * a third kind of quantization in the job takes the portable preparation path. */
static void test_multi_shared_x(void **state) {
    (void)state;
    int64_t cols = 256;
    test_weight tw[4] = {
        make_weight(WEIGHT_MLX_AFFINE, 37, cols, 4, 64, DTYPE_BF16),
        make_weight(WEIGHT_MLX_AFFINE, 13, cols, 3, 32, DTYPE_F16),
        make_weight(WEIGHT_MLX_AFFINE, 21, cols, 4, 64, DTYPE_BF16),
        make_weight(WEIGHT_BF16, 19, cols, 0, 0, DTYPE_F32),
    };
    const weight_matrix *ws[4] = {&tw[0].w, &tw[1].w, &tw[2].w, &tw[3].w};
    int64_t token_counts[] = {1, 3, 8, 9, 40, 70};
    for (size_t nc = 0; nc < sizeof token_counts / sizeof *token_counts; nc++) {
        int64_t n = token_counts[nc];
        float *x = random_x(n, cols);
        float *ref[4], *y[4];
        for (int i = 0; i < 4; i++) {
            ref[i] = malloc((size_t)(n * ws[i]->rows) * sizeof(float));
            y[i] = malloc((size_t)(n * ws[i]->rows) * sizeof(float));
            cpu_matmul_reference(ws[i], x, ref[i], n);
        }
        for (int level = 0; level < CPU_LEVEL_COUNT; level++) {
            if (!cpu_kernels_for((cpu_level)level)) continue;
            for (int split = CPU_SPLIT_STATIC; split <= CPU_SPLIT_STEAL; split++) {
                cpu_matvec_set_split(split);
                for (int parts = 1; parts <= 4; parts++) {
                    for (int i = 0; i < parts; i++)
                        for (int64_t j = 0; j < n * ws[i]->rows; j++) y[i][j] = NAN;
                    assert_int_equal(cpu_matmul_multi_with(parts, ws, x, y, n, (cpu_level)level,
                                                           CPU_GEMM_AUTO, -1), 0);
                    for (int i = 0; i < parts; i++)
                        for (int64_t j = 0; j < n * ws[i]->rows; j++) {
                            double tol = 4e-5 * tolerance_scale(ws[i], x, j / ws[i]->rows, j % ws[i]->rows) + 1e-6;
                            double err = fabs((double)y[i][j] - (double)ref[i][j]);
                            if (!(err <= tol))
                                fail_msg("multi %s split=%d parts=%d n=%lld: matrix %d element %lld: "
                                         "got %.7g, reference %.7g", cpu_kernels_for((cpu_level)level)->name,
                                         split, parts, (long long)n, i, (long long)j, y[i][j], ref[i][j]);
                        }
                    checks_run++;
                }
            }
        }
        /* The public entry point agrees too. */
        cpu_matvec_set_split(CPU_SPLIT_STEAL);
        cpu_matmul_multi(4, ws, x, y, n);
        for (int i = 0; i < 4; i++)
            for (int64_t j = 0; j < n * ws[i]->rows; j++)
                assert_true(fabs(y[i][j] - ref[i][j]) <=
                            4e-5 * tolerance_scale(ws[i], x, j / ws[i]->rows, j % ws[i]->rows) + 1e-6);
        for (int i = 0; i < 4; i++) free(ref[i]), free(y[i]);
        free(x);
    }
    /* Matrices that do not share a column count are refused: outputs zeroed, -1. */
    test_weight other = make_weight(WEIGHT_BF16, 3, cols + 16, 0, 0, DTYPE_F32);
    const weight_matrix *mixed[2] = {&tw[3].w, &other.w};
    float *x = random_x(1, cols + 16), y0[19], y1[3];
    float *ys[2] = {y0, y1};
    for (int i = 0; i < 3; i++) y1[i] = 42.0f;
    assert_int_equal(cpu_matmul_multi_with(2, mixed, x, ys, 1, CPU_LEVEL_GENERIC, CPU_GEMM_AUTO, -1), -1);
    for (int i = 0; i < 3; i++) assert_true(y1[i] == 0.0f);
    free(x);
    free_weight(&other);
    for (int i = 0; i < 4; i++) free_weight(&tw[i]);
}

/* The 4-bit kernel's two activation layouts (byte planes, the default; int16 for A/B runs) on
 * every group size, columns a multiple of 128 (where the planes apply) and not, odd row counts,
 * 1..8 tokens; and a job where the 4-bit matrix is the second quantization (the portable
 * preparation in cpu.c builds the planes). */
static void test_q4_layouts(void **state) {
    (void)state;
    int groups[] = {32, 64, 128};
    int64_t shapes[][2] = {{1, 128}, {7, 384}, {33, 1152}, {5, 192}, {19, 2048}};
    for (int planes = 1; planes >= 0; planes--) {
        cpu_matvec_set_q4_planes(planes);
        for (size_t g = 0; g < 3; g++)
            for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
                if (shapes[sh][1] % groups[g]) continue;
                test_weight tw = make_weight(WEIGHT_MLX_AFFINE, shapes[sh][0], shapes[sh][1], 4, groups[g],
                                             (dtype)(g == 0 ? DTYPE_F16 : g == 1 ? DTYPE_BF16 : DTYPE_F32));
                for (int64_t n = 1; n <= CPU_MATVEC_MAX_TOKENS; n++) check_all_paths(&tw.w, n);
                free_weight(&tw);
            }
        test_weight a = make_weight(WEIGHT_MLX_AFFINE, 11, 256, 3, 32, DTYPE_F16);
        test_weight b = make_weight(WEIGHT_MLX_AFFINE, 23, 256, 4, 64, DTYPE_BF16);
        const weight_matrix *ws[2] = {&a.w, &b.w};
        for (int64_t n = 1; n <= CPU_MATVEC_MAX_TOKENS; n++) {
            float *x = random_x(n, 256), *ref = malloc((size_t)(n * 23) * sizeof(float));
            float *y0 = malloc((size_t)(n * 11) * sizeof(float)), *y1 = malloc((size_t)(n * 23) * sizeof(float));
            float *ys[2] = {y0, y1};
            cpu_matmul_reference(&b.w, x, ref, n);
            for (int level = 0; level < CPU_LEVEL_COUNT; level++) {
                if (!cpu_kernels_for((cpu_level)level)) continue;
                assert_int_equal(cpu_matmul_multi_with(2, ws, x, ys, n, (cpu_level)level, CPU_GEMM_AUTO, -1), 0);
                for (int64_t j = 0; j < n * 23; j++) {
                    double tol = 4e-5 * tolerance_scale(&b.w, x, j / 23, j % 23) + 1e-6;
                    if (!(fabs((double)y1[j] - (double)ref[j]) <= tol))
                        fail_msg("q4 second in a job, %s planes=%d n=%lld element %lld: got %.7g, reference %.7g",
                                 cpu_kernels_for((cpu_level)level)->name, planes, (long long)n, (long long)j,
                                 y1[j], ref[j]);
                }
                checks_run++;
            }
            free(x), free(ref), free(y0), free(y1);
        }
        free_weight(&a);
        free_weight(&b);
    }
    cpu_matvec_set_q4_planes(1);
}

/* The byte planes hold exactly the int16 activations: x = 256 * hi (signed) + lo (unsigned). */
static void test_q4_planes_split_is_exact(void **state) {
    (void)state;
    int16_t q[256];
    for (int i = 0; i < 256; i++) q[i] = (int16_t)((int)(rng_u32() % 65535) - 32767);
    int16_t edge[] = {-32767, 32767, -1, 0, 1, 255, 256, -256, -255, 127, -128, 128, -32768 + 1};
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) q[i * 3] = edge[i];
    int16_t orig[256];
    memcpy(orig, q, sizeof q);
    cpu_mlx_x_to_planes(q, 256);
    for (int c0 = 0; c0 < 256; c0 += 128) {
        const uint8_t *b = (const uint8_t *)(q + c0);
        for (int j = 0; j < 64; j++)
            for (int k = 0; k < 2; k++) {
                int hi = (int8_t)b[64 * k + j], lo = b[128 + 64 * k + j];
                assert_int_equal(256 * hi + lo, orig[c0 + 2 * j + k]);
            }
    }
}

/* A copy of t's MLX matrix (same values, own memory), for repacking. */
static test_weight copy_weight(const test_weight *t) {
    test_weight c = *t;
    size_t words = (size_t)(t->w.rows * t->w.cols * t->w.bits / 32);
    size_t sb = (size_t)(t->w.rows * (t->w.cols / t->w.group_size)) * dtype_size(t->w.scale_dtype);
    place_mlx(&c, t->data, words * 4, t->scales, t->biases, sb);
    return c;
}

/* The largest |y - ref| / A (tolerance_scale) over y[n][rows] against a double reference. */
static double max_scaled_error(const weight_matrix *w, const float *x, const float *y, int64_t n) {
    float *row = malloc((size_t)w->cols * sizeof *row);
    double worst = 0;
    for (int64_t r = 0; r < w->rows; r++) {
        weight_matrix_row_to_f32(w, r, row);
        for (int64_t k = 0; k < n; k++) {
            double ref = 0;
            for (int64_t c = 0; c < w->cols; c++) ref += (double)row[c] * x[k * w->cols + c];
            double e = fabs(y[k * w->rows + r] - ref) / tolerance_scale(w, x, k, r);
            worst = e > worst ? e : worst;
        }
    }
    free(row);
    return worst;
}

/* A 4-bit matrix flagged exact_activations is multiplied with its activations unrounded at every
 * level, in MLX order and (where the level interleaves it: AVX-512) in the 16-row layout: the
 * AVX-512 residual-plane kernel (float-activation rows beside it), a float level elsewhere.
 * Within float summation error of a double reference (1e-6 A), and where the matrix is
 * interleaved, 30x under the error the same matrix shows unflagged (the int16 kernel) on the same
 * inputs (with their outliers): the check would catch a kernel that rounds to int16. Shapes cover group sizes 32, 64
 * and 128, rows past the last block of 16, and 1..12 and 40 tokens (passes and remainders). */
static void test_exact_activations(void **state) {
    (void)state;
    int64_t shapes[][3] = {{48, 256, 64}, {37, 128, 32}, {16, 512, 128}, {64, 384, 64}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int64_t n = 1; n <= 40; n += (n < 9 ? 1 : n < 12 ? 3 : 28)) {
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            test_weight t = make_weight(WEIGHT_MLX_AFFINE, rows, cols, 4, (int)shapes[si][2], DTYPE_BF16);
            test_weight il = copy_weight(&t); /* interleaved where this level reads it exactly */
            t.w.exact_activations = il.w.exact_activations = 1;
            int interleaved = cpu_weight_prefers_rows16(&il.w);
            if (interleaved) assert_int_equal(cpu_weight_repack_rows16(&il.w), 0);
            float *x = random_x(n, cols), *y = malloc((size_t)(n * rows) * sizeof *y);
            const test_weight *views[2] = {&t, &il};
            double exact_err = 0;
            for (int v = 0; v < 1 + interleaved; v++) {
                cpu_matmul(&views[v]->w, x, y, n);
                double e = max_scaled_error(&views[v]->w, x, y, n);
                if (e > 1e-6)
                    fprintf(stderr, "%lldx%lld g%lld n %lld %s: error %.3g A\n", (long long)rows,
                            (long long)cols, (long long)shapes[si][2], (long long)n,
                            v ? "interleaved" : "mlx order", e);
                assert_true(e <= 1e-6);
                exact_err = e > exact_err ? e : exact_err;
                checks_run++;
            }
            il.w.exact_activations = 0; /* the same matrix through the level's int16 kernels (the
                                            * AMX tiles, from 16 tokens on, round less: matmul_amx.c) */
            cpu_amx_set_enabled(0);
            cpu_matmul(&il.w, x, y, n);
            cpu_amx_set_enabled(-1);
            double rounded_err = max_scaled_error(&il.w, x, y, n);
            if (interleaved && !(exact_err * 30 < rounded_err))
                fail_msg("%lldx%lld n %lld: exact error %.3g A is not 30x under the int16 kernels' %.3g A",
                         (long long)rows, (long long)cols, (long long)n, exact_err, rounded_err);
            free(x), free(y);
            free_weight(&t), free_weight(&il);
        }
}

/* The 16-row interleaved layout (4- and 8-bit): the repack moves every word, scale and bias
 * exactly where weight_mlx_word / weight_mlx_group say (rows past the last whole block stay put),
 * the reference dequantization reads the same values, and every regime of each level that reads
 * the layout (matvec 1..8 tokens, the MLX int16 gemm at 9..256, the f32 gemms on dequantized
 * panels, passes) matches the reference on odd row counts (4-bit; 8-bit takes multiples of 16
 * only), g32/g64/g128 and f16/bf16/f32 scales. */
static void test_q4_rows16(void **state) {
    (void)state;
    int groups[] = {32, 64, 128};
    dtype sdts[] = {DTYPE_F16, DTYPE_BF16, DTYPE_F32};
    int64_t shapes[][2] = {{16, 128}, {33, 256}, {47, 384}, {64, 1024}, {100, 128}, {48, 256}};
    int64_t tokens[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 48, 130, 300};
    int inline8 = 0, apart8 = 0; /* 8-bit matrices repacked with scales inline, and in 3 arrays */
    for (int bits = 4; bits <= 8; bits += 4)
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
        for (size_t g = 0; g < 3; g++) {
            int64_t rows = shapes[sh][0], cols = shapes[sh][1], gs = groups[g];
            if (bits == 8 && rows % 16) continue;
            test_weight orig = make_weight(WEIGHT_MLX_AFFINE, rows, cols, bits, (int)gs, sdts[(sh + g) % 3]);
            test_weight rp = copy_weight(&orig);
            assert_int_equal(cpu_weight_repack_rows16(&rp.w), 0);
            assert_int_equal(rp.w.layout, WEIGHT_LAYOUT_MLX_ROWS16);
            int64_t words = cols * bits / 32, ng = cols / gs;
            size_t es = dtype_size(rp.w.scale_dtype);
            /* 8-bit scales and biases move inline exactly when the three parts filled one span */
            size_t inline_stride = bits == 8 && rp.span ? 2 * (size_t)gs * 8 + 32 * es : 0;
            assert_int_equal(rp.w.group_stride, inline_stride);
            inline8 += bits == 8 && inline_stride, apart8 += bits == 8 && !inline_stride;
            if (inline_stride) { /* within the span, the scales and biases right after the lines */
                assert_ptr_equal(rp.w.scales, (const char *)rp.w.data + 16 * gs);
                assert_ptr_equal(rp.w.biases, (const char *)rp.w.scales + 16 * es);
                assert_true((char *)rp.w.data >= (char *)rp.span &&
                            (char *)rp.w.data + (size_t)(rows / 16 * ng) * inline_stride <=
                                (char *)rp.span + (size_t)(rows * cols) + 2 * (size_t)(rows * ng) * es);
            }
            int moved = 0;
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t d = 0; d < words; d++) {
                    int64_t i = weight_mlx_word(&rp.w, r, d);
                    assert_int_equal(((const uint32_t *)rp.w.data)[i], ((const uint32_t *)orig.data)[r * words + d]);
                    moved += i != r * words + d;
                }
                for (int64_t k = 0; k < ng; k++) {
                    int64_t i = weight_mlx_group(&rp.w, r, k);
                    assert_memory_equal((const char *)rp.w.scales + i * (int64_t)es, (const char *)orig.scales + (r * ng + k) * (int64_t)es, es);
                    assert_memory_equal((const char *)rp.w.biases + i * (int64_t)es, (const char *)orig.biases + (r * ng + k) * (int64_t)es, es);
                }
                if (r >= (rows & ~15)) /* the tail rows keep MLX order */
                    assert_memory_equal((const uint32_t *)rp.w.data + r * words, (const uint32_t *)orig.data + r * words, (size_t)words * 4);
            }
            assert_true(moved > 0);
            float *a = malloc((size_t)cols * sizeof *a), *b = malloc((size_t)cols * sizeof *b);
            for (int64_t r = 0; r < rows; r++) {
                weight_matrix_row_to_f32(&orig.w, r, a);
                weight_matrix_row_to_f32(&rp.w, r, b);
                assert_memory_equal(a, b, (size_t)cols * sizeof *a);
            }
            free(a), free(b);
            /* a second repack, or any other width, is refused and changes nothing */
            assert_int_equal(cpu_weight_repack_rows16(&rp.w), -1);
            for (size_t n = 0; n < sizeof tokens / sizeof *tokens; n++)
                if (tokens[n] <= 9 || (sh + g) % 2 == 0) check_all_paths(&rp.w, tokens[n]);
            free_weight(&orig);
            free_weight(&rp);
        }
    assert_true(inline8 >= 3 && apart8 >= 1);
    /* The AVX2 level's kernels without AVX-VNNI (4-bit: vpmaddubsw, 8-bit: vpmaddwd), where the
     * CPU has it. */
    if (cpu_kernels_for(CPU_LEVEL_AVX2) && cpu_avx2_vnni()) {
        cpu_avx2_set_vnni(0);
        for (int bits = 4; bits <= 8; bits += 4)
            for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
                if (bits == 8 && shapes[sh][0] % 16) continue;
                test_weight tw = make_weight(WEIGHT_MLX_AFFINE, shapes[sh][0], shapes[sh][1], bits, groups[sh % 3], sdts[sh % 3]);
                assert_int_equal(cpu_weight_repack_rows16(&tw.w), 0);
                for (int64_t n = 1; n <= 9; n += 1 + (int64_t)(sh % 2)) check_all_paths(&tw.w, n);
                free_weight(&tw);
            }
        cpu_avx2_set_vnni(1);
        assert_true(cpu_avx2_vnni());
    }
    int64_t refused[][3] = {{15, 128, 4}, {32, 64, 4}, {32, 128, 3}, {40, 256, 8}, {32, 128, 2}, {16, 64, 8}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        test_weight t = make_weight(WEIGHT_MLX_AFFINE, refused[i][0], refused[i][1], (int)refused[i][2], 32, DTYPE_BF16);
        test_weight c = copy_weight(&t);
        assert_int_equal(cpu_weight_prefers_rows16(&c.w), 0);
        assert_int_equal(cpu_weight_repack_rows16(&c.w), -1);
        assert_int_equal(c.w.layout, WEIGHT_LAYOUT_MLX);
        assert_memory_equal(c.data, t.data, (size_t)(refused[i][0] * refused[i][1] * refused[i][2] / 8));
        free_weight(&t);
        free_weight(&c);
    }
}

/* Every way of splitting a matvec over threads cuts interleaved matrices at whole blocks (or
 * stores only its own rows of a block), with several matrices in one job; and a level that
 * cannot read the layout refuses it (zeros, -1) instead of reading garbage. */
static void test_q4_rows16_splits_and_levels(void **state) {
    (void)state;
    test_weight t[3] = {make_weight(WEIGHT_MLX_AFFINE, 200, 512, 4, 64, DTYPE_BF16),
                        make_weight(WEIGHT_MLX_AFFINE, 37, 512, 4, 32, DTYPE_F16),
                        make_weight(WEIGHT_MLX_AFFINE, 21, 512, 3, 64, DTYPE_BF16)};
    assert_int_equal(cpu_weight_repack_rows16(&t[0].w), 0);
    assert_int_equal(cpu_weight_repack_rows16(&t[1].w), 0);
    const weight_matrix *ws[3] = {&t[0].w, &t[1].w, &t[2].w};
    cpu_level rows16_levels[] = {CPU_LEVEL_AVX512, CPU_LEVEL_AVX2};
    for (size_t li = 0; li < 2; li++) {
        cpu_level lv = rows16_levels[li];
        if (!cpu_kernels_for(lv)) continue;
        for (int split = CPU_SPLIT_STATIC; split <= CPU_SPLIT_STEAL; split++) {
            cpu_matvec_set_split(split);
            /* 40 and 100 tokens: on AVX-512 a job mixing interleaved and MLX-order matrices goes to
             * the MLX int16 gemm, which copies interleaved blocks back to MLX order; on AVX2 to the
             * f32 gemm on panels dequantized from the interleaved rows */
            int64_t tokens[] = {1, 4, 7, 40, 100};
            for (size_t ti = 0; ti < sizeof tokens / sizeof *tokens; ti++) {
                int64_t n = tokens[ti];
                float *x = random_x(n, 512), *ys[3], *ref[3];
                for (int i = 0; i < 3; i++) {
                    ys[i] = malloc((size_t)(n * ws[i]->rows) * sizeof(float));
                    ref[i] = malloc((size_t)(n * ws[i]->rows) * sizeof(float));
                    cpu_matmul_reference(ws[i], x, ref[i], n);
                }
                assert_int_equal(cpu_matmul_multi_with(3, ws, x, ys, n, lv, CPU_GEMM_AUTO, -1), 0);
                for (int i = 0; i < 3; i++) {
                    for (int64_t j = 0; j < n * ws[i]->rows; j++) {
                        double tol = 4e-5 * tolerance_scale(ws[i], x, j / ws[i]->rows, j % ws[i]->rows) + 1e-6;
                        if (!(fabs((double)ys[i][j] - (double)ref[i][j]) <= tol))
                            fail_msg("rows16 %s split %d matrix %d n=%lld element %lld: got %.7g, reference %.7g",
                                     cpu_kernels_for(lv)->name, split, i, (long long)n, (long long)j, ys[i][j], ref[i][j]);
                    }
                    free(ys[i]), free(ref[i]);
                }
                checks_run++;
                free(x);
            }
        }
        cpu_matvec_set_split(CPU_SPLIT_STEAL);
    }
    /* The kernel itself on ranges that cut blocks anywhere (the driver never does): each range
     * writes exactly its own rows; AVX-512 and AVX2 (with and without AVX-VNNI where the CPU has
     * it), 1, 2 and 4 blocks in flight at 1-2 tokens (cpu_matvec_set_streams). */
    for (int kv = 0; kv < 3 * 3; kv++) {
    int variant = kv / 3, streams = 1 << (kv % 3);
    const cpu_kernels *k = cpu_kernels_for(variant == 0 ? CPU_LEVEL_AVX512 : CPU_LEVEL_AVX2);
    if (variant > 0) cpu_avx2_set_vnni(variant == 2);
    if (variant == 2 && !cpu_avx2_vnni()) continue; /* the CPU lacks AVX-VNNI */
    cpu_matvec_set_streams(streams);
    for (int64_t n = 1; k && n <= CPU_MATVEC_MAX_TOKENS; n += n < 2 ? 1 : 6) {
        const weight_matrix *w = &t[0].w;
        int64_t groups = w->cols / w->group_size, cuts[] = {0, 5, 16, 37, 38, 100, 193, 200};
        float *x = random_x(n, w->cols), *ref = malloc((size_t)(n * w->rows) * sizeof(float));
        float *y = malloc((size_t)(n * w->rows) * sizeof(float));
        float *xsum = malloc((size_t)(n * groups) * sizeof(float)), *xscale = malloc((size_t)(n * groups) * sizeof(float));
        int16_t *xq = malloc((size_t)(n * w->cols) * sizeof(int16_t));
        k->prepare_mlx(w, x, n, xsum, xscale, xq);
        matvec_input in = {.x = x, .n_tokens = n, .xq = xq, .xscale = xscale, .xsum = xsum};
        cpu_matmul_reference(w, x, ref, n);
        float *part = malloc((size_t)(n * w->rows) * sizeof(float));
        for (size_t c = 0; c + 1 < sizeof cuts / sizeof *cuts; c++) {
            for (int64_t i = 0; i < n * w->rows; i++) part[i] = NAN;
            k->matvec(w, &in, part, cuts[c], cuts[c + 1]);
            for (int64_t tk = 0; tk < n; tk++)
                for (int64_t r = 0; r < w->rows; r++) {
                    float v = part[tk * w->rows + r];
                    if (r >= cuts[c] && r < cuts[c + 1]) y[tk * w->rows + r] = v;
                    else if (!isnan(v)) fail_msg("rows16 range [%lld, %lld) wrote row %lld", (long long)cuts[c],
                                                 (long long)cuts[c + 1], (long long)r);
                }
        }
        free(part);
        for (int64_t j = 0; j < n * w->rows; j++) {
            double tol = 4e-5 * tolerance_scale(w, x, j / w->rows, j % w->rows) + 1e-6;
            if (!(fabs((double)y[j] - (double)ref[j]) <= tol))
                fail_msg("rows16 cut ranges %s (variant %d) streams %d n=%lld element %lld: got %.7g, reference %.7g",
                         k->name, variant, streams, (long long)n, (long long)j, y[j], ref[j]);
        }
        checks_run++;
        free(x), free(ref), free(y), free(xsum), free(xscale), free(xq);
    }
    }
    cpu_avx2_set_vnni(1);
    cpu_matvec_set_streams(2);
    for (int level = CPU_LEVEL_GENERIC; level < CPU_LEVEL_COUNT; level++) {
        const cpu_kernels *kl = cpu_kernels_for((cpu_level)level);
        if (!kl || (kl->rows16_bits & (1u << 4))) continue;
        float *x = random_x(2, 512), *y = malloc(2 * 200 * sizeof(float));
        for (int i = 0; i < 400; i++) y[i] = 1.0f;
        assert_int_equal(cpu_matmul_with(&t[0].w, x, y, 2, (cpu_level)level, CPU_GEMM_AUTO, -1), -1);
        for (int i = 0; i < 400; i++) assert_true(y[i] == 0.0f);
        free(x), free(y);
    }
    for (int i = 0; i < 3; i++) free_weight(&t[i]);
}

/* The AVX2 4-bit interleaved kernels (vpmaddubsw with int16 sums carried over lines, and
 * AVX-VNNI) compute the AVX-512 kernel's integer dot products and scale them in the same order:
 * on the same prepared activations their outputs equal the AVX-512 ones bit for bit, at 1..8
 * tokens, 1, 2 and 4 blocks in flight, every group size and scale type, random data and the
 * extremes of the int16 sums (every nibble 15 against activations of +-max|x|: hi bytes -128 or
 * 127, lo bytes 1 or 255; a saturating or wrapping int16 sum would differ). Rows of whole blocks
 * only: rows past the last block take each level's MLX-order kernel. */
static void test_rows16_avx2_exact(void **state) {
    (void)state;
    const cpu_kernels *k512 = cpu_kernels_for(CPU_LEVEL_AVX512), *k2 = cpu_kernels_for(CPU_LEVEL_AVX2);
    if (!k512 || !k2) {
        print_message("no AVX-512 and AVX2 here: the AVX2 kernels are checked against the reference only\n");
        return;
    }
    int groups[] = {32, 64, 128};
    dtype sdts[] = {DTYPE_F16, DTYPE_BF16, DTYPE_F32};
    for (int fill = 0; fill < 4; fill++) /* 0: random; 1-3: nibbles 15, x = -1, +1, alternating */
        for (int gi = 0; gi < 3; gi++) {
            int64_t rows = 80, cols = 512, gs = groups[gi], ng = cols / gs;
            test_weight t = make_weight(WEIGHT_MLX_AFFINE, rows, cols, 4, (int)gs, sdts[(fill + gi) % 3]);
            if (fill) memset(t.data, 0xff, (size_t)(rows * cols / 2));
            assert_int_equal(cpu_weight_repack_rows16(&t.w), 0);
            for (int64_t n = 1; n <= CPU_MATVEC_MAX_TOKENS; n++) {
                float *x = random_x(n, cols);
                for (int64_t i = 0; fill && i < n * cols; i++) x[i] = fill == 1 ? -1.0f : fill == 2 ? 1.0f : (i & 1 ? 1.0f : -1.0f);
                float *xsum = malloc((size_t)(n * ng) * sizeof(float)), *xscale = malloc((size_t)(n * ng) * sizeof(float));
                int16_t *xq = malloc((size_t)(n * cols) * sizeof(int16_t));
                k2->prepare_mlx(&t.w, x, n, xsum, xscale, xq);
                matvec_input in = {.x = x, .n_tokens = n, .xq = xq, .xscale = xscale, .xsum = xsum};
                float *y512 = malloc((size_t)(n * rows) * sizeof(float)), *y2 = malloc((size_t)(n * rows) * sizeof(float));
                cpu_matvec_set_streams(2);
                k512->matvec(&t.w, &in, y512, 0, rows);
                for (int v = 0; v < 2; v++) {
                    cpu_avx2_set_vnni(v);
                    if (v == 1 && !cpu_avx2_vnni()) break; /* the CPU lacks AVX-VNNI */
                    for (int streams = 1; streams <= 4; streams *= 2) {
                        cpu_matvec_set_streams(streams);
                        memset(y2, 0, (size_t)(n * rows) * sizeof(float));
                        /* two ranges: the second thread's share starts mid-matrix */
                        k2->matvec(&t.w, &in, y2, 0, 32);
                        k2->matvec(&t.w, &in, y2, 32, rows);
                        for (int64_t j = 0; j < n * rows; j++)
                            if (memcmp(&y2[j], &y512[j], sizeof(float)))
                                fail_msg("avx2 (vnni %d) fill %d g%lld streams %d n=%lld element %lld: %.9g, AVX-512 %.9g",
                                         v, fill, (long long)gs, streams, (long long)n, (long long)j, y2[j], y512[j]);
                        checks_run++;
                    }
                }
                cpu_avx2_set_vnni(1);
                cpu_matvec_set_streams(2);
                free(x), free(xsum), free(xscale), free(xq), free(y512), free(y2);
            }
            free_weight(&t);
        }
}

/* A level's own activation preparation (cpu_kernels.prepare_mlx: AVX-512, AVX2) gives the int16
 * activations, steps and layouts of the portable rule (cpu_levels.h, matvec_input): xq =
 * lrintf(x * xmax / max|x|) bit for bit, in byte planes (4-bit, columns % 128), permuted (2-bit,
 * 4-bit MLX order otherwise) or natural order; the group sums within float rounding. Shapes cover
 * every group size, a 4-bit row that only permutes (192 columns), 3-, 8- and 2-bit, 1..3 tokens and a
 * group of zeros (step 0). The AVX2 one replaced an lrintf call per value (cpu27). */
static void test_prepare_mlx_levels(void **state) {
    (void)state;
    struct { int bits; int64_t cols, gs; } cases[] = {{4, 256, 32}, {4, 256, 64}, {4, 384, 128}, {4, 192, 64},
                                                      {8, 256, 64}, {2, 256, 32}, {3, 128, 128}};
    for (int level = CPU_LEVEL_AVX2; level <= CPU_LEVEL_AVX512; level++) {
        const cpu_kernels *k = cpu_kernels_for((cpu_level)level);
        if (!k || !k->prepare_mlx) continue;
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
            for (int64_t n = 1; n <= 3; n++) {
                weight_matrix w = {.format = WEIGHT_MLX_AFFINE, .rows = 16, .cols = cases[ci].cols,
                                   .bits = cases[ci].bits, .group_size = cases[ci].gs, .scale_dtype = DTYPE_BF16};
                if (w.bits == 8 && k->rows16_x8_planes) continue; /* its planes8 layout: the rows16 tests */
                int64_t cols = w.cols, gs = w.group_size, groups = cols / gs;
                float *x = random_x(n, cols), *xsum = malloc((size_t)(n * groups) * sizeof(float));
                float *xscale = malloc((size_t)(n * groups) * sizeof(float));
                for (int64_t c = 0; c < gs; c++) x[c] = 0.0f; /* token 0, group 0: all zero */
                int16_t *xq = malloc((size_t)(n * cols) * sizeof(int16_t)), *want = malloc((size_t)cols * sizeof(int16_t));
                k->prepare_mlx(&w, x, n, xsum, xscale, xq);
                for (int64_t t = 0; t < n; t++) {
                    for (int64_t g = 0; g < groups; g++) {
                        const float *xs = x + t * cols + g * gs;
                        float amax = 0;
                        double sum = 0, sabs = 0;
                        for (int64_t c = 0; c < gs; c++) {
                            amax = fabsf(xs[c]) > amax ? fabsf(xs[c]) : amax;
                            sum += xs[c], sabs += fabs(xs[c]);
                        }
                        float inv = amax > 0 ? 32767.0f / amax : 0.0f;
                        for (int64_t c = 0; c < gs; c++) want[g * gs + c] = (int16_t)lrintf(xs[c] * inv);
                        assert_true(xscale[t * groups + g] == amax / 32767.0f);
                        assert_true(fabs(xsum[t * groups + g] - sum) <= 1e-5 * sabs + 1e-30);
                    }
                    int per_byte = w.bits == 2 ? 4 : w.bits == 4 ? 2 : 0;
                    if (w.bits == 4 && cols % 128 == 0) {
                        cpu_mlx_x_to_planes(want, cols);
                    } else if (per_byte) {
                        int16_t tmp[128];
                        for (int64_t c0 = 0; c0 < cols; c0 += 32 * per_byte) {
                            for (int kk = 0; kk < per_byte; kk++)
                                for (int j = 0; j < 32; j++) tmp[kk * 32 + j] = want[c0 + j * per_byte + kk];
                            memcpy(want + c0, tmp, (size_t)(32 * per_byte) * sizeof *want);
                        }
                    }
                    if (memcmp(want, xq + t * cols, (size_t)cols * sizeof *want))
                        fail_msg("%s prepare_mlx: %d-bit %lld cols group %lld token %lld differs from the portable rule",
                                 k->name, w.bits, (long long)cols, (long long)gs, (long long)t);
                }
                checks_run++;
                free(x), free(xsum), free(xscale), free(xq), free(want);
            }
    }
}

static int report_checks(void **state) {
    (void)state;
    print_message("matmul comparisons run: %d\n", checks_run);
    return checks_run > 0 ? 0 : -1;
}

/* A zero_point matrix (GGUF Q4_0/Q8_0, weight_matrix.zero_point): kernels that derive the biases
 * from the scales give bit-for-bit what reading the stored biases gives, in MLX order and in the
 * 16-row layout, for 1..8 tokens (matvec) and a gemm-sized batch; and weight_matrix_bytes drops
 * the biases it no longer streams. */
static void test_zero_point(void **state) {
    (void)state;
    int zps[] = {8, 128};
    for (int i = 0; i < 2; i++) {
        int bits = i ? 8 : 4, zp = zps[i];
        for (int layout = 0; layout < 2; layout++) {
            test_weight t = make_weight(WEIGHT_MLX_AFFINE, 48, 256, bits, 32, DTYPE_F16);
            for (int64_t g = 0; g < 48 * 256 / 32; g++)
                store_scalar(DTYPE_F16, t.biases, g, -(float)zp * f16_to_f32(((uint16_t *)t.scales)[g]));
            if (layout) assert_int_equal(cpu_weight_repack_rows16(&t.w), 0);
            size_t stored = weight_matrix_bytes(&t.w);
            int64_t tokens[] = {1, 2, 3, 5, 8, 40};
            for (size_t n = 0; n < sizeof tokens / sizeof *tokens; n++) {
                float *x = random_x(tokens[n], 256);
                float *y0 = malloc(sizeof(float) * 48 * (size_t)tokens[n]);
                float *y1 = malloc(sizeof(float) * 48 * (size_t)tokens[n]);
                t.w.zero_point = 0;
                cpu_matmul(&t.w, x, y0, tokens[n]);
                t.w.zero_point = zp;
                cpu_matmul(&t.w, x, y1, tokens[n]);
                assert_memory_equal(y0, y1, sizeof(float) * 48 * (size_t)tokens[n]);
                free(x), free(y0), free(y1);
            }
            assert_int_equal(weight_matrix_bytes(&t.w), stored - 48 * 256 / 32 * 2);
            free_weight(&t);
        }
    }
}

int main(void) {
    cpu_set_threads(3); /* an odd thread count: uneven byte shares, rows split mid-matrix */
    /* Every path here is held to the int16 kernels' bound (4e-5 A). The AMX tiles' default rounds
     * activations to bf16 (2 products, up to 2^-8 A): test_cpu_amx checks that precision; here the
     * tiles run with 3 products, which meet this bound, so their dispatch is still covered. */
    cpu_amx_set_products(3);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_formats),
        cmocka_unit_test(test_mlx_every_bits_and_group),
        cmocka_unit_test(test_mlx_batched_decode_sizes),
        cmocka_unit_test(test_large_shapes),
        cmocka_unit_test(test_public_entry_and_level),
        cmocka_unit_test(test_rejects_unsupported_views),
        cmocka_unit_test(test_multi_shared_x),
        cmocka_unit_test(test_q4_layouts),
        cmocka_unit_test(test_q4_planes_split_is_exact),
        cmocka_unit_test(test_exact_activations),
        cmocka_unit_test(test_q4_rows16),
        cmocka_unit_test(test_q4_rows16_splits_and_levels),
        cmocka_unit_test(test_zero_point),
        cmocka_unit_test(test_prepare_mlx_levels),
        cmocka_unit_test(test_rows16_avx2_exact),
    };
    return cmocka_run_group_tests(tests, NULL, report_checks);
}
