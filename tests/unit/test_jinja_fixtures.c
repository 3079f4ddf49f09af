/* Differential test: every template fixture under tests/fixtures/templates/ (rendered by Python
 * Jinja2 the way transformers does, see tools/reference/render_templates.py) must come out of our
 * engine byte for byte, and every case where Jinja2 failed must fail here too, with an error
 * naming a template line instead of a crash. Every publisher's template in
 * tests/fixtures/templates/published/ must have its fixture next to it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/jinja/jinja.h"

static json_t *load_fixture(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/templates/%s.json", name);
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc) fail_msg("cannot load %s: %s (line %d)", path, je.text, je.line);
    return doc;
}

static void show_diff(const char *what, const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i])
        i++;
    size_t from = i > 60 ? i - 60 : 0;
    print_error("%s: differs at byte %zu\n  want: %.120s\n  got:  %.120s\n", what, i, want + from,
                got + from);
}

static void run_model(const char *name) {
    json_t *doc = load_fixture(name);
    /* templates that print today's date were rendered at this instant (strftime_now) */
    json_t *epoch = json_object_get(doc, "source_date_epoch");
    char epoch_text[32];
    snprintf(epoch_text, sizeof epoch_text, "%lld", (long long)json_integer_value(epoch));
    if (epoch) setenv("SOURCE_DATE_EPOCH", epoch_text, 1);
    const char *source = json_string_value(json_object_get(doc, "template"));
    const char *bos = json_string_value(json_object_get(doc, "bos_token"));
    const char *eos = json_string_value(json_object_get(doc, "eos_token"));
    char err[512];
    chat_template *t = chat_template_compile(source, err, sizeof err);
    if (!t) fail_msg("%s: compile failed: %s", name, err);
    json_t *cases = json_object_get(doc, "cases");
    size_t i, failures = 0, ok = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *et = json_object_get(c, "enable_thinking");
        chat_render_options o = {
            .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
            .enable_thinking = json_is_null(et) || !et ? -1 : json_is_true(et),
            .bos_token = bos,
            .eos_token = eos,
            .extra_vars = json_object_get(c, "extra"),
        };
        json_t *tools = json_object_get(c, "tools");
        char *out = chat_template_render(t, json_object_get(c, "messages"),
                                         json_is_null(tools) ? NULL : tools, &o, err, sizeof err);
        const char *want = json_string_value(json_object_get(c, "expected"));
        char what[64];
        snprintf(what, sizeof what, "%s case %zu", name, i);
        if (want && !out) {
            print_error("%s: we failed (%s), Jinja2 rendered\n", what, err);
            failures++;
        } else if (!want && out) {
            print_error("%s: Jinja2 failed (%s), we rendered\n", what,
                        json_string_value(json_object_get(c, "error")));
            failures++;
        } else if (want && strcmp(want, out) != 0) {
            show_diff(what, want, out);
            failures++;
        } else if (!want && !strstr(err, "line ")) {
            print_error("%s: error does not name a line: %s\n", what, err);
            failures++;
        } else
            ok++;
        free(out);
    }
    chat_template_free(t);
    unsetenv("SOURCE_DATE_EPOCH");
    print_message("%s: %zu/%zu cases match Jinja2\n", name, ok, json_array_size(cases));
    assert_true(json_array_size(cases) >= 50);
    json_decref(doc);
    assert_int_equal(failures, 0);
}

static void test_qwen3(void **s) {
    (void)s;
    run_model("qwen3");
}
static void test_llama3_1(void **s) {
    (void)s;
    run_model("llama3_1");
}
static void test_deepseek_v3(void **s) {
    (void)s;
    run_model("deepseek_v3");
}
/* the publishers' own templates (Llama 2, gpt-oss, Qwen3 x2, Qwen3-Next x2, Qwen3.5, DeepSeek
 * V3 / V3.1, GLM-4.5): each .jinja there must have a fixture, and all of them must match */
static void test_published(void **s) {
    (void)s;
    DIR *d = opendir("tests/fixtures/templates/published");
    assert_non_null(d);
    struct dirent *e;
    int templates = 0;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 7 || strcmp(e->d_name + n - 6, ".jinja") != 0) continue;
        char name[300];
        snprintf(name, sizeof name, "published/%.*s", (int)(n - 6), e->d_name);
        run_model(name);
        templates++;
    }
    closedir(d);
    assert_true(templates >= 10);
}
static void test_gemma3(void **s) {
    (void)s;
    run_model("gemma3");
}

static void run_feature_file(const char *file) {
    json_t *doc = load_fixture(file);
    json_t *cases = json_object_get(doc, "cases");
    size_t i, failures = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *src = json_string_value(json_object_get(c, "template"));
        const char *want = json_string_value(json_object_get(c, "expected"));
        char err[512] = "";
        char *out = NULL;
        jinja_template *t = jinja_compile(src, strlen(src), err, sizeof err);
        json_t *ctx = json_object_get(c, "context");
        if (!ctx) ctx = json_object_get(doc, "context"); /* one context for the whole file */
        if (t) out = jinja_render(t, ctx, NULL, err, sizeof err);
        if (want && !out) {
            print_error("feature %s: we failed (%s), Jinja2 rendered %s\n", name, err, want);
            failures++;
        } else if (!want && out) {
            print_error("feature %s: Jinja2 failed (%s), we rendered [%s]\n", name,
                        json_string_value(json_object_get(c, "error")), out);
            failures++;
        } else if (want && strcmp(want, out) != 0) {
            print_error("feature %s:\n  want [%s]\n  got  [%s]\n", name, want, out);
            failures++;
        } else if (!want && !strstr(err, "line ")) {
            print_error("feature %s: error does not name a line: %s\n", name, err);
            failures++;
        }
        free(out);
        jinja_free(t);
    }
    print_message("%s: %zu/%zu match Jinja2\n", file, json_array_size(cases) - failures,
                  json_array_size(cases));
    json_decref(doc);
    assert_int_equal(failures, 0);
}

/* one template per feature (tools/reference/render_templates.py FEATURES) */
static void test_features(void **s) {
    (void)s;
    run_feature_file("features");
}

/* random whitespace-control templates: trim_blocks, lstrip_blocks, -/+ markers */
static void test_whitespace(void **s) {
    (void)s;
    run_feature_file("whitespace");
}

/* random expressions: operators, filters, tests, methods, subscripts over one context */
static void test_expressions(void **s) {
    (void)s;
    run_feature_file("expressions");
}

/* random programs: set/for/if/macro/namespace scoping */
static void test_programs(void **s) {
    (void)s;
    run_feature_file("programs");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_features),    cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_expressions), cmocka_unit_test(test_programs),
        cmocka_unit_test(test_qwen3),       cmocka_unit_test(test_llama3_1),
        cmocka_unit_test(test_published),   cmocka_unit_test(test_deepseek_v3),
        cmocka_unit_test(test_gemma3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
