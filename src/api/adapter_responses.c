/* adapter_responses — OpenAI Responses (/v1/responses) over the shared generation path (gen.h):
 * input as a string or items (message, function_call, function_call_output, reasoning),
 * instructions, function tools, reasoning effort, and the streaming event sequence with
 * sequence numbers. It refuses: built-in tools (web search, files), images, stored responses
 * (previous_response_id). */
#include "api/gen.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ITEM_NONE = 0, ITEM_MESSAGE, ITEM_REASONING };

static int parse_input(const json_t *input, json_t *msgs, char *err, size_t errlen) {
    if (!input) {
        snprintf(err, errlen, "'input' is required");
        return 400;
    }
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", input));
        return 0;
    }
    if (!json_is_array(input) || !json_array_size(input)) {
        snprintf(err, errlen, "'input' must be a string or a non-empty array of items");
        return 400;
    }
    size_t i;
    json_t *it;
    json_array_foreach(input, i, it) {
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!json_is_object(it)) {
            snprintf(err, errlen, "'input[%zu]' must be an object", i);
            return 400;
        }
        if (!type || !strcmp(type, "message")) {
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") &&
                          strcmp(role, "system") && strcmp(role, "developer"))) {
                snprintf(err, errlen, "'input[%zu].role' must be user, assistant, system or "
                                      "developer", i);
                return 400;
            }
            char field[48];
            snprintf(field, sizeof field, "input[%zu].content", i);
            strbuf text = {0};
            int rc = gen_content_text(json_object_get(it, "content"), field, &text, err, errlen);
            if (!rc)
                json_array_append_new(msgs, json_pack("{s:s,s:s}", "role",
                                                      !strcmp(role, "developer") ? "system" : role,
                                                      "content", text.data ? text.data : ""));
            strbuf_free(&text);
            if (rc) return rc;
        } else if (!strcmp(type, "function_call")) {
            const char *name = json_string_value(json_object_get(it, "name"));
            if (!name) {
                snprintf(err, errlen, "'input[%zu].name' must be a string", i);
                return 400;
            }
            json_t *call = gen_template_tool_call(json_string_value(json_object_get(it, "call_id")),
                                                  name, json_object_get(it, "arguments"));
            /* consecutive calls join one assistant message */
            json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
            if (last && !strcmp(json_string_value(json_object_get(last, "role")), "assistant") &&
                json_object_get(last, "tool_calls")) {
                json_array_append_new(json_object_get(last, "tool_calls"), call);
            } else {
                json_array_append_new(msgs, json_pack("{s:s,s:s,s:[o]}", "role", "assistant",
                                                      "content", "", "tool_calls", call));
            }
        } else if (!strcmp(type, "function_call_output")) {
            char field[48];
            snprintf(field, sizeof field, "input[%zu].output", i);
            int rc = gen_append_tool_result(msgs, json_object_get(it, "output"), field,
                                            json_string_value(json_object_get(it, "call_id")), err,
                                            errlen);
            if (rc) return rc;
        } else if (!strcmp(type, "reasoning")) {
            continue; /* earlier reasoning is not fed back to the model */
        } else {
            snprintf(err, errlen, "'input[%zu].type' \"%s\" is not supported", i, type);
            return 400;
        }
    }
    return 0;
}

static int responses_parse(const json_t *b, gen_state *st, char *err, size_t errlen) {
    gen_request *q = &st->req;
    int rc;
    if ((rc = gen_get_model(b, st, err, errlen))) return rc;
    long n = LONG_MIN;
    if ((rc = gen_get_int(b, "max_output_tokens", -(1L << 40), 1L << 30, &n, err, errlen)))
        return rc;
    if ((rc = gen_set_token_limit(n, "max_output_tokens", q, err, errlen))) return rc;
    if ((rc = gen_get_number(b, "temperature", 0, 2, &q->temperature, err, errlen))) return rc;
    if ((rc = gen_get_number(b, "top_p", 0, 1, &q->top_p, err, errlen))) return rc;
    if ((rc = gen_get_bool(b, "stream", &q->stream, err, errlen))) return rc;
    json_t *msgs = json_array();
    json_t *ins = json_object_get(b, "instructions");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins)) {
            snprintf(err, errlen, "'instructions' must be a string");
            json_decref(msgs);
            return 400;
        }
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    }
    if ((rc = parse_input(json_object_get(b, "input"), msgs, err, errlen))) {
        json_decref(msgs);
        return rc;
    }
    q->messages = msgs;
    static const gen_tools_shape responses_tools = {
        "parameters", 1,
        "'tools[%zu]' must be {\"type\":\"function\",\"name\":...}; built-in tools are not "
        "supported"};
    json_t *tools = json_object_get(b, "tools"), *choice = json_object_get(b, "tool_choice");
    if ((rc = gen_parse_function_tools(
             tools, &responses_tools,
             json_is_string(choice) && !strcmp(json_string_value(choice), "none"), q, err, errlen)))
        return rc;
    json_t *reasoning = json_object_get(b, "reasoning");
    const char *effort = json_string_value(json_object_get(reasoning, "effort"));
    if ((rc = gen_set_reasoning_effort(q, effort, "reasoning.effort", err, errlen))) return rc;
    st->scratch = json_pack("{s:O?,s:O?}", "instructions", ins, "tools", tools);
    return 0;
}

