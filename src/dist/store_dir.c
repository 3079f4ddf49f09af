/* store_dir — the dist_store over files in one directory: every rank on one host (tests,
 * `exo bench`) sees the same keys. A key is one file; set writes a temporary file and renames
 * it into place, so a reader sees either nothing or the whole value; get polls until timeout.
 * Refuses: keys it cannot map to a file name of bounded length (they fail with -1). */
#include "dist/dist.h"

#include "base/clock.h"
#include "base/fdio.h"
#include "base/paths.h"

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

static int store_dir_set(void *ctx, const char *key, const void *value, size_t len) {
    store_dir *s = ctx;
    char path[4096], tmp[4200];
    if (store_dir_path(s, key, path, sizeof path) < 0) return -1;
    static unsigned counter; /* distinguishes two sets of one process; getpid() two processes */
    snprintf(tmp, sizeof tmp, "%s/.tmp.%ld.%u", s->dir, (long)getpid(),
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    int rc = fdio_write_all(fd, value, len);
    if (close(fd) < 0) rc = -1;
    if (rc == 0 && rename(tmp, path) < 0) rc = -1;
    if (rc < 0) unlink(tmp);
    return rc;
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
        /* -1 while the key's file does not exist (yet) */
        char *data = paths_read_file(path, SIZE_MAX, len);
        if (data) {
            *value = data;
            return 0;
        }
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
