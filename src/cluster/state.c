/* cluster/state — apply(): the only code that changes cluster State (see state.h). */
#include "cluster/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

json_t *cluster_state_new(void) {
    return json_pack("{s:{}, s:{}, s:{}, s:{}, s:{}, s:{s:[], s:[]}, s:{}, s:{}, s:{}, s:{}, s:{}, "
                     "s:{}, s:n, s:i, s:i}",
                     "instances", "runners", "downloads", "tasks", "lastSeen", "topology", "nodes",
                     "connections", "nodeIdentities", "nodeMemory", "nodeDisk", "nodeSystem",
                     "nodeNetwork", "customModelCards", "masterNodeId", "term", 0,
                     "lastEventAppliedIdx", 0);
}

void cluster_format_time(long long unix_ms, char *out, size_t n) {
    time_t secs = (time_t)(unix_ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    char buf[32];
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, n, "%s.%03lldZ", buf, unix_ms % 1000);
}

static int ignore(char *err, size_t errlen, const char *event, const char *why) {
    snprintf(err, errlen, "%s: %s", event, why);
    return -1;
}

/* A string field that names something (ids, model ids): non-empty and bounded. */
static const char *id_field(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    if (!s || !s[0] || strlen(s) > 512) return NULL;
    return s;
}

static void touch_last_seen(json_t *state, const char *node_id, long long time_ms) {
    char iso[48];
    cluster_format_time(time_ms, iso, sizeof iso);
    json_object_set_new(json_object_get(state, "lastSeen"), node_id, json_string(iso));
}

static void topology_add_node(json_t *state, const char *node_id) {
    json_t *nodes = json_object_get(json_object_get(state, "topology"), "nodes");
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n) {
        if (!strcmp(json_string_value(n), node_id)) return;
    }
    json_array_append_new(nodes, json_string(node_id));
}

/* Removes connections whose source (or, when both is set, sink) is node_id. */
static void topology_remove_edges(json_t *state, const char *node_id, int both) {
    json_t *conns = json_object_get(json_object_get(state, "topology"), "connections");
    for (size_t i = json_array_size(conns); i-- > 0;) {
        json_t *c = json_array_get(conns, i);
        const char *src = json_string_value(json_object_get(c, "source"));
        const char *sink = json_string_value(json_object_get(c, "sink"));
        if ((src && !strcmp(src, node_id)) || (both && sink && !strcmp(sink, node_id)))
            json_array_remove(conns, i);
    }
}

static int apply_node_info(json_t *state, const json_t *ev, long long time_ms, char *err,
                           size_t errlen) {
    const char *node = id_field(ev, "nodeId");
    json_t *info = json_object_get(ev, "info");
    if (!node || !json_is_object(info) || json_object_size(info) != 1)
        return ignore(err, errlen, "NodeGatheredInfo", "needs nodeId and info{Kind:{..}}");
    const char *kind = json_object_iter_key(json_object_iter(info));
    json_t *value = json_object_iter_value(json_object_iter(info));
    if (!json_is_object(value)) return ignore(err, errlen, "NodeGatheredInfo", "info is not an object");
    static const struct {
        const char *kind, *field;
    } kinds[] = {{"NodeIdentity", "nodeIdentities"}, {"MemoryUsage", "nodeMemory"},
                 {"DiskUsage", "nodeDisk"},         {"SystemInfo", "nodeSystem"},
                 {"NetworkInterfaces", "nodeNetwork"}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(kind, kinds[i].kind)) continue;
        json_object_set_new(json_object_get(state, kinds[i].field), node, json_deep_copy(value));
        topology_add_node(state, node);
        touch_last_seen(state, node, time_ms);
        return 0;
    }
    return ignore(err, errlen, "NodeGatheredInfo", "unknown info kind");
}

