/* The AVX-512 matvec for 4-bit MLX matrices whose activations must not be rounded to int16
 * (weight_matrix.exact_activations: the hybrids' GatedDeltaNet input projections, whose
 * consumers amplify the rounding; weights.c says why). Every other 4-bit kernel of this level
 * multiplies the weights with activations rounded per group to int16 (steps of max|x_g|/32767).
 *
 * 16-row interleaved matrices (layout.c puts exact matrices in that layout at this level): each
 * activation is split as x = step * (256*hi + lo + res/256), hi (s8) and lo (u8) the int16
 * rounding the other kernels use, res (s8) the rounding error of that int16 in 1/256 steps. The
 * weights are read once and meet three byte planes through VNNI vpdpbusd: the int16 products as
 * in mlx4_rows16 (matmul_avx512.c) plus two more instructions per 64 weight bytes and token for
 * the residual. The error per activation is at most step/512 = 2^-24 max|x_g|: float rounding of
 * the group's largest value, where int16 alone leaves step/2 = 2^-16 max|x_g|. The products are
 * exact integers, so only the group's sum order and that 2^-24 differ from a float dot product.
 *
 * MLX-order matrices (columns not a multiple of 128, fewer than 16 rows, another level's layout)
 * and rows past the last whole block of 16: the nibbles widened to f32 and FMA'd against the
 * float activations, y = sum_g scale_g * (q_g . x_g) + bias_g * sum(x_g). Exact products too,
 * but 2-4x the instructions per weight byte: only small matrices take it.
 *
 * One job for up to CPU_MATMUL_MULTI_MAX matrices that read the same activations (q/k/v/z, b, a):
 * the activations are split once per group size, items are blocks of 16 rows of any of them,
 * and a block's tokens are done in passes of up to 4 (register budget) while its 16 rows stay in
 * cache, so the weights stream from memory once for any number of tokens. At prefill sizes the
 * residual kernel does 16 multiply-adds per instruction, as the f32 gemm's FMAs, without the
 * gemm's dequantize-and-pack of every weight per call.
 *
 * Refuses (the caller checks cpu_mlx4_exact_ok): other bit widths, group sizes not a multiple of
 * 32, more than CPU_EXACT_MAX_TOKENS tokens. */
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/cpu.h"
#include "compute/cpu/mlx_avx512.h"

#include "base/threadpool.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CPU_EXACT_MAX_GROUPS 2048 /* 65536 columns in groups of 32 */
#define EXACT_PASS_TOKENS 4       /* tokens per pass of the residual kernel (registers) */
#define FLOAT_PASS_TOKENS 8       /* tokens per pass of the float kernel */
#define EXACT_PLANE_CHUNK 384     /* bytes of planes per 128 activations */

int cpu_mlx4_exact_ok(const weight_matrix *w, int64_t n_tokens) {
    return w->format == WEIGHT_MLX_AFFINE && w->bits == 4 &&
           (w->layout == WEIGHT_LAYOUT_MLX || w->layout == WEIGHT_LAYOUT_MLX_ROWS16) && !w->group_stride &&
           w->group_size % 32 == 0 && w->cols / w->group_size <= CPU_EXACT_MAX_GROUPS &&
           n_tokens >= 1 && n_tokens <= CPU_EXACT_MAX_TOKENS;
}

/* The activations of one group size as both kernels read them. */
typedef struct exact_x {
    int64_t group_size;
    float *xsum;     /* [n][groups]: float sum of each group (the bias term) */
    float *xscale;   /* [n][groups]: the int16 step max|x_g| / 32767 */
    uint8_t *planes; /* [n][cols / 128][384] (16-row interleaved matrices only, else NULL): per
                      * 128 values hi bytes of the 64 even values (s8), of the odd ones, lo bytes
                      * (u8) even, odd, residual bytes (s8) even, odd */
} exact_x;

