/* download transfer — the engine that fetches whole files: one curl multi handle driven by the
 * download's thread, up to `parallel` files at once, each streaming into its .partial (resumed
 * with Range), hashed and written through the ring (hashing.c), verified, then renamed into
 * place. It decides retries, back-off, rate limits and the fall-back from a peer to the Hub. */
#include "download/download_internal.h"

#include "base/log.h"
#include "model/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud) {
    plan_file *pf = ud;
    engine *e = pf->eng;
    size_t n = size * nmemb;
    if (engine_cancelled(e)) return 0;
    if (pf->http_status == 0) {
        long code = 0;
        curl_easy_getinfo(pf->easy, CURLINFO_RESPONSE_CODE, &code);
        pf->http_status = (int)code;
        if (code < 200 || code >= 300)
            pf->body_ignored = 1;
        else if (code == 200 && pf->offset > 0) {
            /* server ignored Range: start over */
            ring_drain(e->ring);
            if (ftruncate(pf->fd, 0) < 0) {
                pf->io_error = errno;
                return 0;
            }
            hash_reset(pf);
        }
    }
    if (pf->body_ignored) return n;
    if (pf->offset + n > pf->f.size) {
        pf->oversize = 1;
        return 0;
    }
    if (ring_push(e->ring, pf, ptr, n) < 0) return 0; /* a write failed: stop */
    pf->offset += n;
    e->fetched += n;
    e->res->bytes_fetched += n;
    if (pf->use_peer) e->res->bytes_from_peers += n;
    return n;
}

/* When a write failed (on the ring's writer thread or inline), sets the download's error and
 * returns 1. Call after ring_drain. */
int transfer_write_error(engine *e, const plan_file *pf) {
    int err = 0;
    plan_file *failed = NULL;
    if ((err = ring_write_error(e->ring, &failed)))
        pf = failed;
    else if (pf && (pf->disk_full || pf->io_error))
        err = pf->disk_full ? ENOSPC : pf->io_error;
    if (!err) return 0;
    if (err == ENOSPC || err == EDQUOT) {
        struct statvfs vfs;
        unsigned long long avail =
            statvfs(e->dir, &vfs) == 0 ? (unsigned long long)vfs.f_bavail * vfs.f_frsize : 0;
        engine_set_result(e, DOWNLOAD_ERR_DISK_FULL,
                          "disk full while writing %s (%llu bytes free in %s); free space or use "
                          "--models-dir on a larger disk, then retry (finished files are kept)",
                          pf->f.path, avail, e->dir);
    } else {
        engine_set_result(e, DOWNLOAD_ERR_IO, "cannot write %s: %s", pf->f.path, strerror(err));
    }
    return 1;
}

void transfer_close_partial(plan_file *pf) {
    if (pf->fd >= 0 && pf->eng) ring_drain(pf->eng->ring); /* queued ranges still read it */
    if (pf->fd >= 0) close(pf->fd);
    pf->fd = -1;
}

static int finish_file(engine *e, plan_file *pf) {
    char got[2 * EVP_MAX_MD_SIZE + 1] = "";
    char part[2048], fin[2048];
    engine_partial_path(e, pf, part, sizeof part);
    engine_final_path(e, pf, fin, sizeof fin);
    int ok = hash_verify(pf, got, sizeof got);
    transfer_close_partial(pf);
    if (transfer_write_error(e, pf)) return 0; /* hashed, but not all of it written */
    if (!ok) {
        log_warn("download %s: %s failed verification (got %s, want %s); removing it",
                 e->req->model_id, pf->f.path, got,
                 hash_kind(&pf->f) == 256 ? pf->f.sha256 : pf->f.git_sha1);
        unlink(part);
        pf->offset = 0;
        ring_drain(e->ring);
        EVP_MD_CTX_free(pf->md);
        pf->md = NULL;
        return -1;
    }
    if (rename(part, fin) < 0) {
        engine_set_result(e, DOWNLOAD_ERR_IO, "cannot move %s into place: %s", fin,
                          strerror(errno));
        return 0;
    }
    pf->done = 1;
    e->res->files_fetched++;
    if (engine_sparse_set(e, pf->f.path, NULL) <
        0) /* it was sparse before: now whole and verified */
        log_warn("download %s: cannot update %s in %s", e->req->model_id, STORE_RANGES, e->dir);
    return 0;
}

