/* Checks scripts/openblas-shim.c against the real OpenBLAS (linked) for every order, transpose and
 * beta case on random matrices; scripts/carry-e2e-device.sh runs it before it carries the shim.
 *   openblas-shim-check PATH/libopenblas.so.0   exit 0 when every element agrees to 1e-5 */
#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);

int main(int argc, char **argv) {
    void *shim = argc == 2 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
    sgemm_fn shim_sgemm = shim ? (sgemm_fn)dlsym(shim, "cblas_sgemm") : NULL;
    if (!shim_sgemm) {
        fprintf(stderr, "usage: openblas-shim-check PATH/libopenblas.so.0 (%s)\n", dlerror());
        return 2;
    }
    enum { M = 5, N = 7, K = 9 };
    float a[M * K], b[K * N], want[M * N], got[M * N];
    int mismatches = 0;
    for (int order = CblasRowMajor; order <= CblasColMajor; order++)
        for (int ta = CblasNoTrans; ta <= CblasTrans; ta++)
            for (int tb = CblasNoTrans; tb <= CblasTrans; tb++)
                for (int zero_beta = 0; zero_beta < 2; zero_beta++) {
                    for (int i = 0; i < M * K; i++) a[i] = rand() / (float)RAND_MAX - 0.5f;
                    for (int i = 0; i < K * N; i++) b[i] = rand() / (float)RAND_MAX - 0.5f;
                    for (int i = 0; i < M * N; i++) want[i] = got[i] = rand() / (float)RAND_MAX;
                    int rows_a = ta == CblasNoTrans ? M : K, cols_a = ta == CblasNoTrans ? K : M;
                    int rows_b = tb == CblasNoTrans ? K : N, cols_b = tb == CblasNoTrans ? N : K;
                    int lda = order == CblasRowMajor ? cols_a : rows_a;
                    int ldb = order == CblasRowMajor ? cols_b : rows_b;
                    int ldc = order == CblasRowMajor ? N : M;
                    float beta = zero_beta ? 0.0f : 0.7f;
                    cblas_sgemm(order, ta, tb, M, N, K, 1.3f, a, lda, b, ldb, beta, want, ldc);
                    shim_sgemm(order, ta, tb, M, N, K, 1.3f, a, lda, b, ldb, beta, got, ldc);
                    for (int i = 0; i < M * N; i++) mismatches += fabsf(want[i] - got[i]) > 1e-5f;
                }
    printf("openblas shim: %d of %d elements differ from OpenBLAS\n", mismatches, 16 * M * N);
    return mismatches != 0;
}
