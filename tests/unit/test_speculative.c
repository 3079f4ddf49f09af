/* Speculative decoding is lossless:
 *   - greedy: with every drafter (n-gram, oracle, a draft model, a drafter that is always wrong)
 *     each request gets exactly the tokens it gets without speculation, on every tiny model of
 *     the reference fixtures (tests/fixtures/reference/, their prompts plus a repetitive one),
 *     alone and batched, and batched again under a KV cache small enough to preempt; no KV block
 *     leaks, and the oracle's drafts are all accepted;
 *   - sampling: on a tiny vocabulary, the tokens sampled with a drafter that is sometimes right
 *     follow the same distribution as without (two-sample chi-square per output position; the
 *     p-values are printed and must exceed 1e-3 -- the seeds are fixed, so the run is
 *     deterministic);
 *   - the per-request override switches speculation off, and bad settings are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tiny_model.h"

#include "backend_sample.h"
#include "reference_models.h"

#include "base/log.h"
#include "infer/drafter.h"
#include "infer/engine.h"
#include "infer/engine_internal.h" /* to give the CPU backend a sample op, as the GPU's */
#include "infer/kv_cache.h"

#define MAX_PROMPTS 4 /* three of the fixture's prompts and a repetitive one */
#define MAX_OUT 20
#define MAX_PROMPT_TOKENS 256

typedef struct prompt_set {
    int32_t tokens[MAX_PROMPTS][MAX_PROMPT_TOKENS];
    int n_tokens[MAX_PROMPTS];
    int n;
} prompt_set;

typedef struct output {
    int32_t tokens[MAX_OUT + 1];
    int n;
    engine_finish finish;
} output;

/* A drafter that is (almost always) wrong: an arithmetic walk from the last token. */
typedef struct wrong_drafter {
    drafter base;
    int vocab;
} wrong_drafter;

static int wrong_propose(drafter *d, drafter_query *q, int n, char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    int vocab = ((wrong_drafter *)d)->vocab;
    for (int i = 0; i < n; i++) {
        int32_t t = q[i].tokens[q[i].n_tokens - 1];
        for (int j = 0; j < q[i].max_draft; j++) q[i].draft[j] = t = (t * 7 + 5) % vocab;
        q[i].n_draft = q[i].max_draft;
    }
    return 0;
}

static void wrong_destroy(drafter *d) { (void)d; }

static engine *open_sized(const char *dir, const char *method, drafter *d, size_t kv_bytes,
                          int max_batch, int max_sequences) {
    engine_options o = {.model_dir = dir, .n_threads = 1, .max_sequences = max_sequences,
                        .max_batch_tokens = max_batch, .kv_cache_bytes = kv_bytes,
                        .speculative = method, .drafter = d, .spec_tokens = 4};
    char err[256] = "";
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) fprintf(stderr, "engine_open %s: %s\n", method ? method : "", err);
    assert_non_null(e);
    return e;
}

static engine *open_with(const char *dir, const char *method, drafter *d, size_t kv_bytes,
                         int max_batch) {
    return open_sized(dir, method, d, kv_bytes, max_batch, 8);
}

static engine_request greedy_request(const int32_t *prompt, int n) {
    engine_request r = {.prompt = prompt, .n_prompt = n, .max_tokens = MAX_OUT};
    r.sampling = sampling_params_default();
    r.sampling.temperature = 0;
    r.sampling.logprobs = 1;
    return r;
}

/* Runs requests [first, first + count) of ps together until done; outputs by request. */
static void run_requests(engine *e, const prompt_set *ps, int first, int count, output *out) {
    char err[256];
    for (int k = first; k < first + count; k++) {
        engine_request r = greedy_request(ps->tokens[k], ps->n_tokens[k]);
        assert_int_equal(engine_submit(e, (uint64_t)k, &r, err, sizeof err), 0);
        memset(&out[k], 0, sizeof out[k]);
    }
    engine_event ev[64];
    for (int step = 0; engine_pending(e); step++) {
        assert_true(step < 100000);
        int n = engine_step(e, ev, 64);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++) {
            output *o = &out[ev[i].seq_id];
            if (ev[i].token >= 0) {
                assert_true(o->n < MAX_OUT);
                o->tokens[o->n++] = ev[i].token;
            }
            if (ev[i].finish) o->finish = ev[i].finish;
        }
    }
}

