/* adapter_openai — OpenAI Chat Completions (/v1/chat/completions, /bench/chat/completions) and
 * legacy Completions (/v1/completions) over the shared generation path (gen.h).
 * It refuses: n > 1, images, audio. */
#include "api/gen.h"

#include "base/clock.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ request */

/* OpenAI messages -> template messages (content as a string, tool-call arguments as objects). */
static int parse_messages(const json_t *msgs, gen_request *req, char *err, size_t errlen) {
    if (gen_require_array(msgs, "messages", err, errlen)) return 400;
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char field[64];
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role) {
            snprintf(err, errlen, "'messages[%zu].role' must be a string", i);
            goto bad;
        }
        if (strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "user") &&
            strcmp(role, "assistant") && strcmp(role, "tool")) {
            snprintf(err, errlen, "'messages[%zu].role' must be system, developer, user, "
                                  "assistant or tool (got '%s')", i, role);
            goto bad;
        }
        snprintf(field, sizeof field, "messages[%zu].content", i);
        strbuf text = {0};
        if (gen_content_text(json_object_get(m, "content"), field, &text, err, errlen)) {
            strbuf_free(&text);
            goto bad;
        }
        json_t *o = json_pack("{s:s,s:s}", "role", !strcmp(role, "developer") ? "system" : role,
                              "content", text.data ? text.data : "");
        strbuf_free(&text);
        /* earlier reasoning as clients send it back: reasoning_content (DeepSeek, Qwen), reasoning
         * (OpenRouter, vLLM) or thinking (gpt-oss's own name) */
        const char *rc = json_string_value(json_object_get(m, "reasoning_content"));
        if (!rc) rc = json_string_value(json_object_get(m, "reasoning"));
        if (!rc) rc = json_string_value(json_object_get(m, "thinking"));
        gen_template_reasoning(o, rc);
        const char *tcid = json_string_value(json_object_get(m, "tool_call_id"));
        if (tcid) json_object_set_new(o, "tool_call_id", json_string(tcid));
        const char *name = json_string_value(json_object_get(m, "name"));
        if (name) json_object_set_new(o, "name", json_string(name));
        json_t *tcs = json_object_get(m, "tool_calls");
        if (json_is_array(tcs) && json_array_size(tcs)) {
            json_t *calls = json_array();
            size_t k;
            json_t *tc;
            json_array_foreach(tcs, k, tc) {
                json_t *fn = json_object_get(tc, "function");
                if (!json_is_string(json_object_get(fn, "name"))) {
                    snprintf(err, errlen, "'messages[%zu].tool_calls[%zu].function.name' must be "
                                          "a string", i, k);
                    json_decref(calls);
                    json_decref(o);
                    goto bad;
                }
                json_array_append_new(
                    calls, gen_template_tool_call(json_string_value(json_object_get(tc, "id")),
                                                  json_string_value(json_object_get(fn, "name")),
                                                  json_object_get(fn, "arguments")));
            }
            json_object_set_new(o, "tool_calls", calls);
        }
        json_array_append_new(out, o);
    }
    req->messages = out;
    return 0;
bad:
    json_decref(out);
    return 400;
}

static int parse_tools(const json_t *body, gen_request *req, char *err, size_t errlen) {
    json_t *tools = json_object_get(body, "tools");
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) {
        snprintf(err, errlen, "'tools' must be an array");
        return 400;
    }
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (!json_is_string(json_object_get(json_object_get(t, "function"), "name"))) {
            snprintf(err, errlen, "'tools[%zu].function.name' must be a string", i);
            return 400;
        }
    }
    json_t *choice = json_object_get(body, "tool_choice");
    if (json_is_string(choice) && !strcmp(json_string_value(choice), "none")) return 0;
    if (json_array_size(tools)) req->tools = json_incref(tools);
    return 0;
}

/* Fields shared by chat and legacy completions. */
static int parse_sampling(const json_t *b, gen_state *st, char *err, size_t errlen) {
    gen_request *q = &st->req;
    long n = LONG_MIN;
    int rc;
    if ((rc = gen_get_model(b, st, err, errlen))) return rc;
    if ((rc = gen_get_int(b, "max_tokens", -(1L << 40), 1L << 30, &n, err, errlen))) return rc;
    if ((rc = gen_get_int(b, "max_completion_tokens", -(1L << 40), 1L << 30, &n, err, errlen)))
        return rc;
    if ((rc = gen_set_token_limit(n, "max_tokens", q, err, errlen))) return rc;
    if ((rc = gen_get_sampling(b, "repetition_penalty", q, err, errlen))) return rc;
    if ((rc = gen_get_stop(b, "stop", q, err, errlen))) return rc;
    if ((rc = gen_get_bool(b, "stream", &q->stream, err, errlen))) return rc;
    long nn = 1;
    if ((rc = gen_get_int(b, "n", 1, 1, &nn, err, errlen))) return rc;
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            snprintf(err, errlen, "'stream_options' must be an object");
            return 400;
        }
        if ((rc = gen_get_bool(so, "include_usage", &st->include_usage, err, errlen))) return rc;
    }
    int use_cache = 1;
    if ((rc = gen_get_bool(b, "use_prefix_cache", &use_cache, err, errlen))) return rc;
    if (st->bench && !json_object_get(b, "use_prefix_cache")) use_cache = 0;
    q->no_prefix_cache = !use_cache;
    return 0;
}

