/* AVX-512 kernels (F/BW/VL/DQ + VBMI + VNNI + GFNI: Ice Lake, Sapphire Rapids, Zen 4 and later).
 * Compiled with per-function target attributes so the default build runs on any x86-64; cpu.c
 * calls them only after CPUID said yes.
 *
 * matvec, dense formats: weights are widened to f32 16 at a time (bf16 by a 16-bit shift, f16 by
 * vcvtph2ps) and FMA'd against each token; a few uops per 32 bytes, far under the memory time.
 *
 * matvec, MLX affine: per 32 packed values (4*bits bytes, one masked load), one vpermb puts the
 * two bytes holding value k into 16-bit lane k, vpsrlvw shifts it into place and an AND masks it:
 * the same three instructions unpack every bit width. VNNI vpdpwssd then multiplies the unsigned
 * values with int16-quantized activations (see matvec_input), 32 products per instruction, into
 * int32 lanes that are converted once per group and scaled by scale*activation_scale; the bias
 * term is sum_g bias_g * sum(x in group g), computed 16 groups at a time.
 * 4-bit weights with columns a multiple of 128 skip the widening: the nibbles stay bytes and meet
 * the int16 activations split into byte planes (x = 256*hi + lo) through vpdpbusd, the same exact
 * integer products with fewer instructions (mlx4_planes_rows; EXO_MATVEC_Q4=int16 for A/B).
 *
 * gemm: a 32-row x 12-token register tile (24 zmm accumulators), weights dequantized per K block
 * into a transposed panel that stays in L1, activations packed per 12-token block.
 *
 * Refuses: anything cpu_weight_supported() rejects (the driver never calls us with it). */
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/matvec_dispatch.h"
#include "compute/cpu/mlx_avx512.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <stdlib.h>


/* Software prefetch, once per row (block), of the same span `ahead` bytes further on: the next
 * rows' bytes are requested while this row is computed (ahead = 0: none). */
T512 INLINE void prefetch_span(const void *p, size_t len, size_t ahead) {
    if (!ahead) return;
    const char *a = (const char *)p + ahead;
    for (size_t o = 0; o < len; o += 64) _mm_prefetch(a + o, _MM_HINT_T0);
}

/* 16 weights of a dense row starting at element i, widened to f32; lanes outside m read as 0. */
T512 INLINE __m512 dense_load16(weight_format f, const void *row, int64_t i, __mmask16 m) {
    if (f == WEIGHT_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i);
    if (f == WEIGHT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

T512 INLINE __m512 dense_load16_full(weight_format f, const void *row, int64_t i) {
    if (f == WEIGHT_F32) return _mm512_loadu_ps((const float *)row + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (f == WEIGHT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

T512 INLINE void dense_rows(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                            int64_t r1, const weight_format f, const int nt) {
    int64_t cols = w->cols, rows = w->rows;
    size_t esize = f == WEIGHT_F32 ? 4 : 2, ahead = cpu_matvec_prefetch();
    for (int64_t r = r0; r < r1; r++) {
        const void *row = (const char *)w->data + (size_t)(r * cols) * esize;
        prefetch_span(row, (size_t)cols * esize, ahead);
        __m512 acc[CPU_MATVEC_MAX_TOKENS][2];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
        int64_t c = 0;
        for (; c + 32 <= cols; c += 32) {
            __m512 w0 = dense_load16_full(f, row, c), w1 = dense_load16_full(f, row, c + 16);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const float *x = in->x + t * cols + c;
                acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), acc[t][1]);
            }
        }
        for (; c < cols; c += 16) {
            __mmask16 m = tail_mask16(cols - c);
            __m512 w0 = dense_load16(f, row, c, m);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                acc[t][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, in->x + t * cols + c), acc[t][0]);
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            y[t * rows + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
    }
}

/* R rows at once, one accumulator per (row, token): each activation vector loaded from cache is
 * used R times. For batches of 3+ tokens, whose activations no longer fit L1 next to the rows. */
T512 INLINE void dense_rows_blocked(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                                    const weight_format f, const int nt, const int R) {
    int64_t cols = w->cols, rows = w->rows;
    size_t esize = f == WEIGHT_F32 ? 4 : 2;
    const char *base = (const char *)w->data + (size_t)(r0 * cols) * esize;
    prefetch_span(base, (size_t)(R * cols) * esize, cpu_matvec_prefetch());
    __m512 acc[4][CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[i][t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 16) {
        __mmask16 m = tail_mask16(cols - c);
        __m512 wv[4];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const void *row = base + (size_t)(i * cols) * esize;
            wv[i] = m == 0xffff ? dense_load16_full(f, row, c) : dense_load16(f, row, c, m);
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, in->x + t * cols + c);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) acc[i][t] = _mm512_fmadd_ps(wv[i], xv, acc[i][t]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) y[t * rows + r0 + i] = _mm512_reduce_add_ps(acc[i][t]);
}

T512 INLINE void dense_rows_any(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                                int64_t r1, const weight_format f, const int nt) {
    if (nt <= 2) {
        dense_rows(w, in, y, r0, r1, f, nt);
        return;
    }
    const int R = nt <= 4 ? 4 : 2;
    int64_t r = r0;
    for (; r + R <= r1; r += R) dense_rows_blocked(w, in, y, r, f, nt, R);
    if (r < r1) dense_rows(w, in, y, r, r1, f, nt);
}

/* ---- MLX affine ---------------------------------------------------------------------------- */



/* The biases of 16 groups at element i (lanes outside m: 0): loaded, or derived from their
 * scales when the matrix has a zero point (weight_matrix.zero_point: GGUF Q4_0/Q8_0), so the
 * matvec streams only the packed values and the scales. */
T512 INLINE __m512 biases_load16(const weight_matrix *w, const void *biases, int64_t i, __mmask16 m,
                                 __m512 scales) {
    if (w->zero_point) return _mm512_mul_ps(scales, _mm512_set1_ps(-(float)w->zero_point));
    return scales_load16(w->scale_dtype, biases, i, m);
}

/* Per-row group constants: sd[t][g] = scale_g * xscale[t][g]; returns the bias terms
 * sum_g bias_g * xsum[t][g] as vectors to add before the final reduction. */
T512 INLINE void mlx_row_setup(const weight_matrix *w, const matvec_input *in, int64_t r, float *sd,
                               __m512 *bacc, const int nt) {
    int64_t groups = w->cols / w->group_size;
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) bacc[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g += 16) {
        __mmask16 m = tail_mask16(groups - g);
        __m512 s = scales_load16(w->scale_dtype, w->scales, r * groups + g, m);
        __m512 b = biases_load16(w, w->biases, r * groups + g, m, s);
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            __m512 xs = _mm512_maskz_loadu_ps(m, in->xscale + t * groups + g);
            _mm512_mask_storeu_ps(sd + t * groups + g, m, _mm512_mul_ps(s, xs));
            bacc[t] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m, in->xsum + t * groups + g), bacc[t]);
        }
    }
}

