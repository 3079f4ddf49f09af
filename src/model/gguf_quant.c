/* ggml block formats: dequantize, quantize, rewrite as MLX groups of 32. See gguf_quant.h.
 * The block layouts are ggml's (ggml-common.h): every multi-byte field little-endian, F16 scales. */
#include "model/gguf_quant.h"

#include "model/gguf.h"
#include "model/weight_types.h"

#include <math.h>
#include <string.h>

#define QK 32   /* values per block of the 32-value formats, and per MLX group here */
#define QK_K 256

static float half_at(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static void put_half(uint8_t *p, float v) {
    uint16_t h = f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static float round_f16(float v) { return f16_to_f32(f32_to_f16(v)); }

int gguf_mlx_bits(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: return 0;
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q4_K: return 4;
    case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q5_K: return 5;
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q6_K: case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: return 8;
    default: return -1;
    }
}

int gguf_mlx_zero_point(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q4_0: return 8;
    case GGML_TYPE_Q5_0: return 16;
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q3_K: return 128;
    default: return 0;
    }
}

/* ---- Q2_K and Q3_K: 16 sub-blocks of 16 values per block of 256 ----
 * Both keep value i's 2 low bits at bit 2*((i%128)/32) of byte (i/128)*32 + i%32 of their 64
 * packed bytes; Q3_K keeps its third bit at bit i/32 of byte i%32 of its 32-byte high mask. */

static int k_low2(const uint8_t *qs, int i) { return qs[(i / 128) * 32 + i % 32] >> (2 * ((i % 128) / 32)) & 3; }

static void k_put_low2(uint8_t *qs, int i, int v) { qs[(i / 128) * 32 + i % 32] |= (uint8_t)((v & 3) << (2 * ((i % 128) / 32))); }

/* Q3_K (110 bytes: high mask 32, low bits 64, 12 bytes of sixteen 6-bit scales, F16 d): value i is
 * d * v[i] with v[i] = (scale_{i/16} - 32) * (q3 - 4), q3 in 0..7; v spans [-124, 128]. */
static float q3_k_ints(const uint8_t *b, int16_t *v) {
    const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    for (int k = 0; k < 16; k++) {
        /* low nibble of byte k%8 (the high one for k >= 8), top 2 bits from byte 8 + k%4 */
        int scale = ((sc[k % 8] >> (4 * (k / 8))) & 0xF) | ((sc[8 + k % 4] >> (2 * (k / 4))) & 3) << 4;
        for (int l = 0; l < 16; l++) {
            int i = 16 * k + l, q3 = k_low2(qs, i) | ((hmask[i % 32] >> (i / 32)) & 1) << 2;
            v[i] = (int16_t)((scale - 32) * (q3 - 4));
        }
    }
    return half_at(b + 108);
}

/* Q2_K (84 bytes: 16 bytes of scale | min << 4, low bits 64, F16 d, F16 dmin): value i is
 * d * scale_{i/16} * q2 - dmin * min_{i/16}. */
static void dequantize_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = half_at(b + 80), dmin = half_at(b + 82);
    for (int i = 0; i < QK_K; i++)
        y[i] = d * (float)(sc[i / 16] & 0xF) * (float)k_low2(qs, i) - dmin * (float)(sc[i / 16] >> 4);
}

/* ---- block decoders: the values of one block as q (unsigned) with one scale/bias per 32 ---- */

/* The 6-bit sub-scale and sub-min j of a Q4_K/Q5_K block's 12 packed bytes. */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Decodes one block of an exactly-convertible type. q gets block_elems values, scale/bias one per
 * 32. Returns 0, or -1 for a type that is not exactly convertible. */