static int chat_parse(const json_t *b, gen_state *st, char *err, size_t errlen) {
    gen_request *q = &st->req;
    int rc;
    if ((rc = parse_sampling(b, st, err, errlen))) return rc;
    if ((rc = parse_messages(json_object_get(b, "messages"), q, err, errlen))) return rc;
    if ((rc = parse_tools(b, q, err, errlen))) return rc;
    json_t *lp = json_object_get(b, "logprobs");
    if ((rc = gen_get_bool(b, "logprobs", &q->logprobs, err, errlen))) return rc;
    (void)lp;
    long top = 0;
    if ((rc = gen_get_int(b, "top_logprobs", 0, 20, &top, err, errlen))) return rc;
    q->top_logprobs = (int)top;
    if (top && !q->logprobs) {
        snprintf(err, errlen, "'top_logprobs' requires 'logprobs': true");
        return 400;
    }
    int think = -1;
    if ((rc = gen_get_bool(b, "enable_thinking", &think, err, errlen))) return rc;
    json_t *effort = json_object_get(b, "reasoning_effort");
    q->enable_thinking = think;
    if (effort && !json_is_null(effort)) {
        if (!json_is_string(effort)) {
            snprintf(err, errlen, "'reasoning_effort' must be a string");
            return 400;
        }
        return gen_set_reasoning_effort(q, json_string_value(effort), "reasoning_effort", err, errlen);
    }
    return 0;
}

static int completions_parse(const json_t *b, gen_state *st, char *err, size_t errlen) {
    gen_request *q = &st->req;
    int rc;
    st->raw = 1;
    if ((rc = parse_sampling(b, st, err, errlen))) return rc;
    json_t *p = json_object_get(b, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1) p = json_array_get(p, 0);
    if (gen_require_string(p, "prompt", err, errlen)) return 400;
    q->prompt = strdup(json_string_value(p));
    long lp = 0;
    if ((rc = gen_get_int(b, "logprobs", 0, 20, &lp, err, errlen))) return rc;
    if (json_is_integer(json_object_get(b, "logprobs"))) {
        q->logprobs = 1;
        q->top_logprobs = (int)lp;
    }
    if (!json_object_get(b, "max_tokens") && !q->max_tokens) q->max_tokens = 16;
    return 0;
}

/* ------------------------------------------------------------------ response */

static void error_openai(api_request *r, int status, const char *message) {
    api_respond_error(r, status, "%s", message);
}

static const char *finish_openai(const gen_state *st) {
    if (!strcmp(st->finish_reason, "cancelled")) return "stop";
    if (!strcmp(st->finish_reason, "error")) return "stop";
    return st->finish_reason;
}

static json_t *usage_json(const gen_state *st) {
    return json_pack("{s:i,s:i,s:i,s:{s:i},s:{s:i}}", "prompt_tokens", st->prompt_tokens,
                     "completion_tokens", st->completion_tokens, "total_tokens",
                     st->prompt_tokens + st->completion_tokens, "prompt_tokens_details",
                     "cached_tokens", st->cached_tokens, "completion_tokens_details",
                     "reasoning_tokens", st->reasoning_tokens);
}

static json_t *chunk_base(const gen_state *st, const char *object) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", st->id, "object", object, "created",
                     (json_int_t)st->created, "model", st->req.model, "system_fingerprint",
                     "exo");
}

static json_t *openai_tool_calls(const json_t *calls, int first_index, int with_index) {
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *o = json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", json_object_get(c, "id"), "type",
                              "function", "function", "name", json_object_get(c, "name"),
                              "arguments", json_object_get(c, "arguments"));
        if (with_index) json_object_set_new(o, "index", json_integer(first_index + (int)i));
        json_array_append_new(out, o);
    }
    return out;
}

static void chat_stream_begin(gen_state *st, strbuf *out) {
    json_t *c = chunk_base(st, "chat.completion.chunk");
    json_object_set_new(c, "choices",
                        json_pack("[{s:i,s:{s:s,s:s},s:n,s:n}]", "index", 0, "delta", "role",
                                  "assistant", "content", "", "logprobs", "finish_reason"));
    gen_sse_data(out, c);
}