/* ------------------------------------------------------------------ response */

static void responses_error(api_request *r, int status, const char *message) {
    api_respond_error(r, status, "%s", message);
}

static json_t *usage(const gen_state *st) {
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", st->prompt_tokens,
                     "input_tokens_details", "cached_tokens", st->cached_tokens, "output_tokens",
                     st->completion_tokens, "output_tokens_details", "reasoning_tokens",
                     st->reasoning_tokens, "total_tokens",
                     st->prompt_tokens + st->completion_tokens);
}

static void item_id(const gen_state *st, const char *prefix, int index, char *out, size_t n) {
    snprintf(out, n, "%s_%s_%d", prefix, st->id + 5, index);
}

static json_t *message_item(const gen_state *st, int index, const char *text, const char *status) {
    char id[96];
    item_id(st, "msg", index, id, sizeof id);
    json_t *content = json_array();
    if (text)
        json_array_append_new(content, json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text",
                                                 text, "annotations"));
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", id, "status", status,
                     "role", "assistant", "content", content);
}

static json_t *reasoning_item(const gen_state *st, int index, const char *text) {
    char id[96];
    item_id(st, "rs", index, id, sizeof id);
    json_t *summary = json_array();
    if (text) json_array_append_new(summary, json_pack("{s:s,s:s}", "type", "summary_text",
                                                       "text", text));
    return json_pack("{s:s,s:s,s:o}", "type", "reasoning", "id", id, "summary", summary);
}

static json_t *function_item(const gen_state *st, int index, const json_t *call,
                             const char *status, int with_args) {
    char id[96];
    item_id(st, "fc", index, id, sizeof id);
    return json_pack("{s:s,s:s,s:O,s:O,s:s,s:s}", "type", "function_call", "id", id, "call_id",
                     json_object_get(call, "id"), "name", json_object_get(call, "name"),
                     "arguments",
                     with_args ? json_string_value(json_object_get(call, "arguments")) : "",
                     "status", status);
}

static json_t *response_object(gen_state *st, const char *status, json_t *output) {
    json_t *r = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:b,s:n,s:n}", "id", st->id, "object",
                          "response", "created_at", (json_int_t)st->created, "status", status,
                          "model", st->req.model, "output", output, "parallel_tool_calls", 1,
                          "error", "incomplete_details");
    json_t *ins = json_object_get(st->scratch, "instructions");
    json_object_set(r, "instructions", ins ? ins : json_null());
    json_t *tools = json_object_get(st->scratch, "tools");
    json_object_set_new(r, "tools", tools ? json_incref(tools) : json_array());
    json_object_set_new(r, "tool_choice", json_string("auto"));
    json_object_set_new(r, "max_output_tokens",
                        st->req.max_tokens ? json_integer(st->req.max_tokens) : json_null());
    if (st->req.temperature >= 0) json_object_set_new(r, "temperature", json_real(st->req.temperature));
    if (st->req.top_p >= 0) json_object_set_new(r, "top_p", json_real(st->req.top_p));
    if (!strcmp(status, "completed") || !strcmp(status, "incomplete")) {
        json_object_set_new(r, "usage", usage(st));
        json_object_set_new(r, "output_text", json_string(st->content.data ? st->content.data : ""));
    }
    if (!strcmp(status, "incomplete"))
        json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason",
                                                               "max_output_tokens"));
    return r;
}

