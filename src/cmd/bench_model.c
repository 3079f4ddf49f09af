/* exo bench --model DIR — end-to-end prefill and decode speed of one model through the engine
 * door, each number next to its ceiling measured in the same run:
 *   prefill (pp N, one request): tok/s and GFLOP/s as a fraction of the f32 GEMM peak
 *     (the faster of OpenBLAS sgemm and exo's own GEMM, measured here);
 *   decode (tg N at batch B): aggregate tok/s against the roofline
 *     min(B / (bytes read per step / read bandwidth), B * flops per token / GEMM peak), where a
 *     step reads the weights (MoE: the experts B tokens can touch) and every sequence's KV cache.
 *     The GEMM peak is the f32 one (the ceiling issue 6 defines). For MLX-quantized models the
 *     quantized matmul's own rate (1536^2 of the model's bits and group size, 128 tokens) can
 *     beat it, so each decode line also prints its fraction of the stricter roofline built on
 *     the better of the two peaks ("int-gemm roofline").
 *     The read bandwidth is probed before the run (bench.c) and again right after each
 *     decode measurement; the roofline uses the higher of the two, so a host whose memory got
 *     faster after the first probe does not inflate the fraction. On the CPU a second decode
 *     line ("paired") runs one more decode with a 1 GiB read probe swept between its steps and
 *     divides by that probe's bandwidth: both from the same seconds of the host, which on a
 *     shared VM swings within seconds (bench/RESULTS.md, issue 25). Its probe splits statically
 *     over threads, so on a host with stragglers it can read less than decode (above 100%).
 *     A GGUF model is converted at load (model/gguf_quant.h), so exo may read more bytes than
 *     the file holds; its decode lines also print the fraction of the roofline over the file's
 *     own bytes per token (what llama.cpp reads), the bar that compares formats fairly.
 * Refuses: writing files (bench/run.sh records results). */
#include "base/clock.h"
#include "compute/cpu/cpu.h"
#include "compute/device.h"
#include "infer/engine.h"
#include "model/gguf.h"
#include "model/model_config.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int bench_model_main(const char *model_dir, int argc, char **argv, double read_gbs);
int bench_dist_main(const char *model_dir, int argc, char **argv);
int bench_spec_main(const char *model_dir, const char *method, const int *ks, int n_k, int tg,
                    int reps, const char *device, const char *kv);
double bench_run_decode(engine *e, int batch, int tg, int vocab, engine_stats *window);
typedef struct bench_probe bench_probe; /* bench.c */
bench_probe *bench_probe_open(size_t bytes);
void bench_probe_sweep(bench_probe *p);
double bench_probe_gbs(const bench_probe *p);
void bench_probe_close(bench_probe *p);
double bench_run_prefill(engine *e, int batch, int pp, int vocab, int salt, engine_stats *window);
double bench_read_gbs(size_t bytes, int reps, double *median_gbs);
double bench_mlx_matmul_gflops(int bits, int group_size, int64_t n, int64_t tokens);

/* On a GPU the ceilings are the GPU's: its device-to-device copy (bytes read plus written) for
 * the decode roofline, and cuBLAS's bf16 GEMM for prefill (cmd_bench_model's header says why a
 * probe runs again after each decode measurement). */
static int on_gpu;
#define GPU_COPY_BYTES ((size_t)2 << 30)
#define GPU_GEMM_N 8192

/* The higher of the run's first probe and a probe now (1 GiB, best of 5; the GPU: 2 GiB). */
static double read_gbs_now(double first) {
    double now = on_gpu ? compute_gpu_copy_gbs(GPU_COPY_BYTES, 5)
                        : bench_read_gbs((size_t)1 << 30, 5, NULL);
    return now > first ? now : first;
}

/* CPU time the hypervisor gave to other guests ("steal", /proc/stat) as a share of all CPU time
 * since the last mark: on a shared VM it says whether a slow measurement was the host's doing. */
typedef struct steal_mark {
    unsigned long long steal, total;
} steal_mark;

static steal_mark steal_now(void) {
    steal_mark m = {0, 0};
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    if (f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                    &v[4], &v[5], &v[6], &v[7]) == 8) {
        for (int i = 0; i < 8; i++) m.total += v[i];
        m.steal = v[7];
    }
    if (f) fclose(f);
    return m;
}

static double steal_pct_since(steal_mark a) {
    steal_mark b = steal_now();
    return b.total > a.total ? 100.0 * (double)(b.steal - a.steal) / (double)(b.total - a.total) : 0;
}

typedef struct model_costs {
    double flops_per_token; /* 2 * multiply-adds of every matmul one token runs */
    double dense_bytes;     /* weight bytes every token reads regardless of routing */
    double expert_bytes;    /* bytes of one expert of one layer (MoE), 0 for dense */
    int moe_layers, n_experts, top_k;
    double kv_bytes_per_pos; /* KV bytes one cached position costs (all layers, f16) */
} model_costs;

