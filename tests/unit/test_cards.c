/* Model cards: the built-in catalog parses and says what users rely on (layers, sizes,
 * capabilities, sampling defaults); bad cards fail with a useful message; custom cards are
 * built from config.json, written, reloaded and removed. Runs from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/cards.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_builtin_catalog(void **state) {
    (void)state;
    card_catalog cat;
    assert_int_equal(card_catalog_load(&cat, "resources/cards", NULL), 0);
    /* every .toml file in the directory must have loaded (none skipped as malformed) */
    DIR *d = opendir("resources/cards");
    assert_non_null(d);
    size_t files = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".toml")) files++;
    closedir(d);
    assert_int_equal(cat.n, files);
    assert_true(cat.n >= 20);

    const model_card *c = card_catalog_find(&cat, "mlx-community/Llama-3.2-1B-Instruct-4bit");
    assert_non_null(c);
    assert_int_equal(c->n_layers, 16);
    assert_int_equal(c->hidden_size, 2048);
    assert_int_equal(c->num_key_value_heads, 8);
    assert_int_equal(c->storage_bytes, 729808896);
    assert_int_equal(c->context_length, 131072);
    assert_string_equal(c->family, "llama");
    assert_true(c->sampling.has & CARD_SAMPLING_TEMPERATURE);
    assert_true(fabs(c->sampling.temperature - 0.6) < 1e-9);
    assert_false(c->is_custom);

    c = card_catalog_find(&cat, "mlx-community/Qwen3-30B-A3B-4bit");
    assert_non_null(c);
    assert_int_equal(c->n_layers, 48);
    assert_int_equal(c->num_key_value_heads, 4);
    assert_true(card_has_capability(c, "thinking_toggle"));
    assert_int_equal(c->sampling.top_k, 20);
    assert_true(fabs(c->sampling_non_thinking.temperature - 0.7) < 1e-9);

    /* the families the catalog must cover */
    const char *need[] = {"mlx-community/Llama-3.2-3B-Instruct-4bit",
                          "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
                          "mlx-community/Meta-Llama-3.1-70B-Instruct-4bit",
                          "mlx-community/Qwen3-0.6B-4bit", "mlx-community/Qwen3-32B-4bit",
                          "mlx-community/Qwen3-235B-A22B-Instruct-2507-4bit",
                          "mlx-community/Qwen3.5-397B-A17B-4bit", "mlx-community/Qwen3.5-9B-4bit",
                          "mlx-community/gpt-oss-20b-MXFP4-Q8", "mlx-community/gpt-oss-120b-MXFP4-Q8",
                          "mlx-community/DeepSeek-V3.1-4bit"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        c = card_catalog_find(&cat, need[i]);
        if (!c) fail_msg("catalog lacks %s", need[i]);
        /* sanity: a card's size must be plausible for its width and depth */
        assert_true(c->storage_bytes > (uint64_t)c->n_layers * (uint64_t)c->hidden_size);
    }
    json_t *j = card_to_json(card_catalog_find(&cat, "mlx-community/gpt-oss-20b-MXFP4-Q8"));
    assert_string_equal(json_string_value(json_object_get(j, "id")), "mlx-community/gpt-oss-20b-MXFP4-Q8");
    assert_string_equal(json_string_value(json_object_get(j, "owned_by")), "exo");
    assert_string_equal(json_string_value(json_object_get(j, "family")), "gpt-oss");
    assert_int_equal(json_integer_value(json_object_get(j, "storage_size_megabytes")),
                     12025908224ULL / (1024 * 1024));
    assert_true(json_is_false(json_object_get(j, "is_custom")));
    assert_true(json_is_array(json_object_get(j, "capabilities")));
    json_decref(j);
    card_catalog_free(&cat);
}

