/* Placement: layer splits proportional to memory (by speed beside a GPU node), tensor
 * divisibility, KV cache counted, clear reasons when a model does not fit. */
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

/* An H200-like GPU node: gib GiB free on the GPU, 4800 GB/s; 64 GiB of host memory. */
static placement_node gpu_node(const char *name, double gib) {
    placement_node n = {.memory_available = 64ull << 30,
                        .gpu_memory_available = (uint64_t)(gib * (double)(1ull << 30)),
                        .bandwidth_gbs = 4800};
    snprintf(n.id, sizeof n.id, "%s", name);
    return n;
}

static placement_node cpu_node(const char *name, int gib, double gbs) {
    placement_node n = {.memory_available = (uint64_t)gib << 30, .bandwidth_gbs = gbs};
    snprintf(n.id, sizeof n.id, "%s", name);
    return n;
}

/* An 8B-shaped bf16 model: 32 layers, 16 GB, 4096 tokens of KV (512 MiB). */
static placement_model llama_8b(void) {
    placement_model m = {.n_layers = 32, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
                         .weight_bytes = 16000000000ull, .context_length = 4096};
    strcpy(m.model_id, "meta-llama/Llama-3.1-8B");
    return m;
}

static int layers_of(const placement_result *r, const char *id) {
    for (int i = 0; i < r->n_nodes; i++)
        if (!strcmp(r->node_ids[i], id)) return r->layer_end[i] - r->layer_start[i];
    return -1;
}

/* A CPU node beside a GPU node: layers by bandwidth, not host memory. The GPU stage at 4800
 * GB/s would need 96 layers before it is as slow as one layer at 100 GB/s, so the CPU keeps the
 * one layer every node gets; the GPU's memory (141 GiB) is what is counted, not its host's. */
static void test_gpu_node_takes_layers_by_bandwidth(void **state) {
    (void)state;
    placement_model m = llama_8b();
    placement_node n[2] = {cpu_node("cpu", 100, 100), gpu_node("gpu", 141)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 2, PLACEMENT_PIPELINE, 2, &r), 0);
    assert_int_equal(layers_of(&r, "gpu"), 31);
    assert_int_equal(layers_of(&r, "cpu"), 1);
    /* the GPU, though first by memory, takes the last stage (the lm_head, sampling) */
    assert_string_equal(r.node_ids[1], "gpu");
    assert_int_equal(r.layer_start[0], 0);
    assert_int_equal(r.layer_end[0], 1);
    assert_int_equal(r.layer_end[1], 32);
    /* (by host memory, the old rule, the CPU node's 100 GiB against the GPU node's 64: 19) */
    /* a slower GPU against a faster CPU: 900 vs 300 GB/s -> 3:1, 24 and 8 */
    n[1].bandwidth_gbs = 900;
    n[0].bandwidth_gbs = 300;
    assert_int_equal(placement_place(&m, n, 2, PLACEMENT_PIPELINE, 2, &r), 0);
    assert_int_equal(layers_of(&r, "gpu"), 24);
    assert_int_equal(layers_of(&r, "cpu"), 8);
    /* a 1-node placement on the GPU node fits in its GPU memory */
    placement_node g[1] = {gpu_node("gpu", 141)};
    assert_int_equal(placement_place(&m, g, 1, PLACEMENT_PIPELINE, 1, &r), 0);
}

/* GPU memory too small for the model: the GPU takes as many layers as fit (weights + KV per
 * layer, after the headroom), the CPU the rest; too small for even its share: a clear error. */
static void test_gpu_memory_too_small(void **state) {
    (void)state;
    placement_model m = llama_8b();
    placement_node n[2] = {gpu_node("gpu", 8), cpu_node("cpu", 64, 100)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 1, PLACEMENT_PIPELINE, 1, &r), -1); /* 16 GB alone */
    assert_non_null(strstr(r.error, "on its GPU"));
    assert_int_equal(placement_place(&m, n, 2, PLACEMENT_PIPELINE, 2, &r), 0);
    /* (8 GiB - 256 MiB) / ((16e9 + 512 MiB) / 32 = 516.8 MB) = 16.1 -> 16 layers */
    assert_int_equal(layers_of(&r, "gpu"), 16);
    assert_int_equal(layers_of(&r, "cpu"), 16);
    for (int i = 0; i < 2; i++) {
        const placement_node *node = !strcmp(r.node_ids[i], "gpu") ? &n[0] : &n[1];
        uint64_t have = node->gpu_memory_available ? node->gpu_memory_available
                                                   : node->memory_available;
        assert_true(r.memory_by_node[i] <= have);
    }
    /* both too small: the split still goes by speed, and the error names the short node */
    n[1].memory_available = 4ull << 30;
    assert_int_equal(placement_place(&m, n, 2, PLACEMENT_PIPELINE, 2, &r), -1);
    assert_non_null(strstr(r.error, "does not fit"));
}

/* Where the model runs on CPUs anyway (tensor parallelism), a GPU node counts its host memory;
 * and without every bandwidth known, memory decides as before. */
static void test_gpu_ignored_where_cpus_compute(void **state) {
    (void)state;
    placement_model m = llama_8b();
    placement_node n[2] = {gpu_node("gpu", 8), cpu_node("cpu", 64, 100)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 2, PLACEMENT_TENSOR, 2, &r), 0); /* 64 GiB hosts */
    n[1].bandwidth_gbs = 0; /* the CPU's bandwidth not measured (yet) */
    n[0].gpu_memory_available = 64ull << 30;
    assert_int_equal(placement_place(&m, n, 2, PLACEMENT_PIPELINE, 2, &r), 0);
    assert_int_equal(layers_of(&r, "gpu"), 16); /* 64:64 GiB, GPU and host */
}

/* Two CPU nodes: their bandwidths are not weighed; the split is by memory as before. */
static void test_cpu_nodes_split_by_memory(void **state) {
    (void)state;
    placement_model m = llama_1b();
    placement_node n[3] = {cpu_node("small", 2, 300), cpu_node("big", 6, 20),
                           cpu_node("mid", 4, 50)};
    placement_result r;
    assert_int_equal(placement_place(&m, n, 3, PLACEMENT_PIPELINE, 2, &r), 0);
    assert_string_equal(r.node_ids[0], "big");
    assert_int_equal(r.layer_end[0] - r.layer_start[0], 10);
    assert_int_equal(r.layer_end[1] - r.layer_start[1], 6);
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
        cmocka_unit_test(test_gpu_node_takes_layers_by_bandwidth),
        cmocka_unit_test(test_gpu_memory_too_small),
        cmocka_unit_test(test_gpu_ignored_where_cpus_compute),
        cmocka_unit_test(test_cpu_nodes_split_by_memory),
    };
    return cmocka_run_group_tests_name("placement", tests, NULL, NULL);
}
