/* autoplace — download-then-place for POST /place_instance (see autoplace.h). */
#include "autoplace.h"

#include "base/log.h"
#include "cluster/cluster.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

typedef struct pending {
    autoplace *owner;
    char model_id[512];
    pthread_t thread;
    struct pending *next;
} pending;

struct autoplace {
    instances *local;
    models_service *models;
    int api_port;
    pthread_mutex_t lock;
    pending *list;
    int stopping;
};

static void command_id(char *out, size_t n) {
    unsigned char b[8] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) b[0] = 1;
    snprintf(out, n, "%02x%02x%02x%02x-%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6],
             b[7]);
}

/* Peers whose State says they completed a download of model_id: "http://addr:api_port". */
static int find_peers(const char *model_id, int api_port, char urls[][96], int max) {
    char *text = cluster_state_json("downloads");
    json_t *downloads = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    text = cluster_status_json();
    json_t *status = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    int n = 0;
    const char *node;
    json_t *list;
    json_object_foreach(downloads, node, list) {
        if (!strcmp(node, cluster_node_id())) continue;
        size_t i;
        json_t *d;
        int has = 0;
        json_array_foreach(list, i, d) {
            json_t *done = json_object_get(d, "DownloadCompleted");
            const char *m = json_string_value(json_object_get(done, "modelId"));
            if (m && !strcmp(m, model_id)) has = 1;
        }
        json_t *p;
        json_array_foreach(json_object_get(status, "peers"), i, p) {
            const char *id = json_string_value(json_object_get(p, "nodeId"));
            const char *addr = json_string_value(json_object_get(p, "address"));
            if (has && n < max && id && addr && !strcmp(id, node) &&
                json_is_true(json_object_get(p, "alive")))
                snprintf(urls[n++], sizeof urls[0], "http://%s:%d", addr, api_port);
        }
    }
    json_decref(downloads);
    json_decref(status);
    return n;
}

static void *wait_then_place(void *arg) {
    pending *p = arg;
    autoplace *a = p->owner;
    download_manager_wait(a->models->downloads, p->model_id);
    pthread_mutex_lock(&a->lock);
    int stopping = a->stopping;
    pthread_mutex_unlock(&a->lock);
    if (stopping) return NULL;
    char id[64], err[1024];
    int status = instances_place(a->local, p->model_id, id, sizeof id, err, sizeof err);
    if (status) log_error("place %s after its download: %s", p->model_id, err);
    else log_info("downloaded and placed %s (instance %s)", p->model_id, id);
    return NULL;
}

static void respond_placed(api_request *r, const char *model_id, const char *instance_id) {
    char cmd[32];
    command_id(cmd, sizeof cmd);
    json_t *body = json_pack("{s:s,s:s,s:s}", "message", "Command received.", "command_id", cmd,
                             "model_id", model_id);
    if (instance_id) json_object_set_new(body, "instance_id", json_string(instance_id));
    else json_object_set_new(body, "downloading", json_true());
    api_respond_json(r, 200, body);
}

/* Starts the download of a catalog model that is not on disk (peers first, then the Hub).
 * Returns 0 (started or already running), or an HTTP status with err. */
static int start_download(autoplace *a, const char *model_id, char *err, size_t errlen) {
    models_service *m = a->models;
    pthread_mutex_lock(&m->lock);
    int known = card_catalog_find(&m->cards, model_id) != NULL;
    pthread_mutex_unlock(&m->lock);
    if (!known) {
        snprintf(err, errlen, "model '%s' not found: it is not on disk and not in the model "
                              "catalog (add it with POST /models/add)", model_id);
        return 404;
    }
    if (m->offline) {
        snprintf(err, errlen, "model '%s' is not downloaded and this node is offline "
                              "(--offline / EXO_OFFLINE): download it first or start without "
                              "--offline", model_id);
        return 404;
    }
    char urls[8][96];
    const char *peers[8];
    int n = find_peers(model_id, a->api_port, urls, 8);
    for (int i = 0; i < n; i++) peers[i] = urls[i];
    char why[512];
    int rc = download_manager_start(m->downloads, model_id, 0, 0, peers, n, why, sizeof why);
    if (rc < 0) {
        snprintf(err, errlen, "cannot download '%s': %s", model_id, why);
        return 400;
    }
    if (rc == 0) log_info("downloading %s from %s", model_id, n ? "a peer" : "the Hub");
    return 0;
}

