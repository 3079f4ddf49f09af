/* Attention over the paged KV cache, reference path: one pass with an online softmax per
 * (token, head), so no score buffer is needed whatever the context length. A sliding window
 * starts the pass later; an attention sink (gpt-oss) is one more logit in the softmax's
 * denominator whose value row is zero. */
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/ops.h"

#include <math.h>
#include <string.h>

static void store_row(void *base, dtype type, int64_t slot, int64_t kv_dim, const float *src) {
    switch (type) {
    case DTYPE_F16: {
        uint16_t *d = (uint16_t *)base + slot * kv_dim;
        for (int64_t i = 0; i < kv_dim; i++) d[i] = f32_to_f16(src[i]);
        break;
    }
    case DTYPE_BF16: {
        uint16_t *d = (uint16_t *)base + slot * kv_dim;
        for (int64_t i = 0; i < kv_dim; i++) d[i] = f32_to_bf16(src[i]);
        break;
    }
    default: memcpy((float *)base + slot * kv_dim, src, (size_t)kv_dim * sizeof(float));
    }
}

void cpu_op_kv_write(const kv_layer *kv, const float *k, const float *v, const int32_t *slots,
                     int64_t n_tokens, int64_t kv_dim) {
    for (int64_t t = 0; t < n_tokens; t++) {
        store_row(kv->k, kv->type, slots[t], kv_dim, k + t * kv_dim);
        store_row(kv->v, kv->type, slots[t], kv_dim, v + t * kv_dim);
    }
}

/* First position token t attends to: 0, or the window's start. */
static inline int32_t attention_first(const attention_batch *ab, int32_t n_ctx) {
    return ab->window > 0 && n_ctx > ab->window ? n_ctx - ab->window : 0;
}

/* 1 / (softmax denominator) for running max m and sum l, with head h's sink logit joining the
 * sum; scaled so that exp never overflows whichever of m and the sink is larger. Returns the
 * factor the accumulator is multiplied by. */
static inline float attention_norm(const attention_batch *ab, int h, float m, float l) {
    if (!ab->sinks) return 1.0f / l;
    float sink = ab->sinks[h];
    if (sink > m) {
        float c = expf(m - sink);
        return c / (l * c + 1.0f);
    }
    return 1.0f / (l + expf(sink - m));
}

/* Reads head_dim values of one cached head into out (f32). */
static inline const float *load_head(const void *base, dtype type, int64_t offset, int hd,
                                     float *tmp) {
    switch (type) {
    case DTYPE_F16:
        for (int i = 0; i < hd; i++) tmp[i] = f16_to_f32(((const uint16_t *)base)[offset + i]);
        return tmp;
    case DTYPE_BF16:
        for (int i = 0; i < hd; i++) tmp[i] = bf16_to_f32(((const uint16_t *)base)[offset + i]);
        return tmp;
    default: return (const float *)base + offset;
    }
}

void cpu_op_attention(const float *q, const kv_layer *kv, const attention_batch *ab, float *out,
                      int64_t begin, int64_t end) {
    int nh = ab->n_heads, hd = ab->head_dim, group = ab->n_heads / ab->n_kv_heads;
    int64_t kv_dim = (int64_t)ab->n_kv_heads * hd;
    float acc[1024], ktmp[1024], vtmp[1024]; /* head_dim <= 1024 (config limit) */
    for (int64_t item = begin; item < end; item++) {
        int64_t t = item / nh;
        int h = (int)(item % nh), kvh = h / group;
        const float *qh = q + item * hd;
        const int32_t *table = ab->block_tables + ab->block_table_start[ab->seq_of_token[t]];
        int32_t n_ctx = ab->positions[t] + 1;
        float m = -INFINITY, l = 0;
        memset(acc, 0, (size_t)hd * sizeof *acc);
        for (int32_t p = attention_first(ab, n_ctx); p < n_ctx; p++) {
            int64_t slot = (int64_t)table[p / ab->block_size] * ab->block_size + p % ab->block_size;
            int64_t off = slot * kv_dim + (int64_t)kvh * hd;
            const float *kr = load_head(kv->k, kv->type, off, hd, ktmp);
            float s = 0;
            for (int i = 0; i < hd; i++) s += qh[i] * kr[i];
            s *= ab->scale;
            const float *vr = load_head(kv->v, kv->type, off, hd, vtmp);
            if (s > m) {
                float corr = expf(m - s);
                l = l * corr + 1.0f;
                for (int i = 0; i < hd; i++) acc[i] = acc[i] * corr + vr[i];
                m = s;
            } else {
                float w = expf(s - m);
                l += w;
                for (int i = 0; i < hd; i++) acc[i] += w * vr[i];
            }
        }
        float *o = out + item * hd, norm = attention_norm(ab, h, m, l);
        for (int i = 0; i < hd; i++) o[i] = acc[i] * norm;
    }
}

