/* remote — forwarding generations to the node holding an instance's rank 0 (see remote.h). One
 * thread per forwarded call runs a blocking libcurl transfer; its write callback splits the NDJSON
 * stream into messages for the caller. */
#include "worker/remote.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/strbuf.h"
#include "cluster/cluster.h"
#include "cluster/nodeinfo.h"
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
    instances *local;
    placer_dirs dirs; /* where auto-placement reads a model's facts */
    char auth_header[300]; /* "Authorization: Bearer <api key>", or "" without a key */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    forward *calls;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

remote *remote_new(instances *local, const placer_dirs *dirs, const char *api_key) {
    remote *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->local = local;
    r->dirs = *dirs;
    if (api_key && api_key[0])
        snprintf(r->auth_header, sizeof r->auth_header, "Authorization: Bearer %s", api_key);
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
    const char *addr = nodeinfo_reachable_ipv4(ifs);
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
    if (f->owner->auth_header[0]) headers = curl_slist_append(headers, f->owner->auth_header);
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
            char message[700], refused[160];
            /* a refusal (not a lost node) says what: 401 is a key the nodes do not share */
            snprintf(refused, sizeof refused, "it answered HTTP %ld%s", http,
                     http == 401 ? " (every node of a cluster needs the same --api-key)" : "");
            snprintf(message, sizeof message,
                     "lost the node serving this model (instance %s, rank 0 on node %.12s): %s",
                     f->instance_id, f->node_id,
                     rc != CURLE_OK ? (curl_err[0] ? curl_err : curl_easy_strerror(rc))
                     : http >= 300  ? refused
                                    : "the stream ended early");
            log_error("%s", message);
            done = json_pack("{s:s,s:s,s:s,s:i}", "type", "done", "finish_reason", "error",
                             "error", message, "error_status", 502);
        }
        deliver(f, done);
        json_decref(done);
    }
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

/* The id of an instance placed across the cluster that serves model_id (the last one State
 * lists), into id (left as is when there is none). Returns 1 when there is one. */
static int cluster_instance_of(const char *model_id, char *id, size_t n) {
    json_t *state = state_get("instances");
    const char *key;
    json_t *inst;
    int found = 0;
    json_object_foreach(state, key, inst) {
        const char *model = json_string_value(json_object_get(
            json_object_get(shards_tagged_body(inst), "shardAssignments"), "modelId"));
        if (shards_is_cluster_instance(inst) && model && !strcmp(model, model_id)) {
            snprintf(id, n, "%s", key);
            found = 1;
        }
    }
    json_decref(state);
    return found;
}

static int route_serves(void *ctx, const char *model_id) {
    (void)ctx;
    char id[64];
    return cluster_node_id()[0] && cluster_instance_of(model_id, id, sizeof id);
}

#define REMOTE_PLACE_CONTEXT 4096

/* Chat for a model that no instance serves and that does not fit this node alone: the best
 * placement over the cluster goes into State, and the call waits (up to REMOTE_PLACE_WAIT_S) until
 * every rank is Ready. Returns 0 when an instance now serves the model, -1 when this node should
 * place it itself (it fits here, or no placement fits: then it tries as without a cluster), or
 * 503 with err when the placed instance did not become Ready. */
