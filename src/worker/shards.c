/* shards — this node's ranks of the State's multi-node instances (see shards.h). */
#include "worker/shards.h"

#include "base/clock.h"
#include "base/log.h"
#include "cluster/cluster.h"
#include "cluster/nodeinfo.h"
#include "worker/peers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where this node's rank of an instance stands: its files downloading, on disk and waiting for
 * the other ranks' files, or started (or failed: never begun again). */
enum rank_phase { RANK_FETCHING = 1, RANK_WAITING, RANK_DONE };

struct shards {
    instances *local;
    placer_dirs dirs;
    char dist_host[64];
    int dist_timeout_ms;
    download_manager *downloads; /* where a rank's missing files come from */
    int api_port;                /* of peers that publish none (peers_find) */
    /* instance id -> {"phase", "runner", "dir", "model", "fetching"}: this node's rank of each
     * instance, begun once; fetching: the rank started the download running for it */
    json_t *ranks;
    json_t *pending;  /* master: {instanceId: {instance, due}} to place again once due */
};

json_t *shards_tagged_body(json_t *tagged) {
    if (!json_is_object(tagged) || json_object_size(tagged) != 1) return NULL;
    json_t *body = json_object_iter_value(json_object_iter(tagged));
    return json_is_object(body) ? body : NULL;
}

json_t *shards_node_to_runner(json_t *instance) {
    return json_object_get(json_object_get(shards_tagged_body(instance), "shardAssignments"),
                           "nodeToRunner");
}

int shards_is_cluster_instance(json_t *instance) {
    return shards_tagged_body(instance) &&
           strcmp(json_object_iter_key(json_object_iter(instance)), "LocalInstance") != 0;
}

/* The first non-loopback IPv4 address (ranks on other nodes dial it), else loopback. */
static void find_dist_host(char *out, size_t n) {
    const char *env = getenv("EXO_DIST_HOST");
    snprintf(out, n, "%s", env && *env ? env : "127.0.0.1");
    if (env && *env) return;
    json_t *net = nodeinfo_network_json();
    const char *ip = nodeinfo_reachable_ipv4(json_object_get(net, "interfaces"));
    if (ip) snprintf(out, n, "%s", ip);
    json_decref(net);
}

shards *shards_new(instances *local, const placer_dirs *dirs, download_manager *downloads,
                   int api_port) {
    shards *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->local = local;
    if (dirs) s->dirs = *dirs;
    find_dist_host(s->dist_host, sizeof s->dist_host);
    const char *t = getenv("EXO_DIST_TIMEOUT_MS");
    s->dist_timeout_ms = t ? atoi(t) : 0;
    s->downloads = downloads;
    s->api_port = api_port;
    s->ranks = json_object();
    s->pending = json_object();
    return s;
}

void shards_free(shards *s) {
    if (!s) return;
    json_decref(s->ranks);
    json_decref(s->pending);
    free(s);
}

/* ------------------------------------------------------------------ rendezvous */

static void rendezvous_set(void *ctx, const char *instance_id, const char *key, const char *value) {
    (void)ctx;
    cluster_submit(json_pack("{s:{s:s,s:s,s:s}}", "InstanceRendezvousSet", "instanceId",
                             instance_id, "key", key, "value", value));
}

static char *rendezvous_get(void *ctx, const char *instance_id, const char *key) {
    (void)ctx;
    char path[128];
    snprintf(path, sizeof path, "instances/%s", instance_id);
    char *text = cluster_state_json(path);
    json_t *inst = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    const char *v = json_string_value(
        json_object_get(json_object_get(shards_tagged_body(inst), "rendezvous"), key));
    char *out = v ? strdup(v) : NULL;
    json_decref(inst);
    return out;
}

static int state_holds(void *ctx, const char *instance_id) {
    (void)ctx;
    char path[128];
    snprintf(path, sizeof path, "instances/%s", instance_id);
    return cluster_state_has(path);
}

instances_rendezvous shards_rendezvous(shards *s) {
    return (instances_rendezvous){
        .ctx = s, .set = rendezvous_set, .get = rendezvous_get, .held = state_holds};
}

/* ------------------------------------------------------------------ following State */

/* How many runners of the instance have a status in State that is `kind` (NULL: any status);
 * *n_runners (may be NULL) gets how many runners the instance has. */
static int runners_reporting(json_t *state, json_t *inst, const char *kind, int *n_runners) {
    json_t *runners = json_object_get(state, "runners");
    const char *node;
    json_t *runner;
    int n = 0, reporting = 0;
    json_object_foreach(shards_node_to_runner(inst), node, runner) {
        json_t *status =
            json_object_get(runners, json_is_string(runner) ? json_string_value(runner) : "");
        n++;
        reporting += status && (!kind || json_object_get(status, kind));
    }
    if (n_runners) *n_runners = n;
    return reporting;
}

