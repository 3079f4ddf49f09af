/* manager — a node's downloads in the background: start, cancel, status, and a listener that
 * receives every (throttled) progress update so the cluster can publish it in state.downloads.
 *
 * One thread per active download (downloads are I/O bound; a node rarely runs more than a few).
 * Starting a model that is already downloading is a no-op. It refuses to run two downloads
 * into the same model directory, and forgets finished downloads only when asked (so the last
 * status stays visible). Thread-safe: every call may come from any thread. */
#ifndef EXO_DOWNLOAD_MANAGER_H
#define EXO_DOWNLOAD_MANAGER_H

#include "download/download.h"

#include <jansson.h>

typedef struct download_manager download_manager;

/* Called from download threads, at most ~1/s per download plus at the end. */
typedef void (*download_listener_fn)(const download_progress *p, void *ud);

typedef struct download_manager_options {
    const char *models_dir;
    const char *node_id;      /* for state entries */
    int offline;
    int parallel;             /* 0 = 8 */
    int progress_interval_ms; /* 0 = 1000 */
    const hf_config *hf;      /* NULL = from the environment (copied) */
    const char *peer_token;   /* this node's API key, sent to peers (download_request); copied */
} download_manager_options;

download_manager *download_manager_new(const download_manager_options *o);
/* Cancels every download and waits for their threads. */
void download_manager_free(download_manager *m);
void download_manager_set_listener(download_manager *m, download_listener_fn fn, void *ud);

/* Starts a download of model_id (layer_end = 0: whole model) from peers (may be NULL/0) or the
 * Hub. Returns 0 started, 1 already running, -1 error (message in err). */
int download_manager_start(download_manager *m, const char *model_id, int layer_start,
                           int layer_end, const char *const *peers, int n_peers, char *err,
                           size_t errlen);
/* Cancels a running download. 0 if one was running, -1 if not. */
int download_manager_cancel(download_manager *m, const char *model_id);
/* Waits until the download of model_id is no longer running (tests, `exo run`). */
void download_manager_wait(download_manager *m, const char *model_id);

/* Where the download of model_id stands: 0 running (pending or ongoing), 1 completed, 2 failed
 * or cancelled, -1 no download known. entry (may be NULL) receives its state.downloads entry
 * (new reference; NULL when none). */
int download_manager_status(download_manager *m, const char *model_id, json_t **entry);

/* All known downloads as exo's state.downloads entries for this node:
 * [{"DownloadOngoing"|"DownloadCompleted"|"DownloadFailed"|"DownloadPending": {...}}]. */
json_t *download_manager_state_json(download_manager *m);
/* One progress update in the same tagged shape (used by the listener side too). */
json_t *download_progress_json(const char *node_id, const download_progress *p);

#endif
