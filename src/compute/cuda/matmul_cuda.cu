/* Matmuls on the GPU: y[t][r] = sum_c x[t][c] * W[r][c].
 *
 * Decode (up to 8 tokens, or every size with EXO_CUDA_MATMUL=exact): GEMV kernels that stream
 * the weights once in 16-byte loads, dequantizing in registers, with float32 activations and
 * float32 accumulation -- the CPU reference's arithmetic up to summation order. A warp owns 4
 * rows; its lanes stride over the rows' 16-byte chunks, loading 2-4 chunks of each row before
 * using any (8-16 independent loads in flight per lane), and every chunk of x a lane reads serves
 * the 4 rows. No shared memory, no barriers: blocks of 4 warps only group launches. MLX weights
 * are dequantized as scale * sum(q x) + bias * sum(x) per chunk (a chunk never crosses a group).
 *
 * Prefill and batches (more than 8 tokens): x rounded to bf16 (f16 for f16 weights), MLX weights
 * dequantized to a bf16 copy, one cuBLAS GEMM with float32 accumulation; f32 weights take
 * SGEMM. Rounding x to bf16 costs ~2^-9 relative per product: the tolerance the tests state. */
#include "compute/cuda/cuda_internal.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdio.h>

#define GEMV_THREADS 128 /* 4 warps, each its own GEMV_ROWS rows */
#define GEMV_ROWS 4
#define GEMV_BLOCK_ROWS (GEMV_THREADS / 32 * GEMV_ROWS)
#define GEMV_MAX_TOKENS 8

template <int KIND> struct chunk_values;
template <> struct chunk_values<GEMV_F32> { static const int n = 4; };
template <> struct chunk_values<GEMV_F16> { static const int n = 8; };
template <> struct chunk_values<GEMV_BF16> { static const int n = 8; };
template <> struct chunk_values<GEMV_Q4> { static const int n = 32; };
template <> struct chunk_values<GEMV_Q8> { static const int n = 16; };
template <> struct chunk_values<GEMV_GENERIC> { static const int n = 4; }; /* unused */

__device__ __forceinline__ float scale_value(const void *p, int64_t i, int dt) {
    if (dt == DTYPE_BF16) return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
    if (dt == DTYPE_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

/* Element (r, c) of any matrix, dequantized: the per-element path (embedding rows, the generic
 * GEMV, dequantizing for the GEMM). */
__device__ __forceinline__ float matrix_value(const dev_matrix &w, int64_t r, int64_t c) {
    switch (w.format) {
    case WEIGHT_F32: return ((const float *)w.data)[r * w.cols + c];
    case WEIGHT_F16: return __half2float(((const __half *)w.data)[r * w.cols + c]);
    case WEIGHT_BF16:
        return __uint_as_float((uint32_t)((const uint16_t *)w.data)[r * w.cols + c] << 16);
    default: {
        int bits = w.bits;
        const uint32_t *q = (const uint32_t *)w.data + r * (w.cols * bits / 32);
        uint64_t bit = (uint64_t)c * (uint64_t)bits;
        int64_t word = (int64_t)(bit >> 5);
        uint32_t off = (uint32_t)(bit & 31);
        uint64_t v = q[word] >> off;
        if (off + (uint32_t)bits > 32) v |= (uint64_t)q[word + 1] << (32 - off);
        uint32_t qv = (uint32_t)v & ((1u << bits) - 1u);
        int64_t g = r * (w.cols / w.group_size) + c / w.group_size;
        return scale_value(w.scales, g, w.scale_dtype) * (float)qv +
               scale_value(w.biases, g, w.scale_dtype);
    }
    }
}

/* A small unsigned integer as float, exactly: 2^23 + q reinterpreted, minus 2^23 (full-rate
 * float ops instead of the quarter-rate integer conversion). */
__device__ __forceinline__ float small_uint_to_float(uint32_t q) {
    return __uint_as_float(0x4b000000u | q) - 8388608.0f;
}

/* sum over the chunk's values of value_i * x_i: dense weights as they are, quantized ones as
 * their integer codes (the caller applies scale and bias). */
template <int KIND>
__device__ __forceinline__ float chunk_dot(const uint4 &w, const float *xv) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    float s = 0;
    if (KIND == GEMV_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) s = fmaf(__uint_as_float(u[i]), xv[i], s);
    } else if (KIND == GEMV_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s = fmaf(__uint_as_float(u[i] << 16), xv[2 * i], s);
            s = fmaf(__uint_as_float(u[i] & 0xffff0000u), xv[2 * i + 1], s);
        }
    } else if (KIND == GEMV_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h = *reinterpret_cast<const __half2 *>(&u[i]);
            float2 f = __half22float2(h);
            s = fmaf(f.x, xv[2 * i], s);
            s = fmaf(f.y, xv[2 * i + 1], s);
        }
    } else if (KIND == GEMV_Q4) {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                s = fmaf(small_uint_to_float((u[i] >> (4 * j)) & 15u), xv[8 * i + j], s);
    } else if (KIND == GEMV_Q8) {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                s = fmaf(small_uint_to_float((u[i] >> (8 * j)) & 255u), xv[4 * i + j], s);
    }
    return s;
}

