/* The hybrid linear-attention forward (Qwen3-Next, Qwen3.5 dense and MoE; bf16 and 4-bit) is
 * consistent with itself wherever the recurrent state is involved: a prompt gives the same logits
 * in one prefill, in chunks and token by token (the conv and delta-rule states carried across
 * calls); two sequences batched together in arbitrary slots give what each gives alone; a slot
 * reused by a new sequence (position 0) starts from zero; a pipeline split inside the run of
 * linear layers gives the whole model's logits; mlx-lm's checkpoint conventions give transformers'
 * logits; and through the engine, greedy tokens do
 * not depend on the prefill chunk size, on batching, on a preemption (recompute), or on a prefix
 * taken from the prefix cache (K/V blocks plus the state snapshot at their end).
 * Agreement with transformers itself is test_engine_reference's (tests/fixtures/reference). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "arch/transformer.h"
#include "compute/backend.h"
#include "infer/engine.h"
#include "infer/kv_cache.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TOK 23
#define BS 4
#define N_BLOCKS 64
/* Same float32 math in another order (a prefill's token loop vs one token per call is the same
 * order; batching and chunking only move the matmul's rows): agreement to float rounding. */
#define TOL 1e-5
/* The AVX-512 MLX matvec rounds activations per group to int16 at some token counts only:
 * measured 5.4e-4 of the largest logit through the 4-bit MoE (with the exact kernels,
 * EXO_CPU_SIMD=avx2 EXO_Q4_LAYOUT=mlx, it meets TOL). */
#define QUANT_TOL 1e-3

typedef struct model {
    char dir[256];
    model_config c;
    safetensors_set *st;
    model_weights w;
    compute_backend *be;
    transformer *t;
    double tol;
} model;