static void publish_status(const char *runner_id, json_t *status) {
    cluster_submit(json_pack("{s:{s:s,s:o}}", "RunnerStatusUpdated", "runnerId", runner_id,
                             "runnerStatus", status));
}

static void publish_failed(const char *runner_id, const char *why) {
    publish_status(runner_id, json_pack("{s:{s:s}}", "RunnerFailed", "errorMessage", why));
}

/* This node's rank of inst as State describes it (strings borrowed from inst). 0, or -1. */
static int shard_of(json_t *inst, const char *id, const char *runner_id, instances_shard *sh) {
    json_t *assign = json_object_get(shards_tagged_body(inst), "shardAssignments");
    json_t *shard = json_object_get(json_object_get(assign, "runnerToShard"), runner_id);
    json_t *meta = shards_tagged_body(shard);
    const char *model = json_string_value(json_object_get(assign, "modelId"));
    if (!meta || !model) return -1;
    *sh = (instances_shard){
        .instance_id = id,
        .runner_id = runner_id,
        .model_id = model,
        .instance = inst,
        .rank = (int)json_integer_value(json_object_get(meta, "deviceRank")),
        .world_size = (int)json_integer_value(json_object_get(meta, "worldSize")),
        .tensor = !strcmp(json_object_iter_key(json_object_iter(shard)), "TensorShardMetadata"),
        .layer_start = (int)json_integer_value(json_object_get(meta, "startLayer")),
        .layer_end = (int)json_integer_value(json_object_get(meta, "endLayer")),
        .transport = json_string_value(json_object_get(shards_tagged_body(inst), "transport"))};
    /* the files a rank needs: a pipeline stage its layers' (download_request), else all */
    int n_layers = (int)json_integer_value(json_object_get(meta, "nLayers"));
    int whole = sh->tensor || (sh->layer_start <= 0 && sh->layer_end >= n_layers);
    sh->files_layer_start = whole ? 0 : sh->layer_start;
    sh->files_layer_end = whole ? 0 : sh->layer_end;
    return 0;
}

/* Starts the download of the rank's files (peers holding the model first, then the Hub).
 * 0 started, 1 one was running already (the rank waits for it), or -1 with err. */
static int fetch_start(shards *s, const instances_shard *sh, char *err, size_t errlen) {
    char urls[8][96];
    const char *peers[8];
    int n = peers_find(sh->model_id, s->api_port, urls, 8);
    for (int i = 0; i < n; i++)
        peers[i] = urls[i];
    char why[512];
    int rc = download_manager_start(s->downloads, sh->model_id, sh->files_layer_start,
                                    sh->files_layer_end, peers, n, why, sizeof why);
    if (rc < 0) {
        snprintf(err, errlen, "cannot download the files of rank %d: %s", sh->rank, why);
        return -1;
    }
    if (rc > 0) return 1;
    log_info("instance %s: downloading %s for rank %d (layers %d:%d, 0:0 = all) from %s",
             sh->instance_id, sh->model_id, sh->rank, sh->files_layer_start, sh->files_layer_end,
             n ? "a peer" : "the Hub");
    return 0;
}

/* The rank of a deleted instance: a download it started stops (download.h keeps the .partial
 * files, so placing the model again resumes it), unless another rank here waits for it. */
static void rank_forget(shards *s, const char *id, json_t *rank) {
    const char *model = json_string_value(json_object_get(rank, "model"));
    if (json_integer_value(json_object_get(rank, "phase")) != RANK_FETCHING ||
        !json_is_true(json_object_get(rank, "fetching")) || !model)
        return;
    const char *other_id;
    json_t *other;
    json_object_foreach(s->ranks, other_id, other) {
        const char *m = json_string_value(json_object_get(other, "model"));
        if (strcmp(other_id, id) && m && !strcmp(m, model) &&
            json_integer_value(json_object_get(other, "phase")) == RANK_FETCHING)
            return;
    }
    if (download_manager_cancel(s->downloads, model) == 0)
        log_info("instance %s was deleted: its download of %s stops", id, model);
}

/* The download of the rank's files: 0 running, 1 done (dir set), -1 failed (err set). A
 * completed download of other layers (one that was running already when this rank asked) is
 * followed by this rank's own (*started = 1). */
