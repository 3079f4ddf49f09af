/* The shared transformer forward against a naive single-sequence implementation, for every
 * family and weight format: whole-prompt prefill, chunked prefill + decode through a paged cache
 * with scattered blocks, and a two-stage pipeline split giving the same logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tiny_model.h"

#include "compute/backend.h"
#include "infer/kv_cache.h"

#define N_TOK 21
/* Dense weights: the fast kernels compute in f32 like the reference, so logits agree to float
 * rounding (1e-5 of the largest logit). MLX-quantized weights: the AVX-512 matvec rounds each
 * group of activations to int16 (relative error 2^-16 per value) to use integer dot products;
 * through 2 layers that stays under 5e-4 of the largest logit, still far below the 1e-3 logprob
 * bar against transformers. */
#define QUANT_TOL 5e-4
#define BS 4

static const tiny_spec base_llama = {
    .arch = "LlamaForCausalLM", .vocab = 96, .dim = 64, .layers = 2, .heads = 4, .kv_heads = 2,
    .head_dim = 16, .inter = 96, .dtype = ST_F32, .seed = 1,
    .rope_scaling = "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                    "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 16}"};

typedef struct loaded {
    model_config c;
    safetensors_set *st;
    model_weights w;
} loaded;

static void load(const char *dir, loaded *m, int ls, int le) {
    char err[512] = "";
    int rc = model_config_load(dir, &m->c, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    m->st = safetensors_set_open(dir, err, sizeof err);
    if (!m->st) fprintf(stderr, "%s\n", err);
    assert_non_null(m->st);
    rc = model_weights_load(m->st, &m->c, ls, le, &m->w, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
}

static void unload(loaded *m) {
    model_weights_free(&m->w);
    safetensors_set_close(m->st);
}

static double max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(a[i] - b[i]) > m ? fabs(a[i] - b[i]) : m;
    return m;
}

/* Runs tokens through t in chunks of `chunk`, one sequence whose blocks are scattered
 * (block i of the sequence is cache block 2*i+1). logits: [N_TOK][vocab]. */
static void run_chunked(transformer *t, kv_cache *kv, const int32_t *tok, int chunk, int vocab,
                        float *logits) {
    int32_t table[64], start = 0;
    for (int i = 0; i < 64; i++) table[i] = 2 * i + 1;
    for (int p0 = 0; p0 < N_TOK; p0 += chunk) {
        int n = N_TOK - p0 < chunk ? N_TOK - p0 : chunk;
        int32_t pos[N_TOK], seq[N_TOK], slots[N_TOK], rows[N_TOK];
        for (int j = 0; j < n; j++) {
            pos[j] = p0 + j;
            seq[j] = 0;
            slots[j] = table[pos[j] / BS] * BS + pos[j] % BS;
            rows[j] = j;
        }
        transformer_batch b = {.n_tokens = n, .tokens = tok + p0, .positions = pos,
                               .seq_of_token = seq, .slots = slots, .n_seqs = 1,
                               .block_table_start = &start, .block_tables = table,
                               .n_block_entries = (p0 + n + BS - 1) / BS, .n_logits = n,
                               .logit_rows = rows};
        char err[256];
        assert_int_equal(transformer_forward(t, kv->layers, BS, &b, logits + (size_t)p0 * vocab,
                                             err, sizeof err), 0);
    }
}

static void check_spec(const tiny_spec *spec, const char *name, double tol) {
    char dir[256];
    tiny_dir(dir, sizeof dir, name);
    assert_int_equal(tiny_model_write(dir, spec), 0);
    loaded m;
    load(dir, &m, 0, 0);
    int vocab = m.c.vocab_size;
    int32_t tok[N_TOK];
    for (int i = 0; i < N_TOK; i++) tok[i] = (i * 37 + 11) % vocab;
    float *ref = malloc(sizeof(float) * N_TOK * vocab), *got = malloc(sizeof(float) * N_TOK * vocab);
    tiny_reference_forward(&m.c, &m.w, tok, N_TOK, ref);
    double scale = max_abs(ref, (size_t)N_TOK * vocab);
    assert_true(scale > 0.5); /* the random model produces non-trivial logits */
    compute_backend *be = compute_backend_cpu(1);
    char err[256];
    transformer *t = transformer_create(&m.c, &m.w, be, 32, 32, err, sizeof err);
    assert_non_null(t);
    int chunks[] = {N_TOK, 5, 1};
    for (int ci = 0; ci < 3; ci++) {
        kv_cache *kv = kv_cache_create(be, m.c.n_layers, (int64_t)m.c.n_kv_heads * m.c.head_dim,
                                       BS, 64, DTYPE_F32, err, sizeof err);
        assert_non_null(kv);
        memset(got, 0, sizeof(float) * N_TOK * vocab);
        run_chunked(t, kv, tok, chunks[ci], vocab, got);
        double d = max_diff(ref, got, (size_t)N_TOK * vocab);
        if (d > tol * scale) fprintf(stderr, "%s chunk %d: max diff %g (scale %g)\n", name, chunks[ci], d, scale);
        assert_true(d <= tol * scale);
        kv_cache_destroy(kv);
    }
    transformer_destroy(t);
    be->destroy(be);
    unload(&m);
    free(ref);
    free(got);
}

static void test_llama_llama3_rope_f32(void **s) {
    (void)s;
    check_spec(&base_llama, "llama_f32", 1e-5);
}

static void test_llama_bf16_tied(void **s) {
    (void)s;
    tiny_spec sp = base_llama;
    sp.dtype = ST_BF16;
    sp.tie = 1;
    sp.rope_scaling = "{\"type\": \"linear\", \"factor\": 2.0}";
    check_spec(&sp, "llama_bf16", 1e-5);
}

static void test_qwen2_bias_f16(void **s) {
    (void)s;
    tiny_spec sp = base_llama;
    sp.arch = "Qwen2ForCausalLM";
    sp.dtype = ST_F16;
    sp.rope_scaling = NULL;
    check_spec(&sp, "qwen2_f16", 1e-5);
}

static void test_qwen3_yarn(void **s) {
    (void)s;
    tiny_spec sp = base_llama;
    sp.arch = "Qwen3ForCausalLM";
    sp.head_dim = 32; /* head_dim * heads != dim, as in real Qwen3 */
    sp.rope_scaling = "{\"rope_type\": \"yarn\", \"factor\": 4.0, "
                      "\"original_max_position_embeddings\": 8}";
    check_spec(&sp, "qwen3_yarn", 1e-5);
}

static void test_qwen3_mlx_quant(void **s) {
    (void)s;
    int bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 32, 64, 32, 64};
    for (int i = 0; i < 6; i++) {
        tiny_spec sp = base_llama;
        sp.arch = "Qwen3ForCausalLM";
        sp.inter = 128;
        sp.quant_bits = bits[i];
        sp.group_size = groups[i];
        sp.tie = i % 2; /* quantized tied embedding as lm_head */
        char name[64];
        snprintf(name, sizeof name, "qwen3_q%d", bits[i]);
        check_spec(&sp, name, QUANT_TOL);
    }
}

