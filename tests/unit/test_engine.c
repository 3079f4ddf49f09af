/* The engine through its public door: continuous batching gives exactly the tokens each request
 * gets alone (mixed prompt lengths, chunked prefill, staggered arrivals, cancellation,
 * preemption under a small KV cache), seeds are reproducible, stop ids and limits end streams,
 * logprobs are consistent, and no KV block leaks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tiny_model.h"

#include "infer/engine.h"
#include "backend_sample.h"
#include "infer/engine_internal.h" /* to give the CPU backend a sample op, as the GPU's */

#include <math.h>
#include <string.h>

#define N_REQ 5
#define MAX_TOK 12

static char model_dir[256];

static const int prompt_len[N_REQ] = {3, 17, 40, 9, 1};

static void make_prompt(int r, int32_t *out) {
    for (int i = 0; i < prompt_len[r]; i++) out[i] = 4 + (r * 31 + i * 7) % 90;
}

static engine *open_engine(int max_batch, size_t kv_bytes) {
    engine_options o = {.model_dir = model_dir, .n_threads = 1, .max_batch_tokens = max_batch,
                        .max_sequences = 8, .kv_cache_bytes = kv_bytes};
    char err[256] = "";
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) fprintf(stderr, "engine_open: %s\n", err);
    assert_non_null(e);
    return e;
}

static engine_request greedy_request(const int32_t *prompt, int n) {
    engine_request r = {.prompt = prompt, .n_prompt = n, .max_tokens = MAX_TOK, .ban_eos = 1};
    r.sampling = sampling_params_default();
    r.sampling.temperature = 0;
    return r;
}

typedef struct stream {
    int32_t tokens[300];
    int n;
    engine_finish finish;
} stream;

/* Steps until idle; events go to streams[seq_id]. Submits request k at step arrive[k] (NULL:
 * all at once), cancels cancel_id at step cancel_step. */
static void drive(engine *e, stream *streams, const int *arrive, int cancel_id, int cancel_step,
                  const engine_request *reqs) {
    char err[256];
    int submitted[N_REQ] = {0};
    engine_event ev[64];
    for (int step = 0; step < 10000; step++) {
        for (int k = 0; k < N_REQ; k++)
            if (!submitted[k] && (!arrive || arrive[k] <= step)) {
                assert_int_equal(engine_submit(e, (uint64_t)k, &reqs[k], err, sizeof err), 0);
                submitted[k] = 1;
            }
        if (step == cancel_step) engine_cancel(e, (uint64_t)cancel_id);
        int n = engine_step(e, ev, 64);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++) {
            stream *s = &streams[ev[i].seq_id];
            if (ev[i].token >= 0 && s->n < 300) s->tokens[s->n++] = ev[i].token;
            if (ev[i].finish) s->finish = ev[i].finish;
        }
        int all = 1;
        for (int k = 0; k < N_REQ; k++) all &= submitted[k];
        if (all && engine_pending(e) == 0) return;
    }
    fail_msg("engine did not finish");
}

static int32_t prompts[N_REQ][64];
static engine_request reqs[N_REQ];
static stream alone[N_REQ];

static int setup(void **s) {
    (void)s;
    tiny_dir(model_dir, sizeof model_dir, "engine_model");
    tiny_spec spec = {.arch = "Qwen3ForCausalLM", .vocab = 96, .dim = 64, .layers = 2,
                      .heads = 4, .kv_heads = 2, .head_dim = 16, .inter = 128,
                      .dtype = ST_BF16, .max_pos = 256, .seed = 3};
    if (tiny_model_write(model_dir, &spec) != 0) return -1;
    for (int k = 0; k < N_REQ; k++) {
        make_prompt(k, prompts[k]);
        reqs[k] = greedy_request(prompts[k], prompt_len[k]);
    }
    /* the ground truth: each request alone in a fresh engine, whole prompt in one step */
    for (int k = 0; k < N_REQ; k++) {
        engine *e = open_engine(512, 0);
        char err[256];
        engine_event ev[8];
        assert_int_equal(engine_submit(e, 0, &reqs[k], err, sizeof err), 0);
        while (engine_pending(e)) {
            int n = engine_step(e, ev, 8);
            for (int i = 0; i < n; i++) {
                if (ev[i].token >= 0) alone[k].tokens[alone[k].n++] = ev[i].token;
                if (ev[i].finish) alone[k].finish = ev[i].finish;
            }
        }
        engine_close(e);
    }
    return 0;
}

