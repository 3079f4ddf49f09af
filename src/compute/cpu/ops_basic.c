/* Reference elementwise and row ops of the CPU backend. */
#include "compute/cpu/ops.h"
#include "compute/ops_shared.h"

#include <math.h>
#include <string.h>

void cpu_op_embed(const weight_matrix *table, const int32_t *ids, int64_t n_tokens, float *out) {
    for (int64_t t = 0; t < n_tokens; t++)
        weight_matrix_row_to_f32(table, ids[t], out + t * table->cols);
}

void cpu_op_rmsnorm(const float *x, const float *weight, float *y, int64_t begin, int64_t end,
                    int64_t dim, float eps) {
    for (int64_t r = begin; r < end; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        double ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        for (int64_t i = 0; i < dim; i++) yr[i] = xr[i] * inv * weight[i];
    }
}

void cpu_op_add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

void cpu_op_add_row(float *x, const float *row, int64_t rows, int64_t dim) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < dim; i++) x[r * dim + i] += row[i];
}

void cpu_op_silu_mul(float *gate, const float *up, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void cpu_op_clamped_swiglu(float *gate, const float *up, const float *gate_bias, const float *up_bias,
                           int64_t rows, int64_t inter, float limit, float alpha) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < inter; i++) {
            float g = gate[r * inter + i] + (gate_bias ? gate_bias[i] : 0.0f);
            float u = up[r * inter + i] + (up_bias ? up_bias[i] : 0.0f);
            g = g > limit ? limit : g;
            u = u > limit ? limit : u < -limit ? -limit : u;
            gate[r * inter + i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
        }
}

void cpu_op_rope(float *x, const int32_t *positions, int64_t begin, int64_t end, int n_heads,
                 int head_dim, int rot_dims, const float *inv_freq, float attn_factor) {
    int half = rot_dims / 2;
    for (int64_t t = begin; t < end; t++) {
        float pos = (float)positions[t];
        for (int i = 0; i < half; i++) {
            float angle = pos * inv_freq[i]; /* float32 product, as transformers computes it */
            float c = (float)cos((double)angle) * attn_factor;
            float s = (float)sin((double)angle) * attn_factor;
            ops_rope_rotate_pair(x + t * n_heads * head_dim, n_heads, head_dim, i, half, c, s);
        }
    }
}

void cpu_op_gather_rows(const float *x, const int32_t *rows, int64_t n, int64_t dim, float *out) {
    for (int64_t i = 0; i < n; i++)
        memcpy(out + i * dim, x + (int64_t)rows[i] * dim, (size_t)dim * sizeof *out);
}