/* Starts (or resumes) one file. Returns 0 if started or finished without network, -1 if the
 * whole download must stop (error set). */
static int start_file(engine *e, CURLM *multi, plan_file *pf) {
    char part[2048], url[2048];
    engine_partial_path(e, pf, part, sizeof part);
    if (pf->fd < 0) {
        if (engine_mkdir_parent(part) < 0) {
            engine_set_result(e, DOWNLOAD_ERR_IO, "cannot create the directory for %s: %s", part,
                              strerror(errno));
            return -1;
        }
        pf->fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (pf->fd < 0) {
            engine_set_result(e, errno == ENOSPC ? DOWNLOAD_ERR_DISK_FULL : DOWNLOAD_ERR_IO,
                              "cannot open %s: %s", part, strerror(errno));
            return -1;
        }
        struct stat st;
        uint64_t have = fstat(pf->fd, &st) == 0 ? (uint64_t)st.st_size : 0;
        if (have > pf->f.size) {
            if (ftruncate(pf->fd, 0) < 0) have = 0;
            have = 0;
        }
        if (!pf->md || pf->offset != have) {
            if (hash_catch_up(pf, have) < 0) {
                if (ftruncate(pf->fd, 0) < 0) { /* unreadable partial: start over */
                }
                hash_reset(pf);
            }
        }
    }
    if (pf->offset == pf->f.size) { /* everything is here already: just verify */
        if (finish_file(e, pf) < 0) {
            pf->attempts++;
            pf->not_before = engine_now_s() + (double)e->backoff_ms / 1000.0;
        }
        return 0;
    }
    if (pf->use_peer)
        engine_peer_file_url(e->req->peers[pf->use_peer - 1], e->req->model_id, pf->f.path, url,
                             sizeof url);
    else if (hf_file_url(e->hf, e->req->model_id, pf->f.path, url, sizeof url) < 0) {
        engine_set_result(e, DOWNLOAD_ERR_BAD_INPUT, "URL for %s is too long", pf->f.path);
        return -1;
    }
    CURL *c = curl_easy_init();
    if (!c) {
        engine_set_result(e, DOWNLOAD_ERR_IO, "cannot create an HTTP handle");
        return -1;
    }
    pf->easy = c;
    pf->http_status = 0;
    pf->body_ignored = pf->disk_full = pf->io_error = pf->oversize = 0;
    pf->errbuf[0] = 0;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PRIVATE, pf);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, pf);
    engine_transfer_setopts(c, pf->errbuf);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    pf->hdrs = engine_auth_header(e, pf->use_peer != 0, NULL);
    if (pf->hdrs) curl_easy_setopt(c, CURLOPT_HTTPHEADER, pf->hdrs);
    if (pf->offset > 0) {
        char range[64];
        snprintf(range, sizeof range, "%llu-", (unsigned long long)pf->offset);
        curl_easy_setopt(c, CURLOPT_RANGE, range);
    }
    curl_multi_add_handle(multi, c);
    pf->active = 1;
    return 0;
}

static void end_transfer(CURLM *multi, plan_file *pf) {
    if (!pf->easy) return;
    curl_multi_remove_handle(multi, pf->easy);
    curl_easy_cleanup(pf->easy);
    curl_slist_free_all(pf->hdrs);
    pf->easy = NULL;
    pf->hdrs = NULL;
    pf->active = 0;
}

/* Counts an attempt and schedules the next one after delay_s (< 0: the doubling backoff).
 * Returns whether pf still has attempts left (false: the caller gives up with its reason). */
