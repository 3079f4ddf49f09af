/* device — which compute backend runs the model: `--device cpu|cuda|auto`, the GPUs this
 * binary can use, and the ceilings a GPU benchmark is measured against. The one door to the
 * CUDA backend: it exists in every build, and in a build without CUDA it says so (no GPUs,
 * `cuda` refused with a message naming the build flag).
 *
 * Refuses: picking among several GPUs (GPU 0 serves; one process per GPU is the plan). */
#ifndef EXO_COMPUTE_DEVICE_H
#define EXO_COMPUTE_DEVICE_H

#include "compute/backend.h"

#include <stddef.h>

#ifdef __cplusplus /* the CUDA backend (.cu) includes this */
extern "C" {
#endif

typedef enum compute_device {
    COMPUTE_DEVICE_AUTO = 0, /* the GPU when this binary has CUDA and a GPU is present, else CPU */
    COMPUTE_DEVICE_CPU,
    COMPUTE_DEVICE_CUDA,
} compute_device;

/* "cpu", "cuda" or "auto" (NULL or "" = auto). Returns 0, or -1 with err. */
int compute_device_parse(const char *name, compute_device *out, char *err, size_t errlen);
const char *compute_device_name(compute_device d);
/* compute_device_parse, then for `cuda` also that this binary has CUDA and a GPU is present: the
 * check a command line runs before it starts anything. Returns 0, or -1 with err. */
int compute_device_check(const char *name, compute_device *out, char *err, size_t errlen);

/* 1 when this binary was built with the CUDA backend (make CUDA=1). */
int compute_cuda_built(void);

typedef struct compute_gpu {
    char name[96];
    size_t memory_total, memory_free; /* bytes */
    int multiprocessors;
    int compute_major, compute_minor;
} compute_gpu;

/* GPUs the CUDA backend can use: 0 in a build without CUDA, or with no GPU or driver. */
int compute_gpu_count(void);
int compute_gpu_get(int index, compute_gpu *out);

/* The device `auto` resolves to on this machine. */
compute_device compute_device_resolve(compute_device d);

/* The backend for d (auto resolved). NULL with err: `cuda` in a build without CUDA or on a
 * machine without a GPU, or the GPU cannot start. n_threads: CPU threads (0 = all cores). */
compute_backend *compute_backend_open(compute_device d, int n_threads, char *err, size_t errlen);

/* GPU benchmark ceilings on GPU 0 (0 without CUDA or GPU): device-to-device copy bandwidth in
 * GB/s (bytes read plus bytes written, best of reps) and the cuBLAS bf16 GEMM rate on n^3
 * random operands in GFLOP/s (best of reps). */
double compute_gpu_copy_gbs(size_t bytes, int reps);
double compute_gpu_gemm_bf16_gflops(int n, int reps);

#ifdef __cplusplus
}
#endif

#endif
