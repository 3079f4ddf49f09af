/* The AVX-512 matvec for 4-bit MLX matrices whose activations must stay float
 * (weight_matrix.exact_activations): the level's own 4-bit kernels round each group of
 * activations to int16 for their integer dot products, which a few matrices' consumers amplify
 * (the hybrids' q/k/v projection). Here the nibbles are widened to f32 and FMA'd against the
 * float activations: y = sum_g scale_g * (q_g . x_g) + bias_g * sum(x_g), the products exact,
 * only the summation order differing from the reference. Memory-bound like the other matvecs:
 * 16 bytes of weights feed two 16-lane FMAs per token.
 *
 * Refuses (the caller checks cpu_mlx4_exact_ok): other bit widths, the interleaved layout,
 * more than CPU_EXACT_MAX_TOKENS tokens. */
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/cpu.h"
#include "compute/cpu/mlx_avx512.h"

#include "base/threadpool.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define CPU_EXACT_MAX_GROUPS 2048 /* 65536 columns in groups of 32 */

int cpu_mlx4_exact_ok(const weight_matrix *w, int64_t n_tokens) {
    return w->format == WEIGHT_MLX_AFFINE && w->bits == 4 && w->layout == WEIGHT_LAYOUT_MLX &&
           w->group_size % 32 == 0 && w->cols / w->group_size <= CPU_EXACT_MAX_GROUPS &&
           n_tokens >= 1 && n_tokens <= CPU_EXACT_MAX_TOKENS;
}

typedef struct exact_job {
    const weight_matrix *w;
    const float *x, *xsum; /* [n][cols], [n][groups] */
    float *y;              /* [n][rows] */
    int64_t n;
} exact_job;

#define EXACT_ROWS_PER_ITEM 16

/* 32 values from 16 packed bytes (value 2i is byte i's low nibble, 2i+1 its high one), as f32 */
T512 INLINE void widen32(const uint8_t *q, __m512 *w0, __m512 *w1) {
    const __m128i nibble = _mm_set1_epi8(0x0F);
    __m128i bytes = _mm_loadu_si128((const __m128i *)q);
    __m128i lo = _mm_and_si128(bytes, nibble);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    *w0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    *w1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
}

/* Row r's group scales and biases as f32, converted inline (a call per group would make the
 * compiler spill every vector register around it). */
T512 static void row_scales(const weight_matrix *w, int64_t r, int64_t groups, float *s, float *b) {
    for (int64_t g = 0; g < groups; g++) {
        int64_t i = r * groups + g;
        if (w->scale_dtype == DTYPE_F32) {
            s[g] = ((const float *)w->scales)[i];
            b[g] = ((const float *)w->biases)[i];
        } else if (w->scale_dtype == DTYPE_BF16) {
            uint32_t sb = (uint32_t)((const uint16_t *)w->scales)[i] << 16;
            uint32_t bb = (uint32_t)((const uint16_t *)w->biases)[i] << 16;
            memcpy(&s[g], &sb, 4);
            memcpy(&b[g], &bb, 4);
        } else {
            s[g] = _cvtsh_ss(((const uint16_t *)w->scales)[i]);
            b[g] = _cvtsh_ss(((const uint16_t *)w->biases)[i]);
        }
    }
}

/* One token (decode at batch 1): four independent FMA chains per group, so the FMA latency does
 * not pace the stream. */
T512 static void exact_rows_one_token(const exact_job *j, int64_t r0, int64_t r1) {
    const weight_matrix *w = j->w;
    int64_t cols = w->cols, gs = w->group_size, groups = cols / gs;
    float scale[CPU_EXACT_MAX_GROUPS], bias[CPU_EXACT_MAX_GROUPS];
    size_t row_bytes = (size_t)(cols / 2);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * row_bytes;
        __m512 acc = _mm512_setzero_ps();
        float bias_sum = 0;
        row_scales(w, r, groups, scale, bias);
        for (int64_t g = 0; g < groups; g++) {
            __m512 p0 = _mm512_setzero_ps(), p1 = p0, p2 = p0, p3 = p0, w0, w1, w2, w3;
            int64_t c = g * gs, end = c + gs;
            for (; c + 64 <= end; c += 64) {
                widen32(q + c / 2, &w0, &w1);
                widen32(q + c / 2 + 16, &w2, &w3);
                p0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(j->x + c), p0);
                p1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(j->x + c + 16), p1);
                p2 = _mm512_fmadd_ps(w2, _mm512_loadu_ps(j->x + c + 32), p2);
                p3 = _mm512_fmadd_ps(w3, _mm512_loadu_ps(j->x + c + 48), p3);
            }
            if (c < end) { /* group of 32 */
                widen32(q + c / 2, &w0, &w1);
                p0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(j->x + c), p0);
                p1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(j->x + c + 16), p1);
            }
            __m512 part = _mm512_add_ps(_mm512_add_ps(p0, p1), _mm512_add_ps(p2, p3));
            acc = _mm512_fmadd_ps(_mm512_set1_ps(scale[g]), part, acc);
            bias_sum += bias[g] * j->xsum[g];
        }
        j->y[r] = _mm512_reduce_add_ps(acc) + bias_sum;
    }
}

