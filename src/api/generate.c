/* generate — the shared generation driver and the field helpers adapters use (see gen.h).
 *
 * Threads: the handler runs on the connection's thread; runner messages arrive on the
 * instance's reader thread (on_message). Until the stream exists, messages wait in a backlog;
 * afterwards on_message encodes and writes them directly. The state is refcounted: the handler
 * and the in-flight call each hold one reference. */
#include "api/gen.h"

#include "api/metrics.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/sync.h"

#include <math.h>
#include <stdatomic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ------------------------------------------------------------------ active generations */

#define MAX_ACTIVE 4096
static pthread_mutex_t active_lock = PTHREAD_MUTEX_INITIALIZER;
static gen_state *active[MAX_ACTIVE];

static void active_add(gen_state *st) {
    pthread_mutex_lock(&active_lock);
    for (int i = 0; i < MAX_ACTIVE; i++)
        if (!active[i]) {
            active[i] = st;
            break;
        }
    pthread_mutex_unlock(&active_lock);
}

static void active_remove(gen_state *st) {
    pthread_mutex_lock(&active_lock);
    for (int i = 0; i < MAX_ACTIVE; i++)
        if (active[i] == st) active[i] = NULL;
    pthread_mutex_unlock(&active_lock);
}

int gen_cancel(const char *api_id) {
    instances *m = NULL;
    uint64_t call = 0;
    pthread_mutex_lock(&active_lock);
    for (int i = 0; i < MAX_ACTIVE; i++)
        if (active[i] && !strcmp(active[i]->id, api_id) && active[i]->call_id) {
            m = active[i]->instances;
            call = active[i]->call_id;
            break;
        }
    pthread_mutex_unlock(&active_lock);
    if (!m) return -1;
    instances_cancel(m, call);
    return 0;
}

void gen_make_id(char *out, size_t n, const char *prefix) {
    unsigned char b[12];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        uint64_t t = clock_now_ns();
        memcpy(b, &t, 8);
        memset(b + 8, 0x5a, 4);
    }
    char hex[25];
    for (int i = 0; i < 12; i++) snprintf(hex + 2 * i, 3, "%02x", b[i]);
    snprintf(out, n, "%s%s", prefix, hex);
}

/* ------------------------------------------------------------------ state */

const char *gen_stream_content_type(const gen_stream_format *f) {
    return f->framing == GEN_FRAMING_SSE ? "text/event-stream" : "application/x-ndjson";
}

gen_state *gen_state_new(const gen_adapter *a, instances *m) {
    gen_state *st = calloc(1, sizeof *st);
    st->adapter = a;
    gen_make_id(st->id, sizeof st->id, a->id_prefix);
    gen_request_init(&st->req);
    st->created = clock_unix_seconds();
    st->tool_calls = json_array();
    st->logprobs = json_array();
    st->backlog = json_array();
    st->instances = m;
    st->refs = 1;
    st->t_start_ns = clock_now_ns();
    pthread_mutex_init(&st->lock, NULL);
    sync_cond_init_monotonic(&st->cond);
    return st;
}

static void state_unref(gen_state *st) {
    if (atomic_fetch_sub(&st->refs, 1) != 1) return;
    gen_request_free(&st->req);
    strbuf_free(&st->content);
    strbuf_free(&st->reasoning);
    json_decref(st->tool_calls);
    json_decref(st->logprobs);
    json_decref(st->backlog);
    json_decref(st->stats);
    json_decref(st->scratch);
    strbuf_free(&st->frame_prefix);
    free(st->stop_sequence);
    free(st->error);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cond);
    free(st);
}

static void accumulate(gen_state *st, const json_t *msg, const char *type);
void gen_state_release(gen_state *st) { state_unref(st); }

void gen_state_accumulate(gen_state *st, const json_t *message) {
    const char *type = json_string_value(json_object_get(message, "type"));
    if (type) accumulate(st, message, type);
}

