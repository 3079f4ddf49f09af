/* CPU backend ops against hand-computed cases, and the fast attention path against the
 * reference over random paged caches (f32/f16/bf16, several GQA groupings and lengths). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "compute/backend.h"
#include "compute/cpu/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 12345;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static void test_rmsnorm(void **s) {
    (void)s;
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 0.5f, 2, 1}, y[4];
    cpu_op_rmsnorm(x, w, y, 0, 1, 4, 0.0f);
    float r = sqrtf((1 + 4 + 9 + 16) / 4.0f);
    assert_float_equal(y[0], 1 / r, 1e-6);
    assert_float_equal(y[1], 2 / r * 0.5f, 1e-6);
    assert_float_equal(y[2], 3 / r * 2, 1e-6);
    assert_float_equal(y[3], 4 / r, 1e-6);
}

static void test_rope_rotate_half(void **s) {
    (void)s;
    /* one head of 4 dims: pairs (0,2) and (1,3) rotate by pos*f0 and pos*f1 */
    float x[4] = {1, 2, 3, 4}, f[2] = {0.5f, 0.25f};
    int32_t pos = 3;
    cpu_op_rope(x, &pos, 0, 1, 1, 4, 4, f, 1.0f);
    float a0 = 1.5f, a1 = 0.75f;
    assert_float_equal(x[0], 1 * cosf(a0) - 3 * sinf(a0), 1e-6);
    assert_float_equal(x[2], 3 * cosf(a0) + 1 * sinf(a0), 1e-6);
    assert_float_equal(x[1], 2 * cosf(a1) - 4 * sinf(a1), 1e-6);
    assert_float_equal(x[3], 4 * cosf(a1) + 2 * sinf(a1), 1e-6);
    /* position 0 is the identity */
    float y[4] = {1, 2, 3, 4};
    pos = 0;
    cpu_op_rope(y, &pos, 0, 1, 1, 4, 4, f, 1.0f);
    assert_float_equal(y[2], 3, 0);
}

static void test_silu_and_route(void **s) {
    (void)s;
    float g[2] = {0, 2}, u[2] = {5, 3};
    cpu_op_silu_mul(g, u, 0, 2);
    assert_float_equal(g[0], 0, 0);
    assert_float_equal(g[1], 2 / (1 + expf(-2)) * 3, 1e-6);
    float logits[4] = {0.1f, 2.0f, -1.0f, 1.0f};
    int32_t ids[2];
    float w[2];
    cpu_op_moe_route(logits, 1, 4, 2, 0, ids, w);
    double z = exp(0.1) + exp(2.0) + exp(-1.0) + exp(1.0);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_float_equal(w[0], exp(2.0) / z, 1e-6);
    assert_float_equal(w[1], exp(1.0) / z, 1e-6);
    cpu_op_moe_route(logits, 1, 4, 2, 1, ids, w);
    assert_float_equal(w[0], exp(2.0) / (exp(2.0) + exp(1.0)), 1e-6);
    assert_float_equal(w[0] + w[1], 1.0, 1e-6);
}

/* Attention over one sequence of 3 positions, by hand: 1 head of 2 dims. */
static void test_attention_by_hand(void **s) {
    (void)s;
    float k[3][2] = {{1, 0}, {0, 1}, {1, 1}}, v[3][2] = {{1, 2}, {3, 4}, {5, 6}};
    kv_layer kv = {.k = k, .v = v, .type = DTYPE_F32};
    float q[2] = {1, 2}, out[2];
    int32_t pos = 2, seq = 0, start = 0, table = 0;
    attention_batch ab = {.n_tokens = 1, .positions = &pos, .seq_of_token = &seq,
                          .block_table_start = &start, .block_tables = &table, .block_size = 4,
                          .n_heads = 1, .n_kv_heads = 1, .head_dim = 2, .scale = 0.5f};
    cpu_op_attention(q, &kv, &ab, out, 0, 1);
    double sc[3] = {0.5, 1.0, 1.5}, z = exp(0.5) + exp(1.0) + exp(1.5);
    double o0 = (exp(sc[0]) * 1 + exp(sc[1]) * 3 + exp(sc[2]) * 5) / z;
    assert_float_equal(out[0], o0, 1e-5);
    pos = 0; /* causal: only position 0 */
    cpu_op_attention(q, &kv, &ab, out, 0, 1);
    assert_float_equal(out[0], 1, 1e-6);
    assert_float_equal(out[1], 2, 1e-6);
}

