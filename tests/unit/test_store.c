/* Model store: id safety (no path traversal), where models live, when a model is complete,
 * read-only search paths, listing and deleting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/paths.h"
#include "model/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void write_file(const char *dir, const char *rel, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    char *slash = strrchr(path, '/');
    *slash = 0;
    assert_int_equal(paths_mkdir_p(path), 0);
    *slash = '/';
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/exo-test-store-%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) return -1;
    return paths_mkdir_p(root);
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_id_validation(void **state) {
    (void)state;
    char err[256];
    const char *good[] = {"mlx-community/Llama-3.2-1B-Instruct-4bit", "Qwen/Qwen3-0.6B", "gpt2",
                          "org_1/a.b_c-d", "org/repo-GGUF:Q4_K_M", "llama3.2:1b", "a/b:x.y-z_1"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_int_equal(store_id_valid(good[i], err, sizeof err), 0);
    const char *bad[] = {"",          "../etc/passwd", "org/..",     "/abs/path", "org/a/b",
                         "org/",      "/name",         "org//name",  "org/na me", "org/n\\m",
                         "a--b/c",    "org/.hidden",   "org/-rf",    "org/a..b",  "org/名前",
                         "org/x\n",   "org/repo:",     "org:tag/x",  "org/a:b:c", "org/a:.b",
                         "org/a:-b",  "org/a:b c",     ":tag",       "org/..:x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        assert_int_equal(store_id_valid(bad[i], err, sizeof err), -1);
        assert_true(strlen(err) > 0);
    }
    char name[256];
    assert_int_equal(store_id_to_dirname("mlx-community/Qwen3-0.6B-4bit", name, sizeof name), 0);
    assert_string_equal(name, "mlx-community--Qwen3-0.6B-4bit");
    assert_int_equal(store_id_to_dirname("../x", name, sizeof name), -1);
    /* a tag stays in the directory name: each quantization of a GGUF repository has its own */
    assert_int_equal(store_id_to_dirname("org/repo-GGUF:Q4_K_M", name, sizeof name), 0);
    assert_string_equal(name, "org--repo-GGUF:Q4_K_M");
    assert_string_equal(store_id_tag("org/repo:Q8_0"), "Q8_0");
    assert_null(store_id_tag("org/repo"));
    assert_int_equal(store_id_repo("org/repo:Q8_0", name, sizeof name), 0);
    assert_string_equal(name, "org/repo");
    assert_int_equal(store_id_to_dirname("org/name", name, 5), -1); /* does not fit */
}

