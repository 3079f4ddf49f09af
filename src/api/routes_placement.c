/* routes_placement — placement previews over HTTP (see routes_placement.h); the cluster-facing
 * work is worker/placer.c's, the decisions cluster/placement.c's. */
#include "api/routes_placement.h"

#include "worker/placer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_PREVIEW_CONTEXT 4096

static const placer_dirs *dirs_of(const routes_placement_dirs *d) { return d; }

static const char *const META_NAMES[] = {"MlxRing", "MlxJaccl"};

static json_t *preview_json(const placer_model *m, placement_sharding s, const char *meta,
                            int n_nodes, const placement_node *nodes, int n_available) {
    placement_result r;
    int rc = placement_place(&m->facts, nodes, n_available, s, n_nodes, &r);
    json_t *mem = json_object();
    for (int i = 0; i < r.n_nodes; i++)
        json_object_set_new(mem, r.node_ids[i], json_integer((json_int_t)r.memory_by_node[i]));
    return json_pack("{s:s,s:s,s:s,s:i,s:o,s:o,s:o}", "model_id", m->facts.model_id, "sharding",
                     placement_sharding_name(s), "instance_meta", meta, "min_nodes", n_nodes,
                     "instance",
                     rc == 0 ? placer_instance_json(&m->facts, s, meta, &r, NULL) : json_null(),
                     "memory_delta_by_node", rc == 0 ? mem : (json_decref(mem), json_null()),
                     "error", rc == 0 ? json_null() : json_string(r.error));
}

static int request_model(api_request *r, const routes_placement_dirs *o, placer_model *m) {
    const char *model_id = api_request_query(r, "model_id");
    char err[512];
    if (!model_id || !model_id[0]) {
        api_respond_error(r, 400, "'model_id' query parameter is required");
        return -1;
    }
    const char *ctx = api_request_query(r, "context_length");
    int want = ctx ? atoi(ctx) : DEFAULT_PREVIEW_CONTEXT;
    if (want <= 0) {
        api_respond_error(r, 400, "'context_length' must be a positive integer");
        return -1;
    }
    if (placer_model_load(dirs_of(o), model_id, want, m, err, sizeof err)) {
        api_respond_error(r, 404, "%s", err);
        return -1;
    }
    return 0;
}

/* Every sharding x instance_meta x node count, each with its per-node memory or the reason it
 * is impossible. */
static void h_previews(api_request *r, void *ctx) {
    placer_model m;
    if (request_model(r, ctx, &m)) return;
    placement_node nodes[PLACEMENT_MAX_NODES];
    int n = placer_nodes(dirs_of(ctx), m.facts.model_id, nodes, PLACEMENT_MAX_NODES);
    json_t *list = json_array();
    for (int s = PLACEMENT_PIPELINE; s <= PLACEMENT_TENSOR; s++)
        for (size_t meta = 0; meta < sizeof META_NAMES / sizeof META_NAMES[0]; meta++)
            for (int k = 1; k <= n; k++)
                json_array_append_new(list, preview_json(&m, s, META_NAMES[meta], k, nodes, n));
    placer_model_free(&m);
    api_respond_json(r, 200, json_pack("{s:o}", "previews", list));
}

/* Parses sharding, instance_meta and min_nodes (query or body): 0, or -1 after answering 400. */
int routes_placement_options(api_request *r, const char *sharding, const char *meta,
                             int min_nodes, placement_sharding *s) {
    const char *tag, *transport;
    char err[256];
    if (sharding && strcmp(sharding, "Tensor") && strcmp(sharding, "Pipeline")) {
        api_respond_error(r, 400, "'sharding' must be \"Pipeline\" or \"Tensor\"");
        return -1;
    }
    if (placer_instance_meta(meta, &tag, &transport, err, sizeof err)) {
        api_respond_error(r, 400, "%s", err);
        return -1;
    }
    if (min_nodes < 1 || min_nodes > PLACEMENT_MAX_NODES) {
        api_respond_error(r, 400, "'min_nodes' must be between 1 and %d", PLACEMENT_MAX_NODES);
        return -1;
    }
    *s = sharding && !strcmp(sharding, "Tensor") ? PLACEMENT_TENSOR : PLACEMENT_PIPELINE;
    return 0;
}

static void h_placement(api_request *r, void *ctx) {
    placer_model m;
    const char *mn = api_request_query(r, "min_nodes");
    const char *meta = api_request_query(r, "instance_meta");
    placement_sharding s;
    if (routes_placement_options(r, api_request_query(r, "sharding"), meta, mn ? atoi(mn) : 1,
                                 &s))
        return;
    if (request_model(r, ctx, &m)) return;
    placement_node nodes[PLACEMENT_MAX_NODES];
    int n = placer_nodes(dirs_of(ctx), m.facts.model_id, nodes, PLACEMENT_MAX_NODES);
    placement_result res;
    char err[512];
    if (placer_place(&m, s, mn ? atoi(mn) : 1, nodes, n, &res, err, sizeof err))
        api_respond_error(r, 400, "%s", err);
    else
        api_respond_json(r, 200, placer_instance_json(&m.facts, s, meta, &res, NULL));
    placer_model_free(&m);
}

int routes_placement_add(api_server *server, const routes_placement_dirs *dirs) {
    int failed = 0;
    failed += api_route_add(server, "GET", "/instance/previews", h_previews, (void *)dirs, 0) != 0;
    failed += api_route_add(server, "GET", "/instance/placement", h_placement, (void *)dirs, 0) != 0;
    return failed;
}