typedef struct exact_job {
    int n;
    const weight_matrix *ws[CPU_MATMUL_MULTI_MAX];
    float *ys[CPU_MATMUL_MULTI_MAX];
    const exact_x *xs[CPU_MATMUL_MULTI_MAX];
    int64_t first_block[CPU_MATMUL_MULTI_MAX + 1]; /* items: blocks of 16 rows, matrix after matrix */
    const float *x;                                /* [n_tokens][cols] */
    int64_t n_tokens;
} exact_job;

/* The 16-row interleaved rows of w that its residual kernel reads (a multiple of 16). */
static int64_t rows16_of(const weight_matrix *w) {
    return w->layout == WEIGHT_LAYOUT_MLX_ROWS16 ? w->rows & ~(int64_t)15 : 0;
}

/* Per group: the float sum, the int16 step, and (planes != NULL) the three byte planes of
 * x / step = 256*hi + lo + res/256 (see exact_x). */
T512 static void exact_x_prepare(const float *x, int64_t cols, int64_t gs, float *xsum, float *xscale,
                                 uint8_t *planes) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const __m512i qmax = _mm512_set1_epi32(32767), rmax = _mm512_set1_epi32(127);
    int32_t q[128], res[128];
    for (int64_t g = 0; g < cols / gs; g++) {
        const float *xs = x + g * gs;
        __m512 s = _mm512_setzero_ps(), amax = _mm512_setzero_ps();
        for (int64_t c = 0; c < gs; c += 16) {
            __m512 v = _mm512_loadu_ps(xs + c);
            s = _mm512_add_ps(s, v);
            amax = _mm512_max_ps(amax, _mm512_andnot_ps(sign, v));
        }
        float m = _mm512_reduce_max_ps(amax), step = m / 32767.0f;
        xsum[g] = _mm512_reduce_add_ps(s);
        xscale[g] = step;
        if (!planes) continue;
        __m512 inv = _mm512_set1_ps(m > 0 ? 32767.0f / m : 0.0f), vstep = _mm512_set1_ps(step);
        __m512 inv256 = _mm512_mul_ps(inv, _mm512_set1_ps(256.0f));
        for (int64_t c0 = 0; c0 < gs; c0 += 128) { /* 128 values at a time: one chunk of planes */
            int64_t len = gs - c0 < 128 ? gs - c0 : 128;
            for (int64_t c = 0; c < len; c += 16) {
                __m512 v = _mm512_loadu_ps(xs + c0 + c);
                __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv)); /* round to nearest even */
                qi = _mm512_max_epi32(_mm512_min_epi32(qi, qmax), _mm512_sub_epi32(_mm512_setzero_si512(), qmax));
                /* x - step*q exactly rounded once (fnmadd), in 1/256 steps */
                __m512 d = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(qi), vstep, v);
                __m512i ri = _mm512_cvtps_epi32(_mm512_mul_ps(d, inv256));
                ri = _mm512_max_epi32(_mm512_min_epi32(ri, rmax), _mm512_sub_epi32(_mm512_setzero_si512(), rmax));
                _mm512_storeu_si512(q + c, qi);
                _mm512_storeu_si512(res + c, ri);
            }
            int64_t v0 = g * gs + c0; /* the first value's index in the row */
            uint8_t *p = planes + (v0 >> 7) * EXACT_PLANE_CHUNK;
            for (int64_t j = 0; j < len; j++) {
                int64_t k = (v0 & 127) + j, at = (k & 1) * 64 + (k >> 1);
                p[at] = (uint8_t)(q[j] >> 8);        /* hi: floor(q / 256), -128..127 */
                p[128 + at] = (uint8_t)(q[j] & 255); /* lo: q - 256*hi, 0..255 */
                p[256 + at] = (uint8_t)(int8_t)res[j];
            }
        }
    }
}

/* One block of 16 interleaved rows (b < rows16_of(w) / 16), tokens t0 .. t0+nt: as mlx4_rows16
 * with the residual plane beside the hi plane, into y[t][16b .. 16b+16). Independent int32
 * chains per plane and token hide the vpdpbusd latency: 4 at 1 token, 2 at 2, 1 above. */