static void test_relpath_validation(void **state) {
    (void)state;
    assert_int_equal(store_relpath_valid("config.json"), 0);
    assert_int_equal(store_relpath_valid("sub/dir/model-00001-of-00002.safetensors"), 0);
    const char *bad[] = {"", "/etc/passwd", "../x", "a/../../x", "a//b", "a/", "./a", "a\\b",
                         "x.partial", "a\nb", "c:x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(store_relpath_valid(bad[i]), -1);
}

static void test_locate_and_completeness(void **state) {
    (void)state;
    char models[300], ro[300], dir[1024], err[256];
    snprintf(models, sizeof models, "%s/models", root);
    snprintf(ro, sizeof ro, "%s/ro", root);
    char path[700];
    snprintf(path, sizeof path, "%s:%s/missing", ro, root);
    model_store s;
    assert_int_equal(store_init(&s, models, path, err, sizeof err), 0);
    assert_int_equal(s.n_search, 2);
    assert_int_equal(store_locate(&s, "org/model", dir, sizeof dir), STORE_ABSENT);
    assert_int_equal(store_write_dir(&s, "org/model", dir, sizeof dir), 0);
    char want[700];
    snprintf(want, sizeof want, "%s/org--model", models);
    assert_string_equal(dir, want);

    /* a manifest makes it complete only when every file has its recorded size */
    write_file(want, ".exo-manifest.json",
               "{\"files\":[{\"path\":\"config.json\",\"size\":2},{\"path\":\"w/a.bin\",\"size\":3}]}");
    write_file(want, "config.json", "{}");
    assert_int_equal(store_locate(&s, "org/model", dir, sizeof dir), STORE_PARTIAL);
    write_file(want, "w/a.bin", "ab");
    assert_int_equal(store_dir_state(want), STORE_PARTIAL); /* wrong size */
    write_file(want, "w/a.bin", "abc");
    assert_int_equal(store_locate(&s, "org/model", dir, sizeof dir), STORE_COMPLETE);
    assert_string_equal(dir, want);
    /* a manifest that names a path outside the dir never counts as complete */
    write_file(want, ".exo-manifest.json", "{\"files\":[{\"path\":\"../../x\",\"size\":1}]}");
    assert_int_equal(store_dir_state(want), STORE_PARTIAL);

    /* read-only dir without a manifest: config + index-listed weights */
    char ro_model[700];
    snprintf(ro_model, sizeof ro_model, "%s/other--m", ro);
    write_file(ro_model, "config.json", "{}");
    write_file(ro_model, "model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-2.safetensors\"}}");
    write_file(ro_model, "m-1.safetensors", "x");
    assert_int_equal(store_locate(&s, "other/m", dir, sizeof dir), STORE_PARTIAL);
    write_file(ro_model, "m-2.safetensors", "x");
    assert_int_equal(store_locate(&s, "other/m", dir, sizeof dir), STORE_COMPLETE);
    assert_string_equal(dir, ro_model);
    assert_true(store_dir_bytes(ro_model) > 0);

    /* a path to a model inside a store dir is that model; a traversal id is never resolved */
    assert_int_equal(store_locate(&s, ro_model, dir, sizeof dir), STORE_COMPLETE);
    assert_int_equal(store_locate(&s, "../ro/other--m", dir, sizeof dir), STORE_ABSENT);

    /* deleting touches only the writable copy */
    assert_int_equal(store_delete(&s, "other/m", err, sizeof err), 0);
    assert_int_equal(store_locate(&s, "other/m", dir, sizeof dir), STORE_COMPLETE);
    assert_int_equal(store_delete(&s, "org/model", err, sizeof err), 0);
    assert_int_equal(store_locate(&s, "org/model", dir, sizeof dir), STORE_ABSENT);
    assert_int_equal(store_delete(&s, "../../etc", err, sizeof err), -1);
}

/* One model, one identity: every spelling of a model directory's path inside a store dir is its
 * id; a path anywhere else names nothing, with one message whether it exists or not. */
static void test_canonical_ids(void **state) {
    (void)state;
    char models[300], ro[300], outside[300], err[512], err2[512], id[256], p[900];
    snprintf(models, sizeof models, "%s/cmodels", root);
    snprintf(ro, sizeof ro, "%s/cro", root);
    snprintf(outside, sizeof outside, "%s/elsewhere", root);
    char model[700], bare[700], other[700];
    snprintf(model, sizeof model, "%s/org--m", ro);
    snprintf(bare, sizeof bare, "%s/plain", models);
    snprintf(other, sizeof other, "%s/org--m", outside);
    write_file(model, "config.json", "{}");
    write_file(model, "model.safetensors", "x");
    write_file(bare, "config.json", "{}");
    write_file(other, "config.json", "{}");
    model_store s;
    assert_int_equal(store_init(&s, models, ro, err, sizeof err), 0);

    const char *aliases[] = {"%s", "%s/", "%s/.", "/%s", "%s//./", "%s/../org--m"};
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        snprintf(p, sizeof p, aliases[i], model);
        assert_int_equal(store_canonical_id(&s, p, id, sizeof id, err, sizeof err), 0);
        assert_string_equal(id, "org/m");
    }
    snprintf(p, sizeof p, "%s/../cro/./org--m", ro);
    assert_int_equal(store_canonical_id(&s, p, id, sizeof id, err, sizeof err), 0);
    assert_string_equal(id, "org/m");
    assert_int_equal(store_canonical_id(&s, bare, id, sizeof id, err, sizeof err), 0);
    assert_string_equal(id, "plain");
    assert_int_equal(store_canonical_id(&s, "org/m", id, sizeof id, err, sizeof err), 0);
    assert_string_equal(id, "org/m");

    /* outside the store dirs: a model dir, an existing dir, a missing path, a file inside a
     * model dir, the root: the same answer, and store_locate finds nothing */
    snprintf(p, sizeof p, "%s/config.json", model);
    const char *refused[] = {other, "/etc", "/nonexistent/x", p, "/", models};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        assert_int_equal(store_canonical_id(&s, refused[i], id, sizeof id, err, sizeof err), -1);
        assert_non_null(strstr(err, "model directories"));
        char dir[1024];
        assert_int_equal(store_locate(&s, refused[i], dir, sizeof dir), STORE_ABSENT);
    }
    assert_int_equal(store_canonical_id(&s, "/etc", id, sizeof id, err, sizeof err), -1);
    assert_int_equal(store_canonical_id(&s, "/nonexistent", id, sizeof id, err2, sizeof err2), -1);
    assert_string_equal(strstr(err, "' not found"), strstr(err2, "' not found"));
    assert_int_equal(store_canonical_id(&s, "a/b/c", id, sizeof id, err, sizeof err), -1);

    /* why a model is missing: a directory without config.json says so */
    write_file(models, "org--empty/README.md", "x");
    store_missing_reason(&s, "org/empty", err, sizeof err);
    assert_non_null(strstr(err, "has no config.json"));
    store_missing_reason(&s, "org/none", err, sizeof err);
    assert_string_equal(err, "it is not on disk");
}

