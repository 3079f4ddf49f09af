/* Shared AVX-512 pieces of the MLX affine kernels (matmul_avx512.c: matvec and f32 dequantize;
 * gemm_mlx_avx512.c: the int16 gemm; matmul_exact_avx512.c: the residual-plane matvec): the
 * VNNI byte dot products with a tied accumulator, the GFNI nibble split, unpacking 32 packed values of any width into uint16 lanes,
 * widening 16 scales or biases to f32, and the tail mask. Header-only: each includer compiles them with the
 * target attributes below. Refuses: nothing; x86-64 only. */
#ifndef EXO_COMPUTE_CPU_MLX_AVX512_H
#define EXO_COMPUTE_CPU_MLX_AVX512_H

#if defined(__x86_64__)

#include "model/weight_types.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vnni,gfni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* Mask of the first min(n, 16) lanes. */
T512 INLINE __mmask16 tail_mask16(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

typedef struct unpack_consts {
    __m512i idx, shifts, mask;
    __mmask32 load_mask;
    int chunk_bytes; /* 4 * bits: bytes holding 32 values */
} unpack_consts;

T512 INLINE unpack_consts unpack_setup(int bits) {
    unpack_consts u;
    uint8_t idx[64] = {0};
    uint16_t sh[32];
    for (int k = 0; k < 32; k++) {
        int bit = k * bits;
        idx[2 * k] = (uint8_t)(bit >> 3);
        idx[2 * k + 1] = (uint8_t)((bit >> 3) + 1);
        sh[k] = (uint16_t)(bit & 7);
    }
    u.idx = _mm512_loadu_si512(idx);
    u.shifts = _mm512_loadu_si512(sh);
    u.mask = _mm512_set1_epi16((short)((1 << bits) - 1));
    u.chunk_bytes = 4 * bits;
    u.load_mask = bits == 8 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (4 * bits)) - 1u);
    return u;
}

/* 32 consecutive packed values (the 4*bits bytes holding them, zero above) -> 32 uint16 lanes
 * (value k in lane k). */
T512 INLINE __m512i unpack32_raw(const unpack_consts *u, __m256i raw) {
    __m512i v = _mm512_permutexvar_epi8(u->idx, _mm512_zextsi256_si512(raw));
    return _mm512_and_si512(_mm512_srlv_epi16(v, u->shifts), u->mask);
}

T512 INLINE __m512i unpack32(const unpack_consts *u, const uint8_t *p) {
    return unpack32_raw(u, _mm256_maskz_loadu_epi8(u->load_mask, p));
}

/* The int16 quantization of one group of gs activations (gs a multiple of 16) that every MLX
 * kernel multiplies: q = round-to-nearest-even(x * xmax / max|x|), saturated; *sum = sum(x) (for
 * the bias term), *scale = max|x| / xmax; xmax = 32767, or CPU_MLX_Q8_XMAX for the 8-bit
 * interleaved kernel. One copy, so the matvec and the gemm round alike. */
T512 INLINE void quantize_group_int16(const float *xs, int64_t gs, int16_t *q, float *sum, float *scale,
                                      float xmax) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 s = _mm512_setzero_ps(), amax = _mm512_setzero_ps();
    for (int64_t c = 0; c < gs; c += 16) {
        __m512 v = _mm512_loadu_ps(xs + c);
        s = _mm512_add_ps(s, v);
        amax = _mm512_max_ps(amax, _mm512_andnot_ps(sign, v));
    }
    float m = _mm512_reduce_max_ps(amax);
    *sum = _mm512_reduce_add_ps(s);
    *scale = m / xmax;
    __m512 inv = _mm512_set1_ps(m > 0 ? xmax / m : 0.0f);
    for (int64_t c = 0; c < gs; c += 16) {
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + c), inv));
        _mm256_storeu_si256((__m256i *)(q + c), _mm512_cvtsepi32_epi16(v));
    }
}

/* acc += u8 a . s8 b per int32 lane (vpdpbusd) with the accumulator tied to the destination:
 * written as the intrinsic, GCC 12 copies the accumulators of mlx_rows16 through other
 * registers and the stack around every instruction (twice the instructions of the loop). */
T512 INLINE __m512i dpbusd_acc(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpbusd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
    return acc;
}

/* The same with b the 4 bytes at p broadcast to every lane (embedded broadcast: one fused uop). */
T512 INLINE __m512i dpbusd_bcast(__m512i acc, __m512i a, const uint8_t *p) {
    __asm__("vpdpbusd %[b]%{1to16%}, %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "m"(*(const uint8_t(*)[4])p));
    return acc;
}

/* The nibbles of 64 packed 4-bit bytes (a 16-row interleaved line, or an MLX-order chunk) as
 * bytes: *we the low ones (even values), *wo the high ones (odd values). The high nibbles by
 * one GFNI affine transform (a per-byte right shift by 4: bit i of the result is bit i+4 of the
 * byte) instead of a 16-bit shift and an AND: one instruction less per 64 weight bytes, +13%
 * for the 4-bit interleaved kernel per core in L2 (bench/RESULTS.md, issue 25, cpu27). */
T512 INLINE void split_nibbles(__m512i v, __m512i *we, __m512i *wo) {
    *we = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
    *wo = _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(0x1020408000000000ll), 0);
}

/* One token's int16 byte-plane products with the nibbles of one such line (mlx_rows16 and the
 * exact kernel's rows16_residual_block): xb is the token's 4 bytes of this line in the hi plane
 * of the even values (cpu_mlx_x_planes: hi odd at +64, lo even at +128, lo odd at +192), each read
 * by broadcast. The hi planes (s8) against the nibbles (u8) into ah[je] and ah[jo], the nibbles
 * (as s8, 0..15) against the lo planes (u8) into al[je] and al[jo] (je == jo: one chain). */
T512 INLINE void rows16_q4_planes(__m512i *ah, __m512i *al, const int je, const int jo, __m512i we, __m512i wo,
                                  const uint8_t *xb) {
    int32_t le, lo;
    memcpy(&le, xb + 128, 4), memcpy(&lo, xb + 192, 4);
    ah[je] = dpbusd_bcast(ah[je], we, xb);
    ah[jo] = dpbusd_bcast(ah[jo], wo, xb + 64);
    al[je] = dpbusd_acc(al[je], _mm512_set1_epi32(le), we);
    al[jo] = dpbusd_acc(al[jo], _mm512_set1_epi32(lo), wo);
}

/* 4, 8 or 16 consecutive 32-bit words of one row of a WEIGHT_LAYOUT_MLX_ROWS16 block, starting
 * at p: every 16th word, one gather. */
T512 INLINE __m128i rows16_words4(const uint32_t *p) {
    return _mm_i32gather_epi32((const int *)p, _mm_setr_epi32(0, 16, 32, 48), 4);
}

T512 INLINE __m256i rows16_words8(const uint32_t *p) {
    return _mm256_i32gather_epi32((const int *)p, _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112), 4);
}

T512 INLINE __m512i rows16_words16(const uint32_t *p) {
    return _mm512_i32gather_epi32(_mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                     _mm512_set1_epi32(16)), p, 4);
}

/* Whether row r of w is inside a 16-row interleaved block (its words and scales 16 apart). */
INLINE int row_strided(const weight_matrix *w, int64_t r) {
    return w->layout == WEIGHT_LAYOUT_MLX_ROWS16 && r < (w->rows & ~(int64_t)15);
}

T512 INLINE __m512 scales_load16(dtype t, const void *p, int64_t i, __mmask16 m) {
    if (t == DTYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (t == DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#endif
#endif
