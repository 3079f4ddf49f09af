/* Output parsers of every chat family against the text its own template renders: each
 * publisher's template (tests/fixtures/templates/published/) renders a conversation whose last
 * assistant turn holds a tool call, reasoning or an answer; what it adds after the generation
 * prompt is what the model would write, and the parser of the family must give back the same
 * call (arguments typed as the tool's schema says), reasoning and content — whole, split at every
 * byte, and byte by byte. Then the details each format has beyond its template: Harmony headers
 * in every order, <|constrain|>, preambles, and malformed calls that must stay text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "output_check.h"

#include "base/paths.h"
#include "text/chat.h"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather in a city.\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":"
    "{\"type\":\"integer\"},\"metric\":{\"type\":\"boolean\"}},\"required\":[\"city\"]}}}]";
static const char USER[] = "{\"role\":\"user\",\"content\":\"What is the weather in Paris?\"}";

typedef struct family {
    const char *name;       /* tests/fixtures/templates/published/<name>.jinja */
    output_format format;
    int string_arguments;   /* the template concatenates arguments: give them as JSON text */
    const char *reasoning_key; /* where the template reads an assistant turn's reasoning, or NULL */
    int null_content;       /* a calling turn has content null (DeepSeek V3 renders calls only then);
                               else "" (gpt-oss and GLM would test or print a null) */
} family;

static const family FAMILIES[] = {
    {"gpt-oss", OUTPUT_FORMAT_HARMONY, 0, "thinking", 0},
    {"qwen3", OUTPUT_FORMAT_HERMES, 0, "reasoning_content", 0},
    {"qwen3-initial-release", OUTPUT_FORMAT_HERMES, 0, "reasoning_content", 0},
    {"qwen3-next", OUTPUT_FORMAT_HERMES, 0, NULL, 0},
    {"qwen3-next-thinking", OUTPUT_FORMAT_HERMES, 0, "reasoning_content", 0},
    {"qwen3.5", OUTPUT_FORMAT_HERMES, 0, "reasoning_content", 0},
    {"glm-4.5", OUTPUT_FORMAT_GLM, 0, "reasoning_content", 0},
    {"deepseek-v3", OUTPUT_FORMAT_DEEPSEEK, 1, NULL, 1},
    {"deepseek-v3.1", OUTPUT_FORMAT_DEEPSEEK, 1, NULL, 1},
};

typedef struct rendered {
    char *output;  /* what the template adds after the generation prompt, eos removed */
    int in_think;  /* the generation prompt ended with <think> */
} rendered;

static char *render(const family *f, json_t *messages, int add_generation_prompt) {
    char path[256], err[512];
    snprintf(path, sizeof path, "tests/fixtures/templates/published/%s.json", f->name);
    json_t *fx = json_load_file(path, 0, NULL);
    assert_non_null(fx);
    setenv("SOURCE_DATE_EPOCH", "1768435200", 1);
    chat_template *t = chat_template_compile(json_string_value(json_object_get(fx, "template")), err, sizeof err);
    if (!t) fail_msg("%s: %s", f->name, err);
    json_t *tools = json_loads(TOOLS, 0, NULL);
    chat_render_options o = {.add_generation_prompt = add_generation_prompt, .enable_thinking = -1,
                             .bos_token = json_string_value(json_object_get(fx, "bos_token")),
                             .eos_token = json_string_value(json_object_get(fx, "eos_token"))};
    char *text = chat_template_render(t, messages, tools, &o, err, sizeof err);
    if (!text) fail_msg("%s: %s", f->name, err);
    /* what the model ends its turn with is its eos: a stop token, not text the parser sees */
    const char *eos = o.eos_token;
    size_t n = strlen(text);
    while (n && strchr(" \n", text[n - 1])) n--;
    if (eos && !add_generation_prompt && n >= strlen(eos) && !memcmp(text + n - strlen(eos), eos, strlen(eos)))
        n -= strlen(eos);
    text[n] = 0;
    chat_template_free(t);
    json_decref(tools);
    json_decref(fx);
    unsetenv("SOURCE_DATE_EPOCH");
    return text;
}