/* ---- grouped attention: AVX2 on x86-64, NEON on aarch64 ------------------------------------
 * One body over an 8-float vector type (vec8): __m256 with AVX2/FMA/F16C, two float32x4_t with
 * NEON. */
#if defined(__x86_64__)
#include <immintrin.h>

#define TVEC __attribute__((target("avx2,fma,f16c")))
typedef __m256 vec8;

TVEC static inline vec8 v8_zero(void) {
    return _mm256_setzero_ps();
}
TVEC static inline vec8 v8_load(const float *p) {
    return _mm256_loadu_ps(p);
}
TVEC static inline void v8_store(float *p, vec8 v) {
    _mm256_storeu_ps(p, v);
}
TVEC static inline vec8 v8_set1(float x) {
    return _mm256_set1_ps(x);
}
TVEC static inline vec8 v8_mul(vec8 a, vec8 b) {
    return _mm256_mul_ps(a, b);
}
TVEC static inline vec8 v8_fmadd(vec8 a, vec8 b, vec8 c) {
    return _mm256_fmadd_ps(a, b, c);
}
TVEC static inline float v8_sum(vec8 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* 8 cached values at offset off of the cache, widened to f32. */
TVEC static inline vec8 v8_load_kv(const void *base, dtype type, int64_t off) {
    switch (type) {
    case DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + off)));
    case DTYPE_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + off))),
            16));
    default: return _mm256_loadu_ps((const float *)base + off);
    }
}
#define GROUPED_LEVEL CPU_LEVEL_AVX2

#elif defined(__aarch64__)
#include <arm_neon.h>

#define TVEC
typedef struct vec8 {
    float32x4_t lo, hi;
} vec8;

static inline vec8 v8_zero(void) {
    return (vec8){vdupq_n_f32(0), vdupq_n_f32(0)};
}
static inline vec8 v8_load(const float *p) {
    return (vec8){vld1q_f32(p), vld1q_f32(p + 4)};
}
static inline void v8_store(float *p, vec8 v) {
    vst1q_f32(p, v.lo);
    vst1q_f32(p + 4, v.hi);
}
static inline vec8 v8_set1(float x) {
    return (vec8){vdupq_n_f32(x), vdupq_n_f32(x)};
}
static inline vec8 v8_mul(vec8 a, vec8 b) {
    return (vec8){vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)};
}
static inline vec8 v8_fmadd(vec8 a, vec8 b, vec8 c) {
    return (vec8){vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
}
static inline float v8_sum(vec8 v) {
    return vaddvq_f32(vaddq_f32(v.lo, v.hi));
}
static inline vec8 v8_load_kv(const void *base, dtype type, int64_t off) {
    if (type == DTYPE_F32) return v8_load((const float *)base + off);
    uint16x8_t h = vld1q_u16((const uint16_t *)base + off);
    if (type == DTYPE_F16) {
        float16x8_t f = vreinterpretq_f16_u16(h);
        return (vec8){vcvt_f32_f16(vget_low_f16(f)), vcvt_high_f32_f16(f)};
    }
    return (vec8){vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)),
                  vreinterpretq_f32_u32(vshll_high_n_u16(h, 16))};
}
#define GROUPED_LEVEL CPU_LEVEL_NEON
#endif

