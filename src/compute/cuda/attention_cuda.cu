/* Attention over the paged KV cache on the GPU, and the writes into it.
 *
 * One warp per (token, KV head): the query heads sharing that KV head (up to 8 at a time) are
 * done together, so each cached K/V row is read once per group. Lane j scores key base + j of
 * each chunk of 32 cached positions (its dot products over the whole head), the chunk's softmax
 * update is a warp max and sum, and for the weighted sum of V each lane owns the head dims
 * lane, lane + 32, ... -- an online softmax in float32 as the CPU reference (ops_attention.c).
 * Four warps of a block take four consecutive tokens of the batch: in a prefill chunk they read
 * the same cached rows, which the L1 then serves once.
 *
 * Flash-decoding split: when the batch has too few (token, KV head) pairs to fill the GPU, each
 * pair's chunks are dealt round-robin to `splits` warps (no host knowledge of the context length
 * is needed), which write partial (max, sum, weighted V) triples that a second kernel merges.
 *
 * Prefill runs (64 or more consecutive positions of one sequence in the batch, found from the
 * host copies of the batch layout) go to the tensor cores instead: the sequence's cached K and V
 * gathered into contiguous rows, then per query head S = Q K^T (cuBLAS, float32 out), a causal
 * softmax into P, and O = P V (cuBLAS), with Q and P in the cache's type (f16/bf16: 2^-11 and
 * 2^-9 relative rounding; an f32 cache keeps everything f32). EXO_CUDA_MATMUL=exact keeps every
 * token on the warp kernel.
 *
 * gpt-oss: a sliding window starts a token's positions later (both paths), and an attention sink
 * joins each softmax's denominator with a zero value row (attention_sink_norm, as the CPU's). */
#include "compute/cuda/cuda_internal.cuh"
#include "compute/ops_shared.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

#define ATT_WARPS 4
#define ATT_GROUP 8  /* query heads per pass */
#define ATT_DIMS 8   /* head dims per lane: head_dim <= 256 */
#define ATT_MAX_SPLITS 32

template <int T> __device__ __forceinline__ float kv_load(const void *base, int64_t i);
template <> __device__ __forceinline__ float kv_load<DTYPE_F32>(const void *base, int64_t i) {
    return ((const float *)base)[i];
}
template <> __device__ __forceinline__ float kv_load<DTYPE_F16>(const void *base, int64_t i) {
    return __half2float(((const __half *)base)[i]);
}
template <> __device__ __forceinline__ float kv_load<DTYPE_BF16>(const void *base, int64_t i) {
    return __uint_as_float((uint32_t)((const uint16_t *)base)[i] << 16);
}

/* 8 consecutive cached values from a 16-byte aligned offset. */
template <int T> __device__ __forceinline__ void kv_load8(const void *base, int64_t i, float *v) {
    if (T == DTYPE_F32) {
        float4 a = *(const float4 *)((const float *)base + i);
        float4 b = *(const float4 *)((const float *)base + i + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        uint4 u = *(const uint4 *)((const uint16_t *)base + i);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (T == DTYPE_BF16) {
                v[2 * k] = __uint_as_float(w[k] << 16);
                v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
            } else {
                float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[k]));
                v[2 * k] = f.x, v[2 * k + 1] = f.y;
            }
        }
    }
}

/* First cached position a token with n_ctx positions attends to (the window's start). */
__device__ __forceinline__ int att_first(const attention_batch &ab, int n_ctx) {
    return ab.window > 0 && n_ctx > ab.window ? n_ctx - ab.window : 0;
}

/* 1 / (the softmax's denominator) for running max m and sum l with head h's sink logit in it;
 * the accumulator is multiplied by it. Never overflows whichever of m and the sink is larger. */
__device__ __forceinline__ float attention_sink_norm(const float *sinks, int64_t h, float m, float l) {
    if (!sinks) return 1.0f / l;
    float sink = sinks[h];
    if (sink > m) {
        float c = __expf(m - sink);
        return c / (l * c + 1.0f);
    }
    return 1.0f / (l + __expf(sink - m));
}