/* The int32 dot products of one scaling unit of a row: one group, or (2/4-bit with a chunk
 * wider than the group) one 32-byte chunk spanning several groups. `bits` is the bytewise
 * layout's width (2, 4, 8) or 0 for the generic vpermb unpack. Advances *q past the unit. */
T512 INLINE void mlx_unit_dot(const uint8_t **q, const int16_t *xu, int64_t cols, int chunks,
                              const unpack_consts *u, __m512i *iacc, const int nt, const int bits) {
    const __m512i zero = _mm512_setzero_si512();
    if (bits == 0) {
        for (int c = 0; c < chunks; c++) {
            __m512i v = unpack32(u, *q);
            *q += u->chunk_bytes;
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                iacc[t] = _mm512_dpwssd_epi32(c == 0 ? zero : iacc[t], v, _mm512_loadu_si512(xu + t * cols + 32 * c));
        }
        return;
    }
    const int P = 8 / (bits ? bits : 8), V = 32 * P;
    const __m512i mask = _mm512_set1_epi16((short)((1 << bits) - 1));
    for (int c = 0; c < chunks; c++) {
        __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)*q));
        *q += 32;
#pragma GCC unroll 4
        for (int k = 0; k < P; k++) {
            __m512i sub = P == 1 ? v
                          : k == 0 ? _mm512_and_si512(v, mask)
                          : k == P - 1 ? _mm512_srli_epi16(v, (unsigned)(k * bits))
                                       : _mm512_and_si512(_mm512_srli_epi16(v, (unsigned)(k * bits)), mask);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                iacc[t] = _mm512_dpwssd_epi32(c == 0 && k == 0 ? zero : iacc[t], sub,
                                              _mm512_loadu_si512(xu + t * cols + c * V + 32 * k));
        }
    }
}

/* MLX rows. bits = 0: any width through the generic vpermb unpack (32 values per chunk);
 * bits = 2, 4, 8: the bytewise layout — 32 bytes (V = 256/bits values) zero-extended to 32 words
 * with one vpmovzxbw, value slot k of each byte is (w >> k*bits) & mask, dotted with the matching
 * block of the permuted activations (cpu_mlx_x_permuted; natural order for 8 bits). When a chunk
 * spans several groups (V > group size), int32 lane i holds values of group (2*i*P)/gs of the
 * chunk and is scaled by a vector gathered from sd with one vpermps.
 * Consecutive units alternate between two float accumulators when there are few tokens, so the
 * FMA latency chain does not limit a single-token decode. */