T512 static void exact_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const exact_job *j = ctx;
    if (j->n == 1) {
        int64_t r1 = end * EXACT_ROWS_PER_ITEM < j->w->rows ? end * EXACT_ROWS_PER_ITEM : j->w->rows;
        exact_rows_one_token(j, begin * EXACT_ROWS_PER_ITEM, r1);
        return;
    }
    const weight_matrix *w = j->w;
    int64_t cols = w->cols, gs = w->group_size, groups = cols / gs, n = j->n;
    int64_t r1 = end * EXACT_ROWS_PER_ITEM < w->rows ? end * EXACT_ROWS_PER_ITEM : w->rows;
    float scale[CPU_EXACT_MAX_GROUPS], bias[CPU_EXACT_MAX_GROUPS];
    for (int64_t r = begin * EXACT_ROWS_PER_ITEM; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * (size_t)(cols / 2);
        row_scales(w, r, groups, scale, bias);
        __m512 acc[CPU_EXACT_MAX_TOKENS];
        float bias_sum[CPU_EXACT_MAX_TOKENS];
        for (int64_t t = 0; t < n; t++) acc[t] = _mm512_setzero_ps(), bias_sum[t] = 0;
        for (int64_t g = 0; g < groups; g++) {
            __m512 part[CPU_EXACT_MAX_TOKENS];
            for (int64_t t = 0; t < n; t++) part[t] = _mm512_setzero_ps();
            for (int64_t c = g * gs; c < (g + 1) * gs; c += 32) {
                __m512 w0, w1;
                widen32(q + c / 2, &w0, &w1);
                for (int64_t t = 0; t < n; t++) {
                    const float *xt = j->x + t * cols + c;
                    part[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), part[t]);
                    part[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + 16), part[t]);
                }
            }
            for (int64_t t = 0; t < n; t++) {
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(scale[g]), part[t], acc[t]);
                bias_sum[t] += bias[g] * j->xsum[t * groups + g];
            }
        }
        for (int64_t t = 0; t < n; t++) j->y[t * w->rows + r] = _mm512_reduce_add_ps(acc[t]) + bias_sum[t];
    }
}

int cpu_mlx4_exact_matmul(const weight_matrix *w, const float *x, float *y, int64_t n_tokens) {
    int64_t groups = w->cols / w->group_size;
    float *xsum = malloc((size_t)(n_tokens * groups) * sizeof *xsum);
    if (!xsum) return -1;
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t g = 0; g < groups; g++) {
            float s = 0;
            for (int64_t i = 0; i < w->group_size; i++) s += x[t * w->cols + g * w->group_size + i];
            xsum[t * groups + g] = s;
        }
    exact_job j = {.w = w, .x = x, .xsum = xsum, .y = y, .n = n_tokens};
    int64_t items = (w->rows + EXACT_ROWS_PER_ITEM - 1) / EXACT_ROWS_PER_ITEM;
    threadpool_parallel_for_dynamic(cpu_thread_pool(), items, 1, exact_rows, &j);
    free(xsum);
    return 0;
}

#else

int cpu_mlx4_exact_ok(const weight_matrix *w, int64_t n_tokens) {
    (void)w, (void)n_tokens;
    return 0;
}

int cpu_mlx4_exact_matmul(const weight_matrix *w, const float *x, float *y, int64_t n_tokens) {
    (void)w, (void)x, (void)y, (void)n_tokens;
    return -1;
}

#endif
