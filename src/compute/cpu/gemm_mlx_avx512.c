/* MLX affine weights times a batch of 9..CPU_MLX_GEMM_MAX_TOKENS tokens on AVX-512 VNNI: the
 * "batched decode" regime (16-64 streams decoding together), between the 8-token matvec passes
 * and the f32 gemm of long prefills.
 *
 * Why a third kernel: at 16-64 tokens the f32 gemm spends a large share of its time dequantizing
 * and transposing weight panels (every weight once per call, amortized over only a few tokens),
 * and the matvec passes unpack and read every weight again for each 8 tokens. Here the packed
 * weights are unpacked once per call and group into int16 pairs (the same vpermb/vpsrlvw/AND as
 * the matvec kernel), and vpdpwssd multiplies each pair with the pairs of 16 tokens at once
 * (tokens in the vector lanes, the weight pair broadcast): 32 products per instruction, twice
 * the f32 FMA's 16, and no transpose of the weights at all. The activations are the int16
 * per-group quantization of the matvec path (x ~= xq * max|x_g| / 32767; matvec_input explains
 * the error bound), laid out [column pair][token] once per call (cpu_mlx_gemm_prepare).
 *
 * Per group g and row r the int32 dot products are converted once and scaled:
 *   y[t][r] += scale[r][g] * xscale[t][g] * (q_r,g . xq_t,g) + bias[r][g] * xsum[t][g].
 * Register tile: R rows x T vectors of 16 tokens, R*T = 12 (24 zmm accumulators: 12 int32,
 * 12 float).
 *
 * Refuses: nothing at run time; cpu.c calls it only for views cpu_weight_supported() accepts,
 * on CPUs with AVX-512 VNNI/VBMI. */
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/mlx_avx512.h"

#if defined(__x86_64__)

#include <immintrin.h>


size_t cpu_mlx_gemm_x_bytes(int64_t n_tokens, int64_t cols, int64_t group_size) {
    int64_t tpad = (n_tokens + 15) & ~(int64_t)15;
    return (size_t)(cols / 2 * tpad) * 4 + 2 * (size_t)(cols / group_size * tpad) * sizeof(float);
}

/* The 4-bit pair order (shift + AND unpack, no vpermb) measured 4-15% faster at 16-48 tokens and
 * ~10% slower at 64 (the 3x4 tile has no register left for its constant), so only up to 48. */
int cpu_mlx_gemm_pairs4(int bits, int64_t n_tokens) {
    return bits == 4 && n_tokens <= 48;
}

void cpu_mlx_gemm_x_init(mlx_gemm_x *px, void *mem, int64_t n_tokens, int64_t cols,
                         int64_t group_size, int bits) {
    px->pairs4 = cpu_mlx_gemm_pairs4(bits, n_tokens);
    px->n_tokens = n_tokens;
    px->tpad = (n_tokens + 15) & ~(int64_t)15;
    px->cols = cols;
    px->group_size = group_size;
    px->xp = mem;
    px->xscale = (float *)(px->xp + cols / 2 * px->tpad);
    px->xsum = px->xscale + cols / group_size * px->tpad;
}

/* Groups [g0, g1) of every token: the same rounding as the matvec path's preparation (sum and
 * max over 16-lane partials, round to nearest even, saturate to int16). */