/* Builds (once) and loads a tiny hybrid with mkmodel: 4 layers, 3 linear then 1 full. */
static void open_model(model *m, const char *name, const char *args) {
    const char *build = getenv("EXO_BUILD");
    snprintf(m->dir, sizeof m->dir, ".cache/unit/hybrid-%s", name);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "mkdir -p .cache/unit && %s/tools/mkmodel --out %s --tokenizer none --vocab 300 "
             "--layers 4 --head-dim 32 --seed 11 %s >/dev/null",
             build ? build : "build", m->dir, args);
    assert_int_equal(system(cmd), 0);
    char err[512] = "";
    int rc = model_config_load(m->dir, &m->c, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    assert_true(model_config_is_hybrid(&m->c));
    m->st = safetensors_set_open(m->dir, err, sizeof err);
    assert_non_null(m->st);
    rc = model_weights_load(m->st, &m->c, 0, 0, &m->w, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    m->be = compute_backend_cpu(1);
    m->t = transformer_create(&m->c, &m->w, m->be, 64, 64, err, sizeof err);
    if (!m->t) fprintf(stderr, "%s\n", err);
    assert_non_null(m->t);
    m->tol = strstr(args, "--quant-bits") ? QUANT_TOL : TOL;
}

static void close_model(model *m) {
    transformer_destroy(m->t);
    m->be->destroy(m->be);
    model_weights_free(&m->w);
    safetensors_set_close(m->st);
}

static kv_cache *new_cache(model *m) {
    char err[256];
    kv_cache *kv = kv_cache_create(m->be, m->c.n_layers, (int64_t)m->c.n_kv_heads * m->c.head_dim,
                                   BS, N_BLOCKS, DTYPE_F32, err, sizeof err);
    assert_non_null(kv);
    return kv;
}

/* One step over up to two sequences: tokens [p0[s], p0[s] + n[s]) of seqs[s], in state slot
 * slot[s], cache blocks table[s] + i * 2 (disjoint per sequence). Logits of every token, in
 * batch order, into out. */
typedef struct seq_run {
    const int32_t *tokens;
    int p0, n, slot, block0;
} seq_run;

static void step(model *m, kv_cache *kv, const seq_run *runs, int n_runs, float *out) {
    int32_t tok[64], pos[64], seq[64], slots[64], rows[64], starts[2], state_slots[2];
    int32_t tables[2 * 32];
    int n = 0;
    for (int s = 0; s < n_runs; s++) {
        starts[s] = s * 32;
        state_slots[s] = runs[s].slot;
        for (int b = 0; b < 32; b++) tables[s * 32 + b] = runs[s].block0 + 2 * b;
        for (int j = 0; j < runs[s].n; j++, n++) {
            int p = runs[s].p0 + j;
            tok[n] = runs[s].tokens[p];
            pos[n] = p;
            seq[n] = s;
            slots[n] = tables[s * 32 + p / BS] * BS + p % BS;
            rows[n] = n;
        }
    }
    transformer_batch b = {.n_tokens = n, .tokens = tok, .positions = pos, .seq_of_token = seq,
                           .slots = slots, .n_seqs = n_runs, .block_table_start = starts,
                           .block_tables = tables, .n_block_entries = 64, .n_logits = n,
                           .logit_rows = rows, .state_slots = state_slots};
    char err[256];
    int rc = transformer_forward(m->t, kv->layers, BS, &b, out, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
}

static double max_abs(const float *a, size_t n) {
    double x = 0;
    for (size_t i = 0; i < n; i++) x = fabs(a[i]) > x ? fabs(a[i]) : x;
    return x;
}

static void expect_close(const model *m, const float *ref, const float *got, size_t n,
                         const char *what) {
    double scale = max_abs(ref, n), d = 0;
    for (size_t i = 0; i < n; i++) d = fabs(ref[i] - got[i]) > d ? fabs(ref[i] - got[i]) : d;
    if (d > m->tol * scale) fprintf(stderr, "%s: %s: max diff %g (scale %g)\n", m->dir, what, d, scale);
    assert_true(scale > 0.5);
    assert_true(d <= m->tol * scale);
}

/* Logits of all N_TOK tokens of `tok` in chunks of `chunk`, one sequence in `slot`. */
static void run_chunked(model *m, const int32_t *tok, int chunk, int slot, float *out) {
    kv_cache *kv = new_cache(m);
    size_t V = (size_t)m->c.vocab_size;
    for (int p0 = 0; p0 < N_TOK; p0 += chunk) {
        seq_run r = {tok, p0, N_TOK - p0 < chunk ? N_TOK - p0 : chunk, slot, 1};
        step(m, kv, &r, 1, out + (size_t)p0 * V);
    }
    kv_cache_destroy(kv);
}

static void check_forward(const char *name, const char *args) {
    model m;
    open_model(&m, name, args);
    size_t V = (size_t)m.c.vocab_size, all = (size_t)N_TOK * V;
    int32_t a[N_TOK], b[N_TOK];
    for (int i = 0; i < N_TOK; i++) a[i] = (i * 37 + 11) % (int)V, b[i] = (i * 53 + 7) % (int)V;
    float *ref = malloc(all * sizeof *ref), *got = malloc(all * sizeof *got);
    float *ref_b = malloc(all * sizeof *ref_b), *mix = malloc(2 * all * sizeof *mix);
    run_chunked(&m, a, N_TOK, 0, ref);
    run_chunked(&m, b, N_TOK, 0, ref_b);
    int chunks[] = {5, 1, 16};
    for (int ci = 0; ci < 3; ci++) { /* the state carries across calls, in any slot */
        run_chunked(&m, a, chunks[ci], 5 - ci, got);
        char what[64];
        snprintf(what, sizeof what, "chunks of %d", chunks[ci]);
        expect_close(&m, ref, got, all, what);
    }
    /* a then b in slot 3: b starts at position 0, so a's leftover state must not leak into it */
    run_chunked(&m, a, 7, 3, got);
    run_chunked(&m, b, 7, 3, got);
    expect_close(&m, ref_b, got, all, "slot reused from position 0");
    /* batched: a decodes token by token in slot 6 while b prefills in chunks of 4 in slot 2 */
    kv_cache *kv = new_cache(&m);
    float *out = mix;
    int pa = 0, pb = 0;
    while (pa < N_TOK || pb < N_TOK) {
        seq_run runs[2];
        int n = 0, na = pa < N_TOK ? 1 : 0, nb = N_TOK - pb < 4 ? N_TOK - pb : 4;
        if (na) runs[n++] = (seq_run){a, pa, 1, 6, 0};
        if (nb) runs[n++] = (seq_run){b, pb, nb, 2, 1};
        step(&m, kv, runs, n, out);
        if (na) memcpy(got + (size_t)pa * V, out, V * sizeof *got);
        if (nb) memcpy(mix + all + (size_t)pb * V, out + (size_t)na * V, (size_t)nb * V * sizeof *got);
        pa += na;
        pb += nb;
    }
    kv_cache_destroy(kv);
    expect_close(&m, ref, got, all, "batched with another sequence (decode)");
    expect_close(&m, ref_b, mix + all, all, "batched with another sequence (prefill)");
    free(ref), free(got), free(ref_b), free(mix);
    close_model(&m);
}

static void test_qwen3_next_moe(void **s) {
    (void)s;
    check_forward("next", "--arch qwen3_next --moe-layout hf");
}

static void test_qwen3_5_dense(void **s) {
    (void)s;
    check_forward("q35", "--arch qwen3_5");
}

static void test_qwen3_5_moe_4bit_mlx(void **s) {
    (void)s;
    check_forward("q35moe-4bit", "--arch qwen3_5_moe --moe-layout mlx --quant-bits 4 --group-size 64");
}

/* A pipeline split anywhere (here inside the run of linear layers: [0, 2) and [2, 4)) gives the
 * whole model's logits, prompt then one decode step: each stage keeps the state of its own
 * layers. */
static void test_pipeline_split(void **s) {
    (void)s;
    model whole;
    open_model(&whole, "q35", "--arch qwen3_5");
    size_t V = (size_t)whole.c.vocab_size, dim = (size_t)whole.c.hidden_size;
    int32_t a[N_TOK];
    for (int i = 0; i < N_TOK; i++) a[i] = (i * 37 + 11) % (int)V;
    float *ref = malloc((size_t)N_TOK * V * sizeof *ref), *got = malloc((size_t)N_TOK * V * sizeof *got);
    run_chunked(&whole, a, N_TOK - 1, 0, ref); /* prefill N_TOK - 1, then decode the last */
    model_weights stage_w[2];
    transformer *stage[2];
    kv_cache *kv[2];
    char err[256];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(model_weights_load(whole.st, &whole.c, 2 * i, 2 * i + 2, &stage_w[i], err,
                                            sizeof err), 0);
        stage[i] = transformer_create(&whole.c, &stage_w[i], whole.be, 64, 64, err, sizeof err);
        assert_non_null(stage[i]);
        kv[i] = kv_cache_create(whole.be, 2, (int64_t)whole.c.n_kv_heads * whole.c.head_dim, BS,
                                N_BLOCKS, DTYPE_F32, err, sizeof err);
    }
    float *hidden = malloc((size_t)N_TOK * dim * sizeof *hidden);
    for (int p0 = 0, n = N_TOK - 1; p0 < N_TOK; p0 += n, n = 1) {
        int32_t pos[N_TOK], seq[N_TOK], slots[N_TOK], rows[N_TOK], table[32], start = 0, slot = 3;
        for (int b = 0; b < 32; b++) table[b] = 1 + 2 * b;
        for (int j = 0; j < n; j++) {
            pos[j] = p0 + j, seq[j] = 0, rows[j] = j;
            slots[j] = table[pos[j] / BS] * BS + pos[j] % BS;
        }
        transformer_batch b = {.n_tokens = n, .tokens = a + p0, .positions = pos,
                               .seq_of_token = seq, .slots = slots, .n_seqs = 1,
                               .block_table_start = &start, .block_tables = table,
                               .n_block_entries = 32, .n_logits = n, .logit_rows = rows,
                               .state_slots = &slot};
        assert_int_equal(transformer_forward(stage[0], kv[0]->layers, BS, &b, hidden, err, sizeof err), 0);
        b.hidden_in = hidden;
        assert_int_equal(transformer_forward(stage[1], kv[1]->layers, BS, &b, got + (size_t)p0 * V,
                                             err, sizeof err), 0);
    }
    expect_close(&whole, ref, got, (size_t)N_TOK * V, "pipeline stages [0, 2) + [2, 4)");
    for (int i = 0; i < 2; i++) {
        kv_cache_destroy(kv[i]);
        transformer_destroy(stage[i]);
        model_weights_free(&stage_w[i]);
    }
    free(hidden), free(ref), free(got);
    close_model(&whole);
}

/* mlx-lm's conversion (conv1d [C, K, 1], the zero-centred norms stored as 1 + w) and
 * transformers' layout of the same values give the same logits (f32 weights: the stored 1 + w
 * differs from 1 + the stored w by one f32 rounding). */
static void test_mlx_conventions(void **s) {
    (void)s;
    model hf, mlx;
    open_model(&hf, "layout-hf", "--arch qwen3_5 --dtype f32");
    open_model(&mlx, "layout-mlx", "--arch qwen3_5 --dtype f32 --hybrid-layout mlx");
    assert_true(hf.w.norm_plus_one);
    assert_false(mlx.w.norm_plus_one);
    size_t V = (size_t)hf.c.vocab_size, all = (size_t)N_TOK * V;
    int32_t a[N_TOK];
    for (int i = 0; i < N_TOK; i++) a[i] = (i * 37 + 11) % (int)V;
    float *x = malloc(all * sizeof *x), *y = malloc(all * sizeof *y);
    run_chunked(&hf, a, N_TOK, 0, x);
    run_chunked(&mlx, a, N_TOK, 0, y);
    expect_close(&hf, x, y, all, "mlx-lm layout");
    free(x), free(y);
    close_model(&hf);
    close_model(&mlx);
}

/* Greedy tokens of three prompts through the engine with these options. */
static void engine_tokens(const char *dir, int max_batch_tokens, size_t kv_bytes, int one_at_a_time,
                          int32_t out[3][12]) {
    engine_options o = {.model_dir = dir, .max_batch_tokens = max_batch_tokens, .n_threads = 1,
                        .kv_cache_bytes = kv_bytes, .kv_cache_dtype = "f32", .device = "cpu",
                        .max_sequences = 4};
    char err[256];
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) fprintf(stderr, "%s\n", err);
    assert_non_null(e);
    int32_t prompts[3][40];
    int lens[3] = {37, 9, 21}, got[3] = {0};
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < lens[p]; i++) prompts[p][i] = (i * (17 + 6 * p) + 3 * p + 1) % 300;
    for (int p = 0; p < 3; p++) {
        engine_request r = {.prompt = prompts[p], .n_prompt = lens[p], .max_tokens = 12,
                            .ban_eos = 1};
        r.sampling = sampling_params_default();
        r.sampling.temperature = 0;
        assert_int_equal(engine_submit(e, (uint64_t)p, &r, err, sizeof err), 0);
        while (one_at_a_time && engine_pending(e)) {
            engine_event ev[8];
            int n = engine_step(e, ev, 8);
            assert_true(n >= 0);
            for (int i = 0; i < n; i++)
                if (ev[i].token >= 0) out[ev[i].seq_id][got[ev[i].seq_id]++] = ev[i].token;
        }
    }
    while (engine_pending(e)) {
        engine_event ev[8];
        int n = engine_step(e, ev, 8);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++)
            if (ev[i].token >= 0) out[ev[i].seq_id][got[ev[i].seq_id]++] = ev[i].token;
    }
    engine_stats st;
    engine_get_stats(e, &st);
    if (kv_bytes) assert_true(st.preemptions > 0); /* the small cache did force recomputes */
    engine_close(e);
    for (int p = 0; p < 3; p++) assert_int_equal(got[p], 12);
}

