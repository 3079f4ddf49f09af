/* The AMX tiles (compute/cpu/matmul_amx.c) against cpu_matmul_reference on random 4- and 8-bit
 * MLX matrices in the 16-row interleaved layout: g32/g64/g128, f16/bf16/f32 scales, zero-point
 * (GGUF Q4_0/Q8_0) and real biases, token counts that are not whole 16-token tiles, K longer than
 * one chunk, an odd number of 16-row blocks (a unit of one block), several matrices of mixed
 * widths in one call; and the fallback: with the tiles off (or on a CPU without AMX), the same
 * calls give the same results through the AVX-512 kernels.
 *
 * Tolerance, per output y[t][r]: |y - ref| <= 4e-5 * A + 1e-6, A = max_c |x[t][c]| *
 * sum_c (|W[r][c]| + |bias|), test_cpu_matmul's bound. The tiles split every weight into two
 * bf16 numbers (hi truncated, lo rounded: within 2^-15 of |w|, exact for 4-bit weights with an
 * f16 scale and zero point). Both precisions of matmul_amx.c are checked:
 * - 3 products (EXO_AMX_PRODUCTS=3): the activations split too, the lo x lo product dropped;
 *   against the f32 reference, far under 4e-5 in practice (~1e-7; the largest ratio is printed).
 * - 2 products (the default): each activation rounded to one bf16. Against the reference on the
 *   same bf16-rounded activations the bound is 4e-5 as above (only the weights' split remains);
 *   against the f32 activations, at most 2^-8 A more (the rounding of each |x|; ~2e-5 in
 *   practice, printed).
 * A wrong index, step or scale is an error of order A. The test also asserts the tiles did run
 * where AMX is available (cpu_amx_ok), so it cannot pass by falling back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "compute/cpu/cpu.h"
#include "compute/cpu/cpu_levels.h"
#include "compute/cpu/matmul_amx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string.h>

#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include "test_random.h"

static uint16_t to_scale_bits(dtype t, float v) {
    return t == DTYPE_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}

static float scale_value(dtype t, const void *p, int64_t i) {
    if (t == DTYPE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* A random MLX matrix, repacked into the 16-row layout (memory owned by the view). Every other
 * one has its biases, scales and data side by side in one allocation, as a placed checkpoint has
 * them: 8-bit MLX ones then take their scales and biases inline (weight_matrix.group_stride). */
static int next_side_by_side;

static weight_matrix make_rows16(int64_t rows, int64_t cols, int bits, int gs, dtype sdt, int zero_point) {
    weight_matrix w = {.format = WEIGHT_MLX_AFFINE, .rows = rows, .cols = cols, .bits = bits,
                       .group_size = gs, .scale_dtype = sdt, .zero_point = zero_point};
    size_t words = (size_t)(rows * cols * bits / 32), groups = (size_t)(rows * cols / gs);
    uint32_t *q = malloc(words * 4);
    for (size_t i = 0; i < words; i++) q[i] = rng_u32() ^ (rng_u32() << 16);
    size_t es = sdt == DTYPE_F32 ? 4 : 2;
    void *s, *b;
    if (next_side_by_side++ % 2) {
        b = malloc(2 * groups * es + words * 4), s = (char *)b + groups * es;
        uint32_t *d = (uint32_t *)((char *)s + groups * es);
        memcpy(d, q, words * 4);
        free(q), q = d;
    } else {
        s = malloc(groups * es), b = malloc(groups * es);
    }
    for (size_t g = 0; g < groups; g++) {
        float sc = rng_uniform(0.001f, 0.03f);
        if (es == 2) ((uint16_t *)s)[g] = to_scale_bits(sdt, sc);
        else ((float *)s)[g] = sc;
        sc = scale_value(sdt, s, (int64_t)g);
        float bias = zero_point ? -(float)zero_point * sc : rng_uniform(-0.2f, 0.2f);
        if (es == 2) ((uint16_t *)b)[g] = to_scale_bits(sdt, bias);
        else ((float *)b)[g] = bias;
    }
    w.data = q, w.scales = s, w.biases = b;
    assert_int_equal(cpu_weight_repack_rows16(&w), 0);
    return w;
}

