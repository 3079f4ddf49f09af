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

/* 8 packed values (the low 8*u->bits bits of raw) -> 8 f32. */
T256 INLINE __m256 unpack8_raw(const unpack8_consts *u, uint64_t raw) {
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)raw), u->idx);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(v, u->shifts), u->mask));
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
    return unpack8_raw(u, raw);
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

/* acc += u8 . s8 per int32 lane by AVX-VNNI: inline asm (VEX-encoded vpdpbusd), so the one
 * kernel body compiles for both forms under the plain AVX2 target. */
T256 INLINE __m256i dpbusd_vex(__m256i acc, __m256i u8, __m256i s8) {
    __asm__("%{vex%} vpdpbusd %[b], %[a], %[acc]" : [acc] "+x"(acc) : [a] "x"(u8), [b] "x"(s8));
    return acc;
}

/* acc += x per int32 lane, in the accumulator's register: written as the intrinsic, GCC adds into
 * a fresh register and copies it back every step (a vmovdqa per accumulator and step; the
 * AVX-512 kernels tie their accumulators the same way, dpbusd_acc). */
T256 INLINE __m256i add32_acc(__m256i acc, __m256i x) {
    __asm__("vpaddd %[x], %[acc], %[acc]" : [acc] "+x"(acc) : [x] "x"(x));
    return acc;
}

/* 8 scales or biases (bf16, f16, f32) from element i, widened as dense weights are. */
T256 INLINE __m256 scales_load8(dtype t, const void *p, int64_t i) {
    return dense_load8(t == DTYPE_F32 ? WEIGHT_F32 : t == DTYPE_F16 ? WEIGHT_F16 : WEIGHT_BF16, p, i);
}

/* ---- the 16-row interleaved layout (WEIGHT_LAYOUT_MLX_ROWS16, layout.c) --------------------
 * A block of 16 rows stores, per group, word k of every row side by side: 64 bytes per k, lane
 * l (4 bytes) = row 16b+l. A 256-bit vector holds half of such a line (8 rows). Each kernel
 * consumes whole 64-byte lines in address order (both halves of a line before the next one),
 * so each core streams its rows once, front to back, and an activation broadcast serves all 16
 * rows. Per group the lanes hold each row's exact integer dot product, converted and scaled for
 * 8 rows at a time (rows16_group_end). Rows outside [r0, r1) of a block that straddles the range
 * are computed and not stored (the driver cuts ranges at multiples of 16). */

/* The end of group g for the 8 rows 16b + 8h .. +7 of block blk: acc[t] += dot[t] * scale *
 * activation step + bias * sum(x), dot the exact int32 products. */
T256 INLINE void rows16_group_end(const weight_matrix *w, const matvec_input *in, const cpu_rows16_block *blk,
                                  int64_t g, int h, const __m256i *dot, __m256 *acc, const int nt) {
    int64_t groups = w->cols / w->group_size;
    __m256 sc = scales_load8(w->scale_dtype, cpu_rows16_scales(blk, g), 8 * h);
    __m256 bi = scales_load8(w->scale_dtype, cpu_rows16_biases(blk, g), 8 * h);
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        __m256 sv = _mm256_mul_ps(sc, _mm256_set1_ps(in->xscale[t * groups + g]));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), sv, acc[t]);
        acc[t] = _mm256_fmadd_ps(bi, _mm256_set1_ps(in->xsum[t * groups + g]), acc[t]);
    }
}

/* Stores the 8 rows 16b + 8h .. +7 of every token that lie in [r0, r1). */
T256 INLINE void rows16_store(float *y, int64_t rows, int64_t b, int h, int64_t r0, int64_t r1,
                              const __m256 *acc, const int nt) {
    int64_t first = 16 * b + 8 * h;
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        if (first >= r0 && first + 8 <= r1) {
            _mm256_storeu_ps(y + t * rows + first, acc[t]);
            continue;
        }
        float out[8];
        _mm256_storeu_ps(out, acc[t]);
        for (int i = 0; i < 8; i++)
            if (first + i >= r0 && first + i < r1) y[t * rows + first + i] = out[i];
    }
}

