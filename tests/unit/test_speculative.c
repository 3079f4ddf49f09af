/* Speculative decoding is lossless:
 *   - greedy: with every drafter (n-gram, oracle, a draft model, a drafter that is always wrong,
 *     one that is partly right)
 *     each request gets exactly the tokens it gets without speculation, on every tiny model of
 *     the reference fixtures (tests/fixtures/reference/, their prompts plus a repetitive one),
 *     alone and batched, and batched again under a KV cache small enough to preempt; no KV block
 *     leaks, and the oracle's drafts are all accepted. The hybrids (Qwen3-Next, Qwen3.5) are
 *     among them: a rejected draft rolls their recurrent state back, which the always-wrong and
 *     the n-gram drafters exercise every few steps, and the prefix cache's state snapshots are
 *     hit by the batched runs after the single ones;
 *   - sampling: on a tiny vocabulary, the tokens sampled with a drafter that is sometimes right
 *     follow the same distribution as without (two-sample chi-square per output position; the
 *     p-values are printed and must exceed 1e-3 -- the seeds are fixed, so the run is
 *     deterministic);
 *   - the MTP drafter (a checkpoint's mtp.* head, made by mkmodel --mtp) is lossless the same
 *     ways, and a head made to agree with its model gets its drafts accepted;
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

/* A drafter that is partly right: the oracle's continuation with every third position (by
 * absolute position) changed, so a step keeps 0, 1 or 2 of its drafts and rejects the next --
 * the rollback of a draft that was partly accepted. */
typedef struct partly_drafter {
    drafter base;
    drafter *oracle;
    int vocab;
} partly_drafter;

static int partly_propose(drafter *d, drafter_query *q, int n, char *err, size_t errlen) {
    partly_drafter *p = (partly_drafter *)d;
    if (p->oracle->propose(p->oracle, q, n, err, errlen) != 0) return -1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < q[i].n_draft; j++)
            if ((q[i].n_tokens + j) % 3 == 0) q[i].draft[j] = (q[i].draft[j] + 1) % p->vocab;
    return 0;
}

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
    if (!strcmp(name, "gpt-oss-tiny")) return "gpt-oss-tiny-mxfp4";
    if (!strncmp(name, "gpt-oss", 7)) return "gpt-oss-tiny";
    if (!strcmp(name, "qwen3-tiny")) return "qwen3-tiny-4bit";
    return "qwen3-tiny"; /* the plain model of the hybrids' tokenizer too: a draft model */
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

/* Greedy outputs of ps on the model in dir without speculation, alone and batched; the KV cache
 * size (6 blocks) that makes the batched run preempt; the vocabulary size. */
typedef struct plain_run {
    output alone[MAX_PROMPTS], batched[MAX_PROMPTS];
    size_t small_kv;
    int vocab;
} plain_run;

static void run_plain(const char *dir, const prompt_set *ps, plain_run *out) {
    engine *e = open_with(dir, NULL, NULL, 0, 512);
    assert_null(engine_speculative(e));
    run_alone(e, ps, out->alone);
    run_requests(e, ps, 0, ps->n, out->batched);
    out->vocab = engine_get_info(e)->vocab_size;
    engine_close(e);
    model_config cfg;
    char err[256];
    assert_int_equal(model_config_load(dir, &cfg, err, sizeof err), 0);
    out->small_kv = kv_cache_block_bytes(cfg.n_layers, (int64_t)cfg.n_kv_heads * cfg.head_dim,
                                         16, DTYPE_F16) * 6;
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
    static plain_run plain;
    run_plain(dir, &ps, &plain);
    const output *plain_alone = plain.alone, *plain_batched = plain.batched;
    size_t small_kv = plain.small_kv;
    int vocab = plain.vocab;

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
    partly_drafter partly = {.base = {.name = "partly right", .propose = partly_propose,
                                      .destroy = wrong_destroy},
                             .oracle = oracle, .vocab = vocab};
    char draft_method[600];
    snprintf(draft_method, sizeof draft_method, "draft:%s", draft_dir);
    engine_stats ngram, orc, model, bad, part;
    check_method(dir, "ngram", "ngram", NULL, &ps, plain_alone, plain_batched, small_kv, &ngram);
    check_method(dir, "oracle", NULL, oracle, &ps, plain_alone, plain_batched, small_kv, &orc);
    check_method(dir, "draft model", draft_method, NULL, &ps, plain_alone, plain_batched, small_kv,
                 &model);
    check_method(dir, "always wrong", NULL, &wrong.base, &ps, plain_alone, plain_batched,
                 small_kv, &bad);
    check_method(dir, "partly right", NULL, &partly.base, &ps, plain_alone, plain_batched,
                 small_kv, &part);
    printf("%-24s drafted/accepted: ngram %llu/%llu, oracle %llu/%llu, draft model (%s) "
           "%llu/%llu, always wrong %llu/%llu, partly right %llu/%llu\n",
           name, (unsigned long long)ngram.spec_drafted, (unsigned long long)ngram.spec_accepted,
           (unsigned long long)orc.spec_drafted, (unsigned long long)orc.spec_accepted, twin,
           (unsigned long long)model.spec_drafted, (unsigned long long)model.spec_accepted,
           (unsigned long long)bad.spec_drafted, (unsigned long long)bad.spec_accepted,
           (unsigned long long)part.spec_drafted, (unsigned long long)part.spec_accepted);
    /* the oracle is right every time (its last draft of a request can only be cut by the end) */
    assert_true(orc.spec_drafted > 0);
    assert_int_equal(orc.spec_accepted, orc.spec_drafted);
    assert_true(model.spec_drafted > 0);
    assert_true(bad.spec_drafted > 0);
    /* some drafts kept and some rejected in the same steps */
    assert_true(part.spec_accepted > 0 && part.spec_accepted < part.spec_drafted);
    oracle->destroy(oracle);
    json_decref(fx);
}