/* The hot path: a delta with only text, no logprobs. Same bytes as the general encoder below
 * (same keys, same order, jansson's escaping) from a prefix built once per request, without
 * building and dumping a JSON tree per token. */
static int chat_stream_text_delta(gen_state *st, const json_t *d, strbuf *out) {
    json_t *content = json_object_get(d, "content");
    if (!json_is_string(content) || json_object_get(d, "reasoning") ||
        json_array_size(json_object_get(d, "tool_calls")) ||
        (st->req.logprobs && json_object_get(d, "logprobs")))
        return 0;
    strbuf *p = &st->frame_prefix;
    if (!p->len) {
        strbuf_append_str(p, "data: {\"id\":");
        gen_json_string(p, st->id, strlen(st->id));
        strbuf_append_str(p, ",\"object\":\"chat.completion.chunk\",\"created\":");
        gen_append_i64(p, (long long)st->created);
        strbuf_append_str(p, ",\"model\":");
        gen_json_string(p, st->req.model, strlen(st->req.model));
        strbuf_append_str(p, ",\"system_fingerprint\":\"exo\",\"choices\":[{\"index\":0,"
                             "\"delta\":{\"content\":");
    }
    strbuf_append(out, p->data, p->len);
    gen_json_string(out, json_string_value(content), json_string_length(content));
    strbuf_append_str(out, "},\"finish_reason\":null,\"logprobs\":null}]");
    if (st->bench) {
        json_t *t = json_object_get(d, "t_ns"), *n = json_object_get(d, "tokens");
        if (t) {
            strbuf_append_str(out, ",\"engine_t_ns\":");
            gen_append_i64(out, (long long)json_integer_value(t));
        }
        if (n) {
            strbuf_append_str(out, ",\"engine_tokens\":");
            gen_append_i64(out, (long long)json_integer_value(n));
        }
        strbuf_append_str(out, ",\"node_t_ns\":");
        gen_append_i64(out, (long long)clock_now_ns());
    }
    strbuf_append_str(out, "}\n\n");
    return 1;
}

static void chat_stream_delta(gen_state *st, const json_t *d, strbuf *out) {
    if (chat_stream_text_delta(st, d, out)) return;
    json_t *delta = json_object();
    json_t *v;
    if ((v = json_object_get(d, "content"))) json_object_set(delta, "content", v);
    if ((v = json_object_get(d, "reasoning"))) json_object_set(delta, "reasoning_content", v);
    if ((v = json_object_get(d, "tool_calls")) && json_array_size(v)) {
        json_object_set_new(delta, "tool_calls",
                            openai_tool_calls(v, st->n_tool_calls_streamed, 1));
        st->n_tool_calls_streamed += (int)json_array_size(v);
    }
    json_t *choice = json_pack("{s:i,s:o,s:n}", "index", 0, "delta", delta, "finish_reason");
    json_t *lp = json_object_get(d, "logprobs");
    if (lp && st->req.logprobs) json_object_set_new(choice, "logprobs", json_pack("{s:O}", "content", lp));
    else json_object_set_new(choice, "logprobs", json_null());
    json_t *c = chunk_base(st, "chat.completion.chunk");
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    if (st->bench) {
        /* for bench/api/overhead.mjs: when the engine made the token, when the node encoded it */
        json_object_set(c, "engine_t_ns", json_object_get(d, "t_ns"));
        json_object_set(c, "engine_tokens", json_object_get(d, "tokens"));
        json_object_set_new(c, "node_t_ns", json_integer((json_int_t)clock_now_ns()));
    }
    gen_sse_data(out, c);
}

static void chat_stream_end(gen_state *st, strbuf *out) {
    json_t *c = chunk_base(st, "chat.completion.chunk");
    json_object_set_new(c, "choices", json_pack("[{s:i,s:{},s:n,s:s}]", "index", 0, "delta",
                                                "logprobs", "finish_reason", finish_openai(st)));
    if (st->bench && st->stats) json_object_set(c, "generation_stats", st->stats);
    gen_sse_data(out, c);
    if (st->include_usage) {
        c = chunk_base(st, "chat.completion.chunk");
        json_object_set_new(c, "choices", json_array());
        json_object_set_new(c, "usage", usage_json(st));
        gen_sse_data(out, c);
    }
    strbuf_append_str(out, "data: [DONE]\n\n");
}

static void chat_stream_error(gen_state *st, const char *message, strbuf *out) {
    int status = st->error_status ? st->error_status : 500;
    gen_sse_data(out, json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", message, "type",
                                api_status_phrase(status), "param", "code", status));
    strbuf_append_str(out, "data: [DONE]\n\n");
}