static void costs_of(const model_config *c, const engine_info *info, model_costs *m) {
    double dim = c->hidden_size, qd = (double)c->n_heads * c->head_dim,
           kvd = (double)c->n_kv_heads * c->head_dim;
    double attn = dim * qd * 2 + dim * kvd * 2, mlp = 3 * dim * c->intermediate_size;
    double expert = 3 * dim * c->moe_intermediate_size;
    memset(m, 0, sizeof *m);
    for (int l = 0; l < c->n_layers; l++) {
        int moe = model_config_layer_is_moe(c, l);
        m->moe_layers += moe;
        m->flops_per_token += 2 * (attn + (moe ? expert * c->n_experts_per_tok + dim * c->n_experts : mlp));
    }
    m->flops_per_token += 2 * dim * c->vocab_size;
    m->n_experts = c->n_experts;
    m->top_k = c->n_experts_per_tok;
    m->kv_bytes_per_pos = (double)c->n_layers * 2 * kvd * 2;
    /* split the engine's per-token bytes into the shared part and the experts by element count */
    double expert_elems = (double)m->moe_layers * m->top_k * expert;
    double total_elems = m->flops_per_token / 2;
    double bpe = (double)info->weight_bytes / total_elems; /* bytes per weight element */
    m->expert_bytes = m->moe_layers ? bpe * expert : 0;
    m->dense_bytes = (double)info->weight_bytes - bpe * expert_elems;
}

typedef struct roofline {
    double rate;       /* tok/s */
    double step_bytes; /* bytes one decode step reads */
    int memory_bound;
} roofline;

/* Decode roofline at batch b with an average context of ctx positions: the bytes a step reads
 * (shared weights, the experts b tokens can reach, b KV caches) at the read bandwidth, or the
 * flops at the GEMM peak, whichever is slower. */
static roofline roofline_for(const model_costs *mc, int b, double ctx, const char *kv,
                             double read_gbs, double peak) {
    double experts = mc->moe_layers ? (b * mc->top_k < mc->n_experts ? b * mc->top_k : mc->n_experts) : 0;
    double kv_per_pos = mc->kv_bytes_per_pos * (kv && !strcmp(kv, "f32") ? 2 : 1);
    roofline r = {.step_bytes = mc->dense_bytes + experts * mc->expert_bytes * mc->moe_layers +
                                b * ctx * kv_per_pos};
    double mem = read_gbs > 0 ? b * read_gbs * 1e9 / r.step_bytes : 0;
    double flop = peak > 0 ? peak * 1e9 / mc->flops_per_token : 0;
    r.memory_bound = flop == 0 || mem < flop;
    r.rate = r.memory_bound ? mem : flop;
    return r;
}

/* The bytes one token reads in the GGUF file's own types: every tensor but the embedding table,
 * which a token only indexes (counted when it is also the output matrix, a tied model). 0 when
 * the model is not a GGUF file. */
static double gguf_file_bytes_per_token(const char *model_dir) {
    char path[4096], err[256];
    if (!gguf_model_file(model_dir, path, sizeof path)) return 0;
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) return 0;
    int tied = gguf_find_tensor(f, "output.weight") == NULL;
    double bytes = 0;
    for (int i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (tied || strcmp(t->name, "token_embd.weight")) bytes += (double)t->nbytes;
    }
    gguf_close(f);
    return bytes;
}

/* The f32 GEMM peak: the better of OpenBLAS sgemm and our own f32 matmul on 1536^3. */
static double gemm_peak_gflops(double *blas_out, double *ours_out) {
    int n = 1536;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    if (!a || !b || !c) return 0;
    for (int i = 0; i < n * n; i++) a[i] = b[i] = (float)(i % 7) * 0.1f;
    weight_matrix w = {.format = WEIGHT_F32, .rows = n, .cols = n, .data = b};
    double best_blas = 1e30, best_ours = 1e30;
    for (int r = 0; r < 4; r++) {
        uint64_t t0 = clock_now_ns();
        if (r % 2 == 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        else
            cpu_matmul(&w, a, c, n);
        double t = (double)(clock_now_ns() - t0) * 1e-9;
        best_blas = t < best_blas ? t : best_blas;
        t0 = clock_now_ns();
        cpu_matmul(&w, a, c, n);
        t = (double)(clock_now_ns() - t0) * 1e-9;
        best_ours = t < best_ours ? t : best_ours;
    }
    free(a);
    free(b);
    free(c);
    double flop = 2.0 * n * n * (double)n * 1e-9;
    *blas_out = flop / best_blas;
    *ours_out = flop / best_ours;
    return *blas_out > *ours_out ? *blas_out : *ours_out;
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 20) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static void fill_prompt(int32_t *p, int n, int vocab, int salt) {
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(salt + 1);
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (int32_t)(x % (uint64_t)(vocab > 1000 ? 1000 : vocab)) + (vocab > 2000 ? 500 : 0);
    }
}