#if defined(__x86_64__) || defined(__aarch64__)
#define ATT_MAX_GROUP 16
#define ATT_MAX_HD 256

/* Work items are (token, kv head) pairs: the query heads sharing a KV head are done together,
 * so each cached K/V row is read once per group, not once per head. head_dim % 8 == 0,
 * head_dim <= 256, group <= 16 (cpu_op_attention_fast_ok). */
TVEC void cpu_op_attention_grouped(const float *q, const kv_layer *kv, const attention_batch *ab,
                                   float *out, int64_t begin, int64_t end) {
    int nkv = ab->n_kv_heads, hd = ab->head_dim, group = ab->n_heads / nkv;
    int64_t kv_dim = (int64_t)nkv * hd;
    int nv = hd / 8;
    vec8 acc[ATT_MAX_GROUP][ATT_MAX_HD / 8];
    float m[ATT_MAX_GROUP], l[ATT_MAX_GROUP], s[ATT_MAX_GROUP];
    for (int64_t item = begin; item < end; item++) {
        int64_t t = item / nkv;
        int kvh = (int)(item % nkv);
        const float *qg = q + (t * ab->n_heads + (int64_t)kvh * group) * hd;
        const int32_t *table = ab->block_tables + ab->block_table_start[ab->seq_of_token[t]];
        int32_t n_ctx = ab->positions[t] + 1;
        for (int g = 0; g < group; g++) {
            m[g] = -INFINITY;
            l[g] = 0;
            for (int i = 0; i < nv; i++) acc[g][i] = v8_zero();
        }
        for (int32_t p = attention_first(ab, n_ctx); p < n_ctx; p++) {
            int64_t slot = (int64_t)table[p / ab->block_size] * ab->block_size + p % ab->block_size;
            int64_t off = slot * kv_dim + (int64_t)kvh * hd;
            for (int g = 0; g < group; g++) {
                vec8 d = v8_zero();
                for (int i = 0; i < nv; i++)
                    d = v8_fmadd(v8_load(qg + g * hd + i * 8), v8_load_kv(kv->k, kv->type, off + i * 8), d);
                s[g] = v8_sum(d) * ab->scale;
            }
            for (int g = 0; g < group; g++) {
                float w;
                if (s[g] > m[g]) {
                    float corr = expf(m[g] - s[g]);
                    vec8 c = v8_set1(corr);
                    for (int i = 0; i < nv; i++) acc[g][i] = v8_mul(acc[g][i], c);
                    l[g] *= corr;
                    m[g] = s[g];
                    w = 1.0f;
                } else {
                    w = expf(s[g] - m[g]);
                }
                l[g] += w;
                s[g] = w;
            }
            for (int i = 0; i < nv; i++) {
                vec8 v = v8_load_kv(kv->v, kv->type, off + i * 8);
                for (int g = 0; g < group; g++) acc[g][i] = v8_fmadd(v8_set1(s[g]), v, acc[g][i]);
            }
        }
        for (int g = 0; g < group; g++) {
            float *o = out + (t * ab->n_heads + (int64_t)kvh * group + g) * hd;
            vec8 inv = v8_set1(attention_norm(ab, kvh * group + g, m[g], l[g]));
            for (int i = 0; i < nv; i++) v8_store(o + i * 8, v8_mul(acc[g][i], inv));
        }
    }
}

int cpu_op_attention_fast_ok(const attention_batch *ab) {
    int group = ab->n_heads / ab->n_kv_heads; /* the level, unless EXO_CPU_SIMD=generic */
    return cpu_level_supported(GROUPED_LEVEL) && ab->head_dim % 8 == 0 && ab->head_dim <= ATT_MAX_HD &&
           group <= ATT_MAX_GROUP;
}
#else
void cpu_op_attention_grouped(const float *q, const kv_layer *kv, const attention_batch *ab,
                              float *out, int64_t begin, int64_t end) {
    (void)q, (void)kv, (void)ab, (void)out, (void)begin, (void)end;
}
int cpu_op_attention_fast_ok(const attention_batch *ab) {
    (void)ab;
    return 0;
}
#endif
