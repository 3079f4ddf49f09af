/* api — the service: builds the server and the whole route table (see api.h). The exo, Ollama
 * and generation routes live here (generation goes through gen_handle); the cluster's
 * (routes_cluster.c), placement previews' (routes_placement.c) and the model store's and
 * downloads' (routes_models.c) beside it. */
#include "api/api.h"

#include "api/gen.h"
#include "api/metrics.h"
#include "api/routes_cluster.h"
#include "api/routes_internal.h"
#include "api/routes_models.h"
#include "api/routes_placement.h"
#include "api/server.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/paths.h"
#include "cluster/cluster.h"
#include "model/model_config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

struct api_service {
    api_server *server;
    worker *worker;
    instances *instances;
    gen_context gen;
    routes_placement_dirs placement_dirs;
    char node_id[128];
};

/* ------------------------------------------------------------------ exo routes */

static void h_node_id(api_request *r, void *ctx) {
    api_service *s = ctx;
    api_respond_json(r, 200, json_string(s->node_id));
}

static void h_health(api_request *r, void *ctx) {
    api_service *s = ctx;
    api_respond_json(r, 200, json_pack("{s:s,s:s,s:i}", "status", "ok", "node_id", s->node_id,
                                       "generations_in_flight",
                                       instances_in_flight(s->instances)));
}

static void h_metrics(api_request *r, void *ctx) {
    api_service *s = ctx;
    strbuf out = {0};
    metrics_render(&out, instances_in_flight(s->instances),
                   api_server_open_connections(s->server),
                   api_server_request_timeouts(s->server));
    instances_render_metrics(s->instances, &out);
    api_respond_bytes(r, 200, "text/plain; version=0.0.4; charset=utf-8", out.data, out.len);
    strbuf_free(&out);
}

static void place(api_request *r, api_service *s, const char *requested) {
    char id[64], err[1024], model_id[512];
    int status = instances_canonical_model(s->instances, requested, model_id, sizeof model_id,
                                           err, sizeof err)
                     ? 404
                     : instances_place(s->instances, model_id, id, sizeof id, err, sizeof err);
    if (status) {
        api_respond_error(r, status, "%s", err);
        return;
    }
    char cmd[64];
    gen_make_id(cmd, sizeof cmd, "");
    api_respond_json(r, 200, json_pack("{s:s,s:s,s:s,s:s}", "message", "Command received.",
                                       "command_id", cmd, "instance_id", id, "model_id",
                                       model_id));
}

/* POST /place_instance: placed now when the model is on disk; a catalog model is downloaded
 * first (peers, then the Hub) and placed when complete ("downloading": true). */
static void command_id(char *out, size_t n) {
    unsigned char b[8] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) b[0] = 1;
    snprintf(out, n, "%02x%02x%02x%02x-%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6],
             b[7]);
}

/* A placement on several nodes (or on one other node) becomes one instance in the cluster
 * State; every node's worker starts its rank when it sees it. Returns 0 (answered) or -1 when
 * this node alone should place it the single-node way (answered nothing). */
static int place_in_cluster(api_request *r, api_service *s, const char *model,
                            placement_sharding sharding, const char *meta, int min_nodes) {
    placer_model m;
    char err[1024];
    const placer_dirs *dirs = worker_placer_dirs(s->worker);
    if (placer_model_load(dirs, model, 0, &m, err, sizeof err)) return -1; /* 404 or download */
    /* Not on this node's disk: one node downloads it first (the single-node path, unchanged);
     * a multi-node instance needs the files on its nodes already (no shard downloads yet). */
    if (!m.config && min_nodes == 1) {
        placer_model_free(&m);
        return -1;
    }
    placement_node nodes[PLACEMENT_MAX_NODES];
    int n = placer_nodes(dirs, model, nodes, PLACEMENT_MAX_NODES);
    placement_result res;
    int rc = -1;
    /* One node that fits here: this node's own instance, exactly as without a cluster. */
    for (int i = 0; i < n && min_nodes == 1; i++)
        if (!strcmp(nodes[i].id, s->node_id) &&
            placement_place(&m.facts, &nodes[i], 1, sharding, 1, &res) == 0)
            goto out;
    if (placer_place(&m, sharding, min_nodes, nodes, n, &res, err, sizeof err)) {
        api_respond_error(r, 400, "%s", err);
        rc = 0;
        goto out;
    }
    if (res.n_nodes == 1 && !strcmp(res.node_ids[0], s->node_id)) goto out;
    json_t *instance = placer_instance_json(&m.facts, sharding, meta, &res, NULL);
    const char *id = json_string_value(
        json_object_get(json_object_iter_value(json_object_iter(instance)), "instanceId"));
    char instance_id[64], cmd[32];
    snprintf(instance_id, sizeof instance_id, "%s", id);
    if (cluster_submit(json_pack("{s:{s:o}}", "InstanceCreated", "instance", instance))) {
        api_respond_error(r, 503, "the cluster is not running on this node: cannot place %s on "
                                  "%d nodes", model, res.n_nodes);
    } else {
        command_id(cmd, sizeof cmd);
        api_respond_json(r, 200, json_pack("{s:s,s:s,s:s,s:s,s:i}", "message",
                                           "Command received.", "command_id", cmd, "model_id",
                                           model, "instance_id", instance_id, "n_nodes",
                                           res.n_nodes));
    }
    rc = 0;
out:
    placer_model_free(&m);
    return rc;
}

