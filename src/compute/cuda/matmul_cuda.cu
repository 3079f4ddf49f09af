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
#include <mma.h>
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

/* Chunks c0, c0 + 32, ... (U of them) of R rows into wv, with each chunk's group scale and bias
 * for quantized kinds; chunks past the row load zeros. */
template <int KIND, int U, int R>
__device__ __forceinline__ void load_chunks(const dev_matrix &w, const int64_t *rows_at, int64_t c0,
                                            int64_t n_chunks, uint4 (&wv)[U][R], float (&sc)[U][R],
                                            float (&bi)[U][R]) {
    const int V = chunk_values<KIND>::n;
    const bool quant = KIND == GEMV_Q4 || KIND == GEMV_Q8;
    const uint4 *base = (const uint4 *)w.data;
    const int64_t groups = quant ? w.cols >> w.group_shift : 0;
#pragma unroll
    for (int u = 0; u < U; u++) {
        int64_t c = c0 + 32 * u;
        bool ok = c < n_chunks;
#pragma unroll
        for (int r = 0; r < R; r++) {
            wv[u][r] = ok ? __ldcs(base + rows_at[r] * n_chunks + c) : make_uint4(0, 0, 0, 0);
            if (quant) {
                int64_t g = rows_at[r] * groups + ((c * V) >> w.group_shift);
                sc[u][r] = ok ? scale_value(w.scales, g, w.scale_dtype) : 0.0f;
                bi[u][r] = ok ? scale_value(w.biases, g, w.scale_dtype) : 0.0f;
            }
        }
    }
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
                                          const float4 *xs = nullptr, int accumulate = 0) {
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
        int64_t rows_at[GEMV_ROWS];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) /* a tail row reads the last row, unused */
            rows_at[r] = row0 + r < w.rows ? row0 + r : w.rows - 1;
        for (int64_t c0 = lane; c0 < n_chunks; c0 += 32 * U) {
            uint4 wv[U][GEMV_ROWS];
            float sc[U][GEMV_ROWS], bi[U][GEMV_ROWS];
            load_chunks<KIND, U, GEMV_ROWS>(w, rows_at, c0, n_chunks, wv, sc, bi);
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
            if (lane == 0 && row0 + r < w.rows) {
                float *o = y + t * y_stride + row0 + r;
                *o = accumulate ? *o + v : v;
            }
        }
}

/* Up to 4 matrices sharing x (q/k/v, gate/up) in one launch: block b belongs to matrix m when
 * block_start[m] <= b < block_start[m + 1] (gemv_kernel), warp tile i when tile_start[m] <= i <
 * tile_start[m + 1] (gemv_persistent_kernel). */
struct gemv_args {
    dev_matrix w[4];
    float *y[4];
    int block_start[5];
    int64_t tile_start[5];
    int n;
    const float *x;
    const float *x_up; /* persistent kernel: x' = silu(x) * x_up, else NULL */
    const float *norm_w; /* persistent kernel: x' = rmsnorm(x) * norm_w (eps), else NULL */
    float eps;
    int64_t x_stride;
    int accumulate;    /* y += W x' instead of y = W x' */
};

template <int KIND, int NT>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_kernel(gemv_args a) {
    int b = blockIdx.x, m = 0;
    while (m + 1 < a.n && b >= a.block_start[m + 1]) m++;
    int64_t row0 = (int64_t)(b - a.block_start[m]) * GEMV_BLOCK_ROWS + (threadIdx.x >> 5) * GEMV_ROWS;
    gemv_rows<KIND, NT>(a.w[m], row0, a.x, a.x_stride, a.y[m], a.w[m].rows, nullptr, a.accumulate);
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
    gemv_rows<KIND, 1, true>(a.w[m], row0, a.x, a.x_stride, a.y[m], a.w[m].rows, xs, a.accumulate);
}

/* The dynamic shared memory kernel fn may be launched with: the device's opt-in limit less the
 * kernel's own static arrays (dynamic + static must fit the limit: asking for the whole opt-in
 * limit fails for a kernel with a static array, and every launch above 48 KB then failed with
 * "invalid argument", call 5 on the H200), raised once per kernel. 48 KB when the raise is
 * refused, so callers fall back to kernels that fit instead of failing. */
static size_t dynamic_smem_limit(const void *fn) {
    static const void *fns[64];
    static size_t limits[64];
    static int n_fns;
    for (int i = 0; i < n_fns; i++)
        if (fns[i] == fn) return limits[i];
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        optin = 48 * 1024;
    cudaFuncAttributes fa;
    size_t static_bytes = cudaFuncGetAttributes(&fa, fn) == cudaSuccess ? fa.sharedSizeBytes : 1024;
    size_t limit = 48 * 1024;
    if ((size_t)optin > static_bytes + limit &&
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)(optin - static_bytes)) == cudaSuccess)
        limit = optin - static_bytes;
    cudaGetLastError();
    if (n_fns < 64) {
        fns[n_fns] = fn;
        limits[n_fns++] = limit;
    }
    return limit;
}

/* Above the default 48 KB of shared memory a kernel must ask (x of 14336 columns: 57 KB). */
template <int KIND> static int staged_fits(int64_t cols) {
    return staged_bytes<KIND>(cols) <= dynamic_smem_limit((const void *)gemv_staged_kernel<KIND>);
}

/* ---- the decode GEMV: persistent blocks, x in shared memory ------------------------------- */

/* One to GEMV_PERSIST_MAX_TOKENS tokens of a 4-bit, bf16, f16 or f32 matrix (the shapes decode
 * spends its time in). Each block copies x once into shared memory (permuted as staged_slot says,
 * so lanes read it without bank conflicts) with, for 4-bit, the sum of every 32-value chunk of
 * x; then its 8 warps walk tiles of 4 (or 2) rows, grid-strided over every tile of the
 * launch's matrices, each lane streaming its 16-byte chunks of the tile's rows (rows x U loads
 * in flight) and the warp summing by shuffles. The grid is as many blocks as the GPU
 * holds at once, so x is staged once per block, not once per 16 rows, and a warp's first loads
 * are issued before the staging so the memory is busy meanwhile.
 *
 * 4-bit chunks are dequantized without integer-to-float conversions: a byte permute drops each
 * nibble q (pre-shifted to bits 3..6 of its byte) into the mantissa of 0.5, giving 0.5 + q/32
 * exactly; the chunk's sum of (0.5 + q/32) x then yields sum(q x) = 32 acc - 16 sum(x), with the
 * chunk sum of x staged once. Two instructions per weight (permute, FMA) plus a quarter for the
 * masks, against four for shift, mask, convert and FMA; float32 throughout (the 0.5 offset costs
 * about one bit of the 24). */
#define GEMV_PERSIST_THREADS 256
#define GEMV_PERSIST_WARPS (GEMV_PERSIST_THREADS / 32)
#define GEMV_PERSIST_MAX_TOKENS 4

/* Rows of a warp's tile: 4, or 2 where 4 rows of several tokens would not fit in registers. */
__host__ __device__ constexpr int persist_tile_rows(int kind, int nt) {
    return kind == GEMV_Q4 && nt >= 2 ? 2 : 4;
}

/* Float4 slots of one token's staged x. */
template <int KIND> __host__ __device__ __forceinline__ int64_t persist_x_slots(int64_t cols) {
    const int V = chunk_values<KIND>::n;
    return (cols / V + 31) / 32 * 32 * (V / 4);
}

template <int KIND> static size_t persist_smem_bytes(int64_t cols, int nt) {
    size_t b = (size_t)nt * (size_t)persist_x_slots<KIND>(cols) * 16;
    if (KIND == GEMV_Q4) b += (size_t)nt * (size_t)(cols / 32) * 4;
    return b;
}