T512 INLINE void mlx_rows(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                          int64_t r1, float *sd, const int bits, const int nt) {
    int64_t cols = w->cols, rows = w->rows, gs = w->group_size, groups = cols / gs;
    const int P = bits ? 8 / bits : 1, V = bits ? 32 * P : 32;
    const int wide = V > gs; /* a chunk spans several groups */
    int64_t unit_values = wide ? V : gs, n_units = cols / unit_values;
    int chunks = wide ? 1 : (int)(gs / V), gpc = wide ? (int)(V / gs) : 1;
    unpack_consts u = unpack_setup(w->bits);
    size_t row_bytes = (size_t)cols * (size_t)w->bits / 8;
    int32_t lane_group[16];
    for (int i = 0; i < 16; i++) lane_group[i] = (int32_t)((2 * i * P) / gs);
    const __m512i lane_idx = _mm512_loadu_si512(lane_group);
    const int two = nt <= 2;
    size_t ahead = cpu_matvec_prefetch(), sbytes = (size_t)groups * dtype_size(w->scale_dtype);
    size_t ahead_rows = ahead ? ahead / row_bytes + 1 : 0;
    for (int64_t r = r0; r < r1; r++) {
        if (ahead) {
            prefetch_span((const uint8_t *)w->data + (size_t)r * row_bytes, row_bytes, ahead);
            prefetch_span((const uint8_t *)w->scales + (size_t)r * sbytes, sbytes, ahead_rows * sbytes);
            if (!w->zero_point)
                prefetch_span((const uint8_t *)w->biases + (size_t)r * sbytes, sbytes, ahead_rows * sbytes);
        }
        __m512 acc0[CPU_MATVEC_MAX_TOKENS], acc1[CPU_MATVEC_MAX_TOKENS];
        mlx_row_setup(w, in, r, sd, acc0, nt);
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc1[t] = _mm512_setzero_ps();
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * row_bytes;
        if (nt > 2) { /* one unit at a time: nt int32 + nt float accumulators stay in registers */
            for (int64_t un = 0; un < n_units; un++) {
                __m512i ia[CPU_MATVEC_MAX_TOKENS];
                mlx_unit_dot(&q, in->xq + un * unit_values, cols, chunks, &u, ia, nt, bits);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const float *st = sd + t * groups + un * gpc;
                    __m512 sa = wide ? _mm512_permutexvar_ps(lane_idx, _mm512_loadu_ps(st)) : _mm512_set1_ps(st[0]);
                    acc0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]), sa, acc0[t]);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) y[t * rows + r] = _mm512_reduce_add_ps(acc0[t]);
            continue;
        }
        for (int64_t un = 0; un < n_units; un += 2) {
            int second = un + 1 < n_units;
            __m512i ia[CPU_MATVEC_MAX_TOKENS], ib[CPU_MATVEC_MAX_TOKENS];
            mlx_unit_dot(&q, in->xq + un * unit_values, cols, chunks, &u, ia, nt, bits);
            if (second) {
                mlx_unit_dot(&q, in->xq + (un + 1) * unit_values, cols, chunks, &u, ib, nt, bits);
            } else {
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) ib[t] = _mm512_setzero_si512();
            }
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const float *st = sd + t * groups + un * gpc;
                __m512 sa = wide ? _mm512_permutexvar_ps(lane_idx, _mm512_loadu_ps(st)) : _mm512_set1_ps(st[0]);
                acc0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]), sa, acc0[t]);
                if (second) {
                    __m512 sb = wide ? _mm512_permutexvar_ps(lane_idx, _mm512_loadu_ps(st + gpc))
                                     : _mm512_set1_ps(st[1]);
                    if (two) acc1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib[t]), sb, acc1[t]);
                    else acc0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib[t]), sb, acc0[t]);
                }
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) y[t * rows + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
    }
}

/* 4-bit MLX rows in the byte-plane layout (cpu_mlx_x_planes; columns a multiple of 128). Per
 * 64-byte chunk of weights (128 values): the low nibbles (even values) by one AND, the high
 * nibbles (odd values) by a 16-bit shift and an AND, kept as bytes. Per token: the signed high
 * bytes of the activations against the weights (vpdpbusd, u8 weights x s8), the sum shifted left
 * by 8, then the unsigned low bytes against the weights (u8 activations x s8 weights 0..15) added
 * on top: exactly the int16 dot product, 4 VNNI instructions per 128 values with no widening.
 * int32 lane i of a chunk holds values 8i..8i+7, i.e. group (8i)/gs of the chunk: one conversion
 * and one FMA per chunk and token, against sd spread over the lanes (one vpermps; a broadcast
 * for 128-value groups). 1-2 tokens alternate two float accumulators (FMA latency). */
