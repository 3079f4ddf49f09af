/* output_parser — splits a model's generated text, as it streams, into what the APIs report
 * separately: visible content, reasoning ("thinking"), and tool calls.
 *
 * One parser per generation. Feed decoded text pieces in order; each call returns the
 * deltas that are now certain (text that might still become a tag is held back). Formats are
 * chosen per model family: reasoning `<think>...</think>` (starting inside the block when the
 * prompt ended with the open tag); tool calls in Qwen/Hermes `<tool_call>{json}</tool_call>`
 * (or, Qwen3.5 / Qwen3-Coder, `<tool_call><function=NAME><parameter=P>VALUE</parameter>...
 * </function></tool_call>`: values that are JSON non-strings become JSON, others stay text) and
 * Llama 3.1 JSON form; the interface takes gpt-oss Harmony, DeepSeek, GLM and Kimi later.
 * A malformed tool call falls back to plain content. */
#ifndef EXO_TEXT_OUTPUT_PARSER_H
#define EXO_TEXT_OUTPUT_PARSER_H

#include <stddef.h>

typedef enum output_format {
    OUTPUT_FORMAT_PLAIN = 0,   /* no reasoning, no tool calls */
    OUTPUT_FORMAT_HERMES,      /* <think>, <tool_call>{"name","arguments"}</tool_call> or the
                                  XML form inside it (Qwen) */
    OUTPUT_FORMAT_LLAMA3_JSON, /* {"name": ..., "parameters": {...}} as the whole reply */
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
/* starts_in_reasoning: the prompt ended with the reasoning open tag. has_tools: tool calls are
 * only parsed when the request offered tools. */
output_parser *output_parser_new(output_format format, int starts_in_reasoning, int has_tools);
void output_parser_free(output_parser *p);
/* Feeds the next decoded text piece; fills *delta (free with output_delta_free). */
void output_parser_feed(output_parser *p, const char *text, size_t len, output_delta *delta);
/* End of generation: flushes everything held back. */
void output_parser_finish(output_parser *p, output_delta *delta);
void output_delta_free(output_delta *delta);

#endif