struct att_args {
    const float *q;
    const void *k, *v;
    attention_batch ab;
    float *out;     /* splits == 1: the output */
    float *partial; /* splits > 1: [n_tokens][n_heads][splits][head_dim + 2] */
    int splits;
    int64_t t_begin, t_end; /* the batch tokens this launch serves */
};

/* DIMS: head dims per lane (head_dim <= 32 DIMS), so a 128-dim head's V loop holds 4 values a
 * row, not 8 with half of them predicated off. */
template <int T, bool VEC, int DIMS>
__global__ void __launch_bounds__(ATT_WARPS * 32) attention_kernel(att_args a) {
    extern __shared__ float q_smem[]; /* [ATT_WARPS][ATT_GROUP][head_dim] */
    const attention_batch &ab = a.ab;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t t = a.t_begin + (int64_t)blockIdx.x * ATT_WARPS + warp;
    if (t >= a.t_end) return; /* no block-wide barrier below */
    int kvh = blockIdx.y, split = blockIdx.z;
    int hd = ab.head_dim, nh = ab.n_heads, group = nh / ab.n_kv_heads;
    int64_t kv_dim = (int64_t)ab.n_kv_heads * hd;
    float *qs = q_smem + warp * ATT_GROUP * hd;
    const int32_t *table = ab.block_tables + ab.block_table_start[ab.seq_of_token[t]];
    int n_ctx = ab.positions[t] + 1, bs = ab.block_size, first = att_first(ab, n_ctx);
    for (int h0 = 0; h0 < group; h0 += ATT_GROUP) {
        int gc = group - h0 < ATT_GROUP ? group - h0 : ATT_GROUP;
        const float *qt = a.q + (t * nh + (int64_t)kvh * group + h0) * hd;
        if (VEC) { /* 16-byte loads, several in flight (one float a lane in series was ~5 us) */
#pragma unroll 4
            for (int i = lane; i < gc * hd / 4; i += 32) ((float4 *)qs)[i] = ((const float4 *)qt)[i];
        } else {
            for (int i = lane; i < gc * hd; i += 32) qs[i] = qt[i];
        }
        __syncwarp();
        /* VEC: the weighted sum of V takes rows in parallel -- lane l reads 16 bytes (dims
         * (l % lpr) * 8 ..) of row l / lpr of each step, lpr = head_dim / 8 lanes a row, so a
         * chunk's rows are all in flight at once (one row at a time, a lane reading its dims of
         * each, was a chain of ~30 dependent loads: most of the 23 us a decode step's attention
         * took); the lanes sharing dims are summed at the end. */
        const int lpr = hd / 8, rpi = 32 / lpr, my_row = lane / lpr, my_dim0 = (lane % lpr) * 8;
        constexpr int AD = VEC ? 8 : DIMS;
        float m[ATT_GROUP], l[ATT_GROUP], acc[ATT_GROUP][AD];
#pragma unroll
        for (int g = 0; g < ATT_GROUP; g++) {
            m[g] = -INFINITY;
            l[g] = 0;
#pragma unroll
            for (int i = 0; i < AD; i++) acc[g][i] = 0;
        }
        for (int base = first + split * 32; base < n_ctx; base += 32 * a.splits) {
            int p = base + lane;
            bool valid = p < n_ctx;
            int64_t row = 0;
            float s[ATT_GROUP];
#pragma unroll
            for (int g = 0; g < ATT_GROUP; g++) s[g] = 0;
            if (valid) {
                row = ((int64_t)table[p / bs] * bs + p % bs) * kv_dim + (int64_t)kvh * hd;
                if (VEC) { /* unrolled: several rows' 16-byte loads in flight, not one at a time */
#pragma unroll 16
                    for (int d = 0; d < hd; d += 8) {
                        float kv8[8];
                        kv_load8<T>(a.k, row + d, kv8);
#pragma unroll
                        for (int g = 0; g < ATT_GROUP; g++) {
                            if (g >= gc) break;
                            const float *qg = qs + g * hd + d;
#pragma unroll
                            for (int i = 0; i < 8; i++) s[g] = fmaf(qg[i], kv8[i], s[g]);
                        }
                    }
                } else {
                    for (int d = 0; d < hd; d++) {
                        float kd = kv_load<T>(a.k, row + d);
#pragma unroll
                        for (int g = 0; g < ATT_GROUP; g++)
                            if (g < gc) s[g] = fmaf(qs[g * hd + d], kd, s[g]);
                    }
                }
            }
            /* softmax update per head; s[g] becomes this lane's weight */
#pragma unroll
            for (int g = 0; g < ATT_GROUP; g++) {
                if (g >= gc) break;
                float sc = valid ? s[g] * ab.scale : -INFINITY;
                float cm = sc;
                for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
                float mn = fmaxf(m[g], cm);
                float corr = __expf(m[g] - mn); /* m = -inf at first: 0 */
                float w = valid ? __expf(sc - mn) : 0.0f;
                float ws = w;
                for (int o = 16; o > 0; o >>= 1) ws += __shfl_xor_sync(0xffffffffu, ws, o);
                l[g] = l[g] * corr + ws;
                m[g] = mn;
#pragma unroll
                for (int i = 0; i < AD; i++) acc[g][i] *= corr;
                s[g] = w;
            }
            int n_valid = n_ctx - base < 32 ? n_ctx - base : 32;
            if (VEC) {
#pragma unroll 16
                for (int j0 = 0; j0 < n_valid; j0 += rpi) {
                    int j = (j0 + my_row) & 31;
                    bool ok = my_row < rpi && j0 + my_row < n_valid;
                    int64_t rj = __shfl_sync(0xffffffffu, row, j);
                    float vv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                    if (ok) kv_load8<T>(a.v, rj + my_dim0, vv);
#pragma unroll
                    for (int g = 0; g < ATT_GROUP; g++) {
                        if (g >= gc) break;
                        float w = __shfl_sync(0xffffffffu, s[g], j);
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[g][i] = ok ? fmaf(w, vv[i], acc[g][i]) : acc[g][i];
                    }
                }
            } else {
#pragma unroll 8
                for (int j = 0; j < n_valid; j++) { /* unrolled for the same reason: V loads in flight */
                    int64_t rj = __shfl_sync(0xffffffffu, row, j);
                    float vv[DIMS];
#pragma unroll
                    for (int i = 0; i < DIMS; i++) {
                        int d = lane + 32 * i;
                        vv[i] = d < hd ? kv_load<T>(a.v, rj + d) : 0.0f;
                    }
#pragma unroll
                    for (int g = 0; g < ATT_GROUP; g++) {
                        if (g >= gc) break;
                        float w = __shfl_sync(0xffffffffu, s[g], j);
#pragma unroll
                        for (int i = 0; i < DIMS && i < AD; i++) acc[g][i] = fmaf(w, vv[i], acc[g][i]);
                    }
                }
            }
        }
        if (VEC) { /* sum the lanes sharing dims into lanes 0 .. lpr - 1 */
#pragma unroll
            for (int g = 0; g < ATT_GROUP; g++) {
                if (g >= gc) break;
#pragma unroll
                for (int i = 0; i < AD; i++) {
                    float v = acc[g][i];
                    for (int r = 1; r < rpi; r++) v += __shfl_sync(0xffffffffu, acc[g][i], (lane + r * lpr) & 31);
                    acc[g][i] = v;
                }
            }
        }
#pragma unroll
        for (int g = 0; g < ATT_GROUP; g++) {
            if (g >= gc) break;
            int64_t h = (int64_t)kvh * group + h0 + g;
            float *o = a.splits == 1 ? a.out + (t * nh + h) * hd
                                     : a.partial + ((t * nh + h) * a.splits + split) * (hd + 2);
            float scale = a.splits == 1 ? attention_sink_norm(ab.sinks, h, m[g], l[g]) : 1.0f;
            if (VEC) {
                if (lane < lpr) {
#pragma unroll
                    for (int i = 0; i < AD; i++) o[my_dim0 + i] = acc[g][i] * scale;
                }
            } else {
#pragma unroll
                for (int i = 0; i < AD; i++)
                    if (lane + 32 * i < hd) o[lane + 32 * i] = acc[g][i] * scale;
            }
            if (a.splits > 1 && lane == 0) o[hd] = m[g], o[hd + 1] = l[g];
        }
        __syncwarp();
    }
}