T512 INLINE void mlx4_planes_rows(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                                  int64_t r1, const int nt) {
    int64_t cols = w->cols, rows = w->rows, gs = w->group_size, groups = cols / gs;
    int64_t n_chunks = cols / 128, gpc = 128 / gs; /* groups per chunk: 4, 2, 1 */
    int64_t cpb = 16 / gpc;                        /* chunks per block of 16 groups */
    size_t row_bytes = (size_t)cols / 2;
    int32_t lane_group[16];
    for (int i = 0; i < 16; i++) lane_group[i] = (int32_t)((8 * i) / gs);
    const __m512i lane_idx = _mm512_loadu_si512(lane_group), idx_step = _mm512_set1_epi32((int)gpc);
    const __m512i zero = _mm512_setzero_si512();
    size_t ahead = cpu_matvec_prefetch(), sbytes = (size_t)groups * dtype_size(w->scale_dtype);
    size_t ahead_rows = ahead ? ahead / row_bytes + 1 : 0;
    const int two = nt <= 2;
    for (int64_t r = r0; r < r1; r++) {
        if (ahead) {
            prefetch_span((const uint8_t *)w->data + (size_t)r * row_bytes, row_bytes, ahead);
            prefetch_span((const uint8_t *)w->scales + (size_t)r * sbytes, sbytes, ahead_rows * sbytes);
            if (!w->zero_point)
                prefetch_span((const uint8_t *)w->biases + (size_t)r * sbytes, sbytes, ahead_rows * sbytes);
        }
        __m512 acc0[CPU_MATVEC_MAX_TOKENS], acc1[CPU_MATVEC_MAX_TOKENS], sdv[CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc0[t] = acc1[t] = _mm512_setzero_ps();
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * row_bytes;
        for (int64_t g0 = 0, c = 0; g0 < groups; g0 += 16) {
            /* This block's 16 group scales times each token's activation steps, in registers, and
             * the bias terms bias_g * sum(x in group g). */
            __mmask16 m = tail_mask16(groups - g0);
            __m512 sc = scales_load16(w->scale_dtype, w->scales, r * groups + g0, m);
            __m512 bi = biases_load16(w, w->biases, r * groups + g0, m, sc);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                sdv[t] = _mm512_mul_ps(sc, _mm512_maskz_loadu_ps(m, in->xscale + t * groups + g0));
                acc1[t] = _mm512_fmadd_ps(bi, _mm512_maskz_loadu_ps(m, in->xsum + t * groups + g0), acc1[t]);
            }
            int64_t c_end = c + cpb < n_chunks ? c + cpb : n_chunks;
            __m512i idx = lane_idx;
            for (; c < c_end; c++) {
                __m512i v = _mm512_loadu_si512(q + 64 * c);
                __m512i we, wo;
                split_nibbles(v, &we, &wo);
                const int odd = two && (c & 1);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const uint8_t *xb = (const uint8_t *)(in->xq + t * cols) + 256 * c;
                    __m512i a = _mm512_dpbusd_epi32(zero, we, _mm512_loadu_si512(xb));
                    a = _mm512_dpbusd_epi32(a, wo, _mm512_loadu_si512(xb + 64));
                    a = _mm512_slli_epi32(a, 8);
                    a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(xb + 128), we);
                    a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(xb + 192), wo);
                    __m512 sv = _mm512_permutexvar_ps(idx, sdv[t]);
                    if (odd) acc1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), sv, acc1[t]);
                    else acc0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), sv, acc0[t]);
                }
                idx = _mm512_add_epi32(idx, idx_step);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) y[t * rows + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
    }
}

/* The end of group g of a 16-row interleaved block:
 * the nc int32 chains of each plane summed (exact), 256*hi + lo converted and scaled by
 * scale * activation step, and bias * sum(x), into the 16 row accumulators of each token. */
T512 INLINE void rows16_group_end(const weight_matrix *w, const matvec_input *in, const cpu_rows16_block *blk,
                                  int64_t g, __m512i ah[][4], __m512i al[][4], const int nc, __m512 *acc,
                                  const int nt) {
    int64_t groups = w->cols / w->group_size;
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
        for (int j = 1; j < nc; j++) {
            ah[t][0] = _mm512_add_epi32(ah[t][0], ah[t][j]);
            al[t][0] = _mm512_add_epi32(al[t][0], al[t][j]);
        }
    __m512 sc = scales_load16(w->scale_dtype, cpu_rows16_scales(blk, g), 0, 0xffff);
    __m512 bi = biases_load16(w, cpu_rows16_biases(blk, g), 0, 0xffff, sc);
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        __m512i a = _mm512_add_epi32(_mm512_slli_epi32(ah[t][0], 8), al[t][0]);
        __m512 sv = _mm512_mul_ps(sc, _mm512_set1_ps(in->xscale[t * groups + g]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), sv, acc[t]);
        acc[t] = _mm512_fmadd_ps(bi, _mm512_set1_ps(in->xsum[t * groups + g]), acc[t]);
    }
}

/* Stores block b's rows that lie in [r0, r1) (a block straddling the range computes all 16). */
T512 INLINE void rows16_store(float *y, int64_t rows, int64_t b, int64_t r0, int64_t r1, const __m512 *acc,
                              const int nt) {
    int64_t lo = r0 > 16 * b ? r0 - 16 * b : 0, hi = r1 < 16 * b + 16 ? r1 - 16 * b : 16;
    __mmask16 m = (__mmask16)(tail_mask16(hi) & ~tail_mask16(lo));
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + t * rows + 16 * b, m, acc[t]);
}

