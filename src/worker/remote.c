/* remote — forwarding generations to the node holding an instance's rank 0 (see remote.h). One
 * thread per forwarded call runs a blocking libcurl transfer; its write callback splits the NDJSON
 * stream into messages for the caller. */
#include "worker/remote.h"

#include "base/log.h"
#include "base/strbuf.h"
#include "cluster/cluster.h"
#include "worker/shards.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct forward {
    remote *owner;
    uint64_t call_id;
    char instance_id[64];
    char url[300];
    char node_id[64];
    char *body;
    instances_message_fn fn;
    void *arg;
    strbuf line;
    int done_sent;
    _Atomic int cancelled;
    struct forward *next;
} forward;

struct remote {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    forward *calls;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

remote *remote_new(void) {
    remote *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_once(&curl_once, curl_init);
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cond, NULL);
    return r;
}

void remote_free(remote *r) {
    if (!r) return;
    pthread_mutex_lock(&r->lock);
    for (forward *f = r->calls; f; f = f->next) atomic_store(&f->cancelled, 1);
    while (r->calls) pthread_cond_wait(&r->cond, &r->lock);
    pthread_mutex_unlock(&r->lock);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->cond);
    free(r);
}

/* ------------------------------------------------------------------ choosing an instance */

static json_t *state_get(const char *path) {
    char *text = cluster_state_json(path);
    json_t *v = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    free(text);
    return v;
}

/* Every runner of the instance is Ready or Running; *rank0_node gets deviceRank 0's node. */
static int instance_ready(json_t *state, json_t *body, const char **rank0_node) {
    json_t *assign = json_object_get(body, "shardAssignments");
    json_t *shards = json_object_get(assign, "runnerToShard");
    json_t *runners = json_object_get(state, "runners");
    const char *node;
    json_t *runner;
    *rank0_node = NULL;
    json_object_foreach(json_object_get(assign, "nodeToRunner"), node, runner) {
        const char *rid = json_string_value(runner);
        json_t *status = json_object_get(runners, rid ? rid : "");
        if (!json_object_get(status, "RunnerReady") && !json_object_get(status, "RunnerRunning"))
            return 0;
        json_t *meta = shards_tagged_body(json_object_get(shards, rid));
        if (json_integer_value(json_object_get(meta, "deviceRank")) == 0) *rank0_node = node;
    }
    return *rank0_node != NULL;
}

/* http://<address>:<apiPort>: the node's first non-loopback IPv4 (loopback when that is all it
 * publishes: nodes of one host), as the cluster dials it. */
static int node_url(json_t *state, const char *node, char *url, size_t n) {
    json_int_t port = json_integer_value(
        json_object_get(json_object_get(json_object_get(state, "nodeIdentities"), node), "apiPort"));
    json_t *ifs = json_object_get(json_object_get(json_object_get(state, "nodeNetwork"), node),
                                  "interfaces");
    const char *addr = NULL, *loopback = NULL;
    size_t i;
    json_t *itf;
    json_array_foreach(ifs, i, itf) {
        const char *ip = json_string_value(json_object_get(itf, "ipAddress"));
        if (!ip || strchr(ip, ':')) continue;
        if (json_is_true(json_object_get(itf, "isLoopback"))) {
            if (!loopback) loopback = ip;
        } else if (!addr) {
            addr = ip;
        }
    }
    if (!addr) addr = loopback;
    if (!addr || port <= 0 || port > 65535) return -1;
    snprintf(url, n, "http://%s:%d/internal/generate", addr, (int)port);
    return 0;
}

static int in_flight_locked(remote *r, const char *instance_id) {
    int n = 0;
    for (forward *f = r->calls; f; f = f->next) n += !strcmp(f->instance_id, instance_id);
    return n;
}

/* ------------------------------------------------------------------ one forwarded call */

static void deliver(forward *f, const json_t *msg) {
    const char *type = json_string_value(json_object_get(msg, "type"));
    if (!type || !strcmp(type, "alive") || f->done_sent) return;
    json_t *copy = json_deep_copy(msg);
    json_object_set_new(copy, "id", json_integer((json_int_t)f->call_id));
    if (!strcmp(type, "done")) f->done_sent = 1;
    f->fn(f->arg, copy);
    json_decref(copy);
}

static size_t on_bytes(char *data, size_t size, size_t nmemb, void *ud) {
    forward *f = ud;
    size_t n = size * nmemb;
    strbuf_append(&f->line, data, n);
    size_t start = 0;
    for (size_t i = 0; i < f->line.len; i++) {
        if (f->line.data[i] != '\n') continue;
        json_t *msg = json_loadb(f->line.data + start, i - start, 0, NULL);
        if (msg) deliver(f, msg);
        json_decref(msg);
        start = i + 1;
    }
    if (start) {
        memmove(f->line.data, f->line.data + start, f->line.len - start);
        f->line.len -= start;
    }
    return n;
}

static int on_progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
    (void)a, (void)b, (void)c, (void)d;
    forward *f = ud;
    return atomic_load(&f->cancelled) ? 1 : 0;
}

