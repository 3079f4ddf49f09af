/* The GatedDeltaNet ops (Qwen3-Next, Qwen3.5) on the GPU: the causal depthwise convolution with
 * its rolling state, the gated delta rule recurrence, the gated RMSNorm and the sigmoid gates.
 * The formulas are compute/cpu/ops_linear_attention.c's, float32 throughout, in the same order
 * of summation where a thread owns the sum (test_cuda_ops holds them to the CPU ops).
 *
 * A batch mixes sequences (linear_attention_batch): each sequence's tokens are consecutive, so a
 * kernel finds the runs on the GPU itself (token t starts one when its sequence differs from
 * token t - 1's) and nothing about the batch's layout is fixed at launch -- a recorded decode
 * step replays with whatever sequences the next step brings. A block (or thread) per run start
 * walks its run token by token, as the recurrence requires; the other blocks return at once. */
#include "compute/cuda/cuda_internal.cuh"

#define LIN_THREADS 128
#define CONV_MAX_KEPT 63 /* conv_kernel <= 64 (model_config checks) */
#define GRID_Y_MAX 65535 /* the y dimension of a grid: run starts beyond it loop */

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

/* torch.nn.functional.softplus (beta 1, threshold 20) */
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ bool starts_run(const int32_t *seq, int64_t t) {
    return t == 0 || seq[t] != seq[t - 1];
}

__device__ __forceinline__ int64_t run_end(const int32_t *seq, int64_t t, int64_t n) {
    int64_t e = t + 1;
    while (e < n && seq[e] == seq[t]) e++;
    return e;
}

/* One thread per (channel, run start): the run's inputs through the channel's taps, silu, in
 * place; the run's last conv_kernel - 1 inputs become the slot's state. */
__global__ void conv1d_causal_kernel(linear_attention_layer l, const int32_t *pos,
                                     const int32_t *seq, const int32_t *slots, int64_t n,
                                     float *qkv) {
    const int64_t C = l.conv_dim, c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int taps = l.conv_kernel, kept = taps - 1;
    const float *w = l.conv_weight + c * taps;
    for (int64_t t0 = blockIdx.y; t0 < n; t0 += gridDim.y) {
        if (!starts_run(seq, t0)) continue;
        const int64_t t1 = run_end(seq, t0, n);
        float *state = l.conv_state + (size_t)slots[seq[t0]] * (size_t)kept * (size_t)C;
        const bool fresh = pos[t0] == 0;
        float past[CONV_MAX_KEPT];
        for (int j = 0; j < kept; j++) past[j] = fresh ? 0.0f : state[(size_t)j * C + c];
        for (int64_t t = t0; t < t1; t++) {
            float x = qkv[t * C + c], y = w[kept] * x;
            for (int j = 0; j < kept; j++) y += w[j] * past[j];
            for (int j = 0; j + 1 < kept; j++) past[j] = past[j + 1];
            if (kept) past[kept - 1] = x;
            qkv[t * C + c] = y * sigmoid_f(y);
        }
        for (int j = 0; j < kept; j++) state[(size_t)j * C + c] = past[j];
    }
}

/* One block per (value head, run start); each thread owns value columns j (tid, tid + 128, ..)
 * of the head's state S [key_dim][value_dim] in the slot, walked by rows: a warp reads 32
 * consecutive floats of a row. Per token, as delta_rule_step on the CPU: q and k L2-normalised
 * (every thread sums the squares from shared memory itself, in the CPU's order: no reduction
 * tree, the same value in every thread); S' = decay S while gathering k^T S' and q^T S'; delta =
 * beta (v - k^T S'); out = q^T S' + (q . k) delta; S = S' + k delta^T. Shared memory: q and k,
 * 2 * key_dim floats (launch). */
__global__ void __launch_bounds__(LIN_THREADS) gated_delta_kernel(
    linear_attention_layer l, const int32_t *pos, const int32_t *seq, const int32_t *slots,
    int64_t n, const float *qkv, const float *beta_logits, const float *a, float *out) {
    extern __shared__ float qk_s[];
    const int dk = l.key_dim, dv = l.value_dim, nv = l.n_v_heads, h = blockIdx.x;
    const int kh = h / (nv / l.n_k_heads);
    const int64_t C = l.conv_dim, key_total = (int64_t)l.n_k_heads * dk;
    float *q = qk_s, *k = qk_s + dk;
    const float scale = 1.0f / sqrtf((float)dk), A = expf(l.a_log[h]);
    for (int64_t t0 = blockIdx.y; t0 < n; t0 += gridDim.y) {
        if (!starts_run(seq, t0)) continue;
        const int64_t t1 = run_end(seq, t0, n);
        float *S = l.recurrent_state + ((size_t)slots[seq[t0]] * nv + (size_t)h) * (size_t)dk * dv;
        if (pos[t0] == 0)
            for (int64_t i = threadIdx.x; i < (int64_t)dk * dv; i += blockDim.x) S[i] = 0.0f;
        for (int64_t t = t0; t < t1; t++) {
            const float *row = qkv + t * C;
            __syncthreads(); /* the previous token is done with q and k (and the zeroed S) */
            for (int i = threadIdx.x; i < dk; i += blockDim.x) {
                q[i] = row[(int64_t)kh * dk + i];
                k[i] = row[key_total + (int64_t)kh * dk + i];
            }
            __syncthreads();
            float ssq = 0, ssk = 0;
            for (int i = 0; i < dk; i++) ssq += q[i] * q[i], ssk += k[i] * k[i];
            const float inv_q = 1.0f / sqrtf(ssq + 1e-6f) * scale, inv_k = 1.0f / sqrtf(ssk + 1e-6f);
            float qk = 0;
            for (int i = 0; i < dk; i++) qk += (q[i] * inv_q) * (k[i] * inv_k);
            const float beta = sigmoid_f(beta_logits[t * nv + h]);
            const float decay = expf(-A * softplus_f(a[t * nv + h] + l.dt_bias[h]));
            const float *v = row + 2 * key_total + (int64_t)h * dv;
            float *o = out + t * (int64_t)nv * dv + (int64_t)h * dv;
            for (int j = threadIdx.x; j < dv; j += blockDim.x) {
                float kv = 0, acc = 0;
                for (int i = 0; i < dk; i++) {
                    float s = S[(size_t)i * dv + j] * decay;
                    S[(size_t)i * dv + j] = s;
                    kv += s * (k[i] * inv_k);
                    acc += s * (q[i] * inv_q);
                }
                const float delta = (v[j] - kv) * beta;
                o[j] = acc + qk * delta;
                for (int i = 0; i < dk; i++) S[(size_t)i * dv + j] += (k[i] * inv_k) * delta;
            }
        }
    }
}

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight * silu(z[r]): a block per row (y may be x:
 * every thread reads its values before it writes them, after the row's sum). */
__global__ void rmsnorm_gated_kernel(const float *x, const float *weight, const float *z, float *y,
                                     int64_t dim, float eps) {
    __shared__ float part[LIN_THREADS / 32];
    const float *xr = x + blockIdx.x * dim, *zr = z + blockIdx.x * dim;
    float *yr = y + blockIdx.x * dim;
    float ss = 0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) total += part[i];
    const float inv = 1.0f / sqrtf(total / (float)dim + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float zv = zr[i];
        yr[i] = weight[i] * (xr[i] * inv) * (zv * sigmoid_f(zv));
    }
}