/* Folds one runner message into the accumulated result. st->lock held. */
static void accumulate(gen_state *st, const json_t *msg, const char *type) {
    if (!strcmp(type, "accepted")) {
        st->accepted = 1;
        st->prompt_tokens = (int)json_integer_value(json_object_get(msg, "prompt_tokens"));
    } else if (!strcmp(type, "delta")) {
        const char *c = json_string_value(json_object_get(msg, "content"));
        const char *r = json_string_value(json_object_get(msg, "reasoning"));
        if (c) strbuf_append_str(&st->content, c);
        if (r) strbuf_append_str(&st->reasoning, r);
        json_array_extend(st->tool_calls, json_object_get(msg, "tool_calls"));
        json_array_extend(st->logprobs, json_object_get(msg, "logprobs"));
        uint64_t now = clock_now_ns();
        if (!st->t_first_ns) {
            st->t_first_ns = now;
            metrics_ttft((double)(now - st->t_start_ns) / 1e9);
        } else {
            metrics_inter_token((double)(now - st->t_last_ns) / 1e9);
        }
        st->t_last_ns = now;
    } else if (!strcmp(type, "done")) {
        st->done = 1;
        const char *f = json_string_value(json_object_get(msg, "finish_reason"));
        snprintf(st->finish_reason, sizeof st->finish_reason, "%s", f ? f : "stop");
        const char *ss = json_string_value(json_object_get(msg, "stop_sequence"));
        if (ss) st->stop_sequence = strdup(ss);
        const char *e = json_string_value(json_object_get(msg, "error"));
        if (e) st->error = strdup(e);
        st->error_status = (int)json_integer_value(json_object_get(msg, "error_status"));
        json_t *u = json_object_get(msg, "usage");
        if (u) {
            int p = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
            if (p) st->prompt_tokens = p;
            st->completion_tokens = (int)json_integer_value(json_object_get(u, "completion_tokens"));
            st->cached_tokens = (int)json_integer_value(json_object_get(u, "cached_tokens"));
            st->reasoning_tokens = (int)json_integer_value(json_object_get(u, "reasoning_tokens"));
        }
        json_t *stats = json_object_get(msg, "stats");
        if (stats) st->stats = json_incref(stats);
        metrics_tokens((uint64_t)st->prompt_tokens, (uint64_t)st->completion_tokens);
    }
}

/* Encodes one message into stream frames. st->lock held, stream attached. */
static void encode(gen_state *st, const json_t *msg, const char *type, strbuf *out) {
    if (!strcmp(type, "delta")) {
        st->adapter->stream->delta(st, msg, out);
    } else if (!strcmp(type, "progress") && st->adapter->stream->framing == GEN_FRAMING_SSE) {
        strbuf_appendf(out, ": prefill_progress {\"processed_tokens\":%lld,\"total_tokens\":%lld}\n\n",
                       (long long)json_integer_value(json_object_get(msg, "processed")),
                       (long long)json_integer_value(json_object_get(msg, "total")));
    } else if (!strcmp(type, "done")) {
        if (st->error && strcmp(st->finish_reason, "cancelled")) {
            st->adapter->stream->error(st, st->error, out);
        } else {
            if (st->bench && st->stats && st->adapter->stream->framing == GEN_FRAMING_SSE) {
                char *text = json_dumps(st->stats, JSON_COMPACT);
                strbuf_appendf(out, ": generation_stats %s\n\n", text);
                free(text);
            }
            st->adapter->stream->end(st, out);
        }
    }
}

static void flush_locked(gen_state *st, const json_t *msg) {
    const char *type = json_string_value(json_object_get(msg, "type"));
    if (!type) return;
    strbuf out = {0};
    encode(st, msg, type, &out);
    if (out.len) api_stream_write(st->stream, out.data, out.len);
    strbuf_free(&out);
    if (!strcmp(type, "done")) {
        api_stream_close(st->stream);
        st->stream = NULL;
    }
}

static void on_message(void *arg, const json_t *msg) {
    gen_state *st = arg;
    const char *type = json_string_value(json_object_get(msg, "type"));
    if (!type) return;
    pthread_mutex_lock(&st->lock);
    accumulate(st, msg, type);
    if (st->stream_ready && st->stream) flush_locked(st, msg);
    else if (st->req.stream) json_array_append(st->backlog, (json_t *)msg);
    int done = !strcmp(type, "done");
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    if (done) {
        active_remove(st);
        state_unref(st); /* the call's reference */
    }
}

static void on_disconnect(void *arg) {
    gen_state *st = arg;
    log_debug("client of %s went away; cancelling", st->id);
    instances_cancel(st->instances, st->call_id);
}