static int teardown(void **s) {
    (void)s;
    tiny_cleanup();
    return 0;
}

static void expect_same(const stream *got, int skip) {
    for (int k = 0; k < N_REQ; k++) {
        if (k == skip) continue;
        assert_int_equal(got[k].n, MAX_TOK);
        assert_int_equal(alone[k].n, MAX_TOK);
        assert_memory_equal(got[k].tokens, alone[k].tokens, MAX_TOK * sizeof(int32_t));
        assert_int_equal(got[k].finish, ENGINE_FINISH_LENGTH);
    }
}

static void expect_no_leak(engine *e) {
    engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
    assert_int_equal(st.n_running + st.n_waiting, 0);
}

static void test_alone_streams_differ(void **s) {
    (void)s; /* guards the other tests against a degenerate model that always says one thing */
    int distinct = 0;
    for (int i = 1; i < MAX_TOK; i++) distinct += alone[0].tokens[i] != alone[0].tokens[0];
    assert_true(distinct > 0);
    assert_memory_not_equal(alone[0].tokens, alone[1].tokens, MAX_TOK * sizeof(int32_t));
}

static void test_batched_equals_alone(void **s) {
    (void)s;
    int budgets[] = {512, 16, 7};
    for (int b = 0; b < 3; b++) {
        engine *e = open_engine(budgets[b], 0);
        stream got[N_REQ] = {0};
        drive(e, got, NULL, -1, -1, reqs);
        expect_same(got, -1);
        expect_no_leak(e);
        engine_close(e);
    }
}

static void test_staggered_arrivals(void **s) {
    (void)s;
    int arrive[N_REQ] = {0, 3, 4, 9, 15};
    engine *e = open_engine(10, 0);
    stream got[N_REQ] = {0};
    drive(e, got, arrive, -1, -1, reqs);
    expect_same(got, -1);
    expect_no_leak(e);
    engine_close(e);
}

static void test_cancel_mid_stream(void **s) {
    (void)s;
    int arrive[N_REQ] = {0, 0, 1, 2, 2};
    engine *e = open_engine(16, 0);
    stream got[N_REQ] = {0};
    drive(e, got, arrive, 2, 6, reqs);
    expect_same(got, 2);
    assert_int_equal(got[2].finish, ENGINE_FINISH_CANCELLED);
    assert_true(got[2].n < MAX_TOK);
    for (int i = 0; i < got[2].n; i++) assert_int_equal(got[2].tokens[i], alone[2].tokens[i]);
    expect_no_leak(e);
    engine_close(e);
}

static void run_one(engine *e, const engine_request *r, stream *out, engine_event *last) {
    char err[256];
    engine_event ev[8];
    memset(out, 0, sizeof *out);
    assert_int_equal(engine_submit(e, 77, r, err, sizeof err), 0);
    while (engine_pending(e)) {
        int n = engine_step(e, ev, 8);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++) {
            if (ev[i].token >= 0 && out->n < 300) {
                out->tokens[out->n++] = ev[i].token;
                if (last) *last = ev[i];
            }
            if (ev[i].finish) out->finish = ev[i].finish;
        }
    }
}