static int decode_block(uint32_t type, const uint8_t *b, uint8_t *q, float *scale, float *bias) {
    switch (type) {
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1: {
        int has_min = type == GGML_TYPE_Q4_1;
        const uint8_t *qs = b + (has_min ? 4 : 2);
        float d = half_at(b);
        for (int j = 0; j < 16; j++) {
            q[j] = qs[j] & 0xF;
            q[j + 16] = qs[j] >> 4;
        }
        scale[0] = d;
        bias[0] = has_min ? half_at(b + 2) : -8.0f * d;
        return 0;
    }
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1: {
        int has_min = type == GGML_TYPE_Q5_1;
        const uint8_t *qhp = b + (has_min ? 4 : 2), *qs = qhp + 4;
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        float d = half_at(b);
        for (int j = 0; j < 16; j++) {
            q[j] = (uint8_t)((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
            q[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        scale[0] = d;
        bias[0] = has_min ? half_at(b + 2) : -16.0f * d;
        return 0;
    }
    case GGML_TYPE_Q8_0: {
        float d = half_at(b);
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)((int8_t)b[2 + j] + 128);
        scale[0] = d;
        bias[0] = -128.0f * d;
        return 0;
    }
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: {
        int five = type == GGML_TYPE_Q5_K;
        float d = half_at(b), dmin = half_at(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + (five ? 48 : 16);
        for (int g = 0; g < 8; g++) {
            int s, m;
            scale_min_k4(g, sc, &s, &m);
            scale[g] = d * (float)s;
            bias[g] = -dmin * (float)m;
            const uint8_t *src = ql + 32 * (g / 2);
            for (int l = 0; l < 32; l++) {
                int v = g % 2 ? src[l] >> 4 : src[l] & 0xF;
                if (five && (qh[l] >> g & 1)) v += 16;
                q[32 * g + l] = (uint8_t)v;
            }
        }
        return 0;
    }
    default: return -1;
    }
}

static void dequantize_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = half_at(b + 208);
    for (int n = 0; n < QK_K; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is] * (float)q1;
            y[l + 32] = d * sc[is + 2] * (float)q2;
            y[l + 64] = d * sc[is + 4] * (float)q3;
            y[l + 96] = d * sc[is + 6] * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

int gguf_dequantize_row(uint32_t type, const void *src, int64_t n, float *out) {
    const uint8_t *p = src;
    switch (type) {
    case GGML_TYPE_F32: memcpy(out, src, (size_t)n * 4); return 0;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) out[i] = half_at(p + 2 * i);
        return 0;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return 0;
    case GGML_TYPE_Q6_K:
        for (int64_t i = 0; i < n / QK_K; i++) dequantize_q6_k(p + i * 210, out + i * QK_K);
        return 0;
    case GGML_TYPE_Q2_K:
        for (int64_t i = 0; i < n / QK_K; i++) dequantize_q2_k(p + i * 84, out + i * QK_K);
        return 0;
    case GGML_TYPE_Q3_K:
        for (int64_t i = 0; i < n / QK_K; i++) {
            int16_t v[QK_K];
            float d = q3_k_ints(p + i * 110, v);
            for (int j = 0; j < QK_K; j++) out[i * QK_K + j] = d * (float)v[j];
        }
        return 0;
    default: break;
    }
    int64_t be = ggml_type_block_elems(type);
    size_t bb = ggml_type_block_bytes(type);
    uint8_t q[QK_K];
    float scale[QK_K / QK], bias[QK_K / QK];
    for (int64_t blk = 0; blk < n / (be ? be : 1); blk++) {
        if (decode_block(type, p + blk * bb, q, scale, bias)) return -1;
        for (int64_t j = 0; j < be; j++) out[blk * be + j] = scale[j / QK] * (float)q[j] + bias[j / QK];
    }
    return be ? 0 : -1;
}

/* ---- MLX groups of 32 ---- */

/* Writes 32 values of `bits` bits at value offset `first` of a row's packed words (zeroed). */
static void pack_group(uint32_t *words, int64_t first, const uint8_t *q, int bits) {
    if (bits == 4 || bits == 8) { /* whole words: 8 or 4 values each (first is a multiple of 32) */
        int per = 32 / bits;
        uint32_t *w = words + first / per;
        for (int k = 0; k < QK / per; k++) {
            uint32_t v = 0;
            for (int j = per - 1; j >= 0; j--) v = v << bits | q[k * per + j];
            w[k] = v;
        }
        return;
    }
    for (int j = 0; j < QK; j++) {
        uint64_t bit = (uint64_t)(first + j) * (uint64_t)bits;
        uint64_t w = bit / 32, s = bit % 32;
        words[w] |= (uint32_t)q[j] << s;
        if (s + (uint64_t)bits > 32) words[w + 1] |= (uint32_t)q[j] >> (32 - s);
    }
}

/* 8-bit min/max requantization of 32 floats (scale and bias rounded to F16 first, q rounded
 * against the rounded pair so the stored grid is the one the values were placed on). */
static void requantize_group8(const float *x, uint8_t *q, float *scale, float *bias) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < QK; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    float s = round_f16((hi - lo) / 255.0f), b = round_f16(lo);
    for (int j = 0; j < QK; j++) {
        float v = s > 0 ? rintf((x[j] - b) / s) : 0;
        q[j] = (uint8_t)(v > 0 ? (v < 255 ? v : 255) : 0); /* a NaN (a file's NaN scale) -> 0 */
    }
    *scale = s;
    *bias = b;
}

int gguf_row_to_mlx(uint32_t type, const void *src, int64_t n, uint32_t *packed, float *scales,
                    float *biases) {
    int bits = gguf_mlx_bits(type);
    if (bits <= 0) return -1;
    memset(packed, 0, (size_t)(n * bits / 32) * 4);
    const uint8_t *p = src;
    int64_t be = ggml_type_block_elems(type);
    size_t bb = ggml_type_block_bytes(type);
    uint8_t q[QK_K];
    for (int64_t blk = 0; blk < n / be; blk++) {
        float *sc = scales + blk * (be / QK), *bi = biases + blk * (be / QK);
        if (type == GGML_TYPE_Q6_K || type == GGML_TYPE_Q2_K) {
            float x[QK_K];
            if (type == GGML_TYPE_Q6_K) dequantize_q6_k(p + blk * bb, x);
            else dequantize_q2_k(p + blk * bb, x);
            for (int g = 0; g < QK_K / QK; g++) requantize_group8(x + g * QK, q + g * QK, &sc[g], &bi[g]);
        } else if (type == GGML_TYPE_Q3_K) {
            /* exact: d * v = (-d) * (128 - v) + 128 * d, 128 - v in [0, 252], and both -d and
             * 128 * d are F16 values (d is one): the zero point 128 of Q8_0 */
            int16_t v[QK_K];
            float d = q3_k_ints(p + blk * bb, v);
            for (int j = 0; j < QK_K; j++) q[j] = (uint8_t)(128 - v[j]);
            for (int g = 0; g < QK_K / QK; g++) sc[g] = -d, bi[g] = 128.0f * d;
        } else if (decode_block(type, p + blk * bb, q, sc, bi)) {
            return -1;
        }
        for (int g = 0; g < be / QK; g++) {
            sc[g] = round_f16(sc[g]);
            bi[g] = round_f16(bi[g]);
            pack_group(packed, blk * be + g * QK, q + g * QK, bits);
        }
    }
    return 0;
}

/* ---- quantizers (writer side) ---- */

static void minmax(const float *x, int n, float *lo, float *hi) {
    *lo = *hi = x[0];
    for (int i = 1; i < n; i++) {
        *lo = x[i] < *lo ? x[i] : *lo;
        *hi = x[i] > *hi ? x[i] : *hi;
    }
}

static int clampi(float v, int lo, int hi) {
    int i = (int)rintf(v);
    return i < lo ? lo : i > hi ? hi : i;
}

/* Q4_0/Q5_0: d = (the value of largest magnitude) / -2^(bits-1), symmetric around 2^(bits-1). */
static void quantize_sym(const float *x, uint8_t *b, int five) {
    float amax = 0, mx = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    float half = five ? 16.0f : 8.0f, d = mx / -half, id = d ? 1.0f / d : 0;
    put_half(b, d);
    uint8_t *qs = b + (five ? 6 : 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int q0 = clampi(x[j] * id + half, 0, five ? 31 : 15);
        int q1 = clampi(x[j + 16] * id + half, 0, five ? 31 : 15);
        qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
        qh |= (uint32_t)((q0 >> 4) & 1) << j | (uint32_t)((q1 >> 4) & 1) << (j + 16);
    }
    if (five) memcpy(b + 2, &qh, 4);
}

/* Q4_1/Q5_1: d = (max - min) / (2^bits - 1), m = min. */
static void quantize_affine(const float *x, uint8_t *b, int five) {
    float lo, hi;
    minmax(x, 32, &lo, &hi);
    int top = five ? 31 : 15;
    float d = (hi - lo) / (float)top, id = d ? 1.0f / d : 0;
    put_half(b, d);
    put_half(b + 2, lo);
    uint8_t *qs = b + (five ? 8 : 4);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int q0 = clampi((x[j] - lo) * id, 0, top), q1 = clampi((x[j + 16] - lo) * id, 0, top);
        qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
        qh |= (uint32_t)((q0 >> 4) & 1) << j | (uint32_t)((q1 >> 4) & 1) << (j + 16);
    }
    if (five) memcpy(b + 4, &qh, 4);
}

static void quantize_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f, id = d ? 1.0f / d : 0;
    put_half(b, d);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)clampi(x[j] * id, -127, 127);
}