static int apply_edges(json_t *state, const json_t *ev, long long time_ms, char *err,
                       size_t errlen) {
    const char *src = id_field(ev, "source");
    json_t *edges = json_object_get(ev, "edges");
    if (!src || !json_is_array(edges))
        return ignore(err, errlen, "TopologyEdgesMeasured", "needs source and edges[]");
    size_t i;
    json_t *e;
    json_array_foreach(edges, i, e) {
        if (!id_field(e, "sink") || !json_is_number(json_object_get(e, "latencyMs")))
            return ignore(err, errlen, "TopologyEdgesMeasured", "an edge needs sink and latencyMs");
    }
    topology_remove_edges(state, src, 0);
    json_t *conns = json_object_get(json_object_get(state, "topology"), "connections");
    json_array_foreach(edges, i, e) {
        json_t *c = json_deep_copy(e);
        json_object_set_new(c, "source", json_string(src));
        json_array_append_new(conns, c);
    }
    topology_add_node(state, src);
    touch_last_seen(state, src, time_ms);
    return 0;
}

static int apply_node_timed_out(json_t *state, const json_t *ev, char *err, size_t errlen) {
    const char *node = id_field(ev, "nodeId");
    if (!node) return ignore(err, errlen, "NodeTimedOut", "needs nodeId");
    char *id = strdup(node); /* ev may alias state values; keep our own copy */
    json_t *nodes = json_object_get(json_object_get(state, "topology"), "nodes");
    for (size_t i = json_array_size(nodes); i-- > 0;)
        if (!strcmp(json_string_value(json_array_get(nodes, i)), id)) json_array_remove(nodes, i);
    topology_remove_edges(state, id, 1);
    static const char *per_node[] = {"nodeIdentities", "nodeMemory", "nodeDisk", "nodeSystem",
                                     "nodeNetwork",    "downloads",  "lastSeen"};
    for (size_t i = 0; i < sizeof per_node / sizeof per_node[0]; i++)
        json_object_del(json_object_get(state, per_node[i]), id);
    free(id);
    return 0;
}

/* An exo instance is a tagged union {"Kind": {"instanceId": ...}}. */
static const char *instance_id(const json_t *instance) {
    if (!json_is_object(instance) || json_object_size(instance) != 1) return NULL;
    return id_field(json_object_iter_value(json_object_iter((json_t *)instance)), "instanceId");
}

/* A key of a multi-node instance's rendezvous (the ranks' data-plane addresses), kept inside the
 * instance as rendezvous{key: value}, so it goes when the instance goes. A key for an instance
 * that is already gone changes nothing. */
static int apply_rendezvous(json_t *state, const json_t *ev, char *err, size_t errlen) {
    const char *id = id_field(ev, "instanceId"), *key = id_field(ev, "key");
    json_t *value = json_object_get(ev, "value");
    if (!id || !key || !json_is_string(value))
        return ignore(err, errlen, "InstanceRendezvousSet", "needs instanceId, key and value");
    json_t *inst = json_object_get(json_object_get(state, "instances"), id);
    if (!inst) return 0;
    json_t *body = json_object_iter_value(json_object_iter(inst));
    json_t *keys = json_object_get(body, "rendezvous");
    if (!json_is_object(keys)) {
        keys = json_object();
        json_object_set_new(body, "rendezvous", keys);
    }
    json_object_set_new(keys, key, json_deep_copy(value));
    return 0;
}