static void test_preemption_small_cache(void **s) {
    (void)s;
    /* 2 layers * 2 (K,V) * 32 kv dims * 16 tokens * 2 bytes (f16) = 4 KiB per block. With 6 blocks
     * the five requests take turns; with 4, two 20-token prompts growing to 50 tokens each
     * (4 blocks each) cannot both stay: one is preempted, recomputed, and still agrees. */
    engine *e = open_engine(16, 6 * 4096);
    stream got[N_REQ] = {0};
    drive(e, got, NULL, -1, -1, reqs);
    expect_same(got, -1);
    engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_total, 6);
    expect_no_leak(e);
    engine_close(e);

    int32_t p[2][20];
    engine_request r[2];
    stream solo[2], both[2] = {0};
    char err[256];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 20; i++) p[k][i] = 4 + (k * 13 + i * 5) % 90;
        r[k] = greedy_request(p[k], 20);
        r[k].max_tokens = 30;
        e = open_engine(64, 0);
        run_one(e, &r[k], &solo[k], NULL);
        engine_close(e);
        assert_int_equal(solo[k].n, 30);
    }
    e = open_engine(64, 4 * 4096);
    for (int k = 0; k < 2; k++) assert_int_equal(engine_submit(e, (uint64_t)k, &r[k], err, sizeof err), 0);
    engine_event ev[8];
    while (engine_pending(e)) {
        int n = engine_step(e, ev, 8);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++)
            if (ev[i].token >= 0) both[ev[i].seq_id].tokens[both[ev[i].seq_id].n++] = ev[i].token;
    }
    engine_get_stats(e, &st);
    assert_true(st.preemptions > 0);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(both[k].n, 30);
        assert_memory_equal(both[k].tokens, solo[k].tokens, 30 * sizeof(int32_t));
    }
    expect_no_leak(e);
    engine_close(e);
}

static void test_seed_reproducible(void **s) {
    (void)s;
    engine *e = open_engine(64, 0);
    engine_request r = reqs[1];
    r.sampling.temperature = 1.5f;
    r.sampling.min_p = 0;
    r.sampling.seed = 7;
    r.max_tokens = 24;
    stream a, b, c;
    run_one(e, &r, &a, NULL);
    run_one(e, &r, &b, NULL);
    r.sampling.seed = 8;
    run_one(e, &r, &c, NULL);
    assert_int_equal(a.n, 24);
    assert_memory_equal(a.tokens, b.tokens, sizeof a.tokens);
    assert_memory_not_equal(a.tokens, c.tokens, 24 * sizeof(int32_t));
    expect_no_leak(e);
    engine_close(e);
}

static void test_stop_and_logprobs(void **s) {
    (void)s;
    engine *e = open_engine(64, 0);
    engine_request r = reqs[0];
    r.ban_eos = 0;
    int32_t stop = alone[0].tokens[3];
    r.stop_tokens = &stop;
    r.n_stop_tokens = 1;
    r.sampling.top_logprobs = 5;
    r.sampling.logprobs = 1;
    stream got;
    engine_event last;
    run_one(e, &r, &got, &last);
    int first_stop = 0;
    while (alone[0].tokens[first_stop] != stop) first_stop++;
    /* eos ids 2 and 3 may come first; otherwise the stream ends at the stop token */
    assert_true(got.n <= first_stop + 1);
    assert_memory_equal(got.tokens, alone[0].tokens, (size_t)got.n * sizeof(int32_t));
    assert_int_equal(got.finish, ENGINE_FINISH_STOP);
    assert_int_equal(last.n_top, 5);
    assert_int_equal(last.top_ids[0], last.token); /* greedy: the best is the one taken */
    assert_float_equal(last.top_logprobs[0], last.logprob, 1e-6);
    double mass = 0;
    for (int i = 0; i < 5; i++) {
        assert_true(last.top_logprobs[i] <= 0);
        if (i) assert_true(last.top_logprobs[i] <= last.top_logprobs[i - 1]);
        mass += exp(last.top_logprobs[i]);
    }
    assert_true(mass <= 1.0 + 1e-5);
    engine_close(e);
}