/* The assistant turn `assistant` (JSON) as the model would write it after the prompt. */
static rendered model_output(const family *f, const char *assistant) {
    char conv[2048];
    snprintf(conv, sizeof conv, "[%s]", USER);
    json_t *prompt_msgs = json_loads(conv, 0, NULL);
    snprintf(conv, sizeof conv, "[%s,%s]", USER, assistant);
    json_t *full_msgs = json_loads(conv, 0, NULL);
    assert_non_null(full_msgs);
    char *prompt = render(f, prompt_msgs, 1), *full = render(f, full_msgs, 0);
    size_t k = 0; /* the generation prompt is a prefix of the rendered turn up to its open tags */
    while (prompt[k] && prompt[k] == full[k]) k++;
    rendered r = {.output = strdup(full + k)};
    size_t e = k;
    while (e && strchr(" \n", prompt[e - 1])) e--;
    r.in_think = e >= 7 && !memcmp(prompt + e - 7, "<think>", 7);
    free(prompt);
    free(full);
    json_decref(prompt_msgs);
    json_decref(full_msgs);
    return r;
}

static void tool_call_turn(const family *f, const char *reasoning, char *out, size_t n) {
    const char *args = f->string_arguments ? "\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 3}\""
                                           : "{\"city\": \"Paris\", \"days\": 3}";
    char extra[256] = "";
    if (reasoning && f->reasoning_key) snprintf(extra, sizeof extra, ",\"%s\":\"%s\"", f->reasoning_key, reasoning);
    snprintf(out, n,
             "{\"role\":\"assistant\",\"content\":%s%s,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
             "\"function\":{\"name\":\"get_weather\",\"arguments\":%s}}]}",
             f->null_content ? "null" : "\"\"", extra, args);
}

static void roundtrip(const family *f, const char *assistant, const char *content, const char *reasoning,
                      const char *calls) {
    rendered r = model_output(f, assistant);
    print_message("%-22s %s\n", f->name, r.output);
    check_tools = json_loads(TOOLS, 0, NULL);
    check_text(f->format, r.in_think, 1, r.output, content, reasoning, calls, 1);
    json_decref(check_tools);
    check_tools = NULL;
    free(r.output);
}

static const char CALL[] = "get_weather({\"city\":\"Paris\",\"days\":3});";

/* every family's own rendering of a tool call comes back as that call */
static void test_template_tool_calls(void **st) {
    (void)st;
    char turn[1024];
    for (size_t i = 0; i < sizeof FAMILIES / sizeof *FAMILIES; i++) {
        tool_call_turn(&FAMILIES[i], NULL, turn, sizeof turn);
        roundtrip(&FAMILIES[i], turn, "", "", CALL);
    }
}

/* reasoning rendered before a tool call (templates that render it in the turn that calls) */
static void test_template_reasoning_then_call(void **st) {
    (void)st;
    char turn[1024];
    const char *with_reasoning[] = {"gpt-oss", "qwen3", "qwen3.5", "glm-4.5", "qwen3-next-thinking"};
    for (size_t i = 0; i < sizeof FAMILIES / sizeof *FAMILIES; i++)
        for (size_t j = 0; j < sizeof with_reasoning / sizeof *with_reasoning; j++) {
            if (strcmp(FAMILIES[i].name, with_reasoning[j])) continue;
            tool_call_turn(&FAMILIES[i], "I need the weather tool.", turn, sizeof turn);
            roundtrip(&FAMILIES[i], turn, "", "I need the weather tool.", CALL);
        }
}

/* a final answer, with its reasoning where the template renders it in the last turn */
static void test_template_answers(void **st) {
    (void)st;
    char turn[512];
    for (size_t i = 0; i < sizeof FAMILIES / sizeof *FAMILIES; i++) {
        const family *f = &FAMILIES[i];
        int deepseek = f->format == OUTPUT_FORMAT_DEEPSEEK;
        if (f->reasoning_key && !deepseek)
            snprintf(turn, sizeof turn, "{\"role\":\"assistant\",\"content\":\"It is sunny.\",\"%s\":\"Easy.\"}",
                     f->reasoning_key);
        else
            snprintf(turn, sizeof turn, "{\"role\":\"assistant\",\"content\":\"It is sunny.\"}");
        roundtrip(f, turn, "It is sunny.", f->reasoning_key && !deepseek ? "Easy." : "", "");
    }
}

/* Harmony beyond its template: the recipient after the channel (as gpt-oss often writes it),
 * <|constrain|>json, a commentary preamble shown to the user, several calls, a call without
 * tools offered, and bodies that are not JSON objects */