static void run_alone(engine *e, const prompt_set *ps, output *out) {
    for (int k = 0; k < ps->n; k++) run_requests(e, ps, k, 1, out);
}

static void expect_same(const char *what, const prompt_set *ps, const output *want,
                        const output *got) {
    for (int k = 0; k < ps->n; k++) {
        int same = want[k].n == got[k].n && want[k].finish == got[k].finish &&
                   !memcmp(want[k].tokens, got[k].tokens, (size_t)want[k].n * sizeof(int32_t));
        if (!same)
            fprintf(stderr, "%s: request %d differs (%d tokens, finish %d; without: %d, %d)\n",
                    what, k, got[k].n, got[k].finish, want[k].n, want[k].finish);
        assert_true(same);
    }
}

static void expect_no_leak(engine *e) {
    engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.n_running + st.n_waiting, 0);
    assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
}

/* The fixture's prompts (at most MAX_PROMPTS - 1) plus one that repeats itself. */
static void load_prompts(json_t *fx, prompt_set *ps) {
    json_t *prompts = json_object_get(fx, "prompts");
    memset(ps, 0, sizeof *ps);
    for (size_t pi = 0; pi < json_array_size(prompts) && ps->n < MAX_PROMPTS - 1; pi++) {
        json_t *ids = json_object_get(json_array_get(prompts, pi), "prompt_ids");
        int n = (int)json_array_size(ids);
        if (n < 1 || n > MAX_PROMPT_TOKENS) continue;
        for (int i = 0; i < n; i++)
            ps->tokens[ps->n][i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
        ps->n_tokens[ps->n++] = n;
    }
    int r = ps->n++, base = ps->n_tokens[0];
    for (int i = 0; i < 60; i++) ps->tokens[r][i] = ps->tokens[0][i % (base < 7 ? base : 7)];
    ps->n_tokens[r] = 60;
}

/* Another fixture model with the same tokenizer as `name` (the draft model). */
static const char *draft_twin(const char *name) {
    if (!strcmp(name, "llama3-tiny")) return "llama3-tiny-4bit";
    if (!strncmp(name, "llama3", 6)) return "llama3-tiny";
    if (!strcmp(name, "qwen3-tiny")) return "qwen3-tiny-4bit";
    return "qwen3-tiny";
}

static void check_method(const char *dir, const char *label, const char *method, drafter *d,
                         const prompt_set *ps, const output *plain_alone,
                         const output *plain_batched, size_t small_kv, engine_stats *stats) {
    output got[MAX_PROMPTS];
    char what[128];
    engine *e = open_with(dir, method, d, 0, 512);
    assert_non_null(engine_speculative(e));
    run_alone(e, ps, got);
    snprintf(what, sizeof what, "%s alone", label);
    expect_same(what, ps, plain_alone, got);
    run_requests(e, ps, 0, ps->n, got);
    snprintf(what, sizeof what, "%s batched", label);
    expect_same(what, ps, plain_batched, got);
    expect_no_leak(e);
    engine_get_stats(e, stats);
    engine_close(e);
    /* a cache of a few blocks: preemption, drafts trimmed back into the pool */
    e = open_with(dir, method, d, small_kv, 32);
    run_requests(e, ps, 0, ps->n, got);
    snprintf(what, sizeof what, "%s batched, small KV cache", label);
    expect_same(what, ps, plain_batched, got);
    expect_no_leak(e);
    engine_stats small;
    engine_get_stats(e, &small);
    assert_true(small.preemptions > 0);
    engine_close(e);
}

static void check_fixture(const char *file) {
    char path[512], dir[512], draft_dir[512], draft_fx[512];
    snprintf(path, sizeof path, "tests/fixtures/reference/%s", file);
    json_error_t jerr;
    json_t *fx = json_load_file(path, 0, &jerr);
    assert_non_null(fx);
    const char *name = json_string_value(json_object_get(fx, "model"));
    snprintf(dir, sizeof dir, ".cache/reference-models/%s", name);
    assert_int_equal(paths_mkdir_p(".cache/reference-models"), 0);
    ensure_model(fx, dir);
    const char *twin = draft_twin(name);
    snprintf(draft_fx, sizeof draft_fx, "tests/fixtures/reference/%s.json", twin);
    json_t *tfx = json_load_file(draft_fx, 0, &jerr);
    assert_non_null(tfx);
    snprintf(draft_dir, sizeof draft_dir, ".cache/reference-models/%s", twin);
    ensure_model(tfx, draft_dir);
    json_decref(tfx);

    static prompt_set ps;
    load_prompts(fx, &ps);
    output plain_alone[MAX_PROMPTS], plain_batched[MAX_PROMPTS];
    engine *e = open_with(dir, NULL, NULL, 0, 512);
    assert_null(engine_speculative(e));
    run_alone(e, &ps, plain_alone);
    run_requests(e, &ps, 0, ps.n, plain_batched);
    const engine_info *info = engine_get_info(e);
    model_config cfg;
    char err[256];
    assert_int_equal(model_config_load(dir, &cfg, err, sizeof err), 0);
    /* 6 blocks: the requests together need more, so the batch preempts */
    size_t small_kv = kv_cache_block_bytes(cfg.n_layers, (int64_t)cfg.n_kv_heads * cfg.head_dim,
                                           16, DTYPE_F16) * 6;
    int vocab = info->vocab_size;
    engine_close(e);

    drafter *oracle = drafter_oracle_create();
    assert_non_null(oracle);
    for (int k = 0; k < ps.n; k++) { /* each prompt followed by its greedy output */
        int32_t seq[MAX_PROMPT_TOKENS + MAX_OUT];
        memcpy(seq, ps.tokens[k], (size_t)ps.n_tokens[k] * sizeof *seq);
        memcpy(seq + ps.n_tokens[k], plain_alone[k].tokens, (size_t)plain_alone[k].n * sizeof *seq);
        assert_int_equal(drafter_oracle_add(oracle, seq, ps.n_tokens[k] + plain_alone[k].n), 0);
    }
    wrong_drafter wrong = {.base = {.name = "wrong", .propose = wrong_propose,
                                    .destroy = wrong_destroy},
                           .vocab = vocab};
    char draft_method[600];
    snprintf(draft_method, sizeof draft_method, "draft:%s", draft_dir);
    engine_stats ngram, orc, model, bad;
    check_method(dir, "ngram", "ngram", NULL, &ps, plain_alone, plain_batched, small_kv, &ngram);
    check_method(dir, "oracle", NULL, oracle, &ps, plain_alone, plain_batched, small_kv, &orc);
    check_method(dir, "draft model", draft_method, NULL, &ps, plain_alone, plain_batched, small_kv,
                 &model);
    check_method(dir, "always wrong", NULL, &wrong.base, &ps, plain_alone, plain_batched,
                 small_kv, &bad);
    printf("%-24s drafted/accepted: ngram %llu/%llu, oracle %llu/%llu, draft model (%s) "
           "%llu/%llu, always wrong %llu/%llu\n",
           name, (unsigned long long)ngram.spec_drafted, (unsigned long long)ngram.spec_accepted,
           (unsigned long long)orc.spec_drafted, (unsigned long long)orc.spec_accepted, twin,
           (unsigned long long)model.spec_drafted, (unsigned long long)model.spec_accepted,
           (unsigned long long)bad.spec_drafted, (unsigned long long)bad.spec_accepted);
    /* the oracle is right every time (its last draft of a request can only be cut by the end) */
    assert_true(orc.spec_drafted > 0);
    assert_int_equal(orc.spec_accepted, orc.spec_drafted);
    assert_true(model.spec_drafted > 0);
    assert_true(bad.spec_drafted > 0);
    oracle->destroy(oracle);
    json_decref(fx);
}

#define FIXTURE_TEST(fn, file)   \
    static void fn(void **s) {   \
        (void)s;                 \
        check_fixture(file);     \
    }
FIXTURE_TEST(test_qwen3, "qwen3-tiny.json")
FIXTURE_TEST(test_qwen3_tied, "qwen3-tiny-tied.json")
FIXTURE_TEST(test_qwen3_4bit, "qwen3-tiny-4bit.json")
FIXTURE_TEST(test_llama3, "llama3-tiny.json")
FIXTURE_TEST(test_llama3_4bit, "llama3-tiny-4bit.json")
FIXTURE_TEST(test_qwen3_moe, "qwen3-moe-tiny.json")
FIXTURE_TEST(test_qwen3_moe_4bit, "qwen3-moe-tiny-4bit.json")
FIXTURE_TEST(test_qwen3_moe_mlx, "qwen3-moe-tiny-mlx.json")
FIXTURE_TEST(test_qwen3_moe_4bit_mlx, "qwen3-moe-tiny-4bit-mlx.json")

/* ---- sampling ---- */

#define SAMPLE_VOCAB 12
#define SAMPLE_TOKENS 4
#define SAMPLE_RUNS 20000
#define SAMPLE_BATCH 64 /* requests in flight together */

static char small_dir[256];

/* Q(a, x), the regularized upper incomplete gamma function (series or continued fraction). */
static double gamma_q(double a, double x) {
    if (x <= 0) return 1;
    double gln = lgamma(a);
    if (x < a + 1) {
        double sum = 1 / a, term = sum, ap = a;
        for (int n = 0; n < 1000; n++) {
            term *= x / ++ap;
            sum += term;
            if (fabs(term) < fabs(sum) * 1e-15) break;
        }
        return 1 - sum * exp(-x + a * log(x) - gln);
    }
    double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
    for (int i = 1; i < 1000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        d = fabs(d) < 1e-300 ? 1e-300 : d;
        c = b + an / c;
        c = fabs(c) < 1e-300 ? 1e-300 : c;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-15) break;
    }
    return exp(-x + a * log(x) - gln) * h;
}

