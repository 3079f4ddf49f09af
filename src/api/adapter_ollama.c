/* adapter_ollama — Ollama /api/chat and /api/generate (under /ollama) over the shared generation
 * path (gen.h): NDJSON streaming with `stream` defaulting to true, options{num_predict,
 * temperature, top_p, top_k, min_p, stop, seed, repeat_penalty, ...}, tools, think.
 * It refuses: images, `context` token arrays, custom templates. */
#include "api/gen.h"

#include "base/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int parse_options(const json_t *b, gen_state *st, char *err, size_t errlen) {
    gen_request *q = &st->req;
    int rc;
    if ((rc = gen_get_model(b, st, err, errlen))) return rc;
    q->stream = 1;
    if ((rc = gen_get_bool(b, "stream", &q->stream, err, errlen))) return rc;
    json_t *think = json_object_get(b, "think");
    if (json_is_boolean(think)) q->enable_thinking = json_is_true(think);
    else if (json_is_string(think) && (rc = gen_set_reasoning_effort(q, json_string_value(think), "think", err, errlen)))
        return rc; /* "low"/"medium"/"high" */
    json_t *o = json_object_get(b, "options");
    if (!o || json_is_null(o)) return 0;
    if (!json_is_object(o)) {
        snprintf(err, errlen, "'options' must be an object");
        return 400;
    }
    long n = -1;
    if ((rc = gen_get_int(o, "num_predict", -2, 1L << 30, &n, err, errlen))) return rc;
    if (n == 0) {
        snprintf(err, errlen, "'options.num_predict' must be at least 1, or -1 for no limit");
        return 400;
    }
    if (n > 0) q->max_tokens = (int)n;
    if ((rc = gen_get_sampling(o, "repeat_penalty", q, err, errlen))) return rc;
    return gen_get_stop(o, "stop", q, err, errlen);
}

static int chat_parse(const json_t *b, gen_state *st, char *err, size_t errlen) {
    int rc;
    if ((rc = parse_options(b, st, err, errlen))) return rc;
    json_t *msgs = json_object_get(b, "messages");
    if (gen_require_array(msgs, "messages", err, errlen)) return 400;
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        if (!role) {
            snprintf(err, errlen, "'messages[%zu].role' must be a string", i);
            json_decref(out);
            return 400;
        }
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool")) {
            snprintf(err, errlen, "'messages[%zu].role': unknown role '%.64s' (expected system, "
                                  "user, assistant or tool)", i, role);
            json_decref(out);
            return 400;
        }
        if (content && !json_is_string(content)) {
            snprintf(err, errlen, "'messages[%zu].content' must be a string", i);
            json_decref(out);
            return 400;
        }
        if (json_array_size(json_object_get(m, "images"))) {
            snprintf(err, errlen, "'messages[%zu].images': images are not supported by this model",
                     i);
            json_decref(out);
            return 400;
        }
        json_t *o = json_pack("{s:s,s:s}", "role", role, "content",
                              content ? json_string_value(content) : "");
        const char *thinking = json_string_value(json_object_get(m, "thinking"));
        gen_template_reasoning(o, thinking);
        const char *tool_name = json_string_value(json_object_get(m, "tool_name"));
        if (tool_name) json_object_set_new(o, "name", json_string(tool_name));
        json_t *tcs = json_object_get(m, "tool_calls");
        if (json_array_size(tcs)) {
            json_t *calls = json_array();
            size_t k;
            json_t *tc;
            json_array_foreach(tcs, k, tc) {
                json_t *fn = json_object_get(tc, "function");
                char cid[64];
                snprintf(cid, sizeof cid, "call_%zu_%zu", i, k);
                json_array_append_new(calls, gen_template_tool_call(
                                                 cid, json_string_value(json_object_get(fn, "name")),
                                                 json_object_get(fn, "arguments")));
            }
            json_object_set_new(o, "tool_calls", calls);
        }
        json_array_append_new(out, o);
    }
    st->req.messages = out;
    json_t *tools = json_object_get(b, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) {
            snprintf(err, errlen, "'tools' must be an array");
            return 400;
        }
        if (json_array_size(tools)) st->req.tools = json_incref(tools);
    }
    return 0;
}

