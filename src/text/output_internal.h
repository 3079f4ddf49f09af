/* output_internal — what the output parser's files share (private to text/): the parser's state,
 * the builder of one delta, and the tool-call body parsers of each family (output_calls.c).
 * The Harmony state machine (gpt-oss) is in output_harmony.c; the tagged families (<think>,
 * <tool_call>, DeepSeek and Kimi sections) and the Llama 3.1 JSON form in output_parser.c. */
#ifndef EXO_TEXT_OUTPUT_INTERNAL_H
#define EXO_TEXT_OUTPUT_INTERNAL_H

#include "text/output_parser.h"

#include "base/strbuf.h"

#include <jansson.h>
#include <stdbool.h>

typedef struct delta_builder {
    strbuf content, reasoning;
    output_tool_call *calls;
    int n_calls, cap_calls;
} delta_builder;

/* The markup of a tagged family: reasoning block, tool-call section (either may be NULL). */
typedef struct tagged_syntax {
    const char *think_open, *think_close;
    const char *call_open, *call_close;
    const char *const *drop; /* end-of-turn markers dropped from content (NULL-terminated) */
} tagged_syntax;

enum parser_state { IN_CONTENT, IN_REASONING, IN_TOOL_CALL, IN_LLAMA_JSON, IN_HARMONY_HEADER, IN_HARMONY_BODY };

struct output_parser {
    output_format format;
    const tagged_syntax *syntax;
    bool has_tools;
    json_t *tools;        /* the request's tools (argument schemas), or NULL */
    enum parser_state state;
    strbuf pending;       /* text received but not yet emitted */
    bool strip_leading;   /* drop whitespace at the start of the next content (after </think>) */
    bool after_tool_call; /* whitespace after a tool call is held and dropped if nothing follows */
    bool seen_text;       /* any non-whitespace content emitted (for the Llama JSON decision) */
    /* Harmony: the message being read */
    int harmony_channel;  /* harmony_channel_kind of the current message */
    char *harmony_recipient; /* "functions.NAME" of a tool call, else NULL */
};

void delta_add_call(delta_builder *d, char *name, char *args);
/* Appends visible text, applying the parser's strip_leading / seen_text bookkeeping. */
void output_emit_content(output_parser *p, delta_builder *d, const char *s, size_t n);
/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
size_t output_partial_tag(const char *s, size_t n, const char *tag);
void output_consume(strbuf *b, size_t n);
bool output_is_ws(char c);

/* Compact JSON with the shortest round-trip form of each number. */
void output_write_json(strbuf *sb, const json_t *j);
/* {"name", "arguments"|"parameters": object or JSON string} -> a call; false if it is not one. */
bool output_parse_call_object(json_t *obj, delta_builder *d);
/* name + arguments (a JSON object's text) -> a call when args is an object; false otherwise. */
bool output_add_json_call(const char *name, size_t name_len, const char *args, size_t args_len, delta_builder *d);
/* The body of a <tool_call>...</tool_call>: a JSON object (Hermes, Qwen3) or
 * <function=NAME><parameter=K>V</parameter></function> (Qwen3.5, Qwen3-Coder); with glm, also
 * NAME<arg_key>K</arg_key><arg_value>V</arg_value> (GLM-4.5; NAME must be one of the tools when
 * they are known). Text values are coerced to the types the tool's schema declares. True when
 * the whole body became calls. */
bool output_parse_tagged_call(const char *body, size_t n, const json_t *tools, bool glm, delta_builder *d);
/* The inside of a DeepSeek V3 / V3.1 <｜tool▁calls▁begin｜> section, or of a Kimi K2
 * <|tool_calls_section_begin|> section. True when the whole section became calls. */
bool output_parse_deepseek_calls(const char *body, size_t n, delta_builder *d);
bool output_parse_kimi_calls(const char *body, size_t n, delta_builder *d);

/* Harmony (output_harmony.c): one step of the state machine over p->pending. */
void output_harmony_process(output_parser *p, delta_builder *d, bool final);

#endif