static bool schedule_retry(engine *e, plan_file *pf, double delay_s) {
    pf->attempts++;
    if (delay_s < 0) {
        delay_s = (double)e->backoff_ms / 1000.0;
        for (int i = 1; i < pf->attempts && delay_s < 60; i++)
            delay_s *= 2;
    }
    pf->not_before = engine_now_s() + delay_s;
    return pf->attempts <= e->max_retries;
}

/* Deletes pf's .partial, to fetch the file again from its first byte. */
static void drop_partial(engine *e, plan_file *pf) {
    transfer_close_partial(pf);
    char part[2048];
    engine_partial_path(e, pf, part, sizeof part);
    unlink(part);
    pf->offset = 0;
}

/* Handles a finished transfer. Returns -1 when the whole download must stop. */
static int on_done(engine *e, CURLM *multi, plan_file *pf, CURLcode rc) {
    long status = 0;
    curl_easy_getinfo(pf->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_off_t retry_after = 0;
    curl_easy_getinfo(pf->easy, CURLINFO_RETRY_AFTER, &retry_after);
    char cerr[CURL_ERROR_SIZE + 64];
    snprintf(cerr, sizeof cerr, "%s", pf->errbuf[0] ? pf->errbuf : curl_easy_strerror(rc));
    int from_peer = pf->use_peer;
    end_transfer(multi, pf);
    if (engine_cancelled(e)) {
        engine_set_result(e, DOWNLOAD_ERR_CANCELLED, "download of %s was cancelled",
                          e->req->model_id);
        return -1;
    }
    ring_drain(e->ring); /* a write that failed is known before deciding what comes next */
    if (transfer_write_error(e, pf)) return -1;
    if (from_peer && (rc != CURLE_OK || status < 200 || status >= 300 || pf->oversize)) {
        /* the peer could not serve it: get it from the Hub instead, keeping what arrived */
        log_info("download %s: peer failed for %s (%s), falling back to the Hub", e->req->model_id,
                 pf->f.path, rc != CURLE_OK ? cerr : "bad status");
        pf->use_peer = 0;
        if (pf->oversize) {
            drop_partial(e, pf);
        }
        return 0;
    }
    if (pf->oversize) {
        log_warn("download %s: %s is larger than the listed %llu bytes; retrying", e->req->model_id,
                 pf->f.path, (unsigned long long)pf->f.size);
        drop_partial(e, pf);
        ring_drain(e->ring);
        EVP_MD_CTX_free(pf->md);
        pf->md = NULL;
        schedule_retry(e, pf, -1);
    } else if (status == 429) {
        double wait = retry_after > 0 ? (double)retry_after : -1;
        if (wait > 300) wait = 300;
        log_info("download %s: rate limited on %s, waiting %.0f s", e->req->model_id, pf->f.path,
                 wait < 0 ? (double)e->backoff_ms / 1000.0 : wait);
        if (schedule_retry(e, pf, wait)) return 0;
        engine_set_result(e, DOWNLOAD_ERR_RATE_LIMIT,
                          "the Hub kept answering 429 (rate limited) for %s after %d attempts; "
                          "wait and retry, or set HF_TOKEN for higher limits",
                          pf->f.path, pf->attempts);
        return -1;
    } else if (status == 416 && pf->offset == pf->f.size) {
        return finish_file(e, pf) < 0 ? (schedule_retry(e, pf, -1), 0) : 0;
    } else if (status == 401 || status == 403) {
        engine_set_result(
            e, DOWNLOAD_ERR_AUTH,
            "HTTP %ld for %s: %s is gated or private; set HF_TOKEN to a token with access "
            "(and accept the model's license on huggingface.co)",
            status, pf->f.path, e->req->model_id);
        return -1;
    } else if (status == 404) {
        engine_set_result(e, DOWNLOAD_ERR_NOT_FOUND,
                          "HTTP 404 for %s of %s: the file is gone from the repository", pf->f.path,
                          e->req->model_id);
        return -1;
    } else if (rc != CURLE_OK || status >= 500 || status < 200 || status >= 300) {
        log_info("download %s: %s interrupted at %llu/%llu bytes (%s); will resume",
                 e->req->model_id, pf->f.path, (unsigned long long)pf->offset,
                 (unsigned long long)pf->f.size, rc != CURLE_OK ? cerr : "server error");
        if (status == 416) { /* our partial is out of step with the server: restart the file */
            drop_partial(e, pf);
        }
        if (schedule_retry(e, pf, -1)) return 0;
        engine_set_result(e, DOWNLOAD_ERR_NETWORK, "giving up on %s after %d attempts: %s%s%ld",
                          pf->f.path, pf->attempts, rc != CURLE_OK ? cerr : "",
                          rc != CURLE_OK ? "" : "HTTP ", rc != CURLE_OK ? 0L : status);
        return -1;
    } else if (pf->offset < pf->f.size) {
        schedule_retry(e, pf, -1); /* short body: resume */
    } else if (finish_file(e, pf) < 0) {
        if (from_peer) { /* a peer sent bad bytes: get this file from the Hub instead */
            pf->use_peer = 0;
            return 0;
        }
        if (schedule_retry(e, pf, -1)) return 0;
        engine_set_result(e, DOWNLOAD_ERR_VERIFY,
                          "%s failed its checksum %d times (corrupt data from the server?); the "
                          "corrupt file was removed — retry later",
                          pf->f.path, pf->attempts);
        return -1;
    }
    if (pf->attempts > e->max_retries && !pf->done) {
        engine_set_result(e, DOWNLOAD_ERR_NETWORK, "giving up on %s after %d attempts", pf->f.path,
                          pf->attempts);
        return -1;
    }
    return e->res->error ? -1 : 0;
}

int transfer_run(engine *e) {
    CURLM *multi = curl_multi_init();
    if (!multi) {
        engine_set_result(e, DOWNLOAD_ERR_IO, "cannot create the transfer engine");
        return -1;
    }
    int rc = 0;
    for (;;) {
        if (engine_cancelled(e)) {
            engine_set_result(e, DOWNLOAD_ERR_CANCELLED, "download of %s was cancelled",
                              e->req->model_id);
            rc = -1;
            break;
        }
        int active = 0, pending = 0;
        double t = engine_now_s(), next_wake = t + 1.0;
        for (size_t i = 0; i < e->n; i++)
            active += e->files[i].active;
        for (size_t i = 0; i < e->n && rc == 0; i++) {
            plan_file *pf = &e->files[i];
            if (!pf->needed || pf->done || pf->active || pf->ranged) continue;
            pending++;
            if (pf->not_before > t) {
                if (pf->not_before < next_wake) next_wake = pf->not_before;
                continue;
            }
            if (active >= e->parallel) continue;
            if (start_file(e, multi, pf) < 0)
                rc = -1;
            else if (pf->active)
                active++;
        }
        if (rc < 0) break;
        if (!active && !pending) break;
        int running = 0;
        curl_multi_perform(multi, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            plan_file *pf = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&pf);
            if (on_done(e, multi, pf, msg->data.result) < 0) rc = -1;
            if (rc < 0) break;
        }
        if (rc < 0) break;
        engine_report(e, DOWNLOAD_ONGOING, 0);
        int still = 0;
        for (size_t i = 0; i < e->n; i++)
            still += e->files[i].active;
        if (still < active)
            continue; /* a transfer ended: start the next file, or finish, now
                       * (polling an engine with nothing left in it would just
                       * sleep out the timeout: 200 ms at the end of every run) */
        int wait_ms = (int)((next_wake - engine_now_s()) * 1000);
        if (wait_ms > 200) wait_ms = 200;
        if (wait_ms < 1) wait_ms = 1;
        if (active)
            curl_multi_poll(multi, NULL, 0, wait_ms, NULL);
        else
            usleep((useconds_t)wait_ms * 1000);
    }
    for (size_t i = 0; i < e->n; i++) {
        end_transfer(multi, &e->files[i]);
        transfer_close_partial(&e->files[i]);
    }
    curl_multi_cleanup(multi);
    return rc;
}
