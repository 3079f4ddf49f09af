/* cluster_routes — HTTP handlers for the cluster's State and log (see cluster_routes.h). */
#include "cluster_routes.h"

#include "cluster/cluster.h"
#include "cluster/state.h"
#include "cluster_sync.h"

#include <stdlib.h>
#include <string.h>

/* The cluster State; instances and runners reach it as events (cluster_sync.c). Without a
 * running cluster, an empty State with this node's own instances and runners folded in. */
static json_t *merged_state(instances *local) {
    char *text = cluster_state_json(NULL);
    json_t *state = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    if (state) {
        /* This node's own runners: the live status (the same value is on its way through the
         * log), so a client that just saw a generation end never reads an older status. */
        json_t *mine = local ? instances_state_json(local) : NULL;
        json_t *runners = json_object_get(state, "runners");
        const char *key;
        json_t *value;
        json_object_foreach(json_object_get(mine, "runners"), key, value) {
            if (json_object_get(runners, key)) json_object_set(runners, key, value);
        }
        json_decref(mine);
        return state;
    }
    state = cluster_state_new();
    json_t *mine = local ? instances_state_json(local) : NULL;
    static const char *fields[] = {"instances", "runners"};
    for (size_t i = 0; mine && i < 2; i++) {
        json_t *dst = json_object_get(state, fields[i]);
        const char *key;
        json_t *value;
        json_object_foreach(json_object_get(mine, fields[i]), key, value) {
            if (!json_object_get(dst, key)) json_object_set(dst, key, value);
        }
    }
    json_decref(mine);
    return state;
}

static void h_state(api_request *r, void *ctx) {
    json_t *state = merged_state(ctx);
    const char *path = api_request_param(r, "path");
    json_t *value = cluster_state_lookup(state, path ? path : "");
    if (!value) {
        api_respond_error(r, 404, "'%s' is not in the cluster state", path ? path : "");
    } else {
        api_respond_json(r, 200, json_incref(value));
    }
    json_decref(state);
}

static void respond_text(api_request *r, char *text) {
    if (!text) {
        api_respond_error(r, 503, "the cluster is not running on this node (see its log)");
        return;
    }
    api_respond_bytes(r, 200, "application/json", text, strlen(text));
    free(text);
}

static void h_events(api_request *r, void *ctx) {
    (void)ctx;
    const char *since = api_request_query(r, "since");
    char *end = NULL;
    unsigned long long n = since ? strtoull(since, &end, 10) : 0;
    if (since && (!*since || *end)) {
        api_respond_error(r, 400, "'since' must be a log index (a non-negative integer)");
        return;
    }
    /* Streamed page by page, so a long log never sits in memory whole. */
    if (!cluster_node_id()[0]) {
        api_respond_error(r, 503, "the cluster is not running on this node (see its log)");
        return;
    }
    api_stream *out = api_respond_stream(r, 200, "application/json");
    api_stream_write(out, "[", 1);
    uint64_t at = n, last = 0;
    int wrote = 0;
    for (;;) {
        char *page = cluster_events_page(at, 500, &last);
        if (!page) break;
        if (wrote) api_stream_write(out, ",", 1);
        int gone = api_stream_write(out, page, strlen(page));
        free(page);
        wrote = 1;
        at = last;
        if (gone) break;
    }
    api_stream_write(out, "]", 1);
    api_stream_close(out);
}

static void h_status(api_request *r, void *ctx) {
    (void)ctx;
    respond_text(r, cluster_status_json());
}

/* GET /instance/{id}: this node's own instances first, then any node's from State. */
static void h_get_instance(api_request *r, void *ctx) {
    const char *id = api_request_param(r, "id");
    json_t *j = ctx ? instances_get_json(ctx, id) : NULL;
    if (!j) {
        json_t *state = merged_state(ctx);
        j = json_incref(json_object_get(json_object_get(state, "instances"), id));
        json_decref(state);
    }
    if (!j) api_respond_error(r, 404, "no instance with id %s", id);
    else api_respond_json(r, 200, j);
}

/* DELETE /instance/{id}: stops a local runner at once; an instance of another node is deleted
 * from State, and its node stops the runner when it sees that. */
static void h_delete_instance(api_request *r, void *ctx) {
    const char *id = api_request_param(r, "id");
    int local = ctx && instances_delete(ctx, id) == 0;
    if (!local && cluster_sync_delete_instance(id)) {
        api_respond_error(r, 404, "no instance with id %s", id);
        return;
    }
    api_respond_json(r, 200, json_pack("{s:s,s:s}", "message", "Command received.",
                                       "instance_id", id));
}

void cluster_routes_add(api_server *server, instances *local) {
    api_route_add(server, "GET", "/state", h_state, local, 0);
    api_route_add(server, "GET", "/state/{path...}", h_state, local, 0);
    api_route_add(server, "GET", "/instance/{id}", h_get_instance, local, 0);
    api_route_add(server, "DELETE", "/instance/{id}", h_delete_instance, local, 0);
    api_route_add(server, "GET", "/events", h_events, NULL, 0);
    api_route_add(server, "GET", "/cluster/status", h_status, NULL, 0);
}
