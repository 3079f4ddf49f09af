/* download — plan and run a model download (see download.h). The transfer engine is one
 * curl multi handle driven by this thread; each file is a plan_file with its own .partial fd
 * and running hash, so a dropped connection resumes from the bytes already hashed. */
#include "download/download.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/paths.h"
#include "base/strbuf.h"
#include "model/safetensors.h"
#include "model/store.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

void download_curl_init(void);

typedef struct plan_file {
    hf_file f;
    int needed;           /* part of this plan */
    int done;             /* verified and in place */
    int active;           /* a transfer is running */
    int fd;               /* .partial, -1 when closed */
    uint64_t offset;      /* bytes in .partial == bytes hashed */
    EVP_MD_CTX *md;       /* hash of bytes [0, offset) (with the git prefix for SHA-1) */
    int attempts;
    double not_before;    /* seconds (monotonic) before which no retry starts */
    int use_peer;         /* index+1 into peers, 0 = the Hub */
    int http_status;      /* status of the current response (0 until headers) */
    int body_ignored;     /* non-2xx body being discarded */
    int disk_full, io_error, oversize;
    int ranged;           /* shard: fetch only the byte ranges of this stage's tensors */
    uint64_t range_total; /* bytes those ranges hold (the whole size until the header is read) */
    uint64_t range_done;  /* of which on disk */
    CURL *easy;
    struct curl_slist *hdrs;
    char errbuf[CURL_ERROR_SIZE];
    struct engine *eng;
} plan_file;

/* The receive path (libcurl's write callback) only copies each chunk libcurl hands over (16 KiB
 * at a time, whatever CURLOPT_BUFFERSIZE is), still hot in the CPU cache, into one
 * preallocated byte ring. Two threads consume the ring: one hashes it, one writes it to the
 * .partial files in blocks of up to RING_STEP bytes (one pwrite per MiB instead of one per
 * 16 KiB chunk). So receiving, hashing and writing overlap on up to three cores and none of
 * them is the long pole that receive + write + hash in one thread would be. A ring byte is
 * reused once it is both hashed and written. No allocation and no page faults per chunk, and
 * no second read of the data from the page cache (which perf showed costing more than the
 * copy). Consecutive chunks of one file coalesce into one job. Anything that reads, truncates,
 * closes or verifies a .partial first drains the ring (ring_drain); a failed write is recorded
 * in werr_pf / werr, and the engine stops the download with it. */
typedef struct ring_job {
    plan_file *pf;
    EVP_MD_CTX *md;
    uint64_t off; /* file offset of the job's first byte */
    uint64_t len; /* grows while the job is the last one */
} ring_job;

enum { RING_HASH, RING_WRITE, RING_CONSUMERS };

#define RING_JOBS 256
#define RING_BYTES (16ull << 20) /* small enough to stay in the last-level cache */
#define RING_STEP (1u << 20)     /* bytes hashed or written per lock round trip */
#define RING_WAKE (1u << 20)     /* a consumer sleeps until this much is queued (or a drain) */

typedef struct ring {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    ring_job jobs[RING_JOBS];
    uint64_t jtail;                 /* jobs queued so far (jobs[i % RING_JOBS]) */
    uint64_t tail;                  /* bytes queued so far (ring position, monotonic) */
    uint64_t jpos[RING_CONSUMERS];  /* each consumer's current job (never past the last one) */
    uint64_t jdone[RING_CONSUMERS]; /* bytes of that job it has done */
    uint64_t pos[RING_CONSUMERS];   /* ring position it has reached */
    int busy[RING_CONSUMERS], sleeping[RING_CONSUMERS];
    int stop, draining, nthreads;
    plan_file *werr_pf;             /* first file whose write failed, and the errno */
    int werr;
    unsigned char *ring;
    pthread_t thread[RING_CONSUMERS];
} ring;

typedef struct ring_arg {
    ring *r;
    int k;
} ring_arg;

/* The options every file transfer (whole file or byte range) shares: errors into errbuf, up to
 * 5 redirects over http(s) only (the Hub sends LFS files to a CDN), and a server that sends
 * nothing for 60 s is a network error. */
