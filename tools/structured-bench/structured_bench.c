/* structured-bench — what structured outputs cost in decode throughput, measured in one process
 * on the engine itself (no HTTP, no other process between the two sides of the ratio).
 *
 *   build/tools/structured-bench MODEL_DIR [--batch 1,32] [--rounds 3] [--threads N]
 *                                [--mode same,varied] [--max-tokens 256]
 *
 * Per batch B and round, two runs from the same B random 16-token prompts:
 *   schema  B sequences constrained by a JSON schema (runner/structured.h, as the runner binds
 *           it), sampled at temperature 0.7 until the grammar ends them;
 *   free    the same B sequences without it, each given exactly the token count its twin made
 *           (eos banned), so both decode the same number of tokens.
 * It prints both rates (tokens / wall time), overhead = 1 - schema / free, and the share of the
 * schema run's wall time spent inside the constraint's mask and accept calls (timed around them:
 * the direct cost, which noise from other processes on the machine moves far less than the rate
 * difference). "same": every sequence shares one schema (its grammar and mask cache are warm
 * after the first round); "varied": every sequence of every round has a schema never seen, so
 * each of its masks is computed from scratch.
 *
 * Refuses: models without a tokenizer.json (the grammar needs the token bytes). */
#include "base/clock.h"
#include "infer/engine.h"
#include "runner/structured.h"
#include "text/json_schema.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BATCH 256

typedef struct timed_constraint {
    engine_constraint inner;
    uint64_t *ns; /* shared total */
} timed_constraint;

static void timed_mask(void *ctx, float *logits, int n) {
    timed_constraint *t = ctx;
    uint64_t t0 = clock_now_ns();
    t->inner.mask(t->inner.ctx, logits, n);
    *t->ns += clock_now_ns() - t0;
}

static void timed_accept(void *ctx, int32_t token) {
    timed_constraint *t = ctx;
    uint64_t t0 = clock_now_ns();
    t->inner.accept(t->inner.ctx, token);
    *t->ns += clock_now_ns() - t0;
}

static void timed_release(void *ctx) {
    timed_constraint *t = ctx;
    t->inner.release(t->inner.ctx);
    free(t);
}

/* A record with strings, a bounded array, an enum, a number range and a nested object; seed
 * makes the property names (and so the grammar and its states) differ. */
static char *schema_grammar(int seed) {
    char text[1536];
    snprintf(text, sizeof text,
             "{\"type\":\"object\",\"properties\":{"
             "\"word%d\":{\"type\":\"string\",\"maxLength\":24},"
             "\"meaning%d\":{\"type\":\"string\",\"maxLength\":48},"
             "\"examples%d\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":16},"
             "\"minItems\":1,\"maxItems\":3},"
             "\"kind%d\":{\"enum\":[\"noun\",\"verb\",\"adjective\",\"adverb\"]},"
             "\"score%d\":{\"type\":\"number\",\"minimum\":0,\"maximum\":10},"
             "\"detail%d\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
             "\"b\":{\"type\":\"boolean\"}},\"required\":[\"a\",\"b\"]}},"
             "\"required\":[\"word%d\",\"meaning%d\",\"examples%d\",\"kind%d\",\"score%d\","
             "\"detail%d\"],\"additionalProperties\":false}",
             seed, seed, seed, seed, seed, seed, seed, seed, seed, seed, seed, seed);
    json_error_t je;
    json_t *schema = json_loads(text, 0, &je);
    char err[256];
    char *g = json_schema_to_grammar(schema, err, sizeof err);
    json_decref(schema);
    if (!g) fprintf(stderr, "structured-bench: %s\n", err);
    return g;
}

typedef struct run_result {
    int tokens[MAX_BATCH];
    int total;
    double seconds;
    uint64_t constraint_ns;
} run_result;

/* B sequences; with grammars (one per sequence, NULL: free) until they end, else exactly
 * budget[b] tokens each. Returns 0 or -1. */
