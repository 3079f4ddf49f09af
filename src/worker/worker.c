/* worker — the node's runners, download-then-place and cluster publishing as one object (see
 * worker.h). The parts live beside it: instances.c (runner processes), autoplace.c (downloads
 * then placement), cluster_sync.c (events to and from the cluster's State). */
#include "worker/worker.h"

#include "cluster/cluster.h"
#include "cluster/state.h"
#include "worker/autoplace.h"
#include "worker/cluster_sync.h"
#include "worker/remote.h"

#include <stdio.h>
#include <stdlib.h>

struct worker {
    instances *instances;
    autoplace *autoplace;
    cluster_sync *sync;
    remote *remote; /* generations for instances whose rank 0 is on another node */
    placer_dirs dirs;
    models_service *models;
    char api_key[256]; /* this node's --api-key: forwarded generations carry it */
    int api_port;
};

worker *worker_new(const worker_config *c, models_service *models, char *err, size_t errlen) {
    worker *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    instances_options io = {.runner_exe = c->runner_exe,
                            .models_dir = c->models_dir,
                            .models_path = c->models_path,
                            .node_id = c->node_id,
                            .kv_cache_bytes = c->kv_cache_bytes,
                            .kv_cache_dtype = c->kv_cache_dtype,
                            .speculative = c->speculative,
                            .spec_tokens = c->spec_tokens,
                            .device = c->device,
                            .watchdog_s = c->watchdog_s,
                            .max_runners = c->max_runners};
    w->models = models;
    snprintf(w->api_key, sizeof w->api_key, "%s", c->api_key ? c->api_key : "");
    w->api_port = c->api_port;
    snprintf(w->dirs.models_dir, sizeof w->dirs.models_dir, "%s", c->models_dir ? c->models_dir : "");
    snprintf(w->dirs.models_path, sizeof w->dirs.models_path, "%s",
             c->models_path ? c->models_path : "");
    snprintf(w->dirs.data_dir, sizeof w->dirs.data_dir, "%s", c->data_dir ? c->data_dir : "");
    w->instances = instances_new(&io);
    w->autoplace = w->instances ? autoplace_new(w->instances, models, c->api_port) : NULL;
    if (!w->autoplace) {
        instances_free(w->instances);
        free(w);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    return w;
}

instances *worker_instances(worker *w) { return w->instances; }

int worker_join_cluster(worker *w) {
    if (w->sync) return 0;
    w->sync = cluster_sync_start(w->instances, &w->dirs, models_service_downloads(w->models),
                                 w->api_port);
    if (!w->sync) return -1;
    w->remote = remote_new(w->instances, &w->dirs, w->api_key);
    if (w->remote) {
        instances_router router = remote_router(w->remote);
        instances_set_cluster_hooks(w->instances, NULL, &router);
    }
    download_manager_set_listener(models_service_downloads(w->models),
                                  cluster_sync_download_listener, NULL);
    return 0;
}

int worker_place(worker *w, const char *model_id, char *instance_id, size_t n, char *err,
                 size_t errlen) {
    return autoplace_place(w->autoplace, model_id, instance_id, n, err, errlen);
}

int worker_download_start(worker *w, const char *model_id, char *err, size_t errlen) {
    return autoplace_download_start(w->autoplace, model_id, err, errlen);
}

int worker_download_poll(worker *w, const char *model_id, json_t **progress, char *err,
                         size_t errlen) {
    return autoplace_download_poll(w->autoplace, model_id, progress, err, errlen);
}

int worker_delete_instance(worker *w, const char *instance_id) {
    if (instances_delete(w->instances, instance_id) == 0) return 0;
    return cluster_sync_delete_instance(instance_id);
}

json_t *worker_state_json(worker *w) {
    char *text = cluster_state_json(NULL);
    json_t *state = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    json_t *mine = instances_state_json(w->instances);
    if (state) {
        /* This node's own runners: the live status (the same value is on its way through the
         * log), so a client that just saw a generation end never reads an older status. */
        json_t *runners = json_object_get(state, "runners");
        const char *key;
        json_t *value;
        json_object_foreach(json_object_get(mine, "runners"), key, value) {
            if (json_object_get(runners, key)) json_object_set(runners, key, value);
        }
        json_decref(mine);
        return state;
    }
    state = cluster_state_new();
    static const char *fields[] = {"instances", "runners"};
    for (size_t i = 0; i < 2; i++) {
        json_t *dst = json_object_get(state, fields[i]);
        const char *key;
        json_t *value;
        json_object_foreach(json_object_get(mine, fields[i]), key, value) {
            if (!json_object_get(dst, key)) json_object_set(dst, key, value);
        }
    }
    json_decref(mine);
    return state;
}

void worker_stop(worker *w) {
    if (!w) return;
    cluster_sync_stop(w->sync);
    w->sync = NULL;
    autoplace_stop(w->autoplace);
}

const placer_dirs *worker_placer_dirs(worker *w) { return &w->dirs; }

void worker_free(worker *w) {
    if (!w) return;
    worker_stop(w);
    autoplace_free(w->autoplace);
    /* Forwarded calls end first (their "done" reaches the API), then no request is routed. */
    remote_free(w->remote);
    static const instances_router none;
    instances_set_cluster_hooks(w->instances, NULL, &none);
    instances_free(w->instances);
    free(w);
}
