/* output_calls — the tool-call bodies of each family, parsed into (name, JSON arguments):
 * JSON objects (Hermes/Qwen3, Llama 3.1), Qwen3.5/Qwen3-Coder XML parameters, GLM-4.5 arg_key /
 * arg_value pairs, DeepSeek V3 / V3.1 and Kimi K2 call sections. XML and GLM values are text; they
 * are coerced to the types the tool's JSON schema declares (a value that does not parse as its
 * declared type stays a string, so nothing the model wrote is lost).
 * Refuses: partial success — a body either becomes calls entirely or is reported as not a call
 * (the caller then shows it as text). */
#include "text/output_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void output_write_json(strbuf *sb, const json_t *j) {
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
            output_write_json(sb, key);
            json_decref(key);
            strbuf_append_char(sb, ':');
            output_write_json(sb, v);
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
            output_write_json(sb, v);
        }
        strbuf_append_char(sb, ']');
        return;
    }
    case JSON_REAL: { /* jansson prints 0.1 as 0.10000000000000001, which is not what was written */
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

static bool add_object_call(const char *name, size_t name_len, const json_t *args, delta_builder *d) {
    if (!json_is_object(args) || !name_len) return false;
    strbuf sb = {0};
    output_write_json(&sb, args);
    char *text = strbuf_detach(&sb), *nm = strndup(name, name_len);
    if (!text || !nm) {
        free(text);
        free(nm);
        return false;
    }
    delta_add_call(d, nm, text);
    return true;
}

bool output_parse_call_object(json_t *obj, delta_builder *d) {
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
    else if (json_is_string(args))
        args = parsed = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
    bool ok = add_object_call(name, strlen(name), args, d);
    json_decref(parsed);
    return ok;
}

bool output_add_json_call(const char *name, size_t name_len, const char *args, size_t args_len, delta_builder *d) {
    json_t *obj = json_loadb(args, args_len, 0, NULL);
    bool ok = add_object_call(name, name_len, obj, d);
    json_decref(obj);
    return ok;
}

/* ---- text values typed by the tool's schema ---------------------------------------------- */

/* The JSON schema type of parameter `key` of tool `name` ("string", "integer", ...), or NULL. */
static const char *schema_type(const json_t *tools, const char *name, const char *key) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        if (!fn) fn = t;
        const char *n = json_string_value(json_object_get(fn, "name"));
        if (!n || strcmp(n, name)) continue;
        json_t *prop = json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"), key);
        json_t *type = json_object_get(prop, "type");
        if (json_is_array(type)) type = json_array_get(type, 0);
        return json_string_value(type);
    }
    return NULL;
}

/* A parameter's text as the JSON value its schema says (templates print Python's True/None for
 * some values); undeclared parameters become JSON when the text is a JSON number, boolean, null,
 * array or object, else the text itself: templates write string values raw, so text that reads
 * as a JSON string ("quoted") was a string with its quotes. */
static json_t *typed_value(const char *text, size_t n, const char *type) {
    if (type && !strcmp(type, "string")) return json_stringn(text, n);
    if (type && !strcmp(type, "boolean")) {
        if ((n == 4 && !strncasecmp(text, "true", 4))) return json_true();
        if ((n == 5 && !strncasecmp(text, "false", 5))) return json_false();
    }
    if (n == 4 && !strncmp(text, "None", 4) && type) return json_null();
    json_t *v = json_loadb(text, n, JSON_DECODE_ANY, NULL);
    if (v && !json_is_string(v)) return v;
    json_decref(v);
    return json_stringn(text, n);
}

/* A call from name + (key, value) text pairs collected in args_text (an object of strings). */
static bool add_typed_call(const char *name, size_t name_len, json_t *pairs, const json_t *tools, delta_builder *d) {
    char *nm = strndup(name, name_len);
    json_t *args = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(pairs, k, v) {
        const char *type = tools && nm ? schema_type(tools, nm, k) : NULL;
        json_object_set_new(args, k, typed_value(json_string_value(v), json_string_length(v), type));
    }
    bool ok = nm && add_object_call(name, name_len, args, d);
    free(nm);
    json_decref(args);
    return ok;
}

static bool tool_known(const json_t *tools, const char *name, size_t n) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *tn = json_string_value(json_object_get(fn ? fn : t, "name"));
        if (tn && strlen(tn) == n && !memcmp(tn, name, n)) return true;
    }
    return false;
}

static const char *skip_ws(const char *s, const char *end) {
    while (s < end && output_is_ws(*s)) s++;
    return s;
}

static bool starts(const char *s, const char *end, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)(end - s) >= n && !memcmp(s, lit, n);
}

static const char *find(const char *s, const char *end, const char *lit) {
    return s < end ? memmem(s, (size_t)(end - s), lit, strlen(lit)) : NULL;
}

/* <function=NAME>\n<parameter=K>\nV\n</parameter>\n...</function> (one newline either side of a
 * value is the template's, not the value's) */
static bool parse_xml_function(const char *s, const char *end, const json_t *tools, delta_builder *d) {
    s = skip_ws(s, end);
    if (!starts(s, end, "<function=")) return false;
    const char *name = s + 10, *gt = find(name, end, ">");
    if (!gt) return false;
    json_t *pairs = json_object();
    const char *p = gt + 1;
    bool ok = false;
    for (;;) {
        p = skip_ws(p, end);
        if (starts(p, end, "</function>")) {
            ok = skip_ws(p + 11, end) == end;
            break;
        }
        if (!starts(p, end, "<parameter=")) break;
        const char *key = p + 11, *kend = find(key, end, ">");
        const char *vend = kend ? find(kend, end, "</parameter>") : NULL;
        if (!vend) break;
        const char *v = kend + 1;
        if (v < vend && *v == '\n') v++;
        const char *ve = vend;
        if (ve > v && ve[-1] == '\n') ve--;
        char *k = strndup(key, (size_t)(kend - key));
        json_object_set_new(pairs, k ? k : "", json_stringn(v, (size_t)(ve - v)));
        free(k);
        p = vend + 12;
    }
    ok = ok && add_typed_call(name, (size_t)(gt - name), pairs, tools, d);
    json_decref(pairs);
    return ok;
}

/* NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>... */
static bool parse_glm_call(const char *s, const char *end, const json_t *tools, delta_builder *d) {
    s = skip_ws(s, end);
    const char *name_end = find(s, end, "<arg_key>");
    if (!name_end) name_end = end;
    const char *ne = name_end;
    while (ne > s && output_is_ws(ne[-1])) ne--;
    if (ne == s || memchr(s, '<', (size_t)(ne - s)) || memchr(s, '{', (size_t)(ne - s))) return false;
    if (tools && json_array_size(tools) && !tool_known(tools, s, (size_t)(ne - s))) return false;
    json_t *pairs = json_object();
    const char *p = name_end;
    bool ok = true;
    while ((p = skip_ws(p, end)) < end) {
        const char *kend = starts(p, end, "<arg_key>") ? find(p, end, "</arg_key>") : NULL;
        const char *v = kend ? skip_ws(kend + 10, end) : NULL;
        const char *vend = v && starts(v, end, "<arg_value>") ? find(v, end, "</arg_value>") : NULL;
        if (!vend) {
            ok = false;
            break;
        }
        char *k = strndup(p + 9, (size_t)(kend - p - 9));
        json_object_set_new(pairs, k ? k : "", json_stringn(v + 11, (size_t)(vend - v - 11)));
        free(k);
        p = vend + 12;
    }
    ok = ok && add_typed_call(s, (size_t)(ne - s), pairs, tools, d);
    json_decref(pairs);
    return ok;
}

bool output_parse_tagged_call(const char *body, size_t n, const json_t *tools, bool glm, delta_builder *d) {
    const char *end = body + n, *s = skip_ws(body, end);
    if (s < end && *s == '{') {
        json_t *obj = json_loadb(s, (size_t)(end - s), 0, NULL);
        bool ok = output_parse_call_object(obj, d);
        json_decref(obj);
        return ok;
    }
    if (starts(s, end, "<function=")) return parse_xml_function(s, end, tools, d);
    return glm && parse_glm_call(s, end, tools, d);
}

/* ---- DeepSeek and Kimi sections -------------------------------------------------------------- */

static const char DS_CALL_BEGIN[] = "<\xef\xbd\x9ctool\xe2\x96\x81""call\xe2\x96\x81""begin\xef\xbd\x9c>";
static const char DS_CALL_END[] = "<\xef\xbd\x9ctool\xe2\x96\x81""call\xe2\x96\x81""end\xef\xbd\x9c>";
static const char DS_SEP[] = "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>";

/* V3: function<sep>NAME\n```json\nARGS\n```   V3.1: NAME<sep>ARGS */
static bool parse_deepseek_call(const char *s, const char *end, delta_builder *d) {
    const char *sep = find(s, end, DS_SEP);
    if (!sep) return false;
    const char *after = sep + strlen(DS_SEP);
    const char *fence = find(after, end, "\n```json\n");
    if ((size_t)(sep - s) == 8 && !memcmp(s, "function", 8) && fence) {
        const char *close = end;
        while (close > fence && output_is_ws(close[-1])) close--;
        if (close - fence < 12 || memcmp(close - 3, "```", 3)) return false;
        const char *args = fence + 9;
        return output_add_json_call(after, (size_t)(fence - after), args, (size_t)(close - 3 - args), d);
    }
    return output_add_json_call(s, (size_t)(sep - s), after, (size_t)(end - after), d);
}

bool output_parse_deepseek_calls(const char *body, size_t n, delta_builder *d) {
    const char *end = body + n, *p = skip_ws(body, end);
    int calls = 0;
    while (p < end) {
        if (!starts(p, end, DS_CALL_BEGIN)) return false;
        const char *s = p + strlen(DS_CALL_BEGIN), *e = find(s, end, DS_CALL_END);
        if (!e || !parse_deepseek_call(s, e, d)) return false;
        calls++;
        p = skip_ws(e + strlen(DS_CALL_END), end);
    }
    return calls > 0;
}

/* <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|> */
bool output_parse_kimi_calls(const char *body, size_t n, delta_builder *d) {
    static const char BEGIN[] = "<|tool_call_begin|>", ARGS[] = "<|tool_call_argument_begin|>",
                      END[] = "<|tool_call_end|>";
    const char *end = body + n, *p = skip_ws(body, end);
    int calls = 0;
    while (p < end) {
        if (!starts(p, end, BEGIN)) return false;
        const char *id = p + strlen(BEGIN), *a = find(id, end, ARGS), *e = a ? find(a, end, END) : NULL;
        if (!e) return false;
        const char *name = id, *name_end = a;
        if (starts(name, a, "functions.")) name += 10;
        const char *colon = name_end;
        while (colon > name && colon[-1] != ':') colon--;
        if (colon > name) name_end = colon - 1;
        const char *args = a + strlen(ARGS);
        if (!output_add_json_call(name, (size_t)(name_end - name), args, (size_t)(e - args), d)) return false;
        calls++;
        p = skip_ws(e + strlen(END), end);
    }
    return calls > 0;
}
