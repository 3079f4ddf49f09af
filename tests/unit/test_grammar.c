/* Structured outputs below the API: the GBNF compiler accepts what llama.cpp's grammars say and
 * refuses bad grammars with a message; the matcher takes exactly the outputs of the grammar,
 * byte by byte (UTF-8 split anywhere); the token mask allows exactly the tokens that can
 * continue (eos only once the output is complete) and is the same from the cache; the JSON Schema
 * compiler's grammars take valid JSON and refuse invalid, and unsupported keywords are named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "text/grammar.h"
#include "text/json_schema.h"

#include <stdlib.h>
#include <string.h>

static grammar *compile(const char *text) {
    char err[256] = "";
    grammar *g = grammar_parse(text, strlen(text), err, sizeof err);
    if (!g) fail_msg("grammar refused: %s\n%s", err, text);
    return g;
}

/* 1: s is a complete output of g; 0: a prefix of one; -1: neither. */
static int match(grammar *g, const char *s) {
    grammar_state *st = grammar_state_new(g);
    int r = grammar_state_advance(st, (const uint8_t *)s, strlen(s));
    int out = r ? -1 : grammar_state_accepting(st);
    grammar_state_free(st);
    return out;
}

static void expect_refused(const char *text, const char *message_part) {
    char err[256] = "";
    grammar *g = grammar_parse(text, strlen(text), err, sizeof err);
    if (g) fail_msg("grammar accepted: %s", text);
    if (!strstr(err, message_part)) fail_msg("message '%s' lacks '%s'", err, message_part);
}

static void test_gbnf_syntax(void **s) {
    (void)s;
    grammar *g = compile("# a comment\n"
                         "root ::= greeting (\", \" name)? \"!\"\n"
                         "greeting ::= \"hi\" | \"hello\"   # trailing comment\n"
                         "name ::= [A-Z] [a-z]{1,3}\n");
    assert_int_equal(match(g, "hi!"), 1);
    assert_int_equal(match(g, "hello, Ann!"), 1);
    assert_int_equal(match(g, "hello, Annie!"), -1); /* {1,3} */
    assert_int_equal(match(g, "hello, A!"), -1);
    assert_int_equal(match(g, "hello, An"), 0);
    assert_int_equal(match(g, "hey"), -1);
    grammar_unref(g);
    g = compile("root ::= ( \"a\" |\n   \"b\" )+ [^a-z\\n]* \"\\x41\\u00e9\\\"\"");
    assert_int_equal(match(g, "abba\x41\xc3\xa9\""), 1);
    assert_int_equal(match(g, "ab12#A\xc3\xa9\""), 1);
    assert_int_equal(match(g, "abzA\xc3\xa9\""), -1);
    grammar_unref(g);
    g = compile("root ::= \"x\"{2} \"y\"{2,} \"z\"*");
    assert_int_equal(match(g, "xxyy"), 1);
    assert_int_equal(match(g, "xxyyyyzz"), 1);
    assert_int_equal(match(g, "xxy"), 0);
    grammar_unref(g);
}

static void test_gbnf_errors(void **s) {
    (void)s;
    expect_refused("root ::= root \"a\"", "left-recursive");
    expect_refused("root ::= a\na ::= \"b\"? root", "left-recursive");
    expect_refused("root ::= (\"a\"?)*", "without matching");
    expect_refused("root ::= x", "'x' is used but not defined");
    expect_refused("start ::= \"a\"", "no 'root'");
    expect_refused("root ::= \"abc", "line 1: unterminated string");
    expect_refused("root ::= \"a\"\nroot ::= \"b\"", "line 2: rule defined twice");
    expect_refused("root ::= [z-a]", "backwards");
    expect_refused("root ::= \"\\q\"", "unknown escape");
    expect_refused("root ::= \"a\"{3,1}", "n < m");
    expect_refused("root ::= \"a\"{99999}", "over 10000");
    expect_refused("root ::= *", "without anything before it");
    expect_refused("root ::= (\"a\"", "expected ')'");
    expect_refused("root ::= [^\\x00-\\U0010FFFF]", "matches no character");
    expect_refused("root ::= []", "matches no character"); /* fuzz: qsort of no ranges */
}