T512 void cpu_mlx_gemm_prepare(const float *x, mlx_gemm_x *px, int64_t g0, int64_t g1) {
    int64_t cols = px->cols, gs = px->group_size, tpad = px->tpad, n = px->n_tokens;
    for (int64_t g = g0; g < g1; g++) {
        uint32_t *xp = px->xp + g * (gs / 2) * tpad;
        for (int64_t t = 0; t < tpad; t++) {
            if (t >= n) {
                px->xscale[g * tpad + t] = px->xsum[g * tpad + t] = 0.0f;
                for (int64_t i = 0; i < gs / 2; i++) xp[i * tpad + t] = 0;
                continue;
            }
            uint32_t pairs[64]; /* the group's int16 values in order, two per word */
            quantize_group_int16(x + t * cols + g * gs, gs, (int16_t *)pairs, &px->xsum[g * tpad + t],
                                 &px->xscale[g * tpad + t], 32767.0f);
            if (!px->pairs4) {
                for (int64_t i = 0; i < gs / 2; i++) xp[i * tpad + t] = pairs[i];
                continue;
            }
            /* 4-bit: value 8d + k of the group (k < 4) pairs with 8d + k + 4 in pair k*D + d */
            const uint16_t *h = (const uint16_t *)pairs;
            int64_t D = gs / 8;
            for (int64_t k = 0; k < 4; k++)
                for (int64_t d = 0; d < D; d++)
                    xp[(k * D + d) * tpad + t] = h[8 * d + k] | (uint32_t)h[8 * d + k + 4] << 16;
        }
    }
}

/* Rows r0 .. r0+R-1 (rows past nr repeat the last valid one; their results are dropped) times
 * token vectors tv0 .. tv0+T-1, over groups [g0, g1). The float accumulators start at zero
 * (g0 == 0) or from acc [R][T][16], and go to y (g1 == groups) or back to acc. wbuf holds R rows
 * of one group as int16 pairs. */
T512 INLINE void mlx_gemm_tile(const weight_matrix *w, const mlx_gemm_x *px, float *y, int64_t r0,
                                int nr, int64_t tv0, int64_t g0, int64_t g1, float *acc,
                                const unpack_consts *u, uint32_t *wbuf, const int R, const int T) {
    int64_t cols = w->cols, gs = w->group_size, groups = cols / gs, kpg = gs / 2, tpad = px->tpad;
    /* MLX order only (cpu_mlx_gemm_rows copies interleaved blocks back first): row i's group g
     * starts at word rows[i] + g * group_words. */
    int64_t group_words = gs * w->bits / 32;
    const uint32_t *rows[12];
    int64_t ridx[12];
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) {
        ridx[i] = r0 + (i < nr ? i : nr - 1);
        rows[i] = (const uint32_t *)w->data + ridx[i] * (cols * w->bits / 32);
    }
    /* this K block's scales and biases of the R rows as f32 (g1 - g0 <= 16), read by broadcast */
    float sb[12][16], bb[12][16];
    __mmask16 gm = tail_mask16(g1 - g0);
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) {
        _mm512_storeu_ps(sb[i], scales_load16(w->scale_dtype, w->scales, ridx[i] * groups + g0, gm));
        _mm512_storeu_ps(bb[i], scales_load16(w->scale_dtype, w->biases, ridx[i] * groups + g0, gm));
    }
    __m512 facc[12][4];