__device__ __forceinline__ float warp_reduce(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* GEMV_ROWS rows of w from row0 against NT tokens of x, by one warp: lane l takes the 16-byte
 * chunks l, l + 32, ... of each row, U chunks of every row loaded before any is used (U * ROWS
 * independent 16-byte loads in flight per lane), then the warp sums by shuffles. */
/* Quantized chunks hold 16 or 32 values: lanes reading x straight from global memory would
 * stride 64 or 128 bytes apart, 32 L1 wavefronts per load (the 4-bit kernel ran at 10% of the
 * bandwidth). For one token the block stages x in shared memory instead, permuted so that the
 * i-th float4 of 32 consecutive chunks lie side by side: lane l's reads are consecutive 16-byte
 * words, one wavefront per 4 lanes' worth. float4 f = 8c + i of chunk c goes to slot
 * (c / 32) * 8V + 32 i + c % 32 (V values per chunk). */
template <int KIND> __device__ __forceinline__ int64_t staged_slot(int64_t c, int i) {
    const int V = chunk_values<KIND>::n;
    return (c >> 5) * (8 * V) + 32 * i + (c & 31);
}

template <int KIND> static size_t staged_bytes(int64_t cols) {
    const int V = chunk_values<KIND>::n;
    int64_t chunks = cols / V;
    return (size_t)((chunks + 31) / 32) * 32 * V * sizeof(float);
}

template <int KIND, int NT, bool STAGED = false>
__device__ __forceinline__ void gemv_rows(const dev_matrix &w, int64_t row0, const float *x,
                                          int64_t x_stride, float *y, int64_t y_stride,
                                          const float4 *xs = nullptr) {
    const int lane = threadIdx.x & 31;
    float acc[NT][GEMV_ROWS];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) acc[t][r] = 0;
    if (row0 >= w.rows) return;
    if (KIND == GEMV_GENERIC) {
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            int64_t row = row0 + r;
            if (row >= w.rows) break;
            for (int64_t c = lane; c < w.cols; c += 32) {
                float v = matrix_value(w, row, c);
#pragma unroll
                for (int t = 0; t < NT; t++) acc[t][r] = fmaf(v, x[t * x_stride + c], acc[t][r]);
            }
        }
    } else {
        const int V = chunk_values<KIND>::n;
        const int U = NT <= 2 ? 4 : 2;
        const bool quant = KIND == GEMV_Q4 || KIND == GEMV_Q8;
        int64_t n_chunks = w.cols / V;
        int64_t groups = quant ? w.cols / w.group_size : 1;
        const uint4 *base = (const uint4 *)w.data;
        int64_t rows_at[GEMV_ROWS];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) /* a tail row reads the last row, unused */
            rows_at[r] = row0 + r < w.rows ? row0 + r : w.rows - 1;
        for (int64_t c0 = lane; c0 < n_chunks; c0 += 32 * U) {
            uint4 wv[U][GEMV_ROWS];
            float sc[U][GEMV_ROWS], bi[U][GEMV_ROWS];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int64_t c = c0 + 32 * u;
                bool ok = c < n_chunks;
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++) {
                    wv[u][r] = ok ? __ldcs(base + rows_at[r] * n_chunks + c) : make_uint4(0, 0, 0, 0);
                    if (quant) {
                        int64_t g = rows_at[r] * groups + ((c * V) >> w.group_shift);
                        sc[u][r] = ok ? scale_value(w.scales, g, w.scale_dtype) : 0.0f;
                        bi[u][r] = ok ? scale_value(w.biases, g, w.scale_dtype) : 0.0f;
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                int64_t c = c0 + 32 * u;
                if (c >= n_chunks) break;
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    float xv[V];
                    const float4 *xp = (const float4 *)(x + t * x_stride + c * V);
#pragma unroll
                    for (int i = 0; i < V / 4; i++) {
                        float4 f = STAGED ? xs[staged_slot<KIND>(c, i)] : __ldg(xp + i);
                        xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
                    }
                    float sx = 0;
                    if (quant) {
#pragma unroll
                        for (int i = 0; i < V; i++) sx += xv[i];
                    }
#pragma unroll
                    for (int r = 0; r < GEMV_ROWS; r++) {
                        float d = chunk_dot<KIND>(wv[u][r], xv);
                        acc[t][r] += quant ? fmaf(sc[u][r], d, bi[u][r] * sx) : d;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            float v = warp_reduce(acc[t][r]);
            if (lane == 0 && row0 + r < w.rows) y[t * y_stride + row0 + r] = v;
        }
}

/* Up to 4 matrices sharing x (q/k/v, gate/up) in one launch: block b belongs to matrix m when
 * block_start[m] <= b < block_start[m + 1]. */
struct gemv_args {
    dev_matrix w[4];
    float *y[4];
    int block_start[5];
    int n;
    const float *x;
    int64_t x_stride;
};

template <int KIND, int NT>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_kernel(gemv_args a) {
    int b = blockIdx.x, m = 0;
    while (m + 1 < a.n && b >= a.block_start[m + 1]) m++;
    int64_t row0 = (int64_t)(b - a.block_start[m]) * GEMV_BLOCK_ROWS + (threadIdx.x >> 5) * GEMV_ROWS;
    gemv_rows<KIND, NT>(a.w[m], row0, a.x, a.x_stride, a.y[m], a.w[m].rows);
}

/* One token of a 4- or 8-bit matrix with x staged in shared memory (staged_slot). */
template <int KIND>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_staged_kernel(gemv_args a) {
    extern __shared__ float4 xs[];
    const int V = chunk_values<KIND>::n;
    int64_t n4 = a.w[0].cols / 4;
    const float4 *x4 = (const float4 *)a.x;
    for (int64_t f = threadIdx.x; f < n4; f += GEMV_THREADS)
        xs[staged_slot<KIND>(f / (V / 4), (int)(f % (V / 4)))] = __ldg(x4 + f);
    __syncthreads();
    int b = blockIdx.x, m = 0;
    while (m + 1 < a.n && b >= a.block_start[m + 1]) m++;
    int64_t row0 = (int64_t)(b - a.block_start[m]) * GEMV_BLOCK_ROWS + (threadIdx.x >> 5) * GEMV_ROWS;
    gemv_rows<KIND, 1, true>(a.w[m], row0, a.x, a.x_stride, a.y[m], a.w[m].rows, xs);
}

/* Above the default 48 KB of shared memory a kernel must ask (x of 14336 columns: 57 KB). */
template <int KIND> static int staged_fits(int64_t cols) {
    static int limit = -1;
    if (limit < 0) {
        int dev = 0, optin = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        limit = optin > 48 * 1024 ? optin : 48 * 1024;
        cudaFuncSetAttribute(gemv_staged_kernel<KIND>, cudaFuncAttributeMaxDynamicSharedMemorySize, limit);
        cudaGetLastError();
    }
    return staged_bytes<KIND>(cols) <= (size_t)limit;
}

/* MoE: job j (blockIdx.y) multiplies expert table[ids[j]] with x row j / x_div into y row j. */
template <int KIND>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_experts_kernel(const dev_matrix *table, const int32_t *ids, int x_div, const float *x,
                        int64_t cols, float *y, int64_t rows) {
    int64_t j = blockIdx.y;
    dev_matrix w = table[ids[j]];
    gemv_rows<KIND, 1>(w, (int64_t)blockIdx.x * GEMV_BLOCK_ROWS + (threadIdx.x >> 5) * GEMV_ROWS,
                       x + (j / x_div) * cols, cols,
                       y + j * rows, rows);
}

template <int KIND>
static void launch_gemv_tokens(cuda_ctx *c, const gemv_args &a, int blocks, int nt) {
    switch (nt) {
#define CASE(N) \
    case N: gemv_kernel<KIND, N><<<blocks, GEMV_THREADS, 0, c->stream>>>(a); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}

static void launch_gemv(cuda_ctx *c, int kind, const gemv_args &a, int blocks, int nt) {
    int64_t cols = a.w[0].cols;
    if (nt == 1 && kind == GEMV_Q4 && staged_fits<GEMV_Q4>(cols)) {
        gemv_staged_kernel<GEMV_Q4><<<blocks, GEMV_THREADS, staged_bytes<GEMV_Q4>(cols), c->stream>>>(a);
        CUDA_LAUNCHED(c, "gemv (4-bit, staged x)");
        return;
    }
    if (nt == 1 && kind == GEMV_Q8 && staged_fits<GEMV_Q8>(cols)) {
        gemv_staged_kernel<GEMV_Q8><<<blocks, GEMV_THREADS, staged_bytes<GEMV_Q8>(cols), c->stream>>>(a);
        CUDA_LAUNCHED(c, "gemv (8-bit, staged x)");
        return;
    }
    switch (kind) {
    case GEMV_F32: launch_gemv_tokens<GEMV_F32>(c, a, blocks, nt); break;
    case GEMV_F16: launch_gemv_tokens<GEMV_F16>(c, a, blocks, nt); break;
    case GEMV_BF16: launch_gemv_tokens<GEMV_BF16>(c, a, blocks, nt); break;
    case GEMV_Q4: launch_gemv_tokens<GEMV_Q4>(c, a, blocks, nt); break;
    case GEMV_Q8: launch_gemv_tokens<GEMV_Q8>(c, a, blocks, nt); break;
    default: launch_gemv_tokens<GEMV_GENERIC>(c, a, blocks, nt); break;
    }
    CUDA_LAUNCHED(c, "gemv");
}

/* n matrices of one kind sharing x, every token through the GEMV kernels, 8 tokens a launch. */
static void gemv_tiles(cuda_ctx *c, int n, const dev_matrix *const *m, const float *x,
                       float *const *ys, int64_t n_tokens) {
    gemv_args a;
    a.n = n;
    a.x_stride = m[0]->cols;
    a.block_start[0] = 0;
    for (int i = 0; i < n; i++) {
        a.w[i] = *m[i];
        a.block_start[i + 1] = a.block_start[i] + (int)cuda_blocks(m[i]->rows, GEMV_BLOCK_ROWS);
    }
    for (int64_t t0 = 0; t0 < n_tokens; t0 += GEMV_MAX_TOKENS) {
        int nt = (int)(n_tokens - t0 < GEMV_MAX_TOKENS ? n_tokens - t0 : GEMV_MAX_TOKENS);
        a.x = x + t0 * m[0]->cols;
        for (int i = 0; i < n; i++) a.y[i] = ys[i] + t0 * m[i]->rows;
        launch_gemv(c, m[0]->kind, a, a.block_start[n], nt);
    }
}

void cuda_gemv_experts(cuda_ctx *c, const dev_matrix *table, int kind, int64_t rows, int64_t cols,
                       const int32_t *ids, int64_t n_jobs, int x_div, const float *x, float *y) {
    dim3 grid(cuda_blocks(rows, GEMV_BLOCK_ROWS), (unsigned)n_jobs);
    switch (kind) {
#define CASE(K) \
    case K: gemv_experts_kernel<K><<<grid, GEMV_THREADS, 0, c->stream>>>(table, ids, x_div, x, cols, y, rows); break;
        CASE(GEMV_F32) CASE(GEMV_F16) CASE(GEMV_BF16) CASE(GEMV_Q4) CASE(GEMV_Q8)
#undef CASE
    default:
        gemv_experts_kernel<GEMV_GENERIC><<<grid, GEMV_THREADS, 0, c->stream>>>(table, ids, x_div, x, cols, y, rows);
    }
    CUDA_LAUNCHED(c, "gemv_experts");
}

/* ---- GEMM path -------------------------------------------------------------------------- */

__global__ void to_half_kernel(const float *x, int64_t n, int bf16, void *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (bf16)
        ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(x[i]);
    else
        ((__half *)out)[i] = __float2half_rn(x[i]);
}

/* A quantized matrix to bf16: one thread per 32-bit word for 4 and 8 bits (its values share a
 * group), per element otherwise. */
__global__ void dequant_words_kernel(dev_matrix w, __nv_bfloat16 *out) {
    int64_t words_per_row = w.cols * w.bits / 32, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= w.rows * words_per_row) return;
    int64_t r = i / words_per_row, c0 = (i % words_per_row) * (32 / w.bits);
    int64_t g = r * (w.cols / w.group_size) + c0 / w.group_size;
    float s = scale_value(w.scales, g, w.scale_dtype), b = scale_value(w.biases, g, w.scale_dtype);
    uint32_t u = ((const uint32_t *)w.data)[i], mask = (1u << w.bits) - 1u;
    for (int j = 0; j < 32 / w.bits; j++)
        out[r * w.cols + c0 + j] = __float2bfloat16_rn(s * (float)((u >> (j * w.bits)) & mask) + b);
}

__global__ void dequant_elements_kernel(dev_matrix w, __nv_bfloat16 *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= w.rows * w.cols) return;
    out[i] = __float2bfloat16_rn(matrix_value(w, i / w.cols, i % w.cols));
}