/* api_model_fetcher for generation requests (see api.h). */
static int fetch_start(void *ud, const char *model_id, char *err, size_t errlen) {
    return start_download(ud, model_id, err, errlen);
}

static int fetch_poll(void *ud, const char *model_id, json_t **progress, char *err, size_t errlen) {
    autoplace *a = ud;
    int st = download_manager_status(a->models->downloads, model_id, progress);
    if (st == 0) return 0;
    if (st == 1) return 1;
    json_t *failed = json_object_get(*progress, "DownloadFailed");
    const char *why = json_string_value(json_object_get(failed, "errorMessage"));
    snprintf(err, errlen, "download of '%s' failed: %s", model_id,
             why ? why : st < 0 ? "it stopped (deleted?)" : "unknown error");
    return -1;
}

void autoplace_fetcher(autoplace *a, api_model_fetcher *out) {
    memset(out, 0, sizeof *out);
    if (!a) return;
    out->start = fetch_start;
    out->poll = fetch_poll;
    out->ud = a;
}

static void place(api_request *r, autoplace *a, const char *model_id) {
    char dir[1024], id[64], err[1024];
    if (instances_resolve_model(a->local, model_id, dir, sizeof dir) == 0) {
        int status = instances_place(a->local, model_id, id, sizeof id, err, sizeof err);
        if (status) api_respond_error(r, status, "%s", err);
        else respond_placed(r, model_id, id);
        return;
    }
    int status = start_download(a, model_id, err, sizeof err);
    if (status) {
        api_respond_error(r, status, "%s", err);
        return;
    }
    pending *p = calloc(1, sizeof *p);
    if (!p) {
        api_respond_error(r, 500, "out of memory");
        return;
    }
    p->owner = a;
    snprintf(p->model_id, sizeof p->model_id, "%s", model_id);
    if (pthread_create(&p->thread, NULL, wait_then_place, p)) {
        free(p);
        api_respond_error(r, 500, "cannot start a thread to place '%s' after its download", model_id);
        return;
    }
    pthread_mutex_lock(&a->lock);
    p->next = a->list;
    a->list = p;
    pthread_mutex_unlock(&a->lock);
    respond_placed(r, model_id, NULL);
}

static void h_place_instance(api_request *r, void *ctx) {
    json_t *b = api_request_json(r);
    if (!b) return;
    const char *model = json_string_value(json_object_get(b, "model_id"));
    const char *sh = json_string_value(json_object_get(b, "sharding"));
    if (!model) api_respond_error(r, 400, "'model_id' is required and must be a string");
    else if (sh && strcmp(sh, "Pipeline") && strcmp(sh, "Tensor"))
        api_respond_error(r, 400, "'sharding' must be \"Pipeline\" or \"Tensor\"");
    else place(r, ctx, model);
    json_decref(b);
}

/* DELETE /download/{node_id}/{model_id}: as models_api, and State forgets the download, so no
 * node takes this one for a peer that holds the model. */
static void h_download_delete(api_request *r, void *ctx) {
    autoplace *a = ctx;
    const char *node = api_request_param(r, "node_id"), *model = api_request_param(r, "model_id");
    json_t *body;
    int status = models_api_download_delete(a->models, node, model, &body);
    if (status == 200 && cluster_node_id()[0])
        cluster_submit(json_pack("{s:{s:s,s:s}}", "DownloadDeleted", "nodeId", node, "modelId",
                                 model));
    api_respond_json(r, status, body);
}

autoplace *autoplace_install(api_server *server, instances *local, models_service *models,
                             int api_port) {
    autoplace *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->local = local;
    a->models = models;
    a->api_port = api_port;
    pthread_mutex_init(&a->lock, NULL);
    api_route_add(server, "POST", "/place_instance", h_place_instance, a, 0);
    api_route_add(server, "DELETE", "/download/{node_id}/{model_id...}", h_download_delete, a, 0);
    return a;
}

void autoplace_stop(autoplace *a) {
    if (!a) return;
    pthread_mutex_lock(&a->lock);
    a->stopping = 1;
    pending *list = a->list;
    a->list = NULL;
    pthread_mutex_unlock(&a->lock);
    while (list) {
        pending *next = list->next;
        download_manager_cancel(a->models->downloads, list->model_id);
        pthread_join(list->thread, NULL);
        free(list);
        list = next;
    }
    pthread_mutex_destroy(&a->lock);
    free(a);
}
