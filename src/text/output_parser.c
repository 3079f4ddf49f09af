/* output_parser — splits streamed model text into content, reasoning and tool calls.
 *
 * A small state machine over a buffer of text not yet certain: in content it looks for <think>
 * and (when tools were offered) <tool_call>; in reasoning for </think>; in a tool call for
 * </tool_call>. Text that could still be the start of one of those tags is held back until the
 * next piece decides it, so a tag split across pieces at any byte is still recognised.
 * A tool call is accepted only when its body is a JSON object with a string "name" and an object
 * "arguments" (or "parameters", or a string holding a JSON object); otherwise the raw text goes
 * out as content. Llama 3.1 JSON calls are recognised when the reply starts with '{' (or
 * <|python_tag|>): the reply is held to the end and becomes tool calls only if it parses.
 * Refuses: nothing; it never fails, malformed input just stays text. */
#include "text/output_parser.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"

enum parser_state { IN_CONTENT, IN_REASONING, IN_TOOL_CALL, IN_LLAMA_JSON };

static const char THINK_OPEN[] = "<think>";
static const char THINK_CLOSE[] = "</think>";
static const char TOOL_OPEN[] = "<tool_call>";
static const char TOOL_CLOSE[] = "</tool_call>";
static const char PYTHON_TAG[] = "<|python_tag|>";

struct output_parser {
    output_format format;
    bool has_tools;
    enum parser_state state;
    strbuf pending;       /* text received but not yet emitted */
    bool strip_leading;   /* drop whitespace at the start of the next content (after </think>) */
    bool after_tool_call; /* whitespace after a tool call is held and dropped if nothing follows */
    bool seen_text;       /* any non-whitespace content emitted (for the Llama JSON decision) */
};

typedef struct delta_builder {
    strbuf content, reasoning;
    output_tool_call *calls;
    int n_calls, cap_calls;
} delta_builder;

