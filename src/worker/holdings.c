/* holdings — this node's whole models on disk, published in State (see holdings.h). */
#include "worker/holdings.h"

#include "base/clock.h"
#include "base/log.h"
#include "cluster/cluster.h"
#include "model/store.h"
#include "worker/peers.h"

#include <stdlib.h>
#include <string.h>

struct holdings {
    placer_dirs dirs;
    download_manager *downloads;
    uint64_t next_scan_ns;
    json_t *published; /* model id -> true: whole copies this node announced */
};

holdings *holdings_new(const placer_dirs *dirs, download_manager *downloads) {
    holdings *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->dirs = *dirs;
    h->downloads = downloads;
    h->published = json_object();
    if (!h->published) {
        free(h);
        return NULL;
    }
    return h;
}

void holdings_free(holdings *h) {
    if (!h) return;
    json_decref(h->published);
    free(h);
}

typedef struct scan {
    holdings *h;
    const model_store *store;
    json_t *downloads; /* State's downloads */
    const char *me;
    json_t *whole; /* model id -> true: whole on disk now */
} scan;

/* The copy in dir is in the writable models dir (else a read-only one: --models-path, built-in). */
static int writable(const model_store *store, const char *dir) {
    size_t n = strlen(store->models_dir);
    return n && !strncmp(dir, store->models_dir, n) && dir[n] == '/';
}

/* readOnly (not in exo's shape; its clients ignore it): the dashboard offers no "Delete files"
 * for such a copy. */
static void announce(const model_store *store, const char *me, const char *id, const char *dir) {
    json_t *done = json_pack("{s:{s:s,s:s,s:{s:I},s:b}}", "DownloadCompleted", "nodeId", me,
                             "modelId", id, "total", "inBytes", (json_int_t)store_dir_bytes(dir),
                             "readOnly", !writable(store, dir));
    cluster_submit(json_pack("{s:{s:o}}", "NodeDownloadProgress", "downloadProgress", done));
}

/* store_list reports each id once, from its first directory; store_locate says whether any
 * directory holds it whole. */
static void visit(const char *id, const char *first_dir, enum store_state st, void *ud) {
    scan *s = ud;
    (void)first_dir;
    (void)st;
    char dir[STORE_PATH_MAX + 64];
    if (store_locate(s->store, id, dir, sizeof dir) != STORE_COMPLETE) return;
    json_object_set_new(s->whole, id, json_true());
    if (peers_node_holds(s->downloads, s->me, id)) return; /* State knows */
    if (s->h->downloads && download_manager_status(s->h->downloads, id, NULL) == 0) return;
    if (!json_object_get(s->h->published, id))
        log_info("cluster: publishing %s (on disk at %s) as held by this node", id, dir);
    announce(s->store, s->me, id, dir);
    json_object_set_new(s->h->published, id, json_true());
}

void holdings_sync(holdings *h, json_t *state, const char *me) {
    uint64_t now = clock_now_ns();
    if (now < h->next_scan_ns) return;
    h->next_scan_ns = now + (uint64_t)HOLDINGS_SCAN_MS * 1000000u;
    model_store store;
    char err[256];
    if (store_init(&store, h->dirs.models_dir[0] ? h->dirs.models_dir : "/nonexistent",
                   h->dirs.models_path, err, sizeof err))
        return;
    scan s = {.h = h,
              .store = &store,
              .downloads = json_object_get(state, "downloads"),
              .me = me,
              .whole = json_object()};
    if (!s.whole) return;
    store_list(&store, visit, &s);
    const char *id;
    json_t *v, *tmp;
    json_object_foreach_safe(h->published, tmp, id, v) { /* gone from disk since */
        if (json_object_get(s.whole, id)) continue;
        if (peers_node_holds(s.downloads, me, id)) {
            log_info("cluster: %s is no longer whole on disk here; withdrawing it", id);
            cluster_submit(
                json_pack("{s:{s:s,s:s}}", "DownloadDeleted", "nodeId", me, "modelId", id));
        }
        json_object_del(h->published, id);
    }
    json_decref(s.whole);
}
