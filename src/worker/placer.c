/* placer — placement against the cluster State (see placer.h). */
#include "worker/placer.h"

#include "cluster/cluster.h"
#include "model/cards.h"
#include "model/model_config.h"
#include "model/store.h"
#include "worker/peers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static int json_int(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : 0;
}

static int tensor_check(const void *ctx, int n, char *err, size_t errlen) {
    return model_config_tensor_split_check(ctx, n, err, errlen);
}

static int locate(const placer_dirs *d, const char *model_id, char *dir, size_t n) {
    model_store store;
    char err[256];
    return store_init(&store, d->models_dir[0] ? d->models_dir : "/nonexistent", d->models_path,
                      err, sizeof err) == 0 &&
                   store_locate(&store, model_id, dir, n) == STORE_COMPLETE
               ? 0
               : -1;
}

/* From config.json when the model is on disk. */
static int facts_from_disk(const placer_dirs *d, const char *model_id, placer_model *out) {
    placement_model *m = &out->facts;
    char dir[STORE_PATH_MAX + 64], path[STORE_PATH_MAX + 96];
    if (locate(d, model_id, dir, sizeof dir)) return -1;
    (void)path;
    size_t len;
    char *cfg_text = model_config_read_json(dir, &len, NULL, 0); /* config.json, or a GGUF's */
    json_t *cfg = cfg_text ? json_loadb(cfg_text, len, 0, NULL) : NULL;
    free(cfg_text);
    if (!cfg) return -1;
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
    out->config = calloc(1, sizeof *out->config);
    char err[256];
    if (out->config && model_config_load(dir, out->config, err, sizeof err) == 0) {
        m->tensor_check = tensor_check;
        m->tensor_check_ctx = out->config;
    } else {
        free(out->config);
        out->config = NULL;
    }
    return m->n_layers > 0 ? 0 : -1;
}

static int facts_from_card(const placer_dirs *d, const char *model_id, placement_model *m) {
    card_catalog cat;
    char custom[1100] = "";
    if (d->data_dir[0]) snprintf(custom, sizeof custom, "%s/custom_cards", d->data_dir);
    if (card_catalog_load(&cat, NULL, custom[0] ? custom : NULL)) return -1;
    const model_card *c = card_catalog_find(&cat, model_id);
    if (c) {
        m->n_layers = (int)c->n_layers;
        m->n_kv_heads = (int)c->num_key_value_heads;
        m->weight_bytes = c->storage_bytes;
        m->context_length = (int)c->context_length;
    }
    card_catalog_free(&cat);
    return m->n_layers > 0 ? 0 : -1;
}

int placer_model_load(const placer_dirs *d, const char *model_id, int context_length,
                      placer_model *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    snprintf(out->facts.model_id, sizeof out->facts.model_id, "%s", model_id);
    if (facts_from_disk(d, model_id, out) && facts_from_card(d, model_id, &out->facts)) {
        placer_model_free(out);
        snprintf(err, errlen, "unknown model '%s': not on disk and not in the model catalog",
                 model_id);
        return -1;
    }
    int have = out->facts.context_length;
    if (context_length > 0 && (have <= 0 || context_length < have))
        out->facts.context_length = context_length;
    return 0;
}

void placer_model_free(placer_model *m) {
    free(m->config);
    m->config = NULL;
}

static json_t *state_get(const char *path) {
    char *text = cluster_state_json(path);
    json_t *v = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    free(text);
    return v;
}

/* Members this node can reach now (a node that just died stays in State's topology until the
 * master times it out; a new instance must not count on it). */
static int node_alive(json_t *status, const char *id) {
    if (!strcmp(id, cluster_node_id())) return 1;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(status, "peers"), i, p) {
        const char *pid = json_string_value(json_object_get(p, "nodeId"));
        if (pid && !strcmp(pid, id)) return json_is_true(json_object_get(p, "alive"));
    }
    return 0;
}

/* The node finished downloading the whole model (State's downloads), or it is this node's on
 * disk. */
static int node_has_files(const placer_dirs *d, json_t *downloads, const char *id,
                          const char *model_id) {
    if (!strcmp(id, cluster_node_id())) {
        char dir[STORE_PATH_MAX + 64];
        return locate(d, model_id, dir, sizeof dir) == 0;
    }
    return peers_node_holds(downloads, id, model_id);
}