static int fetch_poll(shards *s, const instances_shard *sh, char *dir, size_t n, int *started,
                      char *err, size_t errlen) {
    json_t *entry = NULL;
    int st = download_manager_status(s->downloads, sh->model_id, &entry);
    json_t *body = shards_tagged_body(entry);
    int rc = 0;
    if (st == 1) {
        json_t *end = json_object_get(body, "endLayer");
        int covers = !end || (sh->files_layer_end == json_integer_value(end) &&
                              sh->files_layer_start ==
                                  json_integer_value(json_object_get(body, "startLayer")));
        const char *where = json_string_value(json_object_get(body, "modelDirectory"));
        if (covers && where) {
            snprintf(dir, n, "%s", where);
            rc = 1;
        } else {
            int got = fetch_start(s, sh, err, errlen);
            *started = got == 0;
            rc = got < 0 ? -1 : 0;
        }
    } else if (st != 0) {
        const char *why = json_string_value(json_object_get(body, "errorMessage"));
        snprintf(err, errlen, "cannot download the files of rank %d: %s", sh->rank,
                 why ? why : "the download stopped");
        rc = -1;
    }
    json_decref(entry);
    return rc;
}

/* Every runner of the instance has a status in State: each node publishes its rank's (Idle,
 * then the runner's own) once the rank's files are on its disk, so no rank starts connecting
 * while another still downloads (its peers would time out waiting for it). */
static int all_ranks_have_files(json_t *state, json_t *inst) {
    int n_runners = 0;
    return runners_reporting(state, inst, NULL, &n_runners) == n_runners;
}

/* A rank just seen in State: its files are here (Idle, waiting for the other ranks), or their
 * download starts. */
static void rank_begin(shards *s, const char *id, json_t *inst, const char *runner_id) {
    instances_shard sh;
    char dir[1024], err[600];
    int started;
    if (shard_of(inst, id, runner_id, &sh)) {
        json_object_set_new(s->ranks, id, json_pack("{s:i}", "phase", RANK_DONE));
        publish_failed(runner_id, "the instance in State has no shard for this runner");
        return;
    }
    if (instances_resolve_model(s->local, sh.model_id, dir, sizeof dir) == 0) {
        json_object_set_new(
            s->ranks, id,
            json_pack("{s:i,s:s,s:s}", "phase", RANK_WAITING, "runner", runner_id, "dir", dir));
        publish_status(runner_id, json_pack("{s:{}}", "RunnerIdle"));
    } else if ((started = fetch_start(s, &sh, err, sizeof err)) >= 0) {
        json_object_set_new(s->ranks, id,
                            json_pack("{s:i,s:s,s:s,s:b}", "phase", RANK_FETCHING, "runner",
                                      runner_id, "model", sh.model_id, "fetching", started == 0));
    } else {
        log_error("instance %s: %s", id, err);
        json_object_set_new(s->ranks, id, json_pack("{s:i}", "phase", RANK_DONE));
        publish_failed(runner_id, err);
    }
}

/* One step of a rank that is not started yet: its download ended, or every rank has its files. */
static void rank_advance(shards *s, json_t *state, const char *id, json_t *inst, json_t *rank) {
    const char *runner_id = json_string_value(json_object_get(rank, "runner"));
    int phase = (int)json_integer_value(json_object_get(rank, "phase"));
    instances_shard sh;
    char dir[1024], err[600];
    if (phase == RANK_DONE || !runner_id || shard_of(inst, id, runner_id, &sh)) return;
    if (phase == RANK_FETCHING) {
        int started = 0;
        int got = fetch_poll(s, &sh, dir, sizeof dir, &started, err, sizeof err);
        if (started) json_object_set_new(rank, "fetching", json_true());
        if (got == 1) {
            json_object_set_new(rank, "phase", json_integer(RANK_WAITING));
            json_object_set_new(rank, "dir", json_string(dir));
            publish_status(runner_id, json_pack("{s:{}}", "RunnerIdle"));
        } else if (got < 0) {
            log_error("instance %s: %s", id, err);
            json_object_set_new(rank, "phase", json_integer(RANK_DONE));
            publish_failed(runner_id, err);
        }
        return;
    }
    if (!all_ranks_have_files(state, inst)) return;
    json_object_set_new(rank, "phase", json_integer(RANK_DONE));
    sh.model_dir = json_string_value(json_object_get(rank, "dir"));
    sh.dist_host = s->dist_host;
    sh.dist_timeout_ms = s->dist_timeout_ms;
    if (instances_start_shard(s->local, &sh, err, sizeof err)) {
        log_error("instance %s: cannot start rank %d: %s", id, sh.rank, err);
        publish_failed(runner_id, err);
    }
}