/* x[i] *= sigmoid(gate[i / per_gate]): per element (per_gate 1) or per row (per_gate = dim) */
__global__ void mul_sigmoid_kernel(float *x, const float *gate, int64_t n, int64_t per_gate) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= sigmoid_f(gate[i / per_gate]);
}

static unsigned run_grid_y(int64_t n) { return (unsigned)(n < GRID_Y_MAX ? n : GRID_Y_MAX); }

static void cuda_conv1d_causal(compute_backend *b, const linear_attention_layer *l,
                               const linear_attention_batch *lb, float *qkv) {
    cuda_ctx *c = (cuda_ctx *)b->ctx;
    if (lb->n_tokens <= 0) return;
    dim3 grid(cuda_blocks(l->conv_dim, LIN_THREADS), run_grid_y(lb->n_tokens));
    conv1d_causal_kernel<<<grid, LIN_THREADS, 0, c->stream>>>(*l, lb->positions, lb->seq_of_token,
                                                               lb->state_slots, lb->n_tokens, qkv);
    CUDA_LAUNCHED(c, "conv1d_causal");
}

static void cuda_gated_delta_rule(compute_backend *b, const linear_attention_layer *l,
                                  const linear_attention_batch *lb, const float *qkv,
                                  const float *beta_logits, const float *a, float *out) {
    cuda_ctx *c = (cuda_ctx *)b->ctx;
    if (lb->n_tokens <= 0) return;
    dim3 grid((unsigned)l->n_v_heads, run_grid_y(lb->n_tokens));
    size_t smem = 2 * (size_t)l->key_dim * sizeof(float);
    gated_delta_kernel<<<grid, LIN_THREADS, smem, c->stream>>>(
        *l, lb->positions, lb->seq_of_token, lb->state_slots, lb->n_tokens, qkv, beta_logits, a, out);
    CUDA_LAUNCHED(c, "gated_delta_rule");
}

static void cuda_rmsnorm_gated(compute_backend *b, const float *x, const float *weight,
                               const float *z, float *y, int64_t rows, int64_t dim, float eps) {
    cuda_ctx *c = (cuda_ctx *)b->ctx;
    if (rows <= 0) return;
    rmsnorm_gated_kernel<<<(unsigned)rows, LIN_THREADS, 0, c->stream>>>(x, weight, z, y, dim, eps);
    CUDA_LAUNCHED(c, "rmsnorm_gated");
}

static void mul_sigmoid_launch(cuda_ctx *c, float *x, const float *gate, int64_t n, int64_t per_gate) {
    if (n <= 0) return;
    mul_sigmoid_kernel<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(x, gate, n, per_gate);
    CUDA_LAUNCHED(c, "mul_sigmoid");
}

static void cuda_mul_sigmoid(compute_backend *b, float *x, const float *gate, int64_t n) {
    mul_sigmoid_launch((cuda_ctx *)b->ctx, x, gate, n, 1);
}

static void cuda_mul_sigmoid_rows(compute_backend *b, float *x, const float *gate, int64_t rows,
                                  int64_t dim) {
    mul_sigmoid_launch((cuda_ctx *)b->ctx, x, gate, rows * dim, dim);
}

static void cuda_copy(compute_backend *b, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = (cuda_ctx *)b->ctx;
    if (bytes) CUDA_OK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

void cuda_bind_linear_attention(compute_backend *b) {
    b->conv1d_causal = cuda_conv1d_causal;
    b->gated_delta_rule = cuda_gated_delta_rule;
    b->rmsnorm_gated = cuda_rmsnorm_gated;
    b->mul_sigmoid = cuda_mul_sigmoid;
    b->mul_sigmoid_rows = cuda_mul_sigmoid_rows;
    b->copy = cuda_copy;
}