/* 4-bit (layout: 8 values of a row per lane; activations: the byte planes of cpu_mlx_x_planes).
 * Per half line, the low nibbles (one AND) and high nibbles (shift + AND) stay bytes, and per
 * token the 4 plane bytes of word k are broadcast. Once per group each row's int32 sum is its
 * exact dot product 256*hi + lo: the same integer products as the AVX-512 kernel, so the same
 * error bound (test_rows16_avx2_exact: bit for bit the AVX-512 results).
 *   Without AVX-VNNI (mlx4_group_maddubs), vpmaddubsw multiplies the weights (u8) with the hi
 *   bytes (s8) and the lo bytes (u8) with the weights (s8, 0..15). Per int16 lane and line the hi
 *   products of the even and odd nibbles sum to at most 2*2*15*128 = 7680, so at 1-2 tokens the
 *   hi sums of two lines (15360) run on in int16 before one vpmaddwd by 256 widens them; the lo
 *   sums (15300 per line) are widened by a vpmaddwd by 1 every line. Both go into one int32
 *   accumulator per half and token (256*hi + lo as it goes: no shift and add per group, half the
 *   int32 registers). Per 64-byte line: 8 vpmaddubsw, 3 vpmaddwd (was 4), 8 adds. A small
 *   gain per core (bench/RESULTS.md, cpu28); vpmaddubsw and vpmaddwd issue on two ports (Intel)
 *   or one (Zen 2/3), where it should count more.
 *   Sums of 4 hi lines (30720) would fit as well but measured no faster and spill with 16 ymm
 *   registers. From 3 tokens the hi sums are widened every line too (registers).
 *   With AVX-VNNI (mlx4_group_vnni) vpdpbusd does each product-and-accumulate; its 5-cycle
 *   latency wants independent chains, so even and odd nibbles then accumulate apart at 1 token.
 * Both halves of a line per step at 1 token (maddubs) or 1-2 tokens (VNNI); with more tokens the
 * accumulators of both would exceed the 16 ymm registers, so the halves take turns within each
 * group (the group's 64-byte lines are then in L1 for the second half). One group g of a block
 * into its row accumulators (mlx_rows16 walks the blocks). */
T256 INLINE void mlx4_group_maddubs(const weight_matrix *w, const matvec_input *in, const cpu_rows16_block *blk,
                                    int64_t g, const uint8_t *const *xq, __m256 acc[2][CPU_MATVEC_MAX_TOKENS],
                                    const int nt) {
    int64_t gs = w->group_size;
    int64_t kpg = gs / 8; /* 4, 8, 16 lines per group: even */
    const __m256i m0f = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), by256 = _mm256_set1_epi16(256);
    const int nh = nt <= 2 ? 2 : 1, hp = nt == 1 ? 2 : 1; /* lines per hi widening, halves per step */
    const uint8_t *wg = cpu_rows16_lines(blk, g);
    int64_t v0 = g * gs, xoff = 256 * (v0 >> 7) + ((v0 & 127) >> 1);
    for (int h0 = 0; h0 < 2; h0 += hp) {
        __m256i a32[2][CPU_MATVEC_MAX_TOKENS]; /* 256*hi + lo so far */
#pragma GCC unroll 2
        for (int h = 0; h < hp; h++)
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) a32[h][t] = _mm256_setzero_si256();
        for (int64_t k = 0; k < kpg; k += nh) {
            __m256i h16[2][CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 2
            for (int u = 0; u < nh; u++)
#pragma GCC unroll 2
                for (int h = 0; h < hp; h++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(wg + 64 * (k + u) + 32 * (h0 + h)));
                    __m256i we = _mm256_and_si256(v, m0f), wo = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
#pragma GCC unroll 8
                    for (int t = 0; t < nt; t++) {
                        const uint8_t *xb = xq[t] + xoff + 4 * (k + u);
                        int32_t he, ho, le, lo;
                        memcpy(&he, xb, 4), memcpy(&ho, xb + 64, 4), memcpy(&le, xb + 128, 4), memcpy(&lo, xb + 192, 4);
                        __m256i hs = _mm256_add_epi16(_mm256_maddubs_epi16(we, _mm256_set1_epi32(he)),
                                                      _mm256_maddubs_epi16(wo, _mm256_set1_epi32(ho)));
                        __m256i ls = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_set1_epi32(le), we),
                                                      _mm256_maddubs_epi16(_mm256_set1_epi32(lo), wo));
                        h16[h][t] = u == 0 ? hs : _mm256_add_epi16(h16[h][t], hs);
                        a32[h][t] = add32_acc(a32[h][t], _mm256_madd_epi16(ls, ones));
                        if (u == nh - 1) a32[h][t] = add32_acc(a32[h][t], _mm256_madd_epi16(h16[h][t], by256));
                    }
                }
        }