struct seen {
    int n;
    char ids[8][128];
};
static void on_model(const char *id, const char *dir, enum store_state st, void *ud) {
    (void)dir;
    (void)st;
    struct seen *s = ud;
    if (s->n < 8) snprintf(s->ids[s->n++], 128, "%s", id);
}

static void test_list(void **state) {
    (void)state;
    char models[300], err[256], d[700];
    snprintf(models, sizeof models, "%s/list", root);
    model_store s;
    assert_int_equal(store_init(&s, models, NULL, err, sizeof err), 0);
    snprintf(d, sizeof d, "%s/a--one", models);
    write_file(d, "config.json", "{}");
    snprintf(d, sizeof d, "%s/bare-model", models);
    write_file(d, "config.json", "{}");
    snprintf(d, sizeof d, "%s/not-a-model", models);
    write_file(d, "notes.txt", "no config");
    snprintf(d, sizeof d, "%s/bad name", models);
    write_file(d, "config.json", "{}");
    struct seen seen = {0};
    store_list(&s, on_model, &seen);
    assert_int_equal(seen.n, 2);
    int one = !strcmp(seen.ids[0], "a/one") || !strcmp(seen.ids[1], "a/one");
    int bare = !strcmp(seen.ids[0], "bare-model") || !strcmp(seen.ids[1], "bare-model");
    assert_true(one && bare);
}

/* The built-in models dir (resources/models) is appended last; these tests use an empty one. */
static void test_builtin_models_dir_is_searched_last(void **state) {
    (void)state;
    char tmpl[] = "/tmp/exo-store-builtin-XXXXXX";
    char *root = mkdtemp(tmpl);
    assert_non_null(root);
    setenv("EXO_BUILTIN_MODELS_DIR", root, 1);
    model_store s;
    char err[256];
    assert_int_equal(store_init(&s, "/tmp/none", "/a:/b", err, sizeof err), 0);
    assert_int_equal(s.n_search, 3);
    assert_string_equal(s.search[2], root);
    setenv("EXO_BUILTIN_MODELS_DIR", "/nonexistent-builtin-models", 1);
    rmdir(root);
}

int main(void) {
    setenv("EXO_BUILTIN_MODELS_DIR", "/nonexistent-builtin-models", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtin_models_dir_is_searched_last),
        cmocka_unit_test(test_id_validation),
        cmocka_unit_test(test_relpath_validation),
        cmocka_unit_test(test_locate_and_completeness),
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_canonical_ids),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