static void transfer_setopts(CURL *c, char *errbuf) {
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

static uint64_t ring_min(const uint64_t *v) { return v[0] < v[1] ? v[0] : v[1]; }

/* Writes all n bytes at off (retrying short writes and EINTR). Returns 0 or the errno. */
static int pwrite_all(int fd, const char *p, size_t n, uint64_t off) {
    size_t written = 0;
    while (written < n) {
        ssize_t w = pwrite(fd, p + written, n - written, (off_t)(off + written));
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        written += (size_t)w;
    }
    return 0;
}

/* Records a failed write of pf's bytes: on the ring (called with it locked) when the consumer
 * threads write, else on the file. The engine turns it into the download's error. */
static void write_failed(ring *r, plan_file *pf, int err) {
    if (r) {
        if (!r->werr_pf) r->werr_pf = pf, r->werr = err;
    } else if (err == ENOSPC || err == EDQUOT) {
        pf->disk_full = 1;
    } else {
        pf->io_error = err;
    }
}

static void *ring_main(void *arg) {
    ring *r = ((ring_arg *)arg)->r;
    int k = ((ring_arg *)arg)->k;
    free(arg);
    pthread_mutex_lock(&r->lock);
    for (;;) {
        /* batch: one wake-up per RING_WAKE bytes, not one per received chunk */
        while (!r->stop && (r->pos[k] == r->tail || (r->tail - r->pos[k] < RING_WAKE && !r->draining))) {
            r->sleeping[k] = 1;
            pthread_cond_wait(&r->cond, &r->lock);
            r->sleeping[k] = 0;
        }
        if (r->pos[k] == r->tail) break; /* stopping, nothing left */
        ring_job *j = &r->jobs[r->jpos[k] % RING_JOBS];
        if (r->jdone[k] == j->len) { /* done with it, and bytes are queued: a later job exists */
            r->jpos[k]++;
            r->jdone[k] = 0;
            continue;
        }
        uint64_t at = r->pos[k] % RING_BYTES, n = j->len - r->jdone[k];
        if (n > RING_STEP) n = RING_STEP;
        if (n > RING_BYTES - at) n = RING_BYTES - at; /* up to the wrap */
        plan_file *pf = j->pf;
        EVP_MD_CTX *md = j->md;
        uint64_t off = j->off + r->jdone[k];
        int fd = k == RING_WRITE && !r->werr_pf ? pf->fd : -2; /* after a failure: drop the bytes */
        r->busy[k] = 1;
        pthread_mutex_unlock(&r->lock);
        int err = 0;
        if (k == RING_HASH) EVP_DigestUpdate(md, r->ring + at, (size_t)n);
        else if (fd != -2) err = fd < 0 ? EBADF : pwrite_all(fd, (const char *)r->ring + at, (size_t)n, off);
        pthread_mutex_lock(&r->lock);
        if (err) write_failed(r, pf, err);
        r->busy[k] = 0;
        r->pos[k] += n;
        r->jdone[k] += n; /* a consumer stays on the last job even when done: it may grow */
        pthread_cond_broadcast(&r->cond);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

static void ring_stop(ring *r) {
    if (!r) return;
    pthread_mutex_lock(&r->lock);
    r->stop = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    for (int k = 0; k < r->nthreads; k++) pthread_join(r->thread[k], NULL);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    free(r->ring);
    free(r);
}

/* NULL when threads or memory are short: callers then hash and write inline. */
static ring *ring_start(void) {
    ring *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->ring = malloc(RING_BYTES);
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cond, NULL);
    for (int k = 0; r->ring && k < RING_CONSUMERS; k++) {
        ring_arg *a = malloc(sizeof *a);
        if (!a) break;
        *a = (ring_arg){.r = r, .k = k};
        if (pthread_create(&r->thread[k], NULL, ring_main, a) != 0) {
            free(a);
            break;
        }
        r->nthreads++;
    }
    if (r->nthreads < RING_CONSUMERS) {
        ring_stop(r);
        return NULL;
    }
    return r;
}

/* Waits until every queued byte is hashed and written. */
static void ring_drain(ring *r) {
    if (!r) return;
    pthread_mutex_lock(&r->lock);
    r->draining++;
    pthread_cond_broadcast(&r->cond);
    while (ring_min(r->pos) != r->tail || r->busy[0] || r->busy[1]) pthread_cond_wait(&r->cond, &r->lock);
    r->draining--;
    pthread_mutex_unlock(&r->lock);
}

/* 1 when a write has failed (the download must stop). */
static int ring_failed(ring *r) {
    if (!r) return 0;
    pthread_mutex_lock(&r->lock);
    int f = r->werr_pf != NULL;
    pthread_mutex_unlock(&r->lock);
    return f;
}

/* Queues n received bytes of pf (at pf->offset, in order) to be hashed and written. Returns 0,
 * or -1 when a write failed (this one inline, or any earlier one on the threads). */
static int ring_push(ring *r, plan_file *pf, const void *data, size_t n) {
    if (!r || n > RING_BYTES / 4) { /* no consumer threads (or a huge chunk): inline */
        ring_drain(r);
        if (ring_failed(r)) return -1;
        int err = pwrite_all(pf->fd, data, n, pf->offset);
        if (err) {
            if (r) pthread_mutex_lock(&r->lock);
            write_failed(r, pf, err);
            if (r) pthread_mutex_unlock(&r->lock);
            return -1;
        }
        EVP_DigestUpdate(pf->md, data, n);
        return 0;
    }
    pthread_mutex_lock(&r->lock);
    int waited = 0;
    for (;;) {
        int room = r->tail + n - ring_min(r->pos) <= RING_BYTES;
        int slot = r->jtail - ring_min(r->jpos) < RING_JOBS;
        if (room && slot) break;
        if (!waited) { /* full (of bytes or of small jobs): the consumers must run what is queued */
            waited = 1;
            r->draining++;
            pthread_cond_broadcast(&r->cond);
        }
        pthread_cond_wait(&r->cond, &r->lock);
    }
    if (waited) r->draining--;
    int failed = r->werr_pf != NULL;
    uint64_t tail = r->tail;
    pthread_mutex_unlock(&r->lock);
    if (failed) return -1;
    /* [tail, tail+n) is free: only this thread writes there, and no consumer reads past tail */
    uint64_t at = tail % RING_BYTES, first = RING_BYTES - at < n ? RING_BYTES - at : n;
    memcpy(r->ring + at, data, (size_t)first);
    if (first < n) memcpy(r->ring, (const unsigned char *)data + first, (size_t)(n - first));
    pthread_mutex_lock(&r->lock);
    ring_job *t = r->jtail ? &r->jobs[(r->jtail - 1) % RING_JOBS] : NULL;
    /* consecutive bytes of one file grow the last job (no consumer moves past the last job),
     * so a consumer that keeps up still hashes and writes a MiB at a time */
    if (t && t->pf == pf && t->md == pf->md && t->off + t->len == pf->offset)
        t->len += n;
    else {
        r->jobs[r->jtail % RING_JOBS] = (ring_job){.pf = pf, .md = pf->md, .off = pf->offset, .len = n};
        r->jtail++;
    }
    r->tail += n;
    if ((r->sleeping[0] && r->tail - r->pos[0] >= RING_WAKE) || (r->sleeping[1] && r->tail - r->pos[1] >= RING_WAKE))
        pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    return 0;
}

typedef struct engine {
    const download_request *req;
    const hf_config *hf;
    download_result *res;
    char dir[1024];
    plan_file *files;
    size_t n;
    const char *peer_base; /* peer whose manifest we use (files come from it first) */
    double started, last_report;
    uint64_t last_report_bytes;
    double speed;
    int parallel, max_retries, backoff_ms, interval_ms;
    uint64_t fetched;
    ring *ring;
    int n_layers, tie; /* shard plans */
} engine;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void set_result(engine *e, enum download_error err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_result(engine *e, enum download_error err, const char *fmt, ...) {
    if (e->res->error != DOWNLOAD_OK) return; /* the first failure is the one to report */
    e->res->error = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->res->message, sizeof e->res->message, fmt, ap);
    va_end(ap);
}

static int cancelled(const engine *e) { return e->req->cancel && *e->req->cancel; }

/* ---- hashing ---- */

static int hash_kind(const hf_file *f) { return f->sha256[0] ? 256 : f->git_sha1[0] ? 1 : 0; }

static void md_reset(plan_file *pf) {
    ring_drain(pf->eng->ring);
    if (!pf->md) pf->md = EVP_MD_CTX_new();
    if (!pf->md) abort();
    int k = hash_kind(&pf->f);
    EVP_DigestInit_ex(pf->md, k == 1 ? EVP_sha1() : EVP_sha256(), NULL);
    if (k == 1) {
        char prefix[64];
        int n = snprintf(prefix, sizeof prefix, "blob %llu", (unsigned long long)pf->f.size);
        EVP_DigestUpdate(pf->md, prefix, (size_t)n + 1); /* includes the NUL */
    }
    pf->offset = 0;
}

/* 1 = matches (or nothing to check), 0 = mismatch. Consumes the running hash. */
static int md_verify(plan_file *pf, char *got, size_t gotlen) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    ring_drain(pf->eng->ring);
    EVP_DigestFinal_ex(pf->md, digest, &dl);
    for (unsigned i = 0; i < dl && 2 * i + 2 < gotlen; i++) sprintf(got + 2 * i, "%02x", digest[i]);
    int k = hash_kind(&pf->f);
    if (k == 0) return 1;
    return !strcmp(got, k == 256 ? pf->f.sha256 : pf->f.git_sha1);
}

/* Re-hashes the bytes already in .partial (after a restart). Returns 0 or -1. */
static int md_catch_up(plan_file *pf, uint64_t upto) {
    md_reset(pf);
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = upto ? malloc(CHUNK) : NULL; /* not on the stack: threads may be small */
    if (upto && !buf) return -1;
    int rc = 0;
    while (pf->offset < upto) {
        size_t want = upto - pf->offset < CHUNK ? (size_t)(upto - pf->offset) : CHUNK;
        ssize_t r = pread(pf->fd, buf, want, (off_t)pf->offset);
        if (r <= 0) {
            rc = -1;
            break;
        }
        EVP_DigestUpdate(pf->md, buf, (size_t)r);
        pf->offset += (uint64_t)r;
    }
    free(buf);
    return rc;
}

/* ---- paths ---- */

static void final_path(const engine *e, const plan_file *pf, char *out, size_t n) {
    snprintf(out, n, "%s/%s", e->dir, pf->f.path);
}
static void partial_path(const engine *e, const plan_file *pf, char *out, size_t n) {
    snprintf(out, n, "%s/%s.partial", e->dir, pf->f.path);
}

static int mkdir_parent(const char *path) {
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s", path);
    char *slash = strrchr(tmp, '/');
    if (!slash) return 0;
    *slash = 0;
    return paths_mkdir_p(tmp);
}

/* ---- progress ---- */

static void report(engine *e, enum download_status st, int force) {
    if (!e->req->progress) return;
    double t = now_s();
    if (!force && (t - e->last_report) * 1000.0 < e->interval_ms) return;
    download_progress p = {.model_id = e->req->model_id, .status = st};
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

/* ---- transfers ---- */

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud) {
    plan_file *pf = ud;
    engine *e = pf->eng;
    size_t n = size * nmemb;
    if (cancelled(e)) return 0;
    if (pf->http_status == 0) {
        long code = 0;
        curl_easy_getinfo(pf->easy, CURLINFO_RESPONSE_CODE, &code);
        pf->http_status = (int)code;
        if (code < 200 || code >= 300) pf->body_ignored = 1;
        else if (code == 200 && pf->offset > 0) {
            /* server ignored Range: start over */
            ring_drain(e->ring);
            if (ftruncate(pf->fd, 0) < 0) {
                pf->io_error = errno;
                return 0;
            }
            md_reset(pf);
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
static int write_error(engine *e, const plan_file *pf) {
    int err = 0;
    if (e->ring && e->ring->werr_pf) pf = e->ring->werr_pf, err = e->ring->werr;
    else if (pf && (pf->disk_full || pf->io_error)) err = pf->disk_full ? ENOSPC : pf->io_error;
    if (!err) return 0;
    if (err == ENOSPC || err == EDQUOT) {
        struct statvfs vfs;
        unsigned long long avail = statvfs(e->dir, &vfs) == 0 ? (unsigned long long)vfs.f_bavail * vfs.f_frsize : 0;
        set_result(e, DOWNLOAD_ERR_DISK_FULL,
                   "disk full while writing %s (%llu bytes free in %s); free space or use "
                   "--models-dir on a larger disk, then retry (finished files are kept)",
                   pf->f.path, avail, e->dir);
    } else {
        set_result(e, DOWNLOAD_ERR_IO, "cannot write %s: %s", pf->f.path, strerror(err));
    }
    return 1;
}

static void close_partial(plan_file *pf) {
    if (pf->fd >= 0 && pf->eng) ring_drain(pf->eng->ring); /* queued ranges still read it */
    if (pf->fd >= 0) close(pf->fd);
    pf->fd = -1;
}

static int ranges_set(const engine *e, const char *file, json_t *entry);

static int finish_file(engine *e, plan_file *pf) {
    char got[2 * EVP_MAX_MD_SIZE + 1] = "";
    char part[2048], fin[2048];
    partial_path(e, pf, part, sizeof part);
    final_path(e, pf, fin, sizeof fin);
    int ok = md_verify(pf, got, sizeof got);
    close_partial(pf);
    if (write_error(e, pf)) return 0; /* hashed, but not all of it written */
    if (!ok) {
        log_warn("download %s: %s failed verification (got %s, want %s); removing it", e->req->model_id,
                 pf->f.path, got, hash_kind(&pf->f) == 256 ? pf->f.sha256 : pf->f.git_sha1);
        unlink(part);
        pf->offset = 0;
        ring_drain(e->ring);
        EVP_MD_CTX_free(pf->md);
        pf->md = NULL;
        return -1;
    }
    if (rename(part, fin) < 0) {
        set_result(e, DOWNLOAD_ERR_IO, "cannot move %s into place: %s", fin, strerror(errno));
        return 0;
    }
    pf->done = 1;
    e->res->files_fetched++;
    if (ranges_set(e, pf->f.path, NULL) < 0) /* it was sparse before: now whole and verified */
        log_warn("download %s: cannot update %s in %s", e->req->model_id, STORE_RANGES, e->dir);
    return 0;
}

static void peer_file_url(const char *base, const char *id, const char *path, char *out, size_t n) {
    snprintf(out, n, "%s/models/%s/files/%s", base, id, path);
}

/* Starts (or resumes) one file. Returns 0 if started or finished without network, -1 if the
 * whole download must stop (error set). */
static int start_file(engine *e, CURLM *multi, plan_file *pf) {
    char part[2048], url[2048];
    partial_path(e, pf, part, sizeof part);
    if (pf->fd < 0) {
        if (mkdir_parent(part) < 0) {
            set_result(e, DOWNLOAD_ERR_IO, "cannot create the directory for %s: %s", part, strerror(errno));
            return -1;
        }
        pf->fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (pf->fd < 0) {
            set_result(e, errno == ENOSPC ? DOWNLOAD_ERR_DISK_FULL : DOWNLOAD_ERR_IO,
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
            if (md_catch_up(pf, have) < 0) {
                if (ftruncate(pf->fd, 0) < 0) { /* unreadable partial: start over */ }
                md_reset(pf);
            }
        }
    }
    if (pf->offset == pf->f.size) { /* everything is here already: just verify */
        if (finish_file(e, pf) < 0) {
            pf->attempts++;
            pf->not_before = now_s() + (double)e->backoff_ms / 1000.0;
        }
        return 0;
    }
    if (pf->use_peer)
        peer_file_url(e->req->peers[pf->use_peer - 1], e->req->model_id, pf->f.path, url, sizeof url);
    else if (hf_file_url(e->hf, e->req->model_id, pf->f.path, url, sizeof url) < 0) {
        set_result(e, DOWNLOAD_ERR_BAD_INPUT, "URL for %s is too long", pf->f.path);
        return -1;
    }
    CURL *c = curl_easy_init();
    if (!c) {
        set_result(e, DOWNLOAD_ERR_IO, "cannot create an HTTP handle");
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
    transfer_setopts(c, pf->errbuf);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    pf->hdrs = NULL;
    if (!pf->use_peer && e->hf->token[0]) {
        char auth[600];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", e->hf->token);
        pf->hdrs = curl_slist_append(pf->hdrs, auth);
    }
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

static void schedule_retry(engine *e, plan_file *pf, double delay_s) {
    pf->attempts++;
    if (delay_s < 0) {
        delay_s = (double)e->backoff_ms / 1000.0;
        for (int i = 1; i < pf->attempts && delay_s < 60; i++) delay_s *= 2;
    }
    pf->not_before = now_s() + delay_s;
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
    if (cancelled(e)) {
        set_result(e, DOWNLOAD_ERR_CANCELLED, "download of %s was cancelled", e->req->model_id);
        return -1;
    }
    ring_drain(e->ring); /* a write that failed is known before deciding what comes next */
    if (write_error(e, pf)) return -1;
    if (from_peer && (rc != CURLE_OK || status < 200 || status >= 300 || pf->oversize)) {
        /* the peer could not serve it: get it from the Hub instead, keeping what arrived */
        log_info("download %s: peer failed for %s (%s), falling back to the Hub", e->req->model_id,
                 pf->f.path, rc != CURLE_OK ? cerr : "bad status");
        pf->use_peer = 0;
        if (pf->oversize) {
            close_partial(pf);
            char part[2048];
            partial_path(e, pf, part, sizeof part);
            unlink(part);
            pf->offset = 0;
        }
        return 0;
    }
    if (pf->oversize) {
        log_warn("download %s: %s is larger than the listed %llu bytes; retrying", e->req->model_id,
                 pf->f.path, (unsigned long long)pf->f.size);
        close_partial(pf);
        char part[2048];
        partial_path(e, pf, part, sizeof part);
        unlink(part);
        ring_drain(e->ring);
        EVP_MD_CTX_free(pf->md);
        pf->md = NULL;
        pf->offset = 0;
        schedule_retry(e, pf, -1);
    } else if (status == 429) {
        double wait = retry_after > 0 ? (double)retry_after : -1;
        if (wait > 300) wait = 300;
        log_info("download %s: rate limited on %s, waiting %.0f s", e->req->model_id, pf->f.path,
                 wait < 0 ? (double)e->backoff_ms / 1000.0 : wait);
        schedule_retry(e, pf, wait);
        if (pf->attempts > e->max_retries) {
            set_result(e, DOWNLOAD_ERR_RATE_LIMIT,
                       "the Hub kept answering 429 (rate limited) for %s after %d attempts; wait "
                       "and retry, or set HF_TOKEN for higher limits", pf->f.path, pf->attempts);
            return -1;
        }
        return 0;
    } else if (status == 416 && pf->offset == pf->f.size) {
        return finish_file(e, pf) < 0 ? (schedule_retry(e, pf, -1), 0) : 0;
    } else if (status == 401 || status == 403) {
        set_result(e, DOWNLOAD_ERR_AUTH,
                   "HTTP %ld for %s: %s is gated or private; set HF_TOKEN to a token with access "
                   "(and accept the model's license on huggingface.co)",
                   status, pf->f.path, e->req->model_id);
        return -1;
    } else if (status == 404) {
        set_result(e, DOWNLOAD_ERR_NOT_FOUND, "HTTP 404 for %s of %s: the file is gone from the repository",
                   pf->f.path, e->req->model_id);
        return -1;
    } else if (rc != CURLE_OK || status >= 500 || status < 200 || status >= 300) {
        log_info("download %s: %s interrupted at %llu/%llu bytes (%s); will resume", e->req->model_id,
                 pf->f.path, (unsigned long long)pf->offset, (unsigned long long)pf->f.size,
                 rc != CURLE_OK ? cerr : "server error");
        if (status == 416) { /* our partial is out of step with the server: restart the file */
            close_partial(pf);
            char part[2048];
            partial_path(e, pf, part, sizeof part);
            unlink(part);
            pf->offset = 0;
        }
        schedule_retry(e, pf, -1);
        if (pf->attempts > e->max_retries) {
            set_result(e, DOWNLOAD_ERR_NETWORK, "giving up on %s after %d attempts: %s%s%ld",
                       pf->f.path, pf->attempts, rc != CURLE_OK ? cerr : "", rc != CURLE_OK ? "" : "HTTP ",
                       rc != CURLE_OK ? 0L : status);
            return -1;
        }
        return 0;
    } else if (pf->offset < pf->f.size) {
        schedule_retry(e, pf, -1); /* short body: resume */
    } else if (finish_file(e, pf) < 0) {
        if (from_peer) { /* a peer sent bad bytes: get this file from the Hub instead */
            pf->use_peer = 0;
            return 0;
        }
        schedule_retry(e, pf, -1);
        if (pf->attempts > e->max_retries) {
            set_result(e, DOWNLOAD_ERR_VERIFY,
                       "%s failed its checksum %d times (corrupt data from the server?); the "
                       "corrupt file was removed — retry later",
                       pf->f.path, pf->attempts);
            return -1;
        }
        return 0;
    }
    if (pf->attempts > e->max_retries && !pf->done) {
        set_result(e, DOWNLOAD_ERR_NETWORK, "giving up on %s after %d attempts", pf->f.path, pf->attempts);
        return -1;
    }
    return e->res->error ? -1 : 0;
}

static int run_engine(engine *e) {
    CURLM *multi = curl_multi_init();
    if (!multi) {
        set_result(e, DOWNLOAD_ERR_IO, "cannot create the transfer engine");
        return -1;
    }
    int rc = 0;
    for (;;) {
        if (cancelled(e)) {
            set_result(e, DOWNLOAD_ERR_CANCELLED, "download of %s was cancelled", e->req->model_id);
            rc = -1;
            break;
        }
        int active = 0, pending = 0;
        double t = now_s(), next_wake = t + 1.0;
        for (size_t i = 0; i < e->n; i++) active += e->files[i].active;
        for (size_t i = 0; i < e->n && rc == 0; i++) {
            plan_file *pf = &e->files[i];
            if (!pf->needed || pf->done || pf->active || pf->ranged) continue;
            pending++;
            if (pf->not_before > t) {
                if (pf->not_before < next_wake) next_wake = pf->not_before;
                continue;
            }
            if (active >= e->parallel) continue;
            if (start_file(e, multi, pf) < 0) rc = -1;
            else if (pf->active) active++;
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
        report(e, DOWNLOAD_ONGOING, 0);
        int still = 0;
        for (size_t i = 0; i < e->n; i++) still += e->files[i].active;
        if (still < active) continue; /* a transfer ended: start the next file, or finish, now
                                       * (polling an engine with nothing left in it would just
                                       * sleep out the timeout: 200 ms at the end of every run) */
        int wait_ms = (int)((next_wake - now_s()) * 1000);
        if (wait_ms > 200) wait_ms = 200;
        if (wait_ms < 1) wait_ms = 1;
        if (active) curl_multi_poll(multi, NULL, 0, wait_ms, NULL);
        else usleep((useconds_t)wait_ms * 1000);
    }
    for (size_t i = 0; i < e->n; i++) {
        end_transfer(multi, &e->files[i]);
        close_partial(&e->files[i]);
    }
    curl_multi_cleanup(multi);
    return rc;
}

/* ---- planning ---- */

static int is_weight_ext(const char *p, int safetensors_only) {
    static const char *exts[] = {".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack",
                                 ".onnx", ".ot", ".gguf", ".ckpt"};
    size_t n = strlen(p);
    for (size_t i = safetensors_only ? 0 : 0; i < sizeof exts / sizeof exts[0]; i++) {
        size_t m = strlen(exts[i]);
        if (n >= m && !strcmp(p + n - m, exts[i])) return safetensors_only ? i == 0 : 1;
    }
    return 0;
}

static int manifest_write(const engine *e) {
    json_t *files = json_array();
    for (size_t i = 0; i < e->n; i++) {
        const hf_file *f = &e->files[i].f;
        json_t *o = json_pack("{s:s, s:I}", "path", f->path, "size", (json_int_t)f->size);
        if (f->sha256[0]) json_object_set_new(o, "sha256", json_string(f->sha256));
        if (f->git_sha1[0]) json_object_set_new(o, "git_sha1", json_string(f->git_sha1));
        json_array_append_new(files, o);
    }
    json_t *m = json_pack("{s:s, s:s, s:o}", "model_id", e->req->model_id, "revision",
                          e->hf->revision, "files", files);
    char path[2048], tmp[2100];
    snprintf(path, sizeof path, "%s/%s", e->dir, STORE_MANIFEST);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(m, tmp, JSON_INDENT(1)) == 0 && rename(tmp, path) == 0 ? 0 : -1;
    json_decref(m);
    return rc;
}

/* Reads a manifest ({files:[{path,size,sha256?,git_sha1?}]}) into a file list. */
static int manifest_parse(const char *text, size_t len, hf_file_list *out) {
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *m = json_loadb(text, len, 0, &je);
    json_t *files = json_object_get(m, "files");
    if (!json_is_array(files) || json_array_size(files) == 0) {
        json_decref(m);
        return -1;
    }
    out->files = calloc(json_array_size(files), sizeof(hf_file));
    if (!out->files) abort();
    size_t i;
    json_t *it;
    json_array_foreach(files, i, it) {
        const char *p = json_string_value(json_object_get(it, "path"));
        json_t *size = json_object_get(it, "size");
        const char *sha = json_string_value(json_object_get(it, "sha256"));
        const char *sha1 = json_string_value(json_object_get(it, "git_sha1"));
        if (!p || store_relpath_valid(p) < 0 || strlen(p) >= sizeof out->files[0].path ||
            !json_is_integer(size) || json_integer_value(size) < 0) {
            hf_file_list_free(out);
            json_decref(m);
            return -1;
        }
        hf_file *f = &out->files[out->n++];
        snprintf(f->path, sizeof f->path, "%s", p);
        f->size = (uint64_t)json_integer_value(size);
        if (sha && strlen(sha) == 64) memcpy(f->sha256, sha, 65);
        if (sha1 && strlen(sha1) == 40) memcpy(f->git_sha1, sha1, 41);
        f->is_lfs = f->sha256[0] != 0;
    }
    json_decref(m);
    return 0;
}

static int read_local_manifest(const char *dir, hf_file_list *out) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, STORE_MANIFEST);
    size_t len;
    char *text = paths_read_file(path, 64 << 20, &len);
    if (!text) return -1;
    int rc = manifest_parse(text, len, out);
    free(text);
    return rc;
}

/* The layer number follows "layers." / ".h." / "blocks." in a tensor name; -1 for none. */
static long tensor_layer(const char *name) {
    const char *keys[] = {"layers.", ".h.", "blocks."};
    for (size_t k = 0; k < 3; k++) {
        const char *p = strstr(name, keys[k]);
        if (p && (p == name || p[-1] == '.' || keys[k][0] == '.')) {
            p += strlen(keys[k]);
            char *endp;
            long l = strtol(p, &endp, 10);
            if (endp != p && *endp == '.') return l;
        }
    }
    return -1;
}

/* Does the stage holding layers [start, end) of n_layers need this tensor? */
static int tensor_needed(const char *name, int n_layers, int tie, int start, int end) {
    int first = start == 0, last = end >= n_layers;
    long layer = tensor_layer(name);
    if (layer >= 0) return layer >= start && layer < end;
    if (strstr(name, "embed")) return first || (last && tie);
    if (strstr(name, "lm_head") || strstr(name, "norm")) return last;
    return first || last; /* unknown extras: keep them with the ends */
}

static int range_cmp(const void *a, const void *b) {
    const download_range *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

#define RANGE_MERGE_GAP (64u << 10) /* one request for ranges closer than this */

int download_shard_ranges(const void *head, size_t head_len, uint64_t file_size, int n_layers,
                          int tie, int start, int end, download_range *out, int max,
                          uint64_t *need, char *err, size_t errlen) {
    const unsigned char *h = head;
    if (max < 1) {
        snprintf(err, errlen, "no room for ranges");
        return -1;
    }
    if (head_len < 8) {
        if (file_size < 8) {
            snprintf(err, errlen, "a safetensors file of %llu bytes is too short", (unsigned long long)file_size);
            return -1;
        }
        *need = 8;
        return -2;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | h[i];
    if (n < 2 || n > SAFETENSORS_MAX_HEADER || n > file_size - 8) {
        snprintf(err, errlen, "safetensors header length %llu does not fit the %llu-byte file",
                 (unsigned long long)n, (unsigned long long)file_size);
        return -1;
    }
    uint64_t data0 = 8 + n;
    if (head_len < data0) {
        *need = data0;
        return -2;
    }
    json_error_t je;
    json_t *hdr = json_loadb((const char *)h + 8, (size_t)n, 0, &je);
    if (!json_is_object(hdr)) {
        snprintf(err, errlen, "safetensors header is not a JSON object (%s)", je.text);
        json_decref(hdr);
        return -1;
    }
    int count = 0;
    out[count++] = (download_range){0, data0};
    const char *name;
    json_t *t;
    json_object_foreach(hdr, name, t) {
        if (!strcmp(name, "__metadata__")) continue;
        json_t *offs = json_object_get(t, "data_offsets");
        json_t *a = json_array_get(offs, 0), *b = json_array_get(offs, 1);
        if (json_array_size(offs) != 2 || !json_is_integer(a) || !json_is_integer(b) ||
            json_integer_value(a) < 0 || json_integer_value(b) < json_integer_value(a) ||
            (uint64_t)json_integer_value(b) > file_size - data0) {
            snprintf(err, errlen, "tensor %.200s has data_offsets outside the file", name);
            json_decref(hdr);
            return -1;
        }
        if (!tensor_needed(name, n_layers, tie, start, end)) continue;
        download_range r = {data0 + (uint64_t)json_integer_value(a), data0 + (uint64_t)json_integer_value(b)};
        if (r.start == r.end) continue;
        if (count < max) out[count++] = r;
        else { /* out of slots: widen the last one (fetches more, never less) */
            if (r.start < out[count - 1].start) out[count - 1].start = r.start;
            if (r.end > out[count - 1].end) out[count - 1].end = r.end;
        }
    }
    json_decref(hdr);
    qsort(out, (size_t)count, sizeof *out, range_cmp);
    int m = 0;
    for (int i = 0; i < count; i++) {
        if (m && out[i].start <= out[m - 1].end + RANGE_MERGE_GAP) {
            if (out[i].end > out[m - 1].end) out[m - 1].end = out[i].end;
        } else out[m++] = out[i];
    }
    return m;
}

int download_shard_files(const char *index_json, int n_layers, int tie_embeddings, int start,
                         int end, json_t *out, char *err, size_t errlen) {
    json_error_t je;
    json_t *idx = json_loads(index_json, 0, &je);
    json_t *map = json_object_get(idx, "weight_map");
    if (!json_is_object(map)) {
        snprintf(err, errlen, "model.safetensors.index.json has no weight_map object");
        json_decref(idx);
        return -1;
    }
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        const char *file = json_string_value(v);
        if (!file || store_relpath_valid(file) < 0) {
            snprintf(err, errlen, "weight_map names an unsafe file for %s", name);
            json_decref(idx);
            return -1;
        }
        int need = tensor_needed(name, n_layers, tie_embeddings, start, end);
        if (!need) continue;
        int dup = 0;
        size_t i;
        json_t *x;
        json_array_foreach(out, i, x) if (!strcmp(json_string_value(x), file)) dup = 1;
        if (!dup) json_array_append_new(out, json_string(file));
    }
    json_decref(idx);
    return 0;
}

static int file_in(json_t *arr, const char *path) {
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) if (!strcmp(json_string_value(x), path)) return 1;
    return 0;
}

/* For a shard: after the non-weight files are in place, mark the weight files it needs. */
static int select_shard(engine *e) {
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", e->dir);
    size_t len;
    char *cfg_text = paths_read_file(path, 16 << 20, &len);
    json_error_t je;
    json_t *cfg = cfg_text ? json_loads(cfg_text, 0, &je) : NULL;
    free(cfg_text);
    json_t *nl = json_object_get(cfg, "num_hidden_layers");
    if (!nl) nl = json_object_get(json_object_get(cfg, "text_config"), "num_hidden_layers");
    int n_layers = json_is_integer(nl) ? (int)json_integer_value(nl) : 0;
    int tie = json_is_true(json_object_get(cfg, "tie_word_embeddings"));
    json_decref(cfg);
    if (n_layers <= 0) {
        set_result(e, DOWNLOAD_ERR_BAD_INPUT, "config.json of %s has no num_hidden_layers; cannot pick a shard",
                   e->req->model_id);
        return -1;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", e->dir);
    char *index = paths_read_file(path, 64 << 20, &len);
    int has_index = index != NULL;
    json_t *want = json_array();
    char err[256];
    if (index) {
        if (download_shard_files(index, n_layers, tie, e->req->layer_start, e->req->layer_end, want,
                                 err, sizeof err) < 0) {
            free(index);
            json_decref(want);
            set_result(e, DOWNLOAD_ERR_BAD_INPUT, "%s", err);
            return -1;
        }
    }
    /* files that also hold tensors this stage does not need: only their ranges are fetched */
    json_t *mixed = json_array();
    const char *ranges_env = getenv("EXO_SHARD_RANGES");
    int use_ranges = !(ranges_env && !strcmp(ranges_env, "0"));
    json_t *idx = index ? json_loads(index, 0, &je) : NULL;
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(idx, "weight_map"), name, v) {
        const char *file = json_string_value(v);
        if (file && file_in(want, file) && !file_in(mixed, file) &&
            !tensor_needed(name, n_layers, tie, e->req->layer_start, e->req->layer_end))
            json_array_append_new(mixed, json_string(file));
    }
    json_decref(idx);
    free(index);
    int whole_model = e->req->layer_start == 0 && e->req->layer_end >= n_layers;
    for (size_t i = 0; i < e->n; i++) {
        plan_file *pf = &e->files[i];
        if (!is_weight_ext(pf->f.path, 1)) continue;
        pf->needed = has_index ? file_in(want, pf->f.path) : 1; /* no index: one file holds all */
        pf->ranged = use_ranges && pf->needed && (has_index ? file_in(mixed, pf->f.path) : !whole_model);
        pf->range_total = pf->f.size; /* until its header says how much */
        pf->range_done = 0;
    }
    e->n_layers = n_layers;
    e->tie = tie;
    json_decref(mixed);
    json_decref(want);
    return 0;
}

static int check_space(engine *e) {
    uint64_t need = 0;
    char path[2048];
    for (size_t i = 0; i < e->n; i++) {
        plan_file *pf = &e->files[i];
        if (!pf->needed || pf->done || pf->ranged) continue; /* ranged files check their own */
        struct stat st;
        partial_path(e, pf, path, sizeof path);
        uint64_t have = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
        need += pf->f.size > have ? pf->f.size - have : 0;
    }
    struct statvfs vfs;
    if (statvfs(e->dir, &vfs) < 0) return 0; /* cannot tell: let ENOSPC catch it */
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    if (avail < need + e->req->min_free_bytes) {
        set_result(e, DOWNLOAD_ERR_DISK_FULL,
                   "not enough disk space for %s: need %llu bytes, %llu free in %s; free space or "
                   "use --models-dir on a larger disk",
                   e->req->model_id, (unsigned long long)(need + e->req->min_free_bytes),
                   (unsigned long long)avail, e->dir);
        return -1;
    }
    return 0;
}

/* ---- files holding only some byte ranges (shards) ----
 * STORE_RANGES in the model dir lists every file that is present at full size but sparse:
 * {"files": {path: {"layers": [start, end], "ranges": [[a, b], ...], "bytes": n}}}. Such a file
 * is in place for the stage that fetched it, never for a whole-model download (which fetches and
 * hash-verifies it whole, then drops the entry), and it keeps the model incomplete for the
 * store (so it is never served to peers or listed as downloaded). */
static json_t *ranges_load(const engine *e) {
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
static int ranges_set(const engine *e, const char *file, json_t *entry) {
    json_t *files = ranges_load(e);
    if (entry) json_object_set_new(files, file, entry);
    else if (json_object_del(files, file) < 0) {
        json_decref(files);
        return 0; /* not listed: nothing to write */
    }
    char path[2048], tmp[2100];
    snprintf(path, sizeof path, "%s/%s", e->dir, STORE_RANGES);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc;
    if (json_object_size(files) == 0) rc = unlink(path) == 0 || errno == ENOENT ? 0 : -1;
    else {
        json_t *m = json_pack("{s:O}", "files", files);
        rc = json_dump_file(m, tmp, JSON_INDENT(1)) == 0 && rename(tmp, path) == 0 ? 0 : -1;
        json_decref(m);
    }
    json_decref(files);
    return rc;
}

/* Marks files already in place. With a trusted local manifest a matching size is enough; a
 * sparse file (STORE_RANGES) counts only for a ranged fetch of the same layers. */
static void mark_present(engine *e) {
    char path[2048];
    json_t *sparse = ranges_load(e);
    for (size_t i = 0; i < e->n; i++) {
        plan_file *pf = &e->files[i];
        final_path(e, pf, path, sizeof path);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != pf->f.size) continue;
        json_t *r = json_object_get(sparse, pf->f.path);
        if (!r) {
            pf->done = 1;
            continue;
        }
        json_t *layers = json_object_get(r, "layers");
        pf->done = pf->ranged &&
                   json_integer_value(json_array_get(layers, 0)) == e->req->layer_start &&
                   json_integer_value(json_array_get(layers, 1)) == e->req->layer_end;
        if (pf->done) pf->range_total = pf->range_done = (uint64_t)json_integer_value(json_object_get(r, "bytes"));
    }
    json_decref(sparse);
}

/* ---- ranged fetch of one file (pipeline shards) ----
 * Blocking, one range at a time: a stage's tensors are contiguous runs, so a file needs a
 * handful of requests. Integrity: each response must be a 206 whose Content-Range starts where
 * asked, for a file of the listed size, and bring exactly the asked bytes; the header's offsets
 * must lie inside the file. A whole-file SHA-256 cannot check part of a file, so these bytes are
 * not hash-verified until a whole-model download fetches the file whole (and verifies it). */
typedef struct range_xfer {
    engine *e;
    plan_file *pf;
    int fd, from_peer;
    uint64_t pos, end; /* next byte to write; end exclusive */
    long status;
    int cr_checked, cr_bad, io_error, disk_full, oversize;
    CURL *easy;
} range_xfer;

static size_t range_header(char *buf, size_t size, size_t nitems, void *ud) {
    range_xfer *x = ud;
    size_t n = size * nitems;
    if (n > 14 && !strncasecmp(buf, "content-range:", 14)) {
        char line[256];
        snprintf(line, sizeof line, "%.*s", (int)(n < 255 ? n : 255), buf);
        unsigned long long a = 0, b = 0, total = 0;
        const char *p = line + 14;
        while (*p == ' ') p++;
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
    if (cancelled(e)) return 0;
    if (!x->status) curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->status == 200) return 0;  /* the whole file: stop, fetch it whole instead */
    if (x->status != 206) return n; /* an error page: judged after */
    if (!x->cr_checked || x->cr_bad) return 0;
    if (x->pos + n > x->end) {
        x->oversize = 1;
        return 0;
    }
    int err = pwrite_all(x->fd, ptr, n, x->pos);
    if (err) {
        if (err == ENOSPC || err == EDQUOT) x->disk_full = 1;
        else x->io_error = err;
        return 0;
    }
    x->pos += n;
    x->pf->range_done += n;
    e->fetched += n;
    e->res->bytes_fetched += n;
    if (x->from_peer) e->res->bytes_from_peers += n;
    report(e, DOWNLOAD_ONGOING, 0);
    return n;
}

static int range_xferinfo(void *ud, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
    (void)a, (void)b, (void)c, (void)d;
    return cancelled(((range_xfer *)ud)->e);
}

enum { RANGE_OK = 0, RANGE_FATAL = -1, RANGE_FAILED = -2, RANGE_UNSUPPORTED = -3 };

/* Fetches bytes [a, b) of pf from url into fd at the same offsets, with retries. FATAL sets the
 * result (cancel, disk, local I/O, auth); FAILED leaves the message in msg. */
static int fetch_range(engine *e, plan_file *pf, int fd, const char *url, int from_peer,
                       uint64_t a, uint64_t b, enum download_error *code, char *msg, size_t msglen) {
    uint64_t pos = a;
    int attempts = 0;
    while (pos < b) {
        if (cancelled(e)) {
            set_result(e, DOWNLOAD_ERR_CANCELLED, "download of %s was cancelled", e->req->model_id);
            return RANGE_FATAL;
        }
        CURL *c = curl_easy_init();
        if (!c) {
            set_result(e, DOWNLOAD_ERR_IO, "cannot create an HTTP handle");
            return RANGE_FATAL;
        }
        range_xfer x = {.e = e, .pf = pf, .fd = fd, .from_peer = from_peer, .pos = pos, .end = b, .easy = c};
        char range[64], errbuf[CURL_ERROR_SIZE] = "";
        snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)pos, (unsigned long long)(b - 1));
        struct curl_slist *hdrs = NULL;
        if (!from_peer && e->hf->token[0]) {
            char auth[600];
            snprintf(auth, sizeof auth, "Authorization: Bearer %s", e->hf->token);
            hdrs = curl_slist_append(hdrs, auth);
        }
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_RANGE, range);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, range_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, range_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, range_xferinfo);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, &x);
        transfer_setopts(c, errbuf);
        if (hdrs) curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
        CURLcode rc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_off_t retry_after = 0;
        curl_easy_getinfo(c, CURLINFO_RETRY_AFTER, &retry_after);
        curl_easy_cleanup(c);
        curl_slist_free_all(hdrs);
        pos = x.pos;
        if (cancelled(e)) continue;
        if (x.disk_full) {
            set_result(e, DOWNLOAD_ERR_DISK_FULL,
                       "disk full while writing %s; free space or use --models-dir on a larger disk",
                       pf->f.path);
            return RANGE_FATAL;
        }
        if (x.io_error) {
            set_result(e, DOWNLOAD_ERR_IO, "cannot write %s: %s", pf->f.path, strerror(x.io_error));
            return RANGE_FATAL;
        }
        if (pos >= b) break;
        if (status == 200) return RANGE_UNSUPPORTED; /* the server ignores Range */
        if (status == 401 || status == 403 || status == 404) {
            *code = status == 404 ? DOWNLOAD_ERR_NOT_FOUND : DOWNLOAD_ERR_AUTH;
            snprintf(msg, msglen, "HTTP %ld for %.200s of %.200s%s", status, pf->f.path, e->req->model_id,
                     status == 404 ? "" : ": set HF_TOKEN to a token with access");
            return RANGE_FAILED;
        }
        if (x.cr_bad || x.oversize || (status == 206 && !x.cr_checked)) {
            *code = DOWNLOAD_ERR_VERIFY;
            snprintf(msg, msglen, "%.200s: the server answered a range request for bytes %s with other bytes",
                     pf->f.path, range);
            return RANGE_FAILED;
        }
        if (++attempts > e->max_retries) {
            *code = status == 429 ? DOWNLOAD_ERR_RATE_LIMIT : DOWNLOAD_ERR_NETWORK;
            snprintf(msg, msglen, "giving up on bytes %s of %.200s after %d attempts: %.200s%s%ld", range,
                     pf->f.path, attempts, rc != CURLE_OK ? (errbuf[0] ? errbuf : curl_easy_strerror(rc)) : "",
                     rc != CURLE_OK ? "" : "HTTP ", rc != CURLE_OK ? 0L : status);
            return RANGE_FAILED;
        }
        double wait = status == 429 && retry_after > 0 ? (double)retry_after : (double)e->backoff_ms / 1000.0;
        for (int i = 1; i < attempts && status != 429 && wait < 60; i++) wait *= 2;
        if (wait > 300) wait = 300;
        log_info("download %s: bytes %s of %s interrupted at %llu (%s); retrying in %.1f s",
                 e->req->model_id, range, pf->f.path, (unsigned long long)pos,
                 rc != CURLE_OK ? (errbuf[0] ? errbuf : curl_easy_strerror(rc)) : "server error", wait);
        for (double t = 0; t < wait && !cancelled(e); t += 0.05) usleep(50000);
    }
    return RANGE_OK;
}

#define MAX_RANGES 4096

/* One ranged file from one source. */
static int ranged_file_from(engine *e, plan_file *pf, const char *url, int from_peer,
                            enum download_error *code, char *msg, size_t msglen) {
    char part[2048], fin[2048];
    partial_path(e, pf, part, sizeof part);
    final_path(e, pf, fin, sizeof fin);
    if (mkdir_parent(part) < 0) {
        set_result(e, DOWNLOAD_ERR_IO, "cannot create the directory for %s: %s", part, strerror(errno));
        return RANGE_FATAL;
    }
    int fd = open(part, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)pf->f.size) < 0) { /* sparse: holes cost no disk */
        set_result(e, errno == ENOSPC ? DOWNLOAD_ERR_DISK_FULL : DOWNLOAD_ERR_IO, "cannot create %s: %s",
                   part, strerror(errno));
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
            set_result(e, DOWNLOAD_ERR_IO, "out of memory reading the header of %s", pf->f.path);
            rc = RANGE_FATAL;
            break;
        }
        head = nh;
        if (pread(fd, head, (size_t)need, 0) != (ssize_t)need) {
            set_result(e, DOWNLOAD_ERR_IO, "cannot read back %s: %s", part, strerror(errno));
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
        for (int i = 0; i < n; i++) pf->range_total += ranges[i].end - ranges[i].start;
        struct statvfs vfs;
        uint64_t left = pf->range_total - pf->range_done;
        if (statvfs(e->dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < left + e->req->min_free_bytes) {
            set_result(e, DOWNLOAD_ERR_DISK_FULL,
                       "not enough disk space for the layers of %s in %s: need %llu bytes; free "
                       "space or use --models-dir on a larger disk",
                       e->req->model_id, pf->f.path, (unsigned long long)(left + e->req->min_free_bytes));
            rc = RANGE_FATAL;
        }
        for (int i = 0; i < n && rc == RANGE_OK; i++) {
            uint64_t a = ranges[i].start < have ? have : ranges[i].start; /* the header is here */
            if (a < ranges[i].end)
                rc = fetch_range(e, pf, fd, url, from_peer, a, ranges[i].end, code, msg, msglen);
            json_array_append_new(list, json_pack("[I,I]", (json_int_t)ranges[i].start, (json_int_t)ranges[i].end));
        }
    }
    free(ranges);
    close(fd);
    if (rc == RANGE_OK) {
        json_t *entry = json_pack("{s:[i,i], s:o, s:I}", "layers", e->req->layer_start,
                                  e->req->layer_end, "ranges", list, "bytes", (json_int_t)pf->range_total);
        if (ranges_set(e, pf->f.path, entry) < 0 || rename(part, fin) < 0) {
            set_result(e, DOWNLOAD_ERR_IO, "cannot move %s into place: %s", fin, strerror(errno));
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
static int fetch_ranged_files(engine *e) {
    for (size_t i = 0; i < e->n; i++) {
        plan_file *pf = &e->files[i];
        if (!pf->needed || pf->done || !pf->ranged) continue;
        for (int src = pf->use_peer ? 0 : 1; src < 2; src++) {
            char url[2048], msg[512] = "";
            enum download_error code = DOWNLOAD_ERR_NETWORK;
            if (src == 0)
                peer_file_url(e->req->peers[pf->use_peer - 1], e->req->model_id, pf->f.path, url, sizeof url);
            else if (hf_file_url(e->hf, e->req->model_id, pf->f.path, url, sizeof url) < 0) {
                set_result(e, DOWNLOAD_ERR_BAD_INPUT, "URL for %s is too long", pf->f.path);
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
            set_result(e, code, "%s", msg);
            return -1;
        }
    }
    return 0;
}

static enum download_error list_files(engine *e, hf_file_list *list) {
    char err[512] = "";
    for (int i = 0; i < e->req->n_peers; i++) {
        char url[2048];
        snprintf(url, sizeof url, "%s/models/%s/manifest", e->req->peers[i], e->req->model_id);
        char *body;
        size_t len;
        if (http_get_small(url, NULL, 64 << 20, &body, &len, err, sizeof err) == DOWNLOAD_OK) {
            int ok = manifest_parse(body, len, list) == 0;
            free(body);
            if (ok) {
                e->peer_base = e->req->peers[i];
                log_info("download %s: using peer %s", e->req->model_id, e->peer_base);
                return DOWNLOAD_OK;
            }
        }
        log_info("download %s: peer %s cannot serve it (%s)", e->req->model_id, e->req->peers[i], err);
    }
    enum download_error de = hf_list_files(e->hf, e->req->model_id, list, err, sizeof err);
    if (de != DOWNLOAD_OK) {
        set_result(e, de, "cannot list the files of %s: %s", e->req->model_id, err);
        return de;
    }
    /* A listing without hashes (some mirrors): ask each file's HEAD for x-linked-etag / etag
     * (and x-linked-size), so every file can still be verified. */
    for (size_t i = 0; i < list->n; i++) {
        hf_file *f = &list->files[i];
        if (f->sha256[0] || f->git_sha1[0] || !strcmp(f->path, ".gitattributes")) continue;
        hf_file_meta meta;
        de = hf_head(e->hf, e->req->model_id, f->path, &meta, err, sizeof err);
        if (de != DOWNLOAD_OK) {
            set_result(e, de, "cannot read the metadata of %s: %s", f->path, err);
            return de;
        }
        size_t n = strlen(meta.etag);
        int hex = n == 64 || n == 40;
        for (size_t k = 0; k < n && hex; k++)
            hex = (meta.etag[k] >= '0' && meta.etag[k] <= '9') || (meta.etag[k] >= 'a' && meta.etag[k] <= 'f');
        if (hex && n == 64) memcpy(f->sha256, meta.etag, 65);
        else if (hex && n == 40) memcpy(f->git_sha1, meta.etag, 41);
        if (meta.size) f->size = meta.size;
    }
    return DOWNLOAD_OK;
}

enum download_error download_model(const download_request *req, download_result *res) {
    memset(res, 0, sizeof *res);
    engine e = {.req = req, .res = res};
    hf_config env_hf;
    if (!req->hf) hf_config_from_env(&env_hf);
    e.hf = req->hf ? req->hf : &env_hf;
    e.parallel = req->parallel > 0 ? req->parallel : 8;
    e.max_retries = req->max_retries > 0 ? req->max_retries : 5;
    e.backoff_ms = req->backoff_ms > 0 ? req->backoff_ms : 1000;
    e.interval_ms = req->progress_interval_ms > 0 ? req->progress_interval_ms : 1000;
    char why[256];
    if (store_id_valid(req->model_id, why, sizeof why) < 0) {
        set_result(&e, DOWNLOAD_ERR_BAD_INPUT, "invalid model id '%s': %s", req->model_id, why);
        return res->error;
    }
    model_store st;
    if (store_init(&st, req->models_dir, NULL, why, sizeof why) < 0 ||
        store_write_dir(&st, req->model_id, e.dir, sizeof e.dir) < 0) {
        set_result(&e, DOWNLOAD_ERR_BAD_INPUT, "bad models dir: %s", why);
        return res->error;
    }
    snprintf(res->model_dir, sizeof res->model_dir, "%s", e.dir);
    download_curl_init();

    hf_file_list list = {0};
    int have_local = read_local_manifest(e.dir, &list) == 0;
    int whole = req->layer_end <= 0;
    if (have_local && whole && store_dir_state(e.dir) == STORE_COMPLETE) goto done_ok;
    if (req->offline) {
        if (!have_local) {
            set_result(&e, DOWNLOAD_ERR_OFFLINE,
                       "offline mode: %s is not in %s and cannot be downloaded; run once online or "
                       "copy it there", req->model_id, e.dir);
            return res->error;
        }
    } else {
        if (have_local) hf_file_list_free(&list);
        if (list_files(&e, &list) != DOWNLOAD_OK) return res->error;
    }
    e.n = 0;
    e.files = calloc(list.n ? list.n : 1, sizeof *e.files);
    if (!e.files) abort();
    int has_safetensors = 0;
    for (size_t i = 0; i < list.n; i++) has_safetensors |= is_weight_ext(list.files[i].path, 1);
    for (size_t i = 0; i < list.n; i++) {
        /* never wanted: git metadata, and other weight formats when safetensors exist */
        if (!strcmp(list.files[i].path, ".gitattributes") ||
            (has_safetensors && is_weight_ext(list.files[i].path, 0) &&
             !is_weight_ext(list.files[i].path, 1)))
            continue;
        plan_file *pf = &e.files[e.n++];
        pf->f = list.files[i];
        pf->fd = -1;
        pf->eng = &e;
        pf->use_peer = 0;
        if (e.peer_base)
            for (int k = 0; k < req->n_peers; k++)
                if (req->peers[k] == e.peer_base) pf->use_peer = k + 1;
        /* phase 1 of a shard: everything but the weights */
        pf->needed = whole || !is_weight_ext(pf->f.path, 0);
    }
    hf_file_list_free(&list);
    if (paths_mkdir_p(e.dir) < 0) {
        set_result(&e, errno == ENOSPC ? DOWNLOAD_ERR_DISK_FULL : DOWNLOAD_ERR_IO,
                   "cannot create %s: %s", e.dir, strerror(errno));
        goto out;
    }
    if (!req->offline && manifest_write(&e) < 0) {
        set_result(&e, DOWNLOAD_ERR_IO, "cannot write the manifest in %s: %s", e.dir, strerror(errno));
        goto out;
    }
    mark_present(&e);
    e.started = now_s();
    for (int phase = whole ? 1 : 0; phase < 2; phase++) {
        if (phase == 1 && !whole && select_shard(&e) < 0) goto out;
        if (phase == 1 && !whole) mark_present(&e);
        for (size_t i = 0; i < e.n; i++) res->files_planned += phase == 1 && e.files[i].needed;
        if (req->offline) {
            for (size_t i = 0; i < e.n; i++)
                if (e.files[i].needed && !e.files[i].done) {
                    set_result(&e, DOWNLOAD_ERR_OFFLINE,
                               "offline mode: %s of %s is missing and cannot be downloaded",
                               e.files[i].f.path, req->model_id);
                    goto out;
                }
            continue;
        }
        if (check_space(&e) < 0) goto out;
        report(&e, DOWNLOAD_ONGOING, 1);
        if (!e.ring) e.ring = ring_start();
        int erc = run_engine(&e);
        ring_drain(e.ring);
        if (write_error(&e, NULL)) goto out; /* a write failed after its transfer ended */
        if (erc < 0) goto out;
        if (phase == 1 && !whole) {
            int any_whole = 0;
            if (fetch_ranged_files(&e) < 0) goto out;
            for (size_t i = 0; i < e.n; i++) any_whole |= e.files[i].needed && !e.files[i].done;
            if (any_whole && (check_space(&e) < 0 || run_engine(&e) < 0)) goto out;
        }
    }
    report(&e, DOWNLOAD_COMPLETED, 1);
out:
    if (res->error) report(&e, DOWNLOAD_FAILED, 1);
    ring_stop(e.ring);
    for (size_t i = 0; i < e.n; i++) EVP_MD_CTX_free(e.files[i].md);
    free(e.files);
    return res->error;
done_ok:
    if (req->progress) {
        download_progress p = {.model_id = req->model_id, .status = DOWNLOAD_COMPLETED, .eta_seconds = 0};
        for (size_t i = 0; i < list.n; i++) p.total_bytes += list.files[i].size;
        p.downloaded_bytes = p.total_bytes;
        p.files_done = p.files_total = (int)list.n;
        req->progress(&p, req->progress_ud);
    }
    res->files_planned = (int)list.n;
    hf_file_list_free(&list);
    return DOWNLOAD_OK;
}

int download_model_blocking(const char *model_id, download_progress_fn progress, void *ud,
                            char *model_dir, size_t model_dir_len, char *err, size_t errlen) {
    char models[1024];
    const char *env = getenv("EXO_MODELS_DIR");
    if (env && *env) snprintf(models, sizeof models, "%s", env);
    else {
        char data[900];
        if (paths_default_data_dir(data, sizeof data) < 0) {
            snprintf(err, errlen, "cannot find a data directory (set EXO_MODELS_DIR)");
            return -1;
        }
        snprintf(models, sizeof models, "%s/models", data);
    }
    const char *off = getenv("EXO_OFFLINE");
    download_request req = {.model_id = model_id, .models_dir = models,
                            .offline = off && *off && strcmp(off, "0"), .progress = progress,
                            .progress_ud = ud};
    download_result res;
    if (download_model(&req, &res) != DOWNLOAD_OK) {
        snprintf(err, errlen, "%s", res.message);
        return -1;
    }
    if (model_dir) snprintf(model_dir, model_dir_len, "%s", res.model_dir);
    return 0;
}

static void human(char *out, size_t n, double bytes) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int i = 0;
    while (bytes >= 1000 && i < 4) bytes /= 1000, i++;
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", bytes, u[i]);
}

void download_progress_bar(const download_progress *p, void *ud) {
    FILE *f = ud ? ud : stderr;
    char done[32], total[32], speed[32];
    human(done, sizeof done, (double)p->downloaded_bytes);
    human(total, sizeof total, (double)p->total_bytes);
    human(speed, sizeof speed, p->speed);
    double frac = p->total_bytes ? (double)p->downloaded_bytes / (double)p->total_bytes : 1;
    char bar[31];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    int tty = isatty(fileno(f));
    if (p->status == DOWNLOAD_FAILED) {
        fprintf(f, "%sdownload failed: %s\n", tty ? "\r\033[K" : "", p->message ? p->message : "");
        return;
    }
    char eta[32] = "--";
    if (p->eta_seconds >= 0) snprintf(eta, sizeof eta, "%dm%02ds", (int)p->eta_seconds / 60, (int)p->eta_seconds % 60);
    fprintf(f, "%s%s [%s] %5.1f%% %s/%s %s/s ETA %s files %d/%d%s", tty ? "\r\033[K" : "",
            p->model_id, bar, frac * 100, done, total, speed, eta, p->files_done, p->files_total,
            tty && p->status == DOWNLOAD_ONGOING ? "" : "\n");
    fflush(f);
}