#pragma GCC unroll 2
        for (int h = 0; h < hp; h++) rows16_group_end(w, in, blk, g, h0 + h, a32[h], acc[h0 + h], nt);
    }
}

T256 INLINE void mlx4_group_vnni(const weight_matrix *w, const matvec_input *in, const cpu_rows16_block *blk,
                                 int64_t g, const uint8_t *const *xq, __m256 acc[2][CPU_MATVEC_MAX_TOKENS],
                                 const int nt) {
    int64_t gs = w->group_size;
    int64_t kpg = gs / 8; /* 4, 8, 16 lines per group */
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    const int hp = nt <= 2 ? 2 : 1, nc = nt == 1 ? 2 : 1; /* halves per step, chains */
    const uint8_t *wg = cpu_rows16_lines(blk, g);
    int64_t v0 = g * gs, xoff = 256 * (v0 >> 7) + ((v0 & 127) >> 1);
    for (int h0 = 0; h0 < 2; h0 += hp) {
        __m256i ah[2][CPU_MATVEC_MAX_TOKENS][2], al[2][CPU_MATVEC_MAX_TOKENS][2];
#pragma GCC unroll 2
        for (int h = 0; h < hp; h++)
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
#pragma GCC unroll 2
                for (int j = 0; j < nc; j++) ah[h][t][j] = al[h][t][j] = _mm256_setzero_si256();
        for (int64_t k = 0; k < kpg; k++) {
            __m256i we[2], wo[2];
#pragma GCC unroll 2
            for (int h = 0; h < hp; h++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(wg + 64 * k + 32 * (h0 + h)));
                we[h] = _mm256_and_si256(v, m0f);
                wo[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
            }
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const uint8_t *xb = xq[t] + xoff + 4 * k;
                int32_t he, ho, le, lo;
                memcpy(&he, xb, 4), memcpy(&ho, xb + 64, 4), memcpy(&le, xb + 128, 4), memcpy(&lo, xb + 192, 4);
                __m256i bhe = _mm256_set1_epi32(he), bho = _mm256_set1_epi32(ho);
                __m256i ble = _mm256_set1_epi32(le), blo = _mm256_set1_epi32(lo);
#pragma GCC unroll 2
                for (int h = 0; h < hp; h++) {
                    ah[h][t][0] = dpbusd_vex(ah[h][t][0], we[h], bhe);
                    ah[h][t][nc - 1] = dpbusd_vex(ah[h][t][nc - 1], wo[h], bho);
                    al[h][t][0] = dpbusd_vex(al[h][t][0], ble, we[h]);
                    al[h][t][nc - 1] = dpbusd_vex(al[h][t][nc - 1], blo, wo[h]);
                }
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < hp; h++) {
            __m256i dot[CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                __m256i sh = nc == 2 ? _mm256_add_epi32(ah[h][t][0], ah[h][t][1]) : ah[h][t][0];
                __m256i sl = nc == 2 ? _mm256_add_epi32(al[h][t][0], al[h][t][1]) : al[h][t][0];
                dot[t] = _mm256_add_epi32(_mm256_slli_epi32(sh, 8), sl);
            }
            rows16_group_end(w, in, blk, g, h0 + h, dot, acc[h0 + h], nt);
        }
    }
}

