/* API adapters on streams a tiny random model cannot produce: reasoning, then text, then a
 * tool call, as the runner reports them. Each API must encode them in its own wire format
 * (Claude content blocks and stop_reason, OpenAI tool_call deltas with index, Responses items,
 * Ollama message.tool_calls), and the non-streamed bodies must agree with the streams. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "api/gen.h"

#include <string.h>

/* Runs body through adapter a with the runner messages below; returns the stream text and
 * (in *final) the non-streamed body. */
static char *run(const gen_adapter *a, const char *body_json, json_t **final) {
    json_t *body = json_loads(body_json, 0, NULL);
    assert_non_null(body);
    gen_state *st = gen_state_new(a, NULL);
    char err[256];
    assert_int_equal(a->parse(body, st, err, sizeof err), 0);
    json_decref(body);
    const char *msgs[] = {
        "{\"type\":\"accepted\",\"id\":1,\"prompt_tokens\":5}",
        "{\"type\":\"delta\",\"id\":1,\"reasoning\":\"let me think\",\"tokens\":1}",
        "{\"type\":\"delta\",\"id\":1,\"content\":\"Checking.\",\"tokens\":2}",
        "{\"type\":\"delta\",\"id\":1,\"tool_calls\":[{\"id\":\"call_7\",\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}],\"tokens\":3}",
        "{\"type\":\"done\",\"id\":1,\"finish_reason\":\"tool_calls\",\"usage\":{\"prompt_tokens\":5,"
        "\"completion_tokens\":3,\"cached_tokens\":0,\"reasoning_tokens\":1}}",
    };
    strbuf out = {0};
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        json_t *m = json_loads(msgs[i], 0, NULL);
        assert_non_null(m);
        gen_state_accumulate(st, m);
        const char *type = json_string_value(json_object_get(m, "type"));
        if (!strcmp(type, "accepted")) a->stream->begin(st, &out);
        if (!strcmp(type, "delta")) a->stream->delta(st, m, &out);
        if (!strcmp(type, "done")) a->stream->end(st, &out);
        json_decref(m);
    }
    *final = a->final(st);
    gen_state_release(st);
    return strbuf_detach(&out);
}

/* Asserts that the needles occur in text in this order. */
static void in_order(const char *text, const char *const *needles, int n) {
    const char *p = text;
    for (int i = 0; i < n; i++) {
        const char *q = strstr(p, needles[i]);
        if (!q) fail_msg("'%s' missing (or out of order) in:\n%s", needles[i], text);
        p = q + strlen(needles[i]);
    }
}

static void test_claude_blocks(void **state) {
    (void)state;
    json_t *final;
    char *s = run(&gen_adapter_claude,
                  "{\"model\":\"m\",\"max_tokens\":9,\"stream\":true,"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                  &final);
    const char *want[] = {
        "event: message_start",
        "\"content_block\":{\"type\":\"thinking\"",
        "\"type\":\"thinking_delta\",\"thinking\":\"let me think\"",
        "\"type\":\"content_block_stop\",\"index\":0",
        "\"index\":1,\"content_block\":{\"type\":\"text\"",
        "\"type\":\"text_delta\",\"text\":\"Checking.\"",
        "\"type\":\"content_block_stop\",\"index\":1",
        "\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_7\"",
        "\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\":\\\"Paris\\\"}\"",
        "\"type\":\"content_block_stop\",\"index\":2",
        "\"stop_reason\":\"tool_use\"",
        "event: message_stop",
    };
    in_order(s, want, (int)(sizeof want / sizeof want[0]));
    json_t *content = json_object_get(final, "content");
    assert_int_equal(json_array_size(content), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(content, 0), "type")),
                        "thinking");
    json_t *tool = json_array_get(content, 2);
    assert_string_equal(json_string_value(json_object_get(tool, "name")), "get_weather");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(tool, "input"), "city")), "Paris");
    assert_string_equal(json_string_value(json_object_get(final, "stop_reason")), "tool_use");
    json_decref(final);
    free(s);
}

static void test_openai_tool_call_deltas(void **state) {
    (void)state;
    json_t *final;
    char *s = run(&gen_adapter_openai_chat,
                  "{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                  &final);
    const char *want[] = {
        "\"delta\":{\"role\":\"assistant\"",
        "\"reasoning_content\":\"let me think\"",
        "\"content\":\"Checking.\"",
        ("\"tool_calls\":[{\"id\":\"call_7\",\"type\":\"function\",\"function\":{\"name\":"
         "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"},\"index\":0}]"),
        "\"finish_reason\":\"tool_calls\"",
        "\"reasoning_tokens\":1",
        "data: [DONE]",
    };
    in_order(s, want, (int)(sizeof want / sizeof want[0]));
    json_t *msg = json_object_get(json_array_get(json_object_get(final, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "Checking.");
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")),
                        "let me think");
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 1);
    json_decref(final);
    free(s);
}