REFERENCE_FIXTURES(REFERENCE_FIXTURE_TEST)

/* ---- MTP ---- */

/* The MTP drafter on qwen3.5-tiny with an MTP head (mkmodel --mtp): a random head (drafts
 * rarely right) and one made to agree with the model (--mtp agree: the model predicts from its
 * last token, the head exactly what the model will). Both lossless alone, batched and under
 * preemption; the agreeing head's drafts are (all but near-ties) accepted. */
static engine_stats check_mtp(const char *kind) {
    json_error_t jerr;
    json_t *fx = json_load_file("tests/fixtures/reference/qwen3.5-tiny.json", 0, &jerr);
    assert_non_null(fx);
    char dir[256], cmd[1024];
    snprintf(dir, sizeof dir, ".cache/unit/%d/qwen3.5-tiny-mtp-%s", (int)getpid(), kind);
    const char *build = getenv("EXO_BUILD");
    int o = snprintf(cmd, sizeof cmd, "%s/tools/mkmodel --out '%s' --mtp %s",
                     build ? build : "build", dir, kind);
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(fx, "mkmodel_args"), i, a)
        o += snprintf(cmd + o, sizeof cmd - (size_t)o, " '%s'", json_string_value(a));
    snprintf(cmd + o, sizeof cmd - (size_t)o, " >/dev/null");
    assert_int_equal(system(cmd), 0);
    static prompt_set ps;
    load_prompts(fx, &ps);
    static plain_run plain;
    run_plain(dir, &ps, &plain);
    engine_stats st;
    check_method(dir, kind, "mtp", NULL, &ps, plain.alone, plain.batched, plain.small_kv, &st);
    printf("MTP head (%s): %llu of %llu drafted tokens accepted, %.2f tokens per verifying "
           "step\n", kind, (unsigned long long)st.spec_accepted,
           (unsigned long long)st.spec_drafted,
           st.spec_verifies ? (double)(st.spec_accepted + st.spec_verifies) / st.spec_verifies : 0);
    json_decref(fx);
    return st;
}

static void test_mtp_lossless(void **s) {
    (void)s;
    engine_stats random = check_mtp("random"), agree = check_mtp("agree");
    assert_true(random.spec_drafted > 0);
    assert_true(agree.spec_drafted > 20 && agree.spec_accepted * 10 >= agree.spec_drafted * 9);
}

/* A drafter that checks the hidden states the engine hands over (observe): every position is
 * handed over once, in order (again only after a recompute), and the model's own lm_head over
 * the hidden state of position p picks the greedy token at p + 1 -- rows belong to the
 * positions they are given for, the kept drafts' included, through hybrid rollbacks. Its
 * drafts are the partly-right ones. */
typedef struct watching_drafter {
    partly_drafter partly;
    model_config cfg;
    model_weights w;
    safetensors_set *st;
    float *norm;               /* [dim] the final norm as used */
    int32_t predicted[MAX_PROMPT_TOKENS + MAX_OUT + ENGINE_SPEC_MAX_TOKENS];
    int next_first, out_of_order, n_prompt, checked;
} watching_drafter;

static void watch_observe(drafter *d, uint64_t serial, int first, int n, const float *hidden) {
    (void)serial;
    watching_drafter *w = (watching_drafter *)d;
    int dim = (int)w->cfg.hidden_size, vocab = w->cfg.vocab_size;
    if (first > w->next_first) w->out_of_order++; /* a position skipped (no prefix cache here) */
    float *x = malloc((size_t)dim * sizeof *x), *row = malloc((size_t)dim * sizeof *row);
    for (int i = 0; i < n; i++) {
        const float *h = hidden + (size_t)i * (size_t)dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)h[j] * h[j];
        float inv = (float)(1.0 / sqrt(ss / dim + w->cfg.rms_norm_eps));
        for (int j = 0; j < dim; j++) x[j] = h[j] * inv * w->norm[j];
        int32_t best = 0;
        float best_logit = -INFINITY;
        for (int v = 0; v < vocab; v++) {
            weight_matrix_row_to_f32(&w->w.lm_head, v, row);
            float logit = 0;
            for (int j = 0; j < dim; j++) logit += row[j] * x[j];
            if (logit > best_logit) best_logit = logit, best = v;
        }
        w->predicted[first + i] = best;
    }
    free(x);
    free(row);
    w->next_first = first + n;
}