__global__ void dequant_f32_kernel(dev_matrix w, float *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= w.rows * w.cols) return;
    out[i] = matrix_value(w, i / w.cols, i % w.cols);
}

/* Matrices this small gain nothing from tensor cores, and an MoE router among them needs its
 * logits in float32 to pick the experts the reference picks: they take SGEMM. */
#define GEMM_F32_MAX_WEIGHTS ((int64_t)1 << 22)

static void gemm_path(cuda_ctx *c, const dev_matrix *m, const float *x, float *y, int64_t n) {
    const float one = 1.0f, zero = 0.0f;
    int rows = (int)m->rows, cols = (int)m->cols, tokens = (int)n;
    cublasStatus_t st;
    if (m->format == WEIGHT_F32 || m->rows * m->cols <= GEMM_F32_MAX_WEIGHTS) {
        const float *wf = (const float *)m->data;
        if (m->format != WEIGHT_F32) {
            float *buf = (float *)cuda_scratch(c, SCRATCH_GEMM_W, (size_t)rows * (size_t)cols * 4);
            if (!buf) return;
            dequant_f32_kernel<<<cuda_blocks(m->rows * m->cols, 256), 256, 0, c->stream>>>(*m, buf);
            CUDA_LAUNCHED(c, "dequantize (f32)");
            wf = buf;
        }
        st = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, tokens, cols, &one, wf, cols, x,
                         cols, &zero, y, rows);
    } else {
        int bf16 = m->format != WEIGHT_F16;
        void *xh = cuda_scratch(c, SCRATCH_GEMM_X, (size_t)n * (size_t)cols * 2);
        if (!xh) return;
        to_half_kernel<<<cuda_blocks(n * cols, 256), 256, 0, c->stream>>>(x, n * cols, bf16, xh);
        CUDA_LAUNCHED(c, "to_half");
        const void *wp = m->data;
        if (m->format == WEIGHT_MLX_AFFINE) {
            __nv_bfloat16 *wb = (__nv_bfloat16 *)cuda_scratch(c, SCRATCH_GEMM_W,
                                                              (size_t)rows * (size_t)cols * 2);
            if (!wb) return;
            if (m->bits == 4 || m->bits == 8) {
                int64_t words = m->rows * m->cols * m->bits / 32;
                dequant_words_kernel<<<cuda_blocks(words, 256), 256, 0, c->stream>>>(*m, wb);
            } else {
                dequant_elements_kernel<<<cuda_blocks(m->rows * m->cols, 256), 256, 0, c->stream>>>(*m, wb);
            }
            CUDA_LAUNCHED(c, "dequantize");
            wp = wb;
        }
        cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
        st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, tokens, cols, &one, wp, t, cols,
                          xh, t, cols, &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        char msg[64];
        snprintf(msg, sizeof msg, "status %d", (int)st);
        cuda_fail(c, "cuBLAS GEMM", msg);
    }
}

