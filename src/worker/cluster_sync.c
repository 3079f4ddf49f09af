/* cluster_sync — local instances <-> cluster State (see cluster_sync.h). */
#include "worker/cluster_sync.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/sync.h"
#include "cluster/cluster.h"
#include "worker/holdings.h"
#include "worker/shards.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct cluster_sync {
    instances *local;
    shards *shards; /* this node's ranks of multi-node instances; master fail-over */
    holdings *holdings; /* this node's whole models on disk, published in State */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    int period_ms;
    /* instance id -> {"seen": bool, "gone": bool}: what this node published */
    json_t *tracked;
    /* runner id -> last published status */
    json_t *runners;
    /* instance ids whose deletion this node (as master or owner) submitted */
    json_t *deleting;
};

static json_t *state_get(const char *path) {
    char *text = cluster_state_json(path);
    json_t *v = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    free(text);
    return v;
}

static void submit_delete(json_t *instance, const char *id) { shards_submit_delete(instance, id); }

int cluster_sync_delete_instance(const char *instance_id) {
    json_t *insts = state_get("instances");
    json_t *inst = json_object_get(insts, instance_id);
    int rc = -1;
    if (inst) {
        submit_delete(inst, instance_id);
        rc = 0;
    }
    json_decref(insts);
    return rc;
}

void cluster_sync_download_listener(const download_progress *p, void *ud) {
    (void)ud;
    const char *me = cluster_node_id();
    if (!me[0]) return;
    cluster_submit(json_pack("{s:{s:o}}", "NodeDownloadProgress", "downloadProgress",
                             download_progress_json(me, p)));
}

static int array_has(json_t *a, const char *s) {
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (json_is_string(v) && !strcmp(json_string_value(v), s)) return 1;
    }
    return 0;
}

static void tick(cluster_sync *s) {
    const char *me = cluster_node_id();
    json_t *state = me[0] ? state_get(NULL) : NULL;
    if (!state) return;
    json_t *st_insts = json_object_get(state, "instances");
    holdings_sync(s->holdings, state, me);
    shards_follow(s->shards, state, me);
    json_t *local = instances_state_json(s->local);
    json_t *l_insts = json_object_get(local, "instances");
    json_t *from_state = json_object_get(local, "fromState");
    json_t *l_runners = json_object_get(local, "runners");
    const char *id;
    json_t *v, *tmp;

    /* New local instances are published; those deleted through State are stopped here. */
    json_object_foreach(l_insts, id, v) {
        json_t *t = json_object_get(s->tracked, id);
        int in_state = json_object_get(st_insts, id) != NULL;
        if (!t && json_object_get(from_state, id)) {
            /* a rank of a State-placed instance: State has it (or has just deleted it) */
            json_object_set_new(s->tracked, id, json_pack("{s:b}", "seen", 1));
        } else if (!t) {
            cluster_submit(json_pack("{s:{s:O}}", "InstanceCreated", "instance", v));
            json_object_set_new(s->tracked, id, json_pack("{s:b}", "seen", in_state));
        } else if (in_state) {
            json_object_set_new(t, "seen", json_true());
        } else if (json_is_true(json_object_get(t, "seen"))) {
            log_info("cluster: instance %s was deleted from the cluster; stopping its runner", id);
            instances_delete(s->local, id);
        }
    }
    /* Runner statuses that changed. */
    json_object_foreach(l_runners, id, v) {
        if (json_equal(json_object_get(s->runners, id), v)) continue;
        cluster_submit(json_pack("{s:{s:s,s:O}}", "RunnerStatusUpdated", "runnerId", id,
                                 "runnerStatus", v));
        json_object_set(s->runners, id, v);
    }
    json_object_foreach_safe(s->runners, tmp, id, v) {
        if (json_object_get(l_runners, id)) continue;
        cluster_submit(json_pack("{s:{s:s}}", "RunnerDeleted", "runnerId", id));
        json_object_del(s->runners, id);
    }
    /* Instances that ended here (deleted, runner died) leave State too. */
    json_object_foreach_safe(s->tracked, tmp, id, v) {
        if (json_object_get(l_insts, id)) continue;
        json_t *inst = json_object_get(st_insts, id);
        if (inst && !json_object_get(s->deleting, id)) {
            submit_delete(inst, id);
            json_object_set_new(s->deleting, id, json_true());
        }
        json_object_del(s->tracked, id);
    }
    /* State's instances that this process does not run: stale ones of this node, and (master)
     * those on nodes that left the cluster. */
    json_t *nodes = json_object_get(json_object_get(state, "topology"), "nodes");
    int master = cluster_is_master();
    json_object_foreach(st_insts, id, v) {
        if (json_object_get(s->tracked, id) || json_object_get(s->deleting, id)) continue;
        json_t *map = shards_node_to_runner(v);
        const char *node;
        json_t *r;
        int mine = 0, lost = 0;
        json_object_foreach(map, node, r) {
            if (!strcmp(node, me)) mine = 1;
            else if (!array_has(nodes, node)) lost = 1;
        }
        if (mine && shards_is_cluster_instance(v)) {
            continue; /* its rank here is shards_follow's (started, or reported Failed) */
        } else if (mine) {
            log_info("cluster: instance %s is in State but not running here; deleting it", id);
        } else if (master && lost) {
            log_info("cluster: instance %s is on a node that left the cluster; deleting it", id);
        } else {
            continue;
        }
        submit_delete(v, id);
        json_object_set_new(s->deleting, id, json_true());
    }
    if (master) shards_fail_over(s->shards, state, s->deleting);
    json_object_foreach_safe(s->deleting, tmp, id, v) {
        if (!json_object_get(st_insts, id)) json_object_del(s->deleting, id);
    }
    json_decref(local);
    json_decref(state);
}

