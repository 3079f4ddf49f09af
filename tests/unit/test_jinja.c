/* Jinja engine behaviour that the Jinja2 differential fixtures cannot show: errors naming the
 * template line, the limits that stop runaway templates, strftime_now, and chat rendering
 * options (enable_thinking only when set, extra variables, absent tools). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>

#include "base/strbuf.h"
#include "text/chat.h"
#include "text/jinja/jinja.h"

/* renders src with context JSON text; returns output (malloc'd) or NULL with err */
static char *render(const char *src, const char *ctx_json, const jinja_limits *limits, char *err,
                    size_t errlen) {
    jinja_template *t = jinja_compile(src, strlen(src), err, errlen);
    if (!t) return NULL;
    json_t *ctx = ctx_json ? json_loads(ctx_json, 0, NULL) : NULL;
    char *out = jinja_render(t, ctx, limits, err, errlen);
    json_decref(ctx);
    jinja_free(t);
    return out;
}

static void test_syntax_error_names_line(void **st) {
    (void)st;
    char err[256];
    assert_null(
        render("line 1\n{% if x %}\nline 3\n{{ 1 + }}\n{% endif %}", NULL, NULL, err, sizeof err));
    assert_non_null(strstr(err, "line 4"));
    assert_null(render("a\nb\n{% for x in y %}\nno end", NULL, NULL, err, sizeof err));
    assert_non_null(strstr(err, "line 4"));
    assert_non_null(strstr(err, "endfor"));
    assert_null(render("\n\n{% include 'x' %}", NULL, NULL, err, sizeof err));
    assert_non_null(strstr(err, "line 3"));
    assert_non_null(strstr(err, "not supported"));
}

static void test_runtime_error_names_line(void **st) {
    (void)st;
    char err[256];
    assert_null(
        render("ok\n\n{{ raise_exception('Only user and assistant roles are supported!') }}", NULL,
               NULL, err, sizeof err));
    assert_non_null(strstr(err, "line 3"));
    assert_non_null(strstr(err, "Only user and assistant roles are supported!"));
    assert_null(render("{% for m in messages %}\n{{ m.content.nope.deeper }}{% endfor %}",
                       "{\"messages\": [{\"content\": {}}]}", NULL, err, sizeof err));
    assert_non_null(strstr(err, "line 2"));
    assert_null(render("{{ 'a' + 1 }}", NULL, NULL, err, sizeof err));
    assert_non_null(strstr(err, "line 1"));
}

static void test_limits(void **st) {
    (void)st;
    char err[256];
    jinja_limits small = {.max_output_bytes = 1000,
                          .max_iterations = 500,
                          .max_depth = 20,
                          .max_memory_bytes = 1 << 20};
    /* output */
    assert_null(render("{% for i in range(2000) %}x{% endfor %}", NULL, &small, err, sizeof err));
    assert_non_null(strstr(err, "iterations"));
    assert_null(
        render("{% for i in range(400) %}xxxxx{% endfor %}", NULL, &small, err, sizeof err));
    assert_non_null(strstr(err, "output"));
    /* recursion */
    assert_null(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &small, err,
                       sizeof err));
    assert_non_null(strstr(err, "recursion"));
    /* memory: a string doubling in a loop */
    assert_null(render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(400) %}{% "
                       "set ns.s = ns.s ~ ns.s[:100] %}"
                       "{% endfor %}{{ ns.s | length }}",
                       NULL,
                       &(jinja_limits){.max_memory_bytes = 1 << 20, .max_output_bytes = 1 << 20},
                       err, sizeof err));
    assert_non_null(strstr(err, "memory"));
    /* self-referencing namespace cannot hang or overflow the stack */
    assert_null(render("{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns }}", NULL, NULL, err,
                       sizeof err));
    /* within the limits, the same templates render */
    char *out = render("{% for i in range(3) %}x{% endfor %}", NULL, &small, err, sizeof err);
    assert_string_equal(out, "xxx");
    free(out);
}

/* long chains and deep nesting are refused while compiling, before they can exhaust the stack */
static void test_deep_templates(void **st) {
    (void)st;
    const char *pieces[][3] = {
        {"{{ 1", " ~ 1", " }}"},
        {"{{ x", "|upper", " }}"},
        {"{{ a", ".b", " }}"},
        {"{{ ", "(", "1"},
        {"{% if a %}", "{% elif a %}", "{% endif %}"},
        {"", "{% if a %}", ""},
        {"{{ ", "not ", "x }}"},
        {"{{ ", "[", "]"},
        {"{{ 1", " if a else 1", " }}"},
        {"{{ x", "[0]", " }}"},
    };
    for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        strbuf sb = {0};
        strbuf_append_str(&sb, pieces[k][0]);
        for (int i = 0; i < 20000; i++)
            strbuf_append_str(&sb, pieces[k][1]);
        strbuf_append_str(&sb, pieces[k][2]);
        char err[256];
        jinja_template *t = jinja_compile(sb.data, sb.len, err, sizeof err);
        assert_null(t);
        assert_non_null(strstr(err, "line 1"));
        assert_non_null(strstr(err, "deeply") ? err : strstr(err, "expected"));
        strbuf_free(&sb);
    }
}

