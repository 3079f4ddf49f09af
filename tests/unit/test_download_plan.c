/* Download planning pieces that need no network: which safetensors files a pipeline stage needs,
 * Range header parsing for peer transfer, and which peer routes resolve to which files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/paths.h"
#include "download/download.h"
#include "download/download_internal.h"
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

/* A safetensors image: header + data offsets as given (data bytes are not needed to plan). */
static size_t st_image(unsigned char *buf, size_t cap, const char *json) {
    size_t n = strlen(json);
    assert_true(8 + n <= cap);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, json, n);
    return 8 + n;
}

static void test_shard_ranges(void **state) {
    (void)state;
    /* 4 layers, 100 bytes each (split in 2 tensors), embed 1000 bytes first, norm+lm_head last;
     * one tensor of layer 2 stored out of order at the end */
    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[250],\"data_offsets\":[0,1000]},"
        "\"model.layers.0.a\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[1000,1100]},"
        "\"model.layers.1.a\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[1100,1200]},"
        "\"model.layers.2.a\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[1200,1300]},"
        "\"model.layers.3.a\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[1300,1400]},"
        "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[1400,1500]},"
        "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[250],\"data_offsets\":[1500,2500]},"
        "\"model.layers.2.b\":{\"dtype\":\"F32\",\"shape\":[25000],\"data_offsets\":[2500,102500]}}";
    unsigned char buf[4096];
    size_t len = st_image(buf, sizeof buf, hdr);
    uint64_t data0 = len, size = data0 + 102500, need = 0;
    download_range r[16];
    char err[256];
    /* too short: asks for the length, then for the whole header */
    assert_int_equal(download_shard_ranges(buf, 4, size, 4, 0, 0, 2, r, 16, &need, err, sizeof err), -2);
    assert_int_equal(need, 8);
    assert_int_equal(download_shard_ranges(buf, 8, size, 4, 0, 0, 2, r, 16, &need, err, sizeof err), -2);
    assert_int_equal(need, data0);
    /* stage 0 (layers 0-1): header + embed + layers 0,1: one contiguous range */
    assert_int_equal(download_shard_ranges(buf, len, size, 4, 0, 0, 2, r, 16, &need, err, sizeof err), 1);
    assert_int_equal(r[0].start, 0);
    assert_int_equal(r[0].end, data0 + 1200);
    /* stage 1 (layers 2-3): header, then layers 2,3 + norm + lm_head (merged: within 64 KiB of
     * the header), and layer 2's far tensor */
    int n = download_shard_ranges(buf, len, size, 4, 0, 2, 4, r, 16, &need, err, sizeof err);
    assert_int_equal(n, 1); /* everything after the embeddings lies within the merge gap ... */
    assert_int_equal(r[0].end, size);
    /* ... so use a file where the gap is large: embeddings of 1 MB */
    const char *hdr2 =
        "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[262144],\"data_offsets\":[0,1048576]},"
        "\"model.layers.0.a\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[1048576,1048676]},"
        "\"model.layers.1.a\":{\"dtype\":\"F32\",\"shape\":[262144],\"data_offsets\":[1048676,2097252]},"
        "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[2097252,2097352]}}";
    len = st_image(buf, sizeof buf, hdr2);
    data0 = len;
    size = data0 + 2097352;
    n = download_shard_ranges(buf, len, size, 2, 0, 1, 2, r, 16, &need, err, sizeof err);
    assert_int_equal(n, 2);
    assert_int_equal(r[0].start, 0);
    assert_int_equal(r[0].end, data0);
    assert_int_equal(r[1].start, data0 + 1048676);
    assert_int_equal(r[1].end, size);
    /* tied embeddings: the last stage also needs them; layer 0's 100 bytes between are merged */
    n = download_shard_ranges(buf, len, size, 2, 1, 1, 2, r, 16, &need, err, sizeof err);
    assert_int_equal(n, 1);
    assert_int_equal(r[0].start, 0);
    assert_int_equal(r[0].end, size);
    /* out of slots: still covers every needed byte */
    n = download_shard_ranges(buf, len, size, 2, 0, 1, 2, r, 1, &need, err, sizeof err);
    assert_int_equal(n, 1);
    assert_int_equal(r[0].start, 0);
    assert_int_equal(r[0].end, size);
    /* offsets past the file, a header longer than the file, not JSON: errors */
    assert_int_equal(download_shard_ranges(buf, len, size - 1, 2, 0, 1, 2, r, 16, &need, err, sizeof err), -1);
    assert_non_null(strstr(err, "outside the file"));
    assert_int_equal(download_shard_ranges(buf, len, 20, 2, 0, 1, 2, r, 16, &need, err, sizeof err), -1);
    len = st_image(buf, sizeof buf, "[1,2,3]");
    assert_int_equal(download_shard_ranges(buf, len, 100, 2, 0, 1, 2, r, 16, &need, err, sizeof err), -1);
}