#pragma GCC unroll 12
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            facc[i][j] = g0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(acc + (i * T + j) * 16);
    for (int64_t g = g0; g < g1; g++) {
        if (px->pairs4 && gs == 64) {
            /* (v[8d+k], v[8d+k+4]) = (dword d >> 4k) & 0x000f000f goes to pair k*8 + d. Plain
             * (unmasked) stores: the broadcasts below read them back at once, and a masked
             * store cannot forward to a load (that made this path slower than the vpermb one). */
            const __m256i nib = _mm256_set1_epi32(0x000f000f);
#pragma GCC unroll 12
            for (int i = 0; i < R; i++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(rows[i] + g * group_words));
                __m256i *dst = (__m256i *)(wbuf + i * kpg);
                _mm256_store_si256(dst, _mm256_and_si256(raw, nib));
                _mm256_store_si256(dst + 1, _mm256_and_si256(_mm256_srli_epi32(raw, 4), nib));
                _mm256_store_si256(dst + 2, _mm256_and_si256(_mm256_srli_epi32(raw, 8), nib));
                _mm256_store_si256(dst + 3, _mm256_and_si256(_mm256_srli_epi32(raw, 12), nib));
            }
        } else if (px->pairs4 && gs == 128) {
            const __m512i nib = _mm512_set1_epi32(0x000f000f);
#pragma GCC unroll 12
            for (int i = 0; i < R; i++) {
                __m512i raw = _mm512_loadu_si512(rows[i] + g * group_words);
                __m512i *dst = (__m512i *)(wbuf + i * kpg);
                _mm512_store_si512(dst, _mm512_and_si512(raw, nib));
                _mm512_store_si512(dst + 1, _mm512_and_si512(_mm512_srli_epi32(raw, 4), nib));
                _mm512_store_si512(dst + 2, _mm512_and_si512(_mm512_srli_epi32(raw, 8), nib));
                _mm512_store_si512(dst + 3, _mm512_and_si512(_mm512_srli_epi32(raw, 12), nib));
            }
        } else if (px->pairs4) { /* gs == 32 */
            const __m128i nib = _mm_set1_epi32(0x000f000f);
#pragma GCC unroll 12
            for (int i = 0; i < R; i++) {
                __m128i raw = _mm_loadu_si128((const __m128i *)(rows[i] + g * group_words));
                __m128i *dst = (__m128i *)(wbuf + i * kpg);
                _mm_store_si128(dst, _mm_and_si128(raw, nib));
                _mm_store_si128(dst + 1, _mm_and_si128(_mm_srli_epi32(raw, 4), nib));
                _mm_store_si128(dst + 2, _mm_and_si128(_mm_srli_epi32(raw, 8), nib));
                _mm_store_si128(dst + 3, _mm_and_si128(_mm_srli_epi32(raw, 12), nib));
            }
        } else {
#pragma GCC unroll 12
            for (int i = 0; i < R; i++) {
                const uint32_t *q = rows[i] + g * group_words;
                for (int64_t c = 0; c < gs; c += 32, q += w->bits)
                    _mm512_store_si512(wbuf + i * kpg + c / 2, unpack32(u, (const uint8_t *)q));
            }
        }
        __m512i iacc[12][4];
#pragma GCC unroll 12
        for (int i = 0; i < R; i++)
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) iacc[i][j] = _mm512_setzero_si512();
        const uint32_t *xg = px->xp + g * kpg * tpad + tv0 * 16;
        for (int64_t kp = 0; kp < kpg; kp++) {
            __m512i xv[4];
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) xv[j] = _mm512_load_si512(xg + kp * tpad + j * 16);
#pragma GCC unroll 12
            for (int i = 0; i < R; i++) {
                __m512i wb = _mm512_set1_epi32((int)wbuf[i * kpg + kp]);
#pragma GCC unroll 4
                for (int j = 0; j < T; j++) iacc[i][j] = _mm512_dpwssd_epi32(iacc[i][j], wb, xv[j]);
            }
        }
        const float *xs = px->xscale + g * tpad + tv0 * 16, *xm = px->xsum + g * tpad + tv0 * 16;
        /* y += scale * (xscale * dot) + bias * xsum: the scalars come as memory broadcasts */
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            __m512 xsj = _mm512_load_ps(xs + j * 16), xmj = _mm512_load_ps(xm + j * 16);
#pragma GCC unroll 12
            for (int i = 0; i < R; i++) {
                __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(iacc[i][j]), xsj);
                facc[i][j] = _mm512_fmadd_ps(d, _mm512_set1_ps(sb[i][g - g0]), facc[i][j]);
                facc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(bb[i][g - g0]), xmj, facc[i][j]);
            }
        }
    }
    if (g1 < groups) {
#pragma GCC unroll 12
        for (int i = 0; i < R; i++)
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) _mm512_store_ps(acc + (i * T + j) * 16, facc[i][j]);
        return;
    }
    int64_t n = px->n_tokens, ld = w->rows;
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) {
        if (i >= nr) break;
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            float out[16] __attribute__((aligned(64)));
            _mm512_store_ps(out, facc[i][j]);
            int64_t t0 = (tv0 + j) * 16;
            int lanes = (int)(n - t0 < 16 ? n - t0 : 16);
            for (int l = 0; l < lanes; l++) y[(t0 + l) * ld + r0 + i] = out[l];
        }
    }
}