static int watch_propose(drafter *d, drafter_query *q, int n, char *err, size_t errlen) {
    watching_drafter *w = (watching_drafter *)d;
    for (int i = 0; i < n; i++) { /* every generated token so far, from the rows before it */
        assert_int_equal(w->next_first, q[i].n_tokens - 1);
        for (int p = w->n_prompt - 1; p + 1 < q[i].n_tokens; p++, w->checked++)
            assert_int_equal(w->predicted[p], q[i].tokens[p + 1]);
    }
    return partly_propose(d, q, n, err, errlen);
}

static void test_hidden_states_reach_the_drafter(void **s) {
    (void)s;
    const char *dir = ".cache/reference-models/qwen3.5-tiny"; /* made by test_qwen3_5 */
    json_error_t jerr;
    json_t *fx = json_load_file("tests/fixtures/reference/qwen3.5-tiny.json", 0, &jerr);
    assert_non_null(fx);
    ensure_model(fx, dir);
    static prompt_set ps;
    load_prompts(fx, &ps);
    json_decref(fx);
    static plain_run plain;
    run_plain(dir, &ps, &plain);
    static watching_drafter w;
    char err[256];
    assert_int_equal(model_config_load(dir, &w.cfg, err, sizeof err), 0);
    w.st = safetensors_set_open(dir, err, sizeof err);
    assert_non_null(w.st);
    assert_int_equal(model_weights_load(w.st, &w.cfg, 0, 0, &w.w, err, sizeof err), 0);
    int dim = (int)w.cfg.hidden_size;
    w.norm = malloc((size_t)dim * sizeof *w.norm);
    weight_matrix_row_to_f32(&w.w.final_norm, 0, w.norm);
    for (int j = 0; w.w.norm_plus_one && j < dim; j++) w.norm[j] += 1.0f;
    drafter *oracle = drafter_oracle_create();
    for (int k = 0; k < ps.n; k++) {
        int32_t seq[MAX_PROMPT_TOKENS + MAX_OUT];
        memcpy(seq, ps.tokens[k], (size_t)ps.n_tokens[k] * sizeof *seq);
        memcpy(seq + ps.n_tokens[k], plain.alone[k].tokens, (size_t)plain.alone[k].n * sizeof *seq);
        assert_int_equal(drafter_oracle_add(oracle, seq, ps.n_tokens[k] + plain.alone[k].n), 0);
    }
    w.partly = (partly_drafter){.base = {.name = "watching", .propose = watch_propose,
                                         .observe = watch_observe, .destroy = wrong_destroy},
                                .oracle = oracle, .vocab = plain.vocab};
    engine *e = open_with(dir, NULL, &w.partly.base, 0, 512);
    output got[MAX_PROMPTS];
    for (int k = 0; k < ps.n; k++) {
        w.next_first = 0;
        w.n_prompt = ps.n_tokens[k];
        run_requests(e, &ps, k, 1, got);
    }
    expect_same("watching", &ps, plain.alone, got);
    engine_stats st;
    engine_get_stats(e, &st);
    engine_close(e);
    printf("hidden states: %d generated tokens checked against the model's lm_head over the "
           "handed-over rows; %llu of %llu drafts kept\n", w.checked,
           (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafted);
    assert_int_equal(w.out_of_order, 0);
    assert_true(w.checked > 20);
    assert_true(st.spec_accepted > 0 && st.spec_accepted < st.spec_drafted);
    oracle->destroy(oracle);
    free(w.norm);
    model_weights_free(&w.w);
    safetensors_set_close(w.st);
}

/* A checkpoint without an MTP head refuses --speculative mtp, naming what it lacks. */
static void test_mtp_needs_a_head(void **s) {
    (void)s;
    engine_options o = {.model_dir = ".cache/reference-models/qwen3.5-tiny", .n_threads = 1,
                        .speculative = "mtp"};
    char err[256];
    assert_null(engine_open(&o, err, sizeof err));
    assert_non_null(strstr(err, "no MTP head"));
}

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
        REFERENCE_FIXTURES(REFERENCE_FIXTURE_ENTRY)
        cmocka_unit_test(test_mtp_lossless),
        cmocka_unit_test(test_mtp_needs_a_head),
        cmocka_unit_test(test_hidden_states_reach_the_drafter),
        cmocka_unit_test(test_sampling_distribution_unchanged),
        cmocka_unit_test(test_request_override_and_bad_settings),
        cmocka_unit_test(test_drafts_verified_where_backend_samples),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    tiny_cleanup();
    return failed;
}
