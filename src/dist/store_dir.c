/* store_dir — the dist_store over files in one directory: every rank on one host (tests,
 * `exo bench`) sees the same keys. A key is one file; set writes a temporary file and renames
 * it into place, so a reader sees either nothing or the whole value; get polls until timeout.
 * Refuses: keys it cannot map to a file name of bounded length (they fail with -1). */
#include "dist/dist.h"

#include "base/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct store_dir {
    char *dir;
} store_dir;

/* Keys may hold '/' and other bytes file names cannot: everything outside [A-Za-z0-9._-] is
 * written as %XX, so two different keys never share a file. A leading '.' is escaped too, so
 * no key collides with the temporary files (which start with '.'). */
static int store_dir_path(const store_dir *s, const char *key, char *out, size_t outlen) {
    size_t n = (size_t)snprintf(out, outlen, "%s/", s->dir);
    if (n >= outlen || !*key) return -1;
    for (const unsigned char *k = (const unsigned char *)key; *k; k++) {
        int plain = (*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') ||
                    (*k >= '0' && *k <= '9') || *k == '_' || *k == '-' ||
                    (*k == '.' && k != (const unsigned char *)key);
        if (n + 4 >= outlen) return -1;
        if (plain)
            out[n++] = (char)*k;
        else
            n += (size_t)snprintf(out + n, outlen - n, "%%%02X", *k);
    }
    out[n] = 0;
    return 0;
}

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static int store_dir_set(void *ctx, const char *key, const void *value, size_t len) {
    store_dir *s = ctx;
    char path[4096], tmp[4200];
    if (store_dir_path(s, key, path, sizeof path) < 0) return -1;
    static unsigned counter; /* distinguishes two sets of one process; getpid() two processes */
    snprintf(tmp, sizeof tmp, "%s/.tmp.%ld.%u", s->dir, (long)getpid(),
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    int rc = write_all(fd, value, len);
    if (close(fd) < 0) rc = -1;
    if (rc == 0 && rename(tmp, path) < 0) rc = -1;
    if (rc < 0) unlink(tmp);
    return rc;
}

/* Reads the whole file; -1 when it does not exist (yet) or cannot be read. */
static int read_file(const char *path, void **value, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size ? size : 1);
    size_t got = 0;
    while (buf && got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!buf || got != size) {
        free(buf);
        return -1;
    }
    *value = buf;
    *len = size;
    return 0;
}

static int store_dir_get(void *ctx, const char *key, void **value, size_t *len, int timeout_ms) {
    store_dir *s = ctx;
    char path[4096];
    if (store_dir_path(s, key, path, sizeof path) < 0) return -1;
    uint64_t deadline = clock_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    /* Poll fast first (ranks usually publish within milliseconds of each other), then back off
     * so a long wait does not spin on a 2-core machine. */
    unsigned sleep_us = 200;
    for (;;) {
        if (read_file(path, value, len) == 0) return 0;
        uint64_t now = clock_now_ns();
        if (now >= deadline) return -1;
        uint64_t left_us = (deadline - now) / 1000;
        usleep((useconds_t)(sleep_us < left_us ? sleep_us : left_us));
        if (sleep_us < 20000) sleep_us *= 2;
    }
}

int dist_store_dir(dist_store *out, const char *dir) {
    memset(out, 0, sizeof *out);
    struct stat st;
    if (!dir || stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) return -1;
    store_dir *s = calloc(1, sizeof *s);
    if (!s || !(s->dir = strdup(dir))) {
        free(s);
        return -1;
    }
    out->ctx = s;
    out->set = store_dir_set;
    out->get = store_dir_get;
    return 0;
}

void dist_store_dir_free(dist_store *s) {
    if (!s || !s->ctx) return;
    store_dir *d = s->ctx;
    free(d->dir);
    free(d);
    memset(s, 0, sizeof *s);
}
