/* cuda — the CUDA compute_backend's door inside compute/ (device.c is its only caller; every
 * other module goes through compute/device.h, which also exists in builds without CUDA).
 *
 * The backend keeps every weight matrix in GPU memory (copied once: load_weight at engine open,
 * or on first use for a forward built without an engine), activations and the paged KV cache in
 * GPU memory, and runs every op as kernels on one stream: nothing waits for the GPU until a
 * download (the logits, or hidden states for the next pipeline stage). Errors of asynchronous
 * work stick to the backend and are reported by its status op after that download.
 *
 * Refuses: weights in a layout other than MLX order (the CPU's interleaved 4-bit blocks), head
 * dimensions over 256 in attention (reported by status). */
#ifndef EXO_COMPUTE_CUDA_H
#define EXO_COMPUTE_CUDA_H

#include "compute/backend.h"
#include "compute/device.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GPUs the CUDA runtime sees (0 when none, or no driver). */
int cuda_gpu_count(void);
/* Fills out for GPU `index`; returns 0, or -1. */
int cuda_gpu_get(int index, compute_gpu *out);
/* The backend on GPU `device`; NULL with err when there is no such GPU or it cannot start. */
compute_backend *compute_backend_cuda(int device, char *err, size_t errlen);
/* Ceilings for benchmarks, measured on GPU `device`: a device-to-device copy of `bytes`
 * (GB/s counting bytes read plus bytes written, the best of reps), and a bf16 GEMM of n^3 through
 * cuBLAS on random data (GFLOP/s, the best of reps). 0 when it cannot run. */
double cuda_probe_copy_gbs(int device, size_t bytes, int reps);
double cuda_probe_gemm_bf16_gflops(int device, int n, int reps);

#ifdef __cplusplus
}
#endif

#endif