static void test_rejects_bad_requests(void **s) {
    (void)s;
    engine *e = open_engine(64, 0);
    char err[256];
    int32_t big[300];
    for (int i = 0; i < 300; i++) big[i] = 5;
    engine_request r = greedy_request(big, 300);
    assert_int_equal(engine_submit(e, 1, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "context length"));
    r.n_prompt = 4;
    big[2] = 96;
    assert_int_equal(engine_submit(e, 1, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "vocabulary"));
    big[2] = 5;
    r.sampling.temperature = -1;
    assert_int_equal(engine_submit(e, 1, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "temperature"));
    r.sampling.temperature = 0;
    r.max_tokens = 0;
    assert_int_equal(engine_submit(e, 1, &r, err, sizeof err), -1);
    r.max_tokens = 1000; /* runs to the context length */
    stream got;
    run_one(e, &r, &got, NULL);
    assert_int_equal(got.n, 256 - 4);
    assert_int_equal(got.finish, ENGINE_FINISH_LENGTH);
    expect_no_leak(e);
    engine_close(e);
}

/* Every KV dtype serves requests; an unknown one is refused by name. f32 and f16 caches give
 * the same greedy tokens on this model (its logit gaps are far above f16 rounding). */
static void test_kv_dtypes(void **s) {
    (void)s;
    const char *types[] = {"f32", "bf16", "f16"};
    for (int i = 0; i < 3; i++) {
        engine_options o = {.model_dir = model_dir, .n_threads = 1, .kv_cache_dtype = types[i]};
        char err[256];
        engine *e = engine_open(&o, err, sizeof err);
        assert_non_null(e);
        stream got;
        run_one(e, &reqs[2], &got, NULL);
        assert_int_equal(got.n, MAX_TOK);
        if (i != 1) assert_memory_equal(got.tokens, alone[2].tokens, MAX_TOK * sizeof(int32_t));
        engine_close(e);
    }
    engine_options o = {.model_dir = model_dir, .kv_cache_dtype = "q9"};
    char err[256];
    assert_null(engine_open(&o, err, sizeof err));
    assert_non_null(strstr(err, "q9"));
}

/* Runs r to the end as sequence `id`; returns the cached_tokens reported. */
static int run_cached(engine *e, const engine_request *r, stream *out) {
    char err[256];
    engine_event ev[8];
    int cached = -1;
    memset(out, 0, sizeof *out);
    assert_int_equal(engine_submit(e, 5, r, err, sizeof err), 0);
    while (engine_pending(e)) {
        int n = engine_step(e, ev, 8);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++) {
            if (ev[i].token >= 0) out->tokens[out->n++] = ev[i].token;
            cached = ev[i].cached_tokens;
        }
    }
    return cached;
}

static void test_prefix_cache(void **s) {
    (void)s;
    engine *e = open_engine(16, 0);
    stream a, b, c;
    /* 40-token prompt: blocks 0 and 1 (32 tokens) are full and get cached */
    assert_int_equal(run_cached(e, &reqs[2], &a), 0);
    assert_memory_equal(a.tokens, alone[2].tokens, MAX_TOK * sizeof(int32_t));
    assert_int_equal(run_cached(e, &reqs[2], &b), 32);
    assert_memory_equal(b.tokens, alone[2].tokens, MAX_TOK * sizeof(int32_t));
    engine_stats st;
    engine_get_stats(e, &st);
    assert_true(st.kv_blocks_cached >= 3);
    assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
    /* a second turn: the first conversation plus its answer plus new tokens */
    int32_t turn2[80];
    memcpy(turn2, prompts[2], 40 * sizeof(int32_t));
    memcpy(turn2 + 40, a.tokens, MAX_TOK * sizeof(int32_t));
    for (int i = 0; i < 8; i++) turn2[52 + i] = 7 + i;
    engine_request r = greedy_request(turn2, 60);
    int cached = run_cached(e, &r, &c);
    assert_true(cached >= 48); /* 40 prompt + 11 computed outputs = 51 -> 3 full blocks */
    /* the same turn without the cache gives the same tokens */
    stream d;
    r.no_prefix_cache = 1;
    assert_int_equal(run_cached(e, &r, &d), 0);
    assert_memory_equal(c.tokens, d.tokens, MAX_TOK * sizeof(int32_t));
    engine_close(e);
}

