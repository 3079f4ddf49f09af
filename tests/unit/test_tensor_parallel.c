/* Tensor-parallel shards of the shared transformer against the whole model, without a network:
 * N ranks are N threads, each with its own backend, KV cache and weight slice, and the
 * all-reduce the forward pass calls is a barrier-and-sum between them. Dense and MoE, bf16 and
 * MLX 4-bit, with q/k/v biases: rank 0's logits equal the one-process logits (to float rounding
 * of the split sums), and each shard holds 1/N of the layer weights. Splits the model's shapes
 * or quantization groups do not allow are refused with a message naming what does not divide. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tiny_model.h"

#include "compute/backend.h"
#include "infer/kv_cache.h"

#include <pthread.h>

#define N_TOK 19
#define BS 4
#define MAX_RANKS 4

/* ---- an in-process all-reduce: a barrier-and-sum between rank threads ---- */

typedef struct thread_group {
    int n;
    pthread_barrier_t barrier;
    float *bufs[MAX_RANKS];
    float *sum;
} thread_group;

typedef struct rank_ctx {
    thread_group *g;
    int rank;
} rank_ctx;

static int thread_allreduce(void *ctx, float *buf, size_t n, char *err, size_t errlen) {
    (void)err, (void)errlen;
    rank_ctx *r = ctx;
    thread_group *g = r->g;
    g->bufs[r->rank] = buf;
    pthread_barrier_wait(&g->barrier);
    if (r->rank == 0)
        for (size_t i = 0; i < n; i++) {
            float s = 0;
            for (int k = 0; k < g->n; k++) s += g->bufs[k][i];
            g->sum[i] = s;
        }
    pthread_barrier_wait(&g->barrier);
    memcpy(buf, g->sum, n * sizeof *buf);
    pthread_barrier_wait(&g->barrier);
    return 0;
}

/* ---- one rank ---- */

typedef struct rank_run {
    rank_ctx ctx;
    const char *dir;
    int tp_size;
    const int32_t *tokens;
    float *logits;        /* [N_TOK][vocab]: each rank fills its vocabulary share's columns */
    size_t layer_bytes;   /* weight bytes of its layers */
    int rc;
    char err[256];
} rank_run;

static size_t layers_bytes(const model_weights *w) {
    return w->bytes_per_token; /* layers and this rank's share of the lm_head */
}

static int prepare_weight(weight_matrix *m, void *backend) {
    compute_backend *b = backend;
    return b->prepare_weight(b, m);
}

static void *rank_main(void *arg) {
    rank_run *r = arg;
    model_config c;
    r->rc = -1;
    if (model_config_load(r->dir, &c, r->err, sizeof r->err)) return NULL;
    safetensors_set *st = safetensors_set_open(r->dir, r->err, sizeof r->err);
    model_weights w;
    model_shard shard = {.tp_rank = r->ctx.rank, .tp_size = r->tp_size};
    if (!st || model_weights_load_shard(st, &c, &shard, &w, r->err, sizeof r->err)) {
        safetensors_set_close(st);
        return NULL;
    }
    r->layer_bytes = layers_bytes(&w);
    compute_backend *be = compute_backend_cpu(1);
    if (be->prepare_weight) model_weights_rewrite(&w, prepare_weight, be); /* as engine_open */
    transformer *t = transformer_create(&c, &w, be, 32, 32, r->err, sizeof r->err);
    int64_t kv_dim = (int64_t)(c.n_kv_heads / r->tp_size) * c.head_dim;
    kv_cache *kv = kv_cache_create(be, c.n_layers, kv_dim, BS, 16, DTYPE_F32, r->err,
                                   sizeof r->err);
    int64_t share = w.lm_head.rows;
    float *part = malloc((size_t)N_TOK * (size_t)share * sizeof *part);
    if (t && kv && part) {
        if (r->tp_size > 1) transformer_set_allreduce(t, thread_allreduce, &r->ctx);
        int32_t pos[N_TOK], seq[N_TOK], slots[N_TOK], rows[N_TOK], table[8], start = 0;
        for (int i = 0; i < 8; i++) table[i] = 7 - i; /* scattered blocks */
        for (int j = 0; j < N_TOK; j++) {
            pos[j] = j;
            seq[j] = 0;
            slots[j] = table[j / BS] * BS + j % BS;
            rows[j] = j;
        }
        transformer_batch b = {.n_tokens = N_TOK, .tokens = r->tokens, .positions = pos,
                               .seq_of_token = seq, .slots = slots, .n_seqs = 1,
                               .block_table_start = &start, .block_tables = table,
                               .n_block_entries = (N_TOK + BS - 1) / BS,
                               .n_logits = N_TOK, .logit_rows = rows};
        r->rc = transformer_forward(t, kv->layers, BS, &b, part, r->err, sizeof r->err);
        for (int i = 0; i < N_TOK; i++)
            memcpy(r->logits + (size_t)i * (size_t)c.vocab_size + w.vocab_start,
                   part + (size_t)i * (size_t)share, (size_t)share * sizeof *part);
    }
    free(part);
    kv_cache_destroy(kv);
    transformer_destroy(t);
    be->destroy(be);
    model_weights_free(&w);
    safetensors_set_close(st);
    return NULL;
}