output_format output_format_detect(const char *architecture, const char *chat_template) {
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

output_parser *output_parser_new(output_format format, int starts_in_reasoning, int has_tools) {
    output_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->format = format;
    p->has_tools = has_tools != 0;
    p->state = starts_in_reasoning && format == OUTPUT_FORMAT_HERMES ? IN_REASONING : IN_CONTENT;
    return p;
}

void output_parser_free(output_parser *p) {
    if (!p) return;
    strbuf_free(&p->pending);
    free(p);
}

static bool is_ws(char c) {
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* length of the longest suffix of s[0..n) that is a proper prefix of tag */
static size_t partial_tag(const char *s, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    size_t k = n < tl - 1 ? n : tl - 1;
    for (; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

static void emit_content(output_parser *p, delta_builder *d, const char *s, size_t n) {
    if (p->strip_leading) {
        while (n && is_ws(*s))
            s++, n--;
        if (!n) return;
        p->strip_leading = false;
    }
    if (!n) return;
    for (size_t i = 0; i < n; i++)
        if (!is_ws(s[i])) p->seen_text = true;
    strbuf_append(&d->content, s, n);
}

static void add_call(delta_builder *d, char *name, char *args) {
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

/* compact JSON with the shortest round-trip form of each number (jansson prints 0.1 as
 * 0.10000000000000001, which is not what the model wrote) */
static void write_json(strbuf *sb, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *v;
        int first = 1;
        strbuf_append_char(sb, '{');
        json_object_foreach((json_t *)j, k, v) {
            if (!first) strbuf_append_char(sb, ',');
            first = 0;
            json_t *key = json_string(k);
            write_json(sb, key);
            json_decref(key);
            strbuf_append_char(sb, ':');
            write_json(sb, v);
        }
        strbuf_append_char(sb, '}');
        return;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *v;
        strbuf_append_char(sb, '[');
        json_array_foreach(j, i, v) {
            if (i) strbuf_append_char(sb, ',');
            write_json(sb, v);
        }
        strbuf_append_char(sb, ']');
        return;
    }
    case JSON_REAL: {
        double d = json_real_value(j);
        char buf[40];
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, d);
            if (strtod(buf, NULL) == d) break;
        }
        strbuf_append_str(sb, buf);
        if (!strpbrk(buf, ".eEni")) strbuf_append_str(sb, ".0");
        return;
    }
    default: {
        char *t = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
        if (t) strbuf_append_str(sb, t);
        free(t);
    }
    }
}

/* {"name": "...", "arguments"|"parameters": {...} or "<json object>"} -> a call, else false */
static bool parse_call_object(json_t *obj, delta_builder *d) {
    if (!json_is_object(obj)) return false;
    json_t *fn = json_object_get(obj, "function");
    if (json_is_object(fn) && !json_object_get(obj, "name")) obj = fn;
    const char *name = json_string_value(json_object_get(obj, "name"));
    if (!name || !*name) return false;
    json_t *args = json_object_get(obj, "arguments");
    if (!args) args = json_object_get(obj, "parameters");
    json_t *parsed = NULL;
    if (!args)
        args = parsed = json_object();
    else if (json_is_string(args)) {
        args = parsed = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
    }
    bool ok = json_is_object(args);
    if (ok) {
        strbuf sb = {0};
        write_json(&sb, args);
        char *text = strbuf_detach(&sb);
        char *nm = strdup(name);
        if (text && nm)
            add_call(d, nm, text);
        else {
            free(text);
            free(nm);
            ok = false;
        }
    }
    json_decref(parsed);
    return ok;
}

/* s[0..n) with one leading and one trailing newline dropped (the XML form puts values on lines
 * of their own) */
static void trim_one_newline(const char **s, size_t *n) {
    if (*n && (*s)[0] == '\n') (*s)++, (*n)--;
    if (*n && (*s)[*n - 1] == '\n') (*n)--;
}

/* The text after `prefix` up to `close`, within [s, end): its start and length; NULL when absent. */
static const char *between(const char *s, const char *end, const char *close, size_t *len) {
    size_t cl = strlen(close);
    for (const char *p = s; p + cl <= end; p++)
        if (memcmp(p, close, cl) == 0) {
            *len = (size_t)(p - s);
            return s;
        }
    return NULL;
}

/* A parameter value of the XML form: JSON when it is a JSON number, boolean, null, array or
 * object (the template writes those with tojson), else the text itself as a string. */
static json_t *xml_value(const char *v, size_t n) {
    json_t *j = json_loadb(v, n, JSON_DECODE_ANY, NULL);
    if (j && !json_is_string(j)) return j;
    json_decref(j);
    return json_stringn(v, n);
}

/* Qwen3.5 / Qwen3-Coder XML form inside <tool_call>:
 *   <function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function> */
static bool parse_xml_call(const char *body, size_t n, delta_builder *d) {
    static const char FN[] = "<function=", PARAM[] = "<parameter=";
    const char *s = body, *end = body + n;
    while (s < end && is_ws(*s)) s++;
    if ((size_t)(end - s) < sizeof FN - 1 || memcmp(s, FN, sizeof FN - 1)) return false;
    size_t name_len, rest_len;
    const char *name = between(s + sizeof FN - 1, end, ">", &name_len);
    if (!name || !name_len) return false;
    const char *rest = name + name_len + 1;
    if (!between(rest, end, "</function>", &rest_len)) return false;
    const char *fn_end = rest + rest_len;
    json_t *args = json_object();
    bool ok = args != NULL;
    for (const char *p = rest; ok && p < fn_end;) {
        while (p < fn_end && is_ws(*p)) p++;
        if (p >= fn_end) break;
        size_t key_len, val_len;
        const char *key = (size_t)(fn_end - p) > sizeof PARAM - 1 && !memcmp(p, PARAM, sizeof PARAM - 1)
                              ? between(p + sizeof PARAM - 1, fn_end, ">", &key_len)
                              : NULL;
        const char *val = key ? between(key + key_len + 1, fn_end, "</parameter>", &val_len) : NULL;
        if (!val) {
            ok = false;
            break;
        }
        trim_one_newline(&val, &val_len);
        char *k = strndup(key, key_len);
        ok = k && json_object_set_new(args, k, xml_value(val, val_len)) == 0;
        free(k);
        p = val + val_len + strlen("</parameter>") + (val[val_len] == '\n');
    }
    if (ok) {
        strbuf sb = {0};
        write_json(&sb, args);
        char *text = strbuf_detach(&sb), *nm = strndup(name, name_len);
        if (text && nm) add_call(d, nm, text);
        else free(text), free(nm), ok = false;
    }
    json_decref(args);
    return ok;
}

static bool parse_hermes_call(const char *body, size_t n, delta_builder *d) {
    json_t *obj = json_loadb(body, n, 0, NULL);
    bool ok = parse_call_object(obj, d);
    json_decref(obj);
    return ok || parse_xml_call(body, n, d);
}

/* the whole Llama reply: one object, or several separated by ';' or newlines, optional python_tag
 */
static bool parse_llama_calls(const char *s, size_t n, delta_builder *d) {
    size_t pl = strlen(PYTHON_TAG);
    while (n && is_ws(*s))
        s++, n--;
    if (n >= pl && memcmp(s, PYTHON_TAG, pl) == 0) s += pl, n -= pl;
    delta_builder tmp = {0};
    size_t i = 0;
    bool any = false;
    while (i < n) {
        while (i < n && (is_ws(s[i]) || s[i] == ';'))
            i++;
        if (i >= n) break;
        json_error_t je;
        json_t *obj = json_loadb(s + i, n - i, JSON_DISABLE_EOF_CHECK, &je);
        if (!obj || !parse_call_object(obj, &tmp)) {
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
            add_call(d, tmp.calls[k].name, tmp.calls[k].arguments);
    else
        for (int k = 0; k < tmp.n_calls; k++)
            free(tmp.calls[k].name), free(tmp.calls[k].arguments);
    free(tmp.calls);
    return any;
}

static void consume(strbuf *b, size_t n) {
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

static void process(output_parser *p, delta_builder *d, bool final) {
    strbuf *b = &p->pending;
    for (;;) {
        if (!b->len) return;
        const char *s = b->data;
        size_t n = b->len;
        if (p->state == IN_REASONING) {
            const char *hit = memmem(s, n, THINK_CLOSE, strlen(THINK_CLOSE));
            if (hit) {
                strbuf_append(&d->reasoning, s, (size_t)(hit - s));
                consume(b, (size_t)(hit - s) + strlen(THINK_CLOSE));
                p->state = IN_CONTENT;
                p->strip_leading = true;
                continue;
            }
            size_t hold = final ? 0 : partial_tag(s, n, THINK_CLOSE);
            strbuf_append(&d->reasoning, s, n - hold);
            consume(b, n - hold);
            return;
        }
        if (p->state == IN_TOOL_CALL) {
            const char *hit = memmem(s, n, TOOL_CLOSE, strlen(TOOL_CLOSE));
            if (!hit && !final) return;
            size_t body = hit ? (size_t)(hit - s) : n;
            if (parse_hermes_call(s, body, d)) {
                p->after_tool_call = true;
            } else {
                emit_content(p, d, TOOL_OPEN, strlen(TOOL_OPEN));
                emit_content(p, d, s, hit ? body + strlen(TOOL_CLOSE) : n);
            }
            consume(b, hit ? body + strlen(TOOL_CLOSE) : n);
            p->state = IN_CONTENT;
            continue;
        }
        if (p->state == IN_LLAMA_JSON) {
            if (!final) return;
            if (!parse_llama_calls(s, n, d)) emit_content(p, d, s, n);
            consume(b, n);
            p->state = IN_CONTENT;
            return;
        }
        /* IN_CONTENT */
        if (p->format == OUTPUT_FORMAT_PLAIN) {
            emit_content(p, d, s, n);
            consume(b, n);
            return;
        }
        if (p->format == OUTPUT_FORMAT_LLAMA3_JSON) {
            if (p->has_tools && !p->seen_text) {
                size_t i = 0, tl = strlen(PYTHON_TAG);
                while (i < n && is_ws(s[i]))
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
            emit_content(p, d, s, n);
            consume(b, n);
            return;
        }
        /* HERMES */
        const char *think = memmem(s, n, THINK_OPEN, strlen(THINK_OPEN));
        const char *tool = p->has_tools ? memmem(s, n, TOOL_OPEN, strlen(TOOL_OPEN)) : NULL;
        const char *hit = think && (!tool || think < tool) ? think : tool;
        if (hit) {
            size_t before = (size_t)(hit - s);
            bool is_tool = hit == tool;
            if (is_tool && p->after_tool_call) {
                bool all_ws = true;
                for (size_t i = 0; i < before; i++)
                    if (!is_ws(s[i])) all_ws = false;
                if (!all_ws) emit_content(p, d, s, before);
            } else
                emit_content(p, d, s, before);
            if (!is_tool || before) p->after_tool_call = false;
            consume(b, before + strlen(is_tool ? TOOL_OPEN : THINK_OPEN));
            p->state = is_tool ? IN_TOOL_CALL : IN_REASONING;
            continue;
        }
        size_t hold = 0;
        if (!final) {
            hold = partial_tag(s, n, THINK_OPEN);
            if (p->has_tools) {
                size_t h2 = partial_tag(s, n, TOOL_OPEN);
                if (h2 > hold) hold = h2;
            }
        }
        if (p->after_tool_call) {
            size_t i = 0;
            while (i < n - hold && is_ws(s[i]))
                i++;
            if (i == n - hold) {
                if (final) consume(b, n); /* trailing whitespace after tool calls is dropped */
                return;                   /* still only whitespace: keep holding it */
            }
            p->after_tool_call = false;
        }
        emit_content(p, d, s, n - hold);
        consume(b, n - hold);
        return;
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
