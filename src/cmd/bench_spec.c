/* exo bench --model DIR --spec METHOD [--spec-k 2,4] — speculative decoding against plain
 * decoding of the same requests in the same engine, alternated run by run (plain, k = 2, k = 4,
 * plain, ...) so a machine whose speed drifts under other load treats both alike; each line
 * prints the best and the median of the runs.
 *
 * Methods: ngram, mtp, draft:DIR (the engine's drafters); oracle (drafts the model's own greedy
 * continuation, recorded by a first plain run: 100% acceptance, the ceiling of what speculation
 * gains on this machine); miss (drafts that recorded continuation with every token changed: 0%
 * acceptance, the cost of verifying drafts that never land, which adaptive k must keep small).
 * Prompts: 16 random tokens, or for ngram a repetitive one (a 24-token phrase said 4 times),
 * the kind of context prompt lookup is for. Every speculative run's tokens are checked against
 * the plain run's (greedy: they must be identical).
 * Refuses: writing files (bench/run.sh records results). */
#include "base/clock.h"
#include "infer/drafter.h"
#include "infer/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bench_spec_main(const char *model_dir, const char *method, const int *ks, int n_k, int tg,
                    int reps, const char *device, const char *kv);

#define SPEC_PROMPT 96
#define SPEC_MAX_K 8

/* The "miss" drafter: the recorded greedy continuation with every token moved to the next id,
 * so greedy verification rejects each one. */
typedef struct miss_drafter {
    drafter base;
    drafter *oracle;
    int vocab;
} miss_drafter;

static int miss_propose(drafter *d, drafter_query *q, int n, char *err, size_t errlen) {
    miss_drafter *m = (miss_drafter *)d;
    if (m->oracle->propose(m->oracle, q, n, err, errlen) != 0) return -1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < q[i].n_draft; j++) q[i].draft[j] = (q[i].draft[j] + 1) % m->vocab;
    return 0;
}

static void miss_destroy(drafter *d) { (void)d; }

static void make_prompt(int32_t *p, int n, int vocab, int repetitive) {
    uint64_t x = 0x2545f4914f6cdd1dull;
    int period = repetitive ? 24 : n;
    for (int i = 0; i < n; i++) {
        if (i >= period) {
            p[i] = p[i - period];
            continue;
        }
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (int32_t)(x % (uint64_t)(vocab > 1000 ? 1000 : vocab)) + (vocab > 2000 ? 500 : 0);
    }
}

typedef struct spec_run {
    double rate;              /* decode tok/s after the first token */
    int32_t tokens[4096];
    int n;
    uint64_t verifies, drafted, accepted;
} spec_run;

/* One greedy request of tg tokens with the given speculation setting (-1: off). */
static int timed_request(engine *e, const int32_t *prompt, int n_prompt, int tg, int spec_tokens,
                         spec_run *out) {
    engine_request r = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = tg, .ban_eos = 1,
                        .no_prefix_cache = 1, .spec_tokens = spec_tokens};
    r.sampling = sampling_params_default();
    r.sampling.temperature = 0;
    char err[256];
    if (engine_submit(e, 1, &r, err, sizeof err) != 0) {
        fprintf(stderr, "exo bench: %s\n", err);
        return -1;
    }
    engine_stats s0, s1;
    engine_get_stats(e, &s0);
    engine_event ev[64];
    uint64_t t0 = 0, t1 = 0;
    out->n = 0;
    while (engine_pending(e)) {
        int n = engine_step(e, ev, 64);
        if (n < 0) {
            fprintf(stderr, "exo bench: %s\n", engine_last_error(e));
            return -1;
        }
        for (int i = 0; i < n; i++) {
            if (ev[i].token < 0) continue;
            if (out->n == 0) t0 = clock_now_ns();
            if (out->n < (int)(sizeof out->tokens / sizeof *out->tokens))
                out->tokens[out->n++] = ev[i].token;
            t1 = clock_now_ns();
        }
    }
    engine_get_stats(e, &s1);
    out->verifies = s1.spec_verifies - s0.spec_verifies;
    out->drafted = s1.spec_drafted - s0.spec_drafted;
    out->accepted = s1.spec_accepted - s0.spec_accepted;
    out->rate = t1 > t0 ? (out->n - 1) / ((double)(t1 - t0) * 1e-9) : 0;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n ? v[n / 2] : 0;
}

static double best_of(const double *v, int n) {
    double b = 0;
    for (int i = 0; i < n; i++) b = v[i] > b ? v[i] : b;
    return b;
}

