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

#define ATT_TILE 32        /* cached positions a warp takes at a time */
#define ATT_MAX_WARPS 4
#define ATT_MAX_SPLITS 32
#define ATT_SMEM_BUDGET (96 * 1024) /* a block's tile buffers: 4 warps of bf16 128-dim rows */

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
    int *done;      /* splits > 1: [n_tokens][n_kv_heads][passes] blocks finished, back to 0 */
    int splits, passes;
    int pitch;      /* bytes of a cached row in shared memory (16-byte multiple + 16) */
    int cp;         /* bytes a cp.async copies: 16, or 8 for 16-bit rows of 4k + 2 (mod 8) values */
    int64_t t_begin, t_end; /* the batch tokens this launch serves */
};

template <int N> __device__ __forceinline__ void cp_async(void *smem, const void *gmem) {
    if (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
                     "l"(gmem) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
                     "l"(gmem), "n"(N) : "memory");
}

/* 4 consecutive values of a row in shared memory (8- or 16-byte aligned). */
template <int T> __device__ __forceinline__ void smem_load4(const char *p, float *v) {
    if (T == DTYPE_F32) {
        float4 f = *(const float4 *)p;
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
        uint2 u = *(const uint2 *)p;
        if (T == DTYPE_BF16) {
            v[0] = __uint_as_float(u.x << 16), v[1] = __uint_as_float(u.x & 0xffff0000u);
            v[2] = __uint_as_float(u.y << 16), v[3] = __uint_as_float(u.y & 0xffff0000u);
        } else {
            float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x));
            float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
            v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
        }
    }
}

/* Decode (and short prefill chunks) over the paged cache: a block of up to 4 warps per (token,
 * KV head, group pass, split), G query heads of the KV head together so each cached row is read
 * once for all of them. A warp takes tiles of 32 cached positions -- tile split + splits (warp +
 * warps i) of the token's window -- and for each copies the tile's K and V rows into shared memory
 * with cp.async (a rolled loop issues every copy before any is waited for: one memory round trip
 * a tile), then lane j scores position j against the G query heads (q in shared memory), an
 * online softmax in float32 as the CPU reference (ops_attention.c), and each lane sums V over the
 * tile for its DPL head dims. The warps' (max, sum, weighted V) are combined through shared
 * memory at the end. The loops stay rolled: the previous kernel, fully unrolled, spent 61-67% of
 * its time waiting on instruction fetch (ncu, H200) at one warp per scheduler.
 *
 * Flash-decoding split: with few (token, KV head) pairs a token's tiles are dealt to `splits`
 * blocks (no host knowledge of the context length is needed). Each writes its partial (max, sum,
 * weighted V); the last block of a (token, KV head, pass) to finish -- counted with an atomic --
 * merges them in split order (deterministic) and resets the count, so no second kernel runs. */
