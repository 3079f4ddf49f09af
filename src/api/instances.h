/* instances — the single-node instance manager: starts one `exo runner` child process per
 * placed model, follows its status (exo's runner status names), forwards generation requests to
 * it over the runner protocol (runner/protocol.h) and hands every message back to the caller.
 *
 * A runner that dies fails its in-flight requests at once (EOF on its socket); its instance stays
 * in the state as RunnerFailed (with the error) until it is deleted or replaced: the next request
 * for that model starts a new one. A runner that stops answering while requests are in flight
 * (silent for watchdog_s, or stuck in one engine step) is killed, its requests fail with 504,
 * and a new runner is started for the model at once.
 *
 * It refuses: multi-node placement (the cluster module takes that over) and more than one
 * instance per model. */
#ifndef EXO_API_INSTANCES_H
#define EXO_API_INSTANCES_H

#include "runner/protocol.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct instances instances;

typedef struct instances_options {
    const char *runner_exe;  /* path of the exo binary (runs `exo runner`) */
    const char *models_dir;  /* writable models directory: org/name lives at <dir>/org--name */
    const char *models_path; /* colon-separated read-only directories (may be NULL) */
    const char *node_id;
    size_t kv_cache_bytes;   /* passed to runners; 0 = automatic */
    const char *device;      /* passed to runners: cpu, cuda or auto (NULL = auto) */
    int ready_timeout_s;     /* how long a request waits for a runner to be Ready; 0 = 600 */
    int watchdog_s;          /* a busy runner silent this long is restarted; 0 = default,
                                < 0 = no watchdog */
} instances_options;

/* Watchdog. A runner's heartbeat thread reports once a second, also in the middle of a long
 * engine step; a runner with requests in flight that sends nothing for watchdog_s seconds is
 * stopped or frozen. One engine step running longer than WATCHDOG_STEP_FACTOR x watchdog_s
 * (default 10 minutes; a 512-token prefill chunk of a large model on a slow CPU takes a minute or
 * two) is stuck. Either way the runner is killed, its requests fail and a new one starts. */
#define INSTANCES_WATCHDOG_DEFAULT_S 30
#define INSTANCES_WATCHDOG_STEP_FACTOR 20
/* A runner asked to stop (instance deleted, node exiting) gets this long before SIGKILL. */
#define INSTANCES_STOP_GRACE_S 5

instances *instances_new(const instances_options *options);
/* Stops every runner (shutdown message, then SIGKILL after a grace period) and frees. */
void instances_free(instances *m);

/* Model id -> directory holding config.json: an absolute path, <models_dir>/org--name, or a
 * directory under models_path (org--name, org/name or name). Returns 0 or -1. */
int instances_resolve_model(const instances *m, const char *model_id, char *dir, size_t n);
/* Every model found on disk, as a JSON array of ids. */
json_t *instances_local_models(const instances *m);

/* Places the model (starts a runner) unless an instance exists; does not wait. Writes the
 * instance id. Returns 0, or an HTTP status (404 unknown model, 500) with err. */
int instances_place(instances *m, const char *model_id, char *instance_id, size_t n, char *err,
                    size_t errlen);

/* Called from the instance's reader thread with each message for one generation (see
 * protocol.h: accepted, progress, delta, done); `done` is always the last one, also when the
 * runner dies. The message is borrowed. */
typedef void (*instances_message_fn)(void *arg, const json_t *message);

/* Sends a generation to a Ready instance of request->model, placing one and waiting for it if
 * needed. Returns 0 with *call_id set (messages then flow to fn), or an HTTP status with err:
 * 404 unknown model, 503 runner failed to start or is not Ready in time. */
int instances_generate(instances *m, const gen_request *request, instances_message_fn fn,
                       void *arg, uint64_t *call_id, char *err, size_t errlen);
/* Asks the runner to stop a generation (it answers with done/cancelled). Unknown ids ignored. */
void instances_cancel(instances *m, uint64_t call_id);

/* {"instances":{...},"runners":{...}} in exo's camelCase tagged-union shape (new reference). */
json_t *instances_state_json(instances *m);
/* One tagged instance, or NULL if absent. */
json_t *instances_get_json(instances *m, const char *instance_id);
/* Stops the instance's runner. Returns 0, or -1 if absent. */
int instances_delete(instances *m, const char *instance_id);
/* Generations in flight, and model ids with a Ready instance (JSON array, new reference). */
int instances_in_flight(instances *m);
json_t *instances_running_models(instances *m);
/* Appends the runners' KV cache and scheduler gauges (exo_kv_blocks_*, exo_scheduler_*), one
 * series per instance labelled by model, in the Prometheus text format. */
struct strbuf;
void instances_render_metrics(instances *m, struct strbuf *out);

#endif