/* Which .gguf of a repository an id picks (plan_pick_gguf): the tag as a whole word of the
 * file name, case-insensitively, never a vision projector; no tag: Q4_K_M, else the only one;
 * refused: no match, several matches, a split model. */
static void test_pick_gguf(void **state) {
    (void)state;
    static const char *names[] = {"README.md", "model-Q4_K_M.gguf", "model-Q4_K.gguf", "model.Q8_0.gguf",
                                  "sub/model-Q4_0.gguf", "mmproj-model-F16.gguf", "big-Q6_K-00001-of-00002.gguf",
                                  "big-Q6_K-00002-of-00002.gguf", "dup-IQ4_XS.gguf", "dup2-IQ4_XS.gguf"};
    hf_file files[sizeof names / sizeof *names];
    memset(files, 0, sizeof files);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) snprintf(files[i].path, sizeof files[i].path, "%s", names[i]);
    hf_file_list list = {files, sizeof names / sizeof *names};
    char err[1024];
    static const struct {
        const char *id;
        int want; /* index, or -1 */
        const char *msg;
    } cases[] = {{"o/r:Q4_K_M", 1, NULL}, {"o/r:q4_k_m", 1, NULL}, {"o/r:Q4_K", 2, NULL}, {"o/r:Q8_0", 3, NULL},
                 {"o/r:Q4_0", 4, NULL},   {"o/r", 1, NULL},        {"o/r:F16", -1, "carries the tag 'F16'"},
                 {"o/r:Q4", -1, "carries the tag"}, {"o/r:Q6_K", -1, "split into several"},
                 {"o/r:IQ4_XS", -1, "2 .gguf files of o/r match"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        err[0] = 0;
        int got = plan_pick_gguf(&list, cases[i].id, err, sizeof err);
        if (got != cases[i].want) fprintf(stderr, "%s: picked %d (%s)\n", cases[i].id, got, err);
        assert_int_equal(got, cases[i].want);
        if (cases[i].msg && !strstr(err, cases[i].msg)) fprintf(stderr, "%s: %s\n", cases[i].id, err);
        if (cases[i].msg) assert_non_null(strstr(err, cases[i].msg));
    }
    assert_true(plan_is_gguf_choice(&list, "o/r"));
    hf_file st[2] = {{.path = "model.safetensors"}, {.path = "model-Q4_0.gguf"}};
    hf_file_list with_st = {st, 2};
    assert_false(plan_is_gguf_choice(&with_st, "o/r")); /* safetensors win without a tag */
    assert_true(plan_is_gguf_choice(&with_st, "o/r:Q4_0"));
    hf_file two[2] = {{.path = "a-Q8_0.gguf"}, {.path = "b-Q5_K_S.gguf"}};
    hf_file_list no_default = {two, 2};
    assert_int_equal(plan_pick_gguf(&no_default, "o/r", err, sizeof err), -1);
    assert_non_null(strstr(err, "none is Q4_K_M"));
}

int main(void) {
    setenv("EXO_BUILTIN_MODELS_DIR", "/nonexistent-builtin-models", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_files),
        cmocka_unit_test(test_range),
        cmocka_unit_test(test_shard_ranges),
        cmocka_unit_test(test_serve_resolve),
        cmocka_unit_test(test_pick_gguf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