T512 INLINE void rows16_residual_block(const weight_matrix *w, const exact_x *in, int64_t t0, float *y,
                                       int64_t b, const int nt) {
    int64_t cols = w->cols, gs = w->group_size, groups = cols / gs, kpg = gs / 8;
    const int nc = nt == 1 ? 4 : nt == 2 ? 2 : 1;
    const __m512 res_unit = _mm512_set1_ps(1.0f / 256.0f);
    size_t esize = dtype_size(w->scale_dtype), ahead = cpu_matvec_prefetch();
    const uint8_t *wb = (const uint8_t *)w->data + (size_t)b * 8 * (size_t)cols;
    const uint8_t *sb = (const uint8_t *)w->scales + (size_t)(b * 16 * groups) * esize;
    const uint8_t *bb = (const uint8_t *)w->biases + (size_t)(b * 16 * groups) * esize;
    const uint8_t *xp[EXACT_PASS_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) xp[t] = in->planes + (size_t)((t0 + t) * (cols / 128)) * EXACT_PLANE_CHUNK;
    __m512 acc[EXACT_PASS_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *wg = wb + (size_t)(g * kpg) * 64;
        if (ahead)
            for (int64_t k = 0; k < kpg; k++) _mm_prefetch((const char *)wg + ahead + 64 * k, _MM_HINT_T0);
        int64_t v0 = g * gs, xoff = EXACT_PLANE_CHUNK * (v0 >> 7) + ((v0 & 127) >> 1);
        __m512i ah[EXACT_PASS_TOKENS][4], al[EXACT_PASS_TOKENS][4], ar[EXACT_PASS_TOKENS][4];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
            for (int j = 0; j < nc; j++) ah[t][j] = al[t][j] = ar[t][j] = _mm512_setzero_si512();
        for (int64_t k = 0; k < kpg; k += 2) { /* kpg is even: gs is a multiple of 32 */
#pragma GCC unroll 2
            for (int u = 0; u < 2; u++) {
                __m512i we, wo;
                split_nibbles(_mm512_loadu_si512(wg + 64 * (k + u)), &we, &wo);
                const int je = nc == 4 ? 2 * u : 0, jo = nc == 1 ? 0 : je + 1;
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) {
                    const uint8_t *xb = xp[t] + xoff + 4 * (k + u);
                    rows16_q4_planes(ah[t], al[t], je, jo, we, wo, xb); /* the int16 planes, as mlx_rows16 */
                    ar[t][je] = dpbusd_bcast(ar[t][je], we, xb + 256);
                    ar[t][jo] = dpbusd_bcast(ar[t][jo], wo, xb + 320);
                }
            }
        }
        __m512 sc = scales_load16(w->scale_dtype, sb, g * 16, 0xffff);
        __m512 bi = scales_load16(w->scale_dtype, bb, g * 16, 0xffff);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
#pragma GCC unroll 4
            for (int j = 1; j < nc; j++) {
                ah[t][0] = _mm512_add_epi32(ah[t][0], ah[t][j]);
                al[t][0] = _mm512_add_epi32(al[t][0], al[t][j]);
                ar[t][0] = _mm512_add_epi32(ar[t][0], ar[t][j]);
            }
            /* |256*hi + lo| <= 32767 and the weights <= 15: the int16 sum fits int32 */
            __m512i a = _mm512_add_epi32(_mm512_slli_epi32(ah[t][0], 8), al[t][0]);
            __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ar[t][0]), res_unit, _mm512_cvtepi32_ps(a));
            int64_t tg = (t0 + t) * groups + g;
            acc[t] = _mm512_fmadd_ps(dot, _mm512_mul_ps(sc, _mm512_set1_ps(in->xscale[tg])), acc[t]);
            acc[t] = _mm512_fmadd_ps(bi, _mm512_set1_ps(in->xsum[tg]), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + (t0 + t) * w->rows + 16 * b, acc[t]);
}

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

