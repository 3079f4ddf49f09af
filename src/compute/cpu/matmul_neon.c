/* NEON kernels (aarch64): two levels, chosen at run time from HWCAP (cpu.c).
 *
 * `neon` (every aarch64 CPU): exact f32 math, as the AVX2 level.
 *   dense: weights widened to f32 (bf16 by a 16-bit shift, f16 by fcvtl) and FMA'd per token.
 *   MLX affine: one group at a time, the packed values unpacked to bytes (4-bit: AND / shift and
 *   a zip; 8-bit: as they are; other widths: a scalar loop), widened to f32 and FMA'd against the
 *   activations into a per-group accumulator that is scaled once at the end of the group; the
 *   bias term is sum_g bias_g * sum(x in group g).
 * `neon-dotprod` (ARMv8.2 dotprod: Cortex-A76 / Raspberry Pi 5, Graviton 2+, Ampere Altra):
 *   the int16 activations of the AVX-512 level (cpu_levels.h, matvec_input), so the integer
 *   products, and the error bound, are exactly those of the AVX-512 kernels.
 *   4-bit, columns a multiple of 128: the byte planes of cpu_mlx_x_planes (x = 256*hi + lo).
 *   Per 16 weight bytes: the low nibbles one AND, the high ones one shift (still bytes, 0..15,
 *   valid as s8 and u8), then per token SDOT of the weights with the signed hi planes and UDOT
 *   with the unsigned lo planes: 4 dot instructions per 32 values, no widening. Lane k of 16-byte
 *   vector i holds values 32i+8k..32i+8k+7, so a 32-value group is one vector.
 *   8-bit: the weights widened to u16 once per 16 and multiplied with the natural-order int16
 *   activations by SMLAL (4 per 16 values and token).
 *   Everything else (2/3/5/6-bit, 4-bit rows that are not whole 128-value chunks) takes the
 *   `neon` f32 path. i8mm is detected (cpu_neon_i8mm) but no kernel needs it yet.
 * gemm (prefill): dequantized rows go to OpenBLAS sgemm (its own NEON kernels).
 * Refuses: the 16-row interleaved layout (the driver never sends it here: rows16_bits = 0). */
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/matvec_dispatch.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <string.h>

#define TNEON /* Advanced SIMD is part of the aarch64 base architecture */
/* GCC declares the dot intrinsics under a target pragma, so a function with the target may use
 * them; clang before 16 declares them only when the whole file is built with dotprod, and then
 * this build has no dotprod level (cpu_kernels_neon_dotprod.matvec is NULL; cpu.c checks). */
#if defined(__clang__) && !defined(__ARM_FEATURE_DOTPROD) && __clang_major__ < 16
#define NEON_NO_DOTPROD 1
#elif defined(__clang__)
#define TDOT __attribute__((target("dotprod")))
#else
#define TDOT __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define INLINE static inline __attribute__((always_inline))

/* ---- dense --------------------------------------------------------------------------------- */