static void h_place_instance(api_request *r, void *ctx) {
    api_service *s = ctx;
    json_t *b = api_request_json(r);
    if (!b) return;
    const char *requested = json_string_value(json_object_get(b, "model_id"));
    const char *sh = json_string_value(json_object_get(b, "sharding"));
    const char *meta = json_string_value(json_object_get(b, "instance_meta"));
    json_t *mn = json_object_get(b, "min_nodes");
    char id[64], err[1024], cmd[32], model[512];
    int status;
    placement_sharding sharding;
    if (!requested) {
        api_respond_error(r, 400, "'model_id' is required and must be a string");
    } else if (instances_canonical_model(s->instances, requested, model, sizeof model, err,
                                         sizeof err)) {
        api_respond_error(r, 404, "%s", err);
    } else if (mn && !json_is_integer(mn)) {
        api_respond_error(r, 400, "'min_nodes' must be an integer");
    } else if (routes_placement_options(r, sh, meta, mn ? (int)json_integer_value(mn) : 1,
                                        &sharding)) {
        /* answered */
    } else if (place_in_cluster(r, s, model, sharding, meta,
                                mn ? (int)json_integer_value(mn) : 1) == 0) {
        /* answered */
    } else if ((status = worker_place(s->worker, model, id, sizeof id, err, sizeof err))) {
        api_respond_error(r, status, "%s", err);
    } else {
        command_id(cmd, sizeof cmd);
        json_t *body = json_pack("{s:s,s:s,s:s}", "message", "Command received.", "command_id",
                                 cmd, "model_id", model);
        if (id[0]) json_object_set_new(body, "instance_id", json_string(id));
        else json_object_set_new(body, "downloading", json_true());
        api_respond_json(r, 200, body);
    }
    json_decref(b);
}

static void h_create_instance(api_request *r, void *ctx) {
    json_t *b = api_request_json(r);
    if (!b) return;
    json_t *inst = json_object_get(b, "instance");
    const char *model = json_string_value(json_object_get(b, "model_id"));
    if (!model && json_is_object(inst)) {
        /* a tagged instance: {"Tag": {"shardAssignments": {"modelId": ...}}} */
        const char *k;
        json_t *v;
        json_object_foreach(inst, k, v) {
            const char *mid =
                json_string_value(json_object_get(json_object_get(v, "shardAssignments"), "modelId"));
            if (mid) model = mid;
        }
    }
    if (!model) api_respond_error(r, 400, "'instance' must name a model (shardAssignments.modelId)");
    else place(r, ctx, model);
    json_decref(b);
}

static void h_cancel(api_request *r, void *ctx) {
    (void)ctx;
    const char *id = api_request_param(r, "id");
    if (gen_cancel(id)) {
        api_respond_error(r, 404, "no active generation with id %s", id);
        return;
    }
    api_respond_json(r, 200, json_pack("{s:s,s:s}", "message", "Command received.",
                                       "command_id", id));
}

/* ------------------------------------------------------------------ generation routes */

#define GEN_ROUTE(fn, adapter, bench)                                                       \
    static void fn(api_request *r, void *ctx) {                                             \
        gen_handle(r, &adapter, &((api_service *)ctx)->gen, bench);                         \
    }
GEN_ROUTE(h_chat, gen_adapter_openai_chat, 0)
GEN_ROUTE(h_bench_chat, gen_adapter_openai_chat, 1)
GEN_ROUTE(h_completions, gen_adapter_openai_completions, 0)
GEN_ROUTE(h_responses, gen_adapter_responses, 0)
GEN_ROUTE(h_messages, gen_adapter_claude, 0)
GEN_ROUTE(h_ollama_chat, gen_adapter_ollama_chat, 0)
GEN_ROUTE(h_ollama_generate, gen_adapter_ollama_generate, 0)

