/* exo bench --model DIR — end-to-end prefill and decode speed of one model through the engine
 * door, each number next to its ceiling measured in the same run:
 *   prefill (pp N, one request): tok/s and GFLOP/s as a fraction of the f32 GEMM peak
 *     (OpenBLAS sgemm, measured here);
 *   decode (tg N at batch B): aggregate tok/s against the roofline
 *     min(B / (bytes read per step / read bandwidth), B * flops per token / GEMM peak), where a
 *     step reads the weights (MoE: the experts B tokens can touch) and every sequence's KV cache.
 * Refuses: writing files (bench/run.sh records results). */
#include "base/clock.h"
#include "compute/cpu/cpu.h"
#include "infer/engine.h"
#include "model/model_config.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bench_model_main(const char *model_dir, int argc, char **argv, double read_gbs);

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

static double gemm_peak_gflops(void) {
    int n = 1536;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    if (!a || !b || !c) return 0;
    for (int i = 0; i < n * n; i++) a[i] = b[i] = (float)(i % 7) * 0.1f;
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        uint64_t t0 = clock_now_ns();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double t = (double)(clock_now_ns() - t0) * 1e-9;
        best = t < best ? t : best;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * (double)n / best * 1e-9;
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

/* Runs one pp-token prefill; returns seconds. */
static double run_prefill(engine *e, int pp, int vocab, int salt) {
    int32_t *p = malloc(sizeof(int32_t) * (size_t)pp);
    fill_prompt(p, pp, vocab, salt);
    engine_request r = {.prompt = p, .n_prompt = pp, .max_tokens = 1, .ban_eos = 1,
                        .no_prefix_cache = 1};
    r.sampling = sampling_params_default();
    r.sampling.temperature = 0;
    char err[256];
    double t = -1;
    if (engine_submit(e, 1, &r, err, sizeof err) == 0) {
        uint64_t t0 = clock_now_ns();
        engine_event ev[4];
        while (engine_pending(e))
            if (engine_step(e, ev, 4) < 0) break;
        t = (double)(clock_now_ns() - t0) * 1e-9;
    } else {
        fprintf(stderr, "exo bench: %s\n", err);
    }
    free(p);
    return t;
}

/* B streams of tg tokens after a 16-token prompt; returns decode tok/s (all streams). */
static double run_decode(engine *e, int batch, int tg, int vocab) {
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
    uint64_t t0 = 0;
    while (engine_pending(e)) {
        int n = engine_step(e, ev, 256);
        if (n < 0) return 0;
        for (int i = 0; i < n; i++) {
            if (ev[i].token < 0) continue;
            if (first < batch) {
                if (++first == batch) t0 = clock_now_ns(); /* every prefill done */
            } else {
                decoded++;
            }
        }
    }
    double t = (double)(clock_now_ns() - t0) * 1e-9;
    return t > 0 ? decoded / t : 0;
}

int bench_model_main(const char *model_dir, int argc, char **argv, double read_gbs) {
    int pp[8] = {128, 512}, n_pp = 2, batch[8] = {1, 8}, n_batch = 2, tg = 64, reps = 2;
    const char *kv = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "exo bench --model: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--pp")) n_pp = parse_list(v, pp, 8);
        else if (!strcmp(a, "--batch")) n_batch = parse_list(v, batch, 8);
        else if (!strcmp(a, "--tg")) tg = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--kv-dtype")) kv = v;
        else {
            fprintf(stderr, "exo bench --model: unknown option %s (--pp 128,512 --tg 64 "
                    "--batch 1,8 --reps 2 --kv-dtype f16)\n", a);
            return 2;
        }
        if (n_pp < 1 || n_batch < 1 || tg < 2 || reps < 1) {
            fprintf(stderr, "exo bench --model: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    int max_pp = 0, max_b = 0;
    for (int i = 0; i < n_pp; i++) max_pp = pp[i] > max_pp ? pp[i] : max_pp;
    for (int i = 0; i < n_batch; i++) max_b = batch[i] > max_b ? batch[i] : max_b;
    model_config cfg;
    char err[512];
    if (model_config_load(model_dir, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "exo bench: %s\n", err);
        return 1;
    }
    int ctx = (max_pp > 16 + tg ? max_pp : 16 + tg) + 16;
    size_t kv_bytes = (size_t)((double)(max_b + 1) * ctx * cfg.n_layers * 2 *
                               cfg.n_kv_heads * cfg.head_dim * 4) + (64u << 20);
    engine_options o = {.model_dir = model_dir, .max_batch_tokens = max_pp, .max_sequences = max_b,
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
    double peak = gemm_peak_gflops();
    printf("model %s: %s, %d layers, %.1f MB of weights read per token, %.2f GFLOP per token "
           "(opened in %.1f s)\n", model_dir, info->architecture, info->n_layers,
           info->weight_bytes / 1e6, mc.flops_per_token * 1e-9,
           (double)(clock_now_ns() - t0) * 1e-9);
    printf("gemm  OpenBLAS sgemm 1536^3: %.1f GFLOP/s (prefill ceiling)\n", peak);
    run_prefill(e, 16, cfg.vocab_size, 0); /* fault the weights in */
    for (int i = 0; i < n_pp; i++) {
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t = run_prefill(e, pp[i], cfg.vocab_size, r + 1);
            if (t > 0 && t < best) best = t;
        }
        double gflops = mc.flops_per_token * pp[i] / best * 1e-9;
        printf("prefill pp%-5d b1: %8.1f tok/s  %7.1f GFLOP/s = %5.1f%% of GEMM peak\n", pp[i],
               pp[i] / best, gflops, peak > 0 ? 100 * gflops / peak : 0);
        fflush(stdout);
    }
    for (int i = 0; i < n_batch; i++) {
        int b = batch[i];
        double best = 0;
        for (int r = 0; r < reps; r++) {
            double rate = run_decode(e, b, tg, cfg.vocab_size);
            best = rate > best ? rate : best;
        }
        /* bytes one step reads: shared weights, the experts b tokens can reach, b KV caches */
        double experts = mc.moe_layers ? (b * mc.top_k < mc.n_experts ? b * mc.top_k : mc.n_experts) : 0;
        double kv_per_pos = mc.kv_bytes_per_pos * (kv && !strcmp(kv, "f32") ? 2 : 1);
        double step_bytes = mc.dense_bytes + experts * mc.expert_bytes * mc.moe_layers +
                            b * (16 + tg / 2.0) * kv_per_pos;
        double mem_roof = read_gbs > 0 ? b * read_gbs * 1e9 / step_bytes : 0;
        double flop_roof = peak > 0 ? peak * 1e9 / mc.flops_per_token : 0;
        double roof = mem_roof < flop_roof || flop_roof == 0 ? mem_roof : flop_roof;
        printf("decode  tg%-5d b%-2d: %8.1f tok/s  roofline %8.1f tok/s (%s, %.1f MB/step at "
               "%.1f GB/s) = %5.1f%%\n", tg, b, best, roof,
               roof == mem_roof ? "memory" : "compute", step_bytes / 1e6, read_gbs,
               roof > 0 ? 100 * best / roof : 0);
        fflush(stdout);
    }
    engine_close(e);
    return 0;
}
