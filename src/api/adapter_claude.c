/* adapter_claude — Anthropic Messages (/v1/messages) over the shared generation path (gen.h):
 * system, content blocks (text, thinking, tool_use, tool_result), tools, thinking, stop_sequences,
 * and the streaming event sequence (message_start, content_block_*, ping, message_delta,
 * message_stop). It refuses: images and documents (400). */
#include "api/gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK_NONE = 0, BLOCK_TEXT, BLOCK_THINKING, BLOCK_TOOL };

static int block_text(const json_t *blocks, const char *field, strbuf *out, char *err,
                      size_t errlen) {
    return gen_content_text(blocks, field, out, err, errlen);
}

/* messages[i].content[k].<key> as a string, or NULL with err naming the field. */
static const char *block_string(const json_t *b, const char *key, size_t i, size_t k, char *err,
                                size_t errlen) {
    const char *s = json_string_value(json_object_get(b, key));
    if (!s) snprintf(err, errlen, "'messages[%zu].content[%zu].%s' must be a string", i, k, key);
    return s;
}

/* Claude messages -> template messages. Assistant tool_use blocks become tool_calls; user
 * tool_result blocks become "tool" messages (before the user's own text). */
static int parse_messages(const json_t *msgs, json_t *out, char *err, size_t errlen) {
    if (gen_require_array(msgs, "messages", err, errlen)) return 400;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
            snprintf(err, errlen, "'messages[%zu].role' must be \"user\" or \"assistant\"", i);
            return 400;
        }
        json_t *content = json_object_get(m, "content");
        if (json_is_string(content)) {
            json_array_append_new(out, json_pack("{s:s,s:O}", "role", role, "content", content));
            continue;
        }
        if (!json_is_array(content)) {
            snprintf(err, errlen, "'messages[%zu].content' must be a string or an array of "
                                  "content blocks", i);
            return 400;
        }
        strbuf text = {0}, thinking = {0};
        json_t *calls = json_array();
        size_t k;
        json_t *b;
        int rc = 0;
        json_array_foreach(content, k, b) {
            const char *type = block_string(b, "type", i, k, err, errlen);
            if (!type) {
                rc = 400;
                break;
            }
            if (!strcmp(type, "text")) {
                const char *t = block_string(b, "text", i, k, err, errlen);
                if (!t) {
                    rc = 400;
                    break;
                }
                strbuf_append_str(&text, t);
            } else if (!strcmp(type, "thinking")) {
                const char *t = json_string_value(json_object_get(b, "thinking"));
                if (t) strbuf_append_str(&thinking, t);
            } else if (!strcmp(type, "tool_use")) {
                const char *name = block_string(b, "name", i, k, err, errlen);
                if (!name) {
                    rc = 400;
                    break;
                }
                json_array_append_new(calls, gen_template_tool_call(
                                                 json_string_value(json_object_get(b, "id")),
                                                 name, json_object_get(b, "input")));
            } else if (!strcmp(type, "tool_result")) {
                char field[96];
                snprintf(field, sizeof field, "messages[%zu].content[%zu].content", i, k);
                if ((rc = gen_append_tool_result(
                         out, json_object_get(b, "content"), field,
                         json_string_value(json_object_get(b, "tool_use_id")), err, errlen)))
                    break;
            } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
                snprintf(err, errlen, "'messages[%zu].content[%zu]': %s blocks are not supported "
                                      "by this model", i, k, type);
                rc = 400;
                break;
            }
        }
        if (!rc && (text.len || json_array_size(calls) || thinking.len || !strcmp(role, "user"))) {
            int only_tool_results = !strcmp(role, "user") && !text.len && json_array_size(out) &&
                                    !strcmp(json_string_value(json_object_get(
                                                json_array_get(out, json_array_size(out) - 1),
                                                "role")),
                                            "tool");
            if (!only_tool_results) {
                json_t *o = json_pack("{s:s,s:s}", "role", role, "content",
                                      text.data ? text.data : "");
                if (thinking.len) gen_template_reasoning(o, thinking.data);
                if (json_array_size(calls)) json_object_set(o, "tool_calls", calls);
                json_array_append_new(out, o);
            }
        }
        strbuf_free(&text);
        strbuf_free(&thinking);
        json_decref(calls);
        if (rc) return rc;
    }
    return 0;
}

