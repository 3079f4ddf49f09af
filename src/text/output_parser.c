/* output_parser — splits streamed model text into content, reasoning and tool calls.
 *
 * Tagged families (HERMES, DEEPSEEK, KIMI): a small state machine over a buffer of text not yet
 * certain: in content it looks for the family's reasoning open tag, its tool-call open tag (when
 * tools were offered) and its end-of-turn markers; in reasoning for the close tag; in a tool call
 * for the close tag, then hands the body to the family's parser (output_calls.c). Text that could
 * still be the start of a tag is held back until the next piece decides it. A tool call is
 * accepted only when its whole body parses; otherwise the raw text goes out as content.
 * Llama 3.1 JSON calls are recognised when the reply starts with '{' (or <|python_tag|>): the
 * reply is held to the end and becomes tool calls only if it parses. Harmony: output_harmony.c.
 * Refuses: nothing; it never fails, malformed input just stays text. */
#include "text/output_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char THINK_OPEN[] = "<think>";
static const char TOOL_OPEN[] = "<tool_call>";
static const char PYTHON_TAG[] = "<|python_tag|>";

#define DS_BAR "\xef\xbd\x9c"   /* U+FF5C FULLWIDTH VERTICAL LINE */
#define DS_SP "\xe2\x96\x81"    /* U+2581 LOWER ONE EIGHTH BLOCK */
static const char *const DEEPSEEK_DROP[] = {"<" DS_BAR "end" DS_SP "of" DS_SP "sentence" DS_BAR ">", NULL};
static const char *const KIMI_DROP[] = {"<|im_end|>", NULL};

static const tagged_syntax HERMES_SYNTAX = {"<think>", "</think>", "<tool_call>", "</tool_call>", NULL};
static const tagged_syntax DEEPSEEK_SYNTAX = {"<think>", "</think>", "<" DS_BAR "tool" DS_SP "calls" DS_SP "begin" DS_BAR ">",
                                              "<" DS_BAR "tool" DS_SP "calls" DS_SP "end" DS_BAR ">", DEEPSEEK_DROP};
static const tagged_syntax KIMI_SYNTAX = {"<think>", "</think>", "<|tool_calls_section_begin|>",
                                          "<|tool_calls_section_end|>", KIMI_DROP};

static bool parse_section(const output_parser *p, const char *body, size_t n, delta_builder *d) {
    switch (p->format) {
    case OUTPUT_FORMAT_DEEPSEEK: return output_parse_deepseek_calls(body, n, d);
    case OUTPUT_FORMAT_KIMI: return output_parse_kimi_calls(body, n, d);
    default: return output_parse_tagged_call(body, n, p->tools, p->format == OUTPUT_FORMAT_GLM, d);
    }
}

output_format output_format_detect(const char *architecture, const char *chat_template) {
    if ((architecture && strstr(architecture, "GptOss")) || (chat_template && strstr(chat_template, "<|channel|>")))
        return OUTPUT_FORMAT_HARMONY;
    if (chat_template && strstr(chat_template, "tool" DS_SP "calls" DS_SP "begin")) return OUTPUT_FORMAT_DEEPSEEK;
    if (chat_template && strstr(chat_template, "<|tool_calls_section_begin|>")) return OUTPUT_FORMAT_KIMI;
    if (chat_template && strstr(chat_template, "<arg_key>")) return OUTPUT_FORMAT_GLM;
    if (chat_template && (strstr(chat_template, TOOL_OPEN) || strstr(chat_template, THINK_OPEN)))
        return OUTPUT_FORMAT_HERMES;
    if (architecture && (strstr(architecture, "Qwen") || strstr(architecture, "qwen")))
        return OUTPUT_FORMAT_HERMES;
    if (chat_template &&
        (strstr(chat_template, PYTHON_TAG) || strstr(chat_template, "<|eom_id|>") ||
         (strstr(chat_template, "<|start_header_id|>") && strstr(chat_template, "tools"))))
        return OUTPUT_FORMAT_LLAMA3_JSON;
    return OUTPUT_FORMAT_PLAIN;
}

int output_format_keeps_special_tokens(output_format format) {
    return format == OUTPUT_FORMAT_HARMONY || format == OUTPUT_FORMAT_KIMI;
}

const char *const *output_format_stop_tokens(output_format format) {
    static const char *const harmony[] = {"<|call|>", "<|return|>", NULL};
    static const char *const none[] = {NULL};
    return format == OUTPUT_FORMAT_HARMONY ? harmony : none;
}

output_parser *output_parser_new(output_format format, int starts_in_reasoning, int has_tools) {
    output_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->format = format;
    p->has_tools = has_tools != 0;
    p->syntax = format == OUTPUT_FORMAT_HERMES || format == OUTPUT_FORMAT_GLM ? &HERMES_SYNTAX
                : format == OUTPUT_FORMAT_DEEPSEEK ? &DEEPSEEK_SYNTAX
                : format == OUTPUT_FORMAT_KIMI     ? &KIMI_SYNTAX
                                                   : NULL;
    p->state = starts_in_reasoning && p->syntax ? IN_REASONING : IN_CONTENT;
    if (format == OUTPUT_FORMAT_HARMONY) p->state = IN_HARMONY_HEADER; /* prompt ends "<|start|>assistant" */
    return p;
}

