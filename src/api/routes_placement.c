/* routes_placement — placement previews over HTTP (see routes_placement.h). */
#include "api/routes_placement.h"

#include "base/paths.h"
#include "cluster/cluster.h"
#include "cluster/placement.h"
#include "model/cards.h"
#include "model/store.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_PREVIEW_CONTEXT 4096

static int json_int(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : 0;
}

/* What we know of a model: its config.json when it is on disk, else its card. */
static int model_facts(const routes_placement_dirs *o, const char *model_id, placement_model *m, char *err,
                       size_t errlen) {
    memset(m, 0, sizeof *m);
    snprintf(m->model_id, sizeof m->model_id, "%s", model_id);
    model_store store;
    char dir[STORE_PATH_MAX + 64];
    if (store_init(&store, o->models_dir, o->models_path, err, errlen) == 0 &&
        store_locate(&store, model_id, dir, sizeof dir) == STORE_COMPLETE) {
        char path[STORE_PATH_MAX + 96];
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_error_t je;
        json_t *cfg = json_load_file(path, 0, &je);
        if (cfg) {
            json_t *text = json_object_get(cfg, "text_config"); /* multimodal configs nest it */
            const json_t *c = json_is_object(text) ? text : cfg;
            m->n_layers = json_int(c, "num_hidden_layers");
            m->n_heads = json_int(c, "num_attention_heads");
            m->n_kv_heads = json_int(c, "num_key_value_heads");
            if (!m->n_kv_heads) m->n_kv_heads = m->n_heads;
            m->head_dim = json_int(c, "head_dim");
            if (!m->head_dim && m->n_heads) m->head_dim = json_int(c, "hidden_size") / m->n_heads;
            m->context_length = json_int(c, "max_position_embeddings");
            json_decref(cfg);
            m->weight_bytes = store_dir_bytes(dir);
            if (m->n_layers > 0) return 0;
        }
    }
    card_catalog cat;
    char custom[1100] = "";
    if (o->data_dir[0]) snprintf(custom, sizeof custom, "%s/custom_cards", o->data_dir);
    if (card_catalog_load(&cat, NULL, custom[0] ? custom : NULL) == 0) {
        const model_card *c = card_catalog_find(&cat, model_id);
        if (c) {
            m->n_layers = (int)c->n_layers;
            m->n_kv_heads = (int)c->num_key_value_heads;
            m->weight_bytes = c->storage_bytes;
            m->context_length = (int)c->context_length;
        }
        card_catalog_free(&cat);
        if (m->n_layers > 0) return 0;
    }
    snprintf(err, errlen, "unknown model '%s': not on disk and not in the model catalog", model_id);
    return -1;
}