/* Two-sample chi-square homogeneity test of counts a and b over n cells (cells with fewer than
 * 10 observations together are pooled); returns the p-value, *df_out the degrees of freedom. */
static double chi_square_p(const int *a, const int *b, int n, int *df_out) {
    double na = 0, nb = 0;
    for (int i = 0; i < n; i++) na += a[i], nb += b[i];
    double chi = 0, pool_a = 0, pool_b = 0;
    int cells = 0;
    for (int i = 0; i <= n; i++) {
        double x, y;
        if (i < n && a[i] + b[i] < 10) {
            pool_a += a[i], pool_b += b[i];
            continue;
        }
        if (i < n) x = a[i], y = b[i];
        else if (pool_a + pool_b > 0) x = pool_a, y = pool_b;
        else break;
        double t = x + y, ea = t * na / (na + nb), eb = t * nb / (na + nb);
        chi += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
        cells++;
    }
    *df_out = cells - 1;
    return cells > 1 ? gamma_q((cells - 1) / 2.0, chi / 2) : 1;
}

/* A drafter right some of the time: (last token * 5 + 3) mod vocab, repeated. */
static int often_wrong_propose(drafter *d, drafter_query *q, int n, char *err, size_t errlen) {
    (void)d;
    (void)err;
    (void)errlen;
    for (int i = 0; i < n; i++) {
        int32_t t = q[i].tokens[q[i].n_tokens - 1];
        for (int j = 0; j < q[i].max_draft; j++) q[i].draft[j] = t = (t * 5 + 3) % SAMPLE_VOCAB;
        q[i].n_draft = q[i].max_draft;
    }
    return 0;
}