/* Rows in the 16-row interleaved layout (WEIGHT_LAYOUT_MLX_ROWS16, layout.c), 4- or 8-bit: per
 * block of 16 rows and group, vector k holds word k of the group of each row (lane l = row 16b+l;
 * 4-bit: values 8k..8k+7 as MLX packs them, 8-bit: values 4k..4k+3). The activations are byte
 * planes of the int16 values x = 256*hi + lo, read 4 bytes at a time by broadcast (dword k of a
 * plane meets vector k), and every product is a vpdpbusd (u8 x s8) into int32 accumulators of
 * the hi and the lo planes, combined as 256*hi + lo once per group: each lane is then one row's
 * exact int16 dot product of the group, converted and scaled once per group and token for 16
 * rows: no horizontal sums, no scale permutes.
 *   4-bit (cpu_mlx_x_planes: hi bytes s8, lo bytes u8, even and odd values apart): one AND and a
 *     shift+AND split the even and odd nibbles of 16 rows at once; the hi planes (s8) against
 *     the nibbles (u8), the nibbles (as s8, 0..15) against the lo planes (u8): 4 vpdpbusd per
 *     vector and token.
 *   8-bit (cpu_mlx_x_planes8: both bytes signed, rows a multiple of 16): no unpacking at all,
 *     the weight bytes (u8) against the hi and against the lo bytes: 2 vpdpbusd per 64 weight
 *     bytes and token (the MLX-order 8-bit kernel: a vpmovzxbw and 2 vpdpwssd per 32 bytes, plus
 *     a horizontal sum per row).
 * Rows outside [r0, r1) of a block that straddles the range are computed and not stored (the
 * driver cuts ranges at multiples of 16); 4-bit rows past the last whole block are in MLX order
 * and go to mlx4_planes_rows. */
/* Group g of block blk: its lines against every token's planes, into the block's 16 row
 * accumulators acc (see mlx_rows16; nc int32 chains per plane and token). */
T512 INLINE void rows16_group(const weight_matrix *w, const matvec_input *in, const cpu_rows16_block *blk,
                              int64_t g, const uint8_t *const *xq, __m512 *acc, const int bits, const int nc,
                              const int nt) {
    int64_t gs = w->group_size, lines = gs * bits / 32; /* vectors per group: even */
    /* Vectors per step: 4-bit 2 at 4 chains (each feeds two, its even and its odd nibbles), else
     * 1; 8-bit one per chain. */
    const int step = bits == 4 ? (nc == 4 ? 2 : 1) : nc;
    const uint8_t *wg = cpu_rows16_lines(blk, g);
    cpu_rows16_prefetch(blk, g);
    int64_t v0 = g * gs, xoff = 256 * (v0 >> 7) + (v0 & 127) * bits / 8;
    __m512i ah[CPU_MATVEC_MAX_TOKENS][4], al[CPU_MATVEC_MAX_TOKENS][4];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) ah[t][j] = al[t][j] = _mm512_setzero_si512();
    for (int64_t k = 0; k < lines; k += step) {
#pragma GCC unroll 4
        for (int u = 0; u < step; u++) {
            __m512i v = _mm512_loadu_si512(wg + 64 * (k + u));
            if (bits == 8) {
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const uint8_t *xb = xq[t] + xoff + 4 * (k + u);
                    ah[t][u] = dpbusd_bcast(ah[t][u], v, xb);
                    al[t][u] = dpbusd_bcast(al[t][u], v, xb + 128);
                }
                continue;
            }
            __m512i we, wo;
            split_nibbles(v, &we, &wo);
            const int je = nc == 4 ? 2 * u : 0, jo = nc == 1 ? 0 : je + 1;
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) rows16_q4_planes(ah[t], al[t], je, jo, we, wo, xq[t] + xoff + 4 * (k + u));
        }
    }
    rows16_group_end(w, in, blk, g, ah, al, nc, acc, nt);
}