#define TILE_FN(R, T)                                                                              \
    T512 static void mlx_gemm_tile_##R##x##T(const weight_matrix *w, const mlx_gemm_x *px,        \
                                             float *y, int64_t r0, int nr, int64_t tv0,           \
                                             int64_t g0, int64_t g1, float *acc,                   \
                                             const unpack_consts *u, uint32_t *wbuf) {                   \
        mlx_gemm_tile(w, px, y, r0, nr, tv0, g0, g1, acc, u, wbuf, R, T);                          \
    }
TILE_FN(12, 1)
TILE_FN(6, 2)
TILE_FN(4, 3)
TILE_FN(3, 4)

/* Rows per block, and columns per K block times token vectors: a block's tiles all reuse the same
 * K block of the activations (16 KiB: 64 column pairs of 64 tokens, 256 pairs of 16) while it is
 * in L1; without the K blocking a 3-row tile streamed the whole activation panel from L2 and ran
 * ~30% slower at 64 tokens. */
#define MLX_GEMM_BLOCK_ROWS 96
#define MLX_GEMM_KB_X_T 512

/* Rows [b0, b1) of a 16-row interleaved matrix copied into mem in MLX order (group by group,
 * as the groups of a row lie apart with inline scales; words by 4- to 16-word gathers, scales
 * one by one), as a view whose row i is row b0 + i and whose `rows` stays w->rows (the tiles use
 * it as y's row stride only). Per block of rows this is a few percent of
 * the tiles' work; reading the interleaved rows inside the tiles instead (gathers per row and
 * group) made the gemm up to 2x slower at 9-32 tokens. */
T512 static weight_matrix rows_in_mlx_order(const weight_matrix *w, int64_t b0, int64_t b1, void *mem) {
    int64_t words = w->cols * w->bits / 32, groups = w->cols / w->group_size, n = b1 - b0;
    size_t es = dtype_size(w->scale_dtype);
    uint32_t *d = mem;
    uint8_t *sc = (uint8_t *)(d + n * words), *bi = sc + (size_t)(n * groups) * es;
    int64_t per_group = words / groups; /* a row's words per group: 4 to 32 */
    /* an interleaved row's scales are 16 apart, or a unit apart with inline scales (group_stride) */
    int64_t sstep = w->group_stride ? (int64_t)(w->group_stride / es) : 16;
    for (int64_t r = b0; r < b1; r++) {
        const uint32_t *src = (const uint32_t *)w->data + weight_mlx_word(w, r, 0);
        uint32_t *dst = d + (r - b0) * words;
        int strided = row_strided(w, r);
        if (!strided) {
            memcpy(dst, src, (size_t)words * 4);
        } else if (!w->group_stride) { /* one row's words every 16th over the whole block */
            for (int64_t j = 0; j < words; j += 16) _mm512_storeu_si512(dst + j, rows16_words16(src + 16 * j));
        } else {
            for (int64_t g = 0; g < groups; g++, src += w->group_stride / 4, dst += per_group) {
                if (per_group >= 16)
                    for (int64_t j = 0; j < per_group; j += 16) _mm512_storeu_si512(dst + j, rows16_words16(src + 16 * j));
                else if (per_group == 8) _mm256_storeu_si256((__m256i *)dst, rows16_words8(src));
                else _mm_storeu_si128((__m128i *)dst, rows16_words4(src));
            }
        }
        int64_t first = weight_mlx_group(w, r, 0), step = strided ? sstep : 1, to = (r - b0) * groups;
        if (es == 2) {
            const uint16_t *s16 = (const uint16_t *)w->scales + first, *b16 = (const uint16_t *)w->biases + first;
            for (int64_t g = 0; g < groups; g++)
                ((uint16_t *)sc)[to + g] = s16[g * step], ((uint16_t *)bi)[to + g] = b16[g * step];
        } else {
            const uint32_t *s32 = (const uint32_t *)w->scales + first, *b32 = (const uint32_t *)w->biases + first;
            for (int64_t g = 0; g < groups; g++)
                ((uint32_t *)sc)[to + g] = s32[g * step], ((uint32_t *)bi)[to + g] = b32[g * step];
        }
    }
    weight_matrix v = *w;
    v.layout = WEIGHT_LAYOUT_MLX, v.group_stride = 0;
    v.data = d, v.scales = sc, v.biases = bi;
    return v;
}

