/* gpt-oss loading: config.json as gpt-oss publishes it (layer_types, sliding_window,
 * swiglu_limit, YaRN without truncation, MXFP4 quantization_config), the experts read from the
 * fused tensors (gate and up de-interleaved; bf16 transposed; MXFP4 re-expressed as MLX 8-bit
 * exactly), and the refusals: bad layer_types, tensor parallel, a backend without the ops.
 * The forward pass against transformers is in test_engine_reference (gpt-oss-tiny fixtures).
 * Models come from $EXO_BUILD/tools/mkmodel. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "arch/transformer.h"
#include "base/paths.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"

static char dir[256];

static void make_model(const char *name, const char *args) {
    const char *build = getenv("EXO_BUILD");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/tools/mkmodel --out %s/%s --arch gpt_oss --tokenizer none --vocab 300 --seed 9 %s",
             build && *build ? build : "build", dir, name, args);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/exo-test-gpt-oss-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    make_model("bf16", "");
    make_model("mxfp4", "--mxfp4");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void load(const char *name, model_config *c, safetensors_set **st, model_weights *w) {
    char path[300], err[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (model_config_load(path, c, err, sizeof err)) fail_msg("%s", err);
    *st = safetensors_set_open(path, err, sizeof err);
    if (!*st) fail_msg("%s", err);
    if (model_weights_load(*st, c, 0, 0, w, err, sizeof err)) fail_msg("%s", err);
}

static void test_config(void **state) {
    (void)state;
    model_config c;
    char path[300], err[512];
    snprintf(path, sizeof path, "%s/bf16", dir);
    assert_int_equal(model_config_load(path, &c, err, sizeof err), 0);
    assert_int_equal(c.family, MODEL_FAMILY_GPT_OSS);
    assert_true(c.attention_bias && c.attention_sinks && c.moe_bias);
    assert_int_equal(model_config_layer_window(&c, 0), 4); /* sliding_attention, window 4 */
    assert_int_equal(model_config_layer_window(&c, 1), 0); /* full_attention */
    assert_int_equal(c.n_experts, 8);
    assert_int_equal(c.n_experts_per_tok, 2);
    assert_int_equal(c.moe_intermediate_size, 64);
    assert_true(model_config_layer_is_moe(&c, 0) && model_config_layer_is_moe(&c, 1));
    assert_float_equal(c.swiglu_limit, 7.0, 1e-6);
    assert_float_equal(c.swiglu_alpha, 1.702, 1e-6);
    assert_int_equal(c.rope.type, ROPE_YARN);
    assert_int_equal(c.rope.truncate, 0);
    assert_int_equal(c.rope.original_max_position, 4096);
    assert_int_equal(model_config_tensor_split_check(&c, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "gpt-oss"));
}

static void test_config_errors(void **state) {
    (void)state;
    model_config c;
    char err[512];
    const char *base = "{\"architectures\":[\"GptOssForCausalLM\"],\"vocab_size\":300,\"hidden_size\":64,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
                       "\"num_local_experts\":8,\"num_experts_per_tok\":2,\"intermediate_size\":64,\"sliding_window\":4,";
    char text[1024];
    snprintf(text, sizeof text, "%s\"layer_types\":[\"sliding_attention\"]}", base);
    assert_int_equal(model_config_parse(text, strlen(text), &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "layer_types"));
    snprintf(text, sizeof text, "%s\"layer_types\":[\"sliding_attention\",\"local\"]}", base);
    assert_int_equal(model_config_parse(text, strlen(text), &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "layer_types entry 1"));
    /* no layer_types: transformers' default, even layers slide */
    snprintf(text, sizeof text, "%s\"experts_per_token\":2}", base);
    assert_int_equal(model_config_parse(text, strlen(text), &c, err, sizeof err), 0);
    assert_int_equal(model_config_layer_window(&c, 0), 4);
    assert_int_equal(model_config_layer_window(&c, 1), 0);
    assert_float_equal(c.swiglu_limit, 7.0, 1e-6);
}