/* Every code point class is byte sequences: a 2-, 3- and 4-byte character is matched when fed
 * whole or one byte at a time, and a byte that cannot continue the character is refused. */
static void test_utf8_classes_byte_by_byte(void **s) {
    (void)s;
    grammar *g = compile("root ::= [\\u00e0-\\u00ff\\u4e00-\\u9fff\\U0001F600-\\U0001F64F]+");
    const char *ok = "\xc3\xa9\xe4\xb8\x80\xf0\x9f\x98\x80"; /* é 一 😀 */
    assert_int_equal(match(g, ok), 1);
    grammar_state *st = grammar_state_new(g);
    for (size_t i = 0; i < strlen(ok); i++) {
        assert_int_equal(grammar_state_advance(st, (const uint8_t *)ok + i, 1), 0);
        assert_int_equal(grammar_state_accepting(st), i == 1 || i == 4 || i == 8);
    }
    grammar_state_free(st);
    assert_int_equal(match(g, "\xc3\xa0"), 1);
    assert_int_equal(match(g, "\xc3\x9f"), -1);         /* ß is below the range */
    assert_int_equal(match(g, "\xf0\x9f\x99\x90"), -1); /* U+1F650 is past it */
    assert_int_equal(match(g, "a"), -1);
    grammar_unref(g);
}

static const char *const vocab_tokens[] = {"{",    "}",    "\"",       "a", "ab", "\"a", "a\"",
                                           "\xc3", "\xa9", "\xc3\xa9", "1", "12", "\"}", "}}"};
#define N_VOCAB 14
#define EOS 15 /* n_vocab 16: token 14 has no bytes (a special token), 15 is eos */

static grammar_vocab *test_vocab(void) {
    const uint8_t *bytes[N_VOCAB];
    uint32_t lens[N_VOCAB];
    for (int i = 0; i < N_VOCAB; i++) {
        bytes[i] = (const uint8_t *)vocab_tokens[i];
        lens[i] = (uint32_t)strlen(vocab_tokens[i]);
    }
    int32_t eos = EOS;
    grammar_vocab *v = grammar_vocab_new(16, bytes, lens, N_VOCAB, &eos, 1, NULL, 0);
    assert_non_null(v);
    return v;
}

/* The set bits of the mask, as a string of token indices: "0 3 15". */
static void mask_string(grammar_state *st, grammar_vocab *v, char *out) {
    const uint64_t *m = grammar_state_mask(st, v);
    out[0] = 0;
    for (int t = 0; t < 16; t++)
        if ((m[0] >> t) & 1) sprintf(out + strlen(out), "%s%d", out[0] ? " " : "", t);
}

static void test_token_mask(void **s) {
    (void)s;
    grammar *g = compile("root ::= \"{\" \"\\\"\" [a\\u00e9]* \"\\\"\" \"}\"");
    grammar_vocab *v = test_vocab();
    grammar_state *st = grammar_state_new(g);
    char m[128];
    mask_string(st, v, m);
    assert_string_equal(m, "0"); /* only "{" */
    assert_int_equal(grammar_state_accept_token(st, v, 0), 0);
    mask_string(st, v, m);
    assert_string_equal(m, "2 5"); /* '"' and '"a' */
    assert_int_equal(grammar_state_accept_token(st, v, 5), 0);
    /* inside the string: a, ab? no (b), a" , \xc3 (a prefix of é), é, " and "} */
    mask_string(st, v, m);
    assert_string_equal(m, "2 3 6 7 9 12");
    char again[128];
    mask_string(st, v, again); /* from the cache */
    assert_string_equal(again, m);
    assert_int_equal(grammar_state_accept_token(st, v, 7), 0); /* half of é */
    mask_string(st, v, m);
    assert_string_equal(m, "8"); /* only its second byte */
    assert_int_equal(grammar_state_accept_token(st, v, 8), 0);
    assert_int_equal(grammar_state_accept_token(st, v, 12), 0); /* "} */
    mask_string(st, v, m);
    assert_string_equal(m, "15"); /* complete: eos only */
    assert_true(grammar_state_finished(st));
    assert_int_equal(grammar_state_accept_token(st, v, 3), -1); /* refused, state unchanged */
    assert_int_equal(grammar_state_accept_token(st, v, EOS), 0);
    grammar_state_free(st);
    grammar_unref(g);
    grammar_vocab_free(v);
}

