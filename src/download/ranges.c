/* download ranges — ranged fetch of the files a pipeline stage needs only part of.
 * Blocking, one range at a time: a stage's tensors are contiguous runs, so a file needs a
 * handful of requests. Integrity: each response must be a 206 whose Content-Range starts where
 * asked, for a file of the listed size, and bring exactly the asked bytes; the header's offsets
 * must lie inside the file. A whole-file SHA-256 cannot check part of a file, so these bytes are
 * not hash-verified until a whole-model download fetches the file whole (and verifies it). */
#include "download/download_internal.h"

#include "base/log.h"
#include "model/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/statvfs.h>
#include <unistd.h>

typedef struct range_xfer {
    engine *e;
    plan_file *pf;
    int fd, from_peer;
    uint64_t pos, end; /* next byte to write; end exclusive */
    long status;
    int cr_checked, cr_bad, io_error, disk_full, oversize;
    CURL *easy;
} range_xfer;

enum { RANGE_OK = 0, RANGE_FATAL = -1, RANGE_FAILED = -2, RANGE_UNSUPPORTED = -3 };

static size_t range_header(char *buf, size_t size, size_t nitems, void *ud) {
    range_xfer *x = ud;
    size_t n = size * nitems;
    if (n > 14 && !strncasecmp(buf, "content-range:", 14)) {
        char line[256];
        snprintf(line, sizeof line, "%.*s", (int)(n < 255 ? n : 255), buf);
        unsigned long long a = 0, b = 0, total = 0;
        const char *p = line + 14;
        while (*p == ' ')
            p++;
        x->cr_checked = 1;
        if (sscanf(p, "bytes %llu-%llu/%llu", &a, &b, &total) != 3 || a != x->pos ||
            total != x->pf->f.size || b + 1 > x->end)
            x->cr_bad = 1;
    }
    return n;
}

static size_t range_body(char *ptr, size_t size, size_t nmemb, void *ud) {
    range_xfer *x = ud;
    engine *e = x->e;
    size_t n = size * nmemb;
    if (engine_cancelled(e)) return 0;
    if (!x->status) curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->status == 200) return 0; /* the whole file: stop, fetch it whole instead */
    if (x->status != 206) return n; /* an error page: judged after */
    if (!x->cr_checked || x->cr_bad) return 0;
    if (x->pos + n > x->end) {
        x->oversize = 1;
        return 0;
    }
    int err = write_all_at(x->fd, ptr, n, x->pos);
    if (err) {
        if (err == ENOSPC || err == EDQUOT)
            x->disk_full = 1;
        else
            x->io_error = err;
        return 0;
    }
    x->pos += n;
    x->pf->range_done += n;
    e->fetched += n;
    e->res->bytes_fetched += n;
    if (x->from_peer) e->res->bytes_from_peers += n;
    engine_report(e, DOWNLOAD_ONGOING, 0);
    return n;
}

static int range_xferinfo(void *ud, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
    (void)a, (void)b, (void)c, (void)d;
    return engine_cancelled(((range_xfer *)ud)->e);
}

/* Fetches bytes [a, b) of pf from url into fd at the same offsets, with retries. FATAL sets the
 * result (cancel, disk, local I/O, auth); FAILED leaves the message in msg. */
