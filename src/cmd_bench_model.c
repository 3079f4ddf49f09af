/* exo bench --model DIR — end-to-end prefill and decode speed of one model through the engine
 * door (infer/engine.h), the way a user's request runs: random prompt token ids, greedy, eos banned,
 * prefix cache off. For every batch size B (default 1 and 8):
 *   pp N   B requests with N-token prompts and max_tokens 1: prefill tok/s = B*N / time to the
 *          last first token. Also as GFLOP/s (matmul + attention FLOPs from config.json) and as a
 *          fraction of the f32 GEMM peak measured in the same run.
 *   tg N   B requests with 8-token prompts, N tokens each: decode tok/s (all sequences together)
 *          after every sequence has its first token. Roofline: per step the weights are read once
 *          (engine_info.weight_bytes: active experts only, so for MoE at B > 1 the roofline is
 *          optimistic) plus every sequence's KV cache; tok/s roof = B * bandwidth / bytes per step.
 * Refuses: to guess a bandwidth: the read-only bandwidth is measured first by cmd_bench.c. */
#include "base/clock.h"
#include "infer/engine.h"
#include "model/model_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bench_model_main(const char *model_dir, int argc, char **argv, double read_gbs, double gemm_peak);

typedef struct model_bench {
    engine *e;
    const engine_info *info;
    model_config cfg;
    int reps;
} model_bench;

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > 1 << 20) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static uint64_t bench_rng = 0x853c49e6748fea9bull;

/* Runs B requests to completion. Returns 0; *first_s = time until every sequence had its first
 * token, *total_s = time until all finished, *generated = tokens produced. */
static int run_batch(model_bench *mb, int batch, int prompt_len, int max_tokens, double *first_s,
                     double *total_s, long *generated) {
    char err[256];
    int32_t *prompt = malloc((size_t)prompt_len * sizeof *prompt);
    if (!prompt) return -1;
    uint64_t start = clock_now_ns();
    for (int b = 0; b < batch; b++) {
        for (int i = 0; i < prompt_len; i++) {
            bench_rng = bench_rng * 6364136223846793005ull + 1442695040888963407ull;
            prompt[i] = (int32_t)((bench_rng >> 33) % (uint64_t)mb->info->vocab_size);
        }
        engine_request req = {.prompt = prompt, .n_prompt = prompt_len, .max_tokens = max_tokens,
                              .ban_eos = 1, .no_prefix_cache = 1};
        req.sampling = sampling_params_default();
        req.sampling.temperature = 0;
        if (engine_submit(mb->e, (uint64_t)b + 1, &req, err, sizeof err) != 0) {
            fprintf(stderr, "exo bench: submit failed: %s\n", err);
            free(prompt);
            return -1;
        }
    }
    free(prompt);
    int have_first = 0, finished = 0;
    char *seen = calloc((size_t)batch + 1, 1);
    engine_event ev[64];
    *generated = 0;
    *first_s = 0;
    while (finished < batch) {
        int n = engine_step(mb->e, ev, 64);
        if (n < 0) {
            fprintf(stderr, "exo bench: engine step failed\n");
            free(seen);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            if (ev[i].token >= 0) {
                (*generated)++;
                uint64_t id = ev[i].seq_id;
                if (id >= 1 && id <= (uint64_t)batch && !seen[id]) {
                    seen[id] = 1;
                    if (++have_first == batch) *first_s = (double)(clock_now_ns() - start) * 1e-9;
                }
            }
            if (ev[i].finish == ENGINE_FINISH_ERROR) fprintf(stderr, "exo bench: %s\n", ev[i].error);
            if (ev[i].finish != ENGINE_FINISH_NONE) finished++;
        }
    }
    *total_s = (double)(clock_now_ns() - start) * 1e-9;
    free(seen);
    return 0;
}

/* Matmul FLOPs per token (2 per multiply-add), lm_head included, attention excluded. */
static double matmul_flops_per_token(const model_config *c) {
    double dim = c->hidden_size, qd = (double)c->n_heads * c->head_dim,
           kvd = (double)c->n_kv_heads * c->head_dim, total = 0;
    for (int l = 0; l < c->n_layers; l++) {
        total += dim * (qd + 2 * kvd) + qd * dim;
        if (model_config_layer_is_moe(c, l))
            total += dim * c->n_experts + 3.0 * dim * c->moe_intermediate_size * c->n_experts_per_tok;
        else
            total += 3.0 * dim * c->intermediate_size;
    }
    total += dim * c->vocab_size;
    return 2 * total;
}

/* Attention FLOPs for one token at context length ctx (QK^T and PV). */
static double attention_flops(const model_config *c, double ctx) {
    return 4.0 * c->n_layers * c->n_heads * (double)c->head_dim * ctx;
}