static void test_harmony(void **st) {
    (void)st;
    check(OUTPUT_FORMAT_HARMONY, 0, 1,
          "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
          "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>",
          "", "Need weather.", "get_weather({\"city\":\"Oslo\"});");
    check(OUTPUT_FORMAT_HARMONY, 0, 1,
          "<|channel|>commentary<|message|>Checking two cities.<|end|><|start|>assistant to=functions.a"
          "<|channel|>commentary json<|message|>{}<|call|><|start|>assistant to=functions.b<|channel|>"
          "commentary json<|message|>{\"x\": [1, 2.5]}<|call|>",
          "Checking two cities.", "", "a({});b({\"x\":[1,2.5]});");
    check(OUTPUT_FORMAT_HARMONY, 0, 1,
          "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done <|x|>.<|return|>",
          "Done <|x|>.", "Think.", "");
    /* no tools offered: the call's body is text */
    check(OUTPUT_FORMAT_HARMONY, 0, 0,
          "<|channel|>commentary to=functions.f json<|message|>{\"a\":1}<|call|>", "{\"a\":1}", "", "");
    /* not a JSON object: shown as text, nothing lost */
    check(OUTPUT_FORMAT_HARMONY, 0, 1,
          "<|channel|>commentary to=functions.f json<|message|>{\"a\":<|call|>", "{\"a\":", "", "");
    check(OUTPUT_FORMAT_HARMONY, 0, 1, "<|channel|>commentary to=functions.f json<|message|>[1]", "[1]", "", "");
    /* cut off mid-reasoning, and a model that writes no Harmony at all */
    check(OUTPUT_FORMAT_HARMONY, 0, 1, "<|channel|>analysis<|message|>Half a tho", "", "Half a tho", "");
    check(OUTPUT_FORMAT_HARMONY, 0, 1, "plain words", "plain words", "", "");
}

/* text values become the types the tool's schema declares; undeclared ones stay what they read */
static void test_typed_arguments(void **st) {
    (void)st;
    check_tools = json_loads(TOOLS, 0, NULL);
    check(OUTPUT_FORMAT_GLM, 0, 1,
          "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>42</arg_value>\n<arg_key>days</arg_key>\n"
          "<arg_value>3</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n</tool_call>",
          "", "", "get_weather({\"city\":\"42\",\"days\":3,\"metric\":true});");
    check(OUTPUT_FORMAT_HERMES, 0, 1,
          "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n<parameter=metric>\nTrue\n"
          "</parameter>\n<parameter=extra>\n{\"a\": 1}\n</parameter>\n</function>\n</tool_call>",
          "", "", "get_weather({\"city\":\"New\\nYork\",\"metric\":true,\"extra\":{\"a\":1}});");
    /* a GLM name that is not one of the tools is not a call */
    check(OUTPUT_FORMAT_GLM, 0, 1, "<tool_call>nope\n</tool_call>", "<tool_call>nope\n</tool_call>", "", "");
    json_decref(check_tools);
    check_tools = NULL;
}

/* DeepSeek and Kimi sections: several calls, and broken ones kept as text */
static void test_sections(void **st) {
    (void)st;
    check(OUTPUT_FORMAT_DEEPSEEK, 0, 1,
          "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"x\":1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>"
          "b<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
          "Sure.", "", "a({\"x\":1});b({});");
    check(OUTPUT_FORMAT_DEEPSEEK, 0, 1,
          "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{bad<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
          "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{bad<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "",
          "");
    /* Kimi K2, as its template renders a call */
    check(OUTPUT_FORMAT_KIMI, 0, 1,
          "<think>hm</think>Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
          "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
          "Let me look.", "hm", "get_weather({\"city\":\"Paris\"});");
}

static void test_detect_families(void **st) {
    (void)st;
    assert_int_equal(output_format_detect("GptOssForCausalLM", NULL), OUTPUT_FORMAT_HARMONY);
    assert_int_equal(output_format_detect("X", "{{ '<|start|>assistant<|channel|>final' }}"), OUTPUT_FORMAT_HARMONY);
    assert_int_equal(output_format_detect("X", "<｜tool▁calls▁begin｜>"), OUTPUT_FORMAT_DEEPSEEK);
    assert_int_equal(output_format_detect("X", "<tool_call>{{ n }}<arg_key>"), OUTPUT_FORMAT_GLM);
    assert_int_equal(output_format_detect("X", "<|tool_calls_section_begin|>"), OUTPUT_FORMAT_KIMI);
    assert_true(output_format_keeps_special_tokens(OUTPUT_FORMAT_HARMONY));
    assert_false(output_format_keeps_special_tokens(OUTPUT_FORMAT_HERMES));
    assert_string_equal(output_format_stop_tokens(OUTPUT_FORMAT_HARMONY)[0], "<|call|>");
    assert_null(output_format_stop_tokens(OUTPUT_FORMAT_HERMES)[0]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_template_tool_calls),  cmocka_unit_test(test_template_reasoning_then_call),
        cmocka_unit_test(test_template_answers),     cmocka_unit_test(test_harmony),
        cmocka_unit_test(test_typed_arguments),      cmocka_unit_test(test_sections),
        cmocka_unit_test(test_detect_families),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
