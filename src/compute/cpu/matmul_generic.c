/* Portable C kernels: the fallback level on CPUs without AVX2/AVX-512 (and for builds on other
 * architectures until their SIMD level lands). Plain loops the compiler may auto-vectorize;
 * the gemm regime hands the dequantized tiles to OpenBLAS sgemm. */
#include "compute/cpu/cpu_internal.h"


static void generic_dequant(const weight_matrix *w, int64_t r, int64_t c0, int64_t len, float *out) {
    int64_t cols = w->cols;
    switch (w->format) {
    case WEIGHT_F32: {
        const float *p = (const float *)w->data + r * cols + c0;
        for (int64_t c = 0; c < len; c++) out[c] = p[c];
        return;
    }
    case WEIGHT_F16: {
        const uint16_t *p = (const uint16_t *)w->data + r * cols + c0;
        for (int64_t c = 0; c < len; c++) out[c] = f16_to_f32(p[c]);
        return;
    }
    case WEIGHT_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + r * cols + c0;
        for (int64_t c = 0; c < len; c++) out[c] = bf16_to_f32(p[c]);
        return;
    }
    case WEIGHT_MLX_AFFINE: {
        int bits = w->bits, gs = w->group_size;
        const uint32_t *q = (const uint32_t *)w->data + r * (cols * bits / 32);
        int64_t groups = cols / gs;
        uint32_t mask = (1u << bits) - 1u;
        for (int64_t c = c0; c < c0 + len; c += gs) {
            int64_t g = r * groups + c / gs;
            float s = cpu_scale_at(w->scale_dtype, w->scales, g);
            float b = cpu_scale_at(w->scale_dtype, w->biases, g);
            for (int64_t i = c; i < c + gs; i++) {
                uint64_t bit = (uint64_t)i * (uint64_t)bits, word = bit >> 5, off = bit & 31;
                uint64_t v = q[word] >> off;
                if (off + (uint64_t)bits > 32) v |= (uint64_t)q[word + 1] << (32 - off);
                out[i - c0] = s * (float)(v & mask) + b;
            }
        }
        return;
    }
    }
}

/* Columns are dequantized 256 at a time (a multiple of every MLX group size) into a stack
 * buffer, so the kernel needs no heap memory. */
static void generic_matvec(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                           int64_t r1) {
    enum { CHUNK = 256 };
    int64_t cols = w->cols;
    float row[CHUNK];
    for (int64_t r = r0; r < r1; r++) {
        float acc[CPU_MATVEC_MAX_TOKENS][8] = {{0}};
        for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
            int64_t len = cols - c0 < CHUNK ? cols - c0 : CHUNK;
            generic_dequant(w, r, c0, len, row);
            for (int64_t t = 0; t < in->n_tokens; t++) {
                const float *x = in->x + t * cols + c0;
                int64_t c = 0;
                for (; c + 8 <= len; c += 8)
                    for (int j = 0; j < 8; j++) acc[t][j] += row[c + j] * x[c + j];
                for (; c < len; c++) acc[t][0] += row[c] * x[c];
            }
        }
        for (int64_t t = 0; t < in->n_tokens; t++) {
            float *a = acc[t];
            y[t * w->rows + r] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        }
    }
}

const cpu_kernels cpu_kernels_generic = {
    .name = "generic",
    .needs_int16_x = 0,
    .matvec = generic_matvec,
    .dequant = generic_dequant,
    .gemm_tile = NULL,
};