/* Merges the splits of one (token, head): weights e^(m_s - M), sums l_s e^(m_s - M). A split
 * that saw no position has m = -inf and weight 0. Each split's (m, l) is read once, by its own
 * thread, into shared memory (a loop over the splits in every thread was 7 us a decode step). */
__global__ void attention_merge_kernel(const float *partial, int splits, int hd, int64_t th0,
                                       const float *sinks, int n_heads, float *out) {
    __shared__ float ms[ATT_MAX_SPLITS], ws[ATT_MAX_SPLITS], norm;
    int64_t th = th0 + blockIdx.x;
    const float *p = partial + th * splits * (hd + 2);
    if (threadIdx.x < 32) {
        int s = threadIdx.x;
        float m = s < splits ? p[s * (hd + 2) + hd] : -INFINITY;
        float l = s < splits ? p[s * (hd + 2) + hd + 1] : 0.0f;
        float mx = m;
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float w = m == -INFINITY ? 0.0f : __expf(m - mx), lw = l * w;
        for (int o = 16; o > 0; o >>= 1) lw += __shfl_xor_sync(0xffffffffu, lw, o);
        if (s < ATT_MAX_SPLITS) ms[s] = m, ws[s] = w;
        if (s == 0) norm = attention_sink_norm(sinks, th % n_heads, mx, lw);
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0;
#pragma unroll 8
        for (int s = 0; s < splits; s++)
            if (ms[s] != -INFINITY) acc += p[s * (hd + 2) + d] * ws[s];
        out[th * hd + d] = acc * norm;
    }
}

