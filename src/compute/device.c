/* Backend choice and the GPU door (see device.h). The only file outside compute/cuda that knows
 * whether CUDA was built in. */
#include "compute/device.h"

#ifdef EXO_CUDA
#include "compute/cuda/cuda.h"
#endif

#include <stdio.h>
#include <string.h>

int compute_device_parse(const char *name, compute_device *out, char *err, size_t errlen) {
    if (!name || !*name || !strcmp(name, "auto")) *out = COMPUTE_DEVICE_AUTO;
    else if (!strcmp(name, "cpu")) *out = COMPUTE_DEVICE_CPU;
    else if (!strcmp(name, "cuda") || !strcmp(name, "gpu")) *out = COMPUTE_DEVICE_CUDA;
    else {
        snprintf(err, errlen, "device '%.32s' is not one of cpu, cuda, auto", name);
        return -1;
    }
    return 0;
}

static const char no_cuda_build[] =
    "this exo was built without the CUDA backend (build it with `make CUDA=1` on a machine with "
    "the CUDA toolkit)";

int compute_device_check(const char *name, compute_device *out, char *err, size_t errlen) {
    if (compute_device_parse(name, out, err, errlen) != 0) return -1;
    if (*out != COMPUTE_DEVICE_CUDA) return 0;
    if (!compute_cuda_built()) {
        snprintf(err, errlen, "--device cuda: %s", no_cuda_build);
        return -1;
    }
    if (compute_gpu_count() == 0) {
        snprintf(err, errlen, "--device cuda: no CUDA GPU is available (no NVIDIA driver, or no GPU)");
        return -1;
    }
    return 0;
}

const char *compute_device_name(compute_device d) {
    switch (d) {
    case COMPUTE_DEVICE_CPU: return "cpu";
    case COMPUTE_DEVICE_CUDA: return "cuda";
    default: return "auto";
    }
}

int compute_cuda_built(void) {
#ifdef EXO_CUDA
    return 1;
#else
    return 0;
#endif
}

int compute_gpu_count(void) {
#ifdef EXO_CUDA
    return cuda_gpu_count();
#else
    return 0;
#endif
}

int compute_gpu_get(int index, compute_gpu *out) {
#ifdef EXO_CUDA
    return cuda_gpu_get(index, out);
#else
    (void)index, (void)out;
    return -1;
#endif
}

compute_device compute_device_resolve(compute_device d) {
    if (d != COMPUTE_DEVICE_AUTO) return d;
    return compute_gpu_count() > 0 ? COMPUTE_DEVICE_CUDA : COMPUTE_DEVICE_CPU;
}

compute_backend *compute_backend_open(compute_device d, int n_threads, char *err, size_t errlen) {
    d = compute_device_resolve(d);
    if (d == COMPUTE_DEVICE_CPU) {
        compute_backend *b = compute_backend_cpu(n_threads);
        if (!b) snprintf(err, errlen, "out of memory starting the CPU backend");
        return b;
    }
#ifdef EXO_CUDA
    return compute_backend_cuda(0, err, errlen);
#else
    snprintf(err, errlen, "--device cuda: %s", no_cuda_build);
    return NULL;
#endif
}

double compute_gpu_copy_gbs(size_t bytes, int reps) {
#ifdef EXO_CUDA
    return cuda_gpu_count() > 0 ? cuda_probe_copy_gbs(0, bytes, reps) : 0;
#else
    (void)bytes, (void)reps;
    return 0;
#endif
}

double compute_gpu_gemm_bf16_gflops(int n, int reps) {
#ifdef EXO_CUDA
    return cuda_gpu_count() > 0 ? cuda_probe_gemm_bf16_gflops(0, n, reps) : 0;
#else
    (void)n, (void)reps;
    return 0;
#endif
}