static int generate_parse(const json_t *b, gen_state *st, char *err, size_t errlen) {
    int rc;
    st->raw = 2; /* generate: "response" field */
    if ((rc = parse_options(b, st, err, errlen))) return rc;
    json_t *p = json_object_get(b, "prompt");
    if (gen_require_string(p, "prompt", err, errlen)) return 400;
    int raw = 0;
    if ((rc = gen_get_bool(b, "raw", &raw, err, errlen))) return rc;
    if (raw) {
        st->req.prompt = strdup(json_string_value(p));
        return 0;
    }
    json_t *msgs = json_array();
    json_t *sys = json_object_get(b, "system");
    if (json_is_string(sys))
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", sys));
    json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", p));
    st->req.messages = msgs;
    return 0;
}

/* ------------------------------------------------------------------ response */

static void ollama_error(api_request *r, int status, const char *message) {
    api_respond_json(r, status, json_pack("{s:s}", "error", message));
}

static json_t *created_at(void) {
    char buf[64];
    int64_t ms = clock_unix_ms();
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03dZ", (int)(ms % 1000));
    return json_string(buf);
}

static json_t *tool_calls(const json_t *calls) {
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *args = json_loads(json_string_value(json_object_get(c, "arguments")), 0, NULL);
        json_array_append_new(out, json_pack("{s:{s:O,s:o}}", "function", "name",
                                             json_object_get(c, "name"), "arguments",
                                             args ? args : json_object()));
    }
    return out;
}

static json_t *frame(gen_state *st, const char *content, const char *thinking, const json_t *calls,
                     int done) {
    json_t *f = json_pack("{s:s,s:o}", "model", st->req.model, "created_at", created_at());
    if (st->raw == 2) {
        json_object_set_new(f, "response", json_string(content ? content : ""));
        if (thinking) json_object_set_new(f, "thinking", json_string(thinking));
    } else {
        json_t *m = json_pack("{s:s,s:s}", "role", "assistant", "content", content ? content : "");
        if (thinking) json_object_set_new(m, "thinking", json_string(thinking));
        if (calls && json_array_size(calls)) json_object_set_new(m, "tool_calls", tool_calls(calls));
        json_object_set_new(f, "message", m);
    }
    json_object_set_new(f, "done", json_boolean(done));
    if (done) {
        uint64_t now = clock_now_ns();
        uint64_t total = now - st->t_start_ns;
        uint64_t prompt_ns = st->t_first_ns ? st->t_first_ns - st->t_start_ns : total;
        json_object_set_new(f, "done_reason",
                            json_string(!strcmp(st->finish_reason, "length") ? "length" : "stop"));
        json_object_set_new(f, "total_duration", json_integer((json_int_t)total));
        json_object_set_new(f, "load_duration", json_integer(0));
        json_object_set_new(f, "prompt_eval_count", json_integer(st->prompt_tokens));
        json_object_set_new(f, "prompt_eval_duration", json_integer((json_int_t)prompt_ns));
        json_object_set_new(f, "eval_count", json_integer(st->completion_tokens));
        json_object_set_new(f, "eval_duration", json_integer((json_int_t)(total - prompt_ns)));
    }
    return f;
}

static void ollama_stream_begin(gen_state *st, strbuf *out) {
    (void)st;
    (void)out;
}

static void ollama_stream_delta(gen_state *st, const json_t *d, strbuf *out) {
    const char *c = json_string_value(json_object_get(d, "content"));
    const char *r = json_string_value(json_object_get(d, "reasoning"));
    const json_t *calls = json_object_get(d, "tool_calls");
    if (!c && !r && !json_array_size(calls)) return;
    gen_ndjson(out, frame(st, c, r, calls, 0));
}

static void ollama_stream_end(gen_state *st, strbuf *out) {
    gen_ndjson(out, frame(st, "", NULL, NULL, 1));
}

static void ollama_stream_error(gen_state *st, const char *message, strbuf *out) {
    (void)st;
    gen_ndjson(out, json_pack("{s:s}", "error", message));
}

static json_t *ollama_final(gen_state *st) {
    return frame(st, st->content.data ? st->content.data : "",
                 st->reasoning.len ? st->reasoning.data : NULL, st->tool_calls, 1);
}

static const gen_stream_format ollama_stream = GEN_STREAM_FORMAT(ollama, GEN_FRAMING_NDJSON);

const gen_adapter gen_adapter_ollama_chat = {"ollama",     "ollama-",      chat_parse,
                                             ollama_error, &ollama_stream, ollama_final};

const gen_adapter gen_adapter_ollama_generate = {"ollama",     "ollama-",      generate_parse,
                                                 ollama_error, &ollama_stream, ollama_final};