/* 0.5 + q/32 for the nibble in bits 3..6 of byte k of v (byte 2 of the result: mantissa bits
 * 19..22; byte 3 0x3f: sign 0, exponent 126). */
__device__ __forceinline__ float half_plus_nibble(uint32_t v, int k) {
    return __uint_as_float(__byte_perm(v, 0x3f000000u, 0x7054u | ((uint32_t)k << 8)));
}

/* sum over a 4-bit chunk of (0.5 + q_i/32) x_i */
__device__ __forceinline__ float q4_chunk_dot_offset(const uint4 &w, const float *xv) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    float s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = (u[i] << 3) & 0x78787878u; /* nibbles 0, 2, 4, 6 at bits 3..6 of bytes */
        uint32_t hi = (u[i] >> 1) & 0x78787878u; /* nibbles 1, 3, 5, 7 */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            s0 = fmaf(half_plus_nibble(lo, k), xv[8 * i + 2 * k], s0);
            s1 = fmaf(half_plus_nibble(hi, k), xv[8 * i + 2 * k + 1], s1);
        }
    }
    return s0 + s1;
}

/* Stages NT tokens of x' -- x, silu(x) * x_up, or rmsnorm(x) * norm_w as rmsnorm_kernel computes
 * it (the sum of squares in double) -- into shared memory, float4 f of token t at
 * xs[t * slots + slot(f)]; ends with the block's barrier. Every thread of the block calls it. */
template <int NT, class SLOT>
__device__ __forceinline__ void stage_x(const gemv_args &a, float4 *xs, int64_t slots, SLOT slot) {
    const int64_t cols = a.w[0].cols, n4 = cols / 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nthreads = blockDim.x;
    for (int t = 0; t < NT; t++) {
        const float4 *x4 = (const float4 *)(a.x + t * a.x_stride);
        const float4 *up4 = (const float4 *)(a.x_up + t * a.x_stride);
#pragma unroll 4
        for (int64_t f = threadIdx.x; f < n4; f += nthreads) {
            float4 v = __ldg(x4 + f);
            if (a.x_up) {
                float4 u = __ldg(up4 + f);
                v = make_float4(silu_times(v.x, u.x), silu_times(v.y, u.y), silu_times(v.z, u.z),
                                silu_times(v.w, u.w));
            }
            xs[t * slots + slot(f)] = v;
        }
    }
    __syncthreads();
    if (!a.norm_w) return;
    __shared__ double part[32];
    const float4 *w4 = (const float4 *)a.norm_w;
    for (int t = 0; t < NT; t++) {
        double ss = 0;
        for (int64_t f = threadIdx.x; f < n4; f += nthreads) {
            float4 v = xs[t * slots + slot(f)];
            ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) part[warp] = ss;
        __syncthreads();
        ss = 0;
        for (int i = 0; i < nthreads / 32; i++) ss += part[i];
        float inv = (float)(1.0 / sqrt(ss / (double)cols + (double)a.eps));
        for (int64_t f = threadIdx.x; f < n4; f += nthreads) {
            float4 *p = &xs[t * slots + slot(f)];
            float4 v = *p, g = __ldg(w4 + f);
            *p = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
        }
        __syncthreads(); /* part is read before the next token's sums are stored */
    }
}

template <int KIND, int NT>
__global__ void __launch_bounds__(GEMV_PERSIST_THREADS, 2) gemv_persistent_kernel(gemv_args a) {
    extern __shared__ float4 xs[]; /* [NT][persist_x_slots], then for 4-bit [NT][cols / 32] */
    const int V = chunk_values<KIND>::n;
    /* chunks of each row in flight per lane: as many as the registers hold without spilling */
    const int U = KIND == GEMV_Q4 ? (NT == 1 ? 2 : 1) : (NT <= 2 ? 4 : 2);
    const int R = persist_tile_rows(KIND, NT);
    const bool quant = KIND == GEMV_Q4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t cols = a.w[0].cols, n_chunks = cols / V, slots = persist_x_slots<KIND>(cols);
    float *chunk_sum = (float *)(xs + NT * slots);
    const int64_t n_tiles = a.tile_start[a.n], tile_step = (int64_t)gridDim.x * GEMV_PERSIST_WARPS;

    int64_t tile = (int64_t)blockIdx.x * GEMV_PERSIST_WARPS + warp, cb = 0;
    int m = 0;
    int64_t row0 = 0, rows_at[R];
    uint4 wv[U][R];
    float sc[U][R], bi[U][R];
    /* the tile's rows (a tail row re-reads the matrix's last row, not stored) */
    auto start_tile = [&]() {
        m = 0;
        while (m + 1 < a.n && tile >= a.tile_start[m + 1]) m++;
        row0 = (tile - a.tile_start[m]) * R;
#pragma unroll
        for (int r = 0; r < R; r++) rows_at[r] = row0 + r < a.w[m].rows ? row0 + r : a.w[m].rows - 1;
        cb = 0;
    };
    auto load = [&]() { load_chunks<KIND, U, R>(a.w[m], rows_at, cb + lane, n_chunks, wv, sc, bi); };
    bool busy = tile < n_tiles;
    if (busy) {
        start_tile();
        load();
    }
    /* stage x (and the 4-bit chunk sums) while those loads are in flight */
    stage_x<NT>(a, xs, slots, [](int64_t f) { return staged_slot<KIND>(f / (V / 4), (int)(f % (V / 4))); });
    if (quant) {
        for (int64_t i = threadIdx.x; i < NT * n_chunks; i += GEMV_PERSIST_THREADS) {
            int64_t t = i / n_chunks, c = i % n_chunks;
            float s = 0;
#pragma unroll
            for (int k = 0; k < V / 4; k++) {
                float4 f = xs[t * slots + staged_slot<KIND>(c, k)];
                s += (f.x + f.y) + (f.z + f.w);
            }
            chunk_sum[i] = s;
        }
        __syncthreads();
    }
    float acc[NT][R];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[t][r] = 0;
    while (busy) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t c = cb + lane + 32 * u;
            if (c >= n_chunks) break;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float xv[V];
#pragma unroll
                for (int i = 0; i < V / 4; i++) {
                    float4 f = xs[t * slots + staged_slot<KIND>(c, i)];
                    xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
                }
                if (quant) {
                    float sx = chunk_sum[t * n_chunks + c];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float d = q4_chunk_dot_offset(wv[u][r], xv);
                        /* s sum(q x) + b sum(x), sum(q x) = 32 d - 16 sx */
                        acc[t][r] = fmaf(32.0f * sc[u][r], d,
                                         fmaf(bi[u][r] - 16.0f * sc[u][r], sx, acc[t][r]));
                    }
                } else {
#pragma unroll
                    for (int r = 0; r < R; r++) acc[t][r] += chunk_dot<KIND>(wv[u][r], xv);
                }
            }
        }
        cb += 32 * U;
        if (cb >= n_chunks) { /* the tile is done: sum across the warp and store */
            const dev_matrix &w = a.w[m];
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float v = warp_reduce(acc[t][r]);
                    acc[t][r] = 0;
                    if (lane == 0 && row0 + r < w.rows) {
                        float *o = a.y[m] + t * w.rows + row0 + r;
                        *o = a.accumulate ? *o + v : v;
                    }
                }
            tile += tile_step;
            busy = tile < n_tiles;
            if (!busy) break;
            start_tile();
        }
        load();
    }
}

/* Launches the persistent GEMV for nt tokens, or returns 0 when it does not apply (kind, token
 * count, or x too long for shared memory). */
template <int KIND> static const void *persist_kernel(int nt) {
    return nt == 1   ? (const void *)gemv_persistent_kernel<KIND, 1>
           : nt == 2 ? (const void *)gemv_persistent_kernel<KIND, 2>
           : nt == 3 ? (const void *)gemv_persistent_kernel<KIND, 3>
                     : (const void *)gemv_persistent_kernel<KIND, 4>;
}