/* batch pp-token prompts submitted together (distinct, no prefix cache), each generating one
 * token; returns the seconds until all are done, or -1. window (may be NULL): the engine's steps
 * and step/communication time over the run. */
double bench_run_prefill(engine *e, int batch, int pp, int vocab, int salt, engine_stats *window) {
    int32_t *p = malloc(sizeof(int32_t) * (size_t)pp);
    if (!p) return -1;
    engine_stats s0, s1;
    engine_get_stats(e, &s0);
    char err[256];
    uint64_t t0 = clock_now_ns();
    double t = -1;
    int submitted = 0;
    for (; submitted < batch; submitted++) {
        fill_prompt(p, pp, vocab, salt + submitted);
        engine_request r = {.prompt = p, .n_prompt = pp, .max_tokens = 1, .ban_eos = 1,
                            .no_prefix_cache = 1};
        r.sampling = sampling_params_default();
        r.sampling.temperature = 0;
        if (engine_submit(e, (uint64_t)submitted + 1, &r, err, sizeof err) != 0) {
            fprintf(stderr, "exo bench: %s\n", err);
            break;
        }
    }
    engine_event ev[64];
    int failed = 0;
    while (engine_pending(e) && !failed) failed = engine_step(e, ev, 64) < 0;
    if (submitted == batch && !failed) t = (double)(clock_now_ns() - t0) * 1e-9;
    if (window) {
        engine_get_stats(e, &s1);
        *window = s1;
        window->steps -= s0.steps;
        window->step_ns -= s0.step_ns;
        window->comm_ns -= s0.comm_ns;
    }
    free(p);
    return t;
}

/* Runs one pp-token prefill; returns seconds. */
static double run_prefill(engine *e, int pp, int vocab, int salt) {
    return bench_run_prefill(e, 1, pp, vocab, salt, NULL);
}

/* B streams of tg tokens after a 16-token prompt; returns decode tok/s (all streams). window
 * (may be NULL): the engine's steps and step/communication time in the decode window. probe
 * (may be NULL): swept once after every decode step, its time left out of the decode's. */
static double run_decode(engine *e, int batch, int tg, int vocab, engine_stats *window, bench_probe *probe) {
    engine_stats s0 = {0}, s1;
    char err[256];
    int32_t p[16];
    for (int b = 0; b < batch; b++) {
        fill_prompt(p, 16, vocab, 100 + b);
        engine_request r = {.prompt = p, .n_prompt = 16, .max_tokens = tg, .ban_eos = 1,
                            .no_prefix_cache = 1};
        r.sampling = sampling_params_default();
        r.sampling.temperature = 0;
        if (engine_submit(e, (uint64_t)b, &r, err, sizeof err) != 0) {
            fprintf(stderr, "exo bench: %s\n", err);
            return 0;
        }
    }
    engine_event ev[256];
    int first = 0, decoded = 0;
    uint64_t t0 = 0, probing = 0; /* ns spent in the probe since t0 */
    while (engine_pending(e)) {
        int n = engine_step(e, ev, 256);
        if (n < 0) return 0;
        int in_window = first == batch;
        for (int i = 0; i < n; i++) {
            if (ev[i].token < 0) continue;
            if (first < batch) {
                if (++first == batch) { /* every prefill done */
                    t0 = clock_now_ns();
                    engine_get_stats(e, &s0);
                }
            } else {
                decoded++;
            }
        }
        if (probe && in_window && engine_pending(e)) {
            uint64_t p0 = clock_now_ns();
            bench_probe_sweep(probe);
            probing += clock_now_ns() - p0;
        }
    }
    double t = (double)(clock_now_ns() - t0 - probing) * 1e-9;
    if (window) {
        engine_get_stats(e, &s1);
        *window = s1;
        window->steps -= s0.steps;
        window->step_ns -= s0.step_ns;
        window->comm_ns -= s0.comm_ns;
    }
    return t > 0 ? decoded / t : 0;
}

double bench_run_decode(engine *e, int batch, int tg, int vocab, engine_stats *window) {
    return run_decode(e, batch, tg, vocab, window, NULL);
}

/* One more decode of b streams with a 1 GiB read probe swept between its steps
 * (bench_probe_sweep): its rate against the roofline at the probe's bandwidth, both measured in
 * the same seconds of the host. The line above compares the best of the reps with the better of
 * two probes taken apart from them, which on a busy shared host can be another host. */