static void test_bad_cards(void **state) {
    (void)state;
    model_card c;
    char err[256];
    const char *no_layers = "model_id = \"a/b\"\nhidden_size = 1\n[storage_size]\nin_bytes = 1\n";
    assert_int_equal(card_parse(no_layers, strlen(no_layers), &c, err, sizeof err), -1);
    assert_string_equal(err, "field 'n_layers': missing (required)");
    const char *neg = "model_id = \"a/b\"\nn_layers = -1\nhidden_size = 1\n";
    assert_int_equal(card_parse(neg, strlen(neg), &c, err, sizeof err), -1);
    assert_string_equal(err, "field 'n_layers': expected a positive integer");
    const char *trav = "model_id = \"../../etc\"\nn_layers = 1\nhidden_size = 1\n";
    assert_int_equal(card_parse(trav, strlen(trav), &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "field 'model_id'"));
    const char *syntax = "model_id = \"a/b\"\nn_layers = = 1\n";
    assert_int_equal(card_parse(syntax, strlen(syntax), &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "line 2:"));
    const char *temp = "model_id = \"a/b\"\nn_layers = 1\nhidden_size = 1\n[storage_size]\n"
                       "in_bytes = 1\n[sampling_defaults]\ntemperature = \"hot\"\n";
    assert_int_equal(card_parse(temp, strlen(temp), &c, err, sizeof err), -1);
    assert_string_equal(err, "field 'sampling_defaults.temperature': expected a number");
}

static void test_custom_cards(void **state) {
    (void)state;
    char dir[256], cmd[300], err[256];
    snprintf(dir, sizeof dir, "/tmp/exo-test-cards-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    const char *config = "{\"model_type\":\"qwen3\",\"num_hidden_layers\":4,\"hidden_size\":64,"
                         "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                         "\"max_position_embeddings\":4096,\"torch_dtype\":\"bfloat16\"}";
    model_card c;
    assert_int_equal(card_from_hf_config("someone/tiny-qwen", config, 123456, &c, err, sizeof err), 0);
    assert_int_equal(c.n_layers, 4);
    assert_int_equal(c.num_key_value_heads, 2);
    assert_int_equal(c.context_length, 4096);
    assert_string_equal(c.family, "qwen");
    assert_string_equal(c.quantization, "bf16");
    assert_true(c.supports_tensor);
    assert_true(c.is_custom);
    assert_int_equal(card_from_hf_config("someone/x", "{\"hidden_size\":3}", 1, &c, err, sizeof err), -1);
    assert_string_equal(err, "config.json has no num_hidden_layers");
    assert_int_equal(card_from_hf_config("someone/x", "not json", 1, &c, err, sizeof err), -1);
    assert_int_equal(card_from_hf_config("../x", config, 1, &c, err, sizeof err), -1);

    /* add -> file written -> a fresh catalog sees it as custom -> remove */
    card_catalog cat;
    assert_int_equal(card_catalog_load(&cat, "resources/cards", dir), 0);
    size_t builtin = cat.n;
    assert_int_equal(card_from_hf_config("someone/tiny-qwen", config, 123456, &c, err, sizeof err), 0);
    c.sampling.has = CARD_SAMPLING_TEMPERATURE | CARD_SAMPLING_TOP_K;
    c.sampling.temperature = 0.25;
    c.sampling.top_k = 7;
    assert_int_equal(card_catalog_add_custom(&cat, &c, err, sizeof err), 0);
    card_catalog_free(&cat);
    assert_int_equal(card_catalog_load(&cat, "resources/cards", dir), 0);
    assert_int_equal(cat.n, builtin + 1);
    const model_card *got = card_catalog_find(&cat, "someone/tiny-qwen");
    assert_non_null(got);
    assert_true(got->is_custom);
    assert_int_equal(got->storage_bytes, 123456);
    assert_int_equal(got->sampling.top_k, 7);
    assert_true(got->sampling.temperature == 0.25);
    /* a built-in card cannot be shadowed or removed as custom */
    model_card fake = *got;
    strcpy(fake.model_id, "mlx-community/Qwen3-0.6B-4bit");
    assert_int_equal(card_catalog_add_custom(&cat, &fake, err, sizeof err), -1);
    assert_int_equal(card_catalog_remove_custom(&cat, "mlx-community/Qwen3-0.6B-4bit", err, sizeof err), 1);
    assert_int_equal(card_catalog_remove_custom(&cat, "someone/tiny-qwen", err, sizeof err), 0);
    assert_int_equal(card_catalog_remove_custom(&cat, "someone/tiny-qwen", err, sizeof err), 1);
    card_catalog_free(&cat);
    assert_int_equal(card_catalog_load(&cat, "resources/cards", dir), 0);
    assert_int_equal(cat.n, builtin);
    card_catalog_free(&cat);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtin_catalog),
        cmocka_unit_test(test_bad_cards),
        cmocka_unit_test(test_custom_cards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