/* Runs the model split tp_size ways; the gathered logits into logits. Returns rank 0's weight
 * bytes read per token. */
static size_t run_split(const char *dir, int tp_size, const int32_t *tokens, float *logits,
                        size_t sum_floats) {
    thread_group g = {.n = tp_size, .sum = malloc(sum_floats * sizeof(float))};
    pthread_barrier_init(&g.barrier, NULL, (unsigned)tp_size);
    rank_run runs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int k = 0; k < tp_size; k++) {
        runs[k] = (rank_run){.ctx = {&g, k}, .dir = dir, .tp_size = tp_size, .tokens = tokens,
                             .logits = logits};
        assert_int_equal(pthread_create(&th[k], NULL, rank_main, &runs[k]), 0);
    }
    for (int k = 0; k < tp_size; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < tp_size; k++) {
        if (runs[k].rc) fprintf(stderr, "rank %d of %d: %s\n", k, tp_size, runs[k].err);
        assert_int_equal(runs[k].rc, 0);
    }
    pthread_barrier_destroy(&g.barrier);
    free(g.sum);
    return runs[0].layer_bytes;
}

static void check_split(const tiny_spec *spec, const char *name, const int *sizes, int n_sizes,
                        double tol) {
    char dir[256];
    tiny_dir(dir, sizeof dir, name);
    assert_int_equal(tiny_model_write(dir, spec), 0);
    size_t n = (size_t)N_TOK * (size_t)spec->vocab;
    int32_t tokens[N_TOK];
    for (int i = 0; i < N_TOK; i++) tokens[i] = (i * 29 + 5) % spec->vocab;
    float *whole = calloc(n, sizeof *whole), *split = calloc(n, sizeof *split);
    size_t sum_floats = (size_t)N_TOK * (size_t)spec->dim;
    size_t whole_bytes = run_split(dir, 1, tokens, whole, sum_floats);
    double scale = 0;
    for (size_t i = 0; i < n; i++) scale = fabs(whole[i]) > scale ? fabs(whole[i]) : scale;
    assert_true(scale > 0.5);
    for (int k = 0; k < n_sizes; k++) {
        memset(split, 0, n * sizeof *split);
        size_t bytes = run_split(dir, sizes[k], tokens, split, sum_floats);
        double d = 0;
        for (size_t i = 0; i < n; i++) d = fmax(d, fabs(whole[i] - split[i]));
        printf("%s tp=%d: max logit diff %.3g (largest logit %.3g), layer bytes %zu of %zu\n",
               name, sizes[k], d, scale, bytes, whole_bytes);
        assert_true(d <= tol * scale);
        /* each rank holds its share of every matrix (the router and norms are whole) */
        assert_true(bytes * (size_t)sizes[k] <= whole_bytes + whole_bytes / 8);
    }
    free(whole);
    free(split);
}

static const int sizes_2_4[] = {2, 4};

static void test_dense_bf16(void **s) {
    (void)s;
    tiny_spec spec = {.arch = "Qwen3ForCausalLM", .vocab = 96, .dim = 64, .layers = 2,
                      .heads = 8, .kv_heads = 4, .head_dim = 16, .inter = 128, .dtype = ST_BF16,
                      .seed = 5};
    check_split(&spec, "tp_qwen3_bf16", sizes_2_4, 2, 1e-5);
}

static void test_dense_biases_f32(void **s) {
    (void)s; /* Qwen2: q/k/v biases are sliced with their rows */
    tiny_spec spec = {.arch = "Qwen2ForCausalLM", .vocab = 96, .dim = 64, .layers = 2,
                      .heads = 4, .kv_heads = 4, .head_dim = 16, .inter = 96, .dtype = ST_F32,
                      .tie = 1, .seed = 6};
    check_split(&spec, "tp_qwen2_f32", sizes_2_4, 2, 1e-5);
}