static int use_gemv(const cuda_ctx *c, int64_t n) {
    return c->exact || n <= GEMV_MAX_TOKENS;
}

void cuda_matmul(cuda_ctx *c, const weight_matrix *w, const float *x, float *y, int64_t n) {
    const dev_matrix *m = cuda_weight(c, w);
    if (!m || n <= 0) return;
    if (use_gemv(c, n))
        gemv_tiles(c, 1, &m, x, &y, n);
    else
        gemm_path(c, m, x, y, n);
}

void cuda_matmul_multi(cuda_ctx *c, int n, const weight_matrix *const *w, const float *x,
                       float *const *ys, int64_t n_tokens) {
    const dev_matrix *m[4];
    int same = n <= 4;
    for (int i = 0; i < n && i < 4; i++) {
        m[i] = cuda_weight(c, w[i]);
        if (!m[i]) return;
        same = same && m[i]->kind == m[0]->kind;
    }
    if (same && use_gemv(c, n_tokens)) {
        gemv_tiles(c, n, m, x, ys, n_tokens);
        return;
    }
    for (int i = 0; i < n; i++) cuda_matmul(c, w[i], x, ys[i], n_tokens);
}

__global__ void embed_kernel(dev_matrix w, const int32_t *ids, float *out) {
    int64_t t = blockIdx.x, r = ids[t];
    for (int64_t col = threadIdx.x; col < w.cols; col += blockDim.x)
        out[t * w.cols + col] = matrix_value(w, r, col);
}