static void print_paired_decode(engine *e, const model_costs *mc, int b, int tg, int vocab, const char *kv,
                                double peak) {
    bench_probe *probe = bench_probe_open((size_t)1 << 30);
    if (!probe) return;
    steal_mark sm = steal_now();
    double rate = run_decode(e, b, tg, vocab, NULL, probe), gbs = bench_probe_gbs(probe);
    bench_probe_close(probe);
    if (rate <= 0 || gbs <= 0) return;
    roofline rl = roofline_for(mc, b, 16 + tg / 2.0, kv, gbs, peak);
    printf("decode  tg%-5d b%-2d: %8.1f tok/s  paired roofline %8.1f tok/s (probe between the "
           "steps: %.1f GB/s) = %5.1f%% | steal %.1f%%\n", tg, b, rate, rl.rate, gbs,
           rl.rate > 0 ? 100 * rate / rl.rate : 0, steal_pct_since(sm));
    fflush(stdout);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(double *v, int n, double q) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

/* N concurrent streams arriving together (vLLM's serving metrics): prompt_len-token prompts,
 * tg tokens each. Prints aggregate and per-stream tok/s, TTFT and inter-token latency p50/p99. */
/* The ceilings a decode measurement is compared with (see the top of the file). */
typedef struct ceilings {
    const model_costs *mc;
    const char *kv;
    double read_gbs, peak, int_peak; /* first probe; f32 GEMM peak; the better of it and the MLX one */
} ceilings;

/* One measurement of N streams (what run_streams prints). */
typedef struct streams_result {
    double agg, per_stream, ttft50, ttft99, itl50, itl99, decode; /* decode: 0 = no window */
} streams_result;

static int measure_streams(engine *e, int n, int prompt_len, int tg, int vocab, int seed,
                           streams_result *res) {
    char err[256];
    int ok = 0;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)prompt_len);
    double *ttft = calloc((size_t)n, sizeof *ttft), *last = calloc((size_t)n, sizeof *last);
    double *first = calloc((size_t)n, sizeof *first);
    double *itl = malloc(sizeof(double) * (size_t)n * (size_t)tg);
    int n_itl = 0, total = 0;
    uint64_t t0 = clock_now_ns();
    for (int b = 0; b < n; b++) {
        fill_prompt(p, prompt_len, vocab, seed + b);
        engine_request r = {.prompt = p, .n_prompt = prompt_len, .max_tokens = tg, .ban_eos = 1,
                            .no_prefix_cache = 1};
        r.sampling = sampling_params_default();
        r.sampling.temperature = 0;
        if (engine_submit(e, (uint64_t)b, &r, err, sizeof err) != 0) {
            fprintf(stderr, "exo bench: %s\n", err);
            goto out;
        }
    }
    engine_event ev[256];
    /* the decode window: from the step where the last stream got its first token (every
     * stream decoding from then on) to the step where the first one finished */
    int n_started = 0, window_tokens = 0, window_open = 0, window_closed = 0;
    double t_open = 0, t_close = 0;
    while (engine_pending(e)) {
        int k = engine_step(e, ev, 256);
        if (k < 0) goto out;
        double now = (double)(clock_now_ns() - t0) * 1e-9;
        int step_tokens = 0, finished = 0;
        for (int i = 0; i < k; i++) {
            if (ev[i].token < 0) continue;
            int b = (int)ev[i].seq_id;
            if (!ttft[b]) first[b] = ttft[b] = now, n_started++;
            else itl[n_itl++] = now - last[b];
            last[b] = now;
            total++;
            step_tokens++;
            finished |= ev[i].finish != ENGINE_FINISH_NONE;
        }
        if (window_open && !window_closed) window_tokens += step_tokens;
        if (window_open && !window_closed && finished) window_closed = 1, t_close = now;
        if (!window_open && n_started == n) window_open = 1, t_open = now;
    }
    double end = 0, per_stream = 0;
    for (int b = 0; b < n; b++) {
        end = last[b] > end ? last[b] : end;
        per_stream += last[b] > first[b] ? (tg - 1) / (last[b] - first[b]) : 0;
    }
    *res = (streams_result){total / end, per_stream / n, percentile(ttft, n, 0.5),
                            percentile(ttft, n, 0.99), percentile(itl, n_itl, 0.5),
                            percentile(itl, n_itl, 0.99),
                            window_closed && t_close > t_open ? window_tokens / (t_close - t_open) : 0};
    ok = 1;
out:
    free(p);
    free(ttft);
    free(first);
    free(last);
    free(itl);
    return ok;
}