static void test_engine_scheduling(void **s) {
    (void)s;
    model m;
    open_model(&m, "q35", "--arch qwen3_5");
    int32_t alone[3][12], chunked[3][12], batched[3][12], preempted[3][12];
    engine_tokens(m.dir, 512, 0, 1, alone);     /* one request at a time, whole prompts */
    engine_tokens(m.dir, 8, 0, 0, chunked);     /* together, prefill in chunks of <= 8 tokens */
    engine_tokens(m.dir, 512, 0, 0, batched);   /* together */
    /* 5 blocks of 16 tokens for 3 sequences needing 4 + 2 + 3: someone is preempted */
    size_t block = kv_cache_block_bytes(m.c.n_layers, (int64_t)m.c.n_kv_heads * m.c.head_dim, 16,
                                        DTYPE_F32);
    engine_tokens(m.dir, 16, 5 * block, 0, preempted);
    assert_memory_equal(alone, chunked, sizeof alone);
    assert_memory_equal(alone, batched, sizeof alone);
    assert_memory_equal(alone, preempted, sizeof alone);
    close_model(&m);
}

/* Runs one request to completion: its 12 greedy tokens, and how many prompt tokens were cached. */
static int generate(engine *e, uint64_t id, const int32_t *prompt, int n, int32_t out[12]) {
    engine_request r = {.prompt = prompt, .n_prompt = n, .max_tokens = 12, .ban_eos = 1};
    r.sampling = sampling_params_default();
    r.sampling.temperature = 0;
    char err[256];
    assert_int_equal(engine_submit(e, id, &r, err, sizeof err), 0);
    int got = 0, cached = -1;
    while (engine_pending(e)) {
        engine_event ev[8];
        int k = engine_step(e, ev, 8);
        assert_true(k >= 0);
        for (int i = 0; i < k; i++) {
            if (ev[i].token >= 0) out[got++] = ev[i].token;
            cached = ev[i].cached_tokens;
        }
    }
    assert_int_equal(got, 12);
    return cached;
}