INLINE float32x4_t dense_load4(weight_format f, const void *row, int64_t i) {
    if (f == WEIGHT_F32) return vld1q_f32((const float *)row + i);
    uint16x4_t h = vld1_u16((const uint16_t *)row + i);
    if (f == WEIGHT_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

INLINE void dense_rows(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                       int64_t r1, const weight_format f, const int nt) {
    int64_t cols = w->cols, rows = w->rows;
    size_t esize = f == WEIGHT_F32 ? 4 : 2;
    for (int64_t r = r0; r < r1; r++) {
        const void *row = (const char *)w->data + (size_t)(r * cols) * esize;
        float32x4_t acc[CPU_MATVEC_MAX_TOKENS][2];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = vdupq_n_f32(0);
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            float32x4_t w0 = dense_load4(f, row, c), w1 = dense_load4(f, row, c + 4);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const float *x = in->x + t * cols + c;
                acc[t][0] = vfmaq_f32(acc[t][0], w0, vld1q_f32(x));
                acc[t][1] = vfmaq_f32(acc[t][1], w1, vld1q_f32(x + 4));
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            float s = vaddvq_f32(vaddq_f32(acc[t][0], acc[t][1]));
            for (int64_t cc = c; cc < cols; cc++) s += cpu_dense_at(f, row, cc) * in->x[t * cols + cc];
            y[t * rows + r] = s;
        }
    }
}

/* ---- MLX affine, exact f32 ----------------------------------------------------------------- */

/* The gs values of one group (starting at value c0 of the row at data) as bytes, natural order. */
INLINE void unpack_group(const uint8_t *data, int bits, int64_t c0, int64_t gs, uint8_t *out) {
    if (bits == 8) {
        memcpy(out, data + c0, (size_t)gs);
        return;
    }
    if (bits == 4) {
        const uint8x16_t m = vdupq_n_u8(0x0f);
        for (int64_t i = 0; i < gs; i += 32) {
            uint8x16_t v = vld1q_u8(data + (c0 + i) / 2);
            uint8x16x2_t z = vzipq_u8(vandq_u8(v, m), vshrq_n_u8(v, 4)); /* value 2j, 2j+1 */
            vst1q_u8(out + i, z.val[0]);
            vst1q_u8(out + i + 16, z.val[1]);
        }
        return;
    }
    const uint32_t *q = (const uint32_t *)data;
    uint32_t mask = (1u << bits) - 1u;
    for (int64_t i = 0; i < gs; i++) {
        uint64_t bit = (uint64_t)(c0 + i) * (uint64_t)bits, word = bit >> 5, off = bit & 31;
        uint64_t v = q[word] >> off;
        if (off + (uint64_t)bits > 32) v |= (uint64_t)q[word + 1] << (32 - off);
        out[i] = (uint8_t)(v & mask);
    }
}

INLINE void mlx_rows_f32(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                         int64_t r1, const int nt) {
    int64_t cols = w->cols, rows = w->rows, gs = w->group_size, groups = cols / gs;
    size_t row_bytes = (size_t)cols * (size_t)w->bits / 8;
    uint8_t qv[128];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *data = (const uint8_t *)w->data + (size_t)r * row_bytes;
        float32x4_t acc[CPU_MATVEC_MAX_TOKENS];
        float bias_term[CPU_MATVEC_MAX_TOKENS] = {0};
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[t] = vdupq_n_f32(0);
        for (int64_t g = 0; g < groups; g++) {
            unpack_group(data, w->bits, g * gs, gs, qv);
            float32x4_t ga[CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) ga[t] = vdupq_n_f32(0);
            for (int64_t i = 0; i < gs; i += 16) {
                uint8x16_t b = vld1q_u8(qv + i);
                uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_high_u8(b);
                float32x4_t v[4] = {vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), vcvtq_f32_u32(vmovl_high_u16(lo)),
                                    vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), vcvtq_f32_u32(vmovl_high_u16(hi))};
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const float *x = in->x + t * cols + g * gs + i;
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) ga[t] = vfmaq_f32(ga[t], v[k], vld1q_f32(x + 4 * k));
                }
            }
            float s = cpu_scale_at(w->scale_dtype, w->scales, r * groups + g);
            float b = cpu_scale_at(w->scale_dtype, w->biases, r * groups + g);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                acc[t] = vfmaq_n_f32(acc[t], ga[t], s);
                bias_term[t] += b * in->xsum[t * groups + g];
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) y[t * rows + r] = vaddvq_f32(acc[t]) + bias_term[t];
    }
}

TNEON static void matvec_mlx_f32(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                                 int64_t r1) {
    CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx_rows_f32, w, in, y, r0, r1)
}

CPU_MATVEC_BY_FORMAT(TNEON, neon_matvec, dense_rows, matvec_mlx_f32)

#if !defined(NEON_NO_DOTPROD)
/* ---- MLX affine, integer (dotprod level) --------------------------------------------------- */

/* Scales and biases of groups [g0, g0 + n) of row r as f32 (n <= NEON_SCALE_BLOCK): converted
 * once per block of groups, so the group loops read plain floats (a per-group switch on the
 * dtype and the pointer reloads around it were half the instructions of a 32-value group). */
#define NEON_SCALE_BLOCK 256

static void row_scales(const weight_matrix *w, int64_t r, int64_t g0, int64_t n, float *sc, float *bi) {
    int64_t first = r * (w->cols / w->group_size) + g0;
    for (int64_t i = 0; i < n; i++) {
        sc[i] = cpu_scale_at(w->scale_dtype, w->scales, first + i);
        bi[i] = cpu_scale_at(w->scale_dtype, w->biases, first + i);
    }
}