static int claude_parse(const json_t *b, gen_state *st, char *err, size_t errlen) {
    gen_request *q = &st->req;
    int rc;
    if ((rc = gen_get_model(b, st, err, errlen))) return rc;
    if (!json_object_get(b, "max_tokens")) {
        snprintf(err, errlen, "'max_tokens' is required");
        return 400;
    }
    long n = 0;
    if ((rc = gen_get_int(b, "max_tokens", -(1L << 40), 1L << 30, &n, err, errlen))) return rc;
    if ((rc = gen_set_token_limit(n, "max_tokens", q, err, errlen))) return rc;
    if ((rc = gen_get_number(b, "temperature", 0, 2, &q->temperature, err, errlen))) return rc;
    if ((rc = gen_get_number(b, "top_p", 0, 1, &q->top_p, err, errlen))) return rc;
    long k = -1;
    if ((rc = gen_get_int(b, "top_k", 0, 1 << 20, &k, err, errlen))) return rc;
    if (k >= 0) q->top_k = (int)k;
    if ((rc = gen_get_stop(b, "stop_sequences", q, err, errlen))) return rc;
    if ((rc = gen_get_bool(b, "stream", &q->stream, err, errlen))) return rc;
    json_t *msgs = json_array();
    json_t *sys = json_object_get(b, "system");
    if (sys && !json_is_null(sys)) {
        strbuf s = {0};
        if ((rc = block_text(sys, "system", &s, err, errlen))) {
            strbuf_free(&s);
            json_decref(msgs);
            return rc;
        }
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content",
                                              s.data ? s.data : ""));
        strbuf_free(&s);
    }
    if ((rc = parse_messages(json_object_get(b, "messages"), msgs, err, errlen))) {
        json_decref(msgs);
        return rc;
    }
    q->messages = msgs;
    static const gen_tools_shape claude_tools = {"input_schema", 0,
                                                 "'tools[%zu].name' must be a string"};
    const char *choice =
        json_string_value(json_object_get(json_object_get(b, "tool_choice"), "type"));
    if ((rc = gen_parse_function_tools(json_object_get(b, "tools"), &claude_tools,
                                       choice && !strcmp(choice, "none"), q, err, errlen)))
        return rc;
    json_t *thinking = json_object_get(b, "thinking");
    if (thinking && !json_is_null(thinking)) {
        const char *type = json_string_value(json_object_get(thinking, "type"));
        if (!type) {
            snprintf(err, errlen, "'thinking.type' must be \"enabled\", \"disabled\" or "
                                  "\"adaptive\"");
            return 400;
        }
        q->enable_thinking = strcmp(type, "disabled") != 0;
    }
    json_t *output_config = json_object_get(b, "output_config");
    return gen_set_reasoning_effort(q, json_string_value(json_object_get(output_config, "effort")),
                                    "output_config.effort", err, errlen);
}

/* ------------------------------------------------------------------ response */

static const char *error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
    }
}

static void claude_error(api_request *r, int status, const char *message) {
    api_respond_json(r, status, json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                                          error_type(status), "message", message));
}

static const char *stop_reason(const gen_state *st) {
    if (!strcmp(st->finish_reason, "length")) return "max_tokens";
    if (!strcmp(st->finish_reason, "tool_calls")) return "tool_use";
    if (st->stop_sequence) return "stop_sequence";
    return "end_turn";
}

static json_t *tool_input(const json_t *call) {
    json_t *in = json_loads(json_string_value(json_object_get(call, "arguments")), 0, NULL);
    return in ? in : json_object();
}

static char *tool_use_id(const json_t *call) {
    const char *id = json_string_value(json_object_get(call, "id"));
    char *out = malloc(64);
    snprintf(out, 64, "toolu_%s", id && !strncmp(id, "call_", 5) ? id + 5 : (id ? id : "0"));
    return out;
}

static json_t *usage(const gen_state *st) {
    return json_pack("{s:i,s:i,s:i}", "input_tokens", st->prompt_tokens, "output_tokens",
                     st->completion_tokens, "cache_read_input_tokens", st->cached_tokens);
}

static void close_block(gen_state *st, strbuf *out) {
    if (st->open_block == BLOCK_NONE) return;
    gen_sse_event(out, "content_block_stop",
                  json_pack("{s:s,s:i}", "type", "content_block_stop", "index", st->n_blocks - 1));
    st->open_block = BLOCK_NONE;
}

static void open_block(gen_state *st, int kind, json_t *block, strbuf *out) {
    close_block(st, out);
    gen_sse_event(out, "content_block_start",
                  json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index",
                            st->n_blocks, "content_block", block));
    st->n_blocks++;
    st->open_block = kind;
}