/* acc += the int16 pairs of a and b multiplied and summed per int32 lane: vpmaddwd + vpaddd, or
 * with AVX-VNNI one VEX-encoded vpdpwssd (inline asm, as dpbusd_vex). */
T256 INLINE __m256i dot2_s16(__m256i acc, __m256i a, __m256i b, const int vnni) {
    if (vnni) {
        __asm__("%{vex%} vpdpwssd %[b], %[a], %[acc]" : [acc] "+x"(acc) : [a] "x"(a), [b] "x"(b));
        return acc;
    }
    return add32_acc(acc, _mm256_madd_epi16(a, b));
}

/* 8-bit (layout: 4 values of a row per lane, rows a multiple of 16; activations: int16 in natural
 * order, cpu_kernels.rows16_x8_planes = 0). The byte planes of the AVX-512 kernel do not work
 * here: vpmaddubsw adds two u8 x s8 products into int16, and two full-range weight and activation
 * bytes (2 * 255 * 128) saturate it. So each quarter line (16 bytes: 4 rows x 4 values) is
 * zero-extended to words (vpmovzxbw, straight from memory) and vpmaddwd (or AVX-VNNI vpdpwssd)
 * multiplies it with the token's 4 int16 activations of word k, broadcast: each int32 lane then
 * holds one row's sum of two products, and one vphaddd per two quarters plus a qword permute
 * turns them into each row's dot product in row order once per group. At most 255 * 32767 *
 * gs per lane (1.07e9 at gs 128): exact in int32. The products are the same as every int16
 * path's, so the error bound is the same (activations quantized to 32767, not 32639). Quarters
 * per step: the whole line at 1-2 tokens, half of it from 3 tokens (registers). One group g of a
 * block into its row accumulators (mlx_rows16 walks the blocks). */
T256 INLINE void mlx8_group(const weight_matrix *w, const matvec_input *in, const cpu_rows16_block *blk, int64_t g,
                            __m256 acc[2][CPU_MATVEC_MAX_TOKENS], const int vnni, const int nt) {
    int64_t cols = w->cols, gs = w->group_size;
    int64_t kpg = gs / 4; /* lines per group: 8, 16, 32 */
    const int qp = nt <= 2 ? 4 : 2, nc = vnni && nt == 1 ? 2 : 1; /* quarters per step, chains */
    const uint8_t *wg = cpu_rows16_lines(blk, g);
    for (int q0 = 0; q0 < 4; q0 += qp) {
        __m256i a[4][CPU_MATVEC_MAX_TOKENS][2];
#pragma GCC unroll 4
        for (int q = 0; q < qp; q++)
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
#pragma GCC unroll 2
                for (int j = 0; j < nc; j++) a[q][t][j] = _mm256_setzero_si256();
        for (int64_t k = 0; k < kpg; k += nc) {
#pragma GCC unroll 2
            for (int j = 0; j < nc; j++) {
                __m256i v[4];
#pragma GCC unroll 4
                for (int q = 0; q < qp; q++)
                    v[q] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(wg + 64 * (k + j) + 16 * (q0 + q))));
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    int64_t x4;
                    memcpy(&x4, in->xq + t * cols + g * gs + 4 * (k + j), 8);
                    __m256i xb = _mm256_set1_epi64x(x4);
#pragma GCC unroll 4
                    for (int q = 0; q < qp; q++) a[q][t][j] = dot2_s16(a[q][t][j], v[q], xb, vnni);
                }
            }
        }
