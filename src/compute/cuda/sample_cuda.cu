/* Sampling on the GPU: one block per logits row does what infer/sampler.c's sampler_sample does
 * after its penalties (the caller keeps rows with penalties on the host), so a decode step sends
 * back token ids and the logprobs asked for instead of [rows][vocab] floats.
 *
 *   banned ids -> -inf; argmax (lowest id on ties); greedy without logprobs stops there.
 *   log_softmax of logits / temperature (the sum of exponentials in double); the top n
 *   alternatives by n passes, each taking the best entry ranked after the previous one.
 *   Non-greedy: candidates are the finite logprobs >= the min_p bound, ranked by probability
 *   descending, lower id first (the host's sort order). Rather than sorting 150k entries, every
 *   cut the host makes on that order is found as a prefix of it: a bisection over the float bits
 *   of a probability threshold T, then over ids among entries equal to T, each step one block
 *   reduction of (count, mass in double) over the row. top_k is the prefix of top_k entries;
 *   top_p the shortest prefix of mass >= top_p within it; the token the first entry at which the
 *   running mass exceeds uniform x total, as the host's walk does. Masses are summed in another
 *   order than the host's running sum: a draw within ~1e-16 of a boundary may pick the neighbour.
 *
 * Refuses: nothing; rows with penalties never get here (backend.h). */
#include "compute/cuda/cuda_internal.cuh"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define SAMPLE_THREADS 1024

struct dev_sample_params {
    float temperature, top_p, min_p;
    int top_k, logprob, n_top, banned_off, n_banned;
    double uniform;
};

/* Sums a and b over the block; every thread gets the totals. */
__device__ void block_sum2(double &a, double &b, double *red) {
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* red may still be read from the previous call */
    if ((threadIdx.x & 31) == 0) red[w] = a, red[32 + w] = b;
    __syncthreads();
    a = 0, b = 0;
    for (int i = 0; i < nw; i++) a += red[i], b += red[32 + i];
}

/* The best (value, id) of the block: larger value, then lower id; NaN never wins. */
__device__ void block_best(float &v, int &id, float *redv, int *redi) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (ov > v || (ov == v && oi < id)) v = ov, id = oi;
    }
    int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) redv[w] = v, redi[w] = id;
    __syncthreads();
    v = redv[0], id = redi[0];
    for (int i = 1; i < nw; i++)
        if (redv[i] > v || (redv[i] == v && redi[i] < id)) v = redv[i], id = redi[i];
}

/* A prefix of the candidates' order: entries with p > t, and those with p == t and id <= last. */
struct prefix {
    float t;
    int last;
};

__device__ __forceinline__ bool in_prefix(float p, int v, prefix a) {
    return p > a.t || (p == a.t && v <= a.last);
}

/* Count and mass of the candidates (p >= 0) in prefix a and in limit l. */
__device__ void prefix_stats(const float *prob, int vocab, prefix a, prefix l, double &count,
                             double &mass, double *red) {
    double c = 0, m = 0;
    for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
        float p = prob[v];
        if (p >= 0 && in_prefix(p, v, a) && in_prefix(p, v, l)) c += 1, m += p;
    }
    block_sum2(c, m, red);
    count = c, mass = m;
}

enum { CUT_COUNT_AT_LEAST, CUT_MASS_AT_LEAST, CUT_MASS_ABOVE };

__device__ __forceinline__ bool cut_reached(int mode, double x, double count, double mass) {
    return mode == CUT_COUNT_AT_LEAST ? count >= x : mode == CUT_MASS_AT_LEAST ? mass >= x : mass > x;
}

/* The shortest prefix within limit l whose (count, mass) reaches the cut; the caller knows the
 * whole of l reaches it. Its last entry is the entry at (t, last). */