static void release_state(void *arg) { state_unref(arg); }

/* SSE keep-alive interval: 10 s as exo; EXO_SSE_KEEPALIVE_MS overrides (tests use a short one). */
static int keepalive_ms(void) {
    const char *v = getenv("EXO_SSE_KEEPALIVE_MS");
    int ms = v ? atoi(v) : 0;
    return ms > 0 ? ms : 10000;
}

/* ------------------------------------------------------------------ the handler */

static void respond_error(gen_state *st, api_request *r, int status, const char *msg) {
    metrics_request(st->adapter->name, status);
    st->adapter->error(r, status, msg);
}

/* An error after the SSE stream was opened for a download (early != NULL) goes into the stream
 * in the API's own error shape; otherwise it is the HTTP answer. */
static void fail(gen_state *st, api_request *r, api_stream *early, int status, const char *msg) {
    if (!early) {
        respond_error(st, r, status, msg);
        return;
    }
    strbuf out = {0};
    st->adapter->stream->error(st, msg, &out);
    if (out.len) api_stream_write(early, out.data, out.len);
    strbuf_free(&out);
    api_stream_close(early);
}

/* How long a request that cannot show progress (non-streamed, NDJSON) waits for a download
 * before a 503 with Retry-After: EXO_DOWNLOAD_WAIT_S, default 30 s. */
static double download_wait_s(void) {
    const char *v = getenv("EXO_DOWNLOAD_WAIT_S");
    return v && *v ? atof(v) : 30.0;
}

static void progress_text(const json_t *entry, char *out, size_t n) {
    json_t *on = json_object_get(entry, "DownloadOngoing");
    json_t *dp = json_object_get(on, "downloadProgress");
    double done = json_number_value(json_object_get(json_object_get(dp, "downloaded"), "inBytes"));
    double total = json_number_value(json_object_get(json_object_get(dp, "total"), "inBytes"));
    if (total > 0)
        snprintf(out, n, "%.0f%%, %.1f of %.1f MB", 100.0 * done / total, done / 1e6, total / 1e6);
    else snprintf(out, n, "starting");
}

/* The model is not on disk: start its download (ctx->fetcher) and wait for it. An SSE stream
 * opens at once and carries ": download_progress {state.downloads entry}" comments about once a
 * second until the download ends (*early = that stream). Other requests wait up to
 * download_wait_s() and then get 503 + Retry-After with the progress in the message; the
 * download keeps running. Returns 0 when the model is on disk, an HTTP status with err, or -1
 * when the client went away (the stream is closed; the download goes on). */
static int fetch_model(gen_state *st, api_request *r, gen_context *ctx, api_stream **early,
                       char *err, size_t errlen) {
    const api_model_fetcher *f = &ctx->fetcher;
    int rc = f->start(f->ud, st->req.model, err, errlen);
    if (rc) return rc;
    log_info("%s: model %s is not on disk; downloading it first", st->id, st->req.model);
    if (st->req.stream && st->adapter->stream->framing == GEN_FRAMING_SSE) {
        *early = api_respond_stream(r, 200, gen_stream_content_type(st->adapter->stream));
        metrics_request(st->adapter->name, 200);
        api_stream_set_keepalive(*early, ": keep-alive\n\n", keepalive_ms());
    }
    uint64_t t0 = clock_now_ns(), last_sent = 0;
    for (;;) {
        json_t *entry = NULL;
        int p = f->poll(f->ud, st->req.model, &entry, err, errlen);
        uint64_t now = clock_now_ns();
        if (*early && entry && (p != 0 || !last_sent || now - last_sent >= 1000000000ull)) {
            char *text = json_dumps(entry, JSON_COMPACT);
            int w = text ? api_stream_printf(*early, ": download_progress %s\n\n", text) : 0;
            free(text);
            last_sent = now;
            if (w < 0) {
                json_decref(entry);
                api_stream_close(*early);
                *early = NULL;
                return -1;
            }
        }
        if (p != 0) {
            json_decref(entry);
            if (p < 0) return 503;
            return 0;
        }
        if (!*early && (double)(now - t0) / 1e9 >= download_wait_s()) {
            char prog[96];
            progress_text(entry, prog, sizeof prog);
            json_decref(entry);
            api_request_add_response_header(r, "Retry-After", "10");
            snprintf(err, errlen,
                     "model '%s' is being downloaded to this node (%s); retry in a few seconds "
                     "(progress: GET /download/status, or stream the request to wait for it)",
                     st->req.model, prog);
            return 503;
        }
        json_decref(entry);
        if (!*early && api_request_client_gone(r)) return -1;
        clock_sleep_ms(200);
    }
}