/* ------------------------------------------------------------------ ollama model info */

/* Ollama's "details" of a model, from its files (model_details_read); *size gets their bytes. */
static json_t *ollama_details(const char *dir, json_int_t *size) {
    model_details d;
    if (!dir || model_details_read(dir, &d)) memset(&d, 0, sizeof d);
    if (size) *size = (json_int_t)d.size;
    json_t *families = json_array();
    if (d.family[0]) json_array_append_new(families, json_string(d.family));
    return json_pack("{s:s,s:s,s:s,s:o,s:s,s:s}", "parent_model", "", "format",
                     d.format[0] ? d.format : "safetensors", "family", d.family, "families", families,
                     "parameter_size", d.parameter_size, "quantization_level", d.quantization);
}

static json_t *ollama_model(api_service *s, const char *id) {
    char dir[1024];
    int found = instances_resolve_model(s->instances, id, dir, sizeof dir) == 0;
    json_int_t size = 0;
    json_t *details = ollama_details(found ? dir : NULL, &size);
    return json_pack("{s:s,s:s,s:s,s:I,s:s,s:o}", "name", id, "model", id, "modified_at",
                     "1970-01-01T00:00:00Z", "size", size, "digest", "", "details", details);
}

static void h_ollama_root(api_request *r, void *ctx) {
    (void)ctx;
    api_respond_bytes(r, 200, "text/plain; charset=utf-8", "Ollama is running", 17);
}

static void h_ollama_version(api_request *r, void *ctx) {
    (void)ctx;
    api_respond_json(r, 200, json_pack("{s:s}", "version", "0.6.4"));
}

/* {"models": [...]} for /api/tags (on disk) and /api/ps (loaded: with Ollama's residency fields,
 * a model stays loaded until its instance is deleted). Takes the reference to ids. */
static void respond_ollama_models(api_request *r, api_service *s, json_t *ids, int loaded) {
    json_t *models = json_array();
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v) {
        json_t *m = ollama_model(s, json_string_value(v));
        if (loaded) {
            json_object_set_new(m, "expires_at", json_string("2999-01-01T00:00:00Z"));
            json_object_set_new(m, "size_vram", json_integer(0));
        }
        json_array_append_new(models, m);
    }
    json_decref(ids);
    api_respond_json(r, 200, json_pack("{s:o}", "models", models));
}

static void h_ollama_tags(api_request *r, void *ctx) {
    api_service *s = ctx;
    respond_ollama_models(r, s, instances_local_models(s->instances), 0);
}

static void h_ollama_ps(api_request *r, void *ctx) {
    api_service *s = ctx;
    respond_ollama_models(r, s, instances_running_models(s->instances), 1);
}

static void h_ollama_show(api_request *r, void *ctx) {
    api_service *s = ctx;
    json_t *b = api_request_json_quiet(r, (char[256]){0}, 256);
    const char *model = json_string_value(json_object_get(b, "model"));
    if (!model) model = json_string_value(json_object_get(b, "name"));
    char dir[1024];
    if (!model) {
        api_respond_json(r, 400, json_pack("{s:s}", "error", "'model' is required"));
    } else if (instances_resolve_model(s->instances, model, dir, sizeof dir)) {
        api_respond_json(r, 404, json_pack("{s:s}", "error", "model not found"));
    } else {
        size_t len;
        char *text = model_config_read_json(dir, &len, NULL, 0); /* config.json, or a GGUF's */
        json_t *config = text ? json_loadb(text, len, 0, NULL) : NULL;
        free(text);
        api_respond_json(r, 200, json_pack("{s:s,s:s,s:s,s:o,s:o,s:[s]}", "modelfile", "",
                                           "parameters", "", "template", "", "details",
                                           ollama_details(dir, NULL), "model_info",
                                           config ? config : json_object(), "capabilities",
                                           "completion"));
    }
    json_decref(b);
}

/* ------------------------------------------------------------------ service */

/* The worker's download-then-place as the generation path's model fetcher (gen.h). */
static int fetch_start(void *ud, const char *model_id, char *err, size_t errlen) {
    return worker_download_start(ud, model_id, err, errlen);
}

static int fetch_poll(void *ud, const char *model_id, json_t **progress, char *err, size_t errlen) {
    return worker_download_poll(ud, model_id, progress, err, errlen);
}