/* Download progress is a tagged union {"DownloadOngoing": {"nodeId", "modelId", ...}}. */
static int apply_download(json_t *state, const json_t *ev, char *err, size_t errlen) {
    json_t *progress = json_object_get(ev, "downloadProgress");
    if (!json_is_object(progress) || json_object_size(progress) != 1)
        return ignore(err, errlen, "NodeDownloadProgress", "needs downloadProgress{Kind:{..}}");
    json_t *inner = json_object_iter_value(json_object_iter(progress));
    const char *node = id_field(inner, "nodeId"), *model = id_field(inner, "modelId");
    if (!node || !model)
        return ignore(err, errlen, "NodeDownloadProgress", "progress needs nodeId and modelId");
    json_t *downloads = json_object_get(state, "downloads");
    json_t *list = json_object_get(downloads, node);
    if (!json_is_array(list)) {
        list = json_array();
        json_object_set_new(downloads, node, list);
    }
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *other = json_object_iter_value(json_object_iter(json_array_get(list, i)));
        if (!strcmp(json_string_value(json_object_get(other, "modelId")), model)) {
            json_array_set_new(list, i, json_deep_copy(progress));
            return 0;
        }
    }
    json_array_append_new(list, json_deep_copy(progress));
    return 0;
}

static int apply_download_deleted(json_t *state, const json_t *ev, char *err, size_t errlen) {
    const char *node = id_field(ev, "nodeId"), *model = id_field(ev, "modelId");
    if (!node || !model) return ignore(err, errlen, "DownloadDeleted", "needs nodeId and modelId");
    json_t *list = json_object_get(json_object_get(state, "downloads"), node);
    for (size_t i = json_array_size(list); i-- > 0;) {
        json_t *other = json_object_iter_value(json_object_iter(json_array_get(list, i)));
        if (!strcmp(json_string_value(json_object_get(other, "modelId")), model))
            json_array_remove(list, i);
    }
    return 0;
}

/* Events of the form {"<idKey>": id, "<valueKey>": value} stored as state[field][id] = value. */
static int apply_set(json_t *state, const json_t *ev, const char *name, const char *field,
                     const char *id_key, const char *value_key, char *err, size_t errlen) {
    const char *id = id_field(ev, id_key);
    json_t *value = json_object_get(ev, value_key);
    if (!id || !value) return ignore(err, errlen, name, "missing id or value");
    json_object_set_new(json_object_get(state, field), id, json_deep_copy(value));
    return 0;
}

static int apply_delete(json_t *state, const json_t *ev, const char *name, const char *field,
                        const char *id_key, char *err, size_t errlen) {
    const char *id = id_field(ev, id_key);
    if (!id) return ignore(err, errlen, name, "missing id");
    json_object_del(json_object_get(state, field), id);
    return 0;
}