template <int T, int DIMS>
static void launch_attention_dims(cuda_ctx *c, const att_args &a, dim3 grid, size_t smem) {
    if (a.ab.head_dim % 8 == 0)
        attention_kernel<T, true, DIMS><<<grid, ATT_WARPS * 32, smem, c->stream>>>(a);
    else
        attention_kernel<T, false, DIMS><<<grid, ATT_WARPS * 32, smem, c->stream>>>(a);
}

template <int T>
static void launch_attention(cuda_ctx *c, const att_args &a, dim3 grid, size_t smem) {
    int hd = a.ab.head_dim;
    if (hd <= 64) launch_attention_dims<T, 2>(c, a, grid, smem);
    else if (hd <= 128) launch_attention_dims<T, 4>(c, a, grid, smem);
    else launch_attention_dims<T, ATT_DIMS>(c, a, grid, smem);
}

/* The warp kernel over batch tokens [t0, t1). */
static void attention_warps(cuda_ctx *c, const float *q, const kv_layer *kv,
                            const attention_batch *ab, float *out, int64_t t0, int64_t t1) {
    int hd = ab->head_dim;
    if (t1 <= t0) return;
    /* enough warps for every multiprocessor several times over: ~132 SMs x 16 warps */
    int64_t pairs = (t1 - t0) * ab->n_kv_heads;
    int splits = 1;
    while (splits < ATT_MAX_SPLITS && pairs * splits < 2048) splits *= 2;
    att_args a;
    a.q = q;
    a.k = kv->k;
    a.v = kv->v;
    a.ab = *ab;
    a.out = out;
    a.splits = splits;
    a.partial = NULL;
    a.t_begin = t0;
    a.t_end = t1;
    if (splits > 1) {
        size_t bytes = (size_t)ab->n_tokens * ab->n_heads * splits * (hd + 2) * sizeof(float);
        a.partial = (float *)cuda_scratch(c, SCRATCH_ATTENTION, bytes);
        if (!a.partial) return;
    }
    dim3 grid(cuda_blocks(t1 - t0, ATT_WARPS), ab->n_kv_heads, splits);
    size_t smem = (size_t)ATT_WARPS * ATT_GROUP * hd * sizeof(float);
    switch (kv->type) {
    case DTYPE_F16: launch_attention<DTYPE_F16>(c, a, grid, smem); break;
    case DTYPE_BF16: launch_attention<DTYPE_BF16>(c, a, grid, smem); break;
    default: launch_attention<DTYPE_F32>(c, a, grid, smem); break;
    }
    CUDA_LAUNCHED(c, "attention");
    if (splits > 1) {
        attention_merge_kernel<<<(unsigned)((t1 - t0) * ab->n_heads), hd < 128 ? 32 : 128, 0,
                                 c->stream>>>(a.partial, splits, hd, t0 * ab->n_heads, ab->sinks,
                                              ab->n_heads, out);
        CUDA_LAUNCHED(c, "attention_merge");
    }
}