/* Q4_K/Q5_K: per 32 a scale and a min (6 bits each, relative to the block's d and dmin). */
static void quantize_k45(const float *x, uint8_t *b, int five) {
    int top = five ? 31 : 15;
    float gscale[8], gmin[8], max_scale = 0, max_min = 0;
    for (int g = 0; g < 8; g++) {
        float lo, hi;
        minmax(x + 32 * g, 32, &lo, &hi);
        lo = lo > 0 ? 0 : lo;
        gscale[g] = (hi - lo) / (float)top;
        gmin[g] = -lo;
        max_scale = gscale[g] > max_scale ? gscale[g] : max_scale;
        max_min = gmin[g] > max_min ? gmin[g] : max_min;
    }
    float d = round_f16(max_scale / 63.0f), dmin = round_f16(max_min / 63.0f);
    put_half(b, d);
    put_half(b + 2, dmin);
    uint8_t *sc = b + 4, *qh = b + 16, *ql = b + (five ? 48 : 16);
    memset(sc, 0, 12);
    if (five) memset(qh, 0, 32);
    for (int g = 0; g < 8; g++) {
        int s = d ? clampi(gscale[g] / d, 0, 63) : 0, m = dmin ? clampi(gmin[g] / dmin, 0, 63) : 0;
        if (g < 4) {
            sc[g] = (uint8_t)s;
            sc[g + 4] = (uint8_t)m;
        } else {
            sc[g + 4] = (uint8_t)((s & 0xF) | (m & 0xF) << 4);
            sc[g - 4] |= (uint8_t)((s >> 4) << 6);
            sc[g] |= (uint8_t)((m >> 4) << 6);
        }
        float step = d * (float)s, off = dmin * (float)m;
        uint8_t *dst = ql + 32 * (g / 2);
        for (int l = 0; l < 32; l++) {
            int v = step > 0 ? clampi((x[32 * g + l] + off) / step, 0, top) : 0;
            if (g % 2 == 0) dst[l] = (uint8_t)(v & 0xF);
            else dst[l] |= (uint8_t)((v & 0xF) << 4);
            if (five && v >= 16) qh[l] |= (uint8_t)(1 << g);
        }
    }
}

