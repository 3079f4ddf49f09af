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
 * Multi-node instances are placed through the cluster State, not here: the worker starts this
 * node's rank of one with instances_start_shard (its runner connects to the other ranks through a
 * rendezvous the worker keeps in State, instances_rendezvous), and generations for a model whose
 * rank 0 runs on another node go through instances_router (the worker forwards them there).
 *
 * It refuses: choosing nodes (placement), and more than one instance per model of its own. */
#ifndef EXO_WORKER_INSTANCES_H
#define EXO_WORKER_INSTANCES_H

#include "runner/protocol.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct instances instances;

/* Called from the instance's reader thread with each message for one generation (see
 * protocol.h: accepted, progress, delta, done); `done` is always the last one, also when the
 * runner dies. The message is borrowed. */
typedef void (*instances_message_fn)(void *arg, const json_t *message);

typedef struct instances_options {
    const char *runner_exe;  /* path of the exo binary (runs `exo runner`) */
    const char *models_dir;  /* writable models directory: org/name lives at <dir>/org--name */
    const char *models_path; /* colon-separated read-only directories (may be NULL) */
    const char *node_id;
    size_t kv_cache_bytes;   /* passed to runners; 0 = automatic */
    const char *kv_cache_dtype; /* passed to runners: f16, bf16, f32 (NULL or "" = default) */
    const char *speculative; /* passed to runners: ngram, mtp, draft:DIR, off (NULL or "" = off) */
    int spec_tokens;         /* passed to runners: most drafted tokens per step, 0 = default */
    const char *device;      /* passed to runners: cpu, cuda or auto (NULL = auto) */
    int ready_timeout_s;     /* how long a request waits for a runner to be Ready; 0 = 600 */
    int watchdog_s;          /* a busy runner silent this long is restarted; 0 = default,
                                < 0 = no watchdog */
    int max_runners;         /* runners this node starts at most (a placement past it is a 503);
                                0 = INSTANCES_MAX_RUNNERS_DEFAULT */
} instances_options;

#define INSTANCES_MAX_RUNNERS_DEFAULT 8

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

/* The cluster State's side of State-placed ranks. Where a rank's rendezvous keys go
 * (runner/store_node.h): set publishes instance_id's key (hex text) to every node; get returns it
 * (malloc'd) or NULL while it is not there yet; both are called from a runner's reader thread.
 * held says whether State still holds the instance: a rank whose instance was deleted lives on
 * until the cluster sync stops it, and in that time it must not serve a request or be handed out
 * by a placement (called with the instances lock held). */
typedef struct instances_rendezvous {
    void *ctx;
    void (*set)(void *ctx, const char *instance_id, const char *key, const char *value);
    char *(*get)(void *ctx, const char *instance_id, const char *key);
    int (*held)(void *ctx, const char *instance_id);
} instances_rendezvous;

/* Generations this node does not serve itself. generate is asked first for every request, with
 * the in-flight count of this node's Ready rank-0 instance of the model (-1: none here): it
 * returns 0 when it took the call (messages then flow to fn, "done" last, as for a local one),
 * -1 to let this node serve it (or place it here), or an HTTP status with err. cancel stops a
 * call it took (it answers "done" with finish_reason "cancelled"). serves says whether an
 * instance placed across the cluster serves the model (ready or not): then a node without the
 * model's files routes the request there instead of downloading the model. */
typedef struct instances_router {
    void *ctx;
    int (*generate)(void *ctx, const gen_request *request, int local_in_flight,
                    instances_message_fn fn, void *arg, uint64_t call_id, char *err,
                    size_t errlen);
    void (*cancel)(void *ctx, uint64_t call_id);
    int (*serves)(void *ctx, const char *model_id);
} instances_router;

/* Installs the worker's hooks (before the first request; either may be NULL). */
void instances_set_cluster_hooks(instances *m, const instances_rendezvous *rendezvous,
                                 const instances_router *router);