/* fuzz: a grammar whose parses multiply with every byte (a repetition of a rule that repeats)
 * once kept the matcher busy for seconds per byte; a state now holds at most a bounded number
 * of parses, and past it the output cannot continue (eos only), so this returns promptly. */
static void test_ambiguous_grammar_is_bounded(void **s) {
    (void)s;
    grammar *g = compile("root ::= [a-z]{1,6} root*");
    grammar_vocab *v = test_vocab();
    grammar_state *st = grammar_state_new(g);
    const char *text = "abababababababababababababababababababab";
    int ok = 1;
    for (size_t i = 0; i < strlen(text) && ok; i++)
        ok = grammar_state_advance(st, (const uint8_t *)text + i, 1) == 0;
    assert_non_null(grammar_state_mask(st, v));
    grammar_state_free(st);
    grammar_unref(g);
    grammar_vocab_free(v);
}

/* ---------------------------------------------------------------- JSON Schema */

/* Every string of 1 to 3 symbols over a small alphabet (JSON punctuation, letters, digits,
 * space, both bytes of é): 1,463 tokens; then "x" and "x" followed by 1 to 3 of a, b, 1 and
 * space: 85 tokens under one trie node with no quote or backslash below it, which a mask inside
 * an unbounded string takes whole. */
#define ALPHABET "ab1\"\\{}: \xc3\xa9,"
#define N_SYMBOLS 11
#define N_PLAIN 85
#define N_SYNTH (N_SYMBOLS + N_SYMBOLS * N_SYMBOLS + N_SYMBOLS * N_SYMBOLS * N_SYMBOLS + N_PLAIN)

static grammar_vocab *synthetic_vocab(uint8_t tokens[N_SYNTH][4], uint32_t lens[N_SYNTH]) {
    const uint8_t *alpha = (const uint8_t *)ALPHABET;
    int n = 0;
    for (int len = 1; len <= 3; len++) {
        int count = len == 1   ? N_SYMBOLS
                    : len == 2 ? N_SYMBOLS * N_SYMBOLS
                               : N_SYMBOLS * N_SYMBOLS * N_SYMBOLS;
        for (int c = 0; c < count; c++, n++) {
            int x = c;
            for (int k = 0; k < len; k++, x /= N_SYMBOLS)
                tokens[n][k] = alpha[x % N_SYMBOLS];
            lens[n] = (uint32_t)len;
        }
    }
    for (int len = 0; len <= 3; len++)
        for (int c = 0; c < (1 << (2 * len)); c++, n++) {
            tokens[n][0] = 'x';
            for (int k = 0; k < len; k++)
                tokens[n][k + 1] = (uint8_t) "ab1 "[(c >> (2 * k)) & 3];
            lens[n] = (uint32_t)len + 1;
        }
    const uint8_t *bytes[N_SYNTH];
    for (int i = 0; i < N_SYNTH; i++)
        bytes[i] = tokens[i];
    int32_t eos = N_SYNTH;
    grammar_vocab *v = grammar_vocab_new(N_SYNTH + 1, bytes, lens, N_SYNTH, &eos, 1, NULL, 0);
    assert_non_null(v);
    return v;
}

static grammar *schema_grammar(const char *schema_json);

/* The mask (trie walk, cached states, subtrees taken whole) equals trying every token on a
 * fresh state fed the same output, along random walks through several grammars. */