/* A cache of 8 blocks, prompts that need 3-4 each: cached blocks are evicted, never reused
 * wrongly, and all of them come back. */
static void test_prefix_cache_eviction(void **s) {
    (void)s;
    engine *e = open_engine(16, 8 * 4096);
    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < N_REQ; k++) {
            stream got;
            run_cached(e, &reqs[k], &got);
            assert_int_equal(got.n, MAX_TOK);
            assert_memory_equal(got.tokens, alone[k].tokens, MAX_TOK * sizeof(int32_t));
        }
    }
    engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
    engine_close(e);
}

/* A short request arriving during a long chunked prefill gets its first token at the next step,
 * while the long prompt keeps advancing; both still produce their solo tokens. */
static void test_short_request_not_stuck_behind_long_prefill(void **s) {
    (void)s;
    engine *e = open_engine(32, 0);
    int32_t longp[200];
    for (int i = 0; i < 200; i++) longp[i] = 4 + (i * 11) % 90;
    engine_request rl = greedy_request(longp, 200), rs = reqs[0];
    rl.max_tokens = 4;
    char err[256];
    engine_event ev[16];
    assert_int_equal(engine_submit(e, 1, &rl, err, sizeof err), 0);
    assert_true(engine_step(e, ev, 16) >= 0); /* first chunk of the long prompt */
    assert_int_equal(engine_submit(e, 2, &rs, err, sizeof err), 0);
    int n = engine_step(e, ev, 16), short_token = 0, long_progress = 0;
    for (int i = 0; i < n; i++) {
        if (ev[i].seq_id == 2 && ev[i].token >= 0) short_token = ev[i].token == alone[0].tokens[0];
        if (ev[i].seq_id == 1) long_progress = ev[i].prefill_done;
    }
    assert_true(short_token);
    assert_true(long_progress > 32 && long_progress < 200);
    while (engine_pending(e)) assert_true(engine_step(e, ev, 16) >= 0);
    expect_no_leak(e);
    engine_close(e);
}

/* The step that gives a newly arrived short prompt its first token is itself short: long
 * prefills in it are capped at an eighth of the budget (at least a block), so time to first token
 * is about the step the request arrived during, not two full chunks. The step after that runs a
 * full chunk again, and the long prompt's tokens do not change. */
static void test_first_token_step_caps_long_prefill(void **s) {
    (void)s;
    engine *e = open_engine(64, 0); /* an eighth of the budget is less than a block: 16 */
    int32_t longp[220];
    for (int i = 0; i < 220; i++) longp[i] = 4 + (i * 13) % 90;
    engine_request rl = greedy_request(longp, 220), rs = reqs[0];
    char err[256];
    engine_event ev[16];
    int progress[4] = {0}, short_first = -1;
    assert_int_equal(engine_submit(e, 1, &rl, err, sizeof err), 0);
    for (int step = 0; step < 3; step++) {
        if (step == 1) assert_int_equal(engine_submit(e, 2, &rs, err, sizeof err), 0);
        int n = engine_step(e, ev, 16);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++) {
            if (ev[i].seq_id == 1) progress[step] = ev[i].prefill_done;
            if (ev[i].seq_id == 2 && ev[i].token >= 0 && short_first < 0) short_first = step;
        }
    }
    assert_int_equal(short_first, 1);                 /* first token at the next step */
    assert_int_equal(progress[0], 64);               /* a full chunk alone */
    assert_int_equal(progress[1], 64 + 16);          /* capped while the short one starts */
    assert_int_equal(progress[2], 64 + 16 + 64 - 1); /* full again (the short one decodes) */
    stream got[3];
    memset(got, 0, sizeof got);
    while (engine_pending(e)) {
        int n = engine_step(e, ev, 16);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++)
            if (ev[i].token >= 0) got[ev[i].seq_id].tokens[got[ev[i].seq_id].n++] = ev[i].token;
    }
    expect_no_leak(e);
    engine_close(e);
    /* the same long prompt alone, unchunked */
    engine *solo = open_engine(512, 0);
    stream alone_long = {0};
    assert_int_equal(engine_submit(solo, 1, &rl, err, sizeof err), 0);
    while (engine_pending(solo)) {
        int n = engine_step(solo, ev, 16);
        for (int i = 0; i < n; i++)
            if (ev[i].token >= 0) alone_long.tokens[alone_long.n++] = ev[i].token;
    }
    engine_close(solo);
    assert_int_equal(got[1].n, MAX_TOK);
    assert_memory_equal(got[1].tokens, alone_long.tokens, MAX_TOK * sizeof(int32_t));
}