/* Free memory per node from cluster State, or this machine alone without a cluster. */
static int cluster_nodes(placement_node *nodes, int max) {
    int n = 0;
    char *text = cluster_state_json("nodeMemory");
    json_t *mem = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    const char *id;
    json_t *v;
    json_object_foreach(mem, id, v) {
        if (n >= max) break;
        json_t *avail = json_object_get(json_object_get(v, "ramAvailable"), "inBytes");
        if (!json_is_integer(avail)) continue;
        snprintf(nodes[n].id, sizeof nodes[n].id, "%s", id);
        nodes[n].memory_available = (uint64_t)json_integer_value(avail);
        n++;
    }
    json_decref(mem);
    if (n == 0) {
        snprintf(nodes[0].id, sizeof nodes[0].id, "%s", cluster_node_id()[0] ? cluster_node_id() : "local");
        nodes[0].memory_available = (uint64_t)sysconf(_SC_AVPHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
        n = 1;
    }
    return n;
}

/* exo's tagged instance shape, so clients that read shardAssignments work unchanged. */
static json_t *instance_json(const placement_model *m, placement_sharding s, const placement_result *r) {
    json_t *node_to_runner = json_object(), *runner_to_shard = json_object();
    for (int i = 0; i < r->n_nodes; i++) {
        char runner[32];
        snprintf(runner, sizeof runner, "runner-%d", i);
        json_object_set_new(node_to_runner, r->node_ids[i], json_string(runner));
        json_object_set_new(runner_to_shard, runner,
                            json_pack("{s:{s:s,s:i,s:i,s:i,s:i,s:i}}",
                                      s == PLACEMENT_TENSOR ? "TensorShardMetadata" : "PipelineShardMetadata",
                                      "modelId", m->model_id, "deviceRank", i, "worldSize", r->n_nodes,
                                      "startLayer", r->layer_start[i], "endLayer", r->layer_end[i],
                                      "nLayers", m->n_layers));
    }
    return json_pack("{s:{s:{s:s,s:o,s:o}}}", s == PLACEMENT_TENSOR ? "TensorInstance" : "PipelineInstance",
                     "shardAssignments", "modelId", m->model_id, "nodeToRunner", node_to_runner,
                     "runnerToShard", runner_to_shard);
}

static json_t *preview_json(const placement_model *m, placement_sharding s, int n_nodes,
                            const placement_node *nodes, int n_available) {
    placement_result r;
    int rc = placement_place(m, nodes, n_available, s, n_nodes, &r);
    json_t *mem = json_object();
    for (int i = 0; i < r.n_nodes; i++)
        json_object_set_new(mem, r.node_ids[i], json_integer((json_int_t)r.memory_by_node[i]));
    return json_pack("{s:s,s:s,s:s,s:i,s:o,s:o,s:o}", "model_id", m->model_id, "sharding",
                     placement_sharding_name(s), "instance_meta", "Ring", "min_nodes", n_nodes,
                     "instance", rc == 0 ? instance_json(m, s, &r) : json_null(),
                     "memory_delta_by_node", rc == 0 ? mem : (json_decref(mem), json_null()),
                     "error", rc == 0 ? json_null() : json_string(r.error));
}

static int request_model(api_request *r, const routes_placement_dirs *o, placement_model *m) {
    const char *model_id = api_request_query(r, "model_id");
    char err[512];
    if (!model_id || !model_id[0]) {
        api_respond_error(r, 400, "'model_id' query parameter is required");
        return -1;
    }
    if (model_facts(o, model_id, m, err, sizeof err)) {
        api_respond_error(r, 404, "%s", err);
        return -1;
    }
    const char *ctx = api_request_query(r, "context_length");
    int want = ctx ? atoi(ctx) : DEFAULT_PREVIEW_CONTEXT;
    if (want <= 0) {
        api_respond_error(r, 400, "'context_length' must be a positive integer");
        return -1;
    }
    if (m->context_length <= 0 || want < m->context_length) m->context_length = want;
    return 0;
}

static void h_previews(api_request *r, void *ctx) {
    placement_model m;
    if (request_model(r, ctx, &m)) return;
    placement_node nodes[PLACEMENT_MAX_NODES];
    int n = cluster_nodes(nodes, PLACEMENT_MAX_NODES);
    json_t *list = json_array();
    for (int s = PLACEMENT_PIPELINE; s <= PLACEMENT_TENSOR; s++)
        for (int k = 1; k <= n; k++) json_array_append_new(list, preview_json(&m, s, k, nodes, n));
    api_respond_json(r, 200, json_pack("{s:o}", "previews", list));
}

static void h_placement(api_request *r, void *ctx) {
    placement_model m;
    if (request_model(r, ctx, &m)) return;
    const char *sh = api_request_query(r, "sharding");
    placement_sharding s = sh && !strcmp(sh, "Tensor") ? PLACEMENT_TENSOR : PLACEMENT_PIPELINE;
    if (sh && strcmp(sh, "Tensor") && strcmp(sh, "Pipeline")) {
        api_respond_error(r, 400, "'sharding' must be \"Pipeline\" or \"Tensor\"");
        return;
    }
    const char *mn = api_request_query(r, "min_nodes");
    int min_nodes = mn ? atoi(mn) : 1;
    if (min_nodes < 1) min_nodes = 1;
    placement_node nodes[PLACEMENT_MAX_NODES];
    int n = cluster_nodes(nodes, PLACEMENT_MAX_NODES);
    placement_result res;
    char first_error[256] = "";
    for (int k = min_nodes; k <= (n > min_nodes ? n : min_nodes); k++) {
        if (placement_place(&m, nodes, n, s, k, &res) == 0) {
            api_respond_json(r, 200, instance_json(&m, s, &res));
            return;
        }
        if (!first_error[0]) snprintf(first_error, sizeof first_error, "%s", res.error);
    }
    api_respond_error(r, 400, "no placement for %s: %s", m.model_id, first_error);
}

int routes_placement_add(api_server *server, const routes_placement_dirs *dirs) {
    int failed = 0;
    failed += api_route_add(server, "GET", "/instance/previews", h_previews, (void *)dirs, 0) != 0;
    failed += api_route_add(server, "GET", "/instance/placement", h_placement, (void *)dirs, 0) != 0;
    return failed;
}