/* ---- prefill runs on the tensor cores ---------------------------------------------------- */

#define ATT_GEMM_MIN_RUN 64

/* Rows 0..ctx-1 of one sequence's cache, in position order (elements of es bytes). */
__global__ void gather_kv_kernel(const void *k, const void *v, const int32_t *table, int bs,
                                 int64_t kv_dim, int es, void *kc, void *vc) {
    int64_t p = blockIdx.x, slot = (int64_t)table[p / bs] * bs + p % bs;
    for (int64_t d = threadIdx.x; d < kv_dim; d += blockDim.x) {
        if (es == 4) {
            ((float *)kc)[p * kv_dim + d] = ((const float *)k)[slot * kv_dim + d];
            ((float *)vc)[p * kv_dim + d] = ((const float *)v)[slot * kv_dim + d];
        } else {
            ((uint16_t *)kc)[p * kv_dim + d] = ((const uint16_t *)k)[slot * kv_dim + d];
            ((uint16_t *)vc)[p * kv_dim + d] = ((const uint16_t *)v)[slot * kv_dim + d];
        }
    }
}

template <int T> __device__ __forceinline__ void store_elem(void *base, int64_t i, float v) {
    if (T == DTYPE_F16) ((__half *)base)[i] = __float2half_rn(v);
    else if (T == DTYPE_BF16) ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(v);
    else ((float *)base)[i] = v;
}

template <int T> __global__ void convert_kernel(const float *x, int64_t n, void *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store_elem<T>(out, i, x[i]);
}

/* Row (head h, run token i) of S [n_heads][n_run][ctx]: softmax over the positions up to the
 * token's own (pos0 + i) -- from the window's start, with the head's sink in the denominator
 * (gpt-oss) -- zeros elsewhere, into P of the cache's type. */