T512 INLINE void mlx_rows16(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                            int64_t r1, const int bits, const int S, const int nt) {
    int64_t cols = w->cols, rows = w->rows, groups = cols / w->group_size, rows16 = rows & ~(int64_t)15;
    /* Independent int32 accumulator chains per plane and token (vpdpbusd latency): 4 at 1-2
     * tokens, 2 at 3-4, 1 above (register budget). */
    const int nc = nt <= 2 ? 4 : nt <= 4 ? 2 : 1;
    /* Software prefetch at 1-2 tokens only: there the kernel waits on DRAM (the 1B shape at 2
     * threads: 8-bit 29.0 -> 32.8 GB/s); from 3 tokens it is compute-bound and the prefetches cost
     * 5-17% per core in cache (b4, b8, pp512 passes; bench/RESULTS.md, cpu26). */
    size_t ahead = nt <= 2 ? cpu_matvec_prefetch() : 0;
    const int to_l2 = cpu_matvec_prefetch_l2();
    const uint8_t *xq[CPU_MATVEC_MAX_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) xq[t] = (const uint8_t *)(in->xq + t * cols);
    int64_t b0 = r0 >> 4, b1 = (r1 + 15) >> 4;
    if (b1 > rows16 >> 4) b1 = rows16 >> 4;
    /* S streams: stream k walks blocks [b0 + k*per, b0 + (k+1)*per), the S side by side, group
     * by group (the last streams may run out a block early). */
    const int64_t per = (b1 - b0 + S - 1) / S;
    for (int64_t i = 0; i < per; i++) {
        cpu_rows16_block blk[4];
        __m512 acc[4][CPU_MATVEC_MAX_TOKENS];
        int on[4];
#pragma GCC unroll 4
        for (int k = 0; k < S; k++) {
            on[k] = b0 + k * per + i < b1;
            blk[k] = cpu_rows16_block_at(w, b0 + k * per + i, ahead);
            blk[k].to_l2 = to_l2;
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) acc[k][t] = _mm512_setzero_ps();
        }
        for (int64_t g = 0; g < groups; g++)
#pragma GCC unroll 4
            for (int k = 0; k < S; k++)
                if (k == 0 || on[k]) rows16_group(w, in, &blk[k], g, xq, acc[k], bits, nc, nt);
#pragma GCC unroll 4
        for (int k = 0; k < S; k++)
            if (on[k]) rows16_store(y, rows, b0 + k * per + i, r0, r1, acc[k], nt);
    }
    if (bits == 4 && r1 > rows16) mlx4_planes_rows(w, in, y, r0 > rows16 ? r0 : rows16, r1, nt);
}

T512 static void matvec_mlx(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0, int64_t r1) {
    if (w->layout == WEIGHT_LAYOUT_MLX_ROWS16) {
        if (in->n_tokens <= 2) { /* decode: S streams (cpu_matvec_streams) */
            int S = cpu_matvec_streams(), two = in->n_tokens == 2;
#define ROWS16_S(bits, S) (two ? mlx_rows16(w, in, y, r0, r1, bits, S, 2) : mlx_rows16(w, in, y, r0, r1, bits, S, 1))
            if (w->bits == 8) S == 1 ? ROWS16_S(8, 1) : S == 2 ? ROWS16_S(8, 2) : ROWS16_S(8, 4);
            else S == 1 ? ROWS16_S(4, 1) : S == 2 ? ROWS16_S(4, 2) : ROWS16_S(4, 4);
#undef ROWS16_S
            return;
        }
        if (w->bits == 8) CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx_rows16, w, in, y, r0, r1, 8, 1)
        else CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx_rows16, w, in, y, r0, r1, 4, 1)
        return;
    }
    if (cpu_mlx_x_planes(w)) { /* scales in registers: no sd array */
        CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx4_planes_rows, w, in, y, r0, r1)
        return;
    }
    int64_t groups = w->cols / w->group_size;
    enum { STACK_FLOATS = 4096 };
    float stack[STACK_FLOATS + 16]; /* +16: a chunk's scales are read as one 16-float vector */
    float *sd = stack;
    if (groups * in->n_tokens > STACK_FLOATS) {
        sd = malloc((size_t)(groups * in->n_tokens + 16) * sizeof *sd);
        if (!sd) { /* out of memory: one token at a time fits the stack for any sane width */
            cpu_kernels_generic.matvec(w, in, y, r0, r1);
            return;
        }
    }
    int layout = w->bits == 8 ? 8 : cpu_mlx_x_permuted(w) ? w->bits : 0;
    switch (layout) {
    case 8: CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx_rows, w, in, y, r0, r1, sd, 8) break;
    case 4: CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx_rows, w, in, y, r0, r1, sd, 4) break;
    case 2: CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx_rows, w, in, y, r0, r1, sd, 2) break;
    default: CPU_MATVEC_CALL_WITH_NT(in->n_tokens, mlx_rows, w, in, y, r0, r1, sd, 0) break;
    }
    if (sd != stack) free(sd);
}

CPU_MATVEC_BY_FORMAT(T512, avx512_matvec, dense_rows_any, matvec_mlx)

/* ---- dequantization (gemm regime) ---------------------------------------------------------- */

