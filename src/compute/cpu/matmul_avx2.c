/* AVX2 + FMA + F16C kernels: the level for x86-64 CPUs without AVX-512 (Haswell .. Alder Lake,
 * Zen 1-3). Compiled with per-function target attributes; cpu.c calls them after CPUID said yes.
 *
 * matvec, dense: weights widened to f32 eight at a time and FMA'd against each token.
 * matvec, MLX affine: 8 packed values (`bits` bytes) are broadcast to both 128-bit halves, one
 * vpshufb puts the two bytes holding value k into 32-bit lane k, vpsrlvd + AND extract it, and it
 * is converted to f32 and FMA'd with the activations into a per-group accumulator that is scaled
 * at the end of the group; the bias term is sum_g bias_g * sum(x in group g). Exact f32 math: no
 * activation quantization on this level, except for the interleaved 4-bit layout (mlx4_rows16).
 * gemm: dequantized tiles go to OpenBLAS sgemm (gemm_tile = NULL). */
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/matvec_dispatch.h"

#if defined(__x86_64__)

#include <cpuid.h>
#include <immintrin.h>
#include <stdlib.h>
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
            for (int64_t cc = c; cc < cols; cc++) s += cpu_dense_at(f, row, cc) * in->x[t * cols + cc];
            y[t * rows + r] = s;
        }
    }
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
    /* loads of constant widths into a register: a memcpy of the run-time size was a libc call
     * per 8 values, and byte copies into a zeroed word a store-forwarding stall (0.4 GB/s) */
    uint64_t raw;
    uint32_t w32;
    uint16_t w16;
    switch (u->bits) {
    case 2: memcpy(&w16, p, 2), raw = w16; break;
    case 4: memcpy(&w32, p, 4), raw = w32; break;
    case 8: memcpy(&raw, p, 8); break;
    case 3: memcpy(&w16, p, 2), raw = (uint64_t)w16 | (uint64_t)p[2] << 16; break;
    case 5: memcpy(&w32, p, 4), raw = (uint64_t)w32 | (uint64_t)p[4] << 32; break;
    default: memcpy(&w32, p, 4), memcpy(&w16, p + 4, 2), raw = (uint64_t)w32 | (uint64_t)w16 << 32; break;
    }
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
            float s = cpu_scale_at(w->scale_dtype, w->scales, r * groups + g);
            float b = cpu_scale_at(w->scale_dtype, w->biases, r * groups + g);
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

/* 4-bit rows in the 16-row interleaved layout (WEIGHT_LAYOUT_MLX_ROWS16; see mlx4_rows16 in
 * matmul_avx512.c for the layout and the byte planes of cpu_mlx_x_planes): per block of 16 rows,
 * group and word k, two 256-bit vectors (rows 0-7, 8-15) whose low nibbles (one AND) and high
 * nibbles (shift + AND) stay bytes. Per token the 4 plane bytes of word k are broadcast; without
 * AVX-VNNI, vpmaddubsw multiplies the weights (u8) with the hi bytes (s8) and the lo bytes (u8)
 * with the weights (s8, 0..15) into int16 pairs (at most 2*15*255 per pair and 15300 per sum of
 * two: no saturation, so exact) and vpmaddwd with ones widens them into the hi and lo int32
 * accumulators; with AVX-VNNI (vnni = 1) vpdpbusd does each product-and-accumulate in one
 * instruction, as on AVX-512. Once per group the lanes hold each row's exact int16 dot product
 * 256*hi + lo, converted and scaled for 8 rows at a time. The same integer products as the
 * AVX-512 kernel, so the same error bound. Rows past the last whole block: mlx_rows (MLX order). */
/* acc += u8 . s8 per int32 lane. The AVX-VNNI form is inline asm (VEX-encoded vpdpbusd), so the
 * one kernel body compiles for both forms under the plain AVX2 target. */
