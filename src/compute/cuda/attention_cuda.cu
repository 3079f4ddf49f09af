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

#define ATT_TILE 32      /* cached positions a block copies and scores at a time */
#define ATT_HEADS 8      /* query heads a block (one warp each) */
#define ATT_MAX_SPLITS 32
#define ATT_MIN_TILES 4  /* a split takes at least this many tiles: short contexts, one split */
#define ATT_SMEM_BUDGET (96 * 1024) /* two tile buffers unless they would pass this */

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
    float *out;     /* the output */
    float *partial; /* splits > 1: [n_tokens][n_heads][splits][head_dim + 2] */
    int *done;      /* splits > 1: [n_tokens][n_kv_heads][passes] blocks finished, back to 0 */
    int splits, passes, heads; /* heads: query heads a block (its warps) */
    int pitch;      /* bytes of a cached row in shared memory (16-byte multiple + 16) */
    int cp;         /* bytes a cp.async copies: 16, or 8 for 16-bit rows of 4k + 2 (mod 8) values */
    int nbuf;       /* tile buffers: 2 (the next tile's copies fly while this one is used) or 1 */
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

/* Decode (and short prefill chunks) over the paged cache. A block per (token, KV head, pass of up
 * to 8 of its query heads, split), one warp per query head: the block copies tiles of 32 cached
 * positions (K and V rows) into shared memory with cp.async -- the next tile's copies in flight
 * while the warps use this one -- and each warp scores the tile for its head (lane j: position
 * j, q in shared memory), updates its online softmax (float32, as the CPU reference,
 * ops_attention.c) and sums V for its head_dim / 32 dims per lane. Rolled loops: the previous
 * kernel, fully unrolled, spent 61-67% of its time waiting on instruction fetch (ncu, H200) at
 * one warp per scheduler, and its successor with a warp per tile for all the heads still took
 * 16 us a call at 50 positions (one warp's long dependent chains).
 *
 * Flash-decoding split: with few (token, KV head) pairs a token's tiles are dealt to `splits`
 * blocks (the host does not know the context length), each taking at least ATT_MIN_TILES tiles:
 * a short context is one block, which writes the output itself. Otherwise each block writes its
 * partial (max, sum, weighted V) and the last of the token's blocks to finish -- counted with an
 * atomic -- merges them in split order (deterministic) and resets the count, no second kernel.
 * The block tables and positions are read before pdl_wait (written before the previous kernel). */