/* gpt-oss: a sliding window keeps the last `window` positions; a sink is one more logit in the
 * softmax with a zero value row, so the weights sum to less than 1. A sink far above the scores
 * (exp would overflow without rescaling) takes all the weight. */
static void test_attention_sink_and_window_by_hand(void **s) {
    (void)s;
    float k[3][2] = {{1, 0}, {0, 1}, {1, 1}}, v[3][2] = {{1, 2}, {3, 4}, {5, 6}};
    kv_layer kv = {.k = k, .v = v, .type = DTYPE_F32};
    float q[2] = {1, 2}, out[2], sink = 0.25f;
    int32_t pos = 2, seq = 0, start = 0, table = 0;
    attention_batch ab = {.n_tokens = 1, .positions = &pos, .seq_of_token = &seq,
                          .block_table_start = &start, .block_tables = &table, .block_size = 4,
                          .n_heads = 1, .n_kv_heads = 1, .head_dim = 2, .scale = 0.5f, .window = 2};
    cpu_op_attention(q, &kv, &ab, out, 0, 1); /* positions 1 and 2 only */
    double z = exp(1.0) + exp(1.5);
    assert_float_equal(out[0], (exp(1.0) * 3 + exp(1.5) * 5) / z, 1e-5);
    ab.sinks = &sink;
    cpu_op_attention(q, &kv, &ab, out, 0, 1);
    z += exp(0.25);
    assert_float_equal(out[1], (exp(1.0) * 4 + exp(1.5) * 6) / z, 1e-5);
    sink = 200.0f;
    cpu_op_attention(q, &kv, &ab, out, 0, 1);
    assert_float_equal(out[0], 0, 1e-6);
    assert_false(isnan(out[1]));
}

/* gpt-oss experts: gate clamped above at the limit, up clamped both ways, biases first */
static void test_clamped_swiglu(void **s) {
    (void)s;
    float gate[3] = {0.5f, 9.0f, -2.0f}, up[3] = {1.0f, -9.0f, 0.5f}, gb[3] = {0.5f, 0, 0}, ub[3] = {0, 0, 1};
    cpu_op_clamped_swiglu(gate, up, gb, ub, 1, 3, 7.0f, 1.702f);
    assert_float_equal(gate[0], (1.0 + 1) * (1.0 / (1 + exp(-1.702))), 1e-5);
    assert_float_equal(gate[1], (-7.0 + 1) * (7.0 / (1 + exp(-7 * 1.702))), 1e-4);
    assert_float_equal(gate[2], (1.5 + 1) * (-2.0 / (1 + exp(2 * 1.702))), 1e-5);
}