/* Whether the persistent kernel of nt tokens can stage x of cols columns. */
template <int KIND> static int persist_fits(int64_t cols, int nt) {
    return persist_smem_bytes<KIND>(cols, nt) <= dynamic_smem_limit(persist_kernel<KIND>(nt));
}

template <int KIND> static int persist_launch_nt(cuda_ctx *c, const gemv_args &a, int nt) {
    size_t smem = persist_smem_bytes<KIND>(a.w[0].cols, nt);
    const void *fn = persist_kernel<KIND>(nt);
    if (!persist_fits<KIND>(a.w[0].cols, nt)) return 0;
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, GEMV_PERSIST_THREADS, smem) !=
            cudaSuccess ||
        per_sm < 1) {
        cudaGetLastError();
        per_sm = 1;
    }
    int64_t want = (a.tile_start[a.n] + GEMV_PERSIST_WARPS - 1) / GEMV_PERSIST_WARPS;
    int64_t most = (int64_t)per_sm * c->sm_count;
    unsigned blocks = (unsigned)(want < most ? want : most);
    if (blocks < 1) blocks = 1;
    switch (nt) {
#define CASE(N) \
    case N: gemv_persistent_kernel<KIND, N><<<blocks, GEMV_PERSIST_THREADS, smem, c->stream>>>(a); break;
        CASE(1) CASE(2) CASE(3) CASE(4)
#undef CASE
    }
    CUDA_LAUNCHED(c, "gemv (persistent)");
    return 1;
}

/* A scale/bias pair of 16-bit values (bf16 or f16) as floats. */
template <int SD> __device__ __forceinline__ float2 unpack_sb(uint32_t p) {
    if (SD == DTYPE_BF16) return make_float2(__uint_as_float(p << 16), __uint_as_float(p & 0xffff0000u));
    __half2 h = *reinterpret_cast<const __half2 *>(&p);
    return __half22float2(h);
}

/* ---- one-token GEMV with x in registers (4-bit group 64, bf16) ------------------------------ */

/* The kernels above stage all of x in shared memory (57 KB for the 14336-column down projection)
 * and read it back for every weight: the SM held one block (12% occupancy, ncu), and the 4-bit
 * weights' 8 floats of x per byte made shared memory, not DRAM, the limit. Here a warp owns a
 * slice of 1024 columns of x for the whole launch, in registers (32 floats a lane: for 4-bit one
 * half group of 32 consecutive columns, for bf16 four runs of 8 columns 256 apart, so that each
 * 16-byte weight load of the warp is 512 contiguous bytes), and a block is one warp per slice
 * (cols / 1024 warps). The block walks tiles of R rows, grid-strided: each lane loads its 16 bytes
 * (bf16: 4 x 16) of every row of the tile, dots them with its x, the warp reduces the R sums with
 * a transposing butterfly (R values halve at each of the first log2 R steps: 9 shuffles for 8
 * rows, not 40), and the slices' sums meet in shared memory, added in slice order by warp 0
 * (deterministic). The next tile's loads are issued before that reduction. x' = silu(x) * x_up or
 * rmsnorm(x) * norm_w is formed once, in registers, as x is loaded. 4-bit: the 0.5 + q/32 byte
 * permute of the persistent kernel, with the lane's sum of x for s sum(q x) + b sum(x). */
#define XR_SLICE 1024
#define XR_MAX_WARPS 16 /* columns <= 16384 */

template <int KIND> struct xr_rows { static const int r = KIND == GEMV_Q4 ? 8 : 2; }; /* bf16: 4 spilled */

template <int KIND, int SD>
__global__ void __launch_bounds__(XR_MAX_WARPS * 32) gemv_xreg_kernel(gemv_args a) {
    constexpr int R = xr_rows<KIND>::r, U = KIND == GEMV_Q4 ? 1 : 4; /* 16-byte loads a row */
    __shared__ float red[2][XR_MAX_WARPS][R];
    __shared__ double part[XR_MAX_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t cols = a.w[0].cols, slice0 = (int64_t)warp * XR_SLICE;
    /* column of this lane's run j (4-bit: one run of 32; bf16: runs of 8) */
    auto col = [&](int j) -> int64_t { return KIND == GEMV_Q4 ? slice0 + lane * 32 : slice0 + j * 256 + lane * 8; };
    const int64_t n_tiles = a.tile_start[a.n];
    int64_t tile = blockIdx.x;
    int m = 0;
    uint4 wv[R][U];
    uint32_t sbv[R];
    /* 16-byte units a row, and this lane's first unit and scale pair in row 0 */
    constexpr int V = KIND == GEMV_Q4 ? 32 : 8;
    const int64_t stride = cols / V, sb_stride = cols / 64;
    auto load = [&](int64_t tl) {
        m = 0;
        while (m + 1 < a.n && tl >= a.tile_start[m + 1]) m++;
        const dev_matrix &w = a.w[m];
        const int64_t row0 = (tl - a.tile_start[m]) * R;
        const int left = w.rows - row0 < R ? (int)(w.rows - row0) : R; /* a tail tile's rows */
        /* one multiply a tile, then a row's stride per row (64-bit products per row cost as
         * much as a fifth of the arithmetic) */
        const uint4 *p = (const uint4 *)w.data + row0 * stride;
        const uint32_t *ps = KIND == GEMV_Q4 ? w.sb + row0 * sb_stride + col(0) / 64 : nullptr;
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int j = 0; j < U; j++) {
                const int64_t c = col(j);
                wv[r][j] = c < cols && r < left ? __ldcs(p + c / V) : make_uint4(0, 0, 0, 0);
            }
            if (KIND == GEMV_Q4) sbv[r] = col(0) < cols && r < left ? __ldg(ps) : 0u;
            p += stride;
            if (KIND == GEMV_Q4) ps += sb_stride;
        }
    };
    if (tile < n_tiles) load(tile); /* weights only: in flight while the previous kernel ends */
    pdl_wait();
    float xr[32];