/* counts[position][token] over SAMPLE_RUNS sampled requests (seed = run number). */
static void sample_counts(const char *method, drafter *d, int counts[SAMPLE_TOKENS][SAMPLE_VOCAB],
                          engine_stats *stats) {
    engine *e = open_sized(small_dir, method, d, 0, 512, SAMPLE_BATCH);
    memset(counts, 0, sizeof(int) * SAMPLE_TOKENS * SAMPLE_VOCAB);
    int32_t prompt[5] = {4, 9, 1, 7, 5};
    char err[256];
    static engine_event ev[SAMPLE_BATCH * SAMPLE_TOKENS];
    int pos[SAMPLE_BATCH] = {0};
    for (int run = 0; run < SAMPLE_RUNS;) {
        int batch = 0;
        for (; batch < SAMPLE_BATCH && run < SAMPLE_RUNS; batch++, run++) {
            engine_request r = {.prompt = prompt, .n_prompt = 5, .max_tokens = SAMPLE_TOKENS,
                                .ban_eos = 1};
            r.sampling = sampling_params_default();
            r.sampling.temperature = 0.8f;
            r.sampling.seed = (uint64_t)run * 7919 + 1;
            assert_int_equal(engine_submit(e, (uint64_t)batch, &r, err, sizeof err), 0);
            pos[batch] = 0;
        }
        while (engine_pending(e)) {
            int n = engine_step(e, ev, SAMPLE_BATCH * SAMPLE_TOKENS);
            assert_true(n >= 0);
            for (int i = 0; i < n; i++) {
                if (ev[i].token < 0) continue;
                int *p = &pos[ev[i].seq_id];
                assert_true(*p < SAMPLE_TOKENS);
                counts[(*p)++][ev[i].token]++;
            }
        }
    }
    engine_get_stats(e, stats);
    expect_no_leak(e);
    engine_close(e);
}