void output_parser_set_tools(output_parser *p, json_t *tools) {
    if (!p) return;
    json_decref(p->tools);
    p->tools = json_incref(tools);
}

void output_parser_free(output_parser *p) {
    if (!p) return;
    strbuf_free(&p->pending);
    json_decref(p->tools);
    free(p->harmony_recipient);
    free(p);
}

bool output_is_ws(char c) {
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

size_t output_partial_tag(const char *s, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    size_t k = n < tl - 1 ? n : tl - 1;
    for (; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

void output_emit_content(output_parser *p, delta_builder *d, const char *s, size_t n) {
    if (p->strip_leading) {
        while (n && output_is_ws(*s))
            s++, n--;
        if (!n) return;
        p->strip_leading = false;
    }
    if (!n) return;
    for (size_t i = 0; i < n; i++)
        if (!output_is_ws(s[i])) p->seen_text = true;
    strbuf_append(&d->content, s, n);
}

void delta_add_call(delta_builder *d, char *name, char *args) {
    if (d->n_calls == d->cap_calls) {
        int cap = d->cap_calls ? d->cap_calls * 2 : 4;
        output_tool_call *nc = realloc(d->calls, (size_t)cap * sizeof *nc);
        if (!nc) {
            free(name);
            free(args);
            return;
        }
        d->calls = nc;
        d->cap_calls = cap;
    }
    d->calls[d->n_calls].name = name;
    d->calls[d->n_calls].arguments = args;
    d->n_calls++;
}

/* the whole Llama reply: one object, or several separated by ';' or newlines, optional python_tag
 */
static bool parse_llama_calls(const char *s, size_t n, delta_builder *d) {
    size_t pl = strlen(PYTHON_TAG);
    while (n && output_is_ws(*s))
        s++, n--;
    if (n >= pl && memcmp(s, PYTHON_TAG, pl) == 0) s += pl, n -= pl;
    delta_builder tmp = {0};
    size_t i = 0;
    bool any = false;
    while (i < n) {
        while (i < n && (output_is_ws(s[i]) || s[i] == ';'))
            i++;
        if (i >= n) break;
        json_error_t je;
        json_t *obj = json_loadb(s + i, n - i, JSON_DISABLE_EOF_CHECK, &je);
        if (!obj || !output_parse_call_object(obj, &tmp)) {
            json_decref(obj);
            any = false;
            break;
        }
        json_decref(obj);
        any = true;
        i += je.position;
    }
    if (any)
        for (int k = 0; k < tmp.n_calls; k++)
            delta_add_call(d, tmp.calls[k].name, tmp.calls[k].arguments);
    else
        for (int k = 0; k < tmp.n_calls; k++)
            free(tmp.calls[k].name), free(tmp.calls[k].arguments);
    free(tmp.calls);
    return any;
}

void output_consume(strbuf *b, size_t n) {
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

/* The first tag of the content state in s[0..n): reasoning open, tool-call open (with tools),
 * or an end-of-turn marker to drop. *kind: 0 think, 1 call, 2 drop; *len its length. */
static const char *first_content_tag(const output_parser *p, const char *s, size_t n, int *kind, size_t *len) {
    const tagged_syntax *x = p->syntax;
    const char *best = NULL;
    const char *tags[2] = {x->think_open, p->has_tools ? x->call_open : NULL};
    for (int k = 0; k < 2; k++) {
        const char *hit = tags[k] ? memmem(s, n, tags[k], strlen(tags[k])) : NULL;
        if (hit && (!best || hit < best)) best = hit, *kind = k, *len = strlen(tags[k]);
    }
    for (int i = 0; x->drop && x->drop[i]; i++) {
        const char *hit = memmem(s, n, x->drop[i], strlen(x->drop[i]));
        if (hit && (!best || hit < best)) best = hit, *kind = 2, *len = strlen(x->drop[i]);
    }
    return best;
}

static size_t content_hold(const output_parser *p, const char *s, size_t n) {
    const tagged_syntax *x = p->syntax;
    size_t hold = output_partial_tag(s, n, x->think_open);
    if (p->has_tools) {
        size_t h = output_partial_tag(s, n, x->call_open);
        if (h > hold) hold = h;
    }
    for (int i = 0; x->drop && x->drop[i]; i++) {
        size_t h = output_partial_tag(s, n, x->drop[i]);
        if (h > hold) hold = h;
    }
    return hold;
}

/* Content of a tagged family. Returns true to loop again (state changed), false when done. */
static bool tagged_content(output_parser *p, delta_builder *d, bool final) {
    strbuf *b = &p->pending;
    const char *s = b->data;
    size_t n = b->len, tag_len = 0;
    int kind = 0;
    const char *hit = first_content_tag(p, s, n, &kind, &tag_len);
    if (hit) {
        size_t before = (size_t)(hit - s);
        bool all_ws = true;
        for (size_t i = 0; i < before; i++)
            if (!output_is_ws(s[i])) all_ws = false;
        /* whitespace between consecutive tool calls is the template's, not content */
        if (!(kind == 1 && p->after_tool_call && all_ws)) output_emit_content(p, d, s, before);
        if (kind != 1 || before) p->after_tool_call = false;
        output_consume(b, before + tag_len);
        if (kind != 2) p->state = kind == 1 ? IN_TOOL_CALL : IN_REASONING;
        return true;
    }
    size_t hold = final ? 0 : content_hold(p, s, n);
    if (p->after_tool_call) {
        size_t i = 0;
        while (i < n - hold && output_is_ws(s[i]))
            i++;
        if (i == n - hold) {
            if (final) output_consume(b, n); /* trailing whitespace after tool calls is dropped */
            return false;                    /* still only whitespace: keep holding it */
        }
        p->after_tool_call = false;
    }
    output_emit_content(p, d, s, n - hold);
    output_consume(b, n - hold);
    return false;
}

static void process(output_parser *p, delta_builder *d, bool final) {
    if (p->format == OUTPUT_FORMAT_HARMONY) {
        output_harmony_process(p, d, final);
        return;
    }
    strbuf *b = &p->pending;
    for (;;) {
        if (!b->len) return;
        const char *s = b->data;
        size_t n = b->len;
        if (p->state == IN_REASONING) {
            const char *close = p->syntax->think_close;
            const char *hit = memmem(s, n, close, strlen(close));
            if (hit) {
                strbuf_append(&d->reasoning, s, (size_t)(hit - s));
                output_consume(b, (size_t)(hit - s) + strlen(close));
                p->state = IN_CONTENT;
                p->strip_leading = true;
                continue;
            }
            size_t hold = final ? 0 : output_partial_tag(s, n, close);
            strbuf_append(&d->reasoning, s, n - hold);
            output_consume(b, n - hold);
            return;
        }
        if (p->state == IN_TOOL_CALL) {
            const char *close = p->syntax->call_close;
            const char *hit = memmem(s, n, close, strlen(close));
            if (!hit && !final) return;
            size_t body = hit ? (size_t)(hit - s) : n;
            if (parse_section(p, s, body, d)) {
                p->after_tool_call = true;
            } else {
                output_emit_content(p, d, p->syntax->call_open, strlen(p->syntax->call_open));
                output_emit_content(p, d, s, hit ? body + strlen(close) : n);
            }
            output_consume(b, hit ? body + strlen(close) : n);
            p->state = IN_CONTENT;
            continue;
        }
        if (p->state == IN_LLAMA_JSON) {
            if (!final) return;
            if (!parse_llama_calls(s, n, d)) output_emit_content(p, d, s, n);
            output_consume(b, n);
            p->state = IN_CONTENT;
            return;
        }
        /* IN_CONTENT */
        if (p->format == OUTPUT_FORMAT_PLAIN) {
            output_emit_content(p, d, s, n);
            output_consume(b, n);
            return;
        }
        if (p->format == OUTPUT_FORMAT_LLAMA3_JSON) {
            if (p->has_tools && !p->seen_text) {
                size_t i = 0, tl = strlen(PYTHON_TAG);
                while (i < n && output_is_ws(s[i]))
                    i++;
                if (i == n && !final) return; /* only whitespace so far: undecided */
                const char *rest = s + i;
                size_t m = n - i;
                if (m && (rest[0] == '{' || (m >= tl && !memcmp(rest, PYTHON_TAG, tl)))) {
                    p->state = IN_LLAMA_JSON;
                    continue;
                }
                if (m && m < tl && !memcmp(rest, PYTHON_TAG, m) && !final)
                    return; /* maybe the tag */
            }
            output_emit_content(p, d, s, n);
            output_consume(b, n);
            return;
        }
        if (!tagged_content(p, d, final)) return;
    }
}

static void finish_delta(delta_builder *d, output_delta *out) {
    out->content = d->content.len ? strbuf_detach(&d->content) : NULL;
    out->reasoning = d->reasoning.len ? strbuf_detach(&d->reasoning) : NULL;
    strbuf_free(&d->content);
    strbuf_free(&d->reasoning);
    out->tool_calls = d->n_calls ? d->calls : NULL;
    out->n_tool_calls = d->n_calls;
    if (!d->n_calls) free(d->calls);
}

void output_parser_feed(output_parser *p, const char *text, size_t len, output_delta *delta) {
    delta_builder d = {0};
    if (p && text && len) {
        strbuf_append(&p->pending, text, len);
        process(p, &d, false);
    }
    finish_delta(&d, delta);
}

void output_parser_finish(output_parser *p, output_delta *delta) {
    delta_builder d = {0};
    if (p) process(p, &d, true);
    finish_delta(&d, delta);
}

void output_delta_free(output_delta *delta) {
    if (!delta) return;
    free(delta->content);
    free(delta->reasoning);
    for (int i = 0; i < delta->n_tool_calls; i++) {
        free(delta->tool_calls[i].name);
        free(delta->tool_calls[i].arguments);
    }
    free(delta->tool_calls);
    memset(delta, 0, sizeof *delta);
}