void cuda_embed(cuda_ctx *c, const dev_matrix *w, const int32_t *ids, int64_t n, float *out) {
    embed_kernel<<<(unsigned)n, 256, 0, c->stream>>>(*w, ids, out);
    CUDA_LAUNCHED(c, "embed");
}

double cuda_gemm_bf16_gflops(cuda_ctx *c, int n, int reps) {
    size_t nn = (size_t)n * (size_t)n;
    void *a = NULL, *b = NULL, *d = NULL;
    double best = 0;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    if (cudaMalloc(&a, nn * 2) == cudaSuccess && cudaMalloc(&b, nn * 2) == cudaSuccess &&
        cudaMalloc(&d, nn * 2) == cudaSuccess) {
        cuda_fill_random(c, a, nn * 2, 11);
        cuda_fill_random(c, b, nn * 2, 12);
        const float one = 1.0f, zero = 0.0f;
        for (int r = 0; r < reps + 2; r++) { /* two warm-ups */
            cudaEventRecord(e0, c->stream);
            cublasStatus_t st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a,
                                             CUDA_R_16BF, n, b, CUDA_R_16BF, n, &zero, d,
                                             CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT);
            cudaEventRecord(e1, c->stream);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (st != CUBLAS_STATUS_SUCCESS) break;
            double gf = 2.0 * n * (double)n * n / (ms * 1e-3) * 1e-9;
            if (r >= 2 && gf > best) best = gf;
        }
    }
    cudaGetLastError();
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (d) cudaFree(d);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}