#pragma GCC unroll 2
        for (int p = 0; p < qp; p += 2) { /* quarters q0+p, q0+p+1 = rows 8h .. 8h+7 */
            int h = (q0 + p) >> 1;
            __m256i dot[CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                __m256i s0 = nc == 2 ? _mm256_add_epi32(a[p][t][0], a[p][t][1]) : a[p][t][0];
                __m256i s1 = nc == 2 ? _mm256_add_epi32(a[p + 1][t][0], a[p + 1][t][1]) : a[p + 1][t][0];
                /* hadd: rows 0 1 4 5 | 2 3 6 7 of the eight; the qword permute puts them in order */
                dot[t] = _mm256_permute4x64_epi64(_mm256_hadd_epi32(s0, s1), 0xd8);
            }
            rows16_group_end(w, in, blk, g, h, dot, acc[h], nt);
        }
    }
}

/* The block walk both widths share (the AVX-512 kernel's, mlx_rows16): per block of 16 rows its
 * 2 x nt row accumulators (rows 0-7, 8-15), per group the prefetch and the group's dot products
 * (mlx4_group_*, mlx8_group), then the rows of [r0, r1). At 1-2 tokens S blocks are in flight
 * (cpu_matvec_streams): stream k walks blocks [b0 + k*per, b0 + (k+1)*per), the S side by side,
 * group by group, as the AVX-512 kernel does. 4-bit rows past the last whole block (MLX order):
 * mlx_rows; 8-bit matrices have none (the repack requires rows % 16 == 0). */
T256 INLINE void mlx_rows16(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0, int64_t r1,
                            const int bits, const int vnni, const int S, const int nt) {
    int64_t rows = w->rows, groups = w->cols / w->group_size, rows16 = rows & ~(int64_t)15;
    size_t ahead = cpu_matvec_prefetch();
    const uint8_t *xq[CPU_MATVEC_MAX_TOKENS]; /* each token's activation planes (4-bit) */
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) xq[t] = (const uint8_t *)(in->xq + t * w->cols);
    int64_t b0 = r0 >> 4, b1 = (r1 + 15) >> 4;
    if (b1 > rows16 >> 4) b1 = rows16 >> 4;
    const int64_t per = (b1 - b0 + S - 1) / S;
    for (int64_t i = 0; i < per; i++) {
        cpu_rows16_block blk[4];
        __m256 acc[4][2][CPU_MATVEC_MAX_TOKENS];
        int on[4];
#pragma GCC unroll 4
        for (int s = 0; s < S; s++) {
            on[s] = b0 + s * per + i < b1;
            blk[s] = cpu_rows16_block_at(w, b0 + s * per + i, ahead);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) acc[s][0][t] = acc[s][1][t] = _mm256_setzero_ps();
        }
        for (int64_t g = 0; g < groups; g++)
#pragma GCC unroll 4
            for (int s = 0; s < S; s++) {
                if (s > 0 && !on[s]) continue;
                cpu_rows16_prefetch(&blk[s], g);
                if (bits == 8) mlx8_group(w, in, &blk[s], g, acc[s], vnni, nt);
                else if (vnni) mlx4_group_vnni(w, in, &blk[s], g, xq, acc[s], nt);
                else mlx4_group_maddubs(w, in, &blk[s], g, xq, acc[s], nt);
            }
#pragma GCC unroll 4
        for (int s = 0; s < S; s++) {
            if (!on[s]) continue;
            rows16_store(y, rows, b0 + s * per + i, 0, r0, r1, acc[s][0], nt);
            rows16_store(y, rows, b0 + s * per + i, 1, r0, r1, acc[s][1], nt);
        }
    }
    if (bits == 4 && r1 > rows16) mlx_rows(w, in, y, r0 > rows16 ? r0 : rows16, r1, nt);
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

/* One interleaved kernel per width and AVX-VNNI choice: 1-2 tokens with cpu_matvec_streams()
 * blocks in flight, more tokens one block at a time (the passes are compute-bound there). */