__device__ prefix shortest_prefix(const float *prob, int vocab, prefix l, int mode, double x,
                                  double *red) {
    double count, mass;
    /* the largest t whose prefix of every entry >= t reaches the cut (0 does: all of l) */
    uint32_t lo = 0, hi = 0x7f800000u;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        prefix_stats(prob, vocab, prefix{__uint_as_float(mid), 0x7fffffff}, l, count, mass, red);
        if (cut_reached(mode, x, count, mass)) lo = mid;
        else hi = mid;
    }
    float t = __uint_as_float(lo);
    /* then the fewest entries equal to t, in id order */
    int ilo = -1, ihi = vocab - 1;
    while (ihi - ilo > 1) {
        int mid = ilo + (ihi - ilo) / 2;
        prefix_stats(prob, vocab, prefix{t, mid}, l, count, mass, red);
        if (cut_reached(mode, x, count, mass)) ihi = mid;
        else ilo = mid;
    }
    return prefix{t, ihi};
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(float *logits, int64_t vocab64, const dev_sample_params *params,
                  const int32_t *banned, float *prob_rows, sample_result *out) {
    __shared__ double red[64];
    __shared__ float redv[32];
    __shared__ int redi[32];
    const int vocab = (int)vocab64, row = blockIdx.x;
    const dev_sample_params p = params[row];
    float *l = logits + (int64_t)row * vocab64;
    sample_result *o = out + row;
    for (int i = threadIdx.x; i < p.n_banned; i += blockDim.x) {
        int id = banned[p.banned_off + i];
        if (id >= 0 && id < vocab) l[id] = -INFINITY;
    }
    __syncthreads();
    float m = -INFINITY;
    int amax = 0x7fffffff;
    for (int v = threadIdx.x; v < vocab; v += blockDim.x)
        if (l[v] > m) m = l[v], amax = v; /* ascending v per thread: the first of equal values */
    block_best(m, amax, redv, redi);
    if (amax == 0x7fffffff) amax = 0; /* every logit -inf or NaN: the host's answer */
    bool greedy = p.temperature <= 0;
    if (threadIdx.x == 0) {
        o->token = amax;
        o->logprob = 0;
        o->n_top = 0;
    }
    if (greedy && !p.logprob && !p.n_top) return;
    float temp = p.temperature > 0 ? p.temperature : 1.0f, inv_t = 1.0f / temp;
    double sum = 0, unused = 0;
    for (int v = threadIdx.x; v < vocab; v += blockDim.x) sum += expf((l[v] - m) * inv_t);
    block_sum2(sum, unused, red);
    float lse = (float)log(sum);
    /* top alternatives: each pass the best entry ranked after the last one taken */
    float prev = INFINITY;
    int prev_id = -1, n_top = 0;
    for (int j = 0; j < p.n_top; j++) {
        float best = -INFINITY;
        int best_id = 0x7fffffff;
        for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
            float lp = (l[v] - m) * inv_t - lse;
            if (!(lp < prev || (lp == prev && v > prev_id))) continue;
            if (lp > best || (lp == best && v < best_id)) best = lp, best_id = v;
        }
        block_best(best, best_id, redv, redi);
        if (best_id == 0x7fffffff) break;
        if (threadIdx.x == 0) o->top_ids[j] = best_id, o->top_logprobs[j] = best;
        prev = best, prev_id = best_id, n_top = j + 1;
    }
    int token = amax;
    if (!greedy) {
        float *prob = prob_rows + (int64_t)row * vocab64;
        float min_lp = p.min_p > 0 ? (l[amax] - m) * inv_t - lse + logf(p.min_p) : -INFINITY;
        for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
            float lp = (l[v] - m) * inv_t - lse;
            prob[v] = lp > -INFINITY && lp >= min_lp ? expf(lp) : -1.0f;
        }
        __syncthreads();
        prefix all = {0.0f, 0x7fffffff}, lim = all;
        double n_cand, mass;
        prefix_stats(prob, vocab, all, all, n_cand, mass, red);
        bool cut = false; /* lim is a proper prefix: its last entry is known */
        if (p.top_k > 0 && p.top_k < n_cand) {
            lim = shortest_prefix(prob, vocab, all, CUT_COUNT_AT_LEAST, p.top_k, red);
            cut = true;
            prefix_stats(prob, vocab, lim, all, n_cand, mass, red);
        }
        if (p.top_p < 1 && mass >= p.top_p) { /* (top_p <= 0 keeps the first candidate) */
            lim = shortest_prefix(prob, vocab, lim, CUT_MASS_AT_LEAST, fmax((double)p.top_p, 1e-30), red);
            cut = true;
            prefix_stats(prob, vocab, lim, all, n_cand, mass, red);
        }
        double target = p.uniform * mass;
        if (mass > target) {
            token = shortest_prefix(prob, vocab, lim, CUT_MASS_ABOVE, target, red).last;
        } else if (cut) {
            token = lim.last;
        } else { /* the draw rounded past the total: the last candidate (least likely, last id) */
            float worst = -INFINITY;
            int worst_id = 0x7fffffff;
            for (int v = threadIdx.x; v < vocab; v += blockDim.x)
                if (prob[v] >= 0) {
                    float k = -prob[v];
                    if (k > worst || (k == worst && -v < worst_id)) worst = k, worst_id = -v;
                }
            block_best(worst, worst_id, redv, redi);
            if (worst_id != 0x7fffffff) token = -worst_id;
        }
    }
    if (threadIdx.x == 0) {
        o->token = token;
        o->logprob = (l[token] - m) * inv_t - lse;
        o->n_top = n_top;
    }
}