T512 int cpu_mlx_gemm_rows(const weight_matrix *w, const mlx_gemm_x *px, float *y, int64_t r0,
                           int64_t r1) {
    unpack_consts u = unpack_setup(w->bits);
    uint32_t wbuf[12 * 64] __attribute__((aligned(64)));
    float acc[MLX_GEMM_BLOCK_ROWS * 64] __attribute__((aligned(64)));
    int64_t nvec = px->tpad / 16, groups = w->cols / w->group_size;
    const weight_matrix *full = w;
    weight_matrix copy;
    /* interleaved rows: one MLX-order copy per block in thread scratch slot 1 (the tiles read
     * MLX order only) */
    size_t copy_bytes = full->layout == WEIGHT_LAYOUT_MLX_ROWS16
                            ? (size_t)MLX_GEMM_BLOCK_ROWS * ((size_t)full->cols * (size_t)full->bits / 8 +
                                                             2 * (size_t)groups * dtype_size(full->scale_dtype))
                            : 0;
    void *copy_mem = copy_bytes ? cpu_scratch(1, copy_bytes) : NULL;
    if (copy_bytes && !copy_mem) return -1;
    for (int64_t b0 = r0; b0 < r1; b0 += MLX_GEMM_BLOCK_ROWS) {
        int64_t b1 = b0 + MLX_GEMM_BLOCK_ROWS < r1 ? b0 + MLX_GEMM_BLOCK_ROWS : r1;
        int64_t base = 0; /* rows of w below the view's row 0 */
        if (copy_mem) {
            copy = rows_in_mlx_order(full, b0, b1, copy_mem);
            w = &copy;
            base = b0;
        }
        for (int64_t tv0 = 0; tv0 < nvec; tv0 += 4) {
            int T = (int)(nvec - tv0 < 4 ? nvec - tv0 : 4), R = 12 / T;
            int64_t kb = MLX_GEMM_KB_X_T / T, gkb = kb > w->group_size ? kb / w->group_size : 1;
            for (int64_t g0 = 0; g0 < groups; g0 += gkb) {
                int64_t g1 = g0 + gkb < groups ? g0 + gkb : groups;
                for (int64_t r = b0; r < b1; r += R) {
                    int nr = (int)(b1 - r < R ? b1 - r : R);
                    float *a = acc + (r - b0) * T * 16; /* this tile's [R][T][16] */
                    float *yb = y + base;
                    int64_t rv = r - base;
                    switch (T) {
                    case 1: mlx_gemm_tile_12x1(w, px, yb, rv, nr, tv0, g0, g1, a, &u, wbuf); break;
                    case 2: mlx_gemm_tile_6x2(w, px, yb, rv, nr, tv0, g0, g1, a, &u, wbuf); break;
                    case 3: mlx_gemm_tile_4x3(w, px, yb, rv, nr, tv0, g0, g1, a, &u, wbuf); break;
                    default: mlx_gemm_tile_3x4(w, px, yb, rv, nr, tv0, g0, g1, a, &u, wbuf); break;
                    }
                }
            }
        }
    }
    return 0;
}

#endif