static float e2m1(int nibble) {
    static const float v[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    return nibble & 8 ? -v[nibble & 7] : v[nibble & 7];
}

/* gate row j of expert e is row 2j of the published gate_up (up: 2j + 1), bit for bit: bf16
 * transposed from [E, in, out]; MXFP4 as E2M1 * 2^(scale - 127) */
static void test_experts(void **state) {
    (void)state;
    model_config c;
    safetensors_set *st[2];
    model_weights w[2];
    load("bf16", &c, &st[0], &w[0]);
    load("mxfp4", &c, &st[1], &w[1]);
    const safetensors_tensor *gu = safetensors_set_find(st[0], "model.layers.1.mlp.experts.gate_up_proj");
    const safetensors_tensor *blocks = safetensors_set_find(st[1], "model.layers.1.mlp.experts.gate_up_proj_blocks");
    const safetensors_tensor *scales = safetensors_set_find(st[1], "model.layers.1.mlp.experts.gate_up_proj_scales");
    assert_non_null(gu);
    assert_non_null(blocks);
    assert_non_null(scales);
    int64_t dim = 64, inter = 64;
    float row[64];
    for (int e = 0; e < 8; e += 7)
        for (int64_t j = 0; j < inter; j += 9)
            for (int up = 0; up < 2; up++) {
                const layer_weights *l0 = &w[0].layers[1], *l1 = &w[1].layers[1];
                int64_t src = 2 * j + up;
                weight_matrix_row_to_f32(up ? &l0->expert_up[e] : &l0->expert_gate[e], j, row);
                for (int64_t d = 0; d < dim; d++) {
                    uint16_t raw = ((const uint16_t *)gu->data)[(e * dim + d) * 2 * inter + src];
                    assert_float_equal(row[d], bf16_to_f32(raw), 0);
                }
                const weight_matrix *m = up ? &l1->expert_up[e] : &l1->expert_gate[e];
                assert_int_equal(m->format, WEIGHT_MLX_AFFINE);
                assert_int_equal(m->bits, 8);
                weight_matrix_row_to_f32(m, j, row);
                for (int64_t d = 0; d < dim; d++) {
                    const uint8_t *b = (const uint8_t *)blocks->data + (e * 2 * inter + src) * (dim / 2);
                    uint8_t s = ((const uint8_t *)scales->data)[(e * 2 * inter + src) * (dim / 32) + d / 32];
                    int nib = d % 2 ? b[d / 2] >> 4 : b[d / 2] & 15;
                    assert_float_equal(row[d], ldexpf(e2m1(nib), s - 127), 0);
                }
            }
    /* biases de-interleaved the same way */
    const safetensors_tensor *gub = safetensors_set_find(st[0], "model.layers.1.mlp.experts.gate_up_proj_bias");
    weight_matrix_row_to_f32(&w[0].layers[1].expert_up_bias, 3, row);
    assert_float_equal(row[5], bf16_to_f32(((const uint16_t *)gub->data)[3 * 2 * inter + 11]), 0);
    for (int i = 0; i < 2; i++) {
        model_weights_free(&w[i]);
        safetensors_set_close(st[i]);
    }
}

/* a backend without attention sinks / windows / clamped experts refuses the model by name */
static void test_backend_without_features(void **state) {
    (void)state;
    model_config c;
    safetensors_set *st;
    model_weights w;
    load("bf16", &c, &st, &w);
    compute_backend *cpu = compute_backend_cpu(1);
    unsigned features = cpu->features;
    cpu->features = 0;
    char err[512] = "";
    transformer *t = transformer_create(&c, &w, cpu, 8, 1, err, sizeof err);
    assert_null(t);
    assert_non_null(strstr(err, "GptOssForCausalLM"));
    cpu->features = features;
    t = transformer_create(&c, &w, cpu, 8, 1, err, sizeof err);
    assert_non_null(t);
    transformer_destroy(t);
    cpu->destroy(cpu);
    model_weights_free(&w);
    safetensors_set_close(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_experts),
        cmocka_unit_test(test_backend_without_features),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