static int auto_place(remote *r, const char *model_id, char *err, size_t errlen) {
    char id[64] = "";
    cluster_instance_of(model_id, id, sizeof id); /* one placed already (by another request) */
    if (!id[0]) {
        placer_model m;
        /* the fit is judged for a modest context (the runner sizes its KV cache to the memory
         * it finds), so a model that ran here before still does */
        if (placer_model_load(&r->dirs, model_id, REMOTE_PLACE_CONTEXT, &m, err, errlen)) return -1;
        placement_node nodes[PLACEMENT_MAX_NODES];
        int n = placer_nodes(&r->dirs, model_id, nodes, PLACEMENT_MAX_NODES);
        placement_result res;
        int fits_here = 0;
        for (int i = 0; i < n; i++)
            if (!strcmp(nodes[i].id, cluster_node_id()))
                fits_here = placement_place(&m.facts, &nodes[i], 1, PLACEMENT_PIPELINE, 1, &res) == 0;
        int rc = fits_here ? -1 : placer_place(&m, PLACEMENT_PIPELINE, 1, nodes, n, &res, err, errlen);
        if (rc == 0) {
            json_t *placed = placer_instance_json(&m.facts, PLACEMENT_PIPELINE, NULL, &res, NULL);
            snprintf(id, sizeof id, "%s",
                     json_string_value(json_object_get(shards_tagged_body(placed), "instanceId")));
            log_info("%s does not fit this node alone: placing it on %d nodes", model_id,
                     res.n_nodes);
            cluster_submit(json_pack("{s:{s:o}}", "InstanceCreated", "instance", placed));
        }
        placer_model_free(&m);
        if (fits_here || rc) return -1; /* here, as without a cluster (it may still fit) */
    }
    int seen = 0;
    for (int waited_ms = 0; waited_ms < REMOTE_PLACE_WAIT_S * 1000; waited_ms += 100) {
        json_t *st = state_get(NULL);
        json_t *inst = json_object_get(json_object_get(st, "instances"), id);
        const char *rank0 = NULL;
        int ready = inst && instance_ready(st, shards_tagged_body(inst), &rank0);
        json_decref(st);
        if (ready) return 0;
        /* not ordered into the log yet, or deleted again (a rank failed) */
        if (inst) seen = 1;
        else if (seen || waited_ms > 10000) break;
        clock_sleep_ms(100);
    }
    snprintf(err, errlen, "the instance placed for %s across the cluster did not become ready",
             model_id);
    return 503;
}

/* The least busy Ready cluster instance of the model whose rank 0 is elsewhere, if less busy than
 * this node's own (local_in_flight; -1: none here). Returns 1 with id/node/url set, else 0. */
static int pick(remote *r, const char *model_id, int local_in_flight, char *best_id,
                char *best_node, char *url) {
    const char *me = cluster_node_id();
    json_t *state = state_get(NULL);
    const char *id;
    json_t *inst;
    int best_load = local_in_flight;
    best_id[0] = 0;
    json_object_foreach(json_object_get(state, "instances"), id, inst) {
        json_t *body = shards_tagged_body(inst);
        const char *model = json_string_value(
            json_object_get(json_object_get(body, "shardAssignments"), "modelId"));
        const char *rank0 = NULL;
        if (!shards_is_cluster_instance(inst) || !model || strcmp(model, model_id) ||
            !instance_ready(state, body, &rank0) || !strcmp(rank0, me))
            continue;
        int load = in_flight_locked(r, id);
        if (best_load >= 0 && load >= best_load) continue;
        char candidate[300];
        if (node_url(state, rank0, candidate, sizeof candidate)) continue;
        best_load = load;
        snprintf(best_id, 64, "%s", id);
        snprintf(best_node, 64, "%s", rank0);
        snprintf(url, 300, "%s", candidate);
    }
    json_decref(state);
    return best_id[0] != 0;
}

static int route_generate(void *ctx, const gen_request *request, int local_in_flight,
                          instances_message_fn fn, void *arg, uint64_t call_id, char *err,
                          size_t errlen) {
    remote *r = ctx;
    if (!cluster_node_id()[0]) return -1;
    char best_id[64], best_node[64], url[300];
    pthread_mutex_lock(&r->lock);
    int found = pick(r, request->model, local_in_flight, best_id, best_node, url);
    if (!found && local_in_flight < 0 && !instances_serves(r->local, request->model)) {
        pthread_mutex_unlock(&r->lock);
        int placed = auto_place(r, request->model, err, errlen);
        if (placed != 0) return placed;
        pthread_mutex_lock(&r->lock);
        found = pick(r, request->model, -1, best_id, best_node, url);
    }
    if (!found) {
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
    return (instances_router){
        .ctx = r, .generate = route_generate, .cancel = route_cancel, .serves = route_serves};
}
