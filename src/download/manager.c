/* manager — background downloads (see manager.h). Each job owns a copy of its request
 * strings and its last progress snapshot; the manager's mutex guards the job list and the
 * snapshots, never a network call. */
#include "download/manager.h"

#include "base/log.h"
#include "model/store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct job {
    struct job *next;
    download_manager *m;
    char model_id[256];
    char model_dir[1024];
    int layer_start, layer_end;
    char *peers[16];
    int n_peers;
    volatile int cancel;
    int running;
    pthread_t thread;
    int joinable;
    download_progress last; /* model_id/current_file/message pointers not kept */
    char message[512];
} job;

struct download_manager {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    job *jobs;
    char models_dir[1024];
    char node_id[128];
    int offline, parallel, interval_ms;
    hf_config hf;
    char peer_token[256];
    download_listener_fn listener;
    void *listener_ud;
};

download_manager *download_manager_new(const download_manager_options *o) {
    download_manager *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->changed, NULL);
    snprintf(m->models_dir, sizeof m->models_dir, "%s", o->models_dir ? o->models_dir : "");
    snprintf(m->node_id, sizeof m->node_id, "%s", o->node_id ? o->node_id : "");
    m->offline = o->offline;
    m->parallel = o->parallel;
    m->interval_ms = o->progress_interval_ms;
    snprintf(m->peer_token, sizeof m->peer_token, "%s", o->peer_token ? o->peer_token : "");
    if (o->hf) m->hf = *o->hf;
    else hf_config_from_env(&m->hf);
    return m;
}

void download_manager_set_listener(download_manager *m, download_listener_fn fn, void *ud) {
    pthread_mutex_lock(&m->lock);
    m->listener = fn;
    m->listener_ud = ud;
    pthread_mutex_unlock(&m->lock);
}

static void on_progress(const download_progress *p, void *ud) {
    job *j = ud;
    download_manager *m = j->m;
    pthread_mutex_lock(&m->lock);
    j->last = *p;
    j->last.model_id = NULL;
    j->last.current_file = NULL;
    j->last.message = NULL;
    if (p->message) snprintf(j->message, sizeof j->message, "%s", p->message);
    download_listener_fn fn = m->listener;
    void *ud2 = m->listener_ud;
    pthread_mutex_unlock(&m->lock);
    if (fn) fn(p, ud2);
}

