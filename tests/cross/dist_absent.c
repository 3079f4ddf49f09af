/* dist_absent — the data plane of a cross build that has no Gloo (make CROSS=..., see the
 * Makefile): every entry point of dist/dist.h answers an error, so the engine runs single-rank
 * models and refuses tensor/pipeline parallel ones with a message instead of failing to link.
 * Linked only into cross builds; the native build uses src/dist/gloo.cc. */
#include "dist/dist.h"

#include <stdio.h>

static int absent(char *err, size_t errlen) {
    if (err && errlen) snprintf(err, errlen, "this build has no data plane (cross build without Gloo)");
    return -1;
}

dist_group *dist_connect(const dist_config *c, const dist_store *store, char *err, size_t errlen) {
    (void)c, (void)store;
    absent(err, errlen);
    return NULL;
}

void dist_close(dist_group *g) {
    (void)g;
}

int dist_rank(const dist_group *g) {
    (void)g;
    return 0;
}

int dist_size(const dist_group *g) {
    (void)g;
    return 1;
}

int dist_allreduce_sum(dist_group *g, float *buf, size_t n, char *err, size_t errlen) {
    (void)g, (void)buf, (void)n;
    return absent(err, errlen);
}

int dist_broadcast(dist_group *g, int root, void *buf, size_t bytes, char *err, size_t errlen) {
    (void)g, (void)root, (void)buf, (void)bytes;
    return absent(err, errlen);
}

int dist_send(dist_group *g, int dst, const void *buf, size_t bytes, char *err, size_t errlen) {
    (void)g, (void)dst, (void)buf, (void)bytes;
    return absent(err, errlen);
}

int dist_recv(dist_group *g, int src, void *buf, size_t bytes, char *err, size_t errlen) {
    (void)g, (void)src, (void)buf, (void)bytes;
    return absent(err, errlen);
}

int dist_barrier(dist_group *g, char *err, size_t errlen) {
    (void)g;
    return absent(err, errlen);
}