template <int T, int G, int DPL>
__global__ void __launch_bounds__(ATT_MAX_WARPS * 32) attention_tile_kernel(att_args a) {
    extern __shared__ float4 att_smem4[];
    float *qs = (float *)att_smem4; /* [G][head_dim], then per warp: K tile, V tile, weights */
    __shared__ int last_block;
    const attention_batch &ab = a.ab;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int hd = ab.head_dim, nh = ab.n_heads, group = nh / ab.n_kv_heads;
    const int kvh = blockIdx.x / a.passes, pass = blockIdx.x % a.passes, split = blockIdx.z;
    const int h0 = kvh * group + pass * G, gc = group - pass * G < G ? group - pass * G : G;
    const int64_t kv_dim = (int64_t)ab.n_kv_heads * hd;
    const int es = T == DTYPE_F32 ? 4 : 2, row_bytes = hd * es, cpr = row_bytes / a.cp;
    char *tiles = (char *)(qs + G * hd);
    char *sk = tiles + (size_t)warp * (2 * ATT_TILE * a.pitch + G * ATT_TILE * 4);
    char *sv = sk + ATT_TILE * a.pitch;
    float *sw = (float *)(sv + ATT_TILE * a.pitch); /* [G][32] this tile's softmax weights */
    pdl_trigger();
    pdl_wait();
    for (int64_t t = a.t_begin + blockIdx.y; t < a.t_end; t += gridDim.y) {
        for (int i = threadIdx.x; i < gc * hd; i += blockDim.x) qs[i] = a.q[(t * nh + h0) * hd + i];
        __syncthreads();
        const int32_t *table = ab.block_tables + ab.block_table_start[ab.seq_of_token[t]];
        const int n_ctx = ab.positions[t] + 1, bs = ab.block_size, first = att_first(ab, n_ctx);
        float m[G], l[G], acc[G][DPL];
#pragma unroll
        for (int g = 0; g < G; g++) {
            m[g] = -INFINITY, l[g] = 0;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[g][i] = 0;
        }
        for (int tile = split + a.splits * warp;; tile += a.splits * nw) {
            const int base = first + tile * ATT_TILE;
            if (base >= n_ctx) break;
            const int n_valid = n_ctx - base < ATT_TILE ? n_ctx - base : ATT_TILE, p = base + lane;
            /* byte offset of this lane's position's row (K and V alike) */
            const int64_t row = p < n_ctx ? (((int64_t)table[p / bs] * bs + p % bs) * kv_dim + (int64_t)kvh * hd) * es : 0;
            for (int i0 = 0; i0 < n_valid * cpr; i0 += 32) { /* uniform trip count: shuffles */
                int i = i0 + lane, j = i / cpr;
                int64_t rj = __shfl_sync(0xffffffffu, row, j < 32 ? j : 31);
                if (i < n_valid * cpr) {
                    int off = (i - j * cpr) * a.cp;
                    if (a.cp == 16) {
                        cp_async<16>(sk + j * a.pitch + off, (const char *)a.k + rj + off);
                        cp_async<16>(sv + j * a.pitch + off, (const char *)a.v + rj + off);
                    } else {
                        cp_async<8>(sk + j * a.pitch + off, (const char *)a.k + rj + off);
                        cp_async<8>(sv + j * a.pitch + off, (const char *)a.v + rj + off);
                    }
                }
            }
            asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
            __syncwarp();
            float s[G];
#pragma unroll
            for (int g = 0; g < G; g++) s[g] = 0;
            if (lane < n_valid) {
                const char *kr = sk + lane * a.pitch;
#pragma unroll 2
                for (int d = 0; d < hd; d += 4) {
                    float kv4[4];
                    smem_load4<T>(kr + d * es, kv4);
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        float4 qg = *(const float4 *)(qs + g * hd + d);
                        s[g] = fmaf(qg.x, kv4[0], fmaf(qg.y, kv4[1], fmaf(qg.z, kv4[2], fmaf(qg.w, kv4[3], s[g]))));
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < G; g++) { /* online softmax; sw[g][j] becomes position j's weight */
                bool valid = lane < n_valid && g < gc;
                float sc = valid ? s[g] * ab.scale : -INFINITY;
                float cm = sc;
                for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
                float mn = fmaxf(m[g], cm);
                float corr = mn == -INFINITY ? 1.0f : __expf(m[g] - mn);
                float w = valid ? __expf(sc - mn) : 0.0f;
                float ws = w;
                for (int o = 16; o > 0; o >>= 1) ws += __shfl_xor_sync(0xffffffffu, ws, o);
                l[g] = l[g] * corr + ws;
                m[g] = mn;
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[g][i] *= corr;
                sw[g * ATT_TILE + lane] = w;
            }
            __syncwarp();
            const int d0 = lane * DPL;
            if (d0 < hd) {
#pragma unroll 2
                for (int j = 0; j < n_valid; j++) {
                    float vv[DPL];
                    const char *vr = sv + j * a.pitch + d0 * es;
                    if (DPL >= 4) {
#pragma unroll
                        for (int i = 0; i < DPL; i += 4) smem_load4<T>(vr + i * es, vv + i);
                    } else {
#pragma unroll
                        for (int i = 0; i < DPL; i++) vv[i] = kv_load<T>(vr, i);
                    }
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        float w = sw[g * ATT_TILE + j];
#pragma unroll
                        for (int i = 0; i < DPL; i++) acc[g][i] = fmaf(w, vv[i], acc[g][i]);
                    }
                }
            }
            __syncwarp(); /* the tile's buffers are read before the next tile's copies land */
        }
        /* combine the warps: [warp][g][head_dim + 2] (acc, m, l) over the tile buffers */
        __syncthreads();
        float *cb = (float *)tiles;
        const int cs = hd + 2;
#pragma unroll
        for (int g = 0; g < G; g++) {
            float *o = cb + (warp * G + g) * cs;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (lane * DPL + i < hd) o[lane * DPL + i] = acc[g][i];
            if (lane == 0) o[hd] = m[g], o[hd + 1] = l[g];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < gc * hd; i += blockDim.x) {
            const int g = i / hd, d = i % hd;
            float mx = -INFINITY;
            for (int w = 0; w < nw; w++) mx = fmaxf(mx, cb[(w * G + g) * cs + hd]);
            float o = 0, sum = 0;
            for (int w = 0; w < nw; w++) {
                const float *c = cb + (w * G + g) * cs;
                if (c[hd] == -INFINITY) continue; /* saw no position */
                float e = __expf(c[hd] - mx);
                o += c[d] * e;
                sum += c[hd + 1] * e;
            }
            const int64_t h = h0 + g;
            if (a.splits == 1) {
                a.out[(t * nh + h) * hd + d] = o * attention_sink_norm(ab.sinks, h, mx, sum);
            } else {
                float *pp = a.partial + ((t * nh + h) * a.splits + split) * cs;
                pp[d] = o;
                if (d == 0) pp[hd] = mx, pp[hd + 1] = sum;
            }
        }
        if (a.splits > 1) { /* the last block of this (token, KV head, pass) merges the splits */
            __threadfence();
            __syncthreads();
            int *done = a.done + (t * ab.n_kv_heads + kvh) * a.passes + pass;
            if (threadIdx.x == 0) last_block = atomicAdd(done, 1) == a.splits - 1;
            __syncthreads();
            if (last_block) {
                __threadfence();
                /* per head: the splits' weights e^(m_s - M) into cb, then 1 / the denominator */
                float *wts = cb; /* [G][splits + 1] */
                for (int g = warp; g < gc; g += nw) {
                    const int64_t h = h0 + g;
                    const float *pp = a.partial + (t * nh + h) * a.splits * cs;
                    float ms = lane < a.splits ? __ldcg(pp + lane * cs + hd) : -INFINITY;
                    float ls = lane < a.splits ? __ldcg(pp + lane * cs + hd + 1) : 0.0f;
                    float mx = ms;
                    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                    float e = ms == -INFINITY ? 0.0f : __expf(ms - mx), le = ls * e;
                    for (int o = 16; o > 0; o >>= 1) le += __shfl_xor_sync(0xffffffffu, le, o);
                    if (lane < a.splits) wts[g * (ATT_MAX_SPLITS + 1) + lane] = e;
                    if (lane == 0) wts[g * (ATT_MAX_SPLITS + 1) + ATT_MAX_SPLITS] = attention_sink_norm(ab.sinks, h, mx, le);
                }
                __syncthreads();
                for (int i = threadIdx.x; i < gc * hd; i += blockDim.x) {
                    const int g = i / hd, d = i % hd;
                    const int64_t h = h0 + g;
                    const float *pp = a.partial + (t * nh + h) * a.splits * cs;
                    const float *wg = wts + g * (ATT_MAX_SPLITS + 1);
                    float o = 0;
                    for (int sp = 0; sp < a.splits; sp++)
                        if (wg[sp] != 0.0f) o += __ldcg(pp + sp * cs + d) * wg[sp];
                    a.out[(t * nh + h) * hd + d] = o * wg[ATT_MAX_SPLITS];
                }
                if (threadIdx.x == 0) *done = 0;
            }
        }
        __syncthreads(); /* qs and the buffers are free for the next token */
    }
}

