/* download engine — what every stage of one download run shares: the run's result (the first
 * error wins), cancellation, the paths of a file in the model dir, the curl options every
 * transfer uses, progress reports, and the record of sparse files (STORE_RANGES). It calls no
 * sibling; plan.c, transfer.c, ranges.c and download.c build on it. */
#include "download/download_internal.h"

#include "base/paths.h"
#include "model/store.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double engine_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void engine_set_result(engine *e, enum download_error err, const char *fmt, ...) {
    if (e->res->error != DOWNLOAD_OK) return; /* the first failure is the one to report */
    e->res->error = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->res->message, sizeof e->res->message, fmt, ap);
    va_end(ap);
}

int engine_cancelled(const engine *e) {
    return e->req->cancel && *e->req->cancel;
}

void engine_final_path(const engine *e, const plan_file *pf, char *out, size_t n) {
    snprintf(out, n, "%s/%s", e->dir, pf->f.path);
}

void engine_partial_path(const engine *e, const plan_file *pf, char *out, size_t n) {
    snprintf(out, n, "%s/%s.partial", e->dir, pf->f.path);
}

int engine_mkdir_parent(const char *path) {
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s", path);
    char *slash = strrchr(tmp, '/');
    if (!slash) return 0;
    *slash = 0;
    return paths_mkdir_p(tmp);
}

void engine_peer_file_url(const char *base, const char *id, const char *path, char *out, size_t n) {
    snprintf(out, n, "%s/models/%s/files/%s", base, id, path);
}

/* The options every file transfer (whole file or byte range) shares: errors into errbuf, up to
 * 5 redirects over http(s) only (the Hub sends LFS files to a CDN), and a server that sends
 * nothing for 60 s is a network error. */
void engine_transfer_setopts(CURL *c, char *errbuf) {
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, "exo/0.1 (+libcurl)");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 15L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
}

struct curl_slist *engine_auth_header(const engine *e, int from_peer, struct curl_slist *hdrs) {
    const char *token = from_peer ? e->req->peer_token : e->hf->token;
    if (!token || !token[0]) return hdrs;
    char auth[600];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    return curl_slist_append(hdrs, auth);
}

void engine_report(engine *e, enum download_status st, int force) {
    if (!e->req->progress) return;
    double t = engine_now_s();
    if (!force && (t - e->last_report) * 1000.0 < e->interval_ms) return;
    download_progress p = {.model_id = e->req->model_id,
                           .status = st,
                           .layer_start = e->req->layer_start,
                           .layer_end = e->req->layer_end};
    const char *current = NULL;
    for (size_t i = 0; i < e->n; i++) {
        plan_file *pf = &e->files[i];
        if (!pf->needed) continue;
        p.files_total++;
        uint64_t size = pf->ranged ? pf->range_total : pf->f.size;
        p.total_bytes += size;
        if (pf->done) {
            p.files_done++;
            p.downloaded_bytes += size;
        } else if (pf->ranged) {
            p.downloaded_bytes += pf->range_done;
        } else {
            p.downloaded_bytes += pf->offset;
            if (pf->active && !current) current = pf->f.path;
        }
    }
    double dt = t - e->last_report;
    if (dt > 0.05 && e->last_report > 0) {
        double inst = (double)(e->fetched - e->last_report_bytes) / dt;
        e->speed = e->speed > 0 ? 0.5 * e->speed + 0.5 * inst : inst;
    }
    p.fetched_bytes = e->fetched;
    p.speed = e->speed;
    p.eta_seconds = e->speed > 1 ? (double)(p.total_bytes - p.downloaded_bytes) / e->speed : -1;
    if (st == DOWNLOAD_COMPLETED) p.eta_seconds = 0;
    p.current_file = current;
    p.error = e->res->error;
    p.message = e->res->error ? e->res->message : NULL;
    e->last_report = t;
    e->last_report_bytes = e->fetched;
    e->req->progress(&p, e->req->progress_ud);
}

/* ---- files holding only some byte ranges (shards) ----
 * STORE_RANGES in the model dir lists every file that is present at full size but sparse:
 * {"files": {path: {"layers": [start, end], "ranges": [[a, b], ...], "bytes": n}}}. Such a file
 * is in place for the stage that fetched it, never for a whole-model download (which fetches and
 * hash-verifies it whole, then drops the entry), and it keeps the model incomplete for the
 * store (so it is never served to peers or listed as downloaded). */
json_t *engine_sparse_load(const engine *e) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", e->dir, STORE_RANGES);
    json_error_t je;
    json_t *m = json_load_file(path, 0, &je);
    json_t *files = json_object_get(m, "files");
    json_t *out = json_is_object(files) ? json_incref(files) : json_object();
    json_decref(m);
    return out;
}

/* Sets (entry != NULL, stolen) or removes the entry of one file. Returns 0 or -1. */
int engine_sparse_set(const engine *e, const char *file, json_t *entry) {
    json_t *files = engine_sparse_load(e);
    if (entry)
        json_object_set_new(files, file, entry);
    else if (json_object_del(files, file) < 0) {
        json_decref(files);
        return 0; /* not listed: nothing to write */
    }
    char path[2048], tmp[2100];
    snprintf(path, sizeof path, "%s/%s", e->dir, STORE_RANGES);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc;
    if (json_object_size(files) == 0)
        rc = unlink(path) == 0 || errno == ENOENT ? 0 : -1;
    else {
        json_t *m = json_pack("{s:O}", "files", files);
        rc = json_dump_file(m, tmp, JSON_INDENT(1)) == 0 && rename(tmp, path) == 0 ? 0 : -1;
        json_decref(m);
    }
    json_decref(files);
    return rc;
}
