/* holdings — private to worker/: tells the cluster which models this node holds whole on disk
 * (its models dir and every --models-path directory, copies made by hand included) by publishing
 * each as a completed download in State (NodeDownloadProgress DownloadCompleted, as exo does for
 * the models it finds at start). Placement on any node then prefers this node for them
 * (placer.c), and peers may fetch their files from it (peers.c; the peer routes serve the same
 * store). A copy in a read-only directory (--models-path, built-in) is marked readOnly: the
 * dashboard offers no "Delete files" for it. A model it published that is no longer whole on disk
 * is withdrawn (DownloadDeleted).
 *
 * It refuses: publishing a model while this node's download of it runs (the download manager's
 * progress is the truth then), and partial copies or pipeline-stage files (not a copy to place
 * on or serve). Runs on cluster_sync's thread. */
#ifndef EXO_WORKER_HOLDINGS_H
#define EXO_WORKER_HOLDINGS_H

#include "download/manager.h"
#include "worker/placer.h"

#include <jansson.h>

#define HOLDINGS_SCAN_MS 5000 /* a copy added or removed by hand shows in State within this */

typedef struct holdings holdings;

/* downloads may be NULL (no download manager). NULL when out of memory. */
holdings *holdings_new(const placer_dirs *dirs, download_manager *downloads);
void holdings_free(holdings *h);

/* One pass of cluster_sync with the State this node sees (me: its node id): at most every
 * HOLDINGS_SCAN_MS, lists the store and submits what State lacks or holds wrongly. */
void holdings_sync(holdings *h, json_t *state, const char *me);

#endif