static engine *open_engine(const char *dir) {
    engine_options o = {.model_dir = dir, .max_batch_tokens = 64, .n_threads = 1,
                        .kv_cache_dtype = "f32", .device = "cpu", .max_sequences = 4};
    char err[256];
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) fprintf(stderr, "%s\n", err);
    assert_non_null(e);
    return e;
}

/* A follow-up turn reuses the prefix of the first (its K/V and its linear layers' state) and
 * generates what a fresh engine generates for the whole prompt. */
static void test_engine_prefix_cache(void **s) {
    (void)s;
    model m;
    open_model(&m, "next", "--arch qwen3_next --moe-layout hf");
    int32_t turn[80], first[12], second[12], fresh[12];
    for (int i = 0; i < 37; i++) turn[i] = (i * 29 + 5) % 300;
    int32_t other[20], other_out[12];
    for (int i = 0; i < 20; i++) other[i] = (i * 7 + 1) % 300; /* shares no block with turn */
    engine *e = open_engine(m.dir);
    assert_int_equal(generate(e, 1, turn, 37, first), 0);
    memcpy(turn + 37, first, sizeof first);
    for (int i = 0; i < 5; i++) turn[49 + i] = (i * 41 + 2) % 300;
    generate(e, 2, other, 20, other_out); /* leaves its own state in the slot turn had */
    /* 37 prompt + 11 computed generated tokens: the state after 48 was snapshotted */
    assert_int_equal(generate(e, 3, turn, 54, second), 48);
    engine_close(e);
    e = open_engine(m.dir);
    assert_int_equal(generate(e, 1, turn, 54, fresh), 0);
    engine_close(e);
    assert_memory_equal(second, fresh, sizeof fresh);
    close_model(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_next_moe),
        cmocka_unit_test(test_qwen3_5_dense),
        cmocka_unit_test(test_qwen3_5_moe_4bit_mlx),
        cmocka_unit_test(test_pipeline_split),
        cmocka_unit_test(test_mlx_conventions),
        cmocka_unit_test(test_engine_scheduling),
        cmocka_unit_test(test_engine_prefix_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