static void test_dense_4bit(void **s) {
    (void)s; /* group 32: o_proj's 128 input columns and the FFN's 256 split into whole groups */
    tiny_spec spec = {.arch = "LlamaForCausalLM", .vocab = 96, .dim = 64, .layers = 2,
                      .heads = 8, .kv_heads = 4, .head_dim = 16, .inter = 256, .quant_bits = 4,
                      .group_size = 32, .seed = 7};
    check_split(&spec, "tp_llama_4bit", sizes_2_4, 2, 5e-4);
}

static void test_tied_4bit(void **s) {
    (void)s; /* the lm_head share of a tied embedding is laid out apart from the embedding (128
              * columns: the CPU backend interleaves such 4-bit matrices in place at load) */
    tiny_spec spec = {.arch = "LlamaForCausalLM", .vocab = 100, .dim = 128, .layers = 2,
                      .heads = 8, .kv_heads = 4, .head_dim = 16, .inter = 256, .quant_bits = 4,
                      .group_size = 32, .tie = 1, .seed = 11};
    check_split(&spec, "tp_llama_4bit_tied", sizes_2_4, 2, 5e-4);
}

static void test_moe_bf16(void **s) {
    (void)s; /* every expert's hidden dim is split; routing is replicated */
    tiny_spec spec = {.arch = "Qwen3MoeForCausalLM", .vocab = 96, .dim = 64, .layers = 2,
                      .heads = 4, .kv_heads = 4, .head_dim = 16, .inter = 128, .experts = 8,
                      .topk = 2, .moe_inter = 64, .norm_topk = 1, .stacked_experts = 0,
                      .dtype = ST_BF16, .seed = 8};
    check_split(&spec, "tp_moe_bf16", sizes_2_4, 2, 1e-5);
}

static void test_moe_4bit_stacked(void **s) {
    (void)s;
    tiny_spec spec = {.arch = "Qwen3MoeForCausalLM", .vocab = 96, .dim = 64, .layers = 2,
                      .heads = 4, .kv_heads = 4, .head_dim = 32, .inter = 128, .experts = 8,
                      .topk = 2, .moe_inter = 128, .norm_topk = 1, .stacked_experts = 1,
                      .quant_bits = 4, .group_size = 32, .seed = 9};
    check_split(&spec, "tp_moe_4bit", sizes_2_4, 2, 5e-4);
}

static void test_refuses_splits_that_do_not_divide(void **s) {
    (void)s;
    char dir[256], err[256] = "";
    /* group 64: o_proj's 64 input columns (4 heads x 16) cannot be cut in 2 whole groups */
    tiny_spec spec = {.arch = "Qwen3ForCausalLM", .vocab = 96, .dim = 64, .layers = 2,
                      .heads = 4, .kv_heads = 2, .head_dim = 16, .inter = 128, .quant_bits = 4,
                      .group_size = 64, .seed = 10};
    tiny_dir(dir, sizeof dir, "tp_refuse");
    assert_int_equal(tiny_model_write(dir, &spec), 0);
    model_config c;
    assert_int_equal(model_config_load(dir, &c, err, sizeof err), 0);
    assert_int_equal(model_config_tensor_split_check(&c, 1, err, sizeof err), 0);
    assert_int_equal(model_config_tensor_split_check(&c, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "quantization group size 64"));
    assert_int_equal(model_config_tensor_split_check(&c, 3, err, sizeof err), -1);
    assert_non_null(strstr(err, "attention heads (4) does not divide by 3"));
    assert_int_equal(model_config_tensor_split_check(&c, 4, err, sizeof err), -1);
    assert_non_null(strstr(err, "KV heads (2) does not divide by 4"));
    safetensors_set *st = safetensors_set_open(dir, err, sizeof err);
    assert_non_null(st);
    model_weights w;
    model_shard shard = {.tp_rank = 1, .tp_size = 2};
    assert_int_equal(model_weights_load_shard(st, &c, &shard, &w, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot split the model 2 ways"));
    shard.tp_rank = 2;
    assert_int_equal(model_weights_load_shard(st, &c, &shard, &w, err, sizeof err), -1);
    safetensors_set_close(st);
}

static int teardown(void **s) {
    (void)s;
    tiny_cleanup();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_bf16),       cmocka_unit_test(test_dense_biases_f32),
        cmocka_unit_test(test_dense_4bit),       cmocka_unit_test(test_tied_4bit),
        cmocka_unit_test(test_moe_bf16),
        cmocka_unit_test(test_moe_4bit_stacked), cmocka_unit_test(test_refuses_splits_that_do_not_divide),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