static int run(engine *e, structured *st, int batch, char **grammars, const int *budget,
               int max_tokens, int vocab, run_result *out) {
    memset(out, 0, sizeof *out);
    char err[512];
    for (int b = 0; b < batch; b++) {
        int32_t prompt[16];
        for (int i = 0; i < 16; i++)
            prompt[i] = 3 + (int32_t)((b * 7919u + i * 104729u) % (unsigned)(vocab - 3));
        engine_request r = {.prompt = prompt,
                            .n_prompt = 16,
                            .max_tokens = grammars ? max_tokens : budget[b],
                            .ban_eos = !grammars,
                            .no_prefix_cache = 1};
        r.sampling = sampling_params_default();
        r.sampling.seed = (uint64_t)b + 1;
        if (grammars) {
            timed_constraint *t = calloc(1, sizeof *t);
            if (structured_constraint(st, grammars[b], &t->inner, err, sizeof err)) {
                fprintf(stderr, "structured-bench: %s\n", err);
                free(t);
                return -1;
            }
            t->ns = &out->constraint_ns;
            r.constraint = (engine_constraint){
                .mask = timed_mask, .accept = timed_accept, .release = timed_release, .ctx = t};
        }
        if (engine_submit(e, (uint64_t)b, &r, err, sizeof err)) {
            fprintf(stderr, "structured-bench: %s\n", err);
            if (r.constraint.ctx) r.constraint.release(r.constraint.ctx);
            return -1;
        }
    }
    engine_event ev[MAX_BATCH * 2];
    uint64_t t0 = clock_now_ns();
    while (engine_pending(e)) {
        int n = engine_step(e, ev, MAX_BATCH * 2);
        if (n < 0) {
            fprintf(stderr, "structured-bench: %s\n", engine_last_error(e));
            return -1;
        }
        for (int i = 0; i < n; i++)
            if (ev[i].token >= 0) {
                out->tokens[ev[i].seq_id]++;
                out->total++;
            }
    }
    out->seconds = (double)(clock_now_ns() - t0) / 1e9;
    return 0;
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        while (*s && *s != ',')
            s++;
        if (*s == ',') s++;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: structured-bench MODEL_DIR [--batch 1,32] [--rounds 3] "
                        "[--threads N] [--mode same,varied] [--max-tokens 256]\n");
        return 2;
    }
    int batches[8] = {1, 32}, n_batches = 2, rounds = 3, threads = 0, max_tokens = 256;
    const char *modes = "same,varied";
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch"))
            n_batches = parse_list(argv[i + 1], batches, 8);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mode"))
            modes = argv[i + 1];
        else if (!strcmp(argv[i], "--max-tokens"))
            max_tokens = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "structured-bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    for (int i = 0; i < n_batches; i++)
        if (batches[i] < 1 || batches[i] > MAX_BATCH) {
            fprintf(stderr, "structured-bench: batch must be in [1, %d]\n", MAX_BATCH);
            return 2;
        }
    char err[512];
    tokenizer *tok = tokenizer_load(argv[1], err, sizeof err);
    if (!tok) {
        fprintf(stderr, "structured-bench: %s\n", err);
        return 1;
    }
    engine_options o = {.model_dir = argv[1],
                        .n_threads = threads,
                        .max_sequences = MAX_BATCH,
                        .context_length = 16 + max_tokens + 16};
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "structured-bench: %s\n", err);
        tokenizer_free(tok);
        return 1;
    }
    const engine_info *info = engine_get_info(e);
    structured *st = structured_new(tok, info);
    uint64_t t0 = clock_now_ns();
    char *warm = schema_grammar(0);
    engine_constraint c;
    if (structured_constraint(st, warm, &c, err, sizeof err) == 0) c.release(c.ctx);
    printf("model %s: vocab %d, %s; vocabulary trie built in %.1f ms\n", argv[1], info->vocab_size,
           info->device, (double)(clock_now_ns() - t0) / 1e6);
    int serial = 1;
    for (int b_i = 0; b_i < n_batches; b_i++) {
        int batch = batches[b_i];
        for (const char *m = modes; *m;) {
            int varied = !strncmp(m, "varied", 6);
            for (int r = 0; r < rounds; r++) {
                char *grammars[MAX_BATCH];
                for (int b = 0; b < batch; b++)
                    grammars[b] = varied ? schema_grammar(serial++) : strdup(warm);
                run_result with, without;
                int bad = run(e, st, batch, grammars, NULL, max_tokens, info->vocab_size, &with);
                for (int b = 0; b < batch; b++)
                    free(grammars[b]);
                if (bad ||
                    run(e, st, batch, NULL, with.tokens, max_tokens, info->vocab_size, &without))
                    return 1;
                double rate_with = with.total / with.seconds,
                       rate_without = without.total / without.seconds;
                printf("%-6s batch %3d round %d: %5d tokens | schema %8.1f tok/s | free %8.1f "
                       "tok/s | overhead %5.1f%% | in mask+accept %5.1f%% of the schema run "
                       "(%.3f ms per token)\n",
                       varied ? "varied" : "same", batch, r + 1, with.total, rate_with,
                       rate_without, 100 * (1 - rate_with / rate_without),
                       100 * (double)with.constraint_ns / 1e9 / with.seconds,
                       (double)with.constraint_ns / 1e6 / with.total);
                fflush(stdout);
            }
            while (*m && *m != ',')
                m++;
            if (*m == ',') m++;
        }
    }
    free(warm);
    engine_close(e);
    structured_free(st);
    tokenizer_free(tok);
    return 0;
}
