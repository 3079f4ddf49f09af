/* Attention over the paged KV cache, reference path: one pass with an online softmax per
 * (token, head), so no score buffer is needed whatever the context length. */
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
        for (int32_t p = 0; p < n_ctx; p++) {
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
        float *o = out + item * hd;
        for (int i = 0; i < hd; i++) o[i] = acc[i] / l;
    }
}