/* KV bytes read per token at context ctx (the engine's cache is f32). */
static double kv_bytes(const model_config *c, double ctx) {
    return 2.0 * c->n_layers * (double)c->n_kv_heads * c->head_dim * 4.0 * ctx;
}

static void usage(void) {
    fprintf(stderr, "usage: exo bench --model DIR [--pp 128,512,2048] [--tg 128] [--batch 1,8] [--reps N]\n");
}

int bench_model_main(const char *model_dir, int argc, char **argv, double read_gbs, double gemm_peak) {
    int pp[8] = {128, 512, 2048}, n_pp = 3, batches[8] = {1, 8}, n_batch = 2, tg = 128, reps = 2;
    for (int i = 0; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--pp") && (n_pp = parse_list(v, pp, 8)) >= 0) i++;
        else if (!strcmp(argv[i], "--batch") && (n_batch = parse_list(v, batches, 8)) > 0) i++;
        else if (!strcmp(argv[i], "--tg") && (tg = atoi(v)) >= 0) i++;
        else if (!strcmp(argv[i], "--reps") && (reps = atoi(v)) > 0) i++;
        else {
            fprintf(stderr, "exo bench: bad model option '%s'\n", argv[i]);
            usage();
            return 2;
        }
    }
    if (n_pp < 0 || n_batch <= 0 || tg < 0 || reps <= 0) {
        usage();
        return 2;
    }
    model_bench mb = {.reps = reps};
    char err[512];
    if (model_config_load(model_dir, &mb.cfg, err, sizeof err) != 0) {
        fprintf(stderr, "exo bench: %s\n", err);
        return 1;
    }
    int max_b = 1, max_pp = 8;
    for (int i = 0; i < n_batch; i++) max_b = batches[i] > max_b ? batches[i] : max_b;
    for (int i = 0; i < n_pp; i++) max_pp = pp[i] > max_pp ? pp[i] : max_pp;
    engine_options eo = {.model_dir = model_dir, .max_sequences = max_b < 8 ? 8 : max_b,
                         .context_length = max_pp + tg + 64};
    eo.kv_cache_bytes = (size_t)((double)max_b * kv_bytes(&mb.cfg, max_pp + tg + 64) / mb.cfg.n_layers *
                                 mb.cfg.n_layers * 1.25) + ((size_t)64 << 20);
    uint64_t t0 = clock_now_ns();
    mb.e = engine_open(&eo, err, sizeof err);
    if (!mb.e) {
        fprintf(stderr, "exo bench: cannot open %s: %s\n", model_dir, err);
        return 1;
    }
    mb.info = engine_get_info(mb.e);
    printf("model %s: %s, %d layers, weights read per token %.1f MB, opened in %.1f s\n", model_dir,
           mb.info->architecture, mb.info->n_layers, (double)mb.info->weight_bytes / 1e6,
           (double)(clock_now_ns() - t0) * 1e-9);
    double fpt = matmul_flops_per_token(&mb.cfg);
    double first, total;
    long gen;
    run_batch(&mb, 1, 8, 2, &first, &total, &gen); /* warm-up: page in the weights */
    for (int bi = 0; bi < n_batch; bi++) {
        int B = batches[bi];
        for (int pi = 0; pi < n_pp; pi++) {
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                if (run_batch(&mb, B, pp[pi], 1, &first, &total, &gen) != 0) goto fail;
                best = first < best ? first : best;
            }
            double toks = (double)B * pp[pi];
            double flops = toks * (fpt + attention_flops(&mb.cfg, pp[pi] / 2.0));
            printf("model B=%d pp%-5d prefill %8.1f tok/s  %7.1f GFLOP/s  %5.1f%% of GEMM peak %.1f\n", B,
                   pp[pi], toks / best, flops / best * 1e-9,
                   gemm_peak > 0 ? 100.0 * flops / best * 1e-9 / gemm_peak : 0, gemm_peak);
            fflush(stdout);
        }
        if (tg > 1) {
            double best_rate = 0;
            for (int r = 0; r < reps; r++) {
                if (run_batch(&mb, B, 8, tg, &first, &total, &gen) != 0) goto fail;
                double rate = (double)(gen - B) / (total - first);
                best_rate = rate > best_rate ? rate : best_rate;
            }
            double ctx = 8 + tg / 2.0;
            double step_bytes = (double)mb.info->weight_bytes + B * kv_bytes(&mb.cfg, ctx);
            double roof = read_gbs > 0 ? B * read_gbs * 1e9 / step_bytes : 0;
            printf("model B=%d tg%-5d decode  %8.2f tok/s  roofline %.2f tok/s (%.1f MB/step at %.2f GB/s)"
                   "  %5.1f%% of roofline\n",
                   B, tg, best_rate, roof, step_bytes / 1e6, read_gbs, roof > 0 ? 100 * best_rate / roof : 0);
            fflush(stdout);
        }
    }
    engine_close(mb.e);
    return 0;
fail:
    engine_close(mb.e);
    return 1;
}