static int node_index(const placement_node *nodes, int n, const char *id) {
    for (int i = 0; id && i < n; i++)
        if (!strcmp(nodes[i].id, id)) return i;
    return -1;
}

/* The measured latencies between the nodes (State's topology.connections). */
static void add_links(placement_node *nodes, int n) {
    json_t *topology = state_get("topology");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(topology, "connections"), i, c) {
        int from = node_index(nodes, n, json_string_value(json_object_get(c, "source")));
        int to = node_index(nodes, n, json_string_value(json_object_get(c, "sink")));
        double ms = json_number_value(json_object_get(c, "latencyMs"));
        if (from >= 0 && to >= 0 && from != to && ms > 0) nodes[from].link_ms[to] = (float)ms;
    }
    json_decref(topology);
}

/* What the node computes on (State's nodeSystem: its device, that device's bandwidth) and, for
 * a GPU node, its GPU's free memory (nodeMemory's gpuAvailable). */
static void add_device(placement_node *node, json_t *system, json_t *memory) {
    node->bandwidth_gbs = json_number_value(json_object_get(system, "memoryBandwidthGBs"));
    json_t *gpu = json_object_get(json_object_get(memory, "gpuAvailable"), "inBytes");
    if (json_is_string(json_object_get(system, "device")) &&
        !strcmp(json_string_value(json_object_get(system, "device")), "cuda") &&
        json_is_integer(gpu))
        node->gpu_memory_available = (uint64_t)json_integer_value(gpu);
}

int placer_nodes(const placer_dirs *d, const char *model_id, placement_node *nodes, int max) {
    int n = 0;
    json_t *mem = state_get("nodeMemory"), *downloads = state_get("downloads");
    json_t *systems = state_get("nodeSystem");
    char *status_text = cluster_status_json();
    json_t *status = status_text ? json_loads(status_text, 0, NULL) : NULL;
    free(status_text);
    const char *id;
    json_t *v;
    json_object_foreach(mem, id, v) {
        if (n >= max) break;
        json_t *avail = json_object_get(json_object_get(v, "ramAvailable"), "inBytes");
        if (!json_is_integer(avail) || !node_alive(status, id)) continue;
        memset(&nodes[n], 0, sizeof nodes[n]);
        snprintf(nodes[n].id, sizeof nodes[n].id, "%s", id);
        nodes[n].memory_available = (uint64_t)json_integer_value(avail);
        nodes[n].has_files = node_has_files(d, downloads, id, model_id);
        add_device(&nodes[n], json_object_get(systems, id), v);
        n++;
    }
    json_decref(mem);
    json_decref(systems);
    json_decref(downloads);
    json_decref(status);
    add_links(nodes, n);
    if (n == 0) {
        memset(&nodes[0], 0, sizeof nodes[0]);
        snprintf(nodes[0].id, sizeof nodes[0].id, "%s",
                 cluster_node_id()[0] ? cluster_node_id() : "local");
        nodes[0].memory_available =
            (uint64_t)sysconf(_SC_AVPHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
        nodes[0].has_files = 1;
        n = 1;
    }
    return n;
}

/* exo's values, and what each one means here. RDMA (Jaccl/IBV) maps to Gloo's ibverbs transport
 * on nodes whose NIC has it; elsewhere TCP. */
static const struct {
    const char *meta, *tag, *transport;
} METAS[] = {
    {"MlxRing", "MlxRingInstance", "tcp"},   {"Ring", "MlxRingInstance", "tcp"},
    {"MlxJaccl", "MlxJacclInstance", "ibverbs"}, {"Jaccl", "MlxJacclInstance", "ibverbs"},
    {"MlxIbv", "MlxIbvInstance", "ibverbs"},  {"Ibv", "MlxIbvInstance", "ibverbs"},
};

int placer_instance_meta(const char *meta, const char **tag, const char **transport, char *err,
                         size_t errlen) {
    if (!meta) meta = "MlxRing";
    for (size_t i = 0; i < sizeof METAS / sizeof METAS[0]; i++)
        if (!strcmp(meta, METAS[i].meta)) {
            *tag = METAS[i].tag;
            *transport = METAS[i].transport;
            return 0;
        }
    size_t n = (size_t)snprintf(err, errlen, "'instance_meta' must be one of");
    for (size_t i = 0; i < sizeof METAS / sizeof METAS[0] && n < errlen; i++)
        n += (size_t)snprintf(err + n, errlen - n, "%s \"%s\"", i ? "," : "", METAS[i].meta);
    return -1;
}

static void fresh_id(char *out, size_t n) {
    unsigned char b[16] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) b[0] = 1;
    snprintf(out, n, "%02x%02x%02x%02x-%02x%02x-4%x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6] & 15, b[7], (b[8] & 0x3f) | 0x80, b[9], b[10],
             b[11], b[12], b[13], b[14], b[15]);
}