static void free_matrix(weight_matrix *w) {
    size_t sb = (size_t)(w->rows * (w->cols / w->group_size)) * dtype_size(w->scale_dtype);
    if (w->group_stride) free((void *)w->data); /* moved inline: the allocation starts with the data */
    else if ((const char *)w->biases + sb == (const char *)w->scales) free((void *)w->biases); /* one allocation */
    else free((void *)w->data), free((void *)w->scales), free((void *)w->biases);
}

/* The largest |y - ref| / (A + 1e-6 / 4e-5) over the outputs: <= 4e-5 passes. */
static double max_ratio(const weight_matrix *w, const float *x, const float *y, int64_t n) {
    float *ref = malloc((size_t)(n * w->rows) * sizeof *ref), *row = malloc((size_t)w->cols * sizeof *row);
    cpu_matmul_reference(w, x, ref, n);
    double worst = 0;
    for (int64_t r = 0; r < w->rows; r++) {
        weight_matrix_row_to_f32(w, r, row);
        double wsum = 0;
        for (int64_t c = 0; c < w->cols; c++)
            wsum += fabs(row[c]) + fabs(scale_value(w->scale_dtype, w->biases, weight_mlx_group(w, r, c / w->group_size)));
        for (int64_t t = 0; t < n; t++) {
            double xmax = 0;
            for (int64_t c = 0; c < w->cols; c++) xmax = fmax(xmax, fabs(x[t * w->cols + c]));
            double e = fabs((double)y[t * w->rows + r] - ref[t * w->rows + r]) / (xmax * wsum + 1e-6 / 4e-5);
            if (!(e <= worst)) worst = e; /* NaN becomes the worst */
        }
    }
    free(ref), free(row);
    return worst;
}

static double worst_seen[3]; /* 3 products; 2 products against bf16 x; 2 products against f32 x */

/* x rounded to bf16 (nearest, ties to even: what the tiles' vcvtne2ps2bf16 does). */
static float *bf16_rounded(const float *x, int64_t n) {
    float *r = malloc((size_t)n * sizeof *r);
    for (int64_t i = 0; i < n; i++) r[i] = bf16_to_f32(f32_to_bf16(x[i]));
    return r;
}

/* ws through the tiles (when AMX is here) and through cpu_matmul_multi with the tiles off: both
 * within the bound of the reference. */
static void check(int n, weight_matrix *ws, int64_t n_tokens) {
    int64_t cols = ws[0].cols;
    float *x = random_x(n_tokens, cols), *ys[CPU_MATMUL_MULTI_MAX];
    const weight_matrix *wp[CPU_MATMUL_MULTI_MAX];
    for (int i = 0; i < n; i++) {
        wp[i] = &ws[i];
        ys[i] = malloc((size_t)(n_tokens * ws[i].rows) * sizeof(float));
    }
    float *xr = bf16_rounded(x, n_tokens * cols);
    cpu_amx_set_enabled(1);
    for (int products = 3; products >= 2 && cpu_amx_available(); products--) {
        cpu_amx_set_products(products);
        for (int i = 0; i < n; i++) assert_true(cpu_amx_ok(&ws[i], n_tokens));
        for (int i = 0; i < n; i++) memset(ys[i], 0xff, (size_t)(n_tokens * ws[i].rows) * sizeof(float)); /* NaN */
        assert_int_equal(cpu_amx_matmul_multi(n, wp, x, ys, n_tokens), 0);
        for (int i = 0; i < n; i++) {
            double e = max_ratio(&ws[i], products == 3 ? x : xr, ys[i], n_tokens);
            double ef = products == 3 ? e : max_ratio(&ws[i], x, ys[i], n_tokens);
            if (!(e <= 4e-5) || !(ef <= 0x1p-8 + 4e-5))
                fail_msg("amx %d products %d-bit g%d %s zp %d %lldx%lld n %lld: error %.3g A (%.3g A against f32 x)",
                         products, ws[i].bits, ws[i].group_size, dtype_name(ws[i].scale_dtype), ws[i].zero_point,
                         (long long)ws[i].rows, (long long)cols, (long long)n_tokens, e, ef);
            worst_seen[3 - products] = fmax(worst_seen[3 - products], e);
            if (products == 2) worst_seen[2] = fmax(worst_seen[2], ef);
        }
    }
    cpu_amx_set_products(-1);
    free(xr);
    cpu_amx_set_enabled(0); /* the fallback: what a CPU without AMX runs */
    assert_false(cpu_amx_ok(&ws[0], n_tokens));
    cpu_matmul_multi(n, wp, x, ys, n_tokens);
    for (int i = 0; i < n; i++) assert_true(max_ratio(&ws[i], x, ys[i], n_tokens) <= 4e-5);
    cpu_amx_set_enabled(-1);
    for (int i = 0; i < n; i++) free(ys[i]);
    free(x);
}