static void test_mask_equals_brute_force(void **s) {
    (void)s;
    static uint8_t tokens[N_SYNTH][4];
    static uint32_t lens[N_SYNTH];
    grammar_vocab *v = synthetic_vocab(tokens, lens);
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":"
        "{\"type\":\"string\",\"maxLength\":4},\"ab\":{\"type\":\"integer\"}},"
        "\"required\":[\"a\",\"b\"]}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"ab\",\"a b\",1]}}",
    };
    unsigned rng = 12345;
    for (int k = 0; k < 6; k++) {
        grammar *g = schema_grammar(schemas[k % 3]);
        /* the second time round, the state tables start over inside every mask walk (a stale
         * state id once let a wrong mask through in the e2e test) */
        if (k >= 3) grammar_set_state_limit(g, 10);
        for (int walk = 0; walk < 6; walk++) {
            grammar_state *st = grammar_state_new(g);
            char trace[256] = "";
            for (int step = 0; step < 24; step++) {
                const uint64_t *m = grammar_state_mask(st, v);
                assert_non_null(m);
                static int allowed[N_SYNTH];
                int n_allowed = 0;
                for (int t = 0; t < N_SYNTH; t++) {
                    grammar_state *copy = grammar_state_new(g);
                    assert_int_equal(
                        grammar_state_advance(copy, (const uint8_t *)trace, strlen(trace)), 0);
                    int ok = grammar_state_advance(copy, tokens[t], lens[t]) == 0;
                    grammar_state_free(copy);
                    int bit = (int)((m[t >> 6] >> (t & 63)) & 1);
                    if (bit != ok)
                        fail_msg("schema %d after '%s': token '%.*s' mask %d, advance %d", k, trace,
                                 (int)lens[t], tokens[t], bit, ok);
                    if (ok) allowed[n_allowed++] = t;
                }
                if (!n_allowed) break;
                rng = rng * 1103515245u + 12345u;
                int t = allowed[(rng >> 8) % (unsigned)n_allowed];
                if (strlen(trace) + lens[t] >= sizeof trace) break;
                assert_int_equal(grammar_state_accept_token(st, v, t), 0);
                strncat(trace, (const char *)tokens[t], lens[t]);
            }
            grammar_state_free(st);
        }
        grammar_unref(g);
    }
    grammar_vocab_free(v);
}

static grammar *schema_grammar(const char *schema_json) {
    json_error_t je;
    json_t *schema = json_loads(schema_json, 0, &je);
    assert_non_null(schema);
    char err[256] = "";
    char *text = json_schema_to_grammar(schema, err, sizeof err);
    if (!text) fail_msg("schema refused: %s", err);
    grammar *g = compile(text);
    free(text);
    json_decref(schema);
    return g;
}

static void expect_schema_error(const char *schema_json, const char *message_part) {
    json_error_t je;
    json_t *schema = json_loads(schema_json, 0, &je);
    char err[256] = "";
    char *text = json_schema_to_grammar(schema, err, sizeof err);
    if (text) fail_msg("schema accepted: %s", schema_json);
    if (!strstr(err, message_part)) fail_msg("message '%s' lacks '%s'", err, message_part);
    json_decref(schema);
}

static void test_schema_objects(void **s) {
    (void)s;
    grammar *g = schema_grammar(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":3,"
        "\"maximum\":120},\"b\":{\"type\":\"string\",\"maxLength\":3},\"c\":{\"enum\":[\"x\",1,"
        "null]}},\"required\":[\"a\"],\"additionalProperties\":false}");
    assert_int_equal(match(g, "{\"a\":3}"), 1);
    assert_int_equal(match(g, "{\"a\":120, \"b\":\"abc\",\"c\":null}"), 1);
    assert_int_equal(match(g, "{\"a\":50,\"c\":1}"), 1);
    assert_int_equal(match(g, "{\"a\":2}"), -1);
    assert_int_equal(match(g, "{\"a\":121}"), -1);
    assert_int_equal(match(g, "{\"b\":\"x\"}"), -1); /* a is required */
    assert_int_equal(match(g, "{\"a\":4,\"b\":\"abcd\"}"), -1);
    assert_int_equal(match(g, "{\"a\":4,\"c\":\"y\"}"), -1);
    assert_int_equal(match(g, "{\"a\":4,\"d\":1}"), -1);
    grammar_unref(g);
    /* a map, and a recursive $ref */
    g = schema_grammar("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}");
    assert_int_equal(match(g, "{\"x\":true,\"y z\":false}"), 1);
    assert_int_equal(match(g, "{\"x\":1}"), -1);
    grammar_unref(g);
    g = schema_grammar("{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
                       "\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/n\"},{\"type\":"
                       "\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/n\"}");
    assert_int_equal(match(g, "{\"v\":1,\"next\":{\"v\":-2,\"next\":null}}"), 1);
    assert_int_equal(match(g, "{\"v\":1}"), -1);
    grammar_unref(g);
}

