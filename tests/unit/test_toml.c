/* TOML reader: every value kind cards use, dotted keys and tables, and the errors a user meets
 * when a card is malformed (with the line number). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/toml.h"

#include <math.h>
#include <string.h>

static toml_value *parse_ok(const char *text) {
    char err[256];
    toml_value *v = toml_parse(text, strlen(text), err, sizeof err);
    if (!v) fail_msg("parse failed: %s", err);
    return v;
}

/* Returns the error message; asserts the parse failed. */
static const char *parse_err(const char *text) {
    static char err[256];
    toml_value *v = toml_parse(text, strlen(text), err, sizeof err);
    if (v) {
        toml_free(v);
        fail_msg("expected failure for: %s", text);
    }
    return err;
}

static void test_card_shape(void **state) {
    (void)state;
    const char *card = "# a card\n"
                       "model_id = \"mlx-community/Llama-3.2-1B-Instruct-4bit\"\n"
                       "n_layers = 16\r\n"
                       "hidden_size = 2_048   # underscores\n"
                       "supports_tensor = true\n"
                       "tasks = [\"TextGeneration\"]\n"
                       "capabilities = [\n  \"text\", # first\n  \"thinking\",\n]\n"
                       "\n[storage_size]\nin_bytes = 729808896\n"
                       "[sampling_defaults]\ntemperature = 0.6\ntop_k = 20\n"
                       "[sampling_defaults.non_thinking]\ntemperature = 7e-1\n";
    toml_value *t = parse_ok(card);
    const char *s;
    int64_t i;
    double d;
    int b;
    assert_int_equal(toml_get_string(t, "model_id", &s), 0);
    assert_string_equal(s, "mlx-community/Llama-3.2-1B-Instruct-4bit");
    assert_int_equal(toml_get_int(t, "n_layers", &i), 0);
    assert_int_equal(i, 16);
    assert_int_equal(toml_get_int(t, "hidden_size", &i), 0);
    assert_int_equal(i, 2048);
    assert_int_equal(toml_get_bool(t, "supports_tensor", &b), 0);
    assert_true(b);
    assert_int_equal(toml_get_int(t, "storage_size.in_bytes", &i), 0);
    assert_int_equal(i, 729808896);
    assert_int_equal(toml_get_double(t, "sampling_defaults.temperature", &d), 0);
    assert_true(fabs(d - 0.6) < 1e-12);
    assert_int_equal(toml_get_double(t, "sampling_defaults.top_k", &d), 0); /* int -> double */
    assert_true(d == 20.0);
    assert_int_equal(toml_get_double(t, "sampling_defaults.non_thinking.temperature", &d), 0);
    assert_true(fabs(d - 0.7) < 1e-12);
    const toml_value *caps = toml_get(t, "capabilities");
    assert_non_null(caps);
    assert_int_equal(caps->type, TOML_ARRAY);
    assert_int_equal(caps->u.array.n, 2);
    assert_string_equal(caps->u.array.items[1]->u.string.data, "thinking");
    /* wrong type and absent keys */
    assert_int_equal(toml_get_int(t, "model_id", &i), -1);
    assert_null(toml_get(t, "nope"));
    assert_null(toml_get(t, "n_layers.x"));
    toml_free(t);
}

static void test_strings_and_escapes(void **state) {
    (void)state;
    toml_value *t = parse_ok("a = \"tab\\tq\\\"back\\\\\"\n"
                             "b = 'C:\\path\\no escapes'\n"
                             "c = \"\\u00e9\\U0001F600\"\n"
                             "\"quoted key\" = 1\n"
                             "'lit.key' = 2\n"
                             "d = \"nul\\u0000byte\"\n");
    const char *s;
    int64_t i;
    assert_int_equal(toml_get_string(t, "a", &s), 0);
    assert_string_equal(s, "tab\tq\"back\\");
    assert_int_equal(toml_get_string(t, "b", &s), 0);
    assert_string_equal(s, "C:\\path\\no escapes");
    assert_int_equal(toml_get_string(t, "c", &s), 0);
    assert_string_equal(s, "\xc3\xa9\xf0\x9f\x98\x80");
    assert_int_equal(toml_get_int(t, "quoted key", &i), 0);
    assert_int_equal(i, 1);
    /* a quoted key with a dot is one key, not a path */
    assert_null(toml_get(t, "lit"));
    assert_string_equal(t->u.table.keys[4], "lit.key");
    const toml_value *d = toml_get(t, "d");
    assert_int_equal(d->u.string.len, 8);
    toml_free(t);
}