#define AVX2_ROWS16(name, bits, vnni)                                                              \
    T256 static void name(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0, int64_t r1) { \
        if (in->n_tokens <= 2) {                                                                   \
            int S = cpu_matvec_streams(), two = in->n_tokens == 2;                                 \
            if (S == 1) two ? mlx_rows16(w, in, y, r0, r1, bits, vnni, 1, 2) : mlx_rows16(w, in, y, r0, r1, bits, vnni, 1, 1); \
            else if (S == 2) two ? mlx_rows16(w, in, y, r0, r1, bits, vnni, 2, 2) : mlx_rows16(w, in, y, r0, r1, bits, vnni, 2, 1); \
            else two ? mlx_rows16(w, in, y, r0, r1, bits, vnni, 4, 2) : mlx_rows16(w, in, y, r0, r1, bits, vnni, 4, 1); \
            return;                                                                                \
        }                                                                                          \
        CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx_rows16, w, in, y, r0, r1, bits, vnni, 1)         \
    }
AVX2_ROWS16(mlx4_rows16_vnni, 4, 1)
AVX2_ROWS16(mlx4_rows16_maddubs, 4, 0)
AVX2_ROWS16(mlx8_rows16_vnni, 8, 1)
AVX2_ROWS16(mlx8_rows16_madd, 8, 0)
#undef AVX2_ROWS16

T256 static void matvec_mlx(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0, int64_t r1) {
    if (w->layout == WEIGHT_LAYOUT_MLX_ROWS16 && w->bits == 8) {
        if (cpu_avx2_vnni()) mlx8_rows16_vnni(w, in, y, r0, r1);
        else mlx8_rows16_madd(w, in, y, r0, r1);
        return;
    }
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
    /* 8 values are `bits` bytes; in a 16-row interleaved block a row's words are 16 apart
     * (weight_mlx_word), 64 bytes: 8 values are one word at 4 bits, two words at 8 bits */
    const int strided = w->layout == WEIGHT_LAYOUT_MLX_ROWS16 && r < (w->rows & ~(int64_t)15);
    const uint8_t *q = (const uint8_t *)((const uint32_t *)w->data + weight_mlx_word(w, r, c0 * w->bits / 32));
    /* bytes from the end of one group's words to the next group's: the inline scales and biases */
    const int64_t gap = strided && w->group_stride ? (int64_t)w->group_stride - 2 * gs * w->bits : 0;
    for (int64_t c = 0; c < len; c += gs, q += gap) {
        int64_t g = weight_mlx_group(w, r, (c0 + c) / gs);
        __m256 s = _mm256_set1_ps(cpu_scale_at(w->scale_dtype, w->scales, g));
        __m256 b = _mm256_set1_ps(cpu_scale_at(w->scale_dtype, w->biases, g));
        for (int64_t i = 0; i < gs; i += 8) {
            __m256 v;
            if (!strided) {
                v = unpack8(&u, q);
                q += u.bits;
            } else {
                uint32_t w0, w1 = 0;
                memcpy(&w0, q, 4);
                if (u.bits == 8) memcpy(&w1, q + 64, 4);
                v = unpack8_raw(&u, (uint64_t)w0 | (uint64_t)w1 << 32);
                q += 64 * (size_t)(u.bits / 4);
            }
            _mm256_storeu_ps(out + c + i, _mm256_fmadd_ps(v, s, b));
        }
    }
}

/* Activation preparation for the MLX matvec (matvec_input; the portable loop in cpu.c does the
 * same): per group the float sum, the int16 step max|x|/32767 and x rounded to it, then the
 * layout the kernels read. Vectorized because it runs on the calling thread while the others
 * wait: the portable loop (a serial float sum and an lrintf call per value) took ~20 us per
 * 8192 activations here, 2% of a 1B 4-bit decode step at 2 threads (bench/RESULTS.md, cpu27).
 * cvtps rounds to nearest even like lrintf, so xq is the same; only the sum's order differs. */