static json_t *full_output(gen_state *st) {
    json_t *output = json_array();
    int index = 0;
    if (st->reasoning.len) json_array_append_new(output, reasoning_item(st, index++, st->reasoning.data));
    if (st->content.len || !json_array_size(st->tool_calls))
        json_array_append_new(output, message_item(st, index++,
                                                   st->content.data ? st->content.data : "",
                                                   "completed"));
    size_t i;
    json_t *call;
    json_array_foreach(st->tool_calls, i, call)
        json_array_append_new(output, function_item(st, index++, call, "completed", 1));
    return output;
}

static const char *final_status(const gen_state *st) {
    return !strcmp(st->finish_reason, "length") ? "incomplete" : "completed";
}

/* ---- streaming: items are opened lazily; st->n_blocks counts output items ---- */

static void event(gen_state *st, strbuf *out, const char *type, json_t *body) {
    json_object_set_new(body, "type", json_string(type));
    json_object_set_new(body, "sequence_number", json_integer(st->sequence++));
    gen_sse_event(out, type, body);
}

/* What differs between the two kinds of output item that stream text: a message (its text in an
 * output_text content part) and a reasoning item (its text in a summary_text part). */
typedef struct text_item_kind {
    const char *id_prefix;
    const char *part_index_key; /* the part's index field; each item has one part, index 0 */
    const char *part_added, *text_delta, *text_done, *part_done; /* event names */
} text_item_kind;

static const text_item_kind MESSAGE_ITEM = {
    "msg", "content_index", "response.content_part.added", "response.output_text.delta",
    "response.output_text.done", "response.content_part.done"};
static const text_item_kind REASONING_ITEM = {
    "rs", "summary_index", "response.reasoning_summary_part.added",
    "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done",
    "response.reasoning_summary_part.done"};

/* kind: ITEM_MESSAGE or ITEM_REASONING. */
static const text_item_kind *text_kind(int kind) {
    return kind == ITEM_MESSAGE ? &MESSAGE_ITEM : &REASONING_ITEM;
}

static json_t *text_part(int kind, const char *text) {
    if (kind == ITEM_MESSAGE)
        return json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text", text, "annotations");
    return json_pack("{s:s,s:s}", "type", "summary_text", "text", text);
}

static void part_event(gen_state *st, strbuf *out, const char *type, int kind, const char *id,
                       int idx, const char *text) {
    const text_item_kind *k = text_kind(kind);
    event(st, out, type,
          json_pack("{s:s,s:i,s:i,s:o}", "item_id", id, "output_index", idx, k->part_index_key, 0,
                    "part", text_part(kind, text)));
}

static void close_item(gen_state *st, strbuf *out) {
    int kind = st->open_block, idx = st->n_blocks - 1;
    if (kind == ITEM_MESSAGE || kind == ITEM_REASONING) {
        const text_item_kind *k = text_kind(kind);
        char id[96];
        item_id(st, k->id_prefix, idx, id, sizeof id);
        const char *text = json_string_value(json_object_get(st->scratch, "open_text"));
        text = text ? text : "";
        event(st, out, k->text_done,
              json_pack("{s:s,s:i,s:i,s:s}", "item_id", id, "output_index", idx, k->part_index_key,
                        0, "text", text));
        part_event(st, out, k->part_done, kind, id, idx, text);
        json_t *item = kind == ITEM_MESSAGE ? message_item(st, idx, text, "completed")
                                            : reasoning_item(st, idx, text);
        event(st, out, "response.output_item.done",
              json_pack("{s:i,s:o}", "output_index", idx, "item", item));
    }
    st->open_block = ITEM_NONE;
    json_object_set_new(st->scratch, "open_text", json_string(""));
}

/* kind: ITEM_MESSAGE or ITEM_REASONING. */
static void open_item(gen_state *st, int kind, strbuf *out) {
    close_item(st, out);
    int idx = st->n_blocks++;
    const text_item_kind *k = text_kind(kind);
    char id[96];
    item_id(st, k->id_prefix, idx, id, sizeof id);
    st->open_block = kind;
    json_t *item = kind == ITEM_MESSAGE ? message_item(st, idx, NULL, "in_progress")
                                        : reasoning_item(st, idx, NULL);
    event(st, out, "response.output_item.added",
          json_pack("{s:i,s:o}", "output_index", idx, "item", item));
    part_event(st, out, k->part_added, kind, id, idx, "");
}