/* Random arrivals, cancellations and sampling settings against a small cache for a few hundred
 * steps: every request ends exactly once, greedy ones that ran to the end match their solo
 * tokens, and every block comes back. */
static void test_random_soak(void **s) {
    (void)s;
    engine *e = open_engine(24, 10 * 4096);
    uint64_t r = 2024;
#define RND() (r = r * 6364136223846793005ull + 1442695040888963407ull, (int)(r >> 33))
    int live[64] = {0}, kind[64] = {0}, ended = 0, submitted = 0;
    stream got[64];
    memset(got, 0, sizeof got);
    char err[256];
    engine_event ev[64];
    for (int step = 0; step < 400 || engine_pending(e); step++) {
        assert_true(step < 5000);
        if (step < 400 && RND() % 3 == 0 && submitted < 64) {
            int id = submitted++, k = RND() % N_REQ;
            engine_request q = reqs[k];
            kind[id] = k;
            if (RND() % 2) { /* sampled requests: only their lifecycle is checked */
                q.sampling.temperature = 0.8f;
                q.sampling.seed = (uint64_t)id;
                kind[id] = -1;
            }
            assert_int_equal(engine_submit(e, (uint64_t)id, &q, err, sizeof err), 0);
            live[id] = 1;
        }
        if (step < 400 && RND() % 7 == 0 && submitted > 0) {
            int id = RND() % submitted;
            engine_cancel(e, (uint64_t)id); /* may be finished already: ignored then */
        }
        int n = engine_step(e, ev, 64);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++) {
            stream *g = &got[ev[i].seq_id];
            if (ev[i].token >= 0) g->tokens[g->n++] = ev[i].token;
            if (ev[i].finish) {
                assert_int_equal(live[ev[i].seq_id], 1);
                live[ev[i].seq_id] = 0;
                g->finish = ev[i].finish;
                ended++;
            }
        }
    }
    printf("soak: %d requests, %d ended\n", submitted, ended);
    assert_int_equal(ended, submitted);
    for (int id = 0; id < submitted; id++) {
        if (kind[id] < 0 || got[id].finish != ENGINE_FINISH_LENGTH) continue;
        assert_memory_equal(got[id].tokens, alone[kind[id]].tokens, MAX_TOK * sizeof(int32_t));
    }
    expect_no_leak(e);
    engine_close(e);
#undef RND
}

/* A constraint (structured outputs) that allows one given token per step: the engine must mask
 * before each sample, report the chosen token, release once, and leave the other sequences of
 * the batch exactly as they are alone. */
typedef struct forced_tokens {
    int32_t want[MAX_TOK];
    int n_masks, n_accepts, released;
    int32_t accepted[MAX_TOK + 4];
} forced_tokens;

static void forced_mask(void *ctx, float *logits, int n) {
    forced_tokens *f = ctx;
    int32_t t = f->want[f->n_accepts < MAX_TOK ? f->n_accepts : 0];
    for (int i = 0; i < n; i++)
        if (i != t) logits[i] = -INFINITY;
    f->n_masks++;
}

static void forced_accept(void *ctx, int32_t token) {
    forced_tokens *f = ctx;
    if (f->n_accepts < MAX_TOK + 4) f->accepted[f->n_accepts] = token;
    f->n_accepts++;
}

static void forced_release(void *ctx) { ((forced_tokens *)ctx)->released++; }

