/* gemvbench — the GPU matmul kernels alone on the Llama-3.1-8B shapes: GB/s of weights read per
 * second against the device-to-device copy measured in the same run, per format (bf16, MLX 4-bit
 * group 64), token count (1, 2, 4, 8: the GEMV kernels; 64: the GEMM path) and kernel generation
 * (the default kernels against EXO_CUDA_GEMV=old, the per-16-rows blocks the persistent and
 * pipelined GEMVs replaced, with EXO_CUDA_QGEMM=0: at 9+ tokens of 4-bit, dequantizing to bf16
 * for cuBLAS instead of the tensor-core GEMM qgemm4).
 *
 *   gemvbench [--reps N] [--tokens 1,2,4,8,64] [--formats bf16,q4] [--against 'VAR=VALUE ...']
 *
 * --against sets the environment of the "old" backend (default 'EXO_CUDA_GEMV=old
 * EXO_CUDA_QGEMM=0'; e.g. 'EXO_CUDA_GEMV1=prev' for the one-token kernels before x in registers).
 *
 * Each case rotates over enough distinct matrices of its shape that the set is several times
 * the GPU's L2 (a repeat over one matrix would time the cache), issues them back to back, and
 * waits once at the end (a 4-byte download): the time is the GPU's, launch gaps included, as in
 * a recorded decode step. Weights are random (never zeros: METHOD.md). Refuses: running without
 * a CUDA build and GPU (says so, exit 2). */
#include "compute/backend.h"
#include "compute/device.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct shape {
    const char *name;
    int n;         /* matrices sharing x (one matmul_multi job) */
    int64_t rows[3];
    int64_t cols;
} shape;