static void test_numbers(void **state) {
    (void)state;
    toml_value *t = parse_ok("a = -17\nb = +3\nc = 0xff\nd = 0o17\ne = 0b101\nf = 1.5e3\n"
                             "g = -inf\nh = nan\ni = 9223372036854775807\nj = -0.0\nk = 1E-2\n");
    int64_t i;
    double d;
    assert_int_equal(toml_get_int(t, "a", &i), 0), assert_int_equal(i, -17);
    assert_int_equal(toml_get_int(t, "b", &i), 0), assert_int_equal(i, 3);
    assert_int_equal(toml_get_int(t, "c", &i), 0), assert_int_equal(i, 255);
    assert_int_equal(toml_get_int(t, "d", &i), 0), assert_int_equal(i, 15);
    assert_int_equal(toml_get_int(t, "e", &i), 0), assert_int_equal(i, 5);
    assert_int_equal(toml_get_double(t, "f", &d), 0), assert_true(d == 1500.0);
    assert_int_equal(toml_get_double(t, "g", &d), 0), assert_true(isinf(d) && d < 0);
    assert_int_equal(toml_get_double(t, "h", &d), 0), assert_true(isnan(d));
    assert_int_equal(toml_get_int(t, "i", &i), 0), assert_true(i == INT64_MAX);
    assert_int_equal(toml_get_double(t, "k", &d), 0), assert_true(fabs(d - 0.01) < 1e-15);
    toml_free(t);
}

static void test_dotted_and_inline(void **state) {
    (void)state;
    toml_value *t = parse_ok("sampling.temp = 0.5\nsampling.\"top k\" = 4\n"
                             "point = { x = 1, y.z = 2 }\n"
                             "nested = [[1, 2], [\"a\"], []]\n"
                             "[a.b]\nc = 1\n[a]\nd = 2\n");
    int64_t i;
    assert_int_equal(toml_get_int(t, "sampling.top k", &i), 0), assert_int_equal(i, 4);
    assert_int_equal(toml_get_int(t, "point.y.z", &i), 0), assert_int_equal(i, 2);
    assert_int_equal(toml_get_int(t, "a.b.c", &i), 0), assert_int_equal(i, 1);
    assert_int_equal(toml_get_int(t, "a.d", &i), 0), assert_int_equal(i, 2);
    const toml_value *n = toml_get(t, "nested");
    assert_int_equal(n->u.array.n, 3);
    assert_int_equal(n->u.array.items[0]->u.array.items[1]->u.integer, 2);
    assert_int_equal(n->u.array.items[2]->u.array.n, 0);
    toml_free(t);
}

static void test_errors_name_the_line(void **state) {
    (void)state;
    assert_string_equal(parse_err("a = 1\nb = \"open\n"), "line 2: unterminated string");
    assert_string_equal(parse_err("a = 1\na = 2\n"), "line 2: duplicate key 'a'");
    assert_string_equal(parse_err("[t]\nx=1\n[t]\n"), "line 3: table [t] is defined twice");
    assert_string_equal(parse_err("a = 1\n\n\nb = 1 2\n"), "line 4: expected end of line, found '2'");
    assert_string_equal(parse_err("x = \"\\q\"\n"), "line 1: unknown escape '\\q' in string");
    assert_string_equal(parse_err("x = [1, 2\n"), "line 2: unterminated array");
    assert_string_equal(parse_err("x = yes\n"), "line 1: invalid value 'yes'");
    assert_string_equal(parse_err("d = 2024-01-01\n"),
                        "line 1: dates and times are not supported in model cards");
    assert_string_equal(parse_err("[[a]]\n"),
                        "line 1: arrays of tables ([[...]]) are not supported in model cards");
    assert_string_equal(parse_err("s = \"\"\"x\"\"\"\n"),
                        "line 1: multi-line strings are not supported in model cards");
    assert_string_equal(parse_err("a = 1\na.b = 2\n"), "line 2: key 'a' is already defined as a value");
    assert_string_equal(parse_err("p = {x=1}\n[p]\n"), "line 2: 'p' is already defined as a value");
    assert_string_equal(parse_err("i = 99999999999999999999\n"), "line 1: integer out of range");
    assert_string_equal(parse_err("= 1\n"), "line 1: expected a key, found '='");
    assert_string_equal(parse_err("a\n"), "line 1: expected '=' after key 'a'");
    parse_err("n = 01\n");
    parse_err("n = 1__0\n");
    parse_err("n = 1.\n");
    parse_err("n = .5\n");
    parse_err("n = 1e\n");
    parse_err("n = -0x10\n");
    parse_err("n = \"\\uD800\"\n");
    parse_err("n = [1,,2]\n");
    parse_err("n = {a=1,}\n");
    parse_err("x = \"a\x01\"\n");
    /* deep nesting is refused, not a stack overflow */
    char deep[400];
    memset(deep, '[', sizeof deep);
    memcpy(deep, "x = ", 4);
    deep[sizeof deep - 1] = 0;
    assert_non_null(strstr(parse_err(deep), "nested more than"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_card_shape),         cmocka_unit_test(test_strings_and_escapes),
        cmocka_unit_test(test_numbers),            cmocka_unit_test(test_dotted_and_inline),
        cmocka_unit_test(test_errors_name_the_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