/* Q2_K: per 16 a 4-bit scale and min relative to the block's d and dmin; values 0..3. */
static void quantize_q2_k(const float *x, uint8_t *b) {
    float sub_scale[16], sub_min[16], max_scale = 0, max_min = 0;
    for (int k = 0; k < 16; k++) {
        float lo, hi;
        minmax(x + 16 * k, 16, &lo, &hi);
        lo = lo > 0 ? 0 : lo;
        sub_scale[k] = (hi - lo) / 3.0f;
        sub_min[k] = -lo;
        max_scale = sub_scale[k] > max_scale ? sub_scale[k] : max_scale;
        max_min = sub_min[k] > max_min ? sub_min[k] : max_min;
    }
    float d = round_f16(max_scale / 15.0f), dmin = round_f16(max_min / 15.0f);
    memset(b, 0, 80);
    for (int k = 0; k < 16; k++) {
        int sc = d ? clampi(sub_scale[k] / d, 0, 15) : 0, m = dmin ? clampi(sub_min[k] / dmin, 0, 15) : 0;
        b[k] = (uint8_t)(sc | m << 4);
        float step = d * (float)sc, off = dmin * (float)m;
        for (int l = 0; l < 16; l++)
            k_put_low2(b + 16, 16 * k + l, step > 0 ? clampi((x[16 * k + l] + off) / step, 0, 3) : 0);
    }
    put_half(b + 80, d);
    put_half(b + 82, dmin);
}

/* Q3_K: per 16 a signed 6-bit scale (stored + 32) relative to the block's d; values q3 - 4 in
 * [-4, 3]. As ggml does, the sub-block of largest magnitude gets scale -32 (so its extreme value
 * lands on -4 * -32 = 128, the end of the range exo's conversion must hold). */