/* 4-bit rows against the byte planes (see the file comment). */
/* vpg = group_size / 32, the 16-byte weight vectors per group, as a constant: with a run-time
 * count GCC carried plane loads across iterations in register rotations (hi-odd of vector i + 4
 * is lo-even of vector i), and a bounded loop still paid a compare per vector. */
TDOT INLINE void mlx4_planes_rows(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                                  int64_t r1, const int vpg, const int nt) {
    int64_t cols = w->cols, rows = w->rows, gs = w->group_size, groups = cols / gs;
    size_t row_bytes = (size_t)cols / 2;
    const uint8x16_t m0f = vdupq_n_u8(0x0f);
    const uint8_t *xq = (const uint8_t *)in->xq;
    const float *xscale = in->xscale, *xsum = in->xsum;
    float sc[NEON_SCALE_BLOCK], bi[NEON_SCALE_BLOCK];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * row_bytes;
        float32x4_t acc[CPU_MATVEC_MAX_TOKENS];
        float bias_term[CPU_MATVEC_MAX_TOKENS] = {0};
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[t] = vdupq_n_f32(0);
        for (int64_t g0 = 0; g0 < groups; g0 += NEON_SCALE_BLOCK) {
            int64_t ng = groups - g0 < NEON_SCALE_BLOCK ? groups - g0 : NEON_SCALE_BLOCK;
            row_scales(w, r, g0, ng, sc, bi);
            for (int64_t gi = 0; gi < ng; gi++) {
                int64_t g = g0 + gi;
                int32x4_t ah[CPU_MATVEC_MAX_TOKENS];
                uint32x4_t al[CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) ah[t] = vdupq_n_s32(0), al[t] = vdupq_n_u32(0);
                /* a group never crosses a 128-value chunk: its planes are contiguous 16-byte steps */
                int64_t byte = g * gs / 2, xo = 256 * (byte / 64) + byte % 64;
#pragma GCC unroll 4
                for (int i = 0; i < vpg; i++) {
                    uint8x16_t v = vld1q_u8(q + byte + 16 * i);
                    uint8x16_t we = vandq_u8(v, m0f), wo = vshrq_n_u8(v, 4);
#pragma GCC unroll 8
                    for (int t = 0; t < nt; t++) {
                        const uint8_t *xb = xq + 2 * t * cols + xo + 16 * i;
                        ah[t] = vdotq_s32(ah[t], vreinterpretq_s8_u8(we), vld1q_s8((const int8_t *)xb));
                        ah[t] = vdotq_s32(ah[t], vreinterpretq_s8_u8(wo), vld1q_s8((const int8_t *)xb + 64));
                        al[t] = vdotq_u32(al[t], we, vld1q_u8(xb + 128));
                        al[t] = vdotq_u32(al[t], wo, vld1q_u8(xb + 192));
                    }
                }
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    int32x4_t a = vaddq_s32(vshlq_n_s32(ah[t], 8), vreinterpretq_s32_u32(al[t]));
                    acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(a), sc[gi] * xscale[t * groups + g]);
                    bias_term[t] += bi[gi] * xsum[t * groups + g];
                }
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) y[t * rows + r] = vaddvq_f32(acc[t]) + bias_term[t];
    }
}