/* N concurrent streams, `reps` times (fresh prompts each time); prints the repetition with the
 * fastest decode window -- as the decode lines print the best of their reps: on a VM whose host
 * takes the cores away at times, the slowest runs measure the host -- and the median next to it. */
static void run_streams(engine *e, int n, int prompt_len, int tg, int vocab, int reps,
                        const ceilings *c) {
    streams_result best = {0}, r;
    double rates[16];
    int done = 0;
    if (reps > 16) reps = 16;
    steal_mark sm = steal_now();
    for (int i = 0; i < reps; i++) {
        if (!measure_streams(e, n, prompt_len, tg, vocab, 1000 + 100 * i, &r)) return;
        rates[done++] = r.decode;
        if (r.decode >= best.decode) best = r;
    }
    double median = percentile(rates, done, 0.5), steal = steal_pct_since(sm);
    double bw = read_gbs_now(c->read_gbs);
    double roof = roofline_for(c->mc, n, prompt_len + tg / 2.0, c->kv, bw, c->peak).rate;
    double roof_int = roofline_for(c->mc, n, prompt_len + tg / 2.0, c->kv, bw, c->int_peak).rate;
    printf("streams %-3d pp%d tg%d: %8.1f tok/s output (all of it / wall time), %6.1f tok/s per "
           "stream | TTFT p50 %7.1f ms p99 %7.1f ms | ITL p50 %6.1f ms p99 %6.1f ms | decode "
           "with all %d streams in the batch %8.1f tok/s = %5.1f%% of roofline %.1f",
           n, prompt_len, tg, best.agg, best.per_stream, 1e3 * best.ttft50, 1e3 * best.ttft99,
           1e3 * best.itl50, 1e3 * best.itl99, n, best.decode,
           roof > 0 ? 100 * best.decode / roof : 0, roof);
    if (roof_int > roof) printf(" (%5.1f%% of int-gemm roofline %.1f)", 100 * best.decode / roof_int, roof_int);
    if (done > 1)
        printf(" | best of %d, median %.1f tok/s = %.1f%%", done, median, roof > 0 ? 100 * median / roof : 0);
    printf(" [%.1f GB/s] steal %.1f%%\n", bw, steal);
    fflush(stdout);
}

/* Short requests arriving during a long chunked prefill: the long prompt (long_len tokens) is
 * prefilled in chunks of `chunk` tokens while n_short requests of short_len tokens arrive at
 * random times spread over it. Arrivals follow a schedule on the clock; the loop submits every
 * request whose time has come before each step -- exactly what a runner does with requests that
 * arrive while a step runs -- and a request's TTFT runs from its scheduled arrival to its first
 * token. Its chunk time is the duration of the full-chunk step nearest to its arrival (the one
 * it arrived during, when that was one), measured in the same run, so a machine whose speed
 * drifts (shared, throttled) still gives a fair ratio. Prints TTFT p50/p99/max, the median chunk
 * time and the p99 and max of TTFT / chunk time (target below 1.5). */
typedef struct bench_step {
    double start, end;
    int full; /* the long prompt advanced by (nearly) a whole chunk */
} bench_step;

static double nearest_full_step(const bench_step *st, int n, double t) {
    double best = 0, dist = 1e30;
    for (int i = 0; i < n; i++) {
        if (!st[i].full) continue;
        double d = t < st[i].start ? st[i].start - t : t > st[i].end ? t - st[i].end : 0;
        if (d < dist) dist = d, best = st[i].end - st[i].start;
    }
    return best;
}