template <int T, int DPL>
__global__ void __launch_bounds__(ATT_HEADS * 32) attention_tile_kernel(att_args a) {
    extern __shared__ float4 att_smem4[];
    __shared__ int last_block;
    const attention_batch &ab = a.ab;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nt = blockDim.x;
    const int hd = ab.head_dim, nh = ab.n_heads, group = nh / ab.n_kv_heads;
    const int kvh = blockIdx.x / a.passes, pass = blockIdx.x % a.passes, split = blockIdx.z;
    const int h0 = kvh * group + pass * a.heads;
    const int gc = group - pass * a.heads < a.heads ? group - pass * a.heads : a.heads;
    const bool head_on = warp < gc;
    const int64_t h = h0 + warp, kv_dim = (int64_t)ab.n_kv_heads * hd;
    const int es = T == DTYPE_F32 ? 4 : 2, cpr = hd * es / a.cp, tile_bytes = ATT_TILE * a.pitch;
    float *qs = (float *)att_smem4;                 /* [heads][hd] */
    float *sw = qs + a.heads * hd + warp * ATT_TILE; /* [heads][32]: this warp's weights */
    char *bufs = (char *)(qs + a.heads * (hd + ATT_TILE)); /* [nbuf][K tile, V tile] */
    for (int64_t t = a.t_begin + blockIdx.y; t < a.t_end; t += gridDim.y) {
        const int32_t *table = ab.block_tables + ab.block_table_start[ab.seq_of_token[t]];
        const int n_ctx = ab.positions[t] + 1, bs = ab.block_size, first = att_first(ab, n_ctx);
        const int n_tiles = (n_ctx - first + ATT_TILE - 1) / ATT_TILE;
        int active = (n_tiles + ATT_MIN_TILES - 1) / ATT_MIN_TILES; /* splits with work */
        active = active < a.splits ? active : a.splits;
        if (split >= active) continue; /* block-uniform */
        /* byte offset of the row of position base + lane (K and V alike) */
        auto row_of = [&](int tile) -> int64_t {
            int p = first + tile * ATT_TILE + lane;
            if (p >= n_ctx) return 0;
            return (((int64_t)table[p / bs] * bs + p % bs) * kv_dim + (int64_t)kvh * hd) * es;
        };
        /* the block's copies of a tile: warp w takes chunk indices w*32 + lane + i*blockDim */
        auto copy = [&](int tile, int buf) {
            const int base = first + tile * ATT_TILE;
            const int n_valid = n_ctx - base < ATT_TILE ? n_ctx - base : ATT_TILE, total = n_valid * cpr;
            const int64_t row = row_of(tile);
            char *sk = bufs + buf * 2 * tile_bytes, *sv = sk + tile_bytes;
            for (int i0 = warp * 32; i0 < total; i0 += nt) { /* uniform per warp: shuffles */
                int i = i0 + lane, j = i / cpr;
                int64_t rj = __shfl_sync(0xffffffffu, row, j < 32 ? j : 31);
                if (i < total) {
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
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        };
        pdl_wait(); /* q, K and V come from the kernels before */
        copy(split, 0);
        if (head_on)
            for (int i = lane; i < hd; i += 32) qs[warp * hd + i] = a.q[(t * nh + h) * hd + i];
        float m = -INFINITY, l = 0, acc[DPL];
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] = 0;
        for (int it = 0, tile = split; tile < n_tiles; it++, tile += active) {
            const int buf = a.nbuf == 2 ? it & 1 : 0;
            if (a.nbuf == 1 && it > 0) copy(tile, 0); /* the buffer is free since the last barrier */
            if (a.nbuf == 2 && tile + active < n_tiles) {
                copy(tile + active, buf ^ 1);
                asm volatile("cp.async.wait_group 1;\n" ::: "memory");
            } else {
                asm volatile("cp.async.wait_group 0;\n" ::: "memory");
            }
            __syncthreads(); /* every thread's copies of this tile (and q) have landed */
            const int base = first + tile * ATT_TILE;
            const int n_valid = n_ctx - base < ATT_TILE ? n_ctx - base : ATT_TILE;
            const char *sk = bufs + buf * 2 * tile_bytes, *sv = sk + tile_bytes;
            if (head_on) { /* warp-uniform */
                const float *qh = qs + warp * hd;
                float s4[4] = {0, 0, 0, 0}; /* four chains: the FMAs do not wait on each other */
                if (lane < n_valid) {
                    const char *kr = sk + lane * a.pitch;
#pragma unroll 4
                    for (int d = 0; d < hd; d += 4) {
                        float k4[4];
                        smem_load4<T>(kr + d * es, k4);
                        float4 q4 = *(const float4 *)(qh + d);
                        s4[0] = fmaf(q4.x, k4[0], s4[0]), s4[1] = fmaf(q4.y, k4[1], s4[1]);
                        s4[2] = fmaf(q4.z, k4[2], s4[2]), s4[3] = fmaf(q4.w, k4[3], s4[3]);
                    }
                }
                const bool valid = lane < n_valid;
                float sc = valid ? ((s4[0] + s4[1]) + (s4[2] + s4[3])) * ab.scale : -INFINITY;
                float cm = sc;
                for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
                const float mn = fmaxf(m, cm), corr = __expf(m - mn); /* m = -inf at first: 0 */
                const float w = valid ? __expf(sc - mn) : 0.0f;
                float ws = w;
                for (int o = 16; o > 0; o >>= 1) ws += __shfl_xor_sync(0xffffffffu, ws, o);
                l = l * corr + ws;
                m = mn;
                sw[lane] = w;
                __syncwarp();
                const int d0 = lane * DPL;
                float acc2[DPL]; /* even and odd rows in two chains */
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[i] *= corr, acc2[i] = 0;
                if (d0 < hd) {
                    int j = 0;
                    for (; j + 1 < n_valid; j += 2) {
                        float v0[DPL], v1[DPL];
                        const char *r0 = sv + j * a.pitch + d0 * es, *r1 = r0 + a.pitch;
                        if (DPL >= 4) {
#pragma unroll
                            for (int i = 0; i < DPL; i += 4) smem_load4<T>(r0 + i * es, v0 + i), smem_load4<T>(r1 + i * es, v1 + i);
                        } else {
#pragma unroll
                            for (int i = 0; i < DPL; i++) v0[i] = kv_load<T>(r0, i), v1[i] = kv_load<T>(r1, i);
                        }
                        const float w0 = sw[j], w1 = sw[j + 1];
#pragma unroll
                        for (int i = 0; i < DPL; i++) acc[i] = fmaf(w0, v0[i], acc[i]), acc2[i] = fmaf(w1, v1[i], acc2[i]);
                    }
                    if (j < n_valid) {
                        float v0[DPL];
                        const char *r0 = sv + j * a.pitch + d0 * es;
                        if (DPL >= 4) {
#pragma unroll
                            for (int i = 0; i < DPL; i += 4) smem_load4<T>(r0 + i * es, v0 + i);
                        } else {
#pragma unroll
                            for (int i = 0; i < DPL; i++) v0[i] = kv_load<T>(r0, i);
                        }
#pragma unroll
                        for (int i = 0; i < DPL; i++) acc[i] = fmaf(sw[j], v0[i], acc[i]);
                    }
                }
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[i] += acc2[i];
            }
            __syncthreads(); /* the tile's buffer and weights are free for the copies after */
        }
        pdl_trigger(); /* the cache is read: the next kernel may start */
        const int d0 = lane * DPL;
        if (active == 1) {
            if (head_on) {
                const float norm = attention_sink_norm(ab.sinks, h, m, l);
#pragma unroll
                for (int i = 0; i < DPL; i++)
                    if (d0 + i < hd) a.out[(t * nh + h) * hd + d0 + i] = acc[i] * norm;
            }
            continue;
        }
        const int cs = hd + 2;
        if (head_on) {
            float *pp = a.partial + ((t * nh + h) * a.splits + split) * cs;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (d0 + i < hd) pp[d0 + i] = acc[i];
            if (lane == 0) pp[hd] = m, pp[hd + 1] = l;
        }
        __threadfence();
        __syncthreads();
        int *done = a.done + (t * ab.n_kv_heads + kvh) * a.passes + pass;
        if (threadIdx.x == 0) last_block = atomicAdd(done, 1) == active - 1;
        __syncthreads();
        if (!last_block) continue;
        __threadfence();
        if (head_on) { /* this warp merges its head's splits: lane s holds split s's weight */
            const float *pp = a.partial + (t * nh + h) * a.splits * cs;
            float ms = lane < active ? __ldcg(pp + lane * cs + hd) : -INFINITY;
            float ls = lane < active ? __ldcg(pp + lane * cs + hd + 1) : 0.0f;
            float mx = ms;
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float e = ms == -INFINITY ? 0.0f : __expf(ms - mx), le = ls * e;
            for (int o = 16; o > 0; o >>= 1) le += __shfl_xor_sync(0xffffffffu, le, o);
            const float norm = attention_sink_norm(ab.sinks, h, mx, le);
            float o[DPL];
#pragma unroll
            for (int i = 0; i < DPL; i++) o[i] = 0;
            for (int sp = 0; sp < active; sp++) {
                const float wsp = __shfl_sync(0xffffffffu, e, sp);
#pragma unroll
                for (int i = 0; i < DPL; i++)
                    if (d0 + i < hd && wsp != 0.0f) o[i] = fmaf(__ldcg(pp + sp * cs + d0 + i), wsp, o[i]);
            }
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (d0 + i < hd) a.out[(t * nh + h) * hd + d0 + i] = o[i] * norm;
        }
        if (threadIdx.x == 0) *done = 0;
    }
}

/* Dims per lane of the V sum: head_dim <= 32 DPL. */
template <int T>
static void launch_attention(cuda_ctx *c, const att_args &a, dim3 grid, size_t smem) {
    int hd = a.ab.head_dim;
    const void *fn;
    if (hd <= 32) fn = (const void *)attention_tile_kernel<T, 1>;
    else if (hd <= 64) fn = (const void *)attention_tile_kernel<T, 2>;
    else if (hd <= 128) fn = (const void *)attention_tile_kernel<T, 4>;
    else fn = (const void *)attention_tile_kernel<T, 8>;
    /* above 48 KB a kernel must ask, once (the largest asked for so far, per kernel) */
    static const void *fns[16];
    static size_t raised[16];
    int k = 0;
    while (k < 16 && fns[k] && fns[k] != fn) k++;
    if (smem > 48 * 1024 && (k == 16 || !fns[k] || raised[k] < smem)) {
        if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
            cudaGetLastError();
            cuda_fail(c, "attention", "cannot raise the kernel's shared memory");
            return;
        }
        if (k < 16) fns[k] = fn, raised[k] = smem;
    }
    dim3 block(a.heads * 32);
    if (hd <= 32) launch_pdl(c, attention_tile_kernel<T, 1>, grid, block, smem, a);
    else if (hd <= 64) launch_pdl(c, attention_tile_kernel<T, 2>, grid, block, smem, a);
    else if (hd <= 128) launch_pdl(c, attention_tile_kernel<T, 4>, grid, block, smem, a);
    else launch_pdl(c, attention_tile_kernel<T, 8>, grid, block, smem, a);
}