/* The generic level reads 16-row interleaved matrices in no kernel (cpu_matmul refuses them), so
 * under EXO_CPU_SIMD=generic there is no fallback to compare: skipped, not failed. */
static int rows16_readable(void) {
    return cpu_level_supported(CPU_LEVEL_AVX2);
}

static void test_amx_matches_reference(void **state) {
    (void)state;
    if (!rows16_readable()) skip();
    int groups[] = {32, 64, 128};
    dtype sdts[] = {DTYPE_F16, DTYPE_BF16, DTYPE_F32};
    int64_t shapes[][2] = {{32, 128}, {48, 384}, {16, 640}}; /* 48: a unit of one block; 640: two K chunks */
    int64_t tokens[] = {CPU_AMX_MIN_TOKENS, CPU_AMX_MIN_TOKENS + 1, 67}; /* whole and partial 16-token tiles */
    int k = 0;
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t sh = 0; sh < 3; sh++)
            for (size_t g = 0; g < 3; g++, k++) {
                int zp = g == 0 && sh != 1 ? (bits == 4 ? 8 : 128) : 0; /* GGUF Q4_0 / Q8_0 */
                weight_matrix w = make_rows16(shapes[sh][0], shapes[sh][1], bits, groups[g], sdts[k % 3], zp);
                check(1, &w, tokens[k % 3]);
                free_matrix(&w);
            }
    if (cpu_amx_available())
        printf("largest error seen: 3 products %.3g A (bound 4e-5 A); 2 products %.3g A against bf16-rounded x "
               "(bound 4e-5 A), %.3g A against f32 x (bound 2^-8 A)\n", worst_seen[0], worst_seen[1], worst_seen[2]);
    else printf("no AMX on this CPU: only the fallback was checked\n");
}

/* q/k/v-like: three matrices of one column count, 4- and 8-bit (a Q4_K_M layer's attn_v is Q6_K,
 * read as 8-bit), one call. */
static void test_amx_multi_mixed(void **state) {
    (void)state;
    if (!rows16_readable()) skip();
    weight_matrix ws[3] = {make_rows16(64, 256, 4, 32, DTYPE_F16, 0), make_rows16(32, 256, 8, 32, DTYPE_F16, 0),
                           make_rows16(16, 256, 4, 32, DTYPE_F16, 8)};
    check(3, ws, CPU_AMX_MIN_TOKENS + 9);
    for (int i = 0; i < 3; i++) free_matrix(&ws[i]);
}

/* What the tiles refuse: too few tokens, MLX order, other widths. */
static void test_amx_refuses(void **state) {
    (void)state;
    cpu_amx_set_enabled(1);
    weight_matrix w = make_rows16(32, 128, 4, 32, DTYPE_F16, 0);
    assert_false(cpu_amx_ok(&w, CPU_AMX_MIN_TOKENS - 1));
    weight_matrix mlx = w;
    mlx.layout = WEIGHT_LAYOUT_MLX;
    assert_false(cpu_amx_ok(&mlx, 64));
    mlx = w;
    mlx.bits = 5;
    assert_false(cpu_amx_ok(&mlx, 64));
    assert_int_equal(cpu_amx_ok(&w, 64), cpu_amx_available());
    cpu_amx_set_enabled(-1);
    free_matrix(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amx_matches_reference),
        cmocka_unit_test(test_amx_multi_mixed),
        cmocka_unit_test(test_amx_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
