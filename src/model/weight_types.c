/* weight_types — dtype sizes and names, float width conversions, and the reference reads of a
 * weight view (bytes, one row dequantized to f32); see weight_types.h. */
#include "model/weight_types.h"

#include <string.h>

size_t dtype_size(dtype t) {
    switch (t) {
    case DTYPE_F32: case DTYPE_U32: case DTYPE_I32: return 4;
    case DTYPE_F16: case DTYPE_BF16: return 2;
    case DTYPE_U8: case DTYPE_I8: return 1;
    case DTYPE_I64: return 8;
    }
    return 0;
}

const char *dtype_name(dtype t) {
    static const char *names[] = {"F32", "F16", "BF16", "U32", "I32", "U8", "I8", "I64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* The bits of an IEEE-754 binary32 and back (memcpy: the one defined way to type-pun in C). */
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float bf16_to_f32(uint16_t h) {
    return f32_from_bits((uint32_t)h << 16);
}

uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return f32_from_bits(u);
}

uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (absu < 0x38800000u) {                                   /* subnormal or zero */
        if (absu < 0x33000000u) return (uint16_t)sign;
        uint32_t exp = absu >> 23;
        uint32_t man = (absu & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exp; /* 14..24 */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u) - (0x70u << 23);
    return (uint16_t)(sign | (r >> 13));
}

static float scale_at(const weight_matrix *w, const void *p, int64_t i) {
    switch (w->scale_dtype) {
    case DTYPE_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case DTYPE_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

size_t weight_matrix_bytes(const weight_matrix *w) {
    size_t n = (size_t)w->rows * (size_t)w->cols;
    switch (w->format) {
    case WEIGHT_F32: return n * 4;
    case WEIGHT_F16: case WEIGHT_BF16: return n * 2;
    case WEIGHT_MLX_AFFINE:
        return n * (size_t)w->bits / 8 +
               (w->zero_point ? 1 : 2) * (n / (size_t)w->group_size) * dtype_size(w->scale_dtype);
    }
    return 0;
}

void weight_matrix_row_to_f32(const weight_matrix *w, int64_t r, float *out) {
    int64_t cols = w->cols;
    switch (w->format) {
    case WEIGHT_F32:
        memcpy(out, (const float *)w->data + r * cols, (size_t)cols * 4);
        return;
    case WEIGHT_F16: {
        const uint16_t *p = (const uint16_t *)w->data + r * cols;
        for (int64_t c = 0; c < cols; c++) out[c] = f16_to_f32(p[c]);
        return;
    }
    case WEIGHT_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + r * cols;
        for (int64_t c = 0; c < cols; c++) out[c] = bf16_to_f32(p[c]);
        return;
    }
    case WEIGHT_MLX_AFFINE: {
        int bits = w->bits;
        const uint32_t *q = (const uint32_t *)w->data;
        uint32_t mask = (1u << bits) - 1u;
        for (int64_t c = 0; c < cols; c++) {
            uint64_t bit = (uint64_t)c * (uint64_t)bits;
            int64_t word = (int64_t)(bit >> 5);
            uint64_t off = bit & 31;
            uint64_t v = q[weight_mlx_word(w, r, word)] >> off;
            if (off + (uint64_t)bits > 32) v |= (uint64_t)q[weight_mlx_word(w, r, word + 1)] << (32 - off);
            int64_t g = weight_mlx_group(w, r, c / w->group_size);
            out[c] = scale_at(w, w->scales, g) * (float)(v & mask) + scale_at(w, w->biases, g);
        }
        return;
    }
    }
}