/* One rank of a multi-node instance that the cluster State assigns to this node. */
typedef struct instances_shard {
    const char *instance_id, *runner_id, *model_id;
    const json_t *instance;  /* the State's tagged instance (copied; /state shows it) */
    int rank, world_size;
    int tensor;              /* 1 tensor parallel, 0 pipeline */
    int layer_start, layer_end; /* pipeline: this rank's layers */
    const char *dist_host;   /* this node's address the other ranks can reach */
    const char *transport;   /* the instance's data plane: "ibverbs", or "tcp" (NULL = tcp) */
    int dist_timeout_ms;     /* 0 = the runner's default */
    /* The layers whose files the rank needs (a pipeline stage's; 0, 0 = every file) and, once
     * downloaded, where they are: a directory holding only those files is no complete model,
     * so model_dir is taken as is (NULL: the complete model in the store). */
    int files_layer_start, files_layer_end;
    const char *model_dir;
} instances_shard;

/* Starts the rank's runner (`exo runner --rank ... --dist-store node`). Returns 0, or an HTTP
 * status with err (404 model not on this node, 500). */
int instances_start_shard(instances *m, const instances_shard *shard, char *err, size_t errlen);
/* 1 when this node has a live instance of the model of its own or a rank 0 of one. */
int instances_serves(instances *m, const char *model_id);
/* 1 when an instance serves the model, here or (the router's serves) placed across the cluster:
 * a generation for it needs no download on this node. */
int instances_serves_anywhere(instances *m, const char *model_id);
/* 1 when this node runs (or ran: Failed) a runner of instance_id. */
int instances_has(instances *m, const char *instance_id);
/* Stops every runner (shutdown message, then SIGKILL after a grace period) and frees. */
void instances_free(instances *m);

/* The one id of the model `requested` names (model/store.h store_canonical_id: ids as they are,
 * a path only when it is a model directory inside the model dirs). Every placement goes through
 * it, so two spellings of one model never start two runners. Returns 0, or -1 with err. */
int instances_canonical_model(const instances *m, const char *requested, char *id, size_t n,
                              char *err, size_t errlen);
/* Model id -> directory holding config.json: <models_dir>/org--name, or a directory under
 * models_path (org--name or name); a path only inside those. Returns 0 or -1. */
int instances_resolve_model(const instances *m, const char *model_id, char *dir, size_t n);
/* Why model_id is not placeable from disk, for messages (model/store.h store_missing_reason). */
void instances_missing_reason(const instances *m, const char *model_id, char *out, size_t n);
/* Every model found on disk, as a JSON array of ids. */
json_t *instances_local_models(const instances *m);

/* Places the model (starts a runner) unless an instance exists; does not wait. Writes the
 * instance id. Returns 0, or an HTTP status (404 unknown model, 500) with err. */
int instances_place(instances *m, const char *model_id, char *instance_id, size_t n, char *err,
                    size_t errlen);


/* Sends a generation to a Ready instance of request->model, placing one and waiting for it if
 * needed. Returns 0 with *call_id set (messages then flow to fn), or an HTTP status with err:
 * 404 unknown model, 503 runner failed to start or is not Ready in time. */
int instances_generate(instances *m, const gen_request *request, instances_message_fn fn,
                       void *arg, uint64_t *call_id, char *err, size_t errlen);
/* Sends a generation to this node's rank-0 runner of instance_id (waiting for Ready), never to
 * another node and never placing one: for requests forwarded here by another node's router. */
int instances_generate_instance(instances *m, const char *instance_id, const gen_request *request,
                                instances_message_fn fn, void *arg, uint64_t *call_id, char *err,
                                size_t errlen);
/* Asks the runner to stop a generation (it answers with done/cancelled). Unknown ids ignored. */
void instances_cancel(instances *m, uint64_t call_id);

/* {"instances":{...},"runners":{...},"fromState":{instanceId:true}} in exo's camelCase
 * tagged-union shape (new reference); fromState lists the multi-node ranks, whose instance the
 * State already holds (the worker publishes only this node's own instances). */
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
