/* dist — the data plane inside one model instance: collectives and point-to-point messages
 * between the ranks (runner processes) of one instance. CPU ranks use Gloo (TCP, or ibverbs);
 * the rendezvous goes through a key/value store the caller provides (in production: the
 * cluster's replicated state, through the runner's worker; in tests: a directory).
 * Every call has a timeout: a dead or slow rank is an error, never a hang.
 *
 * Owns: the pairs between ranks (one per peer), the cached collective objects, the address
 * exchange through the store. Refuses: to hang (every operation is bounded by timeout_ms), to
 * abort on a peer's failure (every Gloo exception becomes -1 and a message), and to be used from
 * two threads at once (one call at a time per group). After a failed call the group is broken:
 * close it and connect again. Implementation: src/dist/gloo.cc; docs/distributed.md. */
#ifndef EXO_DIST_H
#define EXO_DIST_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dist_store {
    void *ctx;
    /* Publishes key = value (bytes) to every rank. Returns 0, or -1. */
    int (*set)(void *ctx, const char *key, const void *value, size_t len);
    /* Waits up to timeout_ms for key; returns 0 with *value (malloc'd, caller frees) and *len,
     * or -1 when it did not appear in time. */
    int (*get)(void *ctx, const char *key, void **value, size_t *len, int timeout_ms);
} dist_store;

/* A store over files in one directory shared by the ranks (tests, `exo bench`, one host).
 * Keys become file names (written whole, then renamed into place); get polls until timeout.
 * The directory must be fresh per instance (or the prefix unique): old keys are read as valid. */
int dist_store_dir(dist_store *out, const char *dir); /* 0 or -1 */
void dist_store_dir_free(dist_store *s);

typedef struct dist_config {
    int rank, size;
    const char *prefix;         /* key namespace in the store (e.g. the instance id) */
    const char *bind_host;      /* address to listen on, e.g. "127.0.0.1" or "0.0.0.0" */
    const char *advertise_host; /* address other ranks dial (NULL = bind_host); lets a proxy sit in
                                   the path */
    int timeout_ms;             /* bound on every operation, connect included (0 = 30000) */
    const char *transport;      /* "tcp" (NULL = tcp) or "ibverbs" */
    /* Fixed listening ports (0 = the kernel picks). Rank r listens for peer p on
     * port_base + r * size + p, so a proxy can be set up before the ranks start. */
    int port_base;
    /* Other ranks dial advertise_host at (listening port + advertise_port_offset): a proxy that
     * listens there and forwards to bind_host:port sits in the data path. Needs port_base. */
    int advertise_port_offset;
} dist_config;

typedef struct dist_group dist_group;

dist_group *dist_connect(const dist_config *c, const dist_store *store, char *err, size_t errlen);
void dist_close(dist_group *g);
int dist_rank(const dist_group *g);
int dist_size(const dist_group *g);

/* In-place sum of n floats across all ranks (every rank gets the sum). 0, or -1 with err. */
int dist_allreduce_sum(dist_group *g, float *buf, size_t n, char *err, size_t errlen);
/* root's bytes to every rank. */
int dist_broadcast(dist_group *g, int root, void *buf, size_t bytes, char *err, size_t errlen);
/* Point to point (pipeline hidden states, token ids). Sizes must match on both ends. */
int dist_send(dist_group *g, int dst, const void *buf, size_t bytes, char *err, size_t errlen);
int dist_recv(dist_group *g, int src, void *buf, size_t bytes, char *err, size_t errlen);
int dist_barrier(dist_group *g, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