int bench_spec_main(const char *model_dir, const char *method, const int *ks, int n_k, int tg,
                    int reps, const char *device, const char *kv) {
    int same = 1;
    int recorded = !strcmp(method, "oracle") || !strcmp(method, "miss");
    int max_k = 0;
    for (int i = 0; i < n_k; i++) max_k = ks[i] > max_k ? ks[i] : max_k;
    if (n_k < 1 || n_k > SPEC_MAX_K || max_k > ENGINE_SPEC_MAX_TOKENS) {
        fprintf(stderr, "exo bench: --spec-k takes 1 to %d values of 1..%d\n", SPEC_MAX_K,
                ENGINE_SPEC_MAX_TOKENS);
        return 2;
    }
    drafter *oracle = recorded ? drafter_oracle_create() : NULL;
    miss_drafter miss = {.base = {.name = "miss", .propose = miss_propose,
                                  .destroy = miss_destroy},
                         .oracle = oracle};
    engine_options o = {.model_dir = model_dir, .max_sequences = 1, .device = device,
                        .kv_cache_dtype = kv, .context_length = SPEC_PROMPT + tg + 64,
                        .spec_tokens = max_k,
                        .speculative = recorded ? NULL : method,
                        .drafter = !recorded ? NULL : !strcmp(method, "miss") ? &miss.base : oracle};
    char err[512];
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "exo bench: %s\n", err);
        if (oracle) oracle->destroy(oracle);
        return 1;
    }
    const engine_info *info = engine_get_info(e);
    miss.vocab = info->vocab_size;
    int32_t prompt[SPEC_PROMPT + 4096];
    int n_prompt = !strcmp(method, "ngram") ? SPEC_PROMPT : 16;
    make_prompt(prompt, n_prompt, info->vocab_size, !strcmp(method, "ngram"));
    static spec_run plain, run;
    /* warm-up, and the greedy continuation the oracle and miss drafters draft from */
    same = 0; /* until the runs compared */
    if (timed_request(e, prompt, n_prompt, tg, -1, &plain) != 0) goto out;
    if (oracle) {
        memcpy(prompt + n_prompt, plain.tokens, (size_t)plain.n * sizeof *prompt);
        drafter_oracle_add(oracle, prompt, n_prompt + plain.n);
    }
    double plain_rates[64], rates[SPEC_MAX_K][64];
    uint64_t verifies[SPEC_MAX_K] = {0}, drafted[SPEC_MAX_K] = {0}, accepted[SPEC_MAX_K] = {0};
    if (reps > 64) reps = 64;
    same = 1;
    for (int r = 0; r < reps; r++) {
        if (timed_request(e, prompt, n_prompt, tg, -1, &run) != 0) goto out;
        plain_rates[r] = run.rate;
        for (int i = 0; i < n_k; i++) {
            if (timed_request(e, prompt, n_prompt, tg, ks[i], &run) != 0) goto out;
            rates[i][r] = run.rate;
            verifies[i] += run.verifies, drafted[i] += run.drafted, accepted[i] += run.accepted;
            same &= run.n == plain.n && !memcmp(run.tokens, plain.tokens, (size_t)run.n * 4);
        }
    }
    double plain_best = best_of(plain_rates, reps), plain_median = median_of(plain_rates, reps);
    printf("speculative %s b1 pp%d tg%d on %s: plain %.1f tok/s (median %.1f)", method, n_prompt,
           tg, info->device, plain_best, plain_median);
    for (int i = 0; i < n_k; i++) {
        double best = best_of(rates[i], reps), median = median_of(rates[i], reps);
        double acc = drafted[i] ? 100.0 * (double)accepted[i] / (double)drafted[i] : 0;
        double per_verify = verifies[i] ? (double)(accepted[i] + verifies[i]) / (double)verifies[i] : 0;
        printf(" | k=%d: %.1f tok/s = %.2fx (median %.1f = %.2fx), %.0f%% of %llu drafted "
               "accepted, %.2f tokens per verifying step", ks[i], best,
               plain_best > 0 ? best / plain_best : 0, median,
               plain_median > 0 ? median / plain_median : 0, acc,
               (unsigned long long)(drafted[i] / (uint64_t)reps), per_verify);
    }
    printf(" | best of %d alternated runs; outputs %s\n", reps,
           same ? "identical to plain" : "DIFFER from plain");
    fflush(stdout);
out:
    engine_close(e);
    if (oracle) oracle->destroy(oracle);
    return same ? 0 : 1;
}
