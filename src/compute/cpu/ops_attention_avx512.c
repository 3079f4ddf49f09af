/* Attention over the paged KV cache on AVX-512, in blocks of 16 cached positions (the
 * flash-attention scheme on a CPU): for a tile of up to 16 consecutive query tokens of one
 * sequence and one KV head, each block of K/V rows is read and widened to f32 once and used by
 * every query head of the tile (up to 16 tokens x the GQA group); a query's 16 scores come out
 * as one vector (K block transposed), softmax is rescaled once per block with a vectorized exp
 * instead of once per position with a scalar expf, and the weighted V sum runs on whole vectors.
 * Before, each (token, KV head) item walked its context one position at a time: a horizontal
 * sum, a scalar expf and a rescale of the accumulator per position and query head, and every K/V
 * row was re-read and re-converted for every query token — late chunks of a long prefill spent
 * most of their time there.
 *
 * A query row's result depends only on its own q, its context length and the cache (blocks of
 * 16 from position 0), never on which other tokens share its tile: the same request gives the
 * same numbers alone or batched, prefilled in one chunk or several.
 *
 * Refuses: shapes cpu_op_attention_avx512_ok() rejects (head_dim not a multiple of 16 or above
 * 256, a GQA group above 16); the backend then uses the AVX2 or reference path. */
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/ops.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define A512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

#define ATT_PB 16 /* cached positions per block */
#define ATT512_MAX_HD 256
#define ATT512_MAX_GROUP 16

int cpu_op_attention_avx512_ok(const attention_batch *ab) {
    if (!cpu_level_supported(CPU_LEVEL_AVX512) || strcmp(cpu_simd_level(), "avx512") != 0) return 0;
    if (ab->sinks || ab->window > 0) return 0; /* gpt-oss: the grouped AVX2 path does those */
    int group = ab->n_heads / ab->n_kv_heads;
    return ab->head_dim % 16 == 0 && ab->head_dim <= ATT512_MAX_HD && group <= ATT512_MAX_GROUP;
}

int64_t cpu_op_attention_tiles(const attention_batch *ab, int32_t *tile_start) {
    int64_t n = 0;
    for (int64_t t = 0; t < ab->n_tokens; t++) {
        if (n > 0 && t - tile_start[n - 1] < CPU_ATT_TILE_TOKENS &&
            ab->seq_of_token[t] == ab->seq_of_token[tile_start[n - 1]])
            continue;
        tile_start[n++] = (int32_t)t;
    }
    tile_start[n] = (int32_t)ab->n_tokens;
    return n;
}

/* e^x on 16 lanes (x <= 0 here): 2^n * p(r), n = round(x / ln 2), |r| <= ln2 / 2, degree-6
 * Taylor polynomial; relative error ~2e-7. Lanes below -87 give 0 after scalef underflow. */
A512 static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-100.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* head_dim values of one cached head, widened to f32, 16 at a time. */
A512 static inline void load_row(const void *base, dtype type, int64_t off, int hd, float *dst) {
    for (int i = 0; i < hd; i += 16) {
        __m512 v;
        if (type == DTYPE_F16)
            v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off + i)));
        else if (type == DTYPE_BF16)
            v = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off + i))), 16));
        else
            v = _mm512_loadu_ps((const float *)base + off + i);
        _mm512_store_ps(dst + i, v);
    }
}

/* Scratch per thread: kt [hd][16], krows [16][hd], vb [16][hd], acc [16*group][hd], m, l. */
size_t cpu_op_attention_avx512_scratch(const attention_batch *ab) {
    size_t hd = (size_t)ab->head_dim, nq = (size_t)CPU_ATT_TILE_TOKENS * (size_t)(ab->n_heads / ab->n_kv_heads);
    return (3 * 16 * hd + nq * hd + 2 * nq) * sizeof(float) + 64;
}