static void test_qwen3_moe_layouts(void **s) {
    (void)s;
    tiny_spec sp = base_llama;
    sp.arch = "Qwen3MoeForCausalLM";
    sp.experts = 8;
    sp.topk = 2;
    sp.moe_inter = 32;
    sp.norm_topk = 1;
    sp.rope_scaling = NULL;
    check_spec(&sp, "moe_hf", 1e-5);
    sp.stacked_experts = 1;
    sp.norm_topk = 0;
    sp.dtype = ST_BF16;
    check_spec(&sp, "moe_stacked", 1e-5);
    sp.quant_bits = 4;
    sp.group_size = 32;
    check_spec(&sp, "moe_stacked_q4", QUANT_TOL);
}

/* Layers [0,1) then [1,2): hidden states passed between stages give the same logits. */
static void test_pipeline_split(void **s) {
    (void)s;
    char dir[256], err[256];
    tiny_dir(dir, sizeof dir, "pp");
    assert_int_equal(tiny_model_write(dir, &base_llama), 0);
    loaded whole, a, b;
    load(dir, &whole, 0, 0);
    load(dir, &a, 0, 1);
    load(dir, &b, 1, 2);
    assert_false(a.w.has_head);
    assert_true(b.w.has_head);
    assert_false(b.w.has_embed);
    int vocab = whole.c.vocab_size, dim = whole.c.hidden_size;
    int32_t tok[N_TOK], pos[N_TOK], seq[N_TOK], slots[N_TOK], rows[N_TOK], table[8], start = 0;
    for (int i = 0; i < N_TOK; i++) {
        tok[i] = (i * 13 + 5) % vocab;
        pos[i] = i;
        seq[i] = 0;
        slots[i] = i;
        rows[i] = i;
    }
    for (int i = 0; i < 8; i++) table[i] = i;
    float *ref = malloc(sizeof(float) * N_TOK * vocab), *got = malloc(sizeof(float) * N_TOK * vocab);
    float *hidden = malloc(sizeof(float) * N_TOK * dim);
    tiny_reference_forward(&whole.c, &whole.w, tok, N_TOK, ref);
    compute_backend *be = compute_backend_cpu(1);
    transformer *ta = transformer_create(&a.c, &a.w, be, 32, 32, err, sizeof err);
    transformer *tb = transformer_create(&b.c, &b.w, be, 32, 32, err, sizeof err);
    int64_t kvd = (int64_t)whole.c.n_kv_heads * whole.c.head_dim;
    kv_cache *ka = kv_cache_create(be, 1, kvd, BS, 8, DTYPE_F32, err, sizeof err);
    kv_cache *kb = kv_cache_create(be, 1, kvd, BS, 8, DTYPE_F32, err, sizeof err);
    transformer_batch bt = {.n_tokens = N_TOK, .tokens = tok, .positions = pos,
                            .seq_of_token = seq, .slots = slots, .n_seqs = 1,
                            .block_table_start = &start, .block_tables = table,
                            .n_block_entries = 8, .n_logits = N_TOK, .logit_rows = rows};
    assert_int_equal(transformer_forward(ta, ka->layers, BS, &bt, hidden, err, sizeof err), 0);
    bt.hidden_in = hidden;
    bt.tokens = NULL;
    assert_int_equal(transformer_forward(tb, kb->layers, BS, &bt, got, err, sizeof err), 0);
    assert_true(max_diff(ref, got, (size_t)N_TOK * vocab) <= 1e-5 * max_abs(ref, (size_t)N_TOK * vocab));
    kv_cache_destroy(ka);
    kv_cache_destroy(kb);
    transformer_destroy(ta);
    transformer_destroy(tb);
    be->destroy(be);
    unload(&whole);
    unload(&a);
    unload(&b);
    free(ref);
    free(got);
    free(hidden);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_llama3_rope_f32), cmocka_unit_test(test_llama_bf16_tied),
        cmocka_unit_test(test_qwen2_bias_f16),        cmocka_unit_test(test_qwen3_yarn),
        cmocka_unit_test(test_qwen3_mlx_quant),       cmocka_unit_test(test_qwen3_moe_layouts),
        cmocka_unit_test(test_pipeline_split),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tiny_cleanup();
    return rc;
}