#pragma unroll
    for (int j = 0; j < 32 / 8; j++) {
        const int64_t c = KIND == GEMV_Q4 ? col(0) + 8 * j : col(j);
        float4 f0 = make_float4(0, 0, 0, 0), f1 = f0;
        if (c < cols) {
            f0 = __ldg((const float4 *)(a.x + c)), f1 = __ldg((const float4 *)(a.x + c) + 1);
            if (a.x_up) {
                float4 u0 = __ldg((const float4 *)(a.x_up + c)), u1 = __ldg((const float4 *)(a.x_up + c) + 1);
                f0 = make_float4(silu_times(f0.x, u0.x), silu_times(f0.y, u0.y), silu_times(f0.z, u0.z), silu_times(f0.w, u0.w));
                f1 = make_float4(silu_times(f1.x, u1.x), silu_times(f1.y, u1.y), silu_times(f1.z, u1.z), silu_times(f1.w, u1.w));
            }
        }
        xr[8 * j] = f0.x, xr[8 * j + 1] = f0.y, xr[8 * j + 2] = f0.z, xr[8 * j + 3] = f0.w;
        xr[8 * j + 4] = f1.x, xr[8 * j + 5] = f1.y, xr[8 * j + 6] = f1.z, xr[8 * j + 7] = f1.w;
    }
    if (a.norm_w) { /* rmsnorm as rmsnorm_kernel: the sum of squares in double */
        double ss = 0;
#pragma unroll
        for (int i = 0; i < 32; i++) ss += (double)xr[i] * xr[i];
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) part[warp] = ss;
        __syncthreads();
        ss = 0;
        for (int i = 0; i < nw; i++) ss += part[i];
        const float inv = (float)(1.0 / sqrt(ss / (double)cols + (double)a.eps));
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t c = KIND == GEMV_Q4 ? col(0) + 8 * j : col(j);
            if (c < cols) {
                float4 g0 = __ldg((const float4 *)(a.norm_w + c)), g1 = __ldg((const float4 *)(a.norm_w + c) + 1);
                const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
                for (int i = 0; i < 8; i++) xr[8 * j + i] = xr[8 * j + i] * inv * g[i];
            }
        }
    }
    float sx = 0;
    if (KIND == GEMV_Q4) {
#pragma unroll
        for (int i = 0; i < 32; i++) sx += xr[i];
    }
    int buf = 0;
    while (tile < n_tiles) {
        float v[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (KIND == GEMV_Q4) { /* s sum(q x) + b sum(x), sum(q x) = 32 d - 16 sx */
                float d = q4_chunk_dot_offset(wv[r][0], xr);
                float2 sb = unpack_sb<SD>(sbv[r]);
                v[r] = fmaf(32.0f * sb.x, d, (sb.y - 16.0f * sb.x) * sx);
            } else {
                float d = 0;
#pragma unroll
                for (int j = 0; j < U; j++) d += chunk_dot<GEMV_BF16>(wv[r][j], xr + 8 * j);
                v[r] = d;
            }
        }
        const int mt = m;
        const int64_t row0 = (tile - a.tile_start[mt]) * R;
        tile += gridDim.x;
        if (tile < n_tiles) load(tile); /* the next tile's bytes fly during the reductions */
        else pdl_trigger(); /* this block's last loads are out: the next kernel may start */
        /* transposing butterfly: after it, lane l holds the warp's sum of row rl */
        int rl = 0;
#pragma unroll
        for (int n = R, o = 16; n > 1; n >>= 1, o >>= 1) {
            const bool up = lane & o;
#pragma unroll
            for (int i = 0; i < n / 2; i++) {
                float send = up ? v[i] : v[i + n / 2], keep = up ? v[i + n / 2] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
            if (up) rl += n / 2;
        }
#pragma unroll
        for (int o = 16 / (R / 2 > 0 ? R / 2 : 1) / 2; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
        if ((lane & (32 / R - 1)) == 0) red[buf][warp][rl] = v[0];
        __syncthreads();
        if (warp == 0 && lane < R) {
            float y = 0;
            for (int w = 0; w < nw; w++) y += red[buf][w][lane];
            const dev_matrix &w = a.w[mt];
            if (row0 + lane < w.rows) {
                float *o = a.y[mt] + row0 + lane;
                *o = a.accumulate ? *o + y : y;
            }
        }
        buf ^= 1; /* the other buffer: warp 0 reads this one before the next barrier */
    }
}

/* The x-in-registers kind of these matrices for one token, or -1 (EXO_CUDA_GEMV1=prev: -1). */
static int xreg_kind(const cuda_ctx *c, const dev_matrix *m) {
    if (c->gemv_old || c->gemv1_prev || m->cols > (int64_t)XR_SLICE * XR_MAX_WARPS) return -1;
    if (m->kind == GEMV_Q4 && m->sb && m->group_size == 64 && m->cols % 64 == 0) return GEMV_Q4;
    if (m->kind == GEMV_BF16 && m->cols % 8 == 0) return GEMV_BF16;
    return -1;
}

template <int KIND, int SD> static int xreg_launch_kind(cuda_ctx *c, gemv_args &a) {
    constexpr int R = xr_rows<KIND>::r;
    const void *fn = (const void *)gemv_xreg_kernel<KIND, SD>;
    const int warps = (int)((a.w[0].cols + XR_SLICE - 1) / XR_SLICE);
    a.tile_start[0] = 0;
    for (int i = 0; i < a.n; i++) a.tile_start[i + 1] = a.tile_start[i] + (a.w[i].rows + R - 1) / R;
    static const void *fns[8];
    static int per_sm[8][XR_MAX_WARPS + 1];
    int k = 0;
    while (k < 8 && fns[k] && fns[k] != fn) k++;
    int occ = k < 8 && fns[k] ? per_sm[k][warps] : 0;
    if (!occ) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, warps * 32, 0) != cudaSuccess || occ < 1) {
            cudaGetLastError();
            occ = 1;
        }
        if (k < 8) fns[k] = fn, per_sm[k][warps] = occ;
    }
    /* as many blocks as fit at once, with every block the same number of tiles (+-1) */
    int64_t n_tiles = a.tile_start[a.n], most = (int64_t)occ * c->sm_count;
    int64_t per_block = (n_tiles + most - 1) / most;
    unsigned blocks = (unsigned)((n_tiles + per_block - 1) / per_block);
    launch_pdl(c, gemv_xreg_kernel<KIND, SD>, dim3(blocks), dim3(warps * 32), 0, a);
    CUDA_LAUNCHED(c, "gemv (x in registers)");
    return 1;
}

static int xreg_launch(cuda_ctx *c, gemv_args &a, int nt) {
    if (nt != 1) return 0;
    int kind = xreg_kind(c, &a.w[0]);
    for (int i = 1; i < a.n; i++)
        if (xreg_kind(c, &a.w[i]) != kind || a.w[i].scale_dtype != a.w[0].scale_dtype) return 0;
    if (kind == GEMV_Q4)
        return a.w[0].scale_dtype == DTYPE_BF16 ? xreg_launch_kind<GEMV_Q4, DTYPE_BF16>(c, a)
                                                : xreg_launch_kind<GEMV_Q4, DTYPE_F16>(c, a);
    if (kind == GEMV_BF16) return xreg_launch_kind<GEMV_BF16, DTYPE_BF16>(c, a);
    return 0;
}

/* Whether every launch of an n-token GEMV of m goes to the persistent kernel. */
static int persist_applies(const cuda_ctx *c, const dev_matrix *m, int64_t n) {
    int nt = (int)(n < GEMV_MAX_TOKENS ? n : GEMV_MAX_TOKENS);
    if (n == 1 && xreg_kind(c, m) >= 0) return 1;
    if (c->gemv_old || n > GEMV_PERSIST_MAX_TOKENS || (m->kind == GEMV_BF16 && n == 1))
        return 0;
    switch (m->kind) {
    case GEMV_Q4: return persist_fits<GEMV_Q4>(m->cols, nt);
    case GEMV_BF16: return persist_fits<GEMV_BF16>(m->cols, nt);
    case GEMV_F16: return persist_fits<GEMV_F16>(m->cols, nt);
    case GEMV_F32: return persist_fits<GEMV_F32>(m->cols, nt);
    }
    return 0;
}