static void test_sampling_distribution_unchanged(void **s) {
    (void)s;
    tiny_dir(small_dir, sizeof small_dir, "spec_small_vocab");
    tiny_spec spec = {.arch = "Qwen3ForCausalLM", .vocab = SAMPLE_VOCAB, .dim = 32, .layers = 2,
                      .heads = 4, .kv_heads = 2, .head_dim = 8, .inter = 64,
                      .dtype = ST_F32, .max_pos = 64, .seed = 11};
    assert_int_equal(tiny_model_write(small_dir, &spec), 0);
    drafter sometimes = {.name = "sometimes", .propose = often_wrong_propose,
                         .destroy = wrong_destroy};
    static int plain[SAMPLE_TOKENS][SAMPLE_VOCAB], spec_counts[SAMPLE_TOKENS][SAMPLE_VOCAB];
    engine_stats st_plain, st_spec;
    sample_counts(NULL, NULL, plain, &st_plain);
    char self_draft[300];
    snprintf(self_draft, sizeof self_draft, "draft:%s", small_dir);
    /* two drafters: an arithmetic guess (mostly rejected: the residual path) and the model's
     * own greedy choice through the draft-model drafter (often accepted) */
    for (int which = 0; which < 2; which++) {
        sample_counts(which ? self_draft : NULL, which ? NULL : &sometimes, spec_counts, &st_spec);
        double rate = (double)st_spec.spec_accepted / (double)st_spec.spec_drafted;
        printf("sampling with the %s drafter, %d requests of %d tokens each way: %llu of %llu "
               "drafted tokens accepted (%.0f%%)\n", which ? "draft-model (itself)" : "arithmetic",
               SAMPLE_RUNS, SAMPLE_TOKENS, (unsigned long long)st_spec.spec_accepted,
               (unsigned long long)st_spec.spec_drafted, 100 * rate);
        /* both branches of the rule ran many times: accepted drafts and residual resampling */
        assert_true(rate > 0.05 && rate < 0.95);
        assert_true(st_spec.spec_drafted > 1000);
        for (int p = 1; p < SAMPLE_TOKENS; p++) { /* the first token comes from the prefill */
            int df;
            double pv = chi_square_p(plain[p], spec_counts[p], SAMPLE_VOCAB, &df);
            printf("  position %d: chi-square homogeneity, %d degrees of freedom, p = %.3f\n",
                   p + 1, df, pv);
            assert_true(df >= 3);
            assert_true(pv > 1e-3);
        }
    }
}