void gen_handle(api_request *r, const gen_adapter *a, gen_context *ctx, int bench) {
    gen_state *st = gen_state_new(a, ctx->instances);
    st->bench = bench;
    char err[1024];
    json_t *body = api_request_json_quiet(r, err, sizeof err);
    if (!body) {
        respond_error(st, r, 400, err);
        state_unref(st);
        return;
    }
    int status = a->parse(body, st, err, sizeof err);
    if (!status && bench) /* bench/api/overhead.mjs: the engine's own pace, same runner */
        status = gen_get_bool(body, "engine_only", &st->req.engine_only, err, sizeof err);
    json_decref(body);
    if (status) {
        respond_error(st, r, status, err);
        state_unref(st);
        return;
    }
    /* One model, one identity (a path inside the model dirs becomes its id; any other path is
     * refused): the runner table, the router and the download all see the same id. */
    char model_id[sizeof st->req.model];
    if (instances_canonical_model(ctx->instances, st->req.model, model_id, sizeof model_id, err,
                                  sizeof err)) {
        respond_error(st, r, 404, err);
        state_unref(st);
        return;
    }
    snprintf(st->req.model, sizeof st->req.model, "%s", model_id);
    if (bench) {
        st->req.ban_eos = 1;
        if (!st->req.max_tokens) st->req.max_tokens = 128;
    }
    api_stream *early = NULL; /* an SSE stream opened while the model downloads */
    char dir[1024];
    if (ctx->fetcher.start &&
        instances_resolve_model(ctx->instances, st->req.model, dir, sizeof dir) < 0 &&
        !instances_serves_anywhere(ctx->instances, st->req.model)) {
        status = fetch_model(st, r, ctx, &early, err, sizeof err);
        if (status) {
            if (status > 0) fail(st, r, early, status, err);
            state_unref(st);
            return;
        }
    }
    st->refs++; /* the call's reference, dropped after "done" */
    active_add(st);
    status = instances_generate(ctx->instances, &st->req, on_message, st, &st->call_id, err,
                                sizeof err);
    if (status) {
        active_remove(st);
        st->refs--;
        fail(st, r, early, status, err);
        state_unref(st);
        return;
    }
    /* Wait until the runner accepted (or rejected) the request, so a bad prompt is an HTTP
     * error and not a broken stream. */
    pthread_mutex_lock(&st->lock);
    while (!st->accepted && !st->done) pthread_cond_wait(&st->cond, &st->lock);
    if (!st->accepted && st->done) {
        int code = st->error_status ? st->error_status : 500;
        snprintf(err, sizeof err, "%s", st->error ? st->error : "generation failed");
        pthread_mutex_unlock(&st->lock);
        fail(st, r, early, code, err);
        state_unref(st);
        return;
    }
    if (st->req.stream) {
        if (early) st->stream = early;
        else {
            st->stream = api_respond_stream(r, 200, gen_stream_content_type(a->stream));
            metrics_request(a->name, 200);
            if (a->stream->framing == GEN_FRAMING_SSE)
                api_stream_set_keepalive(st->stream, ": keep-alive\n\n", keepalive_ms());
        }
        strbuf out = {0};
        a->stream->begin(st, &out);
        if (out.len) api_stream_write(st->stream, out.data, out.len);
        strbuf_free(&out);
        st->stream_ready = 1;
        size_t i;
        json_t *m;
        json_array_foreach(st->backlog, i, m) {
            if (st->stream) flush_locked(st, m);
        }
        json_array_clear(st->backlog);
        if (st->stream) {
            st->refs++; /* the stream's reference, released when it is destroyed */
            api_stream_on_disconnect(st->stream, on_disconnect, st, release_state);
        }
        pthread_mutex_unlock(&st->lock);
        state_unref(st);
        return;
    }
    /* Non-streamed: wait for the end, cancelling if the client goes away meanwhile. */
    while (!st->done) {
        sync_cond_wait_ms(&st->cond, &st->lock, 200);
        if (!st->done && api_request_client_gone(r)) instances_cancel(st->instances, st->call_id);
    }
    pthread_mutex_unlock(&st->lock);
    if (st->error && strcmp(st->finish_reason, "cancelled")) {
        respond_error(st, r, st->error_status ? st->error_status : 500, st->error);
    } else {
        metrics_request(a->name, 200);
        api_respond_json(r, 200, a->final(st));
    }
    state_unref(st);
}

