/* autoplace — download-then-place (see autoplace.h). */
#include "worker/autoplace.h"

#include "base/log.h"
#include "worker/peers.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void *wait_then_place(void *arg) {
    pending *p = arg;
    autoplace *a = p->owner;
    download_manager_wait(models_service_downloads(a->models), p->model_id);
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

int autoplace_download_start(autoplace *a, const char *model_id, char *err, size_t errlen) {
    models_service *m = a->models;
    if (!models_service_has_card(m, model_id)) {
        char why[1024];
        instances_missing_reason(a->local, model_id, why, sizeof why);
        snprintf(err, errlen, "model '%s' not found: %s, and it is not in the model catalog "
                              "(add it with POST /models/add)", model_id, why);
        return 404;
    }
    if (models_service_offline(m)) {
        snprintf(err, errlen, "model '%s' is not downloaded and this node is offline "
                              "(--offline / EXO_OFFLINE): download it first or start without "
                              "--offline", model_id);
        return 404;
    }
    char urls[8][96];
    const char *peers[8];
    int n = peers_find(model_id, a->api_port, urls, 8);
    for (int i = 0; i < n; i++) peers[i] = urls[i];
    char why[512];
    int rc = download_manager_start(models_service_downloads(m), model_id, 0, 0, peers, n, why,
                                    sizeof why);
    if (rc < 0) {
        snprintf(err, errlen, "cannot download '%s': %s", model_id, why);
        return 400;
    }
    if (rc == 0) log_info("downloading %s from %s", model_id, n ? "a peer" : "the Hub");
    return 0;
}

int autoplace_download_poll(autoplace *a, const char *model_id, json_t **progress, char *err,
                            size_t errlen) {
    int st = download_manager_status(models_service_downloads(a->models), model_id, progress);
    if (st == 0) return 0;
    if (st == 1) return 1;
    json_t *failed = json_object_get(*progress, "DownloadFailed");
    const char *why = json_string_value(json_object_get(failed, "errorMessage"));
    snprintf(err, errlen, "download of '%s' failed: %s", model_id,
             why ? why : st < 0 ? "it stopped (deleted?)" : "unknown error");
    return -1;
}

int autoplace_place(autoplace *a, const char *model_id, char *instance_id, size_t n, char *err,
                    size_t errlen) {
    char dir[1024];
    if (instances_resolve_model(a->local, model_id, dir, sizeof dir) == 0)
        return instances_place(a->local, model_id, instance_id, n, err, errlen);
    pthread_mutex_lock(&a->lock);
    int stopping = a->stopping;
    pthread_mutex_unlock(&a->lock);
    if (stopping) {
        snprintf(err, errlen, "this node is stopping");
        return 503;
    }
    int status = autoplace_download_start(a, model_id, err, errlen);
    if (status) return status;
    pending *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return 500;
    }
    p->owner = a;
    snprintf(p->model_id, sizeof p->model_id, "%s", model_id);
    if (pthread_create(&p->thread, NULL, wait_then_place, p)) {
        free(p);
        snprintf(err, errlen, "cannot start a thread to place '%s' after its download", model_id);
        return 500;
    }
    pthread_mutex_lock(&a->lock);
    p->next = a->list;
    a->list = p;
    pthread_mutex_unlock(&a->lock);
    if (n) instance_id[0] = 0;
    return 0;
}

autoplace *autoplace_new(instances *local, models_service *models, int api_port) {
    autoplace *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->local = local;
    a->models = models;
    a->api_port = api_port;
    pthread_mutex_init(&a->lock, NULL);
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
        download_manager_cancel(models_service_downloads(a->models), list->model_id);
        pthread_join(list->thread, NULL);
        free(list);
        list = next;
    }
}

void autoplace_free(autoplace *a) {
    if (!a) return;
    autoplace_stop(a);
    pthread_mutex_destroy(&a->lock);
    free(a);
}