/* n random values in [0, scale) stored as type t. */
static void *random_values(dtype t, int64_t n, float scale) {
    void *p = malloc(dtype_size(t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        float v = frand() * scale;
        if (t == DTYPE_F32) ((float *)p)[i] = v;
        else if (t == DTYPE_F16) ((uint16_t *)p)[i] = f32_to_f16(v);
        else ((uint16_t *)p)[i] = f32_to_bf16(v);
    }
    return p;
}

/* A KV cache of n values per side: K in [0, k_scale), V in [0, 1). */
static kv_layer random_cache(dtype t, int64_t n, float k_scale) {
    kv_layer kv = {.type = t};
    kv.k = random_values(t, n, k_scale);
    kv.v = random_values(t, n, 1.0f);
    return kv;
}

static void test_fast_attention_matches_reference(void **s) {
    (void)s;
    const int bs = 16, n_blocks = 12;
    struct { int nh, nkv, hd; } shapes[] = {{4, 2, 16}, {8, 8, 32}, {32, 8, 64}, {16, 1, 128}};
    dtype types[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (int ti = 0; ti < 3; ti++) {
            int nh = shapes[si].nh, nkv = shapes[si].nkv, hd = shapes[si].hd;
            int64_t kvd = (int64_t)nkv * hd, slots = (int64_t)n_blocks * bs;
            kv_layer kv = random_cache(types[ti], slots * kvd, 2);
            /* two sequences with scattered blocks; tokens at several positions */
            int32_t tables[12] = {5, 2, 9, 0, 11, 1, 3, 7, 4, 6, 8, 10}, starts[2] = {0, 6};
            int32_t pos[5] = {0, 17, 95, 3, 50}, seq[5] = {0, 0, 0, 1, 1};
            float *q = malloc(sizeof(float) * 5 * nh * hd), *o1 = malloc(sizeof(float) * 5 * nh * hd),
                  *o2 = malloc(sizeof(float) * 5 * nh * hd), sinks[32];
            for (int i = 0; i < 5 * nh * hd; i++) q[i] = frand();
            for (int i = 0; i < nh; i++) sinks[i] = 4 * frand() - 2;
            for (int variant = 0; variant < 3; variant++) { /* plain; gpt-oss sinks + window; sinks */
                attention_batch ab = {.n_tokens = 5, .positions = pos, .seq_of_token = seq,
                                      .block_table_start = starts, .block_tables = tables,
                                      .block_size = bs, .n_heads = nh, .n_kv_heads = nkv,
                                      .head_dim = hd, .scale = 1.0f / sqrtf((float)hd),
                                      .window = variant == 1 ? 20 : 0, .sinks = variant ? sinks : NULL};
                cpu_op_attention(q, &kv, &ab, o1, 0, 5 * nh);
                if (cpu_op_attention_fast_ok(&ab)) {
                    cpu_op_attention_grouped(q, &kv, &ab, o2, 0, 5 * nkv);
                    for (int i = 0; i < 5 * nh * hd; i++) assert_float_equal(o1[i], o2[i], 1e-5);
                }
                assert_false(variant && cpu_op_attention_avx512_ok(&ab)); /* gpt-oss: not on that path */
            }
            free(kv.k);
            free(kv.v);
            free(q);
            free(o1);
            free(o2);
        }
    }
}

/* The AVX-512 blocked path against the reference: prefill-like runs of one sequence (tiles of
 * 16 tokens and a partial one, positions crossing cache blocks in a scattered block table),
 * decode-like single tokens of other sequences, every KV dtype and GQA shape. And a token's
 * result does not depend on its tile: computed alone it is bit for bit the same (batching and
 * chunking cannot change outputs). */
static void test_avx512_attention_matches_reference(void **s) {
    (void)s;
    const int bs = 16, n_blocks = 12;
    struct { int nh, nkv, hd; } shapes[] = {{4, 2, 16}, {8, 8, 32}, {32, 8, 64}, {16, 1, 128}, {6, 3, 48}};
    dtype types[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    enum { NT = 45 };
    int32_t pos[NT], seq[NT];
    for (int i = 0; i < 40; i++) pos[i] = 70 + i, seq[i] = 0; /* a 40-token chunk at 70..109 */
    /* then single tokens, sequences interleaved, positions not in order */
    int32_t extra_pos[5] = {0, 79, 15, 16, 3}, extra_seq[5] = {1, 1, 0, 1, 1};
    for (int i = 0; i < 5; i++) pos[40 + i] = extra_pos[i], seq[40 + i] = extra_seq[i];
    int checked = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (int ti = 0; ti < 3; ti++) {
            int nh = shapes[si].nh, nkv = shapes[si].nkv, hd = shapes[si].hd;
            int64_t kvd = (int64_t)nkv * hd, slots = (int64_t)n_blocks * bs;
            kv_layer kv = random_cache(types[ti], slots * kvd, 3);
            /* seq 0: blocks 5 2 9 0 11 1 10 (112 positions), seq 1: 3 7 4 6 8 (80) */
            int32_t tables[12] = {5, 2, 9, 0, 11, 1, 10, 3, 7, 4, 6, 8}, starts[2] = {0, 7};
            size_t qn = (size_t)NT * nh * hd;
            float *q = malloc(sizeof(float) * qn), *o1 = malloc(sizeof(float) * qn),
                  *o2 = malloc(sizeof(float) * qn), *o3 = malloc(sizeof(float) * nh * hd);
            for (size_t i = 0; i < qn; i++) q[i] = frand();
            attention_batch ab = {.n_tokens = NT, .positions = pos, .seq_of_token = seq,
                                  .block_table_start = starts, .block_tables = tables,
                                  .block_size = bs, .n_heads = nh, .n_kv_heads = nkv,
                                  .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
            cpu_op_attention(q, &kv, &ab, o1, 0, (int64_t)NT * nh);
            if (cpu_op_attention_avx512_ok(&ab)) {
                int32_t tiles[NT + 1];
                int64_t n_tiles = cpu_op_attention_tiles(&ab, tiles);
                assert_int_equal(n_tiles, 6); /* 16 + 16 + 8 of seq 0, then 2, 1, 2 */
                float *scratch = aligned_alloc(64, (cpu_op_attention_avx512_scratch(&ab) + 63) & ~(size_t)63);
                cpu_op_attention_avx512(q, &kv, &ab, tiles, o2, 0, n_tiles * nkv, scratch);
                for (size_t i = 0; i < qn; i++) assert_float_equal(o1[i], o2[i], 1e-5);
                for (int t = 0; t < NT; t += 7) { /* the same token alone: identical bits */
                    attention_batch one = ab;
                    one.n_tokens = 1;
                    one.positions = &pos[t];
                    one.seq_of_token = &seq[t];
                    int32_t one_starts[1] = {starts[seq[t]]}, one_seq = 0, one_tiles[2];
                    one.block_table_start = one_starts;
                    one.seq_of_token = &one_seq;
                    assert_int_equal(cpu_op_attention_tiles(&one, one_tiles), 1);
                    cpu_op_attention_avx512(q + (size_t)t * nh * hd, &kv, &one, one_tiles, o3, 0,
                                            nkv, scratch);
                    assert_memory_equal(o3, o2 + (size_t)t * nh * hd, sizeof(float) * nh * hd);
                }
                free(scratch);
                checked++;
            }
            free(kv.k);
            free(kv.v);
            free(q);
            free(o1);
            free(o2);
            free(o3);
        }
    }
    /* every shape ran where the CPU has AVX-512; none can run without it */
    int have = cpu_op_attention_avx512_ok(&(attention_batch){.n_heads = 4, .n_kv_heads = 2, .head_dim = 16});
    assert_int_equal(checked, have ? 15 : 0);
}

static void test_kv_write_f16(void **s) {
    (void)s;
    uint16_t k[4 * 2], v[4 * 2];
    kv_layer kv = {.k = k, .v = v, .type = DTYPE_F16};
    float ks[4] = {1.5f, -2, 0.25f, 1000}, vs[4] = {3, 4, 5, 6};
    int32_t slots[2] = {3, 1};
    cpu_op_kv_write(&kv, ks, vs, slots, 2, 2);
    assert_float_equal(f16_to_f32(k[3 * 2 + 0]), 1.5f, 0);
    assert_float_equal(f16_to_f32(k[3 * 2 + 1]), -2, 0);
    assert_float_equal(f16_to_f32(k[1 * 2 + 1]), 1000, 0);
    assert_float_equal(f16_to_f32(v[1 * 2 + 0]), 5, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),           cmocka_unit_test(test_rope_rotate_half),
        cmocka_unit_test(test_silu_and_route),    cmocka_unit_test(test_attention_by_hand),
        cmocka_unit_test(test_attention_sink_and_window_by_hand), cmocka_unit_test(test_clamped_swiglu),
        cmocka_unit_test(test_fast_attention_matches_reference),
        cmocka_unit_test(test_avx512_attention_matches_reference),
        cmocka_unit_test(test_kv_write_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
