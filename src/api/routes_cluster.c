/* routes_cluster — HTTP handlers for the cluster's State and log (see routes_cluster.h). */
#include "api/routes_cluster.h"

#include "cluster/cluster.h"
#include "cluster/state.h"

#include <stdlib.h>
#include <string.h>

static void h_state(api_request *r, void *ctx) {
    json_t *state = worker_state_json(ctx);
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
    worker *w = ctx;
    const char *id = api_request_param(r, "id");
    json_t *j = instances_get_json(worker_instances(w), id);
    if (!j) {
        json_t *state = worker_state_json(w);
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
    if (worker_delete_instance(ctx, id)) {
        api_respond_error(r, 404, "no instance with id %s", id);
        return;
    }
    api_respond_json(r, 200, json_pack("{s:s,s:s}", "message", "Command received.",
                                       "instance_id", id));
}

int routes_cluster_add(api_server *server, worker *w) {
    int failed = 0;
    failed += api_route_add(server, "GET", "/state", h_state, w, 0) != 0;
    failed += api_route_add(server, "GET", "/state/{path...}", h_state, w, 0) != 0;
    failed += api_route_add(server, "GET", "/instance/{id}", h_get_instance, w, 0) != 0;
    failed += api_route_add(server, "DELETE", "/instance/{id}", h_delete_instance, w, 0) != 0;
    failed += api_route_add(server, "GET", "/events", h_events, NULL, 0) != 0;
    failed += api_route_add(server, "GET", "/cluster/status", h_status, NULL, 0) != 0;
    return failed;
}
