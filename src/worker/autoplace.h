/* autoplace — download-then-place, private to worker/: a model in the catalog that is not on
 * disk is downloaded first (from peers whose State says they hold it, else from HF_ENDPOINT),
 * then placed on this node's instance manager. The same download path serves generation
 * requests for such models (worker_download_start / worker_download_poll). Progress is in
 * State's downloads[nodeId]. With --offline a missing model is a 404 naming it. Models already
 * on disk are placed at once.
 *
 * It refuses models that are neither on disk nor in the catalog (404), and does not choose
 * other nodes to run on (placement across nodes is the cluster's). It speaks no HTTP: api/
 * turns its results into responses. */
#ifndef EXO_WORKER_AUTOPLACE_H
#define EXO_WORKER_AUTOPLACE_H

#include "download/models_api.h"
#include "worker/instances.h"

typedef struct autoplace autoplace;

/* api_port is this node's (the port of peers that publish none). NULL when out
 * of memory. */
autoplace *autoplace_new(instances *local, models_service *models, int api_port);
/* Places model_id now when it is on disk (instance_id set), else starts its download and
 * places it when the download completes (instance_id set to ""). Returns 0, or an HTTP status
 * with err (404 unknown or offline, 400 download refused, 500). */
int autoplace_place(autoplace *a, const char *model_id, char *instance_id, size_t n, char *err,
                    size_t errlen);
/* Starts the download of a catalog model that is not on disk (peers first, then the Hub).
 * Returns 0 (started or already running), or an HTTP status with err. */
int autoplace_download_start(autoplace *a, const char *model_id, char *err, size_t errlen);
/* 0 still running, 1 complete, -1 failed (err says why); *progress = the state.downloads entry
 * (new reference) or NULL. */
int autoplace_download_poll(autoplace *a, const char *model_id, json_t **progress, char *err,
                            size_t errlen);
/* Cancels downloads still waiting to be placed and joins their threads; later placements of
 * models not on disk get 503. Call before the instance manager and the models service are
 * freed. Safe with NULL and to call twice. */
void autoplace_stop(autoplace *a);
/* autoplace_stop, then frees. Safe with NULL. */
void autoplace_free(autoplace *a);

#endif