static void test_constraint_decides_tokens(void **s) {
    (void)s;
    for (int sampled = 0; sampled < 2; sampled++) { /* greedy, then temperature 1 */
        engine *e = open_engine(16, 0);
        forced_tokens f = {0};
        for (int i = 0; i < MAX_TOK; i++) f.want[i] = 5 + (i * 13) % 80;
        engine_request constrained[N_REQ];
        memcpy(constrained, reqs, sizeof constrained);
        constrained[2].constraint = (engine_constraint){.mask = forced_mask,
                                                        .accept = forced_accept,
                                                        .release = forced_release, .ctx = &f};
        if (sampled) constrained[2].sampling.temperature = 1.0f;
        stream got[N_REQ] = {0};
        drive(e, got, NULL, -1, -1, constrained);
        assert_int_equal(f.released, 1);
        assert_int_equal(f.n_accepts, MAX_TOK);
        assert_int_equal(f.n_masks, MAX_TOK);
        assert_int_equal(got[2].n, MAX_TOK);
        assert_memory_equal(got[2].tokens, f.want, sizeof f.want);
        assert_memory_equal(f.accepted, f.want, sizeof f.want);
        expect_same(got, 2);
        expect_no_leak(e);
        engine_close(e);
    }
}

/* A constrained sequence cancelled before its end is released once, by the cancel. */
static void test_constraint_released_on_cancel(void **s) {
    (void)s;
    engine *e = open_engine(512, 0);
    forced_tokens f = {0};
    engine_request q = reqs[0];
    q.constraint = (engine_constraint){.mask = forced_mask, .accept = forced_accept,
                                       .release = forced_release, .ctx = &f};
    char err[256];
    engine_event ev[8];
    assert_int_equal(engine_submit(e, 7, &q, err, sizeof err), 0);
    engine_step(e, ev, 8);
    engine_cancel(e, 7);
    engine_step(e, ev, 8);
    assert_int_equal(f.released, 1);
    engine_close(e);
    assert_int_equal(f.released, 1);
}

/* Backend sampling never bypasses a constraint's mask: with a sample op on the backend, the
 * constrained sequence still gets exactly the tokens its mask allows, and the unconstrained
 * batch still samples on the backend once the constrained one is done. */
static void test_backend_sampling_keeps_constraints(void **s) {
    (void)s;
    engine *e = open_engine(16, 0);
    e->be->sample = argmax_sample;
    backend_samples = 0;
    forced_tokens f = {0};
    for (int i = 0; i < MAX_TOK; i++) f.want[i] = 5 + (i * 13) % 80;
    engine_request constrained[N_REQ];
    memcpy(constrained, reqs, sizeof constrained);
    constrained[2].constraint = (engine_constraint){.mask = forced_mask, .accept = forced_accept,
                                                    .release = forced_release, .ctx = &f};
    stream got[N_REQ] = {0};
    drive(e, got, NULL, -1, -1, constrained);
    assert_int_equal(f.n_masks, MAX_TOK);
    assert_memory_equal(got[2].tokens, f.want, sizeof f.want);
    expect_same(got, 2);
    assert_true(backend_samples > 0); /* the steps without it sampled on the backend */
    e->be->sample = NULL;
    expect_no_leak(e);
    engine_close(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone_streams_differ), cmocka_unit_test(test_batched_equals_alone),
        cmocka_unit_test(test_staggered_arrivals),   cmocka_unit_test(test_cancel_mid_stream),
        cmocka_unit_test(test_preemption_small_cache), cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_stop_and_logprobs),    cmocka_unit_test(test_rejects_bad_requests),
        cmocka_unit_test(test_kv_dtypes),            cmocka_unit_test(test_prefix_cache),
        cmocka_unit_test(test_prefix_cache_eviction),
        cmocka_unit_test(test_short_request_not_stuck_behind_long_prefill),
        cmocka_unit_test(test_first_token_step_caps_long_prefill),
        cmocka_unit_test(test_random_soak),
        cmocka_unit_test(test_constraint_decides_tokens),
        cmocka_unit_test(test_constraint_released_on_cancel),
        cmocka_unit_test(test_backend_sampling_keeps_constraints),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