A512 void cpu_op_attention_avx512(const float *q, const kv_layer *kv, const attention_batch *ab,
                                  const int32_t *tile_start, float *out, int64_t begin, int64_t end,
                                  float *scratch) {
    int nh = ab->n_heads, nkv = ab->n_kv_heads, hd = ab->head_dim, group = nh / nkv, nvec = hd / 16;
    int64_t kv_dim = (int64_t)nkv * hd;
    float *kt = scratch, *krows = kt + 16 * hd, *vb = krows + 16 * hd, *acc = vb + 16 * hd;
    float *ms = acc + (size_t)CPU_ATT_TILE_TOKENS * group * hd, *ls = ms + CPU_ATT_TILE_TOKENS * group;
    const __m512i kidx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(hd));
    for (int64_t item = begin; item < end; item++) {
        int64_t tile = item / nkv;
        int kvh = (int)(item % nkv);
        int64_t t0 = tile_start[tile];
        int nt = (int)(tile_start[tile + 1] - t0), nq = nt * group;
        const int32_t *table = ab->block_tables + ab->block_table_start[ab->seq_of_token[t0]];
        int32_t nctx[CPU_ATT_TILE_TOKENS], max_ctx = 0;
        for (int j = 0; j < nt; j++) {
            nctx[j] = ab->positions[t0 + j] + 1;
            max_ctx = nctx[j] > max_ctx ? nctx[j] : max_ctx;
        }
        for (int r = 0; r < nq; r++) {
            ms[r] = -INFINITY;
            ls[r] = 0;
            memset(acc + (size_t)r * hd, 0, (size_t)hd * sizeof(float));
        }
        for (int32_t p0 = 0; p0 < max_ctx; p0 += ATT_PB) {
            int np = max_ctx - p0 < ATT_PB ? max_ctx - p0 : ATT_PB;
            for (int k = 0; k < ATT_PB; k++) {
                if (k >= np) {
                    memset(krows + k * hd, 0, (size_t)hd * sizeof(float));
                    memset(vb + k * hd, 0, (size_t)hd * sizeof(float));
                    continue;
                }
                int32_t p = p0 + k;
                int64_t slot = (int64_t)table[p / ab->block_size] * ab->block_size + p % ab->block_size;
                int64_t off = slot * kv_dim + (int64_t)kvh * hd;
                load_row(kv->k, kv->type, off, hd, krows + k * hd);
                load_row(kv->v, kv->type, off, hd, vb + k * hd);
            }
            for (int i = 0; i < hd; i++) /* kt[i][k] = K[p0 + k][i] */
                _mm512_store_ps(kt + i * 16, _mm512_i32gather_ps(kidx, krows + i, 4));
            for (int r = 0; r < nq; r++) {
                int j = r / group, g = r % group;
                int valid = nctx[j] - p0;
                if (valid <= 0) continue;
                if (valid > ATT_PB) valid = ATT_PB;
                const float *qr = q + ((t0 + j) * nh + (int64_t)kvh * group + g) * hd;
                __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
                int i = 0;
                for (; i + 4 <= hd; i += 4) {
                    s0 = _mm512_fmadd_ps(_mm512_set1_ps(qr[i]), _mm512_load_ps(kt + i * 16), s0);
                    s1 = _mm512_fmadd_ps(_mm512_set1_ps(qr[i + 1]), _mm512_load_ps(kt + (i + 1) * 16), s1);
                    s2 = _mm512_fmadd_ps(_mm512_set1_ps(qr[i + 2]), _mm512_load_ps(kt + (i + 2) * 16), s2);
                    s3 = _mm512_fmadd_ps(_mm512_set1_ps(qr[i + 3]), _mm512_load_ps(kt + (i + 3) * 16), s3);
                }
                __m512 s = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)),
                                         _mm512_set1_ps(ab->scale));
                __mmask16 vm = (__mmask16)(valid >= 16 ? 0xffffu : (1u << valid) - 1u);
                s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vm, s);
                float bm = _mm512_reduce_max_ps(s), mn = bm > ms[r] ? bm : ms[r];
                __m512 pw = _mm512_maskz_mov_ps(vm, exp16(_mm512_sub_ps(s, _mm512_set1_ps(mn))));
                float corr = ms[r] == -INFINITY ? 0.0f : expf(ms[r] - mn);
                ls[r] = ls[r] * corr + _mm512_reduce_add_ps(pw);
                ms[r] = mn;
                float w[16] __attribute__((aligned(64)));
                _mm512_store_ps(w, pw);
                float *ar = acc + (size_t)r * hd;
                __m512 c = _mm512_set1_ps(corr);
                for (int v = 0; v < nvec; v++) {
                    __m512 a = _mm512_mul_ps(_mm512_load_ps(ar + v * 16), c);
                    for (int k = 0; k < valid; k++)
                        a = _mm512_fmadd_ps(_mm512_set1_ps(w[k]), _mm512_load_ps(vb + k * hd + v * 16), a);
                    _mm512_store_ps(ar + v * 16, a);
                }
            }
        }
        for (int r = 0; r < nq; r++) {
            int j = r / group, g = r % group;
            float *o = out + ((t0 + j) * nh + (int64_t)kvh * group + g) * hd;
            __m512 inv = _mm512_set1_ps(1.0f / ls[r]);
            for (int v = 0; v < nvec; v++)
                _mm512_storeu_ps(o + v * 16, _mm512_mul_ps(_mm512_load_ps(acc + (size_t)r * hd + v * 16), inv));
        }
    }
}
#else
int cpu_op_attention_avx512_ok(const attention_batch *ab) {
    (void)ab;
    return 0;
}
int64_t cpu_op_attention_tiles(const attention_batch *ab, int32_t *tile_start) {
    (void)ab, (void)tile_start;
    return 0;
}
size_t cpu_op_attention_avx512_scratch(const attention_batch *ab) {
    (void)ab;
    return 0;
}
void cpu_op_attention_avx512(const float *q, const kv_layer *kv, const attention_batch *ab,
                             const int32_t *tile_start, float *out, int64_t begin, int64_t end,
                             float *scratch) {
    (void)q, (void)kv, (void)ab, (void)tile_start, (void)out, (void)begin, (void)end, (void)scratch;
}
#endif
