/* gen_parse — request pieces that several API adapters read the same way, so each shape is
 * parsed once: the sampling knobs, the required messages array, flat function tools (Claude's and
 * Responses' {name, schema, description} -> the template's {"type":"function","function":{...}})
 * and tool results (Claude's tool_result blocks, Responses' function_call_output items -> "tool"
 * messages). The typed field reads live with the generation path (generate.c); both are declared in
 * gen.h. It refuses nothing adapter-specific: field names and error texts come from the caller. */
#include "api/gen.h"

#include "text/grammar.h"
#include "text/json_schema.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gen_set_token_limit(long n, const char *field, gen_request *q, char *err, size_t errlen) {
    if (n != LONG_MIN && n <= 0) {
        snprintf(err, errlen, "'%s' must be at least 1 (got %ld)", field, n);
        return 400;
    }
    if (n > 0) q->max_tokens = (int)n;
    return 0;
}

int gen_get_sampling(const json_t *o, const char *repetition_field, gen_request *q, char *err,
                     size_t errlen) {
    int rc;
    if ((rc = gen_get_number(o, "temperature", 0, 2, &q->temperature, err, errlen))) return rc;
    if ((rc = gen_get_number(o, "top_p", 0, 1, &q->top_p, err, errlen))) return rc;
    if ((rc = gen_get_number(o, "min_p", 0, 1, &q->min_p, err, errlen))) return rc;
    if ((rc = gen_get_number(o, repetition_field, 0, 10, &q->repetition_penalty, err, errlen)))
        return rc;
    if ((rc = gen_get_number(o, "presence_penalty", -2, 2, &q->presence_penalty, err, errlen)))
        return rc;
    if ((rc = gen_get_number(o, "frequency_penalty", -2, 2, &q->frequency_penalty, err, errlen)))
        return rc;
    long k = -1;
    if ((rc = gen_get_int(o, "top_k", 0, 1 << 20, &k, err, errlen))) return rc;
    if (k >= 0) q->top_k = (int)k;
    long seed = 0;
    if ((rc = gen_get_int(o, "seed", -(1L << 62), 1L << 62, &seed, err, errlen))) return rc;
    if (json_is_integer(json_object_get(o, "seed"))) { /* gen_get_int refused any other value */
        q->has_seed = 1;
        q->seed = (uint64_t)seed;
    }
    /* exo's own: speculative decoding for this request (0 = off, n = at most n drafted tokens
     * per step; absent = the node's --speculative setting) */
    long spec = -1;
    if ((rc = gen_get_int(o, "spec_tokens", 0, 16, &spec, err, errlen))) return rc;
    if (spec >= 0) q->spec_tokens = spec ? (int)spec : -1;
    return 0;
}

int gen_require_array(const json_t *v, const char *field, char *err, size_t errlen) {
    if (!v) {
        snprintf(err, errlen, "'%s' is required", field);
        return 400;
    }
    if (!json_is_array(v) || !json_array_size(v)) {
        snprintf(err, errlen, "'%s' must be a non-empty array", field);
        return 400;
    }
    return 0;
}

int gen_require_string(const json_t *v, const char *field, char *err, size_t errlen) {
    if (!v) {
        snprintf(err, errlen, "'%s' is required", field);
        return 400;
    }
    if (!json_is_string(v)) {
        snprintf(err, errlen, "'%s' must be a string", field);
        return 400;
    }
    return 0;
}

int gen_parse_function_tools(const json_t *tools, const gen_tools_shape *shape, int choice_none,
                             gen_request *req, char *err, size_t errlen) {
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) {
        snprintf(err, errlen, "'tools' must be an array");
        return 400;
    }
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(t, "name"));
        if (!name || (shape->function_type_required && (!type || strcmp(type, "function")))) {
            snprintf(err, errlen, shape->invalid_tool, i);
            json_decref(out);
            return 400;
        }
        json_t *schema = json_object_get(t, shape->schema_key);
        json_t *fn = json_pack("{s:s,s:o}", "name", name, "parameters",
                               schema ? json_incref(schema) : json_object());
        const char *d = json_string_value(json_object_get(t, "description"));
        if (d) json_object_set_new(fn, "description", json_string(d));
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    if (json_array_size(out) && !choice_none)
        req->tools = out;
    else
        json_decref(out);
    return 0;
}