void shards_follow(shards *s, json_t *state, const char *me) {
    json_t *insts = json_object_get(state, "instances");
    const char *id;
    json_t *inst, *rank, *tmp;
    json_object_foreach(insts, id, inst) {
        if (!shards_is_cluster_instance(inst) || json_object_get(s->ranks, id)) continue;
        json_t *map = shards_node_to_runner(inst);
        const char *runner = json_string_value(json_object_get(map, me));
        if (runner && !instances_has(s->local, id)) rank_begin(s, id, inst, runner);
    }
    json_object_foreach_safe(s->ranks, tmp, id, rank) {
        inst = json_object_get(insts, id);
        if (!inst) {
            rank_forget(s, id, rank);
            json_object_del(s->ranks, id);
        } else
            rank_advance(s, state, id, inst, rank);
    }
}

/* ------------------------------------------------------------------ master: fail-over */

/* The same model, sharding and transport on the nodes alive now (any count that fits). */
static void place_again(shards *s, json_t *inst) {
    json_t *body = shards_tagged_body(inst);
    const char *model = json_string_value(
        json_object_get(json_object_get(body, "shardAssignments"), "modelId"));
    const char *sharding = json_string_value(json_object_get(body, "sharding"));
    char meta[64];
    snprintf(meta, sizeof meta, "%s", json_object_iter_key(json_object_iter(inst)));
    char *suffix = strstr(meta, "Instance");
    if (suffix) *suffix = 0;
    placer_model m;
    char err[512];
    if (!model || placer_model_load(&s->dirs, model, 0, &m, err, sizeof err)) return;
    placement_node nodes[PLACEMENT_MAX_NODES];
    int n = placer_nodes(&s->dirs, model, nodes, PLACEMENT_MAX_NODES);
    placement_sharding sh = sharding && !strcmp(sharding, "Tensor") ? PLACEMENT_TENSOR
                                                                     : PLACEMENT_PIPELINE;
    placement_result r;
    if (placer_place(&m, sh, 1, nodes, n, &r, err, sizeof err) == 0) {
        json_t *again = placer_instance_json(&m.facts, sh, meta, &r, NULL);
        /* a second failure is not placed again: no loop when the model cannot start anywhere */
        json_object_set_new(shards_tagged_body(again), "placedAgainFrom",
                            json_string(json_string_value(json_object_get(body, "instanceId"))));
        log_info("cluster: placing %s again on %d node(s)", model, r.n_nodes);
        cluster_submit(json_pack("{s:{s:o}}", "InstanceCreated", "instance", again));
    } else {
        log_warn("cluster: %s does not fit the remaining nodes: %s", model, err);
    }
    placer_model_free(&m);
}

void shards_submit_delete(json_t *instance, const char *id) {
    cluster_submit(json_pack("{s:{s:s}}", "InstanceDeleted", "instanceId", id));
    const char *node;
    json_t *runner;
    json_object_foreach(shards_node_to_runner(instance), node, runner) {
        if (json_is_string(runner))
            cluster_submit(json_pack("{s:{s:O}}", "RunnerDeleted", "runnerId", runner));
    }
}

/* A peer that died is still listed alive until the cluster's peer timeout: the placement waits
 * that long, so it does not count on the node whose death failed the instance. */
static uint64_t replace_delay_ns(void) {
    const char *env = getenv("EXO_CLUSTER_PEER_TIMEOUT_MS");
    uint64_t ms = env && atoi(env) > 0 ? (uint64_t)atoi(env) : 5000;
    return (ms + 1000) * 1000000ull;
}

void shards_fail_over(shards *s, json_t *state, json_t *deleting) {
    const char *id;
    json_t *inst, *tmp;
    uint64_t now = clock_now_ns();
    json_object_foreach(json_object_get(state, "instances"), id, inst) {
        if (!shards_is_cluster_instance(inst) || json_object_get(deleting, id) ||
            !runners_reporting(state, inst, "RunnerFailed", NULL))
            continue;
        log_info("cluster: instance %s has a failed runner; deleting it", id);
        shards_submit_delete(inst, id);
        json_object_set_new(deleting, id, json_true());
        if (json_object_get(shards_tagged_body(inst), "placedAgainFrom")) continue;
        json_object_set_new(s->pending, id, json_pack("{s:O,s:I}", "instance", inst, "due",
                                                      (json_int_t)(now + replace_delay_ns())));
    }
    json_object_foreach_safe(s->pending, tmp, id, inst) {
        if ((uint64_t)json_integer_value(json_object_get(inst, "due")) > now) continue;
        place_again(s, json_object_get(inst, "instance"));
        json_object_del(s->pending, id);
    }
}
