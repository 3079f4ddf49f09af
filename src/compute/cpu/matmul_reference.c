/* Reference matmul: dequantize one weight row at a time and dot it with every token.
 * Slow and obviously right; SIMD paths are tested against it. */
#include "compute/cpu/cpu.h"

#include <stdlib.h>

void cpu_matmul_reference(const weight_matrix *w, const float *x, float *y, int64_t n_tokens) {
    float *row = malloc((size_t)w->cols * sizeof *row);
    if (!row) abort();
    for (int64_t r = 0; r < w->rows; r++) {
        weight_matrix_row_to_f32(w, r, row);
        for (int64_t t = 0; t < n_tokens; t++) {
            const float *xt = x + t * w->cols;
            double acc = 0;
            for (int64_t c = 0; c < w->cols; c++) acc += (double)row[c] * xt[c];
            y[t * w->rows + r] = (float)acc;
        }
    }
    free(row);
}