int cuda_sample(cuda_ctx *c, float *logits, int64_t n_rows, int64_t vocab,
                const sample_params *params, sample_result *out) {
    if (n_rows <= 0) return 0;
    if (vocab <= 0 || vocab > 0x3fffffff) {
        cuda_fail(c, "sample", "vocabulary size out of range");
        return -1;
    }
    int64_t n_banned = 0, any_random = 0;
    for (int64_t i = 0; i < n_rows; i++) {
        n_banned += params[i].n_banned > 0 ? params[i].n_banned : 0;
        any_random |= params[i].temperature > 0;
    }
    size_t head = (size_t)n_rows * sizeof(dev_sample_params);
    size_t in_bytes = head + (size_t)n_banned * sizeof(int32_t) + 16;
    size_t out_bytes = (size_t)n_rows * sizeof(sample_result);
    char *host = (char *)malloc(in_bytes);
    if (!host) {
        cuda_fail(c, "sample", "out of host memory");
        return -1;
    }
    dev_sample_params *dp = (dev_sample_params *)host;
    int32_t *ban = (int32_t *)(host + head);
    int off = 0;
    for (int64_t i = 0; i < n_rows; i++) {
        const sample_params *q = &params[i];
        dp[i] = dev_sample_params{q->temperature, q->top_p, q->min_p, q->top_k, q->logprob,
                                  q->n_top < 0 ? 0 : q->n_top > COMPUTE_MAX_TOP_LOGPROBS ? COMPUTE_MAX_TOP_LOGPROBS : q->n_top,
                                  off, q->n_banned > 0 ? q->n_banned : 0, q->uniform};
        for (int j = 0; j < q->n_banned; j++) ban[off++] = q->banned[j];
    }
    char *dev = (char *)cuda_scratch(c, SCRATCH_SAMPLE, in_bytes + out_bytes + 256);
    float *probs = any_random ? (float *)cuda_scratch(c, SCRATCH_SAMPLE_PROBS,
                                                      (size_t)(n_rows * vocab) * sizeof(float))
                              : NULL;
    if (!dev || (any_random && !probs)) {
        free(host);
        return -1;
    }
    sample_result *dout = (sample_result *)(dev + ((in_bytes + 255) & ~(size_t)255));
    CUDA_OK(c, cudaMemcpyAsync(dev, host, in_bytes, cudaMemcpyHostToDevice, c->stream));
    sample_kernel<<<(unsigned)n_rows, SAMPLE_THREADS, 0, c->stream>>>(
        logits, vocab, (const dev_sample_params *)dev, (const int32_t *)(dev + head), probs, dout);
    CUDA_LAUNCHED(c, "sample");
    CUDA_OK(c, cudaMemcpyAsync(out, dout, out_bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_OK(c, cudaStreamSynchronize(c->stream));
    free(host);
    return c->error[0] ? -1 : 0;
}
