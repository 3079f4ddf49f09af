/* routes_internal — POST /internal/generate: the other end of worker/remote.c. A node that holds
 * an HTTP request for a model whose instance has its rank 0 here forwards the generation; this
 * route hands it to that rank-0 runner (never to another node, never placing anything) and
 * streams the runner's messages back as NDJSON lines, with {"type":"alive"} every second while
 * nothing else is written (the forwarding node treats silence as a dead node). The forwarding
 * node closing the connection cancels the generation. */
#include "api/routes_internal.h"

#include "runner/protocol.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Shared by the handler, the runner's message callback and the stream's disconnect callback;
 * freed by the last of them. */
typedef struct forwarded {
    pthread_mutex_t lock;
    api_stream *stream;
    instances *local;
    uint64_t call_id;
    int have_call, done, gone;
    _Atomic int refs;
} forwarded;

static void unref(void *arg) {
    forwarded *f = arg;
    if (atomic_fetch_sub(&f->refs, 1) != 1) return;
    pthread_mutex_destroy(&f->lock);
    free(f);
}

static void write_line(api_stream *s, const json_t *msg) {
    char *text = json_dumps(msg, JSON_COMPACT);
    if (!text) return;
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps' terminator becomes the line end */
    api_stream_write(s, text, n + 1);
    free(text);
}

/* Every runner message goes out as one line; "done" is the last and ends the response. */
static void on_message(void *arg, const json_t *msg) {
    forwarded *f = arg;
    const char *type = json_string_value(json_object_get(msg, "type"));
    int last = type && !strcmp(type, "done");
    pthread_mutex_lock(&f->lock);
    int was_done = f->done;
    if (!was_done) write_line(f->stream, msg);
    if (last) f->done = 1;
    pthread_mutex_unlock(&f->lock);
    if (last && !was_done) {
        api_stream_close(f->stream);
        unref(f);
    }
}

/* The forwarding node went away (its client left, or it died): stop the generation. */
static void on_gone(void *arg) {
    forwarded *f = arg;
    pthread_mutex_lock(&f->lock);
    f->gone = 1;
    int cancel = f->have_call && !f->done;
    uint64_t id = f->call_id;
    pthread_mutex_unlock(&f->lock);
    if (cancel) instances_cancel(f->local, id); /* the runner answers "done" */
}

static void h_generate(api_request *r, void *ctx) {
    instances *local = ctx;
    json_t *body = api_request_json(r);
    if (!body) return;
    const char *instance_id = json_string_value(json_object_get(body, "instance_id"));
    gen_request req;
    gen_request_init(&req);
    char err[512];
    if (!instance_id ||
        gen_request_from_json(json_object_get(body, "request"), &req, err, sizeof err)) {
        if (!instance_id) snprintf(err, sizeof err, "'instance_id' is required");
        api_respond_error(r, 400, "%s", err);
        gen_request_free(&req);
        json_decref(body);
        return;
    }
    forwarded *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->lock, NULL);
    f->local = local;
    f->refs = 3; /* this handler, the message path (until "done"), the stream */
    f->stream = api_respond_stream(r, 200, "application/x-ndjson");
    api_stream_set_keepalive(f->stream, "{\"type\":\"alive\"}\n", 1000);
    api_stream_on_disconnect(f->stream, on_gone, f, unref);
    uint64_t call_id = 0;
    int status = instances_generate_instance(local, instance_id, &req, on_message, f, &call_id,
                                             err, sizeof err);
    if (status) {
        json_t *done = json_pack("{s:s,s:s,s:s,s:i}", "type", "done", "finish_reason", "error",
                                 "error", err, "error_status", status);
        on_message(f, done);
        json_decref(done);
    } else {
        pthread_mutex_lock(&f->lock);
        f->call_id = call_id;
        f->have_call = 1;
        int cancel = f->gone && !f->done;
        pthread_mutex_unlock(&f->lock);
        if (cancel) instances_cancel(local, call_id);
    }
    unref(f);
    gen_request_free(&req);
    json_decref(body);
}

int routes_internal_add(api_server *server, instances *local) {
    return api_route_add(server, "POST", "/internal/generate", h_generate, local, 0) != 0;
}