static int fetch_range(engine *e, plan_file *pf, int fd, const char *url, int from_peer, uint64_t a,
                       uint64_t b, enum download_error *code, char *msg, size_t msglen) {
    uint64_t pos = a;
    int attempts = 0;
    while (pos < b) {
        if (engine_cancelled(e)) {
            engine_set_result(e, DOWNLOAD_ERR_CANCELLED, "download of %s was cancelled",
                              e->req->model_id);
            return RANGE_FATAL;
        }
        CURL *c = curl_easy_init();
        if (!c) {
            engine_set_result(e, DOWNLOAD_ERR_IO, "cannot create an HTTP handle");
            return RANGE_FATAL;
        }
        range_xfer x = {
            .e = e, .pf = pf, .fd = fd, .from_peer = from_peer, .pos = pos, .end = b, .easy = c};
        char range[64], errbuf[CURL_ERROR_SIZE] = "";
        snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)pos,
                 (unsigned long long)(b - 1));
        struct curl_slist *hdrs = engine_auth_header(e, from_peer, NULL);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_RANGE, range);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, range_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, range_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, range_xferinfo);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, &x);
        engine_transfer_setopts(c, errbuf);
        if (hdrs) curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
        CURLcode rc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_off_t retry_after = 0;
        curl_easy_getinfo(c, CURLINFO_RETRY_AFTER, &retry_after);
        curl_easy_cleanup(c);
        curl_slist_free_all(hdrs);
        pos = x.pos;
        if (engine_cancelled(e)) continue;
        if (x.disk_full) {
            engine_set_result(
                e, DOWNLOAD_ERR_DISK_FULL,
                "disk full while writing %s; free space or use --models-dir on a larger disk",
                pf->f.path);
            return RANGE_FATAL;
        }
        if (x.io_error) {
            engine_set_result(e, DOWNLOAD_ERR_IO, "cannot write %s: %s", pf->f.path,
                              strerror(x.io_error));
            return RANGE_FATAL;
        }
        if (pos >= b) break;
        if (status == 200) return RANGE_UNSUPPORTED; /* the server ignores Range */
        if (status == 401 || status == 403 || status == 404) {
            *code = status == 404 ? DOWNLOAD_ERR_NOT_FOUND : DOWNLOAD_ERR_AUTH;
            snprintf(msg, msglen, "HTTP %ld for %.200s of %.200s%s", status, pf->f.path,
                     e->req->model_id,
                     status == 404 ? "" : ": set HF_TOKEN to a token with access");
            return RANGE_FAILED;
        }
        if (x.cr_bad || x.oversize || (status == 206 && !x.cr_checked)) {
            *code = DOWNLOAD_ERR_VERIFY;
            snprintf(msg, msglen,
                     "%.200s: the server answered a range request for bytes %s with other bytes",
                     pf->f.path, range);
            return RANGE_FAILED;
        }
        if (++attempts > e->max_retries) {
            *code = status == 429 ? DOWNLOAD_ERR_RATE_LIMIT : DOWNLOAD_ERR_NETWORK;
            snprintf(msg, msglen, "giving up on bytes %s of %.200s after %d attempts: %.200s%s%ld",
                     range, pf->f.path, attempts,
                     rc != CURLE_OK ? (errbuf[0] ? errbuf : curl_easy_strerror(rc)) : "",
                     rc != CURLE_OK ? "" : "HTTP ", rc != CURLE_OK ? 0L : status);
            return RANGE_FAILED;
        }
        double wait =
            status == 429 && retry_after > 0 ? (double)retry_after : (double)e->backoff_ms / 1000.0;
        for (int i = 1; i < attempts && status != 429 && wait < 60; i++)
            wait *= 2;
        if (wait > 300) wait = 300;
        log_info("download %s: bytes %s of %s interrupted at %llu (%s); retrying in %.1f s",
                 e->req->model_id, range, pf->f.path, (unsigned long long)pos,
                 rc != CURLE_OK ? (errbuf[0] ? errbuf : curl_easy_strerror(rc)) : "server error",
                 wait);
        for (double t = 0; t < wait && !engine_cancelled(e); t += 0.05)
            usleep(50000);
    }
    return RANGE_OK;
}

#define MAX_RANGES 4096