static void *sync_main(void *arg) {
    cluster_sync *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stop) {
        pthread_mutex_unlock(&s->lock);
        tick(s);
        pthread_mutex_lock(&s->lock);
        if (s->stop) break;
        sync_cond_wait_ms(&s->cond, &s->lock, (unsigned)s->period_ms);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Frees s and all it owns; its thread has ended or never started. */
static void free_sync(cluster_sync *s) {
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    json_decref(s->tracked);
    json_decref(s->runners);
    json_decref(s->deleting);
    shards_free(s->shards);
    holdings_free(s->holdings);
    free(s);
}

cluster_sync *cluster_sync_start(instances *local, const placer_dirs *dirs,
                                 download_manager *downloads, int api_port) {
    cluster_sync *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->local = local;
    s->shards = shards_new(local, dirs, downloads, api_port);
    s->holdings = holdings_new(dirs, downloads);
    if (!s->shards || !s->holdings) {
        shards_free(s->shards);
        holdings_free(s->holdings);
        free(s);
        return NULL;
    }
    instances_rendezvous rendezvous = shards_rendezvous(s->shards);
    instances_set_cluster_hooks(local, &rendezvous, NULL);
    const char *env = getenv("EXO_CLUSTER_SYNC_MS");
    s->period_ms = env && atoi(env) > 0 ? atoi(env) : 200;
    s->tracked = json_object();
    s->runners = json_object();
    s->deleting = json_object();
    pthread_mutex_init(&s->lock, NULL);
    sync_cond_init_monotonic(&s->cond);
    if (pthread_create(&s->thread, NULL, sync_main, s)) {
        log_error("cluster: cannot start the instance sync thread");
        free_sync(s);
        return NULL;
    }
    return s;
}

void cluster_sync_stop(cluster_sync *s) {
    if (!s) return;
    sync_set_flag_and_wake(&s->lock, &s->cond, &s->stop);
    pthread_join(s->thread, NULL);
    free_sync(s);
}