T512 static void avx512_dequant(const weight_matrix *w, int64_t r, int64_t c0, int64_t len, float *out) {
    int64_t cols = w->cols;
    if (w->format != WEIGHT_MLX_AFFINE) {
        const void *row = (const char *)w->data + (size_t)(r * cols) * (w->format == WEIGHT_F32 ? 4 : 2);
        for (int64_t c = 0; c < len; c += 16) {
            __mmask16 m = tail_mask16(len - c);
            _mm512_mask_storeu_ps(out + c, m, dense_load16(w->format, row, c0 + c, m));
        }
        return;
    }
    int64_t gs = w->group_size;
    unpack_consts u = unpack_setup(w->bits);
    /* 32 values are `bits` words; in a 16-row interleaved block (4- or 8-bit) a row's words are
     * 16 apart and its scales too (weight_mlx_word / weight_mlx_group) */
    const int strided = row_strided(w, r);
    const uint32_t *q = (const uint32_t *)w->data + weight_mlx_word(w, r, c0 * w->bits / 32);
    /* words from the end of one group's to the next group's: the inline scales and biases */
    const int64_t gap = strided && w->group_stride ? (int64_t)w->group_stride / 4 - gs * w->bits / 2 : 0;
    for (int64_t c = 0; c < len; c += gs, q += gap) {
        int64_t g = weight_mlx_group(w, r, (c0 + c) / gs);
        __m512 s = scales_load16(w->scale_dtype, w->scales, g, 1);
        __m512 b = scales_load16(w->scale_dtype, w->biases, g, 1);
        s = _mm512_broadcastss_ps(_mm512_castps512_ps128(s));
        b = _mm512_broadcastss_ps(_mm512_castps512_ps128(b));
        for (int64_t i = 0; i < gs; i += 32) {
            __m512i v = !strided       ? unpack32(&u, (const uint8_t *)q)
                        : w->bits == 4 ? unpack32_raw(&u, _mm256_zextsi128_si256(rows16_words4(q)))
                                       : unpack32_raw(&u, rows16_words8(q));
            q += strided ? 16 * w->bits : w->bits;
            __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)));
            _mm512_storeu_ps(out + c + i, _mm512_fmadd_ps(lo, s, b));
            _mm512_storeu_ps(out + c + i + 16, _mm512_fmadd_ps(hi, s, b));
        }
    }
}

/* ---- gemm micro-kernel ---------------------------------------------------------------------- */

T512 static void avx512_gemm_tile(const float *wp, const float *xp, int64_t kl, float *y, int64_t ldy,
                                  int mv, int nv, int accumulate) {
    __m512 acc[CPU_GEMM_NR][2];
#pragma GCC unroll 12
    for (int j = 0; j < CPU_GEMM_NR; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kl; k++) {
        __m512 w0 = _mm512_load_ps(wp + k * CPU_GEMM_MR);
        __m512 w1 = _mm512_load_ps(wp + k * CPU_GEMM_MR + 16);
        const float *xk = xp + k * CPU_GEMM_NR;
#pragma GCC unroll 12
        for (int j = 0; j < CPU_GEMM_NR; j++) {
            __m512 xb = _mm512_set1_ps(xk[j]);
            acc[j][0] = _mm512_fmadd_ps(w0, xb, acc[j][0]);
            acc[j][1] = _mm512_fmadd_ps(w1, xb, acc[j][1]);
        }
    }
    __mmask16 m0 = tail_mask16(mv), m1 = tail_mask16(mv > 16 ? mv - 16 : 0);
#pragma GCC unroll 12
    for (int j = 0; j < CPU_GEMM_NR; j++) {
        if (j >= nv) break;
        float *yr = y + j * ldy;
        __m512 a0 = acc[j][0], a1 = acc[j][1];
        if (accumulate) {
            a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(m0, yr));
            a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps(m1, yr + 16));
        }
        _mm512_mask_storeu_ps(yr, m0, a0);
        _mm512_mask_storeu_ps(yr + 16, m1, a1);
    }
}

T512 static void avx512_gemm_pack(const weight_matrix *w, int64_t r0, int mv, int64_t c0, int64_t kl,
                                  float *wpanel, float *tmp) {
    for (int i = 0; i < mv; i++) avx512_dequant(w, r0 + i, c0, kl, tmp + i * kl);
    for (int i = mv; i < CPU_GEMM_MR; i++)
        for (int64_t k = 0; k < kl; k++) tmp[i * kl + k] = 0.0f;
    /* Transpose [MR][kl] -> [kl][MR] with two 16-lane gathers per k. */
    __m512i rows_idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32((int)kl));
    const float *hi = tmp + 16 * kl;
    for (int64_t k = 0; k < kl; k++) {
        _mm512_store_ps(wpanel + k * CPU_GEMM_MR, _mm512_i32gather_ps(rows_idx, tmp + k, 4));
        _mm512_store_ps(wpanel + k * CPU_GEMM_MR + 16, _mm512_i32gather_ps(rows_idx, hi + k, 4));
    }
}

/* Activation preparation for the MLX matvec (see matvec_input): per group, the float sum, the
 * int16 step max|x|/32767, and x rounded to that step (round to nearest even, as lrintf). */