/* MLX-order rows [r0, r1) (rows at or past rows16_of(w) of an interleaved matrix are in MLX
 * order too), tokens t0 .. t0+n (n <= FLOAT_PASS_TOKENS), with float activations. Two FMA chains
 * per group and token so the FMA latency does not pace one token's stream. */
T512 static void float_rows(const weight_matrix *w, const float *x, const exact_x *in, int64_t t0,
                            int64_t n, float *y, int64_t r0, int64_t r1) {
    x += t0 * w->cols;
    y += t0 * w->rows;
    int64_t cols = w->cols, gs = w->group_size, groups = cols / gs;
    float scale[CPU_EXACT_MAX_GROUPS], bias[CPU_EXACT_MAX_GROUPS];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * (size_t)(cols / 2);
        row_scales(w, r, groups, scale, bias);
        __m512 acc[FLOAT_PASS_TOKENS];
        float bias_sum[FLOAT_PASS_TOKENS];
        for (int64_t t = 0; t < n; t++) acc[t] = _mm512_setzero_ps(), bias_sum[t] = 0;
        for (int64_t g = 0; g < groups; g++) {
            __m512 part[FLOAT_PASS_TOKENS][2];
            for (int64_t t = 0; t < n; t++) part[t][0] = part[t][1] = _mm512_setzero_ps();
            for (int64_t c = g * gs, h = 0; c < (g + 1) * gs; c += 32, h ^= 1) {
                __m512 w0, w1;
                widen32(q + c / 2, &w0, &w1);
                for (int64_t t = 0; t < n; t++) {
                    const float *xt = x + t * cols + c;
                    part[t][h] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), part[t][h]);
                    part[t][h] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + 16), part[t][h]);
                }
            }
            for (int64_t t = 0; t < n; t++) {
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(scale[g]), _mm512_add_ps(part[t][0], part[t][1]), acc[t]);
                bias_sum[t] += bias[g] * in->xsum[(t0 + t) * groups + g];
            }
        }
        for (int64_t t = 0; t < n; t++) y[t * w->rows + r] = _mm512_reduce_add_ps(acc[t]) + bias_sum[t];
    }
}

T512 static void exact_blocks(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const exact_job *j = ctx;
    int i = 0;
    for (int64_t item = begin; item < end; item++) {
        while (item >= j->first_block[i + 1]) i++;
        const weight_matrix *w = j->ws[i];
        int64_t b = item - j->first_block[i];
        if (16 * b >= rows16_of(w)) {
            int64_t r1 = 16 * b + 16 < w->rows ? 16 * b + 16 : w->rows;
            for (int64_t t0 = 0; t0 < j->n_tokens; t0 += FLOAT_PASS_TOKENS) {
                int64_t nt = j->n_tokens - t0 < FLOAT_PASS_TOKENS ? j->n_tokens - t0 : FLOAT_PASS_TOKENS;
                float_rows(w, j->x, j->xs[i], t0, nt, j->ys[i], 16 * b, r1);
            }
            continue;
        }
        for (int64_t t0 = 0; t0 < j->n_tokens; t0 += EXACT_PASS_TOKENS) {
            int64_t nt = j->n_tokens - t0 < EXACT_PASS_TOKENS ? j->n_tokens - t0 : EXACT_PASS_TOKENS;
            switch (nt) {
            case 1: rows16_residual_block(w, j->xs[i], t0, j->ys[i], b, 1); break;
            case 2: rows16_residual_block(w, j->xs[i], t0, j->ys[i], b, 2); break;
            case 3: rows16_residual_block(w, j->xs[i], t0, j->ys[i], b, 3); break;
            default: rows16_residual_block(w, j->xs[i], t0, j->ys[i], b, 4); break;
            }
        }
    }
}