/* Every route of the node; each api_route_add that fails (a route registered twice, a bad
 * pattern) has logged why and counts here. */
static int add_routes(api_service *s, models_service *models) {
    api_server *sv = s->server;
    int failed = 0;
#define ROUTE(method, pattern, handler, flags)                                                     \
    failed += api_route_add(sv, method, pattern, handler, s, flags) != 0
    ROUTE("GET", "/node_id", h_node_id, API_ROUTE_PUBLIC);
    ROUTE("GET", "/health", h_health, API_ROUTE_PUBLIC);
    ROUTE("GET", "/metrics", h_metrics, 0);
    ROUTE("POST", "/place_instance", h_place_instance, 0);
    ROUTE("POST", "/instance", h_create_instance, 0);
    ROUTE("POST", "/v1/cancel/{id}", h_cancel, 0);
    ROUTE("POST", "/v1/chat/completions", h_chat, 0);
    ROUTE("POST", "/bench/chat/completions", h_bench_chat, 0);
    ROUTE("POST", "/v1/completions", h_completions, 0);
    ROUTE("POST", "/v1/responses", h_responses, 0);
    ROUTE("POST", "/v1/messages", h_messages, 0);
    ROUTE("POST", "/ollama/api/chat", h_ollama_chat, 0);
    ROUTE("POST", "/ollama/api/generate", h_ollama_generate, 0);
    ROUTE("GET", "/ollama", h_ollama_root, 0);
    ROUTE("GET", "/ollama/api/version", h_ollama_version, 0);
    ROUTE("GET", "/ollama/api/tags", h_ollama_tags, 0);
    ROUTE("GET", "/ollama/api/ps", h_ollama_ps, 0);
    ROUTE("POST", "/ollama/api/show", h_ollama_show, 0);
#undef ROUTE
    /* /state, /events, /cluster/status, GET and DELETE /instance/{id} */
    failed += routes_cluster_add(sv, s->worker);
    /* GET /instance/previews, /instance/placement */
    failed += routes_placement_add(sv, &s->placement_dirs);
    /* POST /internal/generate: generations other nodes forward to this node's rank 0 */
    failed += routes_internal_add(sv, s->instances);
    /* /models, /v1/models, /models/..., /download/... and the peer file transfer */
    failed += routes_models_add(sv, models);
    return failed;
}

static void copy_dir(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src ? src : ""); }

api_service *api_service_new(const api_config *c, const char *node_id, worker *worker,
                             models_service *models, char *err, size_t errlen) {
    api_service *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(s->node_id, sizeof s->node_id, "%s", node_id);
    s->worker = worker;
    s->instances = worker_instances(worker);
    s->gen.instances = s->instances;
    s->gen.fetcher = (api_model_fetcher){.start = fetch_start, .poll = fetch_poll, .ud = worker};
    copy_dir(s->placement_dirs.models_dir, sizeof s->placement_dirs.models_dir, c->models_dir);
    copy_dir(s->placement_dirs.models_path, sizeof s->placement_dirs.models_path, c->models_path);
    copy_dir(s->placement_dirs.data_dir, sizeof s->placement_dirs.data_dir, c->data_dir);

    /* web/ next to the binary's repository (build/exo -> ../web), or $EXO_WEB_DIR. */
    char web[PATH_MAX + 64] = "";
    if (paths_shipped_dir("EXO_WEB_DIR", "web", web, sizeof web)) web[0] = 0;
    api_server_options so = {.port = c->port,
                             .api_key = c->api_key,
                             .max_body_bytes = c->max_body_bytes,
                             .max_connections_per_ip = c->max_connections_per_ip,
                             .header_timeout_s = c->header_timeout_s,
                             .body_timeout_s = c->body_timeout_s,
                             .web_dir = web[0] ? web : NULL};
    s->server = api_server_new(&so);
    if (!s->server || add_routes(s, models)) {
        snprintf(err, errlen, "api: the HTTP routes could not be registered (see the log above)");
        api_server_free(s->server);
        free(s);
        return NULL;
    }
    return s;
}

int api_service_start(api_service *s, char *err, size_t errlen) {
    return api_server_start(s->server, err, errlen);
}

int api_service_port(api_service *s) { return api_server_port(s->server); }

void api_service_stop(api_service *s) {
    if (s) api_server_stop(s->server);
}

void api_service_free(api_service *s) {
    if (!s) return;
    api_server_free(s->server);
    free(s);
}