/* Dims per lane of the V sum: head_dim <= 32 DPL. */
template <int T, int G>
static void launch_attention_g(cuda_ctx *c, const att_args &a, dim3 grid, int warps, size_t smem) {
    int hd = a.ab.head_dim;
    const void *fn;
    if (hd <= 32) fn = (const void *)attention_tile_kernel<T, G, 1>;
    else if (hd <= 64) fn = (const void *)attention_tile_kernel<T, G, 2>;
    else if (hd <= 128) fn = (const void *)attention_tile_kernel<T, G, 4>;
    else fn = (const void *)attention_tile_kernel<T, G, 8>;
    /* above 48 KB a kernel must ask, once (the largest asked for so far, per kernel) */
    static const void *fns[64];
    static size_t raised[64];
    int k = 0;
    while (k < 64 && fns[k] && fns[k] != fn) k++;
    if (smem > 48 * 1024 && (k == 64 || !fns[k] || raised[k] < smem)) {
        if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
            cudaGetLastError();
            cuda_fail(c, "attention", "cannot raise the kernel's shared memory");
            return;
        }
        if (k < 64) fns[k] = fn, raised[k] = smem;
    }
    if (hd <= 32) launch_pdl(c, attention_tile_kernel<T, G, 1>, grid, dim3(warps * 32), smem, a);
    else if (hd <= 64) launch_pdl(c, attention_tile_kernel<T, G, 2>, grid, dim3(warps * 32), smem, a);
    else if (hd <= 128) launch_pdl(c, attention_tile_kernel<T, G, 4>, grid, dim3(warps * 32), smem, a);
    else launch_pdl(c, attention_tile_kernel<T, G, 8>, grid, dim3(warps * 32), smem, a);
}