static int persist_launch(cuda_ctx *c, int kind, gemv_args &a, int nt) {
    if (xreg_launch(c, a, nt)) return 1;
    if (c->gemv_old || nt > GEMV_PERSIST_MAX_TOKENS || (kind == GEMV_BF16 && nt == 1))
        return 0;
    a.tile_start[0] = 0;
    const int rows = persist_tile_rows(kind, nt);
    for (int i = 0; i < a.n; i++)
        a.tile_start[i + 1] = a.tile_start[i] + (a.w[i].rows + rows - 1) / rows;
    switch (kind) {
    case GEMV_Q4: return persist_launch_nt<GEMV_Q4>(c, a, nt);
    case GEMV_BF16: return persist_launch_nt<GEMV_BF16>(c, a, nt);
    case GEMV_F16: return persist_launch_nt<GEMV_F16>(c, a, nt);
    case GEMV_F32: return persist_launch_nt<GEMV_F32>(c, a, nt);
    }
    return 0;
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

static void launch_gemv(cuda_ctx *c, int kind, gemv_args &a, int blocks, int nt) {
    if (persist_launch(c, kind, a, nt)) return;
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

/* n matrices of one kind sharing x, every token through the GEMV kernels, 8 tokens a launch;
 * x_up (x' = silu(x) * x_up) only where the persistent kernel takes every launch. */
static void gemv_tiles(cuda_ctx *c, int n, const dev_matrix *const *m, const float *x,
                       const float *x_up, float *const *ys, int64_t n_tokens, int accumulate,
                       const float *norm_w = NULL, float eps = 0) {
    gemv_args a;
    a.n = n;
    a.x_stride = m[0]->cols;
    a.accumulate = accumulate;
    a.norm_w = norm_w;
    a.eps = eps;
    a.block_start[0] = 0;
    for (int i = 0; i < n; i++) {
        a.w[i] = *m[i];
        a.block_start[i + 1] = a.block_start[i] + (int)cuda_blocks(m[i]->rows, GEMV_BLOCK_ROWS);
    }
    for (int64_t t0 = 0; t0 < n_tokens; t0 += GEMV_MAX_TOKENS) {
        int nt = (int)(n_tokens - t0 < GEMV_MAX_TOKENS ? n_tokens - t0 : GEMV_MAX_TOKENS);
        a.x = x + t0 * m[0]->cols;
        a.x_up = x_up ? x_up + t0 * m[0]->cols : NULL;
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

/* x (or silu(x) * up) rounded to bf16 or f16 for the tensor cores; perm: each 8 columns stored
 * in the order 0,4,1,5,2,6,3,7 (qgemm4's k order). */
__global__ void to_half_kernel(const float *x, const float *up, int64_t n, int bf16, int perm, void *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = up ? silu_times(x[i], up[i]) : x[i];
    int64_t o = perm ? (i & ~(int64_t)7) | ((i & 3) << 1) | ((i >> 2) & 1) : i;
    if (bf16)
        ((__nv_bfloat16 *)out)[o] = __float2bfloat16_rn(v);
    else
        ((__half *)out)[o] = __float2half_rn(v);
}

/* A 4- or 8-bit matrix to bf16: one thread per 32-bit word (its values share a group), written
 * as one 16-byte (8-byte) store. */
template <int BITS> __global__ void dequant_words_kernel(dev_matrix w, __nv_bfloat16 *out) {
    const int per_word = 32 / BITS;
    int64_t words_per_row = w.cols / per_word, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= w.rows * words_per_row) return;
    int64_t r = i / words_per_row, c0 = (i % words_per_row) * per_word;
    int64_t g = r * (w.cols >> w.group_shift) + (c0 >> w.group_shift);
    float s = scale_value(w.scales, g, w.scale_dtype), b = scale_value(w.biases, g, w.scale_dtype);
    uint32_t u = ((const uint32_t *)w.data)[i], mask = (1u << BITS) - 1u, packed[per_word / 2];
#pragma unroll
    for (int j = 0; j < per_word; j += 2) {
        __nv_bfloat162 h = __floats2bfloat162_rn(s * (float)((u >> (j * BITS)) & mask) + b,
                                                 s * (float)((u >> ((j + 1) * BITS)) & mask) + b);
        packed[j / 2] = *reinterpret_cast<uint32_t *>(&h);
    }
    __nv_bfloat16 *o = out + r * w.cols + c0;
    if (BITS == 4)
        *(uint4 *)o = make_uint4(packed[0], packed[1], packed[2], packed[3 % (per_word / 2)]);
    else
        *(uint2 *)o = make_uint2(packed[0], packed[1 % (per_word / 2)]);
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

/* Matrices under 2^22 weights gain little from tensor cores, and an MoE router among them needs
 * its logits in float32 to pick the experts the reference picks: they take SGEMM. (At 2^22 and
 * up, half width: the 8B shape's k and v projections, 1024 x 4096 = 2^22 exactly, took SGEMM at
 * ~50 TFLOP/s and were a fifth of a 2048-token prefill.) */
#define GEMM_F32_BELOW_WEIGHTS ((int64_t)1 << 22)

static int gemm_in_f32(const dev_matrix *m) {
    return m->format == WEIGHT_F32 || m->rows * m->cols < GEMM_F32_BELOW_WEIGHTS;
}

static void check_blas(cuda_ctx *c, cublasStatus_t st) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    if (c->capturing >= 0) { /* cannot be recorded: the step runs again, unrecorded */
        c->capture_broken = 1;
        return;
    }
    char msg[64];
    snprintf(msg, sizeof msg, "status %d", (int)st);
    cuda_fail(c, "cuBLAS GEMM", msg);
}

/* y (+)= W x through SGEMM, x float32. */
static void gemm_f32(cuda_ctx *c, const dev_matrix *m, const float *x, float *y, int64_t n,
                     int accumulate) {
    const float one = 1.0f, zero = 0.0f;
    int rows = (int)m->rows, cols = (int)m->cols;
    const float *wf = (const float *)m->data;
    if (m->format != WEIGHT_F32) {
        float *buf = (float *)cuda_scratch(c, SCRATCH_GEMM_W, (size_t)rows * (size_t)cols * 4);
        if (!buf) return;
        dequant_f32_kernel<<<cuda_blocks(m->rows * m->cols, 256), 256, 0, c->stream>>>(*m, buf);
        CUDA_LAUNCHED(c, "dequantize (f32)");
        wf = buf;
    }
    check_blas(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, (int)n, cols, &one, wf, cols,
                              x, cols, accumulate ? &one : &zero, y, rows));
}

/* x (x' = silu(x) * up when up) as n rows of 16-bit values in scratch, for half-width GEMMs
 * (perm: in qgemm4's column order, in a scratch of its own). */
static const void *half_x(cuda_ctx *c, const float *x, const float *up, int64_t n, int64_t cols,
                          int bf16, int perm) {
    void *xh = cuda_scratch(c, perm ? SCRATCH_QGEMM_X : SCRATCH_GEMM_X, (size_t)(n * cols) * 2);
    if (!xh) return NULL;
    to_half_kernel<<<cuda_blocks(n * cols, 256), 256, 0, c->stream>>>(x, up, n * cols, bf16, perm, xh);
    CUDA_LAUNCHED(c, "to_half");
    return xh;
}

/* y (+)= W xh on the tensor cores: MLX weights dequantized to a bf16 copy first. */
static void gemm_half(cuda_ctx *c, const dev_matrix *m, const void *xh, float *y, int64_t n,
                      int accumulate) {
    const float one = 1.0f, zero = 0.0f;
    int rows = (int)m->rows, cols = (int)m->cols, bf16 = m->format != WEIGHT_F16;
    const void *wp = m->data;
    if (m->format == WEIGHT_MLX_AFFINE) {
        __nv_bfloat16 *wb = (__nv_bfloat16 *)cuda_scratch(c, SCRATCH_GEMM_W,
                                                          (size_t)rows * (size_t)cols * 2);
        if (!wb) return;
        int64_t elems = m->rows * m->cols;
        if (m->bits == 4 && m->group_size >= 8)
            dequant_words_kernel<4><<<cuda_blocks(elems / 8, 256), 256, 0, c->stream>>>(*m, wb);
        else if (m->bits == 8 && m->group_size >= 4)
            dequant_words_kernel<8><<<cuda_blocks(elems / 4, 256), 256, 0, c->stream>>>(*m, wb);
        else
            dequant_elements_kernel<<<cuda_blocks(elems, 256), 256, 0, c->stream>>>(*m, wb);
        CUDA_LAUNCHED(c, "dequantize");
        wp = wb;
    }
    cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    check_blas(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, (int)n, cols, &one, wp, t,
                               cols, xh, t, cols, accumulate ? &one : &zero, y, CUDA_R_32F, rows,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* ---- 4-bit GEMM on the tensor cores, dequantizing as it goes (9..QGEMM_MAX_TOKENS tokens) --- */

/* The GEMM path above dequantizes a whole matrix to a bf16 copy and hands it to cuBLAS: for a
 * decode batch that writes and reads 4x the bytes of the 4-bit weights, every step. qgemm4 reads
 * the MLX 4-bit words as they are (the layout the one-token GEMV reads; no second copy) and
 * multiplies on the tensor cores with mma.sync m16n8k16 (bf16 in, float32 accumulators).
 *
 * A block of 4 warps takes 128 rows x BN tokens (BN = 16, 32 or 64: 8 x NT), each warp 32 rows x
 * BN tokens. Per stage of 128 columns, cp.async copies the raw 4-bit tile (64 contiguous bytes
 * per row) and x (bf16, BN x 256 bytes) into shared memory, QGEMM_STAGES stages in flight, one
 * barrier per stage. Scales and biases go to registers two stages ahead.
 *
 * The k order inside the mma is free as long as weights and x agree, so each lane takes whole
 * 32-bit words: in a 32-column step, lane (g = lane / 4, t = lane % 4) owns the columns
 * 32t + 8s .. +7 of the stage (s = step), i.e. word 4t + s of its rows -- one 16-byte shared load
 * gives a row's words for all four steps. A word's nibbles (n0..n7, column order) become bf16
 * pairs (128 + n_i, 128 + n_{i+4}) with one mask-or each (0x4300 | n is 128 + n exactly), so x is
 * stored with each 8 columns in the order 0,4,1,5,2,6,3,7 (to_half_kernel, perm): one 16-byte
 * shared load of x is then the B fragments of both k16 halves of the step.
 *
 * Numerics: w = s * n + b rounded once to bf16 (bf16 scales: (128 + n) - 128 exactly, then one
 * fused bf16x2 fma; f16/f32 scales: fmaf in float32, then rounded), x rounded to bf16, float32
 * accumulation -- the cuBLAS path's numbers up to summation order. Matrices with few row blocks
 * split k across blocks; a second kernel adds the partial sums in split order (deterministic). */
#define QGEMM_MAX_TOKENS 256
#define QGEMM_BM 128
#define QGEMM_BK 128
#define QGEMM_STAGES 4
#define QGEMM_THREADS 128

/* Up to 4 matrices sharing x and column count (q/k/v, gate/up): block b belongs to matrix m when
 * block_start[m] <= b < block_start[m + 1] (row blocks of 128). */
struct qgemm_args {
    const uint32_t *data[4];
    const void *scales[4], *biases[4];
    float *y[4];
    float *partial[4];      /* [splits][tokens][rows] of each matrix when split, else NULL */
    int rows[4];
    int block_start[5];
    int n;
    int cols, group_shift;
    int tokens;
    int chunks_per_split;   /* stages of QGEMM_BK columns per block */
    int accumulate;
    const __nv_bfloat16 *x; /* [tokens][cols], each 8 columns in the order 0,4,1,5,2,6,3,7 */
};

template <int NT> struct qgemm_shape {
    static const int BN = 8 * NT;
    static const int A_BYTES = QGEMM_BM * QGEMM_BK / 2; /* 64 bytes a row */
    static const int X_BYTES = BN * QGEMM_BK * 2;       /* 256 bytes a token */
    static const int STAGE = A_BYTES + X_BYTES;
    static const int SMEM = QGEMM_STAGES * STAGE;
};

__device__ __forceinline__ void qg_cp16(void *smem, const void *gmem, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(smem)),
                 "l"(gmem), "r"(ok ? 16 : 0)
                 : "memory");
}

/* x's 16-byte chunk c (of 16 in a token's 256 bytes) is stored at c ^ qg_swz(token, c): the 8
 * lanes of a shared-load phase (g in 0..1, t in 0..3) then hit 8 different bank groups. */
__device__ __forceinline__ int qg_swz(int tok, int c) { return (tok & 1) | (((c >> 3) & 1) << 1); }

__device__ __forceinline__ void qg_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* A group's scale and bias as the dequantization takes them: bf16 scales as a pair of bf16x2
 * words {s, s}, {b, b}; others as float32. */
template <int SD> struct qg_scale {
    float s, b;
};
template <> struct qg_scale<DTYPE_BF16> {
    uint32_t s2, b2;
};

template <int SD>
__device__ __forceinline__ qg_scale<SD> qg_load_scale(const void *scales, const void *biases, int64_t i) {
    qg_scale<SD> r;
    if constexpr (SD == DTYPE_BF16) {
        uint32_t s = __ldg((const unsigned short *)scales + i), b = __ldg((const unsigned short *)biases + i);
        r.s2 = s | s << 16, r.b2 = b | b << 16;
    } else if constexpr (SD == DTYPE_F16) {
        r.s = __half2float(__ldg((const __half *)scales + i));
        r.b = __half2float(__ldg((const __half *)biases + i));
    } else {
        r.s = __ldg((const float *)scales + i), r.b = __ldg((const float *)biases + i);
    }
    return r;
}

/* Nibbles i and i + 4 of word u, dequantized: a bf16 pair (low half: nibble i). */
template <int SD>
__device__ __forceinline__ uint32_t qg_dequant_pair(uint32_t u, int i, const qg_scale<SD> &sc) {
    uint32_t p = ((u >> (4 * i)) & 0x000f000fu) | 0x43004300u; /* 128 + n, exactly */
    if constexpr (SD == DTYPE_BF16) {
        __nv_bfloat162 q = __hsub2(*reinterpret_cast<__nv_bfloat162 *>(&p),
                                   __floats2bfloat162_rn(128.0f, 128.0f));
        __nv_bfloat162 v = __hfma2(q, *reinterpret_cast<const __nv_bfloat162 *>(&sc.s2),
                                   *reinterpret_cast<const __nv_bfloat162 *>(&sc.b2));
        return *reinterpret_cast<uint32_t *>(&v);
    } else {
        float lo = __uint_as_float(p << 16) - 128.0f, hi = __uint_as_float(p & 0xffff0000u) - 128.0f;
        __nv_bfloat162 v = __floats2bfloat162_rn(fmaf(sc.s, lo, sc.b), fmaf(sc.s, hi, sc.b));
        return *reinterpret_cast<uint32_t *>(&v);
    }
}

template <int SD, int NT>
__global__ void __launch_bounds__(QGEMM_THREADS, 2) qgemm4_kernel(qgemm_args a) {
    typedef qgemm_shape<NT> S;
    extern __shared__ __align__(16) unsigned char qg_smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    /* this block's matrix (selected with constant indices: no local copy of the arguments) */
    int b = blockIdx.x, m = 0;
#pragma unroll
    for (int i = 1; i < 4; i++)
        if (i < a.n && b >= a.block_start[i]) m = i;
    const uint32_t *wdata = a.data[0];
    const void *wsc = a.scales[0], *wbi = a.biases[0];
    float *y = a.y[0], *partial = a.partial[0];
    int rows = a.rows[0], bstart = a.block_start[0];
#pragma unroll
    for (int i = 1; i < 4; i++)
        if (m == i) {
            wdata = a.data[i], wsc = a.scales[i], wbi = a.biases[i], y = a.y[i];
            partial = a.partial[i], rows = a.rows[i], bstart = a.block_start[i];
        }
    const int bm = (b - bstart) * QGEMM_BM, bn = blockIdx.y * S::BN;
    const int cols = a.cols, tokens = a.tokens, groups = cols >> a.group_shift;
    const int c0 = blockIdx.z * a.chunks_per_split;
    int n_chunks = cols / QGEMM_BK - c0;
    if (n_chunks > a.chunks_per_split) n_chunks = a.chunks_per_split;

    /* one stage's copies: 4 16-byte pieces of weights and NT of x per thread */
    auto issue = [&](int i) {
        if (i < n_chunks) {
            unsigned char *sa = qg_smem + (i % QGEMM_STAGES) * S::STAGE, *sx = sa + S::A_BYTES;
            const int64_t k0 = (int64_t)(c0 + i) * QGEMM_BK;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int p = tid + QGEMM_THREADS * j, r = p >> 2, part = p & 3;
                int row = bm + r;
                bool ok = row < rows;
                const unsigned char *src = (const unsigned char *)wdata +
                                           ((int64_t)(ok ? row : 0) * cols + k0) / 2 + 16 * part;
                qg_cp16(sa + r * 64 + 16 * part, src, ok);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                int p = tid + QGEMM_THREADS * j, tk = p >> 4, c = p & 15;
                int tok = bn + tk;
                bool ok = tok < tokens;
                const __nv_bfloat16 *src = a.x + (int64_t)(ok ? tok : 0) * cols + k0 + 8 * c;
                qg_cp16(sx + tk * 256 + 16 * (c ^ qg_swz(tk, c)), src, ok);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    /* this thread's 4 rows (r = 2 mt + h: row 32 warp + 16 mt + 8 h + g) and their scales */
    int64_t sidx[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        int row = bm + 32 * warp + 8 * r + g;
        sidx[r] = (int64_t)(row < rows ? row : 0) * groups;
    }
    auto load_scales = [&](int i, qg_scale<SD>(&sc)[4]) {
        if (i >= n_chunks) i = n_chunks - 1; /* past the end: a harmless re-read */
        int grp = (int)((((int64_t)(c0 + i) * QGEMM_BK) + 32 * t) >> a.group_shift);
#pragma unroll
        for (int r = 0; r < 4; r++) sc[r] = qg_load_scale<SD>(wsc, wbi, sidx[r] + grp);
    };

    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][j][e] = 0.0f;

    qg_scale<SD> sc0[4], sc1[4], sc2[4];
    load_scales(0, sc0);
    load_scales(1, sc1);
#pragma unroll
    for (int i = 0; i < QGEMM_STAGES - 1; i++) issue(i);

    for (int i = 0; i < n_chunks; i++) {
        load_scales(i + 2, sc2);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(QGEMM_STAGES - 2) : "memory");
        __syncthreads(); /* stage i is in; every warp is done with stage i - 1's slot */
        issue(i + QGEMM_STAGES - 1);
        const unsigned char *sa = qg_smem + (i % QGEMM_STAGES) * S::STAGE, *sx = sa + S::A_BYTES;
        uint4 wq[4];
#pragma unroll
        for (int r = 0; r < 4; r++) wq[r] = *(const uint4 *)(sa + (32 * warp + 8 * r + g) * 64 + 16 * t);
#pragma unroll
        for (int s = 0; s < 4; s++) {
            uint32_t av[4][4]; /* [row r][pair p]: nibbles p, p + 4 of word s */
#pragma unroll
            for (int r = 0; r < 4; r++) {
                uint32_t u = s == 0 ? wq[r].x : s == 1 ? wq[r].y : s == 2 ? wq[r].z : wq[r].w;
#pragma unroll
                for (int p = 0; p < 4; p++) av[r][p] = qg_dequant_pair<SD>(u, p, sc0[r]);
            }
            const int c = 4 * t + s;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int tk = 8 * j + g;
                uint4 xb = *(const uint4 *)(sx + tk * 256 + 16 * (c ^ qg_swz(tk, c)));
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    qg_mma(acc[mt][j], av[2 * mt][0], av[2 * mt + 1][0], av[2 * mt][1],
                           av[2 * mt + 1][1], xb.x, xb.y);
                    qg_mma(acc[mt][j], av[2 * mt][2], av[2 * mt + 1][2], av[2 * mt][3],
                           av[2 * mt + 1][3], xb.z, xb.w);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 4; r++) sc0[r] = sc1[r], sc1[r] = sc2[r];
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");

    /* accumulator (mt, j): e = 0, 1 row g, tokens 2t, 2t + 1; e = 2, 3 row g + 8 */
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int row = bm + 32 * warp + 16 * mt + 8 * (e >> 1) + g, tok = bn + 8 * j + 2 * t + (e & 1);
                if (row >= rows || tok >= tokens) continue;
                float v = acc[mt][j][e];
                if (partial) {
                    partial[((int64_t)blockIdx.z * tokens + tok) * rows + row] = v;
                } else {
                    float *o = y + (int64_t)tok * rows + row;
                    *o = a.accumulate ? *o + v : v;
                }
            }
}

/* y (+)= the sum of the splits' partial sums, in split order. */
__global__ void qgemm_reduce_kernel(const float *partial, int splits, int64_t n, float *y,
                                    int accumulate) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = 0;
    for (int s = 0; s < splits; s++) v += partial[s * n + i];
    y[i] = accumulate ? y[i] + v : v;
}

typedef void (*qgemm_fn)(qgemm_args);

template <int SD> static qgemm_fn qgemm_kernel_for(int nt) {
    return nt == 2 ? qgemm4_kernel<SD, 2> : nt == 4 ? qgemm4_kernel<SD, 4> : qgemm4_kernel<SD, 8>;
}

static int qgemm_tile_tokens(int64_t n) { return n <= 16 ? 2 : n <= 32 ? 4 : 8; }

static qgemm_fn qgemm_kernel(int sd, int nt) {
    return sd == DTYPE_BF16 ? qgemm_kernel_for<DTYPE_BF16>(nt)
           : sd == DTYPE_F16 ? qgemm_kernel_for<DTYPE_F16>(nt)
                             : qgemm_kernel_for<DTYPE_F32>(nt);
}

static size_t qgemm_smem(int nt) {
    return nt == 2 ? qgemm_shape<2>::SMEM : nt == 4 ? qgemm_shape<4>::SMEM : qgemm_shape<8>::SMEM;
}

/* Whether qgemm4 takes this matrix at this token count (others take the cuBLAS copy path). */
static int qgemm_applies(const cuda_ctx *c, const dev_matrix *m, int64_t n) {
    if (!c->qgemm || m->format != WEIGHT_MLX_AFFINE || m->bits != 4 || n <= GEMV_MAX_TOKENS ||
        n > QGEMM_MAX_TOKENS)
        return 0;
    if (m->group_size != 32 && m->group_size != 64 && m->group_size != 128) return 0;
    if (m->scale_dtype != DTYPE_BF16 && m->scale_dtype != DTYPE_F16 && m->scale_dtype != DTYPE_F32)
        return 0;
    if (m->cols % QGEMM_BK || m->cols > INT32_MAX / QGEMM_MAX_TOKENS || m->rows > INT32_MAX / 2 ||
        m->rows * m->cols / m->group_size > INT32_MAX)
        return 0;
    int nt = qgemm_tile_tokens(n);
    return dynamic_smem_limit((const void *)qgemm_kernel(m->scale_dtype, nt)) >= qgemm_smem(nt);
}

/* ys[i] (+)= W_i x for n (<= 4) matrices qgemm_applies takes, of one column count and scale
 * type; xq: x as qgemm_args.x says. */
static void qgemm4(cuda_ctx *c, int n, const dev_matrix *const *m, const void *xq,
                   float *const *ys, int64_t tokens, int accumulate) {
    qgemm_args a = {};
    int row_blocks = 0;
    for (int i = 0; i < n; i++) {
        a.data[i] = (const uint32_t *)m[i]->data, a.scales[i] = m[i]->scales;
        a.biases[i] = m[i]->biases, a.y[i] = ys[i], a.rows[i] = (int)m[i]->rows;
        a.block_start[i] = row_blocks;
        row_blocks += (int)((m[i]->rows + QGEMM_BM - 1) / QGEMM_BM);
    }
    a.block_start[n] = row_blocks;
    a.n = n, a.cols = (int)m[0]->cols, a.group_shift = m[0]->group_shift, a.tokens = (int)tokens;
    a.accumulate = accumulate, a.x = (const __nv_bfloat16 *)xq;
    int nt = qgemm_tile_tokens(tokens), bn = 8 * nt;
    int tok_blocks = (int)((tokens + bn - 1) / bn), chunks = a.cols / QGEMM_BK;
    /* split k while the grid is under one wave of 2 blocks an SM, each split >= 4 stages */
    int blocks = row_blocks * tok_blocks, splits = (2 * c->sm_count) / blocks;
    if (splits > chunks / 4) splits = chunks / 4;
    if (splits < 1) splits = 1;
    a.chunks_per_split = (chunks + splits - 1) / splits;
    splits = (chunks + a.chunks_per_split - 1) / a.chunks_per_split;
    if (splits > 1) {
        size_t total = 0;
        for (int i = 0; i < n; i++) total += (size_t)splits * (size_t)tokens * (size_t)m[i]->rows;
        float *p = (float *)cuda_scratch(c, SCRATCH_QGEMM, total * sizeof(float));
        if (!p) return;
        for (int i = 0; i < n; i++) {
            a.partial[i] = p;
            p += (size_t)splits * (size_t)tokens * (size_t)m[i]->rows;
        }
    }
    dim3 grid((unsigned)row_blocks, (unsigned)tok_blocks, (unsigned)splits);
    qgemm_kernel(m[0]->scale_dtype, nt)<<<grid, QGEMM_THREADS, qgemm_smem(nt), c->stream>>>(a);
    CUDA_LAUNCHED(c, "qgemm4");
    if (splits > 1)
        for (int i = 0; i < n; i++) {
            int64_t cnt = tokens * m[i]->rows;
            qgemm_reduce_kernel<<<cuda_blocks(cnt, 256), 256, 0, c->stream>>>(a.partial[i], splits,
                                                                              cnt, ys[i], accumulate);
            CUDA_LAUNCHED(c, "qgemm_reduce");
        }
}

/* n matrices sharing x (x' = silu(x) * up when up), each y[i] (+)= W_i x': x rounded to 16 bits
 * once for every matrix of the same width (bf16, or f16 for f16 weights). */
static void gemm_path_multi(cuda_ctx *c, int n, const dev_matrix *const *m, float *x,
                            const float *up, float *const *ys, int64_t tokens, int accumulate) {
    int f32 = 0, half_kinds = 0; /* bit 0: bf16 wanted, bit 1: f16 wanted */
    for (int i = 0; i < n; i++) {
        if (gemm_in_f32(m[i])) f32 = 1;
        else half_kinds |= m[i]->format == WEIGHT_F16 ? 2 : 1;
    }
    if (up && f32) { /* SGEMM reads float32 x: silu applied in place (backend.h allows it) */
        cuda_silu_mul_launch(c, x, up, tokens * m[0]->cols);
        up = NULL;
    }
    /* 4-bit matrices for qgemm4: x in its column order, one launch per scale type */
    int q[4] = {0, 0, 0, 0}, n_q = 0;
    for (int i = 0; i < n && i < 4; i++)
        if (!gemm_in_f32(m[i]) && m[i]->cols == m[0]->cols && qgemm_applies(c, m[i], tokens))
            q[i] = 1, n_q++;
    if (n_q) {
        const void *xq = half_x(c, x, up, tokens, m[0]->cols, 1, 1);
        if (!xq) return;
        const int sds[3] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
        for (int k = 0; k < 3; k++) {
            const dev_matrix *mq[4];
            float *yq[4];
            int nq = 0;
            for (int i = 0; i < n && i < 4; i++)
                if (q[i] && m[i]->scale_dtype == sds[k]) mq[nq] = m[i], yq[nq++] = ys[i];
            if (nq) qgemm4(c, nq, mq, xq, yq, tokens, accumulate);
        }
        half_kinds = 0;
        for (int i = 0; i < n; i++)
            if (!gemm_in_f32(m[i]) && !(i < 4 && q[i])) half_kinds |= m[i]->format == WEIGHT_F16 ? 2 : 1;
    }
    for (int bf16 = 1; bf16 >= 0; bf16--) {
        if (!(half_kinds & (bf16 ? 1 : 2))) continue;
        const void *xh = half_x(c, x, up, tokens, m[0]->cols, bf16, 0);
        if (!xh) return;
        for (int i = 0; i < n; i++) {
            if (gemm_in_f32(m[i]) || (m[i]->format != WEIGHT_F16) != bf16 || (i < 4 && q[i])) continue;
            gemm_half(c, m[i], xh, ys[i], tokens, accumulate);
        }
    }
    for (int i = 0; i < n; i++)
        if (gemm_in_f32(m[i])) gemm_f32(c, m[i], x, ys[i], tokens, accumulate);
}

static int use_gemv(const cuda_ctx *c, int64_t n) {
    return c->exact || n <= GEMV_MAX_TOKENS;
}

void cuda_matmul(cuda_ctx *c, const weight_matrix *w, const float *x, float *y, int64_t n) {
    const dev_matrix *m = cuda_weight(c, w);
    if (!m || n <= 0) return;
    if (use_gemv(c, n))
        gemv_tiles(c, 1, &m, x, NULL, &y, n, 0);
    else
        gemm_path_multi(c, 1, &m, (float *)x, NULL, &y, n, 0); /* x is written only with up */
}

/* silu(x) * x_up is applied where x is read anyway: by the persistent GEMV while staging x, by
 * the GEMM path while rounding x to 16 bits; the other GEMV kernels (and SGEMM) get it from the
 * silu_mul kernel first, in place (x may be overwritten, as backend.h allows). */
void cuda_matmul_fused(cuda_ctx *c, const weight_matrix *w, float *x, const float *x_up, float *y,
                       int64_t n, int accumulate) {
    const dev_matrix *m = cuda_weight(c, w);
    if (!m || n <= 0) return;
    if (!use_gemv(c, n)) {
        gemm_path_multi(c, 1, &m, x, x_up, &y, n, accumulate);
        return;
    }
    int fused = x_up && persist_applies(c, m, n);
    if (x_up && !fused) cuda_silu_mul_launch(c, x, x_up, n * m->cols);
    gemv_tiles(c, 1, &m, x, fused ? x_up : NULL, &y, n, accumulate);
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
        gemv_tiles(c, n, m, x, NULL, ys, n_tokens, 0);
        return;
    }
    if (n <= 4 && !use_gemv(c, n_tokens)) { /* x rounded to 16 bits once for all of them */
        gemm_path_multi(c, n, m, (float *)x, NULL, ys, n_tokens, 0);
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

/* ys[i] = W_i rmsnorm(x): the norm applied by the persistent GEMV while it stages x, where it
 * takes every matrix; else rmsnorm into xn, then the matmuls. */
void cuda_norm_matmul(cuda_ctx *c, const float *x, const float *norm_w, float eps, float *xn, int n,
                      const weight_matrix *const *w, float *const *ys, int64_t n_tokens) {
    const dev_matrix *m[4];
    int fused = n <= 4 && use_gemv(c, n_tokens);
    for (int i = 0; i < n && i < 4; i++) {
        m[i] = cuda_weight(c, w[i]);
        if (!m[i]) return;
        fused = fused && m[i]->kind == m[0]->kind && m[i]->scale_dtype == m[0]->scale_dtype &&
                persist_applies(c, m[i], n_tokens);
    }
    if (fused) {
        gemv_tiles(c, n, m, x, NULL, ys, n_tokens, 0, norm_w, eps);
        return;
    }
    cuda_rmsnorm_launch(c, x, norm_w, xn, n_tokens, w[0]->cols, eps);
    cuda_matmul_multi(c, n, w, xn, ys, n_tokens);
}