T512 static void avx512_prepare_mlx(const weight_matrix *w, const float *x, int64_t n, float *xsum,
                                    float *xscale, int16_t *xq) {
    int64_t cols = w->cols, gs = w->group_size, groups = cols / gs;
    for (int64_t t = 0; t < n; t++) {
        const float *xt = x + t * cols;
        int16_t *qt = xq + t * cols;
        float xmax = (float)cpu_mlx_x_max(&cpu_kernels_avx512, w);
        for (int64_t g = 0; g < groups; g++)
            quantize_group_int16(xt + g * gs, gs, qt + g * gs, &xsum[t * groups + g], &xscale[t * groups + g], xmax);
        int per_byte = cpu_mlx_x_permuted(w);
        if (cpu_mlx_x_planes8(&cpu_kernels_avx512, w)) { /* per 128 values: the signed hi bytes, then the signed lo bytes */
            for (int64_t c = 0; c < cols; c += 128) {
                __m512i v[4], hi[4];
                for (int k = 0; k < 4; k++) {
                    v[k] = _mm512_loadu_si512(qt + c + 32 * k);
                    __m512i lo = _mm512_srai_epi16(_mm512_slli_epi16(v[k], 8), 8); /* sign-extended */
                    hi[k] = _mm512_srai_epi16(_mm512_sub_epi16(v[k], lo), 8);
                }
                int8_t *out = (int8_t *)(qt + c);
                for (int k = 0; k < 4; k++) {
                    _mm256_storeu_si256((__m256i *)(out + 32 * k), _mm512_cvtepi16_epi8(hi[k]));
                    _mm256_storeu_si256((__m256i *)(out + 128 + 32 * k), _mm512_cvtepi16_epi8(v[k]));
                }
            }
        } else if (cpu_mlx_x_planes(w)) { /* per 128 values: hi bytes even/odd, lo bytes even/odd */
            int16_t ev[32], od[32];
            for (int j = 0; j < 32; j++) ev[j] = (int16_t)(2 * j), od[j] = (int16_t)(2 * j + 1);
            __m512i even = _mm512_loadu_si512(ev), odd = _mm512_loadu_si512(od);
            for (int64_t c = 0; c < cols; c += 128) {
                __m512i a = _mm512_loadu_si512(qt + c), b = _mm512_loadu_si512(qt + c + 32);
                __m512i d = _mm512_loadu_si512(qt + c + 64), e = _mm512_loadu_si512(qt + c + 96);
                __m512i vals[4] = {_mm512_permutex2var_epi16(a, even, b), _mm512_permutex2var_epi16(d, even, e),
                                   _mm512_permutex2var_epi16(a, odd, b), _mm512_permutex2var_epi16(d, odd, e)};
                uint8_t *out = (uint8_t *)(qt + c);
                for (int k = 0; k < 2; k++) { /* k = 0: even values, 1: odd */
                    __m512i lo0 = vals[2 * k], lo1 = vals[2 * k + 1];
                    __m512i hi = _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srai_epi16(lo0, 8))),
                        _mm512_cvtepi16_epi8(_mm512_srai_epi16(lo1, 8)), 1);
                    __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(lo0)),
                                                    _mm512_cvtepi16_epi8(lo1), 1);
                    _mm512_storeu_si512(out + 64 * k, hi);
                    _mm512_storeu_si512(out + 128 + 64 * k, lo);
                }
            }
        } else if (per_byte == 2) { /* chunks of 64: even values, then odd values */
            int16_t ev[32], od[32];
            for (int j = 0; j < 32; j++) ev[j] = (int16_t)(2 * j), od[j] = (int16_t)(2 * j + 1);
            __m512i even = _mm512_loadu_si512(ev), odd = _mm512_loadu_si512(od);
            for (int64_t c = 0; c < cols; c += 64) {
                __m512i a = _mm512_loadu_si512(qt + c), b = _mm512_loadu_si512(qt + c + 32);
                _mm512_storeu_si512(qt + c, _mm512_permutex2var_epi16(a, even, b));
                _mm512_storeu_si512(qt + c + 32, _mm512_permutex2var_epi16(a, odd, b));
            }
        } else if (per_byte == 4) { /* chunks of 128: value slot k of every byte, k = 0..3 */
            int16_t tmp[128];
            for (int64_t c = 0; c < cols; c += 128) {
                for (int k = 0; k < 4; k++)
                    for (int j = 0; j < 32; j++) tmp[k * 32 + j] = qt[c + 4 * j + k];
                for (int i = 0; i < 128; i++) qt[c + i] = tmp[i];
            }
        }
    }
}

const cpu_kernels cpu_kernels_avx512 = {
    .name = "avx512",
    .needs_int16_x = 1,
    .rows16_bits = 1u << 4 | 1u << 8,
    .rows16_x8_planes = 1,
    .prepare_mlx = avx512_prepare_mlx,
    .matvec = avx512_matvec,
    .dequant = avx512_dequant,
    .gemm_tile = avx512_gemm_tile,
    .gemm_pack = avx512_gemm_pack,
};

#endif