T256 INLINE float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* The byte planes of cpu_mlx_x_to_planes for one row of int16 activations, in place: per 16
 * values one vpshufb sorts each dword's bytes (lo even, lo odd, hi even, hi odd: x = 256*hi + lo
 * is the int16's low and high byte) and one vpermd gathers them into 8-byte runs. */
T256 INLINE void x_to_planes(int16_t *q, int64_t cols) {
    const __m256i idx = _mm256_setr_epi8(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15,
                                         0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
        uint8_t *out = (uint8_t *)(q + c0);
        __m256i v[8];
        for (int i = 0; i < 8; i++)
            v[i] = _mm256_permutevar8x32_epi32(
                _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(q + c0 + 16 * i)), idx), perm);
        for (int i = 0; i < 8; i++) { /* qwords: lo even, lo odd, hi even, hi odd of values 16i.. */
            __m128i lo = _mm256_castsi256_si128(v[i]), hi = _mm256_extracti128_si256(v[i], 1);
            _mm_storel_epi64((__m128i *)(out + 128 + 8 * i), lo);
            _mm_storeh_pd((double *)(out + 192 + 8 * i), _mm_castsi128_pd(lo));
            _mm_storel_epi64((__m128i *)(out + 8 * i), hi);
            _mm_storeh_pd((double *)(out + 64 + 8 * i), _mm_castsi128_pd(hi));
        }
    }
}

T256 static void avx2_prepare_mlx(const weight_matrix *w, const float *x, int64_t n, float *xsum,
                                  float *xscale, int16_t *xq) {
    int64_t cols = w->cols, gs = w->group_size, groups = cols / gs;
    const float xmax = (float)cpu_mlx_x_max(&cpu_kernels_avx2, w);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t t = 0; t < n; t++) {
        int16_t *qt = xq + t * cols;
        for (int64_t g = 0; g < groups; g++) {
            const float *xs = x + t * cols + g * gs;
            __m256 s = _mm256_setzero_ps(), amax = _mm256_setzero_ps();
            for (int64_t c = 0; c < gs; c += 8) {
                __m256 v = _mm256_loadu_ps(xs + c);
                s = _mm256_add_ps(s, v);
                amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
            }
            float m = hmax8(amax);
            xsum[t * groups + g] = hsum8(s);
            xscale[t * groups + g] = m / xmax;
            __m256 inv = _mm256_set1_ps(m > 0 ? xmax / m : 0.0f);
            for (int64_t c = 0; c < gs; c += 16) { /* packs interleaves the 128-bit halves; the permute undoes it */
                __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + c), inv));
                __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + c + 8), inv));
                _mm256_storeu_si256((__m256i *)(qt + g * gs + c), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8));
            }
        }
        int per_byte = cpu_mlx_x_permuted(w);
        if (cpu_mlx_x_planes(w)) {
            x_to_planes(qt, cols);
        } else if (per_byte) { /* MLX order (the kernels here read x): as the portable loop */
            int64_t V = 32 * per_byte;
            int16_t tmp[128];
            for (int64_t c0 = 0; c0 < cols; c0 += V) {
                for (int k = 0; k < per_byte; k++)
                    for (int j = 0; j < 32; j++) tmp[k * 32 + j] = qt[c0 + j * per_byte + k];
                memcpy(qt + c0, tmp, (size_t)V * sizeof *qt);
            }
        }
    }
}

const cpu_kernels cpu_kernels_avx2 = {
    .name = "avx2",
    .needs_int16_x = 1, /* for the interleaved kernels; the MLX-order kernels read x */
    .rows16_bits = 1u << 4 | 1u << 8,
    .rows16_x8_planes = 0, /* mlx8_rows16 reads natural-order int16 */
    .prepare_mlx = avx2_prepare_mlx,
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
