/* config.json parsing: real-shaped configs of every family parse to the right fields;
 * missing, mistyped and absurd fields are rejected with a message naming the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "arch/transformer.h"
#include "model/model_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *llama32 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"bos_token_id\": 128000,"
    " \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": 64, \"hidden_act\": \"silu\","
    " \"hidden_size\": 2048, \"intermediate_size\": 8192, \"max_position_embeddings\": 131072,"
    " \"mlp_bias\": false, \"num_attention_heads\": 32, \"num_hidden_layers\": 16,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0,"
    " \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\":"
    " 8192, \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": true,"
    " \"vocab_size\": 128256, \"quantization\": {\"group_size\": 64, \"bits\": 4}}";

static const char *qwen3moe =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"bos_token_id\": 151643,"
    " \"decoder_sparse_step\": 1, \"eos_token_id\": 151645, \"head_dim\": 128,"
    " \"hidden_size\": 2048, \"intermediate_size\": 6144, \"max_position_embeddings\": 40960,"
    " \"mlp_only_layers\": [0], \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 32, \"num_experts\": 128, \"num_experts_per_tok\": 8,"
    " \"num_hidden_layers\": 48, \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": null, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": false,"
    " \"vocab_size\": 151936}";

static void test_llama32(void **s) {
    (void)s;
    model_config c;
    char err[256];
    assert_int_equal(model_config_parse(llama32, strlen(llama32), &c, err, sizeof err), 0);
    assert_int_equal(c.family, MODEL_FAMILY_LLAMA);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.n_kv_heads, 8);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.rope.type, ROPE_LLAMA3);
    assert_int_equal(c.rope.original_max_position, 8192);
    assert_true(c.tie_word_embeddings);
    assert_int_equal(c.bos_id, 128000);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_ids[2], 128009);
    assert_int_equal(c.quant_bits, 4);
    assert_int_equal(c.quant_group_size, 64);
    assert_false(c.qk_norm);
    assert_int_equal(c.n_experts, 0);
}

static void test_qwen3_moe(void **s) {
    (void)s;
    model_config c;
    char err[256];
    assert_int_equal(model_config_parse(qwen3moe, strlen(qwen3moe), &c, err, sizeof err), 0);
    assert_int_equal(c.family, MODEL_FAMILY_QWEN3_MOE);
    assert_true(c.qk_norm);
    assert_int_equal(c.n_experts, 128);
    assert_int_equal(c.n_experts_per_tok, 8);
    assert_int_equal(c.moe_intermediate_size, 768);
    assert_true(c.norm_topk_prob);
    assert_false(model_config_layer_is_moe(&c, 0)); /* mlp_only_layers */
    assert_true(model_config_layer_is_moe(&c, 1));
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
}

/* Replaces the first `from` in base with `to` and expects an error containing `want`. */
static void expect_error(const char *base, const char *from, const char *to, const char *want) {
    char buf[4096];
    const char *p = strstr(base, from);
    assert_non_null(p);
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(p - base), base, to, p + strlen(from));
    model_config c;
    char err[256] = "";
    int rc = model_config_parse(buf, strlen(buf), &c, err, sizeof err);
    if (rc == 0 || !strstr(err, want))
        fprintf(stderr, "replacing '%s' by '%s': rc %d, err '%s' (want '%s')\n", from, to, rc, err,
                want);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, want));
}

static void test_rejects(void **s) {
    (void)s;
    expect_error(llama32, "\"hidden_size\": 2048,", "", "hidden_size");
    expect_error(llama32, "\"num_attention_heads\": 32", "\"num_attention_heads\": 0",
                 "num_attention_heads");
    expect_error(llama32, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 7",
                 "multiple");
    expect_error(llama32, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 64",
                 "num_key_value_heads");
    expect_error(llama32, "\"vocab_size\": 128256", "\"vocab_size\": 99999999999", "vocab_size");
    expect_error(llama32, "\"vocab_size\": 128256", "\"vocab_size\": \"big\"", "vocab_size");
    expect_error(llama32, "\"head_dim\": 64", "\"head_dim\": 63", "head_dim");
    /* found by fuzz_model_config: a head_dim derived from hidden_size / heads (no head_dim
     * field) was not range-checked */
    const char *derived = "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 1516, "
                          "\"hidden_size\": 6284, \"intermediate_size\": 128, "
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 2}";
    model_config c;
    char err[256] = "";
    assert_int_equal(model_config_parse(derived, strlen(derived), &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "head_dim"));
    expect_error(llama32, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1", "rms_norm_eps");
    expect_error(llama32, "LlamaForCausalLM", "GPT2LMHeadModel", "GPT2LMHeadModel");
    expect_error(llama32, "\"rope_type\": \"llama3\"", "\"rope_type\": \"dynamic\"", "dynamic");
    expect_error(llama32, "\"low_freq_factor\": 1.0,", "", "low_freq_factor");
    expect_error(llama32, "\"eos_token_id\": [128001", "\"eos_token_id\": [999999",
                 "eos_token_id");
    expect_error(llama32, "\"bits\": 4", "\"bits\": 7", "bits");
    expect_error(llama32, "\"group_size\": 64", "\"group_size\": 48", "group_size");
    expect_error(llama32, "\"silu\"", "\"gelu\"", "hidden_act");
    expect_error(llama32, "\"num_hidden_layers\": 16", "\"num_hidden_layers\": 1e9",
                 "num_hidden_layers");
    expect_error(llama32, "{", "[", "JSON");
    expect_error(qwen3moe, "\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 200",
                 "num_experts_per_tok");
    expect_error(qwen3moe, "\"num_experts\": 128,", "", "num_experts");
    expect_error(qwen3moe, "\"mlp_only_layers\": [0]", "\"mlp_only_layers\": [99]",
                 "mlp_only_layers");
}

/* llama3 rope: high frequencies untouched, low ones divided by factor, smooth in between. */
static void test_rope_llama3_frequencies(void **s) {
    (void)s;
    model_config c;
    char err[256];
    assert_int_equal(model_config_parse(llama32, strlen(llama32), &c, err, sizeof err), 0);
    float f[32], af;
    rope_inv_freq(&c.rope, 64, f, &af);
    assert_float_equal(af, 1.0, 0);
    assert_float_equal(f[0], 1.0, 1e-7); /* wavelength 2*pi: high frequency, unchanged */
    double plain31 = 1.0 / pow(500000.0, 62.0 / 64.0);
    assert_float_equal(f[31], plain31 / 32.0, plain31 * 1e-5); /* long wavelength: / factor */
    for (int i = 1; i < 32; i++) assert_true(f[i] < f[i - 1]);
    /* linear and yarn */
    c.rope.type = ROPE_LINEAR;
    c.rope.factor = 4;
    rope_inv_freq(&c.rope, 64, f, &af);
    assert_float_equal(f[0], 0.25, 1e-7);
    c.rope.type = ROPE_YARN;
    c.rope.beta_fast = 32;
    c.rope.beta_slow = 1;
    c.rope.attention_factor = 0;
    c.rope.original_max_position = 8192;
    rope_inv_freq(&c.rope, 64, f, &af);
    assert_float_equal(af, 0.1 * log(4.0) + 1.0, 1e-6);
    assert_float_equal(f[0], 1.0, 1e-7);                   /* extrapolated */
    assert_float_equal(f[31], plain31 / 4.0, plain31 * 1e-5); /* interpolated */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama32),
        cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_rope_llama3_frequencies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
