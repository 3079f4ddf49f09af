/* Download planning pieces that need no network: which safetensors files a pipeline stage needs,
 * Range header parsing for peer transfer, and which peer routes resolve to which files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/paths.h"
#include "download/download.h"
#include "download/serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *INDEX =
    "{\"metadata\":{},\"weight_map\":{"
    "\"model.embed_tokens.weight\":\"a.safetensors\","
    "\"model.layers.0.mlp.w\":\"a.safetensors\",\"model.layers.1.mlp.w\":\"a.safetensors\","
    "\"model.layers.2.mlp.w\":\"b.safetensors\",\"model.layers.3.mlp.w\":\"b.safetensors\","
    "\"model.layers.4.mlp.w\":\"c.safetensors\",\"model.layers.5.mlp.w\":\"c.safetensors\","
    "\"model.layers.10.mlp.w\":\"c.safetensors\","
    "\"model.norm.weight\":\"d.safetensors\",\"lm_head.weight\":\"d.safetensors\"}}";

static int has(json_t *a, const char *s) {
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) if (!strcmp(json_string_value(v), s)) return 1;
    return 0;
}

static void test_shard_files(void **state) {
    (void)state;
    char err[256];
    json_t *a = json_array();
    assert_int_equal(download_shard_files(INDEX, 11, 0, 0, 3, a, err, sizeof err), 0);
    assert_int_equal(json_array_size(a), 2);
    assert_true(has(a, "a.safetensors") && has(a, "b.safetensors"));
    json_decref(a);

    /* the last stage: its layers plus the final norm and lm_head, not the embeddings */
    a = json_array();
    assert_int_equal(download_shard_files(INDEX, 11, 0, 4, 11, a, err, sizeof err), 0);
    assert_int_equal(json_array_size(a), 2);
    assert_true(has(a, "c.safetensors") && has(a, "d.safetensors"));
    json_decref(a);

    /* tied embeddings: the last stage also needs the embedding matrix */
    a = json_array();
    assert_int_equal(download_shard_files(INDEX, 11, 1, 4, 11, a, err, sizeof err), 0);
    assert_true(has(a, "a.safetensors"));
    json_decref(a);

    /* "layers.1" must not match layer 10 (and vice versa) */
    a = json_array();
    assert_int_equal(download_shard_files(INDEX, 11, 0, 10, 11, a, err, sizeof err), 0);
    assert_true(has(a, "c.safetensors") && !has(a, "b.safetensors"));
    json_decref(a);

    a = json_array();
    assert_int_equal(download_shard_files("{\"weight_map\":{\"x\":\"../../etc/passwd\"}}", 1, 0, 0, 1,
                                          a, err, sizeof err), -1);
    assert_int_equal(download_shard_files("not json", 1, 0, 0, 1, a, err, sizeof err), -1);
    assert_non_null(strstr(err, "weight_map"));
    json_decref(a);
}

static void test_range(void **state) {
    (void)state;
    uint64_t s = 0, n = 0;
    assert_int_equal(serve_parse_range(NULL, 100, &s, &n), 200);
    assert_int_equal(serve_parse_range("bytes=10-19", 100, &s, &n), 206);
    assert_true(s == 10 && n == 10);
    assert_int_equal(serve_parse_range("bytes=90-", 100, &s, &n), 206);
    assert_true(s == 90 && n == 10);
    assert_int_equal(serve_parse_range("bytes=95-500", 100, &s, &n), 206);
    assert_true(s == 95 && n == 5);
    assert_int_equal(serve_parse_range("bytes=-30", 100, &s, &n), 206);
    assert_true(s == 70 && n == 30);
    assert_int_equal(serve_parse_range("bytes=100-", 100, &s, &n), 416);
    assert_int_equal(serve_parse_range("bytes=20-10", 100, &s, &n), 416);
    assert_int_equal(serve_parse_range("bytes=0-1,5-6", 100, &s, &n), 200);
    assert_int_equal(serve_parse_range("items=0-1", 100, &s, &n), 200);
    assert_int_equal(serve_parse_range("bytes=0-", 0, &s, &n), 416);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_serve_resolve(void **state) {
    (void)state;
    char root[128], dir[256], path[400], cmd[200], err[128];
    snprintf(root, sizeof root, "/tmp/exo-test-serve-%d", (int)getpid());
    snprintf(dir, sizeof dir, "%s/org--m", root);
    assert_int_equal(paths_mkdir_p(dir), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, "{}");
    snprintf(path, sizeof path, "%s/w.safetensors.partial", dir);
    write_file(path, "xx");
    snprintf(path, sizeof path, "%s/.exo-manifest.json", dir);
    write_file(path, "{\"files\":[{\"path\":\"config.json\",\"size\":2},{\"path\":\"w.safetensors\",\"size\":4}]}");
    model_store st;
    assert_int_equal(store_init(&st, root, NULL, err, sizeof err), 0);
    serve_target t;
    serve_resolve(&st, "/models/org/m/manifest", &t);
    assert_int_equal(t.status, 404); /* incomplete: w.safetensors missing */
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    write_file(path, "abcd");
    serve_resolve(&st, "/models/org/m/manifest", &t);
    assert_int_equal(t.status, 200);
    assert_true(t.is_manifest);
    serve_resolve(&st, "/models/org/m/files/w.safetensors", &t);
    assert_int_equal(t.status, 200);
    assert_int_equal(t.size, 4);
    serve_resolve(&st, "/models/org/m/files/w.safetensors.partial", &t);
    assert_int_equal(t.status, 400);
    serve_resolve(&st, "/models/org/m/files/../../../etc/passwd", &t);
    assert_int_equal(t.status, 400);
    serve_resolve(&st, "/models/org/m/files/.exo-manifest.json", &t);
    assert_int_equal(t.status, 400);
    serve_resolve(&st, "/models/org/m/files/unlisted.txt", &t);
    assert_int_equal(t.status, 404);
    serve_resolve(&st, "/models/../m/manifest", &t);
    assert_int_equal(t.status, 400);
    serve_resolve(&st, "/models/org/none/manifest", &t);
    assert_int_equal(t.status, 404);
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    setenv("EXO_BUILTIN_MODELS_DIR", "/nonexistent-builtin-models", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_files),
        cmocka_unit_test(test_range),
        cmocka_unit_test(test_serve_resolve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
