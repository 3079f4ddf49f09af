/* Private to compute/cuda: the backend's state, device-side weight descriptors and the entry
 * points each .cu file gives the others. Everything here runs on the backend's one stream. */
#ifndef EXO_COMPUTE_CUDA_INTERNAL_CUH
#define EXO_COMPUTE_CUDA_INTERNAL_CUH

#include "compute/backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* Which GEMV kernel reads a matrix: 16-byte loads of a known element type, or the per-element
 * path for everything else (MLX 2/3/5/6-bit, rows not a multiple of 16 bytes). */
enum gemv_kind { GEMV_F32 = 0, GEMV_F16, GEMV_BF16, GEMV_Q4, GEMV_Q8, GEMV_GENERIC };

/* A weight matrix in GPU memory (MLX order), by value in kernel arguments. */
struct dev_matrix {
    const void *data, *scales, *biases;
    int64_t rows, cols;
    int format;      /* weight_format */
    int bits, group_size;
    int group_shift; /* log2(group_size) (MLX group sizes are powers of two) */
    int scale_dtype; /* dtype of scales and biases */
    int kind;        /* gemv_kind */
    const uint32_t *sb; /* 4-bit group 64, 16-bit scales: [rows][groups] (scale | bias << 16), the
                         * one-token GEMV's one 4-byte load per group; else NULL */
};

/* An MoE layer's experts as device descriptor tables ([n_experts] each), built on first use. */
struct dev_experts {
    const void *key;   /* host: ex->gate */
    const void *first; /* host: ex->gate[0].data, n_experts: the key still describes ex */
    int n;
    dev_matrix *gate, *up, *down; /* device arrays */
    int kind_gate_up, kind_down;  /* the one kind of every expert, or GEMV_GENERIC */
};

struct weight_entry {
    const void *host; /* the view's host data pointer (the key) */
    dev_matrix m;
};

struct cuda_ctx {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_workspace; /* cuBLAS's workspace (cublasSetWorkspace): graphs can record GEMMs */
    int exact;             /* EXO_CUDA_MATMUL=exact: every matmul through the f32 GEMV kernels */
    int gemv_old;          /* EXO_CUDA_GEMV=old: the per-16-rows GEMV blocks (for A/B timing) */
    int gemv1_prev;        /* EXO_CUDA_GEMV1=prev: one-token 4-bit and bf16 GEMVs on the kernels
                            * before the x-in-registers one (4-bit: the persistent kernel; bf16:
                            * the per-16-rows blocks), for A/B */
    int pdl;               /* programmatic dependent launch of the decode chain's kernels
                            * (EXO_CUDA_PDL=0: plain launches, A/B) */
    int qgemm;             /* 4-bit batches through qgemm4 (EXO_CUDA_QGEMM=0: a bf16 copy, cuBLAS) */
    int sm_count;          /* multiprocessors: the persistent kernels' grid */
    char error[256];       /* first failure, reported by status */
    /* weights: hash of host pointer -> entry; bytes from a bump allocator of big chunks */
    weight_entry *entries;
    size_t n_entries, cap_entries;
    int64_t *slots; /* open addressing into entries, -1 empty */
    size_t slot_mask;
    void **chunks;
    size_t n_chunks, cap_chunks;
    char *chunk_ptr;
    size_t chunk_left;
    size_t weight_bytes;
    dev_experts *experts;
    size_t n_experts_sets;
    /* scratch, grown on demand (GPU memory) */
    void *scratch[16]; /* [SCRATCH_COUNT], below */
    size_t scratch_bytes[16];
    /* recorded decode steps (CUDA graphs), see step_begin in backend_cuda.cu */
    struct step_graph {
        uint64_t key;
        int seen, disabled;
        unsigned epoch;
        cudaGraphExec_t exec;
    } graphs[64];
    int n_graphs;
    int capturing;      /* index into graphs, or -1 */
    int capture_broken; /* an op could not be recorded: run the step again unrecorded */
    unsigned epoch;     /* bumped when scratch moves: graphs recorded before hold stale pointers */
    int no_graphs;      /* EXO_CUDA_GRAPHS=0 */
};

enum {
    SCRATCH_GEMM_X = 0,
    SCRATCH_GEMM_W,
    SCRATCH_ATTENTION,
    SCRATCH_MOE,
    SCRATCH_ATT_GEMM,
    SCRATCH_SAMPLE,       /* the sampler's parameters in, results out */
    SCRATCH_SAMPLE_PROBS, /* [rows][vocab] candidate probabilities of non-greedy rows */
    SCRATCH_QGEMM,        /* the 4-bit GEMM's partial sums of split k */
    SCRATCH_QGEMM_X,      /* the 4-bit GEMM's x: bf16 in its column order */
    SCRATCH_ATT_DONE,     /* split attention's per-(token, KV head) counts of finished blocks:
                           * zeroed when allocated, each merge sets its count back to 0 */
    SCRATCH_COUNT
};

/* Records the first error (sticky) from a CUDA or cuBLAS call site. */
void cuda_fail(cuda_ctx *c, const char *what, const char *detail);
#define CUDA_OK(c, call)                                                              \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) cuda_fail((c), #call, cudaGetErrorString(e_));          \
    } while (0)
/* After a kernel launch: a bad configuration shows up at once. */
#define CUDA_LAUNCHED(c, name)                                                        \
    do {                                                                              \
        cudaError_t e_ = cudaGetLastError();                                          \
        if (e_ != cudaSuccess) cuda_fail((c), name, cudaGetErrorString(e_));           \
    } while (0)