template <int T> static void launch_attention(cuda_ctx *c, const att_args &a, int G, dim3 grid, int warps, size_t smem) {
    switch (G) {
    case 1: launch_attention_g<T, 1>(c, a, grid, warps, smem); break;
    case 2: launch_attention_g<T, 2>(c, a, grid, warps, smem); break;
    case 4: launch_attention_g<T, 4>(c, a, grid, warps, smem); break;
    default: launch_attention_g<T, 8>(c, a, grid, warps, smem); break;
    }
}

/* The tile kernel over batch tokens [t0, t1). */
static void attention_warps(cuda_ctx *c, const float *q, const kv_layer *kv,
                            const attention_batch *ab, float *out, int64_t t0, int64_t t1) {
    int hd = ab->head_dim, group = ab->n_heads / ab->n_kv_heads;
    if (t1 <= t0) return;
    int G = group >= 8 ? 8 : group >= 4 ? 4 : group >= 2 ? 2 : 1; /* heads a pass (a power of 2) */
    if (G < group && G < 8) G *= 2;
    int passes = (group + G - 1) / G, es = kv->type == DTYPE_F32 ? 4 : 2;
    att_args a;
    a.q = q;
    a.k = kv->k;
    a.v = kv->v;
    a.ab = *ab;
    a.out = out;
    a.partial = NULL;
    a.done = NULL;
    a.passes = passes;
    a.cp = hd * es % 16 == 0 ? 16 : 8;
    a.pitch = (hd * es + 15) / 16 * 16 + 16; /* rows 16 bytes apart in banks: conflict-free */
    a.t_begin = t0;
    a.t_end = t1;
    /* warps a block: up to 4, as the shared memory budget allows (f32 rows of 256 dims: 1) */
    size_t per_warp = 2 * (size_t)ATT_TILE * a.pitch + (size_t)G * ATT_TILE * 4;
    int warps = (int)(ATT_SMEM_BUDGET / per_warp);
    warps = warps < 1 ? 1 : warps > ATT_MAX_WARPS ? ATT_MAX_WARPS : warps;
    size_t comb = (size_t)warps * G * (hd + 2) * 4, merge = (size_t)G * (ATT_MAX_SPLITS + 1) * 4;
    size_t tiles = (size_t)warps * per_warp;
    if (tiles < comb) tiles = comb;
    if (tiles < merge) tiles = merge;
    size_t smem = (size_t)G * hd * 4 + tiles;
    /* split the positions while the blocks would not fill the GPU twice over */
    int64_t ntok = t1 - t0, blocks = ntok * ab->n_kv_heads * passes;
    int splits = 1;
    while (splits < ATT_MAX_SPLITS && blocks * splits < 2 * c->sm_count) splits *= 2;
    a.splits = splits;
    if (splits > 1) {
        size_t pbytes = (size_t)ab->n_tokens * ab->n_heads * splits * (hd + 2) * sizeof(float);
        a.partial = (float *)cuda_scratch(c, SCRATCH_ATTENTION, pbytes);
        a.done = (int *)cuda_scratch(c, SCRATCH_ATT_DONE, (size_t)ab->n_tokens * ab->n_kv_heads * passes * sizeof(int));
        if (!a.partial || !a.done) return;
    }
    dim3 grid((unsigned)(ab->n_kv_heads * passes), (unsigned)(ntok < 65535 ? ntok : 65535), (unsigned)splits);
    switch (kv->type) {
    case DTYPE_F16: launch_attention<DTYPE_F16>(c, a, G, grid, warps, smem); break;
    case DTYPE_BF16: launch_attention<DTYPE_BF16>(c, a, G, grid, warps, smem); break;
    default: launch_attention<DTYPE_F32>(c, a, G, grid, warps, smem); break;
    }
    CUDA_LAUNCHED(c, "attention");
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
    if (ab->head_dim > 256 || ab->head_dim % 4 || ab->n_heads % ab->n_kv_heads) {
        cuda_fail(c, "attention", "head_dim over 256 or not a multiple of 4, or heads not a multiple of KV heads");
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
    pdl_trigger();
    pdl_wait();
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
    launch_pdl(c, rope_kv_write_kernel<T>, grid, dim3(ROPE_THREADS), 0, q, k, v, pos, n, n_heads,   \
               n_kv_heads, head_dim, half, inv_freq, attn_factor, kv->k, kv->v, slots)
    case DTYPE_F16: LAUNCH(DTYPE_F16); break;
    case DTYPE_BF16: LAUNCH(DTYPE_BF16); break;
    default: LAUNCH(DTYPE_F32); break;
#undef LAUNCH
    }
    CUDA_LAUNCHED(c, "rope_kv_write");
}
