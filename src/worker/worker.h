/* worker — this node's runners and what keeps them in step with the cluster. It owns:
 *   - the runner processes: spawn, supervise, watchdog, restart, and forwarding generation
 *     requests to them (instances.h, the table api/ streams generations through);
 *   - download-then-place: a catalog model that is not on disk is fetched (peers first, then
 *     the Hub) and placed when complete (autoplace.h, private);
 *   - publishing: instance and runner events and download progress go to the cluster's log,
 *     and instances deleted through another node are stopped here (cluster_sync.h, private).
 *
 * It refuses HTTP (api/ translates requests into these calls), choosing other nodes to run on
 * (the cluster's placement) and model math (runner processes do that).
 *
 * Public headers: this one and worker/instances.h; everything else in worker/ is private. */
#ifndef EXO_WORKER_WORKER_H
#define EXO_WORKER_WORKER_H

#include "download/models_api.h"
#include "worker/instances.h"
#include "worker/placer.h"

#include <jansson.h>
#include <stddef.h>

typedef struct worker worker;

/* What the worker needs from the node's configuration (cmd/ fills it). Strings are copied. */
typedef struct worker_config {
    const char *runner_exe;  /* the exo binary that runs `exo runner` */
    const char *models_dir;  /* writable models directory */
    const char *models_path; /* colon-separated read-only model directories (may be NULL) */
    const char *data_dir;    /* custom model cards under <data_dir>/custom_cards (may be NULL) */
    const char *node_id;
    size_t kv_cache_bytes;   /* passed to runners; 0 = automatic */
    const char *kv_cache_dtype; /* passed to runners: f16, bf16, f32 (NULL or "" = default) */
    const char *speculative; /* passed to runners: ngram, mtp, draft:DIR, off (NULL or "" = off) */
    int spec_tokens;         /* passed to runners: most drafted tokens per step, 0 = default */
    const char *device;      /* passed to runners: cpu, cuda or auto (NULL or "" = auto) */
    int watchdog_s;          /* a busy runner silent this long is restarted; 0 = default, < 0 off */
    int max_runners;         /* runner processes this node starts at most; 0 = default */
    int api_port;            /* this node's HTTP port */
    /* This node's --api-key (NULL or "" = none): every node of a cluster runs with the same
     * key, so generations forwarded to another node's /internal/generate carry it. */
    const char *api_key;
} worker_config;

/* models (the node's downloads and catalog) must outlive the worker. NULL with err on failure. */
worker *worker_new(const worker_config *config, models_service *models, char *err,
                   size_t errlen);
/* The runner table: generations, this node's instances and runners, metrics. */
instances *worker_instances(worker *w);

/* Once the cluster runs: publish this node's instances, runners and download progress to its
 * log and follow deletions made through other nodes. Returns 0, or -1 (logged). */
int worker_join_cluster(worker *w);

/* Places model_id on this node: at once when it is on disk (instance_id set), else after its
 * download (instance_id set to ""; see autoplace.h). Returns 0, or an HTTP status with err. */
int worker_place(worker *w, const char *model_id, char *instance_id, size_t n, char *err,
                 size_t errlen);
/* The download half of worker_place, for generation requests that wait for their model:
 * start returns 0 (running) or an HTTP status with err; poll returns 0 still running, 1
 * complete, -1 failed (err), with *progress = the state.downloads entry (new ref) or NULL. */
int worker_download_start(worker *w, const char *model_id, char *err, size_t errlen);
int worker_download_poll(worker *w, const char *model_id, json_t **progress, char *err,
                         size_t errlen);

/* Where placement reads a model's facts (this node's model directories). */
const placer_dirs *worker_placer_dirs(worker *w);

/* Deletes an instance: this node's stops its runner at once; another node's is deleted from
 * State and its node stops the runner when it sees that. Returns 0, or -1 when no node has it. */
int worker_delete_instance(worker *w, const char *instance_id);
/* The cluster State as this node sees it (new reference): this node's runners with their live
 * status (the same value is on its way through the log). Without a running cluster, an empty
 * State with this node's own instances and runners folded in. */
json_t *worker_state_json(worker *w);

/* Stops publishing and cancels the downloads waiting to be placed; runners keep serving until
 * worker_free. Safe with NULL and to call twice. */
void worker_stop(worker *w);
/* worker_stop, then stops every runner and frees. Safe with NULL. */
void worker_free(worker *w);

#endif