/* Fills xs[0 .. *n_xs) for the distinct group sizes of ws and points job->xs at them; the
 * memory is one block the caller frees. Returns it, or NULL when out of memory. */
static void *exact_job_prepare(exact_job *job, exact_x *xs, int *n_xs) {
    int64_t n = job->n_tokens, cols = job->ws[0]->cols;
    int any_rows16 = 0;
    for (int i = 0; i < job->n; i++) any_rows16 |= rows16_of(job->ws[i]) > 0;
    size_t plane_bytes = any_rows16 ? (size_t)(n * (cols / 128)) * EXACT_PLANE_CHUNK : 0;
    size_t per_size = 2 * (size_t)(n * (cols / 32)) * sizeof(float) + plane_bytes; /* groups <= cols/32 */
    char *mem = malloc(CPU_MATMUL_MULTI_MAX * per_size + 64);
    if (!mem) return NULL;
    *n_xs = 0;
    for (int i = 0; i < job->n; i++) {
        int64_t gs = job->ws[i]->group_size, groups = cols / gs;
        int found = -1;
        for (int k = 0; k < *n_xs && found < 0; k++)
            if (xs[k].group_size == gs) found = k;
        if (found < 0) {
            exact_x *e = &xs[found = (*n_xs)++];
            char *base = mem + (size_t)found * per_size;
            e->group_size = gs;
            e->xsum = (float *)base;
            e->xscale = e->xsum + n * groups;
            e->planes = any_rows16 ? (uint8_t *)(e->xscale + n * groups) : NULL;
            for (int64_t t = 0; t < n; t++)
                exact_x_prepare(job->x + t * cols, cols, gs, e->xsum + t * groups, e->xscale + t * groups,
                                e->planes ? e->planes + (size_t)(t * (cols / 128)) * EXACT_PLANE_CHUNK : NULL);
        }
        job->xs[i] = &xs[found];
    }
    return mem;
}

int cpu_mlx4_exact_matmul_multi(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                                int64_t n_tokens) {
    if (n < 1 || n > CPU_MATMUL_MULTI_MAX) return -1;
    exact_job job = {.n = n, .x = x, .n_tokens = n_tokens};
    for (int i = 0; i < n; i++) {
        if (!cpu_mlx4_exact_ok(ws[i], n_tokens) || ws[i]->cols != ws[0]->cols) return -1;
        if (rows16_of(ws[i]) && ws[i]->cols % 128) return -1; /* layout.c never makes such a matrix */
        job.ws[i] = ws[i];
        job.ys[i] = ys[i];
        job.first_block[i + 1] = job.first_block[i] + (ws[i]->rows + 15) / 16;
    }
    exact_x xs[CPU_MATMUL_MULTI_MAX];
    int n_xs = 0;
    void *mem = exact_job_prepare(&job, xs, &n_xs);
    if (!mem) return -1;
    threadpool *pool = cpu_thread_pool();
    int64_t items = job.first_block[n], threads = pool ? threadpool_size(pool) : 1;
    int64_t chunk = items / (threads * 8);
    threadpool_parallel_for_dynamic(pool, items, chunk > 0 ? chunk : 1, exact_blocks, &job);
    free(mem);
    return 0;
}

int cpu_mlx4_exact_matmul(const weight_matrix *w, const float *x, float *y, int64_t n_tokens) {
    return cpu_mlx4_exact_matmul_multi(1, &w, x, &y, n_tokens);
}

#else

int cpu_mlx4_exact_ok(const weight_matrix *w, int64_t n_tokens) {
    (void)w, (void)n_tokens;
    return 0;
}

int cpu_mlx4_exact_matmul_multi(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                                int64_t n_tokens) {
    (void)n, (void)ws, (void)x, (void)ys, (void)n_tokens;
    return -1;
}

int cpu_mlx4_exact_matmul(const weight_matrix *w, const float *x, float *y, int64_t n_tokens) {
    (void)w, (void)x, (void)y, (void)n_tokens;
    return -1;
}

#endif