static int apply_event(json_t *state, const char *name, const json_t *ev, const json_t *entry,
                       char *err, size_t errlen) {
    long long time_ms = json_integer_value(json_object_get(entry, "time"));
    if (!json_is_object(ev)) return ignore(err, errlen, name, "event body is not an object");
    if (!strcmp(name, "MasterElected")) {
        /* The entry itself says who ordered it and in which term. */
        json_object_set_new(state, "masterNodeId", json_deep_copy(json_object_get(entry, "master")));
        json_object_set_new(state, "term", json_deep_copy(json_object_get(entry, "term")));
        return 0;
    }
    if (!strcmp(name, "NodeGatheredInfo")) return apply_node_info(state, ev, time_ms, err, errlen);
    if (!strcmp(name, "TopologyEdgesMeasured")) return apply_edges(state, ev, time_ms, err, errlen);
    if (!strcmp(name, "NodeTimedOut")) return apply_node_timed_out(state, ev, err, errlen);
    if (!strcmp(name, "InstanceCreated")) {
        json_t *inst = json_object_get(ev, "instance");
        const char *id = instance_id(inst);
        if (!id) return ignore(err, errlen, name, "instance needs {Kind:{instanceId}}");
        json_object_set_new(json_object_get(state, "instances"), id, json_deep_copy(inst));
        return 0;
    }
    if (!strcmp(name, "InstanceRendezvousSet")) return apply_rendezvous(state, ev, err, errlen);
    if (!strcmp(name, "InstanceDeleted"))
        return apply_delete(state, ev, name, "instances", "instanceId", err, errlen);
    if (!strcmp(name, "RunnerStatusUpdated"))
        return apply_set(state, ev, name, "runners", "runnerId", "runnerStatus", err, errlen);
    if (!strcmp(name, "RunnerDeleted"))
        return apply_delete(state, ev, name, "runners", "runnerId", err, errlen);
    if (!strcmp(name, "TaskCreated"))
        return apply_set(state, ev, name, "tasks", "taskId", "task", err, errlen);
    if (!strcmp(name, "TaskStatusUpdated")) {
        const char *id = id_field(ev, "taskId");
        json_t *status = json_object_get(ev, "taskStatus");
        json_t *task = id ? json_object_get(json_object_get(state, "tasks"), id) : NULL;
        if (!status) return ignore(err, errlen, name, "needs taskId and taskStatus");
        if (!json_is_object(task)) return ignore(err, errlen, name, "no such task");
        /* A task is a tagged union; the status lives in its inner object when it has one. */
        json_t *inner = json_object_size(task) == 1 ? json_object_iter_value(json_object_iter(task))
                                                    : NULL;
        json_object_set_new(json_is_object(inner) ? inner : task, "taskStatus", json_deep_copy(status));
        return 0;
    }
    if (!strcmp(name, "TaskDeleted")) return apply_delete(state, ev, name, "tasks", "taskId", err, errlen);
    if (!strcmp(name, "NodeDownloadProgress")) return apply_download(state, ev, err, errlen);
    if (!strcmp(name, "DownloadDeleted")) return apply_download_deleted(state, ev, err, errlen);
    if (!strcmp(name, "CustomModelCardAdded")) {
        json_t *card = json_object_get(ev, "modelCard");
        const char *id = id_field(card, "modelId");
        if (!id) return ignore(err, errlen, name, "modelCard needs modelId");
        json_object_set_new(json_object_get(state, "customModelCards"), id, json_deep_copy(card));
        return 0;
    }
    if (!strcmp(name, "CustomModelCardDeleted"))
        return apply_delete(state, ev, name, "customModelCards", "modelId", err, errlen);
    return ignore(err, errlen, name, "unknown event type");
}

enum cluster_apply_result cluster_state_apply(json_t *state, const json_t *entry, char *err,
                                              size_t errlen) {
    json_int_t idx = json_integer_value(json_object_get(entry, "idx"));
    json_int_t last = json_integer_value(json_object_get(state, "lastEventAppliedIdx"));
    if (idx != last + 1) {
        snprintf(err, errlen, "entry %lld does not follow applied index %lld", (long long)idx,
                 (long long)last);
        return CLUSTER_APPLY_OUT_OF_ORDER;
    }
    json_object_set_new(state, "lastEventAppliedIdx", json_integer(idx));
    json_t *event = json_object_get(entry, "event");
    if (!json_is_object(event) || json_object_size(event) != 1) {
        snprintf(err, errlen, "event is not a tagged union {\"Name\": {...}}");
        return CLUSTER_APPLY_IGNORED;
    }
    const char *name = json_object_iter_key(json_object_iter(event));
    json_t *body = json_object_iter_value(json_object_iter(event));
    /* Every handler checks its fields before it changes anything, and stores deep copies. */
    return apply_event(state, name, body, entry, err, errlen) ? CLUSTER_APPLY_IGNORED
                                                             : CLUSTER_APPLY_OK;
}

json_t *cluster_state_lookup(json_t *state, const char *path) {
    json_t *cur = state;
    const char *p = path ? path : "";
    while (*p == '/') p++;
    while (*p && cur) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char key[1024];
        if (n >= sizeof key) return NULL;
        memcpy(key, p, n);
        key[n] = 0;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, key);
        } else if (json_is_array(cur)) {
            char *stop;
            unsigned long i = strtoul(key, &stop, 10);
            if (!n || *stop || key[0] == '-' || key[0] == '+' || key[0] == ' ') return NULL;
            cur = json_array_get(cur, i);
        } else {
            return NULL;
        }
        p += n;
        while (*p == '/') p++;
    }
    return cur;
}