/* ------------------------------------------------------------------ field helpers */

/* o[field] when present, not null and an integer (integer) or any number; else NULL with *rc
 * 0 (absent) or 400 and err (another type). */
static json_t *number_field(const json_t *o, const char *field, int integer, int *rc, char *err,
                            size_t errlen) {
    json_t *v = json_object_get(o, field);
    *rc = 0;
    if (!v || json_is_null(v)) return NULL;
    if (integer ? json_is_integer(v) : json_is_number(v)) return v;
    snprintf(err, errlen, "'%s' must be %s", field, integer ? "an integer" : "a number");
    *rc = 400;
    return NULL;
}

int gen_get_number(const json_t *o, const char *field, double lo, double hi, double *out,
                   char *err, size_t errlen) {
    int rc;
    json_t *v = number_field(o, field, 0, &rc, err, errlen);
    if (!v) return rc;
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi) || isnan(d)) {
        snprintf(err, errlen, "'%s' must be between %g and %g (got %g)", field, lo, hi, d);
        return 400;
    }
    *out = d;
    return 0;
}

int gen_get_int(const json_t *o, const char *field, long lo, long hi, long *out, char *err,
                size_t errlen) {
    int rc;
    json_t *v = number_field(o, field, 1, &rc, err, errlen);
    if (!v) return rc;
    json_int_t d = json_integer_value(v);
    if ((d < lo || d > hi) && lo == hi) {
        snprintf(err, errlen, "'%s' must be %ld (got %lld)", field, lo, (long long)d);
        return 400;
    }
    if (d < lo || d > hi) {
        snprintf(err, errlen, "'%s' must be between %ld and %ld (got %lld)", field, lo, hi,
                 (long long)d);
        return 400;
    }
    *out = (long)d;
    return 0;
}

int gen_set_reasoning_effort(gen_request *q, const char *effort, const char *field, char *err, size_t errlen) {
    if (!effort) return 0;
    static const char *const known[] = {"none", "minimal", "low", "medium", "high"};
    size_t i = 0;
    while (i < sizeof known / sizeof *known && strcmp(effort, known[i])) i++;
    if (i == sizeof known / sizeof *known) {
        snprintf(err, errlen, "'%s' must be one of none, minimal, low, medium, high", field);
        return 400;
    }
    if (i == 0) {
        if (q->enable_thinking < 0) q->enable_thinking = 0;
        return 0;
    }
    snprintf(q->reasoning_effort, sizeof q->reasoning_effort, "%s", i == 1 ? "low" : effort);
    if (q->enable_thinking < 0) q->enable_thinking = 1;
    return 0;
}

int gen_get_bool(const json_t *o, const char *field, int *out, char *err, size_t errlen) {
    json_t *v = json_object_get(o, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        snprintf(err, errlen, "'%s' must be true or false", field);
        return 400;
    }
    *out = json_is_true(v);
    return 0;
}

int gen_get_model(const json_t *o, gen_state *st, char *err, size_t errlen) {
    json_t *v = json_object_get(o, "model");
    if (!v) {
        snprintf(err, errlen, "'model' is required");
        return 400;
    }
    if (!json_is_string(v) || !json_string_length(v)) {
        snprintf(err, errlen, "'model' must be a non-empty string");
        return 400;
    }
    if (json_string_length(v) >= sizeof st->req.model) {
        snprintf(err, errlen, "'model' is too long");
        return 400;
    }
    snprintf(st->req.model, sizeof st->req.model, "%s", json_string_value(v));
    return 0;
}

