/* libopenblas.so.0 for device payloads that cannot carry OpenBLAS (scripts/carry-e2e-device.sh):
 * the three functions exo links from it (cblas_sgemm, openblas_set_num_threads,
 * openblas_get_corename), with a plain triple-loop SGEMM in float32. OpenBLAS and the Fortran
 * runtime it needs are 5 MB compressed, a fifth of what a payload may hold; a run on
 * `--device cuda` multiplies on the GPU, so this SGEMM only serves the CPU paths that remain
 * (a tiny model's, when a test asks for the CPU), correctly and slowly. Never part of a build
 * that ships: the Makefile does not know it. */
#include <stddef.h>

enum shim_order { SHIM_ROW_MAJOR = 101, SHIM_COL_MAJOR = 102 };
enum shim_transpose { SHIM_NO_TRANS = 111, SHIM_TRANS = 112, SHIM_CONJ_TRANS = 113 };

/* Element (row, col) of op(M), M stored in `order` with leading dimension ld. */
static float element(const float *m, int ld, int row, int col, int transposed, int order) {
    if (transposed) {
        int t = row;
        row = col;
        col = t;
    }
    return order == SHIM_ROW_MAJOR ? m[(size_t)row * ld + col] : m[(size_t)col * ld + row];
}

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* C = alpha * op(A) op(B) + beta * C; with beta 0, C is written without being read (BLAS). */
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    int ta = trans_a != SHIM_NO_TRANS, tb = trans_b != SHIM_NO_TRANS;
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            float sum = 0;
            if (order == SHIM_ROW_MAJOR && !ta && tb) { /* exo's x W^T: both rows contiguous */
                const float *ar = a + (size_t)i * lda, *br = b + (size_t)j * ldb;
                for (int p = 0; p < k; p++) sum += ar[p] * br[p];
            } else {
                for (int p = 0; p < k; p++)
                    sum += element(a, lda, i, p, ta, order) * element(b, ldb, p, j, tb, order);
            }
            float *out = order == SHIM_ROW_MAJOR ? &c[(size_t)i * ldc + j] : &c[(size_t)j * ldc + i];
            *out = alpha * sum + (beta == 0 ? 0 : beta * *out);
        }
    }
}

void openblas_set_num_threads(int n);
void openblas_set_num_threads(int n) { (void)n; }

char *openblas_get_corename(void);
char *openblas_get_corename(void) {
    static char name[] = "shim (no OpenBLAS in this payload: plain SGEMM)";
    return name;
}
