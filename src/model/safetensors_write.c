/* In-memory safetensors builder. See safetensors_write.h. */
#include "model/safetensors_write.h"

#include "base/strbuf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pending_tensor {
    char *name;
    safetensors_dtype dtype;
    int n_dims;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    void *data;
    size_t nbytes;
} pending_tensor;

struct safetensors_writer {
    pending_tensor *t;
    int n, cap;
};

safetensors_writer *safetensors_writer_new(void) {
    return calloc(1, sizeof(safetensors_writer));
}

int safetensors_writer_add(safetensors_writer *w, const char *name, safetensors_dtype dtype,
                           int n_dims, const int64_t *shape, const void *data, size_t nbytes) {
    if (n_dims < 0 || n_dims > SAFETENSORS_MAX_DIMS) return -1;
    size_t count = 1;
    for (int i = 0; i < n_dims; i++) count *= (size_t)shape[i];
    if (count * safetensors_dtype_size(dtype) != nbytes) return -1;
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 16;
        pending_tensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt) return -1;
        w->t = nt;
        w->cap = cap;
    }
    pending_tensor *p = &w->t[w->n];
    p->name = strdup(name);
    p->data = malloc(nbytes ? nbytes : 1);
    if (!p->name || !p->data) {
        free(p->name);
        free(p->data);
        return -1;
    }
    memcpy(p->data, data, nbytes);
    p->dtype = dtype;
    p->n_dims = n_dims;
    memcpy(p->shape, shape, (size_t)n_dims * sizeof *shape);
    p->nbytes = nbytes;
    w->n++;
    return 0;
}

int safetensors_writer_save(const safetensors_writer *w, const char *path, char *err,
                            size_t errlen) {
    strbuf h = {0};
    strbuf_append_str(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const pending_tensor *p = &w->t[i];
        strbuf_appendf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", p->name,
                       safetensors_dtype_name(p->dtype));
        for (int d = 0; d < p->n_dims; d++)
            strbuf_appendf(&h, d ? ",%lld" : "%lld", (long long)p->shape[d]);
        strbuf_appendf(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + p->nbytes);
        off += p->nbytes;
    }
    strbuf_append_char(&h, '}');
    while (h.len % 8) strbuf_append_char(&h, ' ');
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        strbuf_free(&h);
        return -1;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(h.data, 1, h.len, f) == h.len;
    for (int i = 0; ok && i < w->n; i++)
        ok = fwrite(w->t[i].data, 1, w->t[i].nbytes, f) == w->t[i].nbytes;
    ok = (fclose(f) == 0) && ok;
    strbuf_free(&h);
    if (!ok) snprintf(err, errlen, "%s: write failed", path);
    return ok ? 0 : -1;
}

void safetensors_writer_free(safetensors_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w);
}
