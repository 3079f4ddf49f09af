/* cpu — the CPU backend's kernels. Each op has a plain C reference (the ground truth that SIMD and
 * CUDA paths are tested against) and fast paths chosen at run time by CPUID; callers use the
 * un-suffixed name and get the fastest path this machine supports. Work is split over a
 * persistent thread pool (never a fork/join of new threads per op). */
#ifndef EXO_COMPUTE_CPU_H
#define EXO_COMPUTE_CPU_H

#include "base/threadpool.h"
#include "model/weight_types.h"

#include <stdint.h>

/* Threads used by CPU kernels. Default: the CPUs this process may run on (its affinity mask:
 * taskset, cgroup cpusets), and on a CPU with cores of two speeds only the fast ones, to which the
 * pool's threads are then pinned (base/cpus.h). Call before first use. */
void cpu_set_threads(int n);
int cpu_threads(void);
/* The persistent pool every CPU op splits its work over (cpu_threads() threads, created on first
 * use, lives until exit). Ops in arch/ and infer/ use it too: one pool, never two competing. */
threadpool *cpu_thread_pool(void);
/* "avx512", "avx2", "neon" or "generic": the best SIMD level detected and used. */
const char *cpu_simd_level(void);

/* y[t][r] = sum_c x[t][c] * W[r][c] for t < n_tokens. x: [n_tokens][w->cols], y: [n_tokens][w->rows].
 * Every weight format of model/weight_types.h. */
void cpu_matmul(const weight_matrix *w, const float *x, float *y, int64_t n_tokens);
/* The same for n matrices with the same number of columns that read the same x (q/k/v,
 * gate/up): ys[i] = x W_i^T. At decode sizes they run as one parallel job (one barrier, one
 * contiguous stream of weight bytes per thread). */
#define CPU_MATMUL_MULTI_MAX 4
void cpu_matmul_multi(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                      int64_t n_tokens);
/* The 16-row interleaved layout of 4- and 8-bit MLX matrices (WEIGHT_LAYOUT_MLX_ROWS16,
 * model/weight_types.h; layout.c).
 * cpu_weight_prefers_rows16: 1 when w is a 4-bit MLX matrix (8-bit: and its rows a multiple of
 * 16) in MLX order with columns a multiple of 128 and at least 16 rows, the level in use reads
 * that width interleaved (4-bit: AVX-512, AVX2; 8-bit: AVX-512), and EXO_Q4_LAYOUT (8-bit:
 * EXO_Q8_LAYOUT) is not `mlx`.
 * cpu_weight_repack_rows16: rewrites w's data, scales and biases in place (the memory behind the
 * view must be writable and owned by the caller, and no other view may read it in MLX order) and
 * sets w->layout. Returns 0, or -1 (not such a matrix, or out of memory) with w unchanged. */
int cpu_weight_prefers_rows16(const weight_matrix *w);
int cpu_weight_repack_rows16(weight_matrix *w);
void cpu_matmul_reference(const weight_matrix *w, const float *x, float *y, int64_t n_tokens);

#endif