/* The first of the chosen nodes that lists no RDMA device in State's nodeNetwork, or NULL when
 * all do. */
static const char *node_without_rdma(const placement_result *r, json_t *network) {
    for (int i = 0; i < r->n_nodes; i++) {
        json_t *devs = json_object_get(json_object_get(network, r->node_ids[i]), "rdmaDevices");
        if (!json_array_size(devs)) return r->node_ids[i];
    }
    return NULL;
}

json_t *placer_instance_json(const placement_model *m, placement_sharding s, const char *meta,
                             const placement_result *r, const char *instance_id) {
    const char *tag = "MlxRingInstance", *transport = "tcp";
    char err[200], id[40], note[200] = "";
    placer_instance_meta(meta, &tag, &transport, err, sizeof err);
    if (!strcmp(transport, "ibverbs") && r->n_nodes > 1) {
        /* every rank must open the same transport: RDMA only when every node has a device */
        json_t *network = state_get("nodeNetwork");
        const char *lacking = node_without_rdma(r, network);
        if (lacking) {
            snprintf(note, sizeof note, "%s asked for RDMA; node %.12s has no RDMA device: TCP",
                     meta, lacking);
            transport = "tcp";
        }
        json_decref(network);
    }
    if (instance_id) snprintf(id, sizeof id, "%s", instance_id);
    else fresh_id(id, sizeof id);
    json_t *node_to_runner = json_object(), *runner_to_shard = json_object();
    for (int i = 0; i < r->n_nodes; i++) {
        char runner[40];
        fresh_id(runner, sizeof runner);
        json_object_set_new(node_to_runner, r->node_ids[i], json_string(runner));
        json_object_set_new(
            runner_to_shard, runner,
            json_pack("{s:{s:s,s:i,s:i,s:i,s:i,s:i}}",
                      s == PLACEMENT_TENSOR ? "TensorShardMetadata" : "PipelineShardMetadata",
                      "modelId", m->model_id, "deviceRank", i, "worldSize", r->n_nodes,
                      "startLayer", r->layer_start[i], "endLayer", r->layer_end[i], "nLayers",
                      m->n_layers));
    }
    json_t *inst = json_pack("{s:{s:s,s:{s:s,s:o,s:o},s:s,s:s}}", tag, "instanceId", id,
                             "shardAssignments", "modelId", m->model_id, "runnerToShard",
                             runner_to_shard, "nodeToRunner", node_to_runner, "sharding",
                             placement_sharding_name(s), "transport", transport);
    if (note[0]) json_object_set_new(json_object_iter_value(json_object_iter(inst)), "transportNote",
                                     json_string(note));
    return inst;
}

int placer_place(const placer_model *m, placement_sharding s, int min_nodes,
                 const placement_node *nodes, int n_nodes, placement_result *out, char *err,
                 size_t errlen) {
    if (min_nodes < 1) min_nodes = 1;
    char first[256] = "";
    for (int k = min_nodes; k <= (n_nodes > min_nodes ? n_nodes : min_nodes); k++) {
        if (placement_place(&m->facts, nodes, n_nodes, s, k, out) == 0) return 0;
        if (!first[0]) snprintf(first, sizeof first, "%s", out->error);
    }
    snprintf(err, errlen, "no %s placement of %s on %d or more nodes: %s",
             placement_sharding_name(s), m->facts.model_id, min_nodes, first);
    return -1;
}
