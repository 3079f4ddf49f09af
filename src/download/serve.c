/* serve — peer transfer routes (see serve.h). */
#include "download/serve.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int serve_is_peer_route(const char *p) {
    if (strncmp(p, "/models/", 8)) return 0;
    return strstr(p, "/manifest") || strstr(p, "/files/");
}

static void fail(serve_target *t, int status, const char *msg) {
    t->status = status;
    snprintf(t->message, sizeof t->message, "%s", msg);
}

void serve_resolve(const model_store *store, const char *p, serve_target *t) {

    memset(t, 0, sizeof *t);
    if (strncmp(p, "/models/", 8)) return fail(t, 404, "not a peer route");
    p += 8;
    /* {org}/{name}/manifest or {org}/{name}/files/{path} */
    const char *s1 = strchr(p, '/');
    const char *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
    if (!s1 || !s2 || (size_t)(s2 - p) >= 256) return fail(t, 404, "expected /models/{org}/{name}/...");
    char id[256];
    memcpy(id, p, (size_t)(s2 - p));
    id[s2 - p] = 0;
    char why[160];
    if (store_id_valid(id, why, sizeof why) < 0) return fail(t, 400, why);
    const char *rest = s2 + 1;
    char dir[2048];
    if (store_locate(store, id, dir, sizeof dir) != STORE_COMPLETE)
        return fail(t, 404, "this node does not hold a complete copy of the model");
    char manifest[2100];
    snprintf(manifest, sizeof manifest, "%s/%s", dir, STORE_MANIFEST);
    if (!strcmp(rest, "manifest")) {
        struct stat st;
        if (stat(manifest, &st) < 0) return fail(t, 404, "the model has no manifest on this node");
        t->status = 200;
        t->is_manifest = 1;
        t->size = (uint64_t)st.st_size;
        snprintf(t->file, sizeof t->file, "%s", manifest);
        return;
    }
    if (strncmp(rest, "files/", 6)) return fail(t, 404, "expected manifest or files/{path}");
    const char *rel = rest + 6;
    if (store_relpath_valid(rel) < 0 || rel[0] == '.') return fail(t, 400, "unsafe file path");
    /* only files the manifest lists */
    json_error_t je;
    json_t *m = json_load_file(manifest, 0, &je);
    json_t *files = json_object_get(m, "files");
    int listed = 0;
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        const char *fp = json_string_value(json_object_get(f, "path"));
        if (fp && !strcmp(fp, rel)) listed = 1;
    }
    json_decref(m);
    if (!listed) return fail(t, 404, "the model's manifest does not list that file");
    snprintf(t->file, sizeof t->file, "%s/%s", dir, rel);
    struct stat st;
    if (lstat(t->file, &st) < 0 || !S_ISREG(st.st_mode)) return fail(t, 404, "file not present");
    t->size = (uint64_t)st.st_size;
    t->status = 200;
}

int serve_parse_range(const char *h, uint64_t size, uint64_t *start, uint64_t *len) {
    if (!h) return 200;
    if (strncmp(h, "bytes=", 6) || strchr(h, ',')) return 200; /* multi-range: send it all */
    const char *p = h + 6;
    char *end;
    if (*p == '-') {
        unsigned long long n = strtoull(p + 1, &end, 10);
        if (end == p + 1 || *end || n == 0) return 416;
        if (n > size) n = size;
        *start = size - n;
        *len = n;
        return size ? 206 : 416;
    }
    if (*p < '0' || *p > '9') return 200;
    unsigned long long a = strtoull(p, &end, 10);
    if (*end != '-') return 200;
    const char *q = end + 1;
    unsigned long long b = size ? size - 1 : 0;
    if (*q) {
        b = strtoull(q, &end, 10);
        if (*end || b < a) return 416;
        if (b >= size) b = size - 1;
    }
    if (a >= size) return 416;
    *start = a;
    *len = b - a + 1;
    return 206;
}

static int send_error(struct MHD_Connection *c, int status, const char *msg) {
    json_t *j = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", msg, "type",
                          status == 404 ? "Not Found" : status == 416 ? "Range Not Satisfiable" : "Bad Request",
                          "param", "code", status);
    char *body = json_dumps(j, 0);
    json_decref(j);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    int rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

int serve_mhd(struct MHD_Connection *c, const model_store *store, const char *url) {
    serve_target t;
    serve_resolve(store, url, &t);
    if (t.status != 200) return send_error(c, t.status, t.message);
    uint64_t start = 0, len = t.size;
    int status = t.is_manifest ? 200
                               : serve_parse_range(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range"),
                                                   t.size, &start, &len);
    if (status == 416) {
        char msg[96];
        snprintf(msg, sizeof msg, "range outside the file (%llu bytes)", (unsigned long long)t.size);
        struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        char cr[64];
        snprintf(cr, sizeof cr, "bytes */%llu", (unsigned long long)t.size);
        MHD_add_response_header(r, "Content-Range", cr);
        int rc = MHD_queue_response(c, 416, r);
        MHD_destroy_response(r);
        (void)msg;
        return rc;
    }
    int fd = open(t.file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return send_error(c, 404, "file not readable");
    struct MHD_Response *r = MHD_create_response_from_fd_at_offset64(len, fd, start);
    if (!r) {
        close(fd);
        return send_error(c, 500, "cannot create the response");
    }
    MHD_add_response_header(r, "Accept-Ranges", "bytes");
    MHD_add_response_header(r, "Content-Type", t.is_manifest ? "application/json" : "application/octet-stream");
    if (status == 206) {
        char cr[96];
        snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", (unsigned long long)start,
                 (unsigned long long)(start + len - 1), (unsigned long long)t.size);
        MHD_add_response_header(r, "Content-Range", cr);
    }
    int rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}
