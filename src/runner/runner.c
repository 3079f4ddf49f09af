/* runner — see runner.h. One thread: it reads the node's messages without blocking while the
 * engine has work, steps the engine, and turns each engine event into protocol messages.
 * Continuous batching happens inside engine_step; this loop only feeds and drains it. */
#include "runner/runner.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/paths.h"
#include "base/strbuf.h"
#include "infer/engine.h"
#include "runner/protocol.h"
#include "runner/stop_strings.h"
#include "runner/structured.h"
#include "text/chat.h"
#include "text/output_parser.h"
#include "model/model_config.h"
#include "runner/model_text.h"
#include "text/tokenizer.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_EVENTS 256
#define PROGRESS_EVERY 256 /* prompt tokens between prefill progress messages */

typedef struct seq {
    uint64_t id;
    detokenizer *detok;
    output_parser *parser;
    stop_strings stops;
    int logprobs, top_logprobs;
    int has_tools;
    int forced_tool_call; /* the output is one {"name","arguments"} call (gen_request) */
    strbuf tool_text;     /* that output so far */
    int prompt_tokens, cached_tokens, generated, reasoning_tokens, n_tool_calls;
    int stopped_by_string; /* we cancelled it after a stop string matched */
    int engine_only;       /* count and time tokens only (gen_request.engine_only) */
    int last_progress;
    uint64_t t_submit, t_first, t_last;
    struct seq *next;
} seq;

typedef struct runner {
    int fd;
    engine *engine;
    const engine_info *info;
    tokenizer *tok;
    chat_template *tmpl;
    output_format format;
    structured *structured; /* grammars of structured outputs */
    int32_t format_stops[4]; /* the format's stop tokens (output_format_stop_tokens) */
    int n_format_stops;
    seq *seqs;
    protocol_reader reader;
    strbuf out; /* framed messages not yet written: one write per engine step */
    int shutdown;
    const char *model_id;
    /* Heartbeat for the node's watchdog: a thread sends {"type":"alive","step_ms":N} every
     * second, N = how long the engine step in progress has been running (0 between steps). */
    pthread_mutex_t send_lock;        /* one writer on the socket at a time */
    _Atomic uint64_t step_started_ns; /* 0 between steps */
    _Atomic int heartbeat_stop;
    _Atomic int loaded; /* load() has returned: watch_node_while_loading stops */
    engine_stats sent_stats; /* last kv_stats sent to the node */
    uint64_t t_stats;        /* when */
    dist_group *dist;        /* several ranks: this instance's data plane, else NULL */
} runner;

/* ------------------------------------------------------------------ messages to the node */

static void flush(runner *r) {
    size_t off = 0;
    if (!r->out.len) return;
    pthread_mutex_lock(&r->send_lock);
    while (off < r->out.len) {
        ssize_t w = send(r->fd, r->out.data + off, r->out.len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            r->shutdown = 1; /* the node is gone */
            break;
        }
        off += (size_t)w;
    }
    pthread_mutex_unlock(&r->send_lock);
    strbuf_clear(&r->out);
}

static void send_msg(runner *r, json_t *msg) {
    protocol_append(&r->out, msg);
    json_decref(msg);
}

static void send_status(runner *r, const char *status, json_t *extra) {
    json_t *m = json_pack("{s:s,s:s}", "type", "status", "status", status);
    if (extra) {
        json_object_update(m, extra);
        json_decref(extra);
    }
    send_msg(r, m);
    flush(r);
}

static void send_done_error(runner *r, uint64_t id, int status, const char *message) {
    send_msg(r, json_pack("{s:s,s:I,s:s,s:s,s:i}", "type", "done", "id", (json_int_t)id,
                          "finish_reason", "error", "error", message, "error_status", status));
}

/* ------------------------------------------------------------------ sequences */

static seq *seq_find(runner *r, uint64_t id) {
    for (seq *s = r->seqs; s; s = s->next)
        if (s->id == id) return s;
    return NULL;
}