static json_t *chat_final(gen_state *st) {
    json_t *msg = json_pack("{s:s,s:s}", "role", "assistant", "content",
                            st->content.data ? st->content.data : "");
    if (st->reasoning.len)
        json_object_set_new(msg, "reasoning_content", json_string(st->reasoning.data));
    if (json_array_size(st->tool_calls))
        json_object_set_new(msg, "tool_calls", openai_tool_calls(st->tool_calls, 0, 0));
    json_t *choice = json_pack("{s:i,s:o,s:s}", "index", 0, "message", msg, "finish_reason",
                               finish_openai(st));
    json_object_set_new(choice, "logprobs",
                        st->req.logprobs ? json_pack("{s:O}", "content", st->logprobs)
                                         : json_null());
    json_t *c = chunk_base(st, "chat.completion");
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    json_object_set_new(c, "usage", usage_json(st));
    if (st->bench && st->stats) json_object_set(c, "generation_stats", st->stats);
    return c;
}

/* Legacy completions logprobs: {tokens, token_logprobs, top_logprobs:[{tok: lp}], text_offset}. */
static json_t *legacy_logprobs(const json_t *lps, size_t *offset) {
    json_t *tokens = json_array(), *tlp = json_array(), *top = json_array(), *off = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(lps, i, e) {
        const char *tok = json_string_value(json_object_get(e, "token"));
        json_array_append(tokens, json_object_get(e, "token"));
        json_array_append(tlp, json_object_get(e, "logprob"));
        json_t *alts = json_object();
        size_t k;
        json_t *a;
        json_array_foreach(json_object_get(e, "top_logprobs"), k, a) {
            const char *t = json_string_value(json_object_get(a, "token"));
            if (t) json_object_set(alts, t, json_object_get(a, "logprob"));
        }
        json_array_append_new(top, alts);
        json_array_append_new(off, json_integer((json_int_t)*offset));
        *offset += tok ? strlen(tok) : 0;
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", tlp, "top_logprobs",
                     top, "text_offset", off);
}

static void completions_stream_begin(gen_state *st, strbuf *out) {
    (void)st;
    (void)out;
}

static void completions_stream_delta(gen_state *st, const json_t *d, strbuf *out) {
    const char *text = json_string_value(json_object_get(d, "content"));
    json_t *choice = json_pack("{s:s,s:i,s:n,s:n}", "text", text ? text : "", "index", 0,
                               "logprobs", "finish_reason");
    json_t *lp = json_object_get(d, "logprobs");
    if (lp && st->req.logprobs) {
        size_t offset = (size_t)st->n_blocks;
        json_object_set_new(choice, "logprobs", legacy_logprobs(lp, &offset));
        st->n_blocks = (int)offset;
    }
    json_t *c = chunk_base(st, "text_completion");
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    gen_sse_data(out, c);
}

static void completions_stream_end(gen_state *st, strbuf *out) {
    json_t *c = chunk_base(st, "text_completion");
    json_object_set_new(c, "choices", json_pack("[{s:s,s:i,s:n,s:s}]", "text", "", "index", 0,
                                                "logprobs", "finish_reason", finish_openai(st)));
    if (st->include_usage) json_object_set_new(c, "usage", usage_json(st));
    gen_sse_data(out, c);
    strbuf_append_str(out, "data: [DONE]\n\n");
}

static json_t *completions_final(gen_state *st) {
    json_t *choice = json_pack("{s:s,s:i,s:s}", "text", st->content.data ? st->content.data : "",
                               "index", 0, "finish_reason", finish_openai(st));
    size_t offset = 0;
    json_object_set_new(choice, "logprobs",
                        st->req.logprobs ? legacy_logprobs(st->logprobs, &offset) : json_null());
    json_t *c = chunk_base(st, "text_completion");
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    json_object_set_new(c, "usage", usage_json(st));
    return c;
}

/* Both endpoints answer a failed stream with the same error frame. */
static void completions_stream_error(gen_state *st, const char *message, strbuf *out) {
    chat_stream_error(st, message, out);
}

static const gen_stream_format chat_stream = GEN_STREAM_FORMAT(chat, GEN_FRAMING_SSE);

static const gen_stream_format completions_stream = GEN_STREAM_FORMAT(completions, GEN_FRAMING_SSE);

const gen_adapter gen_adapter_openai_chat = {"openai",     "chatcmpl-",  chat_parse,
                                             error_openai, &chat_stream, chat_final};

const gen_adapter gen_adapter_openai_completions = {"completions",       "cmpl-",
                                                    completions_parse,   error_openai,
                                                    &completions_stream, completions_final};