static void quantize_q3_k(const float *x, uint8_t *b) {
    float sub[16], smax = 0;
    for (int k = 0; k < 16; k++) {
        float amax = 0, mx = 0;
        for (int l = 0; l < 16; l++)
            if (fabsf(x[16 * k + l]) > amax) amax = fabsf(x[16 * k + l]), mx = x[16 * k + l];
        sub[k] = mx / -4.0f;
        smax = fabsf(sub[k]) > fabsf(smax) ? sub[k] : smax;
    }
    float d = round_f16(smax / -32.0f);
    uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    memset(b, 0, 108);
    for (int k = 0; k < 16; k++) {
        int s = d ? clampi(sub[k] / d, -32, 31) : 0, u = s + 32;
        sc[k % 8] |= (uint8_t)((u & 0xF) << (4 * (k / 8)));
        sc[8 + k % 4] |= (uint8_t)((u >> 4) << (2 * (k / 4)));
        float step = d * (float)s;
        for (int l = 0; l < 16; l++) {
            int i = 16 * k + l, q3 = step != 0 ? clampi(x[i] / step, -4, 3) + 4 : 4;
            k_put_low2(qs, i, q3);
            hmask[i % 32] |= (uint8_t)((q3 >> 2) << (i / 32));
        }
    }
    put_half(b + 108, d);
}

/* Q6_K: per 16 an int8 scale relative to the block's d; values q - 32 in [-32, 31]. */
static void quantize_q6_k(const float *x, uint8_t *b) {
    float sub[16], amax_sub = 0;
    for (int s = 0; s < 16; s++) {
        float amax = 0;
        for (int l = 0; l < 16; l++) amax = fabsf(x[16 * s + l]) > amax ? fabsf(x[16 * s + l]) : amax;
        sub[s] = amax / 31.0f;
        amax_sub = sub[s] > amax_sub ? sub[s] : amax_sub;
    }
    float d = round_f16(amax_sub / 127.0f);
    uint8_t L[QK_K];
    int8_t *scales = (int8_t *)(b + 192);
    for (int s = 0; s < 16; s++) {
        int sc = d ? clampi(sub[s] / d, 0, 127) : 0;
        scales[s] = (int8_t)sc;
        float step = d * (float)sc;
        for (int l = 0; l < 16; l++)
            L[16 * s + l] = (uint8_t)(step > 0 ? clampi(x[16 * s + l] / step, -32, 31) + 32 : 32);
    }
    uint8_t *ql = b, *qh = b + 128;
    for (int n = 0; n < QK_K; n += 128) {
        for (int l = 0; l < 32; l++) {
            int q1 = L[n + l], q2 = L[n + l + 32], q3 = L[n + l + 64], q4 = L[n + l + 96];
            ql[l] = (uint8_t)((q1 & 0xF) | (q3 & 0xF) << 4);
            ql[l + 32] = (uint8_t)((q2 & 0xF) | (q4 & 0xF) << 4);
            qh[l] = (uint8_t)((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
        }
        ql += 64;
        qh += 32;
    }
    put_half(b + 208, d);
}

int gguf_quantize_row(uint32_t type, const float *x, int64_t n, void *dst) {
    uint8_t *b = dst;
    int64_t be = ggml_type_block_elems(type);
    size_t bb = ggml_type_block_bytes(type);
    if (!be || n % be) return -1;
    for (int64_t i = 0; i < n / be; i++) {
        const float *v = x + i * be;
        uint8_t *o = b + i * bb;
        switch (type) {
        case GGML_TYPE_F32: memcpy(o, v, 4); break;
        case GGML_TYPE_F16: put_half(o, v[0]); break;
        case GGML_TYPE_BF16: {
            uint16_t h = f32_to_bf16(v[0]);
            o[0] = (uint8_t)h;
            o[1] = (uint8_t)(h >> 8);
            break;
        }
        case GGML_TYPE_Q4_0: quantize_sym(v, o, 0); break;
        case GGML_TYPE_Q5_0: quantize_sym(v, o, 1); break;
        case GGML_TYPE_Q4_1: quantize_affine(v, o, 0); break;
        case GGML_TYPE_Q5_1: quantize_affine(v, o, 1); break;
        case GGML_TYPE_Q8_0: quantize_q8_0(v, o); break;
        case GGML_TYPE_Q4_K: quantize_k45(v, o, 0); break;
        case GGML_TYPE_Q5_K: quantize_k45(v, o, 1); break;
        case GGML_TYPE_Q6_K: quantize_q6_k(v, o); break;
        case GGML_TYPE_Q2_K: quantize_q2_k(v, o); break;
        case GGML_TYPE_Q3_K: quantize_q3_k(v, o); break;
        default: return -1;
        }
    }
    return 0;
}