/* The per-request override turns speculation off; a bad method or token count is refused. */
static void test_request_override_and_bad_settings(void **s) {
    (void)s;
    drafter sometimes = {.name = "sometimes", .propose = often_wrong_propose,
                         .destroy = wrong_destroy};
    engine *e = open_with(small_dir, NULL, &sometimes, 0, 512);
    int32_t prompt[5] = {4, 9, 1, 7, 5};
    engine_request r = greedy_request(prompt, 5);
    r.max_tokens = 20;
    r.spec_tokens = -1;
    char err[256];
    assert_int_equal(engine_submit(e, 1, &r, err, sizeof err), 0);
    engine_event ev[64];
    while (engine_pending(e)) assert_true(engine_step(e, ev, 64) >= 0);
    engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.spec_drafted, 0);
    r.spec_tokens = 2; /* at most 2 per step */
    assert_int_equal(engine_submit(e, 2, &r, err, sizeof err), 0);
    while (engine_pending(e)) assert_true(engine_step(e, ev, 64) >= 0);
    engine_get_stats(e, &st);
    assert_true(st.spec_drafted > 0 && st.spec_drafted <= 2 * st.spec_verifies);
    engine_close(e);

    engine_options o = {.model_dir = small_dir, .n_threads = 1, .speculative = "magic"};
    assert_null(engine_open(&o, err, sizeof err));
    assert_non_null(strstr(err, "magic"));
    o.speculative = "ngram";
    o.spec_tokens = ENGINE_SPEC_MAX_TOKENS + 1;
    assert_null(engine_open(&o, err, sizeof err));
    assert_non_null(strstr(err, "speculative tokens"));
    o.spec_tokens = 0;
    o.speculative = "draft:.cache/reference-models/qwen3-tiny"; /* another vocabulary */
    assert_null(engine_open(&o, err, sizeof err));
    assert_non_null(strstr(err, "vocabulary"));
}

/* Drafts are verified on the host even where the backend samples (the CUDA backend: only ids
 * come back): greedy tokens with an often-wrong drafter equal those without speculation, and
 * no more tokens are accepted than drafted. The GPU once sampled each verify row as a plain
 * row (found by the API e2e suite on --device cuda: accepted > drafted). */
static void test_drafts_verified_where_backend_samples(void **s) {
    (void)s;
    drafter sometimes = {.name = "sometimes", .propose = often_wrong_propose,
                         .destroy = wrong_destroy};
    int32_t prompt[5] = {4, 9, 1, 7, 5};
    output out[2];
    char err[256];
    for (int spec = 0; spec < 2; spec++) {
        engine *e = open_with(small_dir, NULL, spec ? &sometimes : NULL, 0, 512);
        e->be->sample = argmax_sample;
        engine_request r = greedy_request(prompt, 5);
        r.max_tokens = 30;
        assert_int_equal(engine_submit(e, 1, &r, err, sizeof err), 0);
        memset(&out[spec], 0, sizeof out[spec]);
        engine_event ev[64];
        while (engine_pending(e)) {
            int n = engine_step(e, ev, 64);
            assert_true(n >= 0);
            for (int i = 0; i < n; i++)
                if (ev[i].token >= 0 && out[spec].n < MAX_OUT) out[spec].tokens[out[spec].n++] = ev[i].token;
        }
        engine_stats st;
        engine_get_stats(e, &st);
        if (spec) {
            assert_true(st.spec_drafted > 0);
            assert_true(st.spec_accepted <= st.spec_drafted);
        }
        e->be->sample = NULL;
        engine_close(e);
    }
    assert_int_equal(out[0].n, out[1].n);
    assert_memory_equal(out[0].tokens, out[1].tokens, (size_t)out[0].n * sizeof(int32_t));
}

int main(void) {
    if (sodium_init() < 0) return 1; /* the fixtures' sha256 */
    log_set_level(LOG_LEVEL_WARN);   /* no per-request acceptance lines */
    const char *filter = getenv("EXO_TEST_FILTER"); /* a glob over the test names */
    if (filter) cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),          cmocka_unit_test(test_qwen3_tied),
        cmocka_unit_test(test_qwen3_4bit),     cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_llama3_4bit),    cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_qwen3_moe_4bit), cmocka_unit_test(test_qwen3_moe_mlx),
        cmocka_unit_test(test_qwen3_moe_4bit_mlx),
        cmocka_unit_test(test_sampling_distribution_unchanged),
        cmocka_unit_test(test_request_override_and_bad_settings),
        cmocka_unit_test(test_drafts_verified_where_backend_samples),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    tiny_cleanup();
    return failed;
}
