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
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct forwarded {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    api_stream *stream;
    int done;
} forwarded;

static void write_line(api_stream *s, const json_t *msg) {
    char *text = json_dumps(msg, JSON_COMPACT);
    if (!text) return;
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps' terminator becomes the line end */
    api_stream_write(s, text, n + 1);
    free(text);
}

static void on_message(void *arg, const json_t *msg) {
    forwarded *f = arg;
    const char *type = json_string_value(json_object_get(msg, "type"));
    pthread_mutex_lock(&f->lock);
    if (!f->done) write_line(f->stream, msg);
    if (type && !strcmp(type, "done")) {
        f->done = 1;
        pthread_cond_broadcast(&f->cond);
    }
    pthread_mutex_unlock(&f->lock);
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
    forwarded f = {.stream = api_respond_stream(r, 200, "application/x-ndjson")};
    pthread_mutex_init(&f.lock, NULL);
    pthread_cond_init(&f.cond, NULL);
    api_stream_set_keepalive(f.stream, "{\"type\":\"alive\"}\n", 1000);
    uint64_t call_id = 0;
    int status = instances_generate_instance(local, instance_id, &req, on_message, &f, &call_id,
                                             err, sizeof err);
    if (status) {
        json_t *done = json_pack("{s:s,s:s,s:s,s:i}", "type", "done", "finish_reason", "error",
                                 "error", err, "error_status", status);
        on_message(&f, done);
        json_decref(done);
    }
    int cancelled = 0;
    pthread_mutex_lock(&f.lock);
    while (!f.done) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 200 * 1000000L;
        t.tv_sec += t.tv_nsec / 1000000000L;
        t.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&f.cond, &f.lock, &t);
        if (!f.done && !cancelled && api_stream_client_gone(f.stream)) {
            cancelled = 1;
            pthread_mutex_unlock(&f.lock);
            instances_cancel(local, call_id); /* the runner answers "done" */
            pthread_mutex_lock(&f.lock);
        }
    }
    pthread_mutex_unlock(&f.lock);
    api_stream_close(f.stream);
    pthread_mutex_destroy(&f.lock);
    pthread_cond_destroy(&f.cond);
    gen_request_free(&req);
    json_decref(body);
}

int routes_internal_add(api_server *server, instances *local) {
    return api_route_add(server, "POST", "/internal/generate", h_generate, local, 0) != 0;
}