template <int T>
__global__ void causal_softmax_kernel(const float *s, int64_t n_run, int64_t ctx, int pos0,
                                      attention_batch ab, void *p) {
    __shared__ float red[32];
    int64_t row = blockIdx.x, i = row % n_run, h = row / n_run;
    int64_t last = pos0 + i; /* attends to first..last */
    int64_t first = att_first(ab, (int)last + 1);
    const float *sr = s + row * ctx;
    float mx = ab.sinks ? ab.sinks[h] : -INFINITY;
    for (int64_t j = first + threadIdx.x; j <= last; j += blockDim.x) mx = fmaxf(mx, sr[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) mx = fmaxf(mx, red[w]);
    __syncthreads();
    float sum = 0;
    for (int64_t j = first + threadIdx.x; j <= last; j += blockDim.x) sum += __expf(sr[j] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
    __syncthreads();
    sum = ab.sinks ? __expf(ab.sinks[h] - mx) : 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) sum += red[w];
    float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < ctx; j += blockDim.x)
        store_elem<T>(p, row * ctx + j, j >= first && j <= last ? __expf(sr[j] - mx) * inv : 0.0f);
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Batch tokens [t0, t1): one sequence at positions pos0 .. pos0 + (t1 - t0) - 1, its block table
 * at device offset table_off. */
static void attention_gemm_run(cuda_ctx *c, const float *q, const kv_layer *kv,
                               const attention_batch *ab, float *out, int64_t t0, int64_t t1,
                               int pos0, int table_off) {
    int64_t nr = t1 - t0, ctx = pos0 + nr, nh = ab->n_heads, nkv = ab->n_kv_heads,
            hd = ab->head_dim, group = nh / nkv, kv_dim = nkv * hd;
    int es = kv->type == DTYPE_F32 ? 4 : 2;
    cudaDataType ct = kv->type == DTYPE_F16 ? CUDA_R_16F : kv->type == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    size_t kv_bytes = align256((size_t)(ctx * kv_dim) * es), q_bytes = align256((size_t)(nr * nh * hd) * es);
    size_t s_bytes = align256((size_t)(nh * nr * ctx) * 4), p_bytes = align256((size_t)(nh * nr * ctx) * es);
    char *buf = (char *)cuda_scratch(c, SCRATCH_ATT_GEMM, 2 * kv_bytes + q_bytes + s_bytes + p_bytes);
    if (!buf) return;
    char *kc = buf, *vc = kc + kv_bytes, *qh = vc + kv_bytes, *p = qh + q_bytes + s_bytes;
    float *s = (float *)(qh + q_bytes);
    gather_kv_kernel<<<(unsigned)ctx, 256, 0, c->stream>>>(kv->k, kv->v, ab->block_tables + table_off,
                                                           ab->block_size, kv_dim, es, kc, vc);
    int64_t qn = nr * nh * hd;
    const float *qt = q + t0 * nh * hd;
    unsigned rows = (unsigned)(nh * nr);
    switch (kv->type) {
    case DTYPE_F16:
        convert_kernel<DTYPE_F16><<<cuda_blocks(qn, 256), 256, 0, c->stream>>>(qt, qn, qh);
        break;
    case DTYPE_BF16:
        convert_kernel<DTYPE_BF16><<<cuda_blocks(qn, 256), 256, 0, c->stream>>>(qt, qn, qh);
        break;
    default: convert_kernel<DTYPE_F32><<<cuda_blocks(qn, 256), 256, 0, c->stream>>>(qt, qn, qh);
    }
    CUDA_LAUNCHED(c, "attention gather");
    const float zero = 0.0f, one = 1.0f, scale = ab->scale;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int64_t g = 0; g < group && st == CUBLAS_STATUS_SUCCESS; g++) /* S = scale Q K^T */
        st = cublasGemmStridedBatchedEx(
            c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)ctx, (int)nr, (int)hd, &scale, kc, ct,
            (int)kv_dim, hd, qh + g * hd * es, ct, (int)(nh * hd), group * hd, &zero,
            s + g * nr * ctx, CUDA_R_32F, (int)ctx, group * nr * ctx, (int)nkv,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    switch (kv->type) {
    case DTYPE_F16: causal_softmax_kernel<DTYPE_F16><<<rows, 256, 0, c->stream>>>(s, nr, ctx, pos0, *ab, p); break;
    case DTYPE_BF16: causal_softmax_kernel<DTYPE_BF16><<<rows, 256, 0, c->stream>>>(s, nr, ctx, pos0, *ab, p); break;
    default: causal_softmax_kernel<DTYPE_F32><<<rows, 256, 0, c->stream>>>(s, nr, ctx, pos0, *ab, p);
    }
    CUDA_LAUNCHED(c, "attention softmax");
    for (int64_t g = 0; g < group && st == CUBLAS_STATUS_SUCCESS; g++) /* O = P V */
        st = cublasGemmStridedBatchedEx(
            c->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)hd, (int)nr, (int)ctx, &one, vc, ct,
            (int)kv_dim, hd, p + g * nr * ctx * es, ct, (int)ctx, group * nr * ctx, &zero,
            out + t0 * nh * hd + g * hd, CUDA_R_32F, (int)(nh * hd), group * hd, (int)nkv,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        char msg[64];
        snprintf(msg, sizeof msg, "status %d", (int)st);
        cuda_fail(c, "cuBLAS (attention)", msg);
    }
}