static void seq_remove(runner *r, seq *s) {
    for (seq **pp = &r->seqs; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    detokenizer_free(s->detok);
    if (s->parser) output_parser_free(s->parser);
    stop_strings_free(&s->stops);
    strbuf_free(&s->tool_text);
    free(s);
}

/* Renders the prompt text for a request; NULL with err on template errors. */
static char *render_prompt(runner *r, const gen_request *q, char *err, size_t errlen) {
    if (q->prompt) return strdup(q->prompt);
    if (r->tmpl) {
        /* reasoning_effort: gpt-oss's "Reasoning: low|medium|high"; thinking: DeepSeek V3.1's
         * name for enable_thinking */
        json_t *extra = json_object();
        if (q->reasoning_effort[0]) json_object_set_new(extra, "reasoning_effort", json_string(q->reasoning_effort));
        if (q->enable_thinking >= 0) json_object_set_new(extra, "thinking", json_boolean(q->enable_thinking));
        chat_render_options o = {.add_generation_prompt = 1,
                                 .enable_thinking = q->enable_thinking,
                                 .bos_token = tokenizer_bos_token(r->tok),
                                 .eos_token = tokenizer_eos_token(r->tok),
                                 .extra_vars = extra};
        char *text = chat_template_render(r->tmpl, q->messages, q->tools, &o, err, errlen);
        json_decref(extra);
        return text;
    }
    /* A model without a chat template: a plain transcript. */
    strbuf sb = {0};
    size_t i;
    json_t *m;
    json_array_foreach(q->messages, i, m) {
        strbuf_appendf(&sb, "%s: %s\n", json_string_value(json_object_get(m, "role")),
                       json_string_value(json_object_get(m, "content")));
    }
    strbuf_append_str(&sb, "assistant:");
    return strbuf_detach(&sb);
}

static int ends_in_reasoning(const char *prompt) {
    size_t n = strlen(prompt);
    while (n && (prompt[n - 1] == '\n' || prompt[n - 1] == ' ')) n--;
    return n >= 7 && !memcmp(prompt + n - 7, "<think>", 7);
}

static sampling_params sampling_from(const gen_request *q) {
    sampling_params p = sampling_params_default();
    if (q->temperature >= 0) p.temperature = (float)q->temperature;
    if (q->top_p >= 0) p.top_p = (float)q->top_p;
    if (q->min_p >= 0) p.min_p = (float)q->min_p;
    if (q->top_k >= 0) p.top_k = q->top_k;
    if (q->repetition_penalty >= 0) p.repetition_penalty = (float)q->repetition_penalty;
    if (q->presence_penalty >= 0) p.presence_penalty = (float)q->presence_penalty;
    if (q->frequency_penalty >= 0) p.frequency_penalty = (float)q->frequency_penalty;
    if (q->has_seed) p.seed = q->seed;
    p.logprobs = q->logprobs;
    p.top_logprobs = q->top_logprobs;
    return p;
}

static void start_generation(runner *r, uint64_t id, const json_t *request) {
    gen_request q;
    char err[512];
    if (seq_find(r, id)) {
        send_done_error(r, id, 400, "duplicate request id");
        return;
    }
    if (gen_request_from_json(request, &q, err, sizeof err)) {
        send_done_error(r, id, 400, err);
        return;
    }
    /* a grammar constrains the whole output: a thinking block would have to match it too */
    if (q.grammar && q.enable_thinking < 0) q.enable_thinking = 0;
    if (q.grammar) q.ban_eos = 0; /* the grammar decides where the output ends (benchmarks) */
    char *prompt = render_prompt(r, &q, err, sizeof err);
    if (!prompt) {
        send_done_error(r, id, 400, err);
        gen_request_free(&q);
        return;
    }
    int32_t *ids = NULL;
    int n = tokenizer_encode(r->tok, prompt, strlen(prompt), q.prompt != NULL, &ids, err,
                             sizeof err);
    int in_reasoning = q.prompt == NULL && ends_in_reasoning(prompt);
    free(prompt);
    if (n < 0) {
        send_done_error(r, id, 400, err);
        gen_request_free(&q);
        return;
    }
    int ctx = r->info->context_length;
    if (n == 0 || n >= ctx) {
        snprintf(err, sizeof err,
                 n ? "the prompt is %d tokens, longer than the model's context of %d tokens"
                   : "the prompt is empty",
                 n, ctx);
        send_done_error(r, id, 400, err);
        free(ids);
        gen_request_free(&q);
        return;
    }
    engine_request er = {.prompt = ids,
                         .n_prompt = n,
                         .sampling = sampling_from(&q),
                         .max_tokens = q.max_tokens > 0 && q.max_tokens < ctx - n ? q.max_tokens
                                                                                  : ctx - n,
                         .ban_eos = q.ban_eos,
                         .no_prefix_cache = q.no_prefix_cache,
                         .stop_tokens = r->format_stops,
                         .n_stop_tokens = r->n_format_stops,
                         .spec_tokens = q.spec_tokens,
                         .constraint_spec = q.grammar};
    if (q.grammar && structured_constraint(r->structured, q.grammar, &er.constraint, err,
                                           sizeof err)) {
        send_done_error(r, id, 400, err);
        free(ids);
        gen_request_free(&q);
        return;
    }
    if (engine_submit(r->engine, id, &er, err, sizeof err)) {
        if (er.constraint.ctx) er.constraint.release(er.constraint.ctx);
        send_done_error(r, id, 400, err);
        free(ids);
        gen_request_free(&q);
        return;
    }
    free(ids);
    seq *s = calloc(1, sizeof *s);
    s->id = id;
    s->detok = detokenizer_new(r->tok, !output_format_keeps_special_tokens(r->format));
    s->has_tools = q.tools != NULL;
    s->forced_tool_call = q.forced_tool_call;
    /* constrained output is the reply as it stands: no reasoning or tool-call markup to split */
    s->parser = q.grammar ? NULL : output_parser_new(r->format, in_reasoning, s->has_tools);
    if (s->parser) output_parser_set_tools(s->parser, q.tools);
    stop_strings_init(&s->stops, q.stop, q.n_stop);
    s->logprobs = q.logprobs;
    s->top_logprobs = q.top_logprobs;
    s->engine_only = q.engine_only;
    s->prompt_tokens = n;
    s->t_submit = clock_now_ns();
    s->next = r->seqs;
    r->seqs = s;
    gen_request_free(&q);
    send_msg(r, json_pack("{s:s,s:I,s:i}", "type", "accepted", "id", (json_int_t)id,
                          "prompt_tokens", n));
}

static void handle_message(runner *r, const json_t *msg) {
    const char *type = json_string_value(json_object_get(msg, "type"));
    uint64_t id = (uint64_t)json_integer_value(json_object_get(msg, "id"));
    if (!type) return;
    if (!strcmp(type, "generate")) start_generation(r, id, json_object_get(msg, "request"));
    else if (!strcmp(type, "cancel") && seq_find(r, id)) engine_cancel(r->engine, id);
    else if (!strcmp(type, "shutdown")) r->shutdown = 1;
}

/* ------------------------------------------------------------------ engine events */

/* One logprobs entry. `bytes` are the token's own bytes; `token` is the text it adds to the
 * content: for the sampled token exactly what the detokenizer released for it (`added`, so the
 * tokens join into the content), for an alternative its bytes as text (a leading space kept, as
 * OpenAI's tokens keep it; one-token decoding would strip it as at the start of a text). */
static json_t *token_logprob(runner *r, int32_t id, float lp, const char *added, size_t added_len) {
    uint8_t buf[256];
    size_t n = tokenizer_token_bytes(r->tok, id, buf, sizeof buf);
    if (n > sizeof buf) n = sizeof buf;
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(bytes, json_integer(buf[i]));
    char *text = added ? strndup(added, added_len) : tokenizer_token_text(r->tok, id, NULL);
    json_t *o = json_pack("{s:s,s:f,s:o}", "token", text ? text : "", "logprob", (double)lp,
                          "bytes", bytes);
    free(text);
    return o;
}

static json_t *event_logprobs(runner *r, const seq *s, const engine_event *ev, const char *added,
                              size_t added_len) {
    json_t *e = token_logprob(r, ev->token, ev->logprob, added, added_len);
    json_t *top = json_array();
    for (int i = 0; i < ev->n_top && i < s->top_logprobs; i++)
        json_array_append_new(top, token_logprob(r, ev->top_ids[i], ev->top_logprobs[i],
                                                 ev->top_ids[i] == ev->token ? added : NULL,
                                                 added_len));
    json_object_set_new(e, "top_logprobs", top);
    return json_pack("[o]", e);
}

/* A forced tool call: the output is held until the end, then reported as the call it spells
 * (a cut-off output, at max_tokens, stays content). */
static void forced_tool_delta(seq *s, const char *text, size_t len, int final, output_delta *d) {
    strbuf_append(&s->tool_text, text, len);
    if (!final) return;
    json_error_t jerr;
    json_t *call = s->tool_text.len ? json_loads(s->tool_text.data, 0, &jerr) : NULL;
    const char *name = json_string_value(json_object_get(call, "name"));
    json_t *arguments = json_object_get(call, "arguments");
    if (name && json_is_object(arguments)) {
        d->tool_calls = calloc(1, sizeof *d->tool_calls);
        d->tool_calls[0].name = strdup(name);
        d->tool_calls[0].arguments = json_dumps(arguments, JSON_COMPACT);
        d->n_tool_calls = 1;
    } else if (s->tool_text.len) {
        d->content = strdup(s->tool_text.data);
    }
    json_decref(call);
}

/* What released text (final: the end of the output) adds to the reply. */
static void next_delta(seq *s, const char *text, size_t len, int final, output_delta *d) {
    if (s->forced_tool_call) forced_tool_delta(s, text, len, final, d);
    else if (!s->parser) { /* no output parser (constrained output): everything is content */
        if (len) d->content = strndup(text, len);
    } else if (final) output_parser_finish(s->parser, d);
    else if (len) output_parser_feed(s->parser, text, len, d);
}

/* Sends a delta for released text (through the output parser) plus optional logprobs; final
 * also flushes the parser. */
static void emit(runner *r, seq *s, const char *text, size_t len, int final, json_t *logprobs) {
    if (final && len) {
        emit(r, s, text, len, 0, logprobs);
        logprobs = NULL;
        len = 0;
    }
    output_delta d = {0};
    next_delta(s, text, len, final, &d);
    json_t *m = json_pack("{s:s,s:I}", "type", "delta", "id", (json_int_t)s->id);
    int any = 0;
    if (d.content && d.content[0]) {
        json_object_set_new(m, "content", json_string(d.content));
        any = 1;
    }
    if (d.reasoning && d.reasoning[0]) {
        json_object_set_new(m, "reasoning", json_string(d.reasoning));
        any = 1;
        if (!(d.content && d.content[0])) s->reasoning_tokens++;
    }
    if (d.n_tool_calls) {
        json_t *calls = json_array();
        for (int i = 0; i < d.n_tool_calls; i++) {
            char cid[48];
            snprintf(cid, sizeof cid, "call_%llx%d", (unsigned long long)s->id, s->n_tool_calls++);
            json_array_append_new(calls, json_pack("{s:s,s:s,s:s}", "id", cid, "name",
                                                   d.tool_calls[i].name, "arguments",
                                                   d.tool_calls[i].arguments));
        }
        json_object_set_new(m, "tool_calls", calls);
        any = 1;
    }
    if (logprobs) {
        json_object_set_new(m, "logprobs", logprobs);
        any = 1;
    }
    json_object_set_new(m, "tokens", json_integer(s->generated));
    /* when the engine produced this token (CLOCK_MONOTONIC): lets benchmarks measure the
     * runner -> node -> client latency of each token */
    json_object_set_new(m, "t_ns", json_integer((json_int_t)s->t_last));
    output_delta_free(&d);
    if (any) send_msg(r, m);
    else json_decref(m);
}

static void finish(runner *r, seq *s, const char *reason, const char *stop_sequence) {
    char buf[512];
    strbuf rest = {0};
    size_t n = detokenizer_flush(s->detok, buf, sizeof buf);
    if (n) stop_strings_push(&s->stops, buf, n, &rest);
    stop_strings_flush(&s->stops, &rest);
    emit(r, s, rest.data ? rest.data : "", rest.len, 1, NULL);
    strbuf_free(&rest);
    if (!strcmp(reason, "stop") && s->n_tool_calls) reason = "tool_calls";
    uint64_t now = clock_now_ns();
    double ttft = s->t_first ? (double)(s->t_first - s->t_submit) / 1e9 : 0;
    double gen_s = s->t_last > s->t_first ? (double)(s->t_last - s->t_first) / 1e9 : 0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    json_t *stats = json_pack(
        "{s:f,s:f,s:i,s:i,s:f,s:I,s:b}", "prompt_tps", ttft > 0 ? s->prompt_tokens / ttft : 0.0,
        "generation_tps", gen_s > 0 ? (s->generated - 1) / gen_s : 0.0, "prompt_tokens",
        s->prompt_tokens, "generation_tokens", s->generated, "ttft_ms", ttft * 1e3,
        "peak_memory_usage", (json_int_t)ru.ru_maxrss * 1024, "prefix_cache_hit",
        s->cached_tokens > 0);
    (void)now;
    json_t *m = json_pack("{s:s,s:I,s:s,s:{s:i,s:i,s:i,s:i},s:o}", "type", "done", "id",
                          (json_int_t)s->id, "finish_reason", reason, "usage", "prompt_tokens",
                          s->prompt_tokens, "completion_tokens", s->generated, "cached_tokens",
                          s->cached_tokens, "reasoning_tokens", s->reasoning_tokens, "stats",
                          stats);
    if (stop_sequence) json_object_set_new(m, "stop_sequence", json_string(stop_sequence));
    send_msg(r, m);
    seq_remove(r, s);
}

static void handle_event(runner *r, const engine_event *ev) {
    seq *s = seq_find(r, ev->seq_id);
    if (!s) return;
    s->cached_tokens = ev->cached_tokens;
    if (ev->finish == ENGINE_FINISH_ERROR) {
        send_done_error(r, s->id, 500, ev->error[0] ? ev->error : "engine error");
        seq_remove(r, s);
        return;
    }
    if (ev->finish == ENGINE_FINISH_CANCELLED) {
        if (s->stopped_by_string)
            finish(r, s, "stop", s->stops.stops[s->stops.matched]);
        else
            finish(r, s, "cancelled", NULL);
        return;
    }
    if (s->stopped_by_string) return; /* tokens after the stop string are dropped */
    if (ev->token < 0) {
        if (ev->prefill_done - s->last_progress >= PROGRESS_EVERY) {
            s->last_progress = ev->prefill_done;
            send_msg(r, json_pack("{s:s,s:I,s:i,s:i}", "type", "progress", "id",
                                  (json_int_t)s->id, "processed", ev->prefill_done, "total",
                                  s->prompt_tokens));
        }
    } else {
        uint64_t now = clock_now_ns();
        if (!s->t_first) s->t_first = now;
        s->t_last = now;
        s->generated++;
        if (s->engine_only) {
            if (ev->finish == ENGINE_FINISH_STOP) finish(r, s, "stop", NULL);
            else if (ev->finish == ENGINE_FINISH_LENGTH) finish(r, s, "length", NULL);
            return;
        }
        char piece[512];
        size_t n = detokenizer_push(s->detok, ev->token, piece, sizeof piece);
        strbuf out = {0};
        int hit = stop_strings_push(&s->stops, piece, n, &out);
        json_t *lp = s->logprobs ? event_logprobs(r, s, ev, piece, n) : NULL;
        emit(r, s, out.data ? out.data : "", out.len, 0, lp);
        strbuf_free(&out);
        if (hit) {
            s->stopped_by_string = 1;
            if (ev->finish != ENGINE_FINISH_NONE) {
                finish(r, s, "stop", s->stops.stops[s->stops.matched]);
                return;
            }
            engine_cancel(r->engine, s->id);
            return;
        }
    }
    if (ev->finish == ENGINE_FINISH_STOP) finish(r, s, "stop", NULL);
    else if (ev->finish == ENGINE_FINISH_LENGTH) finish(r, s, "length", NULL);
}

/* Tells the node the scheduler's and KV cache's state (for /metrics) when it changed: at most
 * every 100 ms while busy, and always once the engine goes idle, so the last word is exact. */
static void send_stats(runner *r, int force) {
    engine_stats st;
    engine_get_stats(r->engine, &st);
    uint64_t now = clock_now_ns();
    const engine_stats *o = &r->sent_stats;
    if (st.kv_blocks_total == o->kv_blocks_total && st.kv_blocks_free == o->kv_blocks_free &&
        st.kv_blocks_cached == o->kv_blocks_cached && st.n_running == o->n_running &&
        st.n_waiting == o->n_waiting && st.preemptions == o->preemptions &&
        st.spec_verifies == o->spec_verifies)
        return;
    if (!force && now - r->t_stats < 100000000u) return;
    r->sent_stats = st;
    r->t_stats = now;
    send_msg(r, json_pack("{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:I,s:I,s:I,s:I}", "type", "kv_stats",
                          "blocks_total", st.kv_blocks_total, "blocks_free", st.kv_blocks_free,
                          "blocks_cached", st.kv_blocks_cached, "block_tokens",
                          st.kv_block_tokens, "running", st.n_running, "waiting", st.n_waiting,
                          "preemptions", (json_int_t)st.preemptions, "spec_verifies",
                          (json_int_t)st.spec_verifies, "spec_drafted",
                          (json_int_t)st.spec_drafted, "spec_accepted",
                          (json_int_t)st.spec_accepted));
}

/* ------------------------------------------------------------------ load, warm up, serve */

static int config_layers(const char *dir) {
    size_t len;
    char *text = model_config_read_json(dir, &len, NULL, 0);
    json_t *c = text ? json_loadb(text, len, 0, NULL) : NULL;
    free(text);
    json_t *tc = json_object_get(c, "text_config");
    int n = (int)json_integer_value(json_object_get(tc ? tc : c, "num_hidden_layers"));
    json_decref(c);
    return n;
}

static int warm_up(runner *r) {
    int32_t *ids = NULL;
    char err[256];
    int n = tokenizer_encode(r->tok, "Hello", 5, 1, &ids, err, sizeof err);
    if (n <= 0) {
        free(ids);
        return 0; /* nothing to warm up with; not fatal */
    }
    engine_request q = {.prompt = ids, .n_prompt = n, .sampling = sampling_params_default(),
                        .max_tokens = 2, .no_prefix_cache = 1};
    const uint64_t warm_id = UINT64_MAX;
    if (engine_submit(r->engine, warm_id, &q, err, sizeof err)) {
        free(ids);
        log_warn("warm-up skipped: %s", err);
        return 0;
    }
    free(ids);
    engine_event ev[8];
    for (int guard = 0; engine_pending(r->engine) && guard < 100000; guard++)
        if (engine_step(r->engine, ev, 8) < 0) return -1;
    return 0;
}

/* Several ranks: joins the instance's data plane (every rank waits for the others here). */
static int connect_ranks(runner *r, const runner_options *o, char *err, size_t errlen) {
    const runner_dist *d = &o->dist;
    if (d->size <= 1) return 0;
    if (!d->store) {
        snprintf(err, errlen, "a runner of %d ranks needs a rendezvous store", d->size);
        return -1;
    }
    dist_config c = {.rank = d->rank, .size = d->size,
                     .prefix = d->instance ? d->instance : "exo",
                     .bind_host = d->bind_host ? d->bind_host : "127.0.0.1",
                     .advertise_host = d->advertise_host, .timeout_ms = d->timeout_ms,
                     .transport = d->transport};
    r->dist = dist_connect(&c, d->store, err, errlen);
    return r->dist ? 0 : -1;
}

/* engine_options.make_constraint: on the rank that samples (a pipeline's last stage, another
 * process than rank 0's), a constrained request's grammar becomes this runner's constraint. */
static int make_constraint(void *ctx, const char *grammar_text, engine_constraint *out, char *err,
                           size_t errlen) {
    runner *r = ctx;
    return structured_constraint(r->structured, grammar_text, out, err, errlen);
}

static int load(runner *r, const runner_options *o) {
    char err[512];
    /* exo's order: the ranks connect, then each loads its shard. */
    if (o->dist.size > 1) {
        send_status(r, "Connecting", NULL);
        if (connect_ranks(r, o, err, sizeof err)) {
            send_status(r, "Failed", json_pack("{s:s}", "error", err));
            return -1;
        }
        send_status(r, "Connected", NULL);
    }
    int layers = config_layers(o->model_dir);
    send_status(r, "Loading", json_pack("{s:i,s:i}", "layers_loaded", 0, "total_layers", layers));
    r->tok = model_text_tokenizer_load(o->model_dir, err, sizeof err);
    if (!r->tok) {
        send_status(r, "Failed", json_pack("{s:s}", "error", err));
        return -1;
    }
    engine_options eo = {.model_dir = o->model_dir, .n_threads = o->n_threads,
                         .kv_cache_bytes = o->kv_cache_bytes,
                         .kv_cache_dtype = o->kv_cache_dtype, .device = o->device,
                         .speculative = o->speculative, .spec_tokens = o->spec_tokens,
                         .dist = r->dist, .parallel = r->dist ? o->dist.parallel : ENGINE_SINGLE,
                         .layer_start = o->dist.layer_start, .layer_end = o->dist.layer_end,
                         .dist_timeout_ms = o->dist.timeout_ms,
                         .make_constraint = make_constraint, .make_constraint_ctx = r};
    r->engine = engine_open(&eo, err, sizeof err);
    if (!r->engine) {
        send_status(r, "Failed", json_pack("{s:s}", "error", err));
        return -1;
    }
    r->info = engine_get_info(r->engine);
    const char *src = tokenizer_chat_template(r->tok);
    if (src) {
        r->tmpl = chat_template_compile(src, err, sizeof err);
        if (!r->tmpl) log_warn("chat template does not compile (%s); using a plain transcript", err);
    }
    r->format = output_format_detect(r->info->architecture, src);
    /* turn ends the format has besides the model's eos (gpt-oss: <|call|> after a tool call) */
    for (const char *const *t = output_format_stop_tokens(r->format); *t && r->n_format_stops < 4; t++) {
        int32_t id = tokenizer_token_id(r->tok, *t);
        if (id >= 0) r->format_stops[r->n_format_stops++] = id;
    }
    r->structured = structured_new(r->tok, r->info);
    send_status(r, "Loaded", NULL);
    send_status(r, "WarmingUp", NULL);
    if (o->dist.rank == 0 && warm_up(r)) { /* followers warm up inside rank 0's steps */
        send_status(r, "Failed", json_pack("{s:s}", "error", "the engine failed during warm-up"));
        return -1;
    }
    send_status(r, "Ready", json_pack("{s:{s:i,s:s,s:i,s:s}}", "info", "context_length",
                                      r->info->context_length, "architecture",
                                      r->info->architecture, "n_layers", r->info->n_layers,
                                      "model_id", o->model_id ? o->model_id : ""));
    return 0;
}

static int read_messages(runner *r, int timeout_ms) {
    struct pollfd p = {.fd = r->fd, .events = POLLIN};
    int rc = poll(&p, 1, timeout_ms);
    if (rc < 0) return errno == EINTR ? 0 : -1;
    if (rc == 0) return 0;
    char buf[65536];
    ssize_t n = read(r->fd, buf, sizeof buf);
    if (n <= 0) return n < 0 && errno == EINTR ? 0 : -1;
    protocol_reader_feed(&r->reader, buf, (size_t)n);
    json_t *m;
    int bad = 0;
    while ((m = protocol_reader_next(&r->reader, &bad))) {
        handle_message(r, m);
        json_decref(m);
    }
    return bad ? -1 : 0;
}

/* Tells the node this process is alive (not stopped, not frozen) once a second, with how long
 * the current engine step has run: the node's watchdog restarts a runner that falls silent, or
 * whose single step runs far longer than any step should. */
static void *heartbeat_main(void *arg) {
    runner *r = arg;
    while (!atomic_load(&r->heartbeat_stop)) {
        for (int i = 0; i < 10 && !atomic_load(&r->heartbeat_stop); i++) clock_sleep_ms(100);
        if (atomic_load(&r->heartbeat_stop)) break;
        uint64_t t = atomic_load(&r->step_started_ns), now = clock_now_ns();
        json_t *alive = json_pack("{s:s,s:I}", "type", "alive", "step_ms",
                                  (json_int_t)(t && now > t ? (now - t) / 1000000 : 0));
        pthread_mutex_lock(&r->send_lock);
        int rc = alive ? protocol_send(r->fd, alive) : 0;
        pthread_mutex_unlock(&r->send_lock);
        json_decref(alive);
        if (rc) break; /* the node is gone; the main loop sees it too */
    }
    return NULL;
}

/* A follower's node socket, watched while the main thread follows rank 0: a "shutdown" or the
 * node going away (EOF) stops the following, so a runner whose node gave up on it exits instead
 * of holding its shard until rank 0 notices. */
static void *watch_node_main(void *arg) {
    runner *r = arg;
    while (!atomic_load(&r->heartbeat_stop)) {
        if (read_messages(r, 100) < 0) r->shutdown = 1; /* EOF or a broken stream */
        if (r->shutdown) {
            engine_stop_following(r->engine);
            break;
        }
    }
    return NULL;
}

/* A rank other than 0: mirrors rank 0's steps until it shuts down. Returns the exit code. */
static int follow(runner *r) {
    atomic_store(&r->step_started_ns, 0);
    pthread_t watcher;
    int watching = pthread_create(&watcher, NULL, watch_node_main, r) == 0;
    int rc = engine_follow(r->engine);
    atomic_store(&r->heartbeat_stop, 1); /* also ends the watcher */
    if (watching) pthread_join(watcher, NULL);
    if (rc == 0) return 0;
    log_error("%s", engine_last_error(r->engine));
    send_status(r, "Failed", json_pack("{s:s}", "error", engine_last_error(r->engine)));
    return 1;
}

/* While the ranks connect and the shard loads, nothing reads the node socket, and a peer that
 * never comes can hold Gloo's pair connect past any timeout: a runner whose node died or gave up
 * then lived on, orphaned, holding its ports and memory. This thread watches only for the node's
 * end closing (POLLRDHUP: the node's messages stay unread for the main loop) and leaves at once. */
static void *watch_node_while_loading(void *arg) {
    runner *r = arg;
    while (!atomic_load(&r->loaded)) {
        struct pollfd p = {.fd = r->fd, .events = POLLRDHUP};
        if (poll(&p, 1, 200) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            log_warn("the node closed this runner's socket while it was connecting or loading: "
                     "exiting");
            _exit(0); /* like a follower whose node leaves: nothing is left to report to */
        }
    }
    return NULL;
}

int runner_run(const runner_options *o) {
    runner r = {.fd = o->fd, .model_id = o->model_id};
    pthread_mutex_init(&r.send_lock, NULL);
    int rc = 1;
    pthread_t heartbeat;
    int heartbeat_started = 0;
    pthread_t load_watcher;
    int load_watched = pthread_create(&load_watcher, NULL, watch_node_while_loading, &r) == 0;
    int load_failed = load(&r, o);
    atomic_store(&r.loaded, 1);
    if (load_watched) pthread_join(load_watcher, NULL);
    if (load_failed) goto out;
    heartbeat_started = pthread_create(&heartbeat, NULL, heartbeat_main, &r) == 0;
    if (o->dist.size > 1 && o->dist.rank != 0) {
        rc = follow(&r);
        goto out;
    }
    r.sent_stats.kv_blocks_total = -1; /* the first report always goes out */
    send_stats(&r, 1);
    flush(&r);
    engine_event *events = calloc(MAX_EVENTS, sizeof *events);
    /* several ranks: an idle rank 0 still steps now and then, so the others' wait for the next
     * step never reaches the data plane's timeout */
    int keepalive_ms = engine_idle_step_ms(r.engine);
    while (!r.shutdown) {
        int busy = engine_pending(r.engine) > 0;
        if (read_messages(&r, busy ? 0 : keepalive_ms)) break; /* node gone */
        flush(&r); /* accepted / rejected answers */
        if (!engine_pending(r.engine) && keepalive_ms < 0) continue;
        atomic_store(&r.step_started_ns, clock_now_ns());
        int n = engine_step(r.engine, events, MAX_EVENTS);
        atomic_store(&r.step_started_ns, 0);
        if (n < 0) {
            const char *why = engine_last_error(r.engine);
            for (seq *s = r.seqs; s;) {
                seq *next = s->next;
                send_done_error(&r, s->id, 500, why[0] ? why : "the engine failed");
                seq_remove(&r, s);
                s = next;
            }
            log_error("engine step failed (%s); exiting", why);
            break;
        }
        for (int i = 0; i < n; i++) handle_event(&r, &events[i]);
        send_stats(&r, engine_pending(r.engine) == 0);
        flush(&r);
    }
    free(events);
    rc = r.shutdown ? 0 : 1;
    if (!r.shutdown) log_info("the node closed the connection; exiting");
out:
    if (heartbeat_started) {
        atomic_store(&r.heartbeat_stop, 1);
        pthread_join(heartbeat, NULL);
    }
    while (r.seqs) seq_remove(&r, r.seqs);
    flush(&r);
    strbuf_free(&r.out);
    protocol_reader_free(&r.reader);
    if (r.tmpl) chat_template_free(r.tmpl);
    if (r.engine) engine_close(r.engine); /* rank 0: also tells the other ranks to stop */
    structured_free(r.structured);        /* after the engine released its constraints */
    if (r.dist) dist_close(r.dist);
    if (r.tok) tokenizer_free(r.tok);
    pthread_mutex_destroy(&r.send_lock);
    return rc;
}