T256 INLINE __m256i dot4_u8s8(__m256i acc, __m256i u8, __m256i s8, const int vnni) {
    if (vnni) {
        __asm__("%{vex%} vpdpbusd %[b], %[a], %[acc]" : [acc] "+x"(acc) : [a] "x"(u8), [b] "x"(s8));
        return acc;
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
}

/* 8 scales or biases (bf16, f16, f32) from element i, widened as dense weights are. */
T256 INLINE __m256 scales_load8(dtype t, const void *p, int64_t i) {
    return dense_load8(t == DTYPE_F32 ? WEIGHT_F32 : t == DTYPE_F16 ? WEIGHT_F16 : WEIGHT_BF16, p, i);
}

T256 INLINE void mlx4_rows16(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                             int64_t r1, const int vnni, const int nt) {
    int64_t cols = w->cols, rows = w->rows, gs = w->group_size, groups = cols / gs;
    int64_t kpg = gs / 8, rows16 = rows & ~(int64_t)15; /* kpg: 4, 8, 16 */
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    /* independent int32 chains per plane and token: with one, the two dependent dot products
     * per word (vpdpbusd: 5 cycles each) bounded a 1-token pass at ~10 GB/s per core. 4 at 1
     * token (even/odd values x two words per step), 2 at 2, 1 above (16 ymm registers) */
    const int nc = nt == 1 ? 4 : nt == 2 ? 2 : 1, ku = nc == 4 ? 2 : 1;
    size_t esize = dtype_size(w->scale_dtype), ahead = cpu_matvec_prefetch();
    const uint8_t *xq[CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) xq[t] = (const uint8_t *)(in->xq + t * cols);
    for (int64_t b = r0 >> 4; 16 * b < r1 && 16 * b < rows16; b++) {
        const uint8_t *wb = (const uint8_t *)w->data + (size_t)b * 8 * (size_t)cols;
        const uint8_t *sb = (const uint8_t *)w->scales + (size_t)(b * 16 * groups) * esize;
        const uint8_t *bb = (const uint8_t *)w->biases + (size_t)(b * 16 * groups) * esize;
        for (int h = 0; h < 2; h++) { /* rows 16b + 8h .. 16b + 8h + 7 */
            __m256 acc[CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
            for (int64_t g = 0; g < groups; g++) {
                const uint8_t *wg = wb + (size_t)(g * kpg) * 64 + 32 * h;
                if (ahead)
                    for (int64_t o = 0; o < kpg * 64; o += 64) _mm_prefetch((const char *)wg + o + ahead, _MM_HINT_T0);
                int64_t v0 = g * gs, xoff = 256 * (v0 >> 7) + ((v0 & 127) >> 1);
                __m256i ah[CPU_MATVEC_MAX_TOKENS][4], al[CPU_MATVEC_MAX_TOKENS][4];
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
                    for (int j = 0; j < nc; j++) ah[t][j] = al[t][j] = _mm256_setzero_si256();
                for (int64_t k = 0; k < kpg; k += ku) {
#pragma GCC unroll 2
                    for (int u = 0; u < ku; u++) {
                        __m256i v = _mm256_loadu_si256((const __m256i *)(wg + 64 * (k + u)));
                        __m256i we = _mm256_and_si256(v, m0f);
                        __m256i wo = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
                        const int je = nc == 4 ? 2 * u : 0, jo = nc == 1 ? 0 : je + 1;
#pragma GCC unroll 8
                        for (int t = 0; t < nt; t++) {
                            const uint8_t *xb = xq[t] + xoff + 4 * (k + u);
                            int32_t he, ho, le, lo;
                            memcpy(&he, xb, 4), memcpy(&ho, xb + 64, 4), memcpy(&le, xb + 128, 4), memcpy(&lo, xb + 192, 4);
                            ah[t][je] = dot4_u8s8(ah[t][je], we, _mm256_set1_epi32(he), vnni);
                            ah[t][jo] = dot4_u8s8(ah[t][jo], wo, _mm256_set1_epi32(ho), vnni);
                            al[t][je] = dot4_u8s8(al[t][je], _mm256_set1_epi32(le), we, vnni);
                            al[t][jo] = dot4_u8s8(al[t][jo], _mm256_set1_epi32(lo), wo, vnni);
                        }
                    }
                }
                __m256 sc = scales_load8(w->scale_dtype, sb, g * 16 + 8 * h);
                __m256 bi = scales_load8(w->scale_dtype, bb, g * 16 + 8 * h);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
#pragma GCC unroll 4
                    for (int j = 1; j < nc; j++) {
                        ah[t][0] = _mm256_add_epi32(ah[t][0], ah[t][j]);
                        al[t][0] = _mm256_add_epi32(al[t][0], al[t][j]);
                    }
                    __m256i a = _mm256_add_epi32(_mm256_slli_epi32(ah[t][0], 8), al[t][0]);
                    __m256 sv = _mm256_mul_ps(sc, _mm256_set1_ps(in->xscale[t * groups + g]));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), sv, acc[t]);
                    acc[t] = _mm256_fmadd_ps(bi, _mm256_set1_ps(in->xsum[t * groups + g]), acc[t]);
                }
            }
            /* store this half's rows that lie in [r0, r1) */
            int64_t first = 16 * b + 8 * h;
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                float out[8];
                _mm256_storeu_ps(out, acc[t]);
                for (int i = 0; i < 8; i++)
                    if (first + i >= r0 && first + i < r1) y[t * rows + first + i] = out[i];
            }
        }
    }
    if (r1 > rows16) {
        int64_t from = r0 > rows16 ? r0 : rows16;
        mlx_rows(w, in, y, from, r1, nt);
    }
}