void cuda_attention(cuda_ctx *c, const float *q, const kv_layer *kv, const attention_batch *ab,
                    float *out) {
    int64_t n = ab->n_tokens;
    if (n <= 0) return;
    if (ab->head_dim > 32 * ATT_DIMS || ab->n_heads % ab->n_kv_heads) {
        cuda_fail(c, "attention", "head_dim over 256 or heads not a multiple of KV heads");
        return;
    }
    const int32_t *pos = ab->host_positions, *seq = ab->host_seq_of_token;
    if (c->exact || !pos || !seq || !ab->host_block_table_start || n < ATT_GEMM_MIN_RUN) {
        attention_warps(c, q, kv, ab, out, 0, n);
        return;
    }
    int64_t warp_from = 0;
    for (int64_t t = 0; t < n;) {
        int64_t e = t + 1;
        while (e < n && seq[e] == seq[t] && pos[e] == pos[e - 1] + 1) e++;
        if (e - t >= ATT_GEMM_MIN_RUN) {
            attention_warps(c, q, kv, ab, out, warp_from, t);
            attention_gemm_run(c, q, kv, ab, out, t, e, pos[t], ab->host_block_table_start[seq[t]]);
            warp_from = e;
        }
        t = e;
    }
    attention_warps(c, q, kv, ab, out, warp_from, n);
}

/* Rounds to nearest even like the CPU's f32_to_f16 / f32_to_bf16. */
template <int T> __device__ __forceinline__ void kv_store(void *base, int64_t i, float v) {
    if (T == DTYPE_F16)
        ((__half *)base)[i] = __float2half_rn(v);
    else if (T == DTYPE_BF16)
        ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(v);
    else
        ((float *)base)[i] = v;
}

template <int T>
__global__ void kv_write_kernel(void *kc, void *vc, const float *k, const float *v,
                                const int32_t *slots, int64_t n, int64_t kv_dim) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * kv_dim) return;
    int64_t t = i / kv_dim, d = i % kv_dim, dst = (int64_t)slots[t] * kv_dim + d;
    kv_store<T>(kc, dst, k[i]);
    kv_store<T>(vc, dst, v[i]);
}

void cuda_kv_write(cuda_ctx *c, const kv_layer *kv, const float *k, const float *v,
                   const int32_t *slots, int64_t n, int64_t kv_dim) {
    if (n <= 0) return;
    unsigned blocks = cuda_blocks(n * kv_dim, 256);
    switch (kv->type) {
    case DTYPE_F16: kv_write_kernel<DTYPE_F16><<<blocks, 256, 0, c->stream>>>(kv->k, kv->v, k, v, slots, n, kv_dim); break;
    case DTYPE_BF16: kv_write_kernel<DTYPE_BF16><<<blocks, 256, 0, c->stream>>>(kv->k, kv->v, k, v, slots, n, kv_dim); break;
    default: kv_write_kernel<DTYPE_F32><<<blocks, 256, 0, c->stream>>>(kv->k, kv->v, k, v, slots, n, kv_dim); break;
    }
    CUDA_LAUNCHED(c, "kv_write");
}