static void test_responses_items(void **state) {
    (void)state;
    json_t *final;
    char *s = run(&gen_adapter_responses, "{\"model\":\"m\",\"stream\":true,\"input\":\"hi\"}",
                  &final);
    const char *want[] = {
        "event: response.created",
        "\"item\":{\"type\":\"reasoning\"",
        "event: response.reasoning_summary_text.delta",
        "event: response.output_item.done",
        "\"item\":{\"type\":\"message\"",
        "event: response.output_text.delta",
        "event: response.output_text.done",
        "\"item\":{\"type\":\"function_call\"",
        "event: response.function_call_arguments.done",
        "event: response.completed",
    };
    in_order(s, want, (int)(sizeof want / sizeof want[0]));
    /* sequence numbers count up from 0 without gaps */
    int expect = 0;
    for (const char *p = s; (p = strstr(p, "\"sequence_number\":")); p++) {
        assert_int_equal(atoi(p + 18), expect);
        expect++;
    }
    assert_true(expect > 10);
    json_t *out = json_object_get(final, "output");
    assert_int_equal(json_array_size(out), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(out, 2), "call_id")),
                        "call_7");
    assert_string_equal(json_string_value(json_object_get(final, "output_text")), "Checking.");
    json_decref(final);
    free(s);
}

static void test_ollama_tool_calls(void **state) {
    (void)state;
    json_t *final;
    char *s = run(&gen_adapter_ollama_chat,
                  "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &final);
    const char *want[] = {
        "\"thinking\":\"let me think\"",
        "\"content\":\"Checking.\"",
        "\"tool_calls\":[{\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]",
        "\"done\":true",
    };
    in_order(s, want, (int)(sizeof want / sizeof want[0]));
    /* NDJSON: every line is one JSON object */
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        assert_non_null(j);
        json_decref(j);
    }
    json_decref(final);
    free(s);
}

static void test_parse_errors_name_the_field(void **state) {
    (void)state;
    struct {
        const gen_adapter *a;
        const char *body, *field;
    } cases[] = {
        {&gen_adapter_openai_chat, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":\"a\"}", "top_p"},
        {&gen_adapter_openai_chat, "{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0].role"},
        {&gen_adapter_openai_chat, "{\"messages\":[]}", "model"},
        {&gen_adapter_claude, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens"},
        {&gen_adapter_claude, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]}", "messages[0].content[0].text"},
        {&gen_adapter_responses, "{\"model\":\"m\",\"input\":7}", "input"},
        {&gen_adapter_responses, "{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens"},
        {&gen_adapter_ollama_chat, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"options\":{\"temperature\":\"warm\"}}", "temperature"},
        {&gen_adapter_ollama_generate, "{\"model\":\"m\"}", "prompt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *body = json_loads(cases[i].body, 0, NULL);
        assert_non_null(body);
        gen_state *st = gen_state_new(cases[i].a, NULL);
        char err[256] = "";
        assert_int_equal(cases[i].a->parse(body, st, err, sizeof err), 400);
        if (!strstr(err, cases[i].field)) fail_msg("case %zu: '%s' does not name %s", i, err, cases[i].field);
        gen_state_release(st);
        json_decref(body);
    }
}

/* The per-token text frame of OpenAI chat streams is built from a template; it must be the
 * exact bytes jansson would produce for the same chunk, for any text the model can emit. */
static void test_openai_text_delta_template(void **state) {
    (void)state;
    const char *texts[] = {"plain", "", "quote \" backslash \\ slash / end",
                           "\n\t\r\b\f\x01\x1f\x7f", "h\xc3\xa9llo \xf0\x9f\x98\x80 \xe4\xb8\xad",
                           "</think>{\"a\": [1, 2]}"};
    json_t *body = json_loads("{\"model\":\"org/m\\\"q\",\"stream\":true,"
                              "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                              0, NULL);
    assert_non_null(body);
    gen_state *st = gen_state_new(&gen_adapter_openai_chat, NULL);
    char err[256];
    assert_int_equal(gen_adapter_openai_chat.parse(body, st, err, sizeof err), 0);
    json_decref(body);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        json_t *d = json_pack("{s:s,s:I,s:s,s:i}", "type", "delta", "id", (json_int_t)1,
                              "content", texts[i], "tokens", (int)i + 1);
        assert_non_null(d);
        strbuf out = {0};
        gen_adapter_openai_chat.stream->delta(st, d, &out);
        json_t *want = json_pack(
            "{s:s,s:s,s:I,s:s,s:s,s:[{s:i,s:{s:s},s:n,s:n}]}", "id", st->id, "object",
            "chat.completion.chunk", "created", (json_int_t)st->created, "model", st->req.model,
            "system_fingerprint", "exo", "choices", "index", 0, "delta", "content", texts[i],
            "finish_reason", "logprobs");
        char *text = json_dumps(want, JSON_COMPACT);
        strbuf expect = {0};
        strbuf_appendf(&expect, "data: %s\n\n", text);
        assert_string_equal(out.data, expect.data);
        free(text);
        json_decref(want);
        json_decref(d);
        strbuf_free(&out);
        strbuf_free(&expect);
    }
    /* every single byte below 0x80 escapes as jansson escapes it */
    for (int c = 1; c < 0x80; c++) {
        char one[2] = {(char)c, 0};
        strbuf a = {0};
        gen_json_string(&a, one, 1);
        json_t *j = json_string(one);
        char *b = json_dumps(j, JSON_ENCODE_ANY);
        assert_string_equal(a.data, b);
        free(b);
        json_decref(j);
        strbuf_free(&a);
    }
    gen_state_release(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_claude_blocks),
        cmocka_unit_test(test_openai_tool_call_deltas),
        cmocka_unit_test(test_responses_items),
        cmocka_unit_test(test_ollama_tool_calls),
        cmocka_unit_test(test_parse_errors_name_the_field),
        cmocka_unit_test(test_openai_text_delta_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
