/* AVX2 + FMA + F16C kernels: the level for x86-64 CPUs without AVX-512 (Haswell .. Alder Lake,
 * Zen 1-3). Compiled with per-function target attributes; cpu.c calls them after CPUID said yes.
 *
 * matvec, dense: weights widened to f32 eight at a time and FMA'd against each token.
 * matvec, MLX affine: 8 packed values (`bits` bytes) are broadcast to both 128-bit halves, one
 * vpshufb puts the two bytes holding value k into 32-bit lane k, vpsrlvd + AND extract it, and it
 * is converted to f32 and FMA'd with the activations into a per-group accumulator that is scaled
 * at the end of the group; the bias term is sum_g bias_g * sum(x in group g). Exact f32 math: no
 * activation quantization on this level.
 * gemm: dequantized tiles go to OpenBLAS sgemm (gemm_tile = NULL). */
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/matvec_dispatch.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#define T256 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

T256 INLINE __m256 dense_load8(weight_format f, const void *row, int64_t i) {
    if (f == WEIGHT_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (f == WEIGHT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

T256 INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float scalar_weight(weight_format f, const void *row, int64_t i) {
    if (f == WEIGHT_F32) return ((const float *)row)[i];
    if (f == WEIGHT_F16) return f16_to_f32(((const uint16_t *)row)[i]);
    return bf16_to_f32(((const uint16_t *)row)[i]);
}

T256 INLINE void dense_rows(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                            int64_t r1, const weight_format f, const int nt) {
    int64_t cols = w->cols, rows = w->rows;
    size_t esize = f == WEIGHT_F32 ? 4 : 2;
    for (int64_t r = r0; r < r1; r++) {
        const void *row = (const char *)w->data + (size_t)(r * cols) * esize;
        __m256 acc[CPU_MATVEC_MAX_TOKENS][2];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 16 <= cols; c += 16) {
            __m256 w0 = dense_load8(f, row, c), w1 = dense_load8(f, row, c + 8);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const float *x = in->x + t * cols + c;
                acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), acc[t][0]);
                acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), acc[t][1]);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            float s = hsum8(_mm256_add_ps(acc[t][0], acc[t][1]));
            for (int64_t cc = c; cc < cols; cc++) s += scalar_weight(f, row, cc) * in->x[t * cols + cc];
            y[t * rows + r] = s;
        }
    }
}

static float scale_value(dtype t, const void *p, int64_t i) {
    if (t == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    if (t == DTYPE_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

typedef struct unpack8_consts {
    __m256i idx, shifts, mask;
    int bits;
} unpack8_consts;

T256 INLINE unpack8_consts unpack8_setup(int bits) {
    unpack8_consts u;
    int8_t idx[32];
    int32_t sh[8];
    for (int k = 0; k < 8; k++) {
        int bit = k * bits, lane = k >= 4 ? 16 : 0; /* lanes 4..7 live in the upper 128 bits */
        idx[(lane ? 16 : 0) + 4 * (k & 3)] = (int8_t)(bit >> 3);
        idx[(lane ? 16 : 0) + 4 * (k & 3) + 1] = (int8_t)((bit >> 3) + 1);
        idx[(lane ? 16 : 0) + 4 * (k & 3) + 2] = (int8_t)0x80;
        idx[(lane ? 16 : 0) + 4 * (k & 3) + 3] = (int8_t)0x80;
        sh[k] = bit & 7;
    }
    u.idx = _mm256_loadu_si256((const __m256i *)idx);
    u.shifts = _mm256_loadu_si256((const __m256i *)sh);
    u.mask = _mm256_set1_epi32((1 << bits) - 1);
    u.bits = bits;
    return u;
}

/* 8 consecutive packed values (u->bits bytes at p) -> 8 f32. */
T256 INLINE __m256 unpack8(const unpack8_consts *u, const uint8_t *p) {
    uint64_t raw = 0;
    memcpy(&raw, p, (size_t)u->bits);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)raw), u->idx);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(v, u->shifts), u->mask));
}

T256 INLINE void mlx_rows(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                          int64_t r1, const int nt) {
    int64_t cols = w->cols, rows = w->rows, gs = w->group_size, groups = cols / gs;
    unpack8_consts u = unpack8_setup(w->bits);
    size_t row_bytes = (size_t)cols * (size_t)w->bits / 8;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * row_bytes;
        __m256 acc[CPU_MATVEC_MAX_TOKENS];
        float bias_term[CPU_MATVEC_MAX_TOKENS] = {0};
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t g = 0; g < groups; g++) {
            __m256 gacc[CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) gacc[t] = _mm256_setzero_ps();
            for (int64_t c = g * gs; c < (g + 1) * gs; c += 8) {
                __m256 v = unpack8(&u, q);
                q += u.bits;
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++)
                    gacc[t] = _mm256_fmadd_ps(v, _mm256_loadu_ps(in->x + t * cols + c), gacc[t]);
            }
            float s = scale_value(w->scale_dtype, w->scales, r * groups + g);
            float b = scale_value(w->scale_dtype, w->biases, r * groups + g);
            __m256 sv = _mm256_set1_ps(s);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                acc[t] = _mm256_fmadd_ps(gacc[t], sv, acc[t]);
                bias_term[t] += b * in->xsum[t * groups + g];
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) y[t * rows + r] = hsum8(acc[t]) + bias_term[t];
    }
}

T256 static void matvec_mlx(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0, int64_t r1) {
    CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx_rows, w, in, y, r0, r1)
}

CPU_MATVEC_BY_FORMAT(T256, avx2_matvec, dense_rows, matvec_mlx)

T256 static void avx2_dequant(const weight_matrix *w, int64_t r, int64_t c0, int64_t len, float *out) {
    int64_t cols = w->cols;
    if (w->format != WEIGHT_MLX_AFFINE) {
        const void *row = (const char *)w->data + (size_t)(r * cols) * (w->format == WEIGHT_F32 ? 4 : 2);
        int64_t c = 0;
        for (; c + 8 <= len; c += 8) _mm256_storeu_ps(out + c, dense_load8(w->format, row, c0 + c));
        for (; c < len; c++) out[c] = scalar_weight(w->format, row, c0 + c);
        return;
    }
    int64_t gs = w->group_size, groups = cols / gs;
    unpack8_consts u = unpack8_setup(w->bits);
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * ((size_t)cols * (size_t)w->bits / 8) +
                       (size_t)(c0 / 8) * (size_t)w->bits;
    for (int64_t c = 0; c < len; c += gs) {
        int64_t g = r * groups + (c0 + c) / gs;
        __m256 s = _mm256_set1_ps(scale_value(w->scale_dtype, w->scales, g));
        __m256 b = _mm256_set1_ps(scale_value(w->scale_dtype, w->biases, g));
        for (int64_t i = 0; i < gs; i += 8) {
            _mm256_storeu_ps(out + c + i, _mm256_fmadd_ps(unpack8(&u, q), s, b));
            q += u.bits;
        }
    }
}

const cpu_kernels cpu_kernels_avx2 = {
    .name = "avx2",
    .needs_int16_x = 0,
    .matvec = avx2_matvec,
    .dequant = avx2_dequant,
    .gemm_tile = NULL,
};

#endif