/* The tile kernel over batch tokens [t0, t1). */
static void attention_warps(cuda_ctx *c, const float *q, const kv_layer *kv,
                            const attention_batch *ab, float *out, int64_t t0, int64_t t1) {
    int hd = ab->head_dim, group = ab->n_heads / ab->n_kv_heads;
    if (t1 <= t0) return;
    int heads = group < ATT_HEADS ? group : ATT_HEADS, passes = (group + heads - 1) / heads;
    int es = kv->type == DTYPE_F32 ? 4 : 2;
    att_args a;
    a.q = q;
    a.k = kv->k;
    a.v = kv->v;
    a.ab = *ab;
    a.out = out;
    a.partial = NULL;
    a.done = NULL;
    a.passes = passes;
    a.heads = heads;
    a.cp = hd * es % 16 == 0 ? 16 : 8;
    a.pitch = (hd * es + 15) / 16 * 16 + 16; /* rows 16 bytes apart in banks: conflict-free */
    a.t_begin = t0;
    a.t_end = t1;
    size_t fixed = (size_t)heads * (hd + ATT_TILE) * 4, buf = 2 * (size_t)ATT_TILE * a.pitch;
    a.nbuf = fixed + 2 * buf <= ATT_SMEM_BUDGET ? 2 : 1;
    size_t smem = fixed + a.nbuf * buf;
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
    case DTYPE_F16: launch_attention<DTYPE_F16>(c, a, grid, smem); break;
    case DTYPE_BF16: launch_attention<DTYPE_BF16>(c, a, grid, smem); break;
    default: launch_attention<DTYPE_F32>(c, a, grid, smem); break;
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