/* 8-bit rows against the natural-order int16 activations. */
TDOT INLINE void mlx8_rows(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                           int64_t r1, const int nt) {
    int64_t cols = w->cols, rows = w->rows, gs = w->group_size, groups = cols / gs;
    const int16_t *xq = in->xq;
    const float *xscale = in->xscale, *xsum = in->xsum;
    float sc[NEON_SCALE_BLOCK], bi[NEON_SCALE_BLOCK];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * (size_t)cols;
        float32x4_t acc[CPU_MATVEC_MAX_TOKENS];
        float bias_term[CPU_MATVEC_MAX_TOKENS] = {0};
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[t] = vdupq_n_f32(0);
        for (int64_t g0 = 0; g0 < groups; g0 += NEON_SCALE_BLOCK) {
            int64_t ng = groups - g0 < NEON_SCALE_BLOCK ? groups - g0 : NEON_SCALE_BLOCK;
            row_scales(w, r, g0, ng, sc, bi);
            for (int64_t gi = 0; gi < ng; gi++) {
                int64_t g = g0 + gi;
                int32x4_t ia[CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) ia[t] = vdupq_n_s32(0);
                for (int64_t c = g * gs; c < (g + 1) * gs; c += 16) {
                    uint8x16_t b = vld1q_u8(q + c);
                    int16x8_t lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(b)));
                    int16x8_t hi = vreinterpretq_s16_u16(vmovl_high_u8(b));
#pragma GCC unroll 8
                    for (int t = 0; t < nt; t++) {
                        const int16_t *x = xq + t * cols + c;
                        int16x8_t x0 = vld1q_s16(x), x1 = vld1q_s16(x + 8);
                        ia[t] = vmlal_s16(ia[t], vget_low_s16(lo), vget_low_s16(x0));
                        ia[t] = vmlal_high_s16(ia[t], lo, x0);
                        ia[t] = vmlal_s16(ia[t], vget_low_s16(hi), vget_low_s16(x1));
                        ia[t] = vmlal_high_s16(ia[t], hi, x1);
                    }
                }
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(ia[t]), sc[gi] * xscale[t * groups + g]);
                    bias_term[t] += bi[gi] * xsum[t * groups + g];
                }
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) y[t * rows + r] = vaddvq_f32(acc[t]) + bias_term[t];
    }
}

TDOT static void matvec_mlx_dot(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                                int64_t r1) {
    if (cpu_mlx_x_planes(w)) {
        switch (w->group_size) {
        case 32: CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx4_planes_rows, w, in, y, r0, r1, 1) break;
        case 64: CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx4_planes_rows, w, in, y, r0, r1, 2) break;
        default: CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx4_planes_rows, w, in, y, r0, r1, 4) break;
        }
    } else if (w->bits == 8) {
        CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx8_rows, w, in, y, r0, r1)
    } else {
        matvec_mlx_f32(w, in, y, r0, r1);
    }
}

CPU_MATVEC_BY_FORMAT(TDOT, neon_dot_matvec, dense_rows, matvec_mlx_dot)

#endif

/* ---- dequantization (gemm regime) ---------------------------------------------------------- */

static void neon_dequant(const weight_matrix *w, int64_t r, int64_t c0, int64_t len, float *out) {
    if (w->format != WEIGHT_MLX_AFFINE) {
        cpu_kernels_generic.dequant(w, r, c0, len, out);
        return;
    }
    int64_t gs = w->group_size, groups = w->cols / gs;
    const uint8_t *data = (const uint8_t *)w->data + (size_t)r * ((size_t)w->cols * (size_t)w->bits / 8);
    uint8_t qv[128];
    for (int64_t c = 0; c < len; c += gs) {
        int64_t g = (c0 + c) / gs;
        unpack_group(data, w->bits, c0 + c, gs, qv);
        float32x4_t s = vdupq_n_f32(cpu_scale_at(w->scale_dtype, w->scales, r * groups + g));
        float32x4_t b = vdupq_n_f32(cpu_scale_at(w->scale_dtype, w->biases, r * groups + g));
        for (int64_t i = 0; i < gs; i += 8) {
            uint16x8_t h = vmovl_u8(vld1_u8(qv + i));
            vst1q_f32(out + c + i, vfmaq_f32(b, vcvtq_f32_u32(vmovl_u16(vget_low_u16(h))), s));
            vst1q_f32(out + c + i + 4, vfmaq_f32(b, vcvtq_f32_u32(vmovl_high_u16(h)), s));
        }
    }
}

const cpu_kernels cpu_kernels_neon = {
    .name = "neon",
    .needs_int16_x = 0,
    .matvec = neon_matvec,
    .dequant = neon_dequant,
    .gemm_tile = NULL,
};

const cpu_kernels cpu_kernels_neon_dotprod = {
    .name = "neon-dotprod",
    .needs_int16_x = 1,
#if !defined(NEON_NO_DOTPROD)
    .matvec = neon_dot_matvec,
#endif
    .dequant = neon_dequant,
    .gemm_tile = NULL,
};

#endif
