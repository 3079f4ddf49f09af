/* cluster/eventlog — append-only checksummed record file (see eventlog.h). */
#include "cluster/eventlog.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define HEADER_BYTES 24
static const unsigned char record_magic[4] = {'E', 'X', 'L', '1'};

struct eventlog {
    int fd;
    uint64_t count;
    uint64_t *offsets; /* offsets[i] = file offset of record i + 1; offsets[count] = end */
    size_t cap;
};

uint32_t eventlog_crc32(uint32_t crc, const void *bytes, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!ready) { /* benign race: every thread computes the same table */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    const unsigned char *p = bytes;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int push_offset(eventlog *log, uint64_t off) {
    if (log->count + 1 >= log->cap) {
        size_t cap = log->cap ? log->cap * 2 : 1024;
        uint64_t *o = realloc(log->offsets, cap * sizeof *o);
        if (!o) return -1;
        log->offsets = o;
        log->cap = cap;
    }
    log->offsets[log->count + 1] = off;
    return 0;
}

static int read_full(int fd, void *buf, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Reads and checks the record at off; returns its total size, or 0 if it is not a valid
 * record with index expect. */
static uint64_t check_record(int fd, uint64_t off, uint64_t file_size, uint64_t expect,
                             char **payload_out) {
    unsigned char h[HEADER_BYTES];
    if (file_size - off < HEADER_BYTES || read_full(fd, h, sizeof h, off)) return 0;
    uint32_t len = get32(h + 4);
    if (memcmp(h, record_magic, 4) || len > EVENTLOG_MAX_RECORD || get64(h + 8) != expect ||
        get32(h + 20) != 0 || file_size - off - HEADER_BYTES < len)
        return 0;
    char *payload = malloc((size_t)len + 1);
    if (!payload || read_full(fd, payload, len, off + HEADER_BYTES)) {
        free(payload);
        return 0;
    }
    payload[len] = 0;
    uint32_t crc = eventlog_crc32(eventlog_crc32(0, h + 8, 8), payload, len);
    if (crc != get32(h + 16)) {
        free(payload);
        return 0;
    }
    if (payload_out) *payload_out = payload;
    else free(payload);
    return HEADER_BYTES + (uint64_t)len;
}

int eventlog_open(const char *path, eventlog **out, uint64_t *dropped_bytes, char *err,
                  size_t errlen) {
    *out = NULL;
    if (dropped_bytes) *dropped_bytes = 0;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open event log %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st)) {
        snprintf(err, errlen, "cannot stat event log %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    eventlog *log = calloc(1, sizeof *log);
    if (!log) {
        close(fd);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    log->fd = fd;
    uint64_t size = (uint64_t)st.st_size, off = 0;
    if (push_offset(log, 0)) goto oom;
    log->offsets[0] = 0;
    for (;;) {
        uint64_t n = check_record(fd, off, size, log->count + 1, NULL);
        if (!n) break;
        off += n;
        if (push_offset(log, off)) goto oom;
        log->count++;
    }
    if (off < size) {
        if (ftruncate(fd, (off_t)off)) {
            snprintf(err, errlen, "cannot cut the damaged tail of %s: %s", path, strerror(errno));
            eventlog_close(log);
            return -1;
        }
        if (dropped_bytes) *dropped_bytes = size - off;
    }
    *out = log;
    return 0;
oom:
    snprintf(err, errlen, "out of memory reading %s", path);
    eventlog_close(log);
    return -1;
}

void eventlog_close(eventlog *log) {
    if (!log) return;
    close(log->fd);
    free(log->offsets);
    free(log);
}

uint64_t eventlog_count(const eventlog *log) {
    return log->count;
}

int eventlog_append(eventlog *log, uint64_t idx, const char *payload, size_t len, char *err,
                    size_t errlen) {
    if (idx != log->count + 1) {
        snprintf(err, errlen, "append of record %llu to a log of %llu records",
                 (unsigned long long)idx, (unsigned long long)log->count);
        return -1;
    }
    if (len > EVENTLOG_MAX_RECORD) {
        snprintf(err, errlen, "record of %zu bytes exceeds %u", len, EVENTLOG_MAX_RECORD);
        return -1;
    }
    unsigned char h[HEADER_BYTES];
    memcpy(h, record_magic, 4);
    put32(h + 4, (uint32_t)len);
    put64(h + 8, idx);
    put32(h + 16, eventlog_crc32(eventlog_crc32(0, h + 8, 8), payload, len));
    put32(h + 20, 0);
    uint64_t off = log->offsets[log->count];
    struct iovec iov[2] = {{h, sizeof h}, {(void *)payload, len}};
    size_t total = sizeof h + len, done = 0;
    while (done < total) {
        ssize_t w = pwritev(log->fd, iov, 2, (off_t)(off + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            snprintf(err, errlen, "cannot write the event log: %s", strerror(errno));
            if (ftruncate(log->fd, (off_t)off)) { /* leave no partial record behind */
            }
            return -1;
        }
        done += (size_t)w;
        /* Advance the iovecs past what was written (rare: short writes). */
        size_t skip = (size_t)w;
        for (int i = 0; i < 2 && skip; i++) {
            size_t s = skip < iov[i].iov_len ? skip : iov[i].iov_len;
            iov[i].iov_base = (char *)iov[i].iov_base + s;
            iov[i].iov_len -= s;
            skip -= s;
        }
    }
    if (push_offset(log, off + total)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    log->count++;
    return 0;
}

int eventlog_sync(eventlog *log) {
    return fdatasync(log->fd);
}

char *eventlog_read(eventlog *log, uint64_t idx, size_t *len_out) {
    if (idx < 1 || idx > log->count) return NULL;
    uint64_t off = log->offsets[idx - 1];
    char *payload = NULL;
    uint64_t n = check_record(log->fd, off, log->offsets[log->count], idx, &payload);
    if (!n) return NULL;
    if (len_out) *len_out = (size_t)(n - HEADER_BYTES);
    return payload;
}

int eventlog_truncate(eventlog *log, uint64_t keep) {
    if (keep > log->count) return -1;
    if (ftruncate(log->fd, (off_t)log->offsets[keep])) return -1;
    log->count = keep;
    return fdatasync(log->fd);
}