int gen_append_tool_result(json_t *msgs, const json_t *content, const char *field,
                           const char *call_id, char *err, size_t errlen) {
    strbuf text = {0};
    int rc = gen_content_text(content, field, &text, err, errlen);
    if (!rc) {
        json_t *m = json_pack("{s:s,s:s}", "role", "tool", "content", text.data ? text.data : "");
        if (call_id) json_object_set_new(m, "tool_call_id", json_string(call_id));
        json_array_append_new(msgs, m);
    }
    strbuf_free(&text);
    return rc;
}

/* ------------------------------------------------------------------ structured outputs */

/* Sets req->grammar to text after checking that it compiles (so a bad grammar is the client's
 * 400 here, not a runner error later). Takes text. */
static int set_grammar(gen_request *req, char *text, const char *field, char *err, size_t errlen) {
    if (req->grammar) {
        snprintf(err, errlen,
                 "'%s' cannot be combined with another constraint on the output "
                 "(response format, grammar or forced tool call)",
                 field);
        free(text);
        return 400;
    }
    char why[400];
    grammar *g = grammar_parse(text, strlen(text), why, sizeof why);
    if (!g) {
        snprintf(err, errlen, "'%s': %s", field, why);
        free(text);
        return 400;
    }
    grammar_unref(g);
    req->grammar = text;
    return 0;
}

int gen_set_json_output(gen_request *req, const json_t *schema, const char *field, char *err,
                        size_t errlen) {
    if (schema && !json_is_object(schema) && !json_is_true(schema)) {
        snprintf(err, errlen, "'%s' must be a JSON Schema object", field);
        return 400;
    }
    char why[400];
    char *text = json_schema_to_grammar(schema, why, sizeof why);
    if (!text) {
        snprintf(err, errlen, "'%s': %s", field, why);
        return 400;
    }
    return set_grammar(req, text, field, err, errlen);
}

int gen_set_grammar(gen_request *req, const json_t *grammar_value, const char *field, char *err,
                    size_t errlen) {
    if (!grammar_value || json_is_null(grammar_value)) return 0;
    if (gen_require_string(grammar_value, field, err, errlen)) return 400;
    return set_grammar(req, strdup(json_string_value(grammar_value)), field, err, errlen);
}

int gen_force_tool_call(gen_request *req, const char *name, const char *field, char *err,
                        size_t errlen) {
    size_t n = json_array_size(req->tools);
    if (!n) {
        snprintf(err, errlen, "'%s' forces a tool call, but the request has no 'tools'", field);
        return 400;
    }
    const char **names = calloc(n, sizeof *names);
    const json_t **schemas = calloc(n, sizeof *schemas);
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *fn = json_object_get(json_array_get(req->tools, i), "function");
        const char *tool = json_string_value(json_object_get(fn, "name"));
        if (!tool || (name && strcmp(tool, name))) continue;
        names[k] = tool;
        schemas[k++] = json_object_get(fn, "parameters");
    }
    int rc = 0;
    char why[400];
    char *text = NULL;
    if (!k) {
        snprintf(err, errlen, "'%s' names the tool '%s', which is not in 'tools'", field, name);
        rc = 400;
    } else if (!(text = json_schema_tool_call_grammar(names, schemas, k, why, sizeof why))) {
        snprintf(err, errlen, "'%s': a tool's parameters cannot be enforced: %s", field, why);
        rc = 400;
    } else if (!(rc = set_grammar(req, text, field, err, errlen))) {
        req->forced_tool_call = 1;
    }
    free(names);
    free(schemas);
    return rc;
}