static void test_schema_values(void **s) {
    (void)s;
    grammar *g = schema_grammar("{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":"
                                "-2.5,\"maximum\":10},\"minItems\":1,\"maxItems\":2}");
    assert_int_equal(match(g, "[-2]"), 1);
    assert_int_equal(match(g, "[9.99, 10]"), 1);
    assert_int_equal(match(g, "[]"), -1);
    assert_int_equal(match(g, "[10.5]"), -1);
    assert_int_equal(match(g, "[-3]"), -1);
    assert_int_equal(match(g, "[1,2,3]"), -1);
    grammar_unref(g);
    g = schema_grammar("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"}");
    assert_int_equal(match(g, "\"AB-123\""), 1);
    assert_int_equal(match(g, "\"Ab-123\""), -1);
    grammar_unref(g);
    g = schema_grammar("{\"type\":\"string\",\"format\":\"date-time\"}");
    assert_int_equal(match(g, "\"2024-02-28T10:00:00Z\""), 1);
    assert_int_equal(match(g, "\"2024-04-31T10:00:00Z\""), -1); /* April has 30 days */
    grammar_unref(g);
    g = schema_grammar("{\"type\":\"integer\",\"minimum\":-1234,\"maximum\":-17}");
    assert_int_equal(match(g, "-17"), 1);
    assert_int_equal(match(g, "-1234"), 1);
    assert_int_equal(match(g, "-999"), 1);
    assert_int_equal(match(g, "-1235"), -1);
    assert_int_equal(match(g, "0"), -1);
    grammar_unref(g);
    g = schema_grammar("{\"anyOf\":[{\"const\":{\"k\":[1,2]}},{\"type\":[\"boolean\",\"null\"]}]}");
    assert_int_equal(match(g, "{\"k\":[1,2]}"), 1);
    assert_int_equal(match(g, "null"), 1);
    assert_int_equal(match(g, "true"), 1);
    assert_int_equal(match(g, "1"), -1);
    grammar_unref(g);
}

static void test_schema_errors(void **s) {
    (void)s;
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"array\","
                        "\"uniqueItems\":true}}}",
                        "'uniqueItems' at '#/properties/t'");
    expect_schema_error("{\"type\":\"number\",\"multipleOf\":2}", "'multipleOf'");
    expect_schema_error("{\"not\":{}}", "'not'");
    expect_schema_error("{\"type\":\"string\",\"format\":\"hostname\"}", "format 'hostname'");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookaround");
    expect_schema_error("{\"$ref\":\"http://x/y\"}", "only local refs");
    expect_schema_error("{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}}}",
                        "refers to itself");
    expect_schema_error("{\"type\":\"object\",\"anyOf\":[{}]}", "next to other keywords");
    expect_schema_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer");
    expect_schema_error("{\"type\":\"thing\"}", "unknown type 'thing'");
    /* fuzz: a pattern's {m,n} with n < m reached the grammar compiler */
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"^\\\\w{6,5}$\"}", "malformed {m,n}");
}

static void test_tool_call_grammar(void **s) {
    (void)s;
    json_error_t je;
    json_t *a = json_loads("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\","
                           "\"maxLength\":5}},\"required\":[\"city\"]}",
                           0, &je);
    const char *names[] = {"get_weather", "noop"};
    const json_t *schemas[] = {a, NULL};
    char err[256];
    char *text = json_schema_tool_call_grammar(names, schemas, 2, err, sizeof err);
    assert_non_null(text);
    grammar *g = compile(text);
    assert_int_equal(match(g, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}"), 1);
    assert_int_equal(match(g, "{\"name\": \"noop\", \"arguments\":{\"any\":[1]}}"), 1);
    assert_int_equal(match(g, "{\"name\":\"get_weather\",\"arguments\":{}}"), -1);
    assert_int_equal(match(g, "{\"name\":\"other\",\"arguments\":{}}"), -1);
    grammar_unref(g);
    free(text);
    json_decref(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_syntax),
        cmocka_unit_test(test_gbnf_errors),
        cmocka_unit_test(test_utf8_classes_byte_by_byte),
        cmocka_unit_test(test_token_mask),
        cmocka_unit_test(test_ambiguous_grammar_is_bounded),
        cmocka_unit_test(test_mask_equals_brute_force),
        cmocka_unit_test(test_schema_objects),
        cmocka_unit_test(test_schema_values),
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_tool_call_grammar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
