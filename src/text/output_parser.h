/* output_parser — splits a model's generated text, as it streams, into what the APIs report
 * separately: visible content, reasoning ("thinking"), and tool calls.
 *
 * One parser per generation. Feed decoded text pieces in order; each call returns the
 * deltas that are now certain (text that might still become a tag is held back, so a tag split
 * at any byte is still recognised). Formats are chosen per model family:
 *   HERMES    reasoning `<think>...</think>` (starting inside the block when the prompt ended with
 *             the open tag); tool calls `<tool_call>BODY</tool_call>` where BODY is a JSON object
 *             (Qwen3, Hermes) or `<function=NAME><parameter=K>V</parameter></function>` (Qwen3.5,
 *             Qwen3-Coder)
 *   GLM       the same tags, bodies `NAME<arg_key>K</arg_key><arg_value>V</arg_value>` (GLM-4.5)
 *   DEEPSEEK  DeepSeek V3 / V3.1 `<｜tool▁calls▁begin｜>` sections, `<think>` blocks
 *   KIMI      Kimi K2 `<|tool_calls_section_begin|>` sections, `<think>` blocks
 *   HARMONY   gpt-oss channels: analysis -> reasoning, final -> content,
 *             commentary to=functions.NAME -> tool calls (see output_harmony.c)
 *   LLAMA3_JSON  Llama 3.1 JSON calls as the whole reply
 * Text values (XML, GLM) are typed by the tool's JSON schema (output_parser_set_tools). A
 * malformed tool call falls back to plain content: output is never lost. */
#ifndef EXO_TEXT_OUTPUT_PARSER_H
#define EXO_TEXT_OUTPUT_PARSER_H

#include <jansson.h>
#include <stddef.h>

typedef enum output_format {
    OUTPUT_FORMAT_PLAIN = 0,   /* no reasoning, no tool calls */
    OUTPUT_FORMAT_HERMES,      /* <think>, <tool_call>{"name","arguments"}</tool_call> (Qwen) */
    OUTPUT_FORMAT_LLAMA3_JSON, /* {"name": ..., "parameters": {...}} as the whole reply */
    OUTPUT_FORMAT_HARMONY,     /* gpt-oss */
    OUTPUT_FORMAT_DEEPSEEK,    /* DeepSeek V3, V3.1 */
    OUTPUT_FORMAT_KIMI,        /* Kimi K2 */
    OUTPUT_FORMAT_GLM,         /* GLM-4.5: HERMES tags, NAME<arg_key>..</arg_key><arg_value>.. bodies */
} output_format;

typedef struct output_parser output_parser;

typedef struct output_tool_call {
    char *name;      /* malloc'd */
    char *arguments; /* malloc'd, a valid JSON object serialized */
} output_tool_call;

typedef struct output_delta {
    char *content;   /* malloc'd or NULL: visible text that is now certain */
    char *reasoning; /* malloc'd or NULL */
    output_tool_call *tool_calls; /* malloc'd array or NULL; completed calls only */
    int n_tool_calls;
} output_delta;

/* Chooses the format from the model's architecture/chat template (e.g. Qwen -> HERMES). */
output_format output_format_detect(const char *architecture, const char *chat_template);
/* Whether the format's markup is made of special tokens, which the detokenizer must then keep
 * (Harmony's <|channel|>...): the parser removes them. */
int output_format_keeps_special_tokens(output_format format);
/* Special tokens that end the model's turn besides its eos (Harmony: <|call|> after a tool call),
 * as a NULL-terminated list of token texts; the caller makes them stop tokens. */
const char *const *output_format_stop_tokens(output_format format);
/* starts_in_reasoning: the prompt ended with the reasoning open tag. has_tools: tool calls are
 * only parsed when the request offered tools. */
output_parser *output_parser_new(output_format format, int starts_in_reasoning, int has_tools);
/* The request's tools (OpenAI shape, [{"type":"function","function":{name, parameters}}]): their
 * parameter schemas type the text values of XML and GLM calls. Keeps a reference. */
void output_parser_set_tools(output_parser *p, json_t *tools);
void output_parser_free(output_parser *p);
/* Feeds the next decoded text piece; fills *delta (free with output_delta_free). */
void output_parser_feed(output_parser *p, const char *text, size_t len, output_delta *delta);
/* End of generation: flushes everything held back. */
void output_parser_finish(output_parser *p, output_delta *delta);
void output_delta_free(output_delta *delta);

#endif