/* GPU scratch buffer `which` of at least `bytes` (grown, never shrunk); NULL on failure. */
void *cuda_scratch(cuda_ctx *c, int which, size_t bytes);
/* The device copy of a view (uploaded now if it was not); NULL with the error recorded. */
const dev_matrix *cuda_weight(cuda_ctx *c, const weight_matrix *w);
/* Device descriptor tables of an MoE layer's experts; NULL with the error recorded. */
const dev_experts *cuda_experts(cuda_ctx *c, const moe_experts *ex);

/* silu(g) * u, the one formula of the silu_mul op and of the GEMV that fuses it. */
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* The rotary cos and sin of position pos for a pair of inverse frequency inv_freq, scaled by
 * attn_factor: cos/sin of the float32 angle in double, as the CPU reference. */
__device__ __forceinline__ void rope_cos_sin(int pos, float inv_freq, float attn_factor, float *cs,
                                             float *sn) {
    float angle = (float)pos * inv_freq;
    *cs = (float)cos((double)angle) * attn_factor;
    *sn = (float)sin((double)angle) * attn_factor;
}

/* backend_cuda.cu */
void cuda_silu_mul_launch(cuda_ctx *c, float *g, const float *u, int64_t n);
void cuda_rmsnorm_launch(cuda_ctx *c, const float *x, const float *w, float *y, int64_t rows,
                         int64_t dim, float eps);

/* matmul_cuda.cu */
void cuda_matmul(cuda_ctx *c, const weight_matrix *w, const float *x, float *y, int64_t n);
/* ys[i] = W_i rmsnorm(x) (backend.h: norm_matmul); xn is scratch. */
void cuda_norm_matmul(cuda_ctx *c, const float *x, const float *norm_w, float eps, float *xn, int n,
                      const weight_matrix *const *w, float *const *ys, int64_t n_tokens);
/* y = W x' (accumulate: y += W x'), x' = silu(x) * x_up when x_up (x may be overwritten). */
void cuda_matmul_fused(cuda_ctx *c, const weight_matrix *w, float *x, const float *x_up, float *y,
                       int64_t n, int accumulate);
void cuda_matmul_multi(cuda_ctx *c, int n, const weight_matrix *const *w, const float *x,
                       float *const *ys, int64_t n_tokens);
/* y[j] = table[ids[j]] x[j / x_div] for j < n_jobs (one token each): MoE experts. */
void cuda_gemv_experts(cuda_ctx *c, const dev_matrix *table, int kind, int64_t rows, int64_t cols,
                       const int32_t *ids, int64_t n_jobs, int x_div, const float *x, float *y);
/* out[t] = row ids[t] of w, dequantized to f32. */
void cuda_embed(cuda_ctx *c, const dev_matrix *w, const int32_t *ids, int64_t n, float *out);
/* cuBLAS bf16 GEMM rate on n^3 random operands (the prefill ceiling), best of reps. */
double cuda_gemm_bf16_gflops(cuda_ctx *c, int n, int reps);
/* Fills bytes (a multiple of 4) of GPU memory with bf16 values of modest size, never NaN. */
void cuda_fill_random(cuda_ctx *c, void *p, size_t bytes, uint32_t seed);

/* linear_attention_cuda.cu: the hybrid models' ops (conv1d_causal, gated_delta_rule,
 * rmsnorm_gated, mul_sigmoid, mul_sigmoid_rows, copy) set on b. */
void cuda_bind_linear_attention(compute_backend *b);

/* sample_cuda.cu: the backend's sample op (backend.h); waits for the results. */
int cuda_sample(cuda_ctx *c, float *logits, int64_t n_rows, int64_t vocab,
                const sample_params *params, sample_result *out);

/* attention_cuda.cu */
void cuda_attention(cuda_ctx *c, const float *q, const kv_layer *kv, const attention_batch *ab,
                    float *out);
void cuda_kv_write(cuda_ctx *c, const kv_layer *kv, const float *k, const float *v,
                   const int32_t *slots, int64_t n, int64_t kv_dim);
void cuda_rope_kv_write(cuda_ctx *c, float *q, float *k, const float *v, const int32_t *pos,
                        int64_t n, int n_heads, int n_kv_heads, int head_dim, int rot_dims,
                        const float *inv_freq, float attn_factor, const kv_layer *kv,
                        const int32_t *slots);

/* Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may start while the
 * kernel before it on the stream is still running -- its blocks are scheduled as that kernel's
 * blocks leave -- and must call pdl_wait() before it reads anything that kernel wrote or writes
 * anything at all (the wait returns once the previous grid has finished and its memory is
 * visible). Work that reads only weights goes before the wait: a decode step is a chain of ~200
 * short kernels, and each one's launch latency and first loads then overlap the tail of the one
 * before. pdl_trigger() lets the next kernel's blocks be scheduled before this grid ends: called
 * once a block has issued its last loads, not at its start (kernels triggering at their start let
 * a chain of several grids sit resident and waiting: the suspected cause of bf16 b1 falling from
 * 224 to 193 tok/s with them, H200, while 4-bit gained 6%); a
 * kernel that never calls it triggers as it exits. Without the launch attribute both are no-ops. */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

template <typename... Params, typename... Args>
static inline void launch_pdl(cuda_ctx *c, void (*kernel)(Params...), dim3 grid, dim3 block,
                              size_t smem, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = c->pdl;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e != cudaSuccess) cuda_fail(c, "cudaLaunchKernelEx", cudaGetErrorString(e));
}

/* Launch shape helpers. */
static inline unsigned cuda_blocks(int64_t n, int per_block) {
    return (unsigned)((n + per_block - 1) / per_block);
}

#endif
