/* download hashing — the receive ring and the running hash of each file.
 *
 * The receive path (libcurl's write callback) only copies each chunk libcurl hands over (16 KiB
 * at a time, whatever CURLOPT_BUFFERSIZE is), still hot in the CPU cache, into one
 * preallocated byte ring. Two threads consume the ring: one hashes it, one writes it to the
 * .partial files in blocks of up to RING_STEP bytes (one pwrite per MiB instead of one per
 * 16 KiB chunk). So receiving, hashing and writing overlap on up to three cores and none of
 * them is the long pole that receive + write + hash in one thread would be. A ring byte is
 * reused once it is both hashed and written. No allocation and no page faults per chunk, and
 * no second read of the data from the page cache (which perf showed costing more than the
 * copy). Consecutive chunks of one file coalesce into one job. Anything that reads, truncates,
 * closes or verifies a .partial first drains the ring (ring_drain); a failed write is recorded
 * in werr_pf / werr, and the engine stops the download with it. It knows nothing of HTTP. */
#include "download/download_internal.h"

#include "base/sync.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

struct ring {
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
    plan_file *werr_pf; /* first file whose write failed, and the errno */
    int werr;
    unsigned char *ring;
    pthread_t thread[RING_CONSUMERS];
};

typedef struct ring_arg {
    ring *r;
    int k;
} ring_arg;

static uint64_t ring_min(const uint64_t *v) {
    return v[0] < v[1] ? v[0] : v[1];
}

/* Writes all n bytes at off (retrying short writes and EINTR). Returns 0 or the errno. */
int write_all_at(int fd, const char *p, size_t n, uint64_t off) {
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
        while (!r->stop &&
               (r->pos[k] == r->tail || (r->tail - r->pos[k] < RING_WAKE && !r->draining))) {
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
        if (k == RING_HASH)
            EVP_DigestUpdate(md, r->ring + at, (size_t)n);
        else if (fd != -2)
            err = fd < 0 ? EBADF : write_all_at(fd, (const char *)r->ring + at, (size_t)n, off);
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

void ring_stop(ring *r) {
    if (!r) return;
    sync_set_flag_and_wake(&r->lock, &r->cond, &r->stop);
    for (int k = 0; k < r->nthreads; k++)
        pthread_join(r->thread[k], NULL);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    free(r->ring);
    free(r);
}

/* NULL when threads or memory are short: callers then hash and write inline. */
ring *ring_start(void) {
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
void ring_drain(ring *r) {
    if (!r) return;
    pthread_mutex_lock(&r->lock);
    r->draining++;
    pthread_cond_broadcast(&r->cond);
    while (ring_min(r->pos) != r->tail || r->busy[0] || r->busy[1])
        pthread_cond_wait(&r->cond, &r->lock);
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

int ring_write_error(const ring *r, plan_file **pf) {
    if (!r || !r->werr_pf) return 0;
    *pf = r->werr_pf;
    return r->werr;
}

/* Queues n received bytes of pf (at pf->offset, in order) to be hashed and written. Returns 0,
 * or -1 when a write failed (this one inline, or any earlier one on the threads). */
int ring_push(ring *r, plan_file *pf, const void *data, size_t n) {
    if (!r || n > RING_BYTES / 4) { /* no consumer threads (or a huge chunk): inline */
        ring_drain(r);
        if (ring_failed(r)) return -1;
        int err = write_all_at(pf->fd, data, n, pf->offset);
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
        r->jobs[r->jtail % RING_JOBS] =
            (ring_job){.pf = pf, .md = pf->md, .off = pf->offset, .len = n};
        r->jtail++;
    }
    r->tail += n;
    if ((r->sleeping[0] && r->tail - r->pos[0] >= RING_WAKE) ||
        (r->sleeping[1] && r->tail - r->pos[1] >= RING_WAKE))
        pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    return 0;
}

int hash_kind(const hf_file *f) {
    return f->sha256[0] ? 256 : f->git_sha1[0] ? 1 : 0;
}

void hash_reset(plan_file *pf) {
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
int hash_verify(plan_file *pf, char *got, size_t gotlen) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    ring_drain(pf->eng->ring);
    EVP_DigestFinal_ex(pf->md, digest, &dl);
    for (unsigned i = 0; i < dl && 2 * i + 2 < gotlen; i++)
        sprintf(got + 2 * i, "%02x", digest[i]);
    int k = hash_kind(&pf->f);
    if (k == 0) return 1;
    return !strcmp(got, k == 256 ? pf->f.sha256 : pf->f.git_sha1);
}

/* Re-hashes the bytes already in .partial (after a restart). Returns 0 or -1. */
int hash_catch_up(plan_file *pf, uint64_t upto) {
    hash_reset(pf);
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