static void run_interrupt(const char *model_dir, const char *kv, const char *device, int long_len,
                          int short_len, int n_short, int chunk, int reps, int vocab) {
    engine_options o = {.model_dir = model_dir, .max_batch_tokens = chunk, .max_sequences = 64,
                        .context_length = long_len + 64, .kv_cache_dtype = kv, .device = device};
    char err[512];
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "exo bench: %s\n", err);
        return;
    }
    int32_t *lp = malloc(sizeof(int32_t) * (size_t)long_len);
    int32_t *sp = malloc(sizeof(int32_t) * (size_t)short_len);
    int n_all = n_short * reps, max_steps = 4 * (long_len / chunk + n_short + 8);
    double *ttft = calloc((size_t)n_all + 1, sizeof *ttft);
    double *ratio = calloc((size_t)n_all + 1, sizeof *ratio);
    double *chunks = calloc((size_t)max_steps * (size_t)reps + 1, sizeof *chunks);
    double *at = calloc((size_t)n_short + 1, sizeof *at), *first = calloc((size_t)n_short + 1, 8);
    bench_step *st = calloc((size_t)max_steps, sizeof *st);
    int n_ttft = 0, n_chunks = 0;
    uint64_t x = 0x2545f4914f6cdd1dull;
    /* warm-up (faults the weights in) and a first estimate of the chunk time for the schedule */
    double est = run_prefill(e, chunk, vocab, 77);
    est = run_prefill(e, chunk, vocab, 78);
    for (int rep = 0; rep < reps && lp && sp && ttft && ratio && chunks && at && first && st;
         rep++) {
        fill_prompt(lp, long_len, vocab, 5000 + rep);
        engine_request r = {.prompt = lp, .n_prompt = long_len, .max_tokens = 2, .ban_eos = 1,
                            .no_prefix_cache = 1};
        r.sampling = sampling_params_default();
        r.sampling.temperature = 0;
        if (engine_submit(e, 0, &r, err, sizeof err) != 0) {
            fprintf(stderr, "exo bench: %s\n", err);
            break;
        }
        double span = 0.9 * est * long_len / chunk; /* arrivals spread over the expected prefill */
        for (int i = 0; i < n_short; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            at[i] = span * (double)(x % 1000000) / 1e6;
            first[i] = 0;
        }
        qsort(at, (size_t)n_short, sizeof *at, cmp_double);
        int next = 0, long_done = 0, n_st = 0;
        uint64_t t0 = clock_now_ns();
        engine_event ev[256];
        while (engine_pending(e) || next < n_short) {
            double now = (double)(clock_now_ns() - t0) * 1e-9;
            while (next < n_short && at[next] <= now) {
                fill_prompt(sp, short_len, vocab, 9000 + rep * 1000 + next);
                engine_request q = r;
                q.prompt = sp;
                q.n_prompt = short_len;
                q.max_tokens = 4;
                if (engine_submit(e, (uint64_t)next + 1, &q, err, sizeof err) != 0)
                    fprintf(stderr, "exo bench: %s\n", err);
                next++;
            }
            if (!engine_pending(e)) { /* idle until the next arrival */
                usleep(200);
                continue;
            }
            int k = engine_step(e, ev, 256);
            if (k < 0) break;
            double end = (double)(clock_now_ns() - t0) * 1e-9;
            int full = 0;
            for (int i = 0; i < k; i++) {
                int id = (int)ev[i].seq_id;
                if (id == 0 && ev[i].token < 0) {
                    full = ev[i].prefill_done - long_done >= chunk - n_short;
                    long_done = ev[i].prefill_done;
                } else if (id > 0 && id <= n_short && ev[i].token >= 0 && !first[id - 1]) {
                    first[id - 1] = end;
                }
            }
            if (n_st < max_steps) st[n_st++] = (bench_step){now, end, full};
            if (full) chunks[n_chunks++] = end - now;
        }
        for (int i = 0; i < n_short; i++) {
            if (!first[i]) continue;
            double c = nearest_full_step(st, n_st, at[i]);
            ttft[n_ttft] = first[i] - at[i];
            ratio[n_ttft++] = c > 0 ? (first[i] - at[i]) / c : 0;
        }
    }
    double chunk_s = percentile(chunks, n_chunks, 0.5);
    double p50 = percentile(ttft, n_ttft, 0.5), p99 = percentile(ttft, n_ttft, 0.99);
    double mx = percentile(ttft, n_ttft, 1.0);
    double r50 = percentile(ratio, n_ttft, 0.5), r99 = percentile(ratio, n_ttft, 0.99);
    double rmax = percentile(ratio, n_ttft, 1.0);
    printf("interrupt pp%d chunk %d: %d short requests (%d tokens) arriving during the prefill: "
           "chunk time median %.1f ms (%d full-chunk steps; first chunk alone %.1f ms) | TTFT p50 "
           "%.1f ms p99 %.1f ms max %.1f ms | TTFT / chunk time of its arrival: p50 %.2f p99 "
           "%.2f max %.2f (target p99 < 1.5) | p99 TTFT / median chunk %.2f\n",
           long_len, chunk, n_ttft, short_len, 1e3 * chunk_s, n_chunks, 1e3 * est, 1e3 * p50,
           1e3 * p99, 1e3 * mx, r50, r99, rmax, chunk_s > 0 ? p99 / chunk_s : 0);
    fflush(stdout);
    free(lp);
    free(sp);
    free(ttft);
    free(ratio);
    free(chunks);
    free(at);
    free(first);
    free(st);
    engine_close(e);
}