static void test_strftime_now(void **st) {
    (void)st;
    char err[256], want[64];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(want, sizeof want, "%Y", &tm);
    char *out = render("{{ strftime_now('%Y') }}", NULL, NULL, err, sizeof err);
    assert_non_null(out);
    assert_string_equal(out, want);
    free(out);
}

/* SOURCE_DATE_EPOCH pins the date templates print (gpt-oss's "Current date:"), in UTC */
static void test_strftime_now_source_date_epoch(void **st) {
    (void)st;
    char err[256];
    setenv("SOURCE_DATE_EPOCH", "1768435200", 1);
    char *out = render("{{ strftime_now('%Y-%m-%d %H:%M') }}", NULL, NULL, err, sizeof err);
    unsetenv("SOURCE_DATE_EPOCH");
    assert_non_null(out);
    assert_string_equal(out, "2026-01-15 00:00");
    free(out);
}

static void test_chat_options(void **st) {
    (void)st;
    char err[256];
    const char *src =
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
        "{{ 'T' if tools is none else tools | length }}"
        "{% if enable_thinking is defined %}think={{ enable_thinking }}{% endif %}"
        "{% if add_generation_prompt %}>{% endif %}{{ effort | default('') }}";
    chat_template *t = chat_template_compile(src, err, sizeof err);
    assert_non_null(t);
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    chat_render_options o = {.add_generation_prompt = 1, .enable_thinking = -1, .bos_token = "<s>"};
    char *out = chat_template_render(t, msgs, NULL, &o, err, sizeof err);
    assert_string_equal(out, "<s>[user:hi]T>");
    free(out);
    json_t *tools = json_loads("[{\"type\": \"function\"}, {\"type\": \"function\"}]", 0, NULL);
    json_t *extra = json_loads("{\"effort\": \"high\"}", 0, NULL);
    o = (chat_render_options){
        .add_generation_prompt = 0, .enable_thinking = 0, .extra_vars = extra};
    out = chat_template_render(t, msgs, tools, &o, err, sizeof err);
    assert_string_equal(out, "[user:hi]2think=Falsehigh");
    free(out);
    assert_null(chat_template_compile(NULL, err, sizeof err));
    assert_null(chat_template_compile("{% if %}", err, sizeof err));
    assert_non_null(strstr(err, "line 1"));
    json_decref(msgs);
    json_decref(tools);
    json_decref(extra);
    chat_template_free(t);
}

static void test_real_template_files(void **st) {
    (void)st;
    /* every model template in the fixtures compiles and renders a one-message chat */
    const char *names[] = {"qwen3", "llama3_1", "published/llama-2-chat", "deepseek_v3", "published/gpt-oss", "gemma3",
                           "published/glm-4.5", "published/deepseek-v3.1", "published/qwen3.5"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[128], err[256];
        snprintf(path, sizeof path, "tests/fixtures/templates/%s.json", names[i]);
        json_t *doc = json_load_file(path, 0, NULL);
        assert_non_null(doc);
        chat_template *t = chat_template_compile(
            json_string_value(json_object_get(doc, "template")), err, sizeof err);
        assert_non_null(t);
        json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"Hello there\"}]", 0, NULL);
        chat_render_options o = {.add_generation_prompt = 1,
                                 .enable_thinking = -1,
                                 .bos_token = json_string_value(json_object_get(doc, "bos_token")),
                                 .eos_token = json_string_value(json_object_get(doc, "eos_token"))};
        char *out = chat_template_render(t, msgs, NULL, &o, err, sizeof err);
        if (!out) fail_msg("%s: %s", names[i], err);
        assert_non_null(strstr(out, "Hello there"));
        free(out);
        json_decref(msgs);
        chat_template_free(t);
        json_decref(doc);
    }
}

/* inputs the fuzzer once crashed on: they must now compile or fail cleanly */
static void test_fuzz_regressions(void **st) {
    (void)st;
    const char *dir = "tests/fuzz/regressions";
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "jinja-", 6) != 0) continue;
        char path[512], err[256];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        char buf[8192];
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        jinja_template *t = jinja_compile(buf, len, err, sizeof err);
        if (t) {
            char *out = jinja_render(t, NULL, NULL, err, sizeof err);
            free(out);
            jinja_free(t);
        } else {
            assert_non_null(strstr(err, "line "));
        }
        n++;
    }
    closedir(d);
    assert_true(n > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_syntax_error_names_line),
        cmocka_unit_test(test_runtime_error_names_line),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_strftime_now),
        cmocka_unit_test(test_strftime_now_source_date_epoch),
        cmocka_unit_test(test_chat_options),
        cmocka_unit_test(test_real_template_files),
        cmocka_unit_test(test_fuzz_regressions),
        cmocka_unit_test(test_deep_templates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