static void *forward_main(void *arg) {
    forward *f = arg;
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    char curl_err[CURL_ERROR_SIZE] = "";
    CURLcode rc = CURLE_FAILED_INIT;
    long http = 0;
    if (curl) {
        curl_easy_setopt(curl, CURLOPT_URL, f->url);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, f->body);
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_bytes);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, f);
        curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(curl, CURLOPT_XFERINFODATA, f);
        curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, (long)REMOTE_SILENCE_S);
        /* The serving node writes at least a line a second: silence means it is gone. */
        curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, (long)REMOTE_SILENCE_S);
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_err);
        curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
        rc = curl_easy_perform(curl);
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
        curl_easy_cleanup(curl);
    }
    curl_slist_free_all(headers);
    if (!f->done_sent) {
        json_t *done;
        if (atomic_load(&f->cancelled)) {
            done = json_pack("{s:s,s:s}", "type", "done", "finish_reason", "cancelled");
        } else {
            char message[700];
            snprintf(message, sizeof message,
                     "lost the node serving this model (instance %s, rank 0 on node %.12s): %s",
                     f->instance_id, f->node_id,
                     rc != CURLE_OK ? (curl_err[0] ? curl_err : curl_easy_strerror(rc))
                                    : "the stream ended early");
            log_error("%s", message);
            done = json_pack("{s:s,s:s,s:s,s:i}", "type", "done", "finish_reason", "error",
                             "error", message, "error_status", 502);
        }
        deliver(f, done);
        json_decref(done);
    }
    (void)http;
    remote *r = f->owner;
    pthread_mutex_lock(&r->lock);
    for (forward **pp = &r->calls; *pp; pp = &(*pp)->next)
        if (*pp == f) {
            *pp = f->next;
            break;
        }
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    strbuf_free(&f->line);
    free(f->body);
    free(f);
    return NULL;
}

static int route_generate(void *ctx, const gen_request *request, int local_in_flight,
                          instances_message_fn fn, void *arg, uint64_t call_id, char *err,
                          size_t errlen) {
    remote *r = ctx;
    const char *me = cluster_node_id();
    if (!me[0]) return -1;
    json_t *state = state_get(NULL);
    const char *id;
    json_t *inst;
    char best_id[64] = "", best_node[64] = "", url[300] = "";
    int best_load = local_in_flight;
    pthread_mutex_lock(&r->lock);
    json_object_foreach(json_object_get(state, "instances"), id, inst) {
        json_t *body = shards_tagged_body(inst);
        const char *model = json_string_value(
            json_object_get(json_object_get(body, "shardAssignments"), "modelId"));
        const char *rank0 = NULL;
        if (!shards_is_cluster_instance(inst) || !model || strcmp(model, request->model) ||
            !instance_ready(state, body, &rank0) || !strcmp(rank0, me))
            continue;
        int load = in_flight_locked(r, id);
        if (best_load >= 0 && load >= best_load) continue;
        char candidate[300];
        if (node_url(state, rank0, candidate, sizeof candidate)) continue;
        best_load = load;
        snprintf(best_id, sizeof best_id, "%s", id);
        snprintf(best_node, sizeof best_node, "%s", rank0);
        snprintf(url, sizeof url, "%s", candidate);
    }
    json_decref(state);
    if (!best_id[0]) {
        pthread_mutex_unlock(&r->lock);
        return -1; /* nothing better elsewhere: this node serves it */
    }
    forward *f = calloc(1, sizeof *f);
    json_t *call = json_pack("{s:s,s:o}", "instance_id", best_id, "request",
                             gen_request_to_json(request));
    f->body = json_dumps(call, JSON_COMPACT);
    json_decref(call);
    f->owner = r;
    f->call_id = call_id;
    f->fn = fn;
    f->arg = arg;
    snprintf(f->instance_id, sizeof f->instance_id, "%s", best_id);
    snprintf(f->node_id, sizeof f->node_id, "%s", best_node);
    snprintf(f->url, sizeof f->url, "%s", url);
    f->next = r->calls;
    r->calls = f;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int started = pthread_create(&t, &attr, forward_main, f) == 0;
    pthread_attr_destroy(&attr);
    if (!started) {
        r->calls = f->next;
        pthread_mutex_unlock(&r->lock);
        free(f->body);
        free(f);
        snprintf(err, errlen, "cannot start a forwarding thread");
        return 500;
    }
    pthread_mutex_unlock(&r->lock);
    log_info("forwarding a generation of %s to instance %s (rank 0 on node %.12s)",
             request->model, best_id, best_node);
    return 0;
}

static void route_cancel(void *ctx, uint64_t call_id) {
    remote *r = ctx;
    pthread_mutex_lock(&r->lock);
    for (forward *f = r->calls; f; f = f->next)
        if (f->call_id == call_id) atomic_store(&f->cancelled, 1);
    pthread_mutex_unlock(&r->lock);
}

instances_router remote_router(remote *r) {
    return (instances_router){.ctx = r, .generate = route_generate, .cancel = route_cancel};
}