static const shape shapes[] = {
    {"qkv 4096+1024+1024 x 4096", 3, {4096, 1024, 1024}, 4096},
    {"o_proj 4096 x 4096", 1, {4096}, 4096},
    {"gate+up 2 x 14336 x 4096", 2, {14336, 14336}, 4096},
    {"down 4096 x 14336", 1, {4096}, 14336},
    {"lm_head 128256 x 4096", 1, {128256}, 4096},
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* A random matrix (host memory, kept until exit: backends key their copies by host address). */
static int make_matrix(weight_matrix *w, int q4, int64_t rows, int64_t cols) {
    memset(w, 0, sizeof *w);
    w->rows = rows, w->cols = cols;
    size_t n = (size_t)(rows * cols);
    if (q4) {
        w->format = WEIGHT_MLX_AFFINE, w->bits = 4, w->group_size = 64, w->scale_dtype = DTYPE_BF16;
        uint32_t *q = malloc(n / 2);
        uint16_t *s = malloc(n / 64 * 2), *b = malloc(n / 64 * 2);
        if (!q || !s || !b) return -1;
        for (size_t i = 0; i < n / 8; i++) q[i] = rnd();
        for (size_t g = 0; g < n / 64; g++) {
            s[g] = bf16_of(0.001f + (float)(rnd() & 1023) * 1e-5f);
            b[g] = bf16_of(-0.01f - (float)(rnd() & 1023) * 1e-5f);
        }
        w->data = q, w->scales = s, w->biases = b;
    } else {
        w->format = WEIGHT_BF16;
        uint32_t *d = malloc(n * 2);
        if (!d) return -1;
        for (size_t i = 0; i < n / 2; i++) d[i] = rnd() & 0xbfffbfffu; /* modest, never NaN */
        w->data = d;
    }
    return 0;
}

static size_t matrix_bytes(const weight_matrix *w) {
    size_t n = (size_t)(w->rows * w->cols);
    return w->format == WEIGHT_MLX_AFFINE ? n / 2 + n / 64 * 4 : n * 2;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per job (the median of reps rounds, each round every matrix set once). */
static double time_case(compute_backend *b, weight_matrix (*sets)[3], int n_sets, const shape *s,
                        int64_t tokens, float *x, float **ys, int reps) {
    double times[64];
    float sink;
    if (reps > 64) reps = 64;
    for (int r = -1; r < reps; r++) { /* round -1 warms up (uploads, module load) */
        double t0 = now_s();
        for (int k = 0; k < n_sets; k++) {
            const weight_matrix *ws[3] = {&sets[k][0], &sets[k][1], &sets[k][2]};
            if (s->n > 1 && b->matmul_multi)
                b->matmul_multi(b, s->n, ws, x, ys, tokens);
            else
                for (int i = 0; i < s->n; i++) b->matmul(b, ws[i], x, ys[i], tokens);
        }
        b->download(b, &sink, ys[0], sizeof sink);
        if (r >= 0) times[r] = (now_s() - t0) / n_sets;
    }
    for (int i = 1; i < reps; i++) /* insertion sort: reps is small */
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            double t = times[j];
            times[j] = times[j - 1], times[j - 1] = t;
        }
    return times[reps / 2];
}

static int parse_list(const char *s, int64_t *out, int max) {
    int n = 0;
    while (s && *s && n < max) {
        out[n++] = strtoll(s, (char **)&s, 10);
        if (*s == ',') s++;
    }
    return n;
}

int main(int argc, char **argv) {
    int reps = 7;
    const char *against = "EXO_CUDA_GEMV=old EXO_CUDA_QGEMM=0";
    int64_t tokens[8] = {1, 2, 4, 8, 64};
    int n_tokens = 5, want_bf16 = 1, want_q4 = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) n_tokens = parse_list(argv[++i], tokens, 8);
        else if (!strcmp(argv[i], "--against") && i + 1 < argc)
            against = argv[++i];
        else if (!strcmp(argv[i], "--formats") && i + 1 < argc) {
            const char *f = argv[++i];
            want_bf16 = strstr(f, "bf16") != NULL, want_q4 = strstr(f, "q4") != NULL;
        } else {
            fprintf(stderr, "usage: gemvbench [--reps N] [--tokens 1,2,4,8,64] [--formats bf16,q4] [--against 'VAR=VALUE ...']\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    char err[256];
    compute_backend *fresh = compute_backend_open(COMPUTE_DEVICE_CUDA, 0, err, sizeof err);
    /* the "old" kernels: --against 'VAR=VALUE ...' (default: the per-16-rows GEMV, no qgemm4) */
    char spec[256], *save = NULL;
    snprintf(spec, sizeof spec, "%s", against);
    for (char *kv = strtok_r(spec, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            fprintf(stderr, "gemvbench: --against wants VAR=VALUE words, not '%s'\n", kv);
            return 2;
        }
        *eq = 0;
        setenv(kv, eq + 1, 1);
    }
    compute_backend *old = fresh ? compute_backend_open(COMPUTE_DEVICE_CUDA, 0, err, sizeof err) : NULL;
    snprintf(spec, sizeof spec, "%s", against);
    for (char *kv = strtok_r(spec, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        *strchr(kv, '=') = 0;
        unsetenv(kv);
    }
    if (!fresh || !old) {
        fprintf(stderr, "gemvbench: %s\n", err);
        return 2;
    }
    double copy = compute_gpu_copy_gbs((size_t)1 << 31, 5);
    printf("copy device to device: %.1f GB/s (read + written)\n", copy);
    printf("%-28s %-5s %6s %10s %9s %7s %9s %7s\n", "shape", "fmt", "tokens", "MB/job", "new us",
           "new %", "old us", "old %");
    size_t x_floats = (size_t)64 * 14336;
    float *x = fresh->alloc(fresh, x_floats * 4), *xo = old->alloc(old, x_floats * 4);
    float *host_x = malloc(x_floats * 4);
    for (size_t i = 0; i < x_floats; i++) host_x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    fresh->upload(fresh, x, host_x, x_floats * 4);
    old->upload(old, xo, host_x, x_floats * 4);
    for (int q4 = 0; q4 < 2; q4++) {
        if ((q4 && !want_q4) || (!q4 && !want_bf16)) continue;
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            const shape *s = &shapes[si];
            size_t set_bytes = 0;
            weight_matrix probe[3];
            for (int i = 0; i < s->n; i++) {
                probe[i] = (weight_matrix){.format = q4 ? WEIGHT_MLX_AFFINE : WEIGHT_BF16,
                                           .rows = s->rows[i], .cols = s->cols};
                set_bytes += matrix_bytes(&probe[i]);
            }
            int n_sets = (int)((size_t)400 * 1000 * 1000 / set_bytes); /* ~400 MB: 6x the L2 */
            if (n_sets < 2) n_sets = 2;
            if (n_sets > 16) n_sets = 16;
            weight_matrix (*sets)[3] = calloc((size_t)n_sets, sizeof *sets);
            for (int k = 0; k < n_sets; k++)
                for (int i = 0; i < s->n; i++)
                    if (make_matrix(&sets[k][i], q4, s->rows[i], s->cols)) {
                        fprintf(stderr, "gemvbench: out of host memory\n");
                        return 1;
                    }
            float *ys[3], *yso[3];
            for (int i = 0; i < s->n; i++) {
                ys[i] = fresh->alloc(fresh, (size_t)(64 * s->rows[i]) * 4);
                yso[i] = old->alloc(old, (size_t)(64 * s->rows[i]) * 4);
            }
            for (int ti = 0; ti < n_tokens; ti++) {
                int64_t n = tokens[ti];
                if (n < 1 || n > 64) continue;
                double tn = time_case(fresh, sets, n_sets, s, n, x, ys, reps);
                double to = time_case(old, sets, n_sets, s, n, xo, yso, reps);
                double mb = (double)set_bytes / 1e6;
                printf("%-28s %-5s %6d %10.1f %9.1f %6.1f%% %9.1f %6.1f%%\n", s->name,
                       q4 ? "q4" : "bf16", (int)n, mb, tn * 1e6, 100 * mb * 1e6 / tn / 1e9 / copy * 1,
                       to * 1e6, 100 * mb * 1e6 / to / 1e9 / copy);
                fflush(stdout);
            }
            if (fresh->status && fresh->status(fresh, err, sizeof err)) printf("  error: %s\n", err);
            if (old->status && old->status(old, err, sizeof err)) printf("  error (old): %s\n", err);
            for (int i = 0; i < s->n; i++) {
                fresh->free(fresh, ys[i]);
                old->free(old, yso[i]);
            }
            /* the GPU copies stay with the backends until exit; host copies must outlive them */
        }
    }
    fresh->destroy(fresh);
    old->destroy(old);
    return 0;
}