/* One ranged file from one source. */
static int ranged_file_from(engine *e, plan_file *pf, const char *url, int from_peer,
                            enum download_error *code, char *msg, size_t msglen) {
    char part[2048], fin[2048];
    engine_partial_path(e, pf, part, sizeof part);
    engine_final_path(e, pf, fin, sizeof fin);
    if (engine_mkdir_parent(part) < 0) {
        engine_set_result(e, DOWNLOAD_ERR_IO, "cannot create the directory for %s: %s", part,
                          strerror(errno));
        return RANGE_FATAL;
    }
    int fd = open(part, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)pf->f.size) < 0) { /* sparse: holes cost no disk */
        engine_set_result(e, errno == ENOSPC ? DOWNLOAD_ERR_DISK_FULL : DOWNLOAD_ERR_IO,
                          "cannot create %s: %s", part, strerror(errno));
        if (fd >= 0) close(fd);
        return RANGE_FATAL;
    }
    pf->range_done = 0;
    download_range *ranges = malloc(MAX_RANGES * sizeof *ranges);
    unsigned char *head = NULL;
    uint64_t have = 0, need = 8;
    int n = -2, rc = RANGE_OK;
    char err[256];
    while (n == -2 && rc == RANGE_OK) { /* the 8-byte length, then the JSON header */
        rc = fetch_range(e, pf, fd, url, from_peer, have, need, code, msg, msglen);
        if (rc != RANGE_OK) break;
        unsigned char *nh = ranges ? realloc(head, (size_t)need) : NULL;
        if (!nh) {
            engine_set_result(e, DOWNLOAD_ERR_IO, "out of memory reading the header of %s",
                              pf->f.path);
            rc = RANGE_FATAL;
            break;
        }
        head = nh;
        if (pread(fd, head, (size_t)need, 0) != (ssize_t)need) {
            engine_set_result(e, DOWNLOAD_ERR_IO, "cannot read back %s: %s", part, strerror(errno));
            rc = RANGE_FATAL;
            break;
        }
        have = need;
        n = download_shard_ranges(head, (size_t)have, pf->f.size, e->n_layers, e->tie,
                                  e->req->layer_start, e->req->layer_end, ranges, MAX_RANGES, &need,
                                  err, sizeof err);
        if (n == -1) {
            *code = DOWNLOAD_ERR_VERIFY;
            snprintf(msg, msglen, "%.200s: %.250s", pf->f.path, err);
            rc = RANGE_FAILED;
        }
    }
    free(head);
    json_t *list = json_array();
    if (rc == RANGE_OK) {
        pf->range_total = 0;
        for (int i = 0; i < n; i++)
            pf->range_total += ranges[i].end - ranges[i].start;
        struct statvfs vfs;
        uint64_t left = pf->range_total - pf->range_done;
        if (statvfs(e->dir, &vfs) == 0 &&
            (uint64_t)vfs.f_bavail * vfs.f_frsize < left + e->req->min_free_bytes) {
            engine_set_result(
                e, DOWNLOAD_ERR_DISK_FULL,
                "not enough disk space for the layers of %s in %s: need %llu bytes; free "
                "space or use --models-dir on a larger disk",
                e->req->model_id, pf->f.path, (unsigned long long)(left + e->req->min_free_bytes));
            rc = RANGE_FATAL;
        }
        for (int i = 0; i < n && rc == RANGE_OK; i++) {
            uint64_t a = ranges[i].start < have ? have : ranges[i].start; /* the header is here */
            if (a < ranges[i].end)
                rc = fetch_range(e, pf, fd, url, from_peer, a, ranges[i].end, code, msg, msglen);
            json_array_append_new(
                list, json_pack("[I,I]", (json_int_t)ranges[i].start, (json_int_t)ranges[i].end));
        }
    }
    free(ranges);
    close(fd);
    if (rc == RANGE_OK) {
        json_t *entry =
            json_pack("{s:[i,i], s:o, s:I}", "layers", e->req->layer_start, e->req->layer_end,
                      "ranges", list, "bytes", (json_int_t)pf->range_total);
        if (engine_sparse_set(e, pf->f.path, entry) < 0 || rename(part, fin) < 0) {
            engine_set_result(e, DOWNLOAD_ERR_IO, "cannot move %s into place: %s", fin,
                              strerror(errno));
            return RANGE_FATAL;
        }
        pf->done = 1;
        e->res->files_fetched++;
        log_info("download %s: %s: %llu of %llu bytes (this stage's tensors)", e->req->model_id,
                 pf->f.path, (unsigned long long)pf->range_total, (unsigned long long)pf->f.size);
        return RANGE_OK;
    }
    json_decref(list);
    unlink(part);
    pf->range_done = 0;
    return rc;
}

/* Fetches every ranged file of the plan: from the peer first if the plan uses one, then the Hub.
 * A server that ignores Range gets the file fetched whole (ranged = 0) by the engine instead.
 * Returns 0, or -1 with the result set. */
int ranges_fetch_files(engine *e) {
    for (size_t i = 0; i < e->n; i++) {
        plan_file *pf = &e->files[i];
        if (!pf->needed || pf->done || !pf->ranged) continue;
        for (int src = pf->use_peer ? 0 : 1; src < 2; src++) {
            char url[2048], msg[512] = "";
            enum download_error code = DOWNLOAD_ERR_NETWORK;
            if (src == 0)
                engine_peer_file_url(e->req->peers[pf->use_peer - 1], e->req->model_id, pf->f.path,
                                     url, sizeof url);
            else if (hf_file_url(e->hf, e->req->model_id, pf->f.path, url, sizeof url) < 0) {
                engine_set_result(e, DOWNLOAD_ERR_BAD_INPUT, "URL for %s is too long", pf->f.path);
                return -1;
            }
            int rc = ranged_file_from(e, pf, url, src == 0, &code, msg, sizeof msg);
            if (rc == RANGE_OK) break;
            if (rc == RANGE_FATAL) return -1;
            if (rc == RANGE_UNSUPPORTED) {
                log_info("download %s: %s does not support byte ranges; fetching %s whole",
                         e->req->model_id, src == 0 ? "the peer" : "the Hub", pf->f.path);
                pf->ranged = 0;
                if (src == 0) pf->use_peer = 0;
                break;
            }
            if (src == 0) {
                log_info("download %s: peer failed for %s (%s), falling back to the Hub",
                         e->req->model_id, pf->f.path, msg);
                pf->use_peer = 0;
                continue;
            }
            engine_set_result(e, code, "%s", msg);
            return -1;
        }
    }
    return 0;
}