/* One thread per item of a token (blockIdx.y): a rotary pair of a q head, a rotary pair of a k
 * head (rotated, and both values stored into the cache), a k value past the rotary dims, or a v
 * value; each thread computes its own cos and sin. Spread over many blocks: one block per token
 * took 10 us a decode step on the H200 (its loops' loads and stores in series). */
#define ROPE_MAX_PAIRS 128 /* head_dim <= 256 (attention refuses more) */
#define ROPE_THREADS 256
template <int T>
__global__ void rope_kv_write_kernel(float *q, float *k, const float *v, const int32_t *pos,
                                     int64_t n, int n_heads, int n_kv_heads, int head_dim, int half,
                                     const float *inv_freq, float attn_factor, void *kc, void *vc,
                                     const int32_t *slots) {
    const int64_t kv_dim = (int64_t)n_kv_heads * head_dim;
    const int q_items = n_heads * half, k_rot = n_kv_heads * half, rest = head_dim - 2 * half,
              k_rest = n_kv_heads * rest;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
        int64_t dst = (int64_t)slots[t] * kv_dim;
        float cs, sn;
        if (i < q_items) {
            int h = i / half, p = i % half;
            rope_cos_sin(pos[t], inv_freq[p], attn_factor, &cs, &sn);
            ops_rope_rotate_pair(q + (t * n_heads + h) * head_dim, 1, head_dim, p, half, cs, sn);
        } else if (i < q_items + k_rot) {
            int j = i - q_items, h = j / half, p = j % half;
            float *kh = k + t * kv_dim + (int64_t)h * head_dim;
            rope_cos_sin(pos[t], inv_freq[p], attn_factor, &cs, &sn);
            ops_rope_rotate_pair(kh, 1, head_dim, p, half, cs, sn);
            kv_store<T>(kc, dst + (int64_t)h * head_dim + p, kh[p]);
            kv_store<T>(kc, dst + (int64_t)h * head_dim + p + half, kh[p + half]);
        } else if (i < q_items + k_rot + k_rest) {
            int j = i - q_items - k_rot, h = j / rest;
            int64_t d = (int64_t)h * head_dim + 2 * half + j % rest;
            kv_store<T>(kc, dst + d, k[t * kv_dim + d]);
        } else if (i < q_items + k_rot + k_rest + kv_dim) {
            int64_t d = i - q_items - k_rot - k_rest;
            kv_store<T>(vc, dst + d, v[t * kv_dim + d]);
        }
    }
}

void cuda_rope_kv_write(cuda_ctx *c, float *q, float *k, const float *v, const int32_t *pos,
                        int64_t n, int n_heads, int n_kv_heads, int head_dim, int rot_dims,
                        const float *inv_freq, float attn_factor, const kv_layer *kv,
                        const int32_t *slots) {
    int half = rot_dims / 2;
    if (n <= 0) return;
    if (half > ROPE_MAX_PAIRS) {
        cuda_fail(c, "rope_kv_write", "more than 256 rotary dims");
        return;
    }
    int64_t items = (int64_t)(n_heads + n_kv_heads) * half + (int64_t)n_kv_heads * (head_dim - 2 * half) +
                    (int64_t)n_kv_heads * head_dim;
    dim3 grid(cuda_blocks(items, ROPE_THREADS), (unsigned)(n < 65535 ? n : 65535));
    switch (kv->type) {
#define LAUNCH(T)                                                                                \
    rope_kv_write_kernel<T><<<grid, ROPE_THREADS, 0, c->stream>>>(q, k, v, pos, n, n_heads,       \
                                                                  n_kv_heads, head_dim, half,      \
                                                                  inv_freq, attn_factor, kv->k,    \
                                                                  kv->v, slots)
    case DTYPE_F16: LAUNCH(DTYPE_F16); break;
    case DTYPE_BF16: LAUNCH(DTYPE_BF16); break;
    default: LAUNCH(DTYPE_F32); break;
#undef LAUNCH
    }
    CUDA_LAUNCHED(c, "rope_kv_write");
}