static void *job_main(void *arg) {
    job *j = arg;
    download_manager *m = j->m;
    download_request req = {
        .model_id = j->model_id,
        .models_dir = m->models_dir,
        .hf = &m->hf,
        .parallel = m->parallel,
        .offline = m->offline,
        .progress_interval_ms = m->interval_ms,
        .layer_start = j->layer_start,
        .layer_end = j->layer_end,
        .peers = (const char *const *)j->peers,
        .n_peers = j->n_peers,
        .peer_token = m->peer_token,
        .progress = on_progress,
        .progress_ud = j,
        .cancel = &j->cancel,
    };
    download_result res;
    enum download_error e = download_model(&req, &res);
    pthread_mutex_lock(&m->lock);
    snprintf(j->model_dir, sizeof j->model_dir, "%s", res.model_dir);
    if (e != DOWNLOAD_OK) {
        j->last.status = DOWNLOAD_FAILED;
        j->last.error = e;
        snprintf(j->message, sizeof j->message, "%s", res.message);
        log_warn("download of %s failed: %s", j->model_id, res.message);
    } else {
        j->last.status = DOWNLOAD_COMPLETED;
        log_info("download of %s complete (%llu bytes fetched)", j->model_id,
                 (unsigned long long)res.bytes_fetched);
    }
    j->running = 0;
    pthread_cond_broadcast(&m->changed);
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

static job *find(download_manager *m, const char *id) {
    for (job *j = m->jobs; j; j = j->next)
        if (!strcmp(j->model_id, id)) return j;
    return NULL;
}

int download_manager_start(download_manager *m, const char *model_id, int layer_start,
                           int layer_end, const char *const *peers, int n_peers, char *err,
                           size_t errlen) {
    char why[256];
    if (store_id_valid(model_id, why, sizeof why) < 0) {
        snprintf(err, errlen, "invalid model id '%s': %s", model_id, why);
        return -1;
    }
    if (layer_start < 0 || (layer_end && layer_end <= layer_start)) {
        snprintf(err, errlen, "invalid layer range [%d, %d)", layer_start, layer_end);
        return -1;
    }
    pthread_mutex_lock(&m->lock);
    job *j = find(m, model_id);
    if (j && j->running) {
        pthread_mutex_unlock(&m->lock);
        return 1;
    }
    if (j && j->joinable) {
        pthread_join(j->thread, NULL); /* finished: reuse its slot */
        j->joinable = 0;
    }
    if (!j) {
        j = calloc(1, sizeof *j);
        if (!j) abort();
        j->m = m;
        snprintf(j->model_id, sizeof j->model_id, "%s", model_id);
        j->next = m->jobs;
        m->jobs = j;
    }
    for (int i = 0; i < j->n_peers; i++) free(j->peers[i]);
    j->n_peers = 0;
    for (int i = 0; i < n_peers && i < 16; i++) j->peers[j->n_peers++] = strdup(peers[i]);
    j->layer_start = layer_start;
    j->layer_end = layer_end;
    j->cancel = 0;
    j->running = 1;
    memset(&j->last, 0, sizeof j->last);
    j->last.status = DOWNLOAD_PENDING;
    j->message[0] = 0;
    if (pthread_create(&j->thread, NULL, job_main, j) != 0) {
        j->running = 0;
        pthread_mutex_unlock(&m->lock);
        snprintf(err, errlen, "cannot start a download thread");
        return -1;
    }
    j->joinable = 1;
    pthread_mutex_unlock(&m->lock);
    return 0;
}

int download_manager_cancel(download_manager *m, const char *model_id) {
    pthread_mutex_lock(&m->lock);
    job *j = find(m, model_id);
    int rc = j && j->running ? 0 : -1;
    if (!rc) j->cancel = 1;
    pthread_mutex_unlock(&m->lock);
    return rc;
}

void download_manager_wait(download_manager *m, const char *model_id) {
    pthread_mutex_lock(&m->lock);
    job *j;
    while ((j = find(m, model_id)) && j->running) pthread_cond_wait(&m->changed, &m->lock);
    pthread_mutex_unlock(&m->lock);
}

static json_t *mem(uint64_t b) { return json_pack("{s:I}", "inBytes", (json_int_t)b); }

json_t *download_progress_json(const char *node_id, const download_progress *p) {
    const char *tag = p->status == DOWNLOAD_ONGOING     ? "DownloadOngoing"
                      : p->status == DOWNLOAD_COMPLETED ? "DownloadCompleted"
                      : p->status == DOWNLOAD_FAILED    ? "DownloadFailed"
                                                        : "DownloadPending";
    json_t *body = json_pack("{s:s, s:s}", "nodeId", node_id ? node_id : "", "modelId",
                             p->model_id ? p->model_id : "");
    if (p->layer_end > 0) { /* one pipeline stage's files, not a copy to serve or place on */
        json_object_set_new(body, "startLayer", json_integer(p->layer_start));
        json_object_set_new(body, "endLayer", json_integer(p->layer_end));
    }
    if (p->status == DOWNLOAD_ONGOING) {
        json_object_set_new(
            body, "downloadProgress",
            json_pack("{s:o, s:o, s:o, s:i, s:i, s:f, s:I}", "total", mem(p->total_bytes),
                      "downloaded", mem(p->downloaded_bytes), "downloadedThisSession",
                      mem(p->fetched_bytes), "completedFiles", p->files_done, "totalFiles",
                      p->files_total, "speed", p->speed, "etaMs",
                      (json_int_t)(p->eta_seconds < 0 ? 0 : p->eta_seconds * 1000)));
    } else if (p->status == DOWNLOAD_COMPLETED) {
        json_object_set_new(body, "total", mem(p->total_bytes));
    } else if (p->status == DOWNLOAD_FAILED) {
        json_object_set_new(body, "errorMessage", json_string(p->message ? p->message : "failed"));
    } else {
        json_object_set_new(body, "downloaded", mem(p->downloaded_bytes));
        json_object_set_new(body, "total", mem(p->total_bytes));
    }
    return json_pack("{s:o}", tag, body);
}

static json_t *job_json(download_manager *m, const job *j) {
    download_progress p = j->last;
    p.model_id = j->model_id;
    p.layer_start = j->layer_start;
    p.layer_end = j->layer_end;
    p.message = j->message[0] ? j->message : NULL;
    json_t *e = download_progress_json(m->node_id, &p);
    json_t *inner = json_object_iter_value(json_object_iter(e));
    if (j->model_dir[0]) json_object_set_new(inner, "modelDirectory", json_string(j->model_dir));
    return e;
}

int download_manager_status(download_manager *m, const char *model_id, json_t **entry) {
    if (entry) *entry = NULL;
    pthread_mutex_lock(&m->lock);
    job *j = find(m, model_id);
    int st = !j ? -1 : j->running ? 0 : j->last.status == DOWNLOAD_COMPLETED ? 1 : 2;
    if (j && entry) *entry = job_json(m, j);
    pthread_mutex_unlock(&m->lock);
    return st;
}

json_t *download_manager_state_json(download_manager *m) {
    json_t *arr = json_array();
    pthread_mutex_lock(&m->lock);
    for (job *j = m->jobs; j; j = j->next) json_array_append_new(arr, job_json(m, j));
    pthread_mutex_unlock(&m->lock);
    return arr;
}

void download_manager_free(download_manager *m) {
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    for (job *j = m->jobs; j; j = j->next) j->cancel = 1;
    pthread_mutex_unlock(&m->lock);
    job *j = m->jobs;
    while (j) {
        job *next = j->next;
        if (j->joinable) pthread_join(j->thread, NULL);
        for (int i = 0; i < j->n_peers; i++) free(j->peers[i]);
        free(j);
        j = next;
    }
    pthread_cond_destroy(&m->changed);
    pthread_mutex_destroy(&m->lock);
    free(m);
}