int gen_get_stop(const json_t *o, const char *field, gen_request *req, char *err, size_t errlen) {
    json_t *v = json_object_get(o, field);
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v)) req->stop[req->n_stop++] = strdup(json_string_value(v));
        return 0;
    }
    if (!json_is_array(v)) {
        snprintf(err, errlen, "'%s' must be a string or an array of strings", field);
        return 400;
    }
    if (json_array_size(v) > GEN_MAX_STOP) {
        snprintf(err, errlen, "'%s' has more than %d entries", field, GEN_MAX_STOP);
        return 400;
    }
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) {
            snprintf(err, errlen, "'%s[%zu]' must be a string", field, i);
            return 400;
        }
        if (json_string_length(s)) req->stop[req->n_stop++] = strdup(json_string_value(s));
    }
    return 0;
}

int gen_content_text(const json_t *content, const char *field, strbuf *out, char *err,
                     size_t errlen) {
    if (!content || json_is_null(content)) return 0;
    if (json_is_string(content)) {
        strbuf_append_str(out, json_string_value(content));
        return 0;
    }
    if (!json_is_array(content)) {
        snprintf(err, errlen, "'%s' must be a string or an array of content parts", field);
        return 400;
    }
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        if (json_is_string(part)) {
            strbuf_append_str(out, json_string_value(part));
            continue;
        }
        const char *type = json_string_value(json_object_get(part, "type"));
        const char *text = json_string_value(json_object_get(part, "text"));
        if (!json_is_object(part) || !type) {
            snprintf(err, errlen, "'%s[%zu]' must be an object with a 'type'", field, i);
            return 400;
        }
        if (!strcmp(type, "text") || !strcmp(type, "input_text") || !strcmp(type, "output_text")) {
            if (!text) {
                snprintf(err, errlen, "'%s[%zu].text' must be a string", field, i);
                return 400;
            }
            strbuf_append_str(out, text);
        } else if (!strcmp(type, "image_url") || !strcmp(type, "image") ||
                   !strcmp(type, "input_image")) {
            snprintf(err, errlen, "'%s[%zu]': images are not supported by this model", field, i);
            return 400;
        }
        /* other part kinds (cache_control hints, ...) carry no text */
    }
    return 0;
}

void gen_template_reasoning(json_t *message, const char *reasoning) {
    if (!reasoning) return;
    json_object_set_new(message, "reasoning_content", json_string(reasoning));
    json_object_set_new(message, "thinking", json_string(reasoning));
}

json_t *gen_template_tool_call(const char *id, const char *name, const json_t *arguments) {
    json_t *args = NULL;
    if (json_is_string(arguments))
        args = json_loads(json_string_value(arguments), JSON_DECODE_ANY, NULL);
    else if (arguments)
        args = json_deep_copy(arguments);
    if (!args) args = json_object();
    return json_pack("{s:s,s:s,s:{s:s,s:o}}", "id", id ? id : "", "type", "function", "function",
                     "name", name ? name : "", "arguments", args);
}

void gen_json_string(strbuf *out, const char *s, size_t n) {
    static const char hex[] = "0123456789ABCDEF";
    strbuf_append(out, "\"", 1);
    size_t run = 0; /* bytes copied as they are, flushed in one append */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        strbuf_append(out, s + run, i - run);
        run = i + 1;
        char e[6] = {'\\', 0};
        size_t k = 2;
        switch (c) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\b': e[1] = 'b'; break;
        case '\f': e[1] = 'f'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        default:
            memcpy(e + 1, "u00", 3);
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            k = 6;
        }
        strbuf_append(out, e, k);
    }
    strbuf_append(out, s + run, n - run);
    strbuf_append(out, "\"", 1);
}

void gen_append_i64(strbuf *out, long long v) {
    char b[24];
    int i = (int)sizeof b;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do b[--i] = (char)('0' + u % 10);
    while ((u /= 10) && i > 1);
    if (v < 0) b[--i] = '-';
    strbuf_append(out, b + i, sizeof b - (size_t)i);
}

void gen_sse_data(strbuf *out, json_t *j) {
    char *t = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    strbuf_appendf(out, "data: %s\n\n", t ? t : "{}");
    free(t);
}

void gen_sse_event(strbuf *out, const char *event, json_t *j) {
    char *t = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    strbuf_appendf(out, "event: %s\ndata: %s\n\n", event, t ? t : "{}");
    free(t);
}

void gen_ndjson(strbuf *out, json_t *j) {
    char *t = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    strbuf_appendf(out, "%s\n", t ? t : "{}");
    free(t);
}