int bench_model_main(const char *model_dir, int argc, char **argv, double read_gbs) {
    int pp[8] = {128, 512}, n_pp = 2, batch[8] = {1, 8}, n_batch = 2, tg = 64, reps = 2;
    int streams[8] = {0}, n_streams = 0, stream_prompt = 128;
    int interrupt = 0, short_prompt = 32, n_short = 24, chunk = 512, set_pp = 0, set_batch = 0;
    const char *kv = NULL, *device = NULL, *spec = NULL;
    int spec_k[8] = {2, 4}, n_spec_k = 2;
    for (int i = 0; i < argc; i++) /* several ranks: cmd_bench_dist.c */
        if (!strcmp(argv[i], "--tp") || !strcmp(argv[i], "--pp-ranks") || !strcmp(argv[i], "--rank"))
            return bench_dist_main(model_dir, argc, argv);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "exo bench --model: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--pp")) n_pp = parse_list(v, pp, 8), set_pp = 1;
        else if (!strcmp(a, "--batch")) n_batch = parse_list(v, batch, 8), set_batch = 1;
        else if (!strcmp(a, "--tg")) tg = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--kv-dtype")) kv = v;
        else if (!strcmp(a, "--streams")) n_streams = parse_list(v, streams, 8);
        else if (!strcmp(a, "--stream-prompt")) stream_prompt = atoi(v);
        else if (!strcmp(a, "--interrupt")) interrupt = atoi(v);
        else if (!strcmp(a, "--short-prompt")) short_prompt = atoi(v);
        else if (!strcmp(a, "--shorts")) n_short = atoi(v);
        else if (!strcmp(a, "--chunk")) chunk = atoi(v);
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--spec")) spec = v;
        else if (!strcmp(a, "--spec-k")) n_spec_k = parse_list(v, spec_k, 8);
        else {
            fprintf(stderr, "exo bench --model: unknown option %s (--pp 128,512 --tg 64 "
                    "--batch 1,8 --reps 2 --kv-dtype f16 --streams 1,8,32 --stream-prompt 128 "
                    "--interrupt 4096 --short-prompt 32 --shorts 24 --chunk 512 "
                    "--device cpu|cuda|auto --spec ngram|mtp|oracle|miss|draft:DIR --spec-k 2,4; several ranks: --tp N or --pp-ranks N, see "
                    "cmd_bench_dist.c)\n", a);
            return 2;
        }
        if (n_pp < 1 || n_batch < 1 || tg < 2 || reps < 1 || n_streams < 0 || stream_prompt < 1 ||
            interrupt < 0 || short_prompt < 1 || n_short < 1 || n_short > 1000 || chunk < 16 ||
            n_spec_k < 1) {
            fprintf(stderr, "exo bench --model: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (spec && strcmp(spec, "off")) /* its own section: bench_spec.c */
        return bench_spec_main(model_dir, spec, spec_k, n_spec_k, tg, reps, device, kv);
    /* --streams / --interrupt alone run only those sections */
    if ((n_streams || interrupt) && !set_pp) n_pp = 0;
    if ((n_streams || interrupt) && !set_batch) n_batch = 0;
    int max_pp = 0, max_b = 0;
    for (int i = 0; i < n_pp; i++) max_pp = pp[i] > max_pp ? pp[i] : max_pp;
    for (int i = 0; i < n_batch; i++) max_b = batch[i] > max_b ? batch[i] : max_b;
    for (int i = 0; i < n_streams; i++) max_b = streams[i] > max_b ? streams[i] : max_b;
    if (n_streams && stream_prompt > max_pp) max_pp = stream_prompt;
    if (max_pp < 16) max_pp = 16;
    if (max_b < 1) max_b = 1;
    model_config cfg;
    char err[512];
    compute_device dev;
    if (compute_device_check(device, &dev, err, sizeof err) != 0) {
        fprintf(stderr, "exo bench: %s\n", err);
        return 2;
    }
    if (model_config_load(model_dir, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "exo bench: %s\n", err);
        return 1;
    }
    int ctx = max_pp + tg + 16;
    size_t kv_bytes = (size_t)((double)(max_b + 1) * ctx * cfg.n_layers * 2 *
                               cfg.n_kv_heads * cfg.head_dim * 4) + (64u << 20);
    /* prefill benchmarks run each prompt in one step; otherwise the server's default chunk */
    engine_options o = {.model_dir = model_dir, .max_batch_tokens = max_pp > 512 ? max_pp : 512,
                        .max_sequences = max_b, .device = device,
                        .context_length = ctx, .kv_cache_bytes = kv_bytes, .kv_cache_dtype = kv};
    uint64_t t0 = clock_now_ns();
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "exo bench: %s\n", err);
        return 1;
    }
    const engine_info *info = engine_get_info(e);
    model_costs mc;
    costs_of(&cfg, info, &mc);
    double open_s = (double)(clock_now_ns() - t0) * 1e-9;
    on_gpu = info->on_gpu;
    double blas = 0, ours = 0, peak = 0, mlx_peak = 0;
    if (on_gpu) {
        read_gbs = compute_gpu_copy_gbs(GPU_COPY_BYTES, 5);
        peak = compute_gpu_gemm_bf16_gflops(GPU_GEMM_N, 5);
    } else {
        peak = gemm_peak_gflops(&blas, &ours);
        mlx_peak = cfg.quant_bits ? bench_mlx_matmul_gflops(cfg.quant_bits, cfg.quant_group_size, 1536, 128) : 0;
    }
    double decode_peak = mlx_peak > peak ? mlx_peak : peak;
    double file_bytes = on_gpu || mc.moe_layers ? 0 : gguf_file_bytes_per_token(model_dir);
    printf("model %s: %s, %d layers, %.1f MB of weights read per token, %.2f GFLOP per token "
           "(opened in %.1f s) on %s\n", model_dir, info->architecture, info->n_layers,
           info->weight_bytes / 1e6, mc.flops_per_token * 1e-9, open_s, info->device);
    if (on_gpu)
        printf("gpu   copy %zu MiB device to device: %.1f GB/s (read + written: the decode "
               "roofline's bandwidth) | cuBLAS bf16 GEMM %d^3: %.1f GFLOP/s (the prefill "
               "ceiling)\n", GPU_COPY_BYTES >> 20, read_gbs, GPU_GEMM_N, peak);
    else
        printf("gemm  f32 1536^3: OpenBLAS %.1f GFLOP/s, cpu_matmul %.1f GFLOP/s (peak = the "
               "better: the prefill ceiling)\n", blas, ours);
    if (mlx_peak > 0)
        printf("gemm  MLX %d-bit g%d 1536^2 x 128 tokens: %.1f GFLOP/s (int-gemm rooflines use the "
               "better of this and the f32 peak: %.1f)\n", cfg.quant_bits, cfg.quant_group_size,
               mlx_peak, decode_peak);
    run_prefill(e, 16, cfg.vocab_size, 0); /* fault the weights in */
    for (int i = 0; i < n_pp; i++) {
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t = run_prefill(e, pp[i], cfg.vocab_size, r + 1);
            if (t > 0 && t < best) best = t;
        }
        double gflops = mc.flops_per_token * pp[i] / best * 1e-9;
        printf("prefill pp%-5d b1: %8.1f tok/s  %7.1f GFLOP/s = %5.1f%% of %s GEMM peak\n", pp[i],
               pp[i] / best, gflops, peak > 0 ? 100 * gflops / peak : 0, on_gpu ? "bf16" : "f32");
        fflush(stdout);
    }
    for (int i = 0; i < n_batch; i++) {
        int b = batch[i];
        double best = 0;
        steal_mark sm = steal_now();
        for (int r = 0; r < reps; r++) {
            double rate = bench_run_decode(e, b, tg, cfg.vocab_size, NULL);
            best = rate > best ? rate : best;
        }
        double bw = read_gbs_now(read_gbs);
        roofline rl = roofline_for(&mc, b, 16 + tg / 2.0, kv, bw, peak);
        roofline ri = roofline_for(&mc, b, 16 + tg / 2.0, kv, bw, decode_peak);
        printf("decode  tg%-5d b%-2d: %8.1f tok/s  roofline %8.1f tok/s (%s, %.1f MB/step at "
               "%.1f GB/s) = %5.1f%%", tg, b, best, rl.rate, rl.memory_bound ? "memory" : "compute",
               rl.step_bytes / 1e6, bw, rl.rate > 0 ? 100 * best / rl.rate : 0);
        if (ri.rate > rl.rate) printf(" (%5.1f%% of int-gemm roofline %.1f)", 100 * best / ri.rate, ri.rate);
        if (file_bytes > 0) {
            model_costs as_file = mc;
            as_file.dense_bytes = file_bytes;
            roofline rf = roofline_for(&as_file, b, 16 + tg / 2.0, kv, bw, 0);
            printf(" | GGUF file roofline %.1f tok/s (%.1f MB/step) = %5.1f%%", rf.rate,
                   rf.step_bytes / 1e6, rf.rate > 0 ? 100 * best / rf.rate : 0);
        }
        printf(" | steal %.1f%%\n", steal_pct_since(sm));
        fflush(stdout);
        if (!on_gpu) print_paired_decode(e, &mc, b, tg, cfg.vocab_size, kv, peak);
    }
    ceilings ceil = {.mc = &mc, .kv = kv, .read_gbs = read_gbs, .peak = peak, .int_peak = decode_peak};
    for (int i = 0; i < n_streams; i++) {
        run_streams(e, streams[i], stream_prompt, tg, cfg.vocab_size, reps, &ceil);
    }
    engine_close(e);
    if (interrupt)
        run_interrupt(model_dir, kv, device, interrupt, short_prompt, n_short, chunk, reps, cfg.vocab_size);
    return 0;
}