static void block_delta(gen_state *st, json_t *delta, strbuf *out) {
    gen_sse_event(out, "content_block_delta",
                  json_pack("{s:s,s:i,s:o}", "type", "content_block_delta", "index",
                            st->n_blocks - 1, "delta", delta));
}

static void claude_stream_begin(gen_state *st, strbuf *out) {
    json_t *msg = json_pack("{s:s,s:s,s:s,s:[],s:s,s:n,s:n,s:{s:i,s:i}}", "id", st->id, "type",
                            "message", "role", "assistant", "content", "model", st->req.model,
                            "stop_reason", "stop_sequence", "usage", "input_tokens",
                            st->prompt_tokens, "output_tokens", 0);
    gen_sse_event(out, "message_start", json_pack("{s:s,s:o}", "type", "message_start",
                                                  "message", msg));
    gen_sse_event(out, "ping", json_pack("{s:s}", "type", "ping"));
}

static void claude_stream_delta(gen_state *st, const json_t *d, strbuf *out) {
    const char *r = json_string_value(json_object_get(d, "reasoning"));
    const char *c = json_string_value(json_object_get(d, "content"));
    if (r && r[0]) {
        if (st->open_block != BLOCK_THINKING)
            open_block(st, BLOCK_THINKING,
                       json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "",
                                 "signature", ""),
                       out);
        block_delta(st, json_pack("{s:s,s:s}", "type", "thinking_delta", "thinking", r), out);
    }
    if (c && c[0]) {
        if (st->open_block != BLOCK_TEXT)
            open_block(st, BLOCK_TEXT, json_pack("{s:s,s:s}", "type", "text", "text", ""), out);
        block_delta(st, json_pack("{s:s,s:s}", "type", "text_delta", "text", c), out);
    }
    size_t i;
    json_t *call;
    json_array_foreach(json_object_get(d, "tool_calls"), i, call) {
        char *id = tool_use_id(call);
        open_block(st, BLOCK_TOOL,
                   json_pack("{s:s,s:s,s:O,s:{}}", "type", "tool_use", "id", id, "name",
                             json_object_get(call, "name"), "input"),
                   out);
        free(id);
        block_delta(st, json_pack("{s:s,s:O}", "type", "input_json_delta", "partial_json",
                                  json_object_get(call, "arguments")),
                    out);
        close_block(st, out);
    }
}

static void claude_stream_end(gen_state *st, strbuf *out) {
    close_block(st, out);
    json_t *delta = json_pack("{s:s,s:s?}", "stop_reason", stop_reason(st), "stop_sequence",
                              st->stop_sequence);
    if (!st->stop_sequence) json_object_set_new(delta, "stop_sequence", json_null());
    gen_sse_event(out, "message_delta", json_pack("{s:s,s:o,s:o}", "type", "message_delta",
                                                  "delta", delta, "usage", usage(st)));
    gen_sse_event(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static void claude_stream_error(gen_state *st, const char *message, strbuf *out) {
    int status = st->error_status ? st->error_status : 500;
    gen_sse_event(out, "error", json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                                          error_type(status), "message", message));
}

static json_t *claude_final(gen_state *st) {
    json_t *content = json_array();
    if (st->reasoning.len)
        json_array_append_new(content, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking",
                                                 st->reasoning.data, "signature", ""));
    if (st->content.len || !json_array_size(st->tool_calls))
        json_array_append_new(content, json_pack("{s:s,s:s}", "type", "text", "text",
                                                 st->content.data ? st->content.data : ""));
    size_t i;
    json_t *call;
    json_array_foreach(st->tool_calls, i, call) {
        char *id = tool_use_id(call);
        json_array_append_new(content, json_pack("{s:s,s:s,s:O,s:o}", "type", "tool_use", "id",
                                                 id, "name", json_object_get(call, "name"),
                                                 "input", tool_input(call)));
        free(id);
    }
    json_t *m = json_pack("{s:s,s:s,s:s,s:o,s:s,s:s,s:o}", "id", st->id, "type", "message",
                          "role", "assistant", "content", content, "model", st->req.model,
                          "stop_reason", stop_reason(st), "usage", usage(st));
    json_object_set_new(m, "stop_sequence",
                        st->stop_sequence ? json_string(st->stop_sequence) : json_null());
    return m;
}

static const gen_stream_format claude_stream = GEN_STREAM_FORMAT(claude, GEN_FRAMING_SSE);

const gen_adapter gen_adapter_claude = {"claude",     "msg_",         claude_parse,
                                        claude_error, &claude_stream, claude_final};