static void append_open_text(gen_state *st, const char *piece) {
    const char *prev = json_string_value(json_object_get(st->scratch, "open_text"));
    strbuf sb = {0};
    strbuf_append_str(&sb, prev ? prev : "");
    strbuf_append_str(&sb, piece);
    json_object_set_new(st->scratch, "open_text", json_string(sb.data));
    strbuf_free(&sb);
}

static void responses_stream_begin(gen_state *st, strbuf *out) {
    if (!st->scratch) st->scratch = json_object();
    event(st, out, "response.created",
          json_pack("{s:o}", "response", response_object(st, "in_progress", json_array())));
    event(st, out, "response.in_progress",
          json_pack("{s:o}", "response", response_object(st, "in_progress", json_array())));
}

/* Streams piece into the open item of this kind, opening one first if another kind is open. */
static void text_delta(gen_state *st, strbuf *out, int kind, const char *piece) {
    const text_item_kind *k = text_kind(kind);
    if (st->open_block != kind) open_item(st, kind, out);
    int idx = st->n_blocks - 1;
    char id[96];
    item_id(st, k->id_prefix, idx, id, sizeof id);
    append_open_text(st, piece);
    json_t *body = json_pack("{s:s,s:i,s:i,s:s}", "item_id", id, "output_index", idx,
                             k->part_index_key, 0, "delta", piece);
    if (kind == ITEM_MESSAGE) json_object_set_new(body, "logprobs", json_array());
    event(st, out, k->text_delta, body);
}

static void responses_stream_delta(gen_state *st, const json_t *d, strbuf *out) {
    const char *r = json_string_value(json_object_get(d, "reasoning"));
    const char *c = json_string_value(json_object_get(d, "content"));
    char id[96];
    if (r && r[0]) text_delta(st, out, ITEM_REASONING, r);
    if (c && c[0]) text_delta(st, out, ITEM_MESSAGE, c);
    size_t i;
    json_t *call;
    json_array_foreach(json_object_get(d, "tool_calls"), i, call) {
        close_item(st, out);
        int idx = st->n_blocks++;
        item_id(st, "fc", idx, id, sizeof id);
        const char *args = json_string_value(json_object_get(call, "arguments"));
        event(st, out, "response.output_item.added",
              json_pack("{s:i,s:o}", "output_index", idx, "item",
                        function_item(st, idx, call, "in_progress", 0)));
        event(st, out, "response.function_call_arguments.delta",
              json_pack("{s:s,s:i,s:s}", "item_id", id, "output_index", idx, "delta", args));
        event(st, out, "response.function_call_arguments.done",
              json_pack("{s:s,s:i,s:s}", "item_id", id, "output_index", idx, "arguments", args));
        event(st, out, "response.output_item.done",
              json_pack("{s:i,s:o}", "output_index", idx, "item",
                        function_item(st, idx, call, "completed", 1)));
    }
}

static void responses_stream_end(gen_state *st, strbuf *out) {
    if (st->n_blocks == 0) open_item(st, ITEM_MESSAGE, out); /* an empty reply is one message */
    close_item(st, out);
    const char *status = final_status(st);
    event(st, out, !strcmp(status, "completed") ? "response.completed" : "response.incomplete",
          json_pack("{s:o}", "response", response_object(st, status, full_output(st))));
}

static void responses_stream_error(gen_state *st, const char *message, strbuf *out) {
    int status = st->error_status ? st->error_status : 500;
    event(st, out, "error", json_pack("{s:s,s:s,s:n}", "code", api_status_phrase(status),
                                      "message", message, "param"));
    json_t *resp = response_object(st, "failed", json_array());
    json_object_set_new(resp, "error", json_pack("{s:s,s:s}", "code", "server_error", "message",
                                                 message));
    event(st, out, "response.failed", json_pack("{s:o}", "response", resp));
}

static json_t *responses_final(gen_state *st) {
    return response_object(st, final_status(st), full_output(st));
}

static const gen_stream_format responses_stream = GEN_STREAM_FORMAT(responses, GEN_FRAMING_SSE);

const gen_adapter gen_adapter_responses = {"responses",     "resp_",           responses_parse,
                                           responses_error, &responses_stream, responses_final};
