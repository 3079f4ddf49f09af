/* Placement: layer splits proportional to memory, tensor divisibility, KV cache counted,
 * clear reasons when a model does not fit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cluster/placement.h"

#include <stdio.h>
#include <string.h>

/* A node with gib GiB free (no links measured). */
#define NODE(name, gib, files)                                                                     \
    { .id = name, .memory_available = (uint64_t)(gib) << 30, .has_files = files }

static placement_model llama_1b(void) {
    placement_model m = {.n_layers = 16, .n_heads = 32, .n_kv_heads = 8, .head_dim = 64,
                         .weight_bytes = 2500000000ull, .context_length = 4096};
    strcpy(m.model_id, "meta-llama/Llama-3.2-1B");
    return m;
}

static void test_single_node_fits(void **state) {
    (void)state;
    placement_model m = llama_1b();
    placement_node n[1] = {NODE("a", 8, 0)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 1, PLACEMENT_PIPELINE, 1, &r), 0);
    assert_int_equal(r.n_nodes, 1);
    assert_int_equal(r.layer_start[0], 0);
    assert_int_equal(r.layer_end[0], 16);
    /* weights + KV (2*16*8*64*2*4096 = 128 MiB) + headroom */
    assert_int_equal(r.memory_by_node[0], 2500000000ull + (128ull << 20) + PLACEMENT_HEADROOM_BYTES);
}

static void test_kv_cache_is_counted(void **state) {
    (void)state;
    placement_model m = llama_1b();
    m.context_length = 131072; /* 4 GiB of KV */
    placement_node n[1] = {NODE("a", 5, 0)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 1, PLACEMENT_PIPELINE, 1, &r), -1);
    assert_non_null(strstr(r.error, "KV cache"));
    assert_non_null(strstr(r.error, "131072"));
}

static void test_pipeline_split_proportional(void **state) {
    (void)state;
    placement_model m = llama_1b();
    placement_node n[3] = {NODE("small", 2, 0), NODE("big", 6, 0), NODE("mid", 4, 0)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 2, &r), 0);
    /* the two with most memory, biggest first: 6:4 of 16 layers -> 9.6 / 6.4 -> 10 / 6 */
    assert_string_equal(r.node_ids[0], "big");
    assert_string_equal(r.node_ids[1], "mid");
    assert_int_equal(r.layer_end[0] - r.layer_start[0], 10);
    assert_int_equal(r.layer_start[1], 10);
    assert_int_equal(r.layer_end[1], 16);
}

static void test_every_node_gets_a_layer(void **state) {
    (void)state;
    placement_model m = llama_1b();
    m.n_layers = 3;
    m.weight_bytes = 1000;
    m.context_length = 0;
    placement_node n[3] = {NODE("a", 100, 0), NODE("b", 1, 0), NODE("c", 1, 0)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 3, &r), 0);
    for (int i = 0; i < 3; i++) assert_int_equal(r.layer_end[i] - r.layer_start[i], 1);
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 4, &r), -1);
}

static void test_tensor_needs_divisible_heads(void **state) {
    (void)state;
    placement_model m = llama_1b();
    placement_node n[3] = {NODE("a", 8, 0), NODE("b", 8, 0), NODE("c", 8, 0)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_TENSOR, 2, &r), 0);
    assert_int_equal(r.layer_end[1], 16);
    assert_true(r.memory_by_node[0] < m.weight_bytes);
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_TENSOR, 3, &r), -1);
    assert_non_null(strstr(r.error, "divide"));
}

/* A node holding the files comes first, even with less free memory: no download before start. */
static void test_nodes_with_files_first(void **state) {
    (void)state;
    placement_model m = llama_1b();
    placement_node n[3] = {NODE("big", 64, 0), NODE("has", 8, 1), NODE("mid", 32, 0)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 1, &r), 0);
    assert_string_equal(r.node_ids[0], "has");
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 2, &r), 0);
    assert_string_equal(r.node_ids[0], "has");
    assert_string_equal(r.node_ids[1], "big");
}

/* With measured links, each next rank is the node with a fast link to the rank before it
 * (holding the files still comes first); unmeasured links keep the memory order; a link choice
 * that does not fit falls back to the memory order. */
static void test_fast_links_preferred(void **state) {
    (void)state;
    placement_model m = llama_1b();
    /* a: most memory; b: next, but 5 ms from a; c: least, 0.2 ms from a */
    placement_node n[3] = {NODE("a", 64, 0), NODE("b", 32, 0), NODE("c", 16, 0)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 2, &r), 0);
    assert_string_equal(r.node_ids[1], "b"); /* nothing measured: memory order */
    n[0].link_ms[1] = n[1].link_ms[0] = 5.0f;
    n[0].link_ms[2] = 0.2f; /* one direction measured is enough */
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 2, &r), 0);
    assert_string_equal(r.node_ids[0], "a");
    assert_string_equal(r.node_ids[1], "c");
    /* a chain: the third rank follows the second's links (c-b fast, a-b slow) */
    n[2].link_ms[1] = 0.3f;
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 3, &r), 0);
    assert_string_equal(r.node_ids[1], "c");
    assert_string_equal(r.node_ids[2], "b");
    /* files beat links */
    n[1].has_files = 1;
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 2, &r), 0);
    assert_string_equal(r.node_ids[0], "b");
    n[1].has_files = 0;
    /* c over the fast link cannot hold its share: the memory order (a, b) is placed instead */
    n[2].memory_available = 1ull << 30;
    n[0].memory_available = 2ull << 30;
    n[1].memory_available = 2ull << 30;
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 2, &r), 0);
    assert_string_equal(r.node_ids[1], "b");
}

/* The model's own split rules (FFN, experts, quantization groups) are asked for tensor only. */
static int refuse_three(const void *ctx, int n, char *err, size_t errlen) {
    (void)ctx;
    if (n != 3) return 0;
    snprintf(err, errlen, "down_proj's 96 columns are not whole groups of 64 for 3 ranks");
    return -1;
}

static void test_tensor_asks_the_model(void **state) {
    (void)state;
    placement_model m = llama_1b();
    m.n_heads = 48;
    m.n_kv_heads = 12;
    m.tensor_check = refuse_three;
    placement_node n[3] = {NODE("a", 8, 0), NODE("b", 8, 0), NODE("c", 8, 0)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_TENSOR, 2, &r), 0);
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_TENSOR, 3, &r), -1);
    assert_non_null(strstr(r.error, "whole groups"));
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 3, &r), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_node_fits),
        cmocka_unit_test(test_kv_cache_is_counted),
        cmocka_unit_test(test_pipeline_split_proportional),
        cmocka_unit_test(test_every_node_gets_a_layer),
        cmocka_unit_test(test_tensor_needs_divisible_heads),
        cmocka_unit_test(test_nodes_with_files_first),
        cmocka_unit_test(test_fast_links_preferred),
        cmocka_unit_test(test_tensor_asks_the_model),
    };
    return cmocka_run_group_tests_name("placement", tests, NULL, NULL);
}