/* AVX-VNNI (Alder Lake, Sapphire Rapids, Zen 5 and later): CPUID leaf 7 subleaf 1, EAX bit 4,
 * read once; EXO_AVX2_VNNI=0 or cpu_avx2_set_vnni(0) keeps vpmaddubsw (tests, A/B runs). */
static _Atomic int avx2_vnni = -1;

static int avx2_vnni_detect(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 1, a, b, c, d);
    (void)b, (void)c, (void)d;
    const char *e = getenv("EXO_AVX2_VNNI");
    return ((a >> 4) & 1) && !(e && !strcmp(e, "0"));
}

int cpu_avx2_vnni(void) {
    int v = atomic_load_explicit(&avx2_vnni, memory_order_relaxed);
    if (v < 0) {
        v = avx2_vnni_detect();
        atomic_store(&avx2_vnni, v);
    }
    return v;
}

void cpu_avx2_set_vnni(int on) {
    atomic_store(&avx2_vnni, on && avx2_vnni_detect());
}

T256 static void mlx4_rows16_vnni(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0, int64_t r1) {
    CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx4_rows16, w, in, y, r0, r1, 1)
}

T256 static void mlx4_rows16_maddubs(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0, int64_t r1) {
    CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx4_rows16, w, in, y, r0, r1, 0)
}

T256 static void matvec_mlx(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0, int64_t r1) {
    if (w->layout == WEIGHT_LAYOUT_MLX_ROWS16) {
        if (cpu_avx2_vnni()) mlx4_rows16_vnni(w, in, y, r0, r1);
        else mlx4_rows16_maddubs(w, in, y, r0, r1);
        return;
    }
    CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx_rows, w, in, y, r0, r1)
}

CPU_MATVEC_BY_FORMAT(T256, avx2_matvec, dense_rows, matvec_mlx)

T256 static void avx2_dequant(const weight_matrix *w, int64_t r, int64_t c0, int64_t len, float *out) {
    int64_t cols = w->cols;
    if (w->format != WEIGHT_MLX_AFFINE) {
        const void *row = (const char *)w->data + (size_t)(r * cols) * (w->format == WEIGHT_F32 ? 4 : 2);
        int64_t c = 0;
        for (; c + 8 <= len; c += 8) _mm256_storeu_ps(out + c, dense_load8(w->format, row, c0 + c));
        for (; c < len; c++) out[c] = cpu_dense_at(w->format, row, c0 + c);
        return;
    }
    int64_t gs = w->group_size;
    unpack8_consts u = unpack8_setup(w->bits);
    /* 8 values are `bits` bytes; in a 16-row interleaved block (4-bit here) a row's words are 16
     * apart (weight_mlx_word), so each 8 values are one word 64 bytes after the previous */
    const int strided = w->layout == WEIGHT_LAYOUT_MLX_ROWS16 && r < (w->rows & ~(int64_t)15);
    const uint8_t *q = (const uint8_t *)((const uint32_t *)w->data + weight_mlx_word(w, r, c0 * w->bits / 32));
    for (int64_t c = 0; c < len; c += gs) {
        int64_t g = weight_mlx_group(w, r, (c0 + c) / gs);
        __m256 s = _mm256_set1_ps(cpu_scale_at(w->scale_dtype, w->scales, g));
        __m256 b = _mm256_set1_ps(cpu_scale_at(w->scale_dtype, w->biases, g));
        for (int64_t i = 0; i < gs; i += 8) {
            _mm256_storeu_ps(out + c + i, _mm256_fmadd_ps(unpack8(&u, q), s, b));
            q += strided ? 64 : u.bits;
        }
    }
}

const cpu_kernels cpu_kernels_avx2 = {
    .name = "avx2",
    .needs_int16_x = 1, /* for the interleaved 4-bit kernel; the MLX-order kernels read x */
    .rows16_bits = 1u << 4,
    .matvec = avx2_matvec,
    .dequant = avx2_dequant,
    .gemm_tile = NULL,
};

#else

int cpu_avx2_vnni(void) {
    return 0;
}

void cpu_avx2_set_vnni(int on) {
    (void)on;
}

#endif
