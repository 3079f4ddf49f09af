/* Output parser: reasoning, Hermes and Llama 3.1 tool calls, malformed calls falling back to
 * text, and streaming — every text is also fed split at every byte position (and byte by byte)
 * and must give exactly the same content, reasoning and calls as when fed whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "output_check.h"

static void test_plain(void **st) {
    (void)st;
    check(OUTPUT_FORMAT_PLAIN, 0, 1, "Hello <think>x</think> <tool_call>{}</tool_call>",
          "Hello <think>x</think> <tool_call>{}</tool_call>", "", "");
    check(OUTPUT_FORMAT_HERMES, 0, 0, "Just text, with < and <b> and <thinking>.",
          "Just text, with < and <b> and <thinking>.", "", "");
}

static void test_reasoning(void **st) {
    (void)st;
    check(OUTPUT_FORMAT_HERMES, 0, 0, "<think>\nLet me see.\n</think>\n\nThe answer is 4.",
          "The answer is 4.", "\nLet me see.\n", "");
    /* the prompt ended with <think>: the reply starts inside the block */
    check(OUTPUT_FORMAT_HERMES, 1, 0, "step 1, step 2</think>Done.", "Done.", "step 1, step 2", "");
    /* never closed: everything is reasoning */
    check(OUTPUT_FORMAT_HERMES, 1, 0, "still thinking <", "", "still thinking <", "");
    /* a partial close tag that turns out not to be one */
    check(OUTPUT_FORMAT_HERMES, 1, 1, "a </thin b</think>ok", "ok", "a </thin b", "");
}

static void test_hermes_tool_calls(void **st) {
    (void)st;
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", "
          "\"days\": [1, 2]}}\n</tool_call>",
          "", "", "get_weather({\"city\":\"Zürich\",\"days\":[1,2]});");
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": "
          "{}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
          "\"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>\n",
          "Let me check.\n", "", "a({});b({\"x\":1});");
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "<think>plan</think>\n\n<tool_call>{\"name\":\"f\",\"parameters\":{\"q\":\"x\"}}</"
          "tool_call>",
          "", "plan", "f({\"q\":\"x\"});");
    /* numbers keep their shortest form, strings their escapes */
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "<tool_call>{\"name\": \"n\", \"arguments\": {\"x\": 0.1, \"y\": 3.0, \"z\": 1e300, "
          "\"s\": \"a\\\"b\\n\"}}</tool_call>",
          "", "", "n({\"x\":0.1,\"y\":3.0,\"z\":1e+300,\"s\":\"a\\\"b\\n\"});");
    /* Qwen3.5's XML form (its chat template's format): multi-line string values stay text, JSON
     * values (what the template writes with tojson) become JSON; a malformed one stays content */
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "<think>plan</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n"
          "</parameter>\n<parameter=days>\n[1, 2]\n</parameter>\n<parameter=note>\nline one\nline "
          "two\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>",
          "", "plan",
          "get_weather({\"city\":\"Zürich\",\"days\":[1,2],\"note\":\"line one\\nline two\",\"n\":3});");
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "<tool_call>\n<function=now>\n</function>\n</tool_call>\n<tool_call>\n<function=s>\n"
          "<parameter=q>\n\"quoted\"\n</parameter>\n</function>\n</tool_call>",
          "", "", "now({});s({\"q\":\"\\\"quoted\\\"\"});"); /* strings are written verbatim */
    check(OUTPUT_FORMAT_HERMES, 0, 1, "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
          "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>", "", "");
    /* a missing close tag at the end of generation still yields the call when the JSON is whole */
    check(OUTPUT_FORMAT_HERMES, 0, 1, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n",
          "", "", "f({\"a\":1});");
}

static void test_malformed_tool_calls(void **st) {
    (void)st;
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "<tool_call>{\"name\": \"f\", \"arguments\": {bad json}}</tool_call>",
          "<tool_call>{\"name\": \"f\", \"arguments\": {bad json}}</tool_call>", "", "");
    check(OUTPUT_FORMAT_HERMES, 0, 1, "<tool_call>{\"arguments\": {}}</tool_call> after",
          "<tool_call>{\"arguments\": {}}</tool_call> after", "", "");
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
          "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "", "");
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",
          "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>", "", "");
    check(OUTPUT_FORMAT_HERMES, 0, 1, "<tool_call>{\"name\": \"f\"", "<tool_call>{\"name\": \"f\"",
          "", "");
    /* one good call, one bad: the good one is a call, the bad one text */
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "<tool_call>{\"name\":\"g\",\"arguments\":{}}</tool_call><tool_call>oops</tool_call>",
          "<tool_call>oops</tool_call>", "", "g({});");
}

static void test_llama3_json(void **st) {
    (void)st;
    check(OUTPUT_FORMAT_LLAMA3_JSON, 0, 1,
          "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "",
          "get_weather({\"city\":\"Paris\"});");
    check(OUTPUT_FORMAT_LLAMA3_JSON, 0, 1,
          "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": "
          "{\"x\": 2}}",
          "", "", "a({});b({\"x\":2});");
    check(OUTPUT_FORMAT_LLAMA3_JSON, 0, 1, "  The weather is fine {really}.",
          "  The weather is fine {really}.", "", "");
    check(OUTPUT_FORMAT_LLAMA3_JSON, 0, 1, "{\"name\": \"f\", \"parameters\": oops",
          "{\"name\": \"f\", \"parameters\": oops", "", "");
    check(OUTPUT_FORMAT_LLAMA3_JSON, 0, 0, "{\"name\": \"f\", \"parameters\": {}}",
          "{\"name\": \"f\", \"parameters\": {}}", "", "");
}

static void test_holds_back_only_possible_tags(void **st) {
    (void)st;
    output_parser *p = output_parser_new(OUTPUT_FORMAT_HERMES, 0, 1);
    output_delta d;
    output_parser_feed(p, "Hello <too", 10, &d);
    assert_string_equal(d.content, "Hello ");
    output_delta_free(&d);
    output_parser_feed(p, "ls> x", 5, &d);
    assert_string_equal(d.content, "<tools> x");
    output_delta_free(&d);
    output_parser_feed(p, "<", 1, &d);
    assert_null(d.content);
    output_delta_free(&d);
    output_parser_finish(p, &d);
    assert_string_equal(d.content, "<");
    output_delta_free(&d);
    output_parser_free(p);
}

static void test_detect(void **st) {
    (void)st;
    assert_int_equal(output_format_detect("Qwen3ForCausalLM", NULL), OUTPUT_FORMAT_HERMES);
    assert_int_equal(output_format_detect("LlamaForCausalLM", "{{ '<tool_call>' }}"),
                     OUTPUT_FORMAT_HERMES);
    assert_int_equal(
        output_format_detect("LlamaForCausalLM", "<|start_header_id|>ipython<|python_tag|>"),
        OUTPUT_FORMAT_LLAMA3_JSON);
    assert_int_equal(output_format_detect("Gemma3ForCausalLM", "<start_of_turn>"),
                     OUTPUT_FORMAT_PLAIN);
    assert_int_equal(output_format_detect(NULL, NULL), OUTPUT_FORMAT_PLAIN);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_reasoning),
        cmocka_unit_test(test_hermes_tool_calls),
        cmocka_unit_test(test_malformed_tool_calls),
        cmocka_unit_test(test_llama3_json),
        cmocka_unit_test(test_holds_back_only_possible_tags),
        cmocka_unit_test(test_detect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
