/* api — the service: builds the server, the instance manager and the route table (see api.h).
 * Routes that only read state live here; generation routes go through gen_handle. */
#include "api/api.h"

#include "api/gen.h"
#include "api/metrics.h"
#include "api/server.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/paths.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct api_service {
    api_server *server;
    instances *instances;
    gen_context gen;
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
                   api_server_open_connections(s->server));
    instances_render_metrics(s->instances, &out);
    api_respond_bytes(r, 200, "text/plain; version=0.0.4; charset=utf-8", out.data, out.len);
    strbuf_free(&out);
}

static void h_state(api_request *r, void *ctx) {
    api_service *s = ctx;
    api_respond_json(r, 200, instances_state_json(s->instances));
}

static void place(api_request *r, api_service *s, const char *model_id) {
    char id[64], err[1024];
    int status = instances_place(s->instances, model_id, id, sizeof id, err, sizeof err);
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

static void h_place_instance(api_request *r, void *ctx) {
    json_t *b = api_request_json(r);
    if (!b) return;
    const char *model = json_string_value(json_object_get(b, "model_id"));
    if (!model) {
        api_respond_error(r, 400, "'model_id' is required and must be a string");
    } else {
        const char *sh = json_string_value(json_object_get(b, "sharding"));
        if (sh && strcmp(sh, "Pipeline") && strcmp(sh, "Tensor"))
            api_respond_error(r, 400, "'sharding' must be \"Pipeline\" or \"Tensor\"");
        else
            place(r, ctx, model);
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

static void h_get_instance(api_request *r, void *ctx) {
    api_service *s = ctx;
    const char *id = api_request_param(r, "id");
    json_t *j = instances_get_json(s->instances, id);
    if (!j) api_respond_error(r, 404, "no instance with id %s", id);
    else api_respond_json(r, 200, j);
}

static void h_delete_instance(api_request *r, void *ctx) {
    api_service *s = ctx;
    const char *id = api_request_param(r, "id");
    if (instances_delete(s->instances, id)) {
        api_respond_error(r, 404, "no instance with id %s", id);
        return;
    }
    api_respond_json(r, 200, json_pack("{s:s,s:s}", "message", "Command received.",
                                       "instance_id", id));
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

static json_t *ollama_details(void) {
    return json_pack("{s:s,s:s,s:s,s:[],s:s,s:s}", "parent_model", "", "format", "safetensors",
                     "family", "", "families", "parameter_size", "", "quantization_level", "");
}

static json_t *ollama_model(const char *id) {
    return json_pack("{s:s,s:s,s:s,s:i,s:s,s:o}", "name", id, "model", id, "modified_at",
                     "1970-01-01T00:00:00Z", "size", 0, "digest", "", "details", ollama_details());
}

static void h_ollama_root(api_request *r, void *ctx) {
    (void)ctx;
    api_respond_bytes(r, 200, "text/plain; charset=utf-8", "Ollama is running", 17);
}

static void h_ollama_version(api_request *r, void *ctx) {
    (void)ctx;
    api_respond_json(r, 200, json_pack("{s:s}", "version", "0.6.4"));
}

static void h_ollama_tags(api_request *r, void *ctx) {
    api_service *s = ctx;
    json_t *ids = instances_local_models(s->instances);
    json_t *models = json_array();
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v) json_array_append_new(models, ollama_model(json_string_value(v)));
    json_decref(ids);
    api_respond_json(r, 200, json_pack("{s:o}", "models", models));
}

static void h_ollama_ps(api_request *r, void *ctx) {
    api_service *s = ctx;
    json_t *ids = instances_running_models(s->instances);
    json_t *models = json_array();
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v) {
        json_t *m = ollama_model(json_string_value(v));
        json_object_set_new(m, "expires_at", json_string("2999-01-01T00:00:00Z"));
        json_object_set_new(m, "size_vram", json_integer(0));
        json_array_append_new(models, m);
    }
    json_decref(ids);
    api_respond_json(r, 200, json_pack("{s:o}", "models", models));
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
        char path[1100];
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_t *config = json_load_file(path, 0, NULL);
        api_respond_json(r, 200, json_pack("{s:s,s:s,s:s,s:o,s:o,s:[s]}", "modelfile", "",
                                           "parameters", "", "template", "", "details",
                                           ollama_details(), "model_info",
                                           config ? config : json_object(), "capabilities",
                                           "completion"));
    }
    json_decref(b);
}

/* ------------------------------------------------------------------ service */

api_service *api_service_new(const exo_options *o, const char *node_id, char *err,
                             size_t errlen) {
    api_service *s = calloc(1, sizeof *s);
    snprintf(s->node_id, sizeof s->node_id, "%s", node_id);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(err, errlen, "cannot find the exo binary (/proc/self/exe)");
        free(s);
        return NULL;
    }
    exe[n] = 0;
    instances_options io = {.runner_exe = exe,
                            .models_dir = o->models_dir,
                            .models_path = o->models_path,
                            .node_id = node_id,
                            .kv_cache_bytes = o->kv_cache_bytes,
                            .device = o->device,
                            .watchdog_s = getenv("EXO_RUNNER_WATCHDOG_S")
                                              ? atoi(getenv("EXO_RUNNER_WATCHDOG_S"))
                                              : 0};
    if (io.watchdog_s == 0 && getenv("EXO_RUNNER_WATCHDOG_S")) io.watchdog_s = -1; /* "0": off */
    s->instances = instances_new(&io);
    s->gen.instances = s->instances;

    /* web/ next to the binary's repository (build/exo -> ../web), or $EXO_WEB_DIR. */
    char web[PATH_MAX + 64] = "";
    if (paths_shipped_dir("EXO_WEB_DIR", "web", web, sizeof web)) web[0] = 0;
    api_server_options so = {.port = o->api_port,
                             .api_key = o->api_key,
                             .max_body_bytes = o->max_body_bytes,
                             .web_dir = web[0] ? web : NULL};
    s->server = api_server_new(&so);
    api_server *sv = s->server;
    api_route_add(sv, "GET", "/node_id", h_node_id, s, API_ROUTE_PUBLIC);
    api_route_add(sv, "GET", "/health", h_health, s, API_ROUTE_PUBLIC);
    api_route_add(sv, "GET", "/metrics", h_metrics, s, 0);
    /* /models and /v1/models belong to the model store (api/routes_models.c). */
    api_route_add(sv, "GET", "/state", h_state, s, 0);
    api_route_add(sv, "POST", "/place_instance", h_place_instance, s, 0);
    api_route_add(sv, "POST", "/instance", h_create_instance, s, 0);
    api_route_add(sv, "GET", "/instance/{id}", h_get_instance, s, 0);
    api_route_add(sv, "DELETE", "/instance/{id}", h_delete_instance, s, 0);
    api_route_add(sv, "POST", "/v1/cancel/{id}", h_cancel, s, 0);
    api_route_add(sv, "POST", "/v1/chat/completions", h_chat, s, 0);
    api_route_add(sv, "POST", "/bench/chat/completions", h_bench_chat, s, 0);
    api_route_add(sv, "POST", "/v1/completions", h_completions, s, 0);
    api_route_add(sv, "POST", "/v1/responses", h_responses, s, 0);
    api_route_add(sv, "POST", "/v1/messages", h_messages, s, 0);
    api_route_add(sv, "POST", "/ollama/api/chat", h_ollama_chat, s, 0);
    api_route_add(sv, "POST", "/ollama/api/generate", h_ollama_generate, s, 0);
    api_route_add(sv, "GET", "/ollama", h_ollama_root, s, 0);
    api_route_add(sv, "GET", "/ollama/api/version", h_ollama_version, s, 0);
    api_route_add(sv, "GET", "/ollama/api/tags", h_ollama_tags, s, 0);
    api_route_add(sv, "GET", "/ollama/api/ps", h_ollama_ps, s, 0);
    api_route_add(sv, "POST", "/ollama/api/show", h_ollama_show, s, 0);
    return s;
}

int api_service_start(api_service *s, char *err, size_t errlen) {
    return api_server_start(s->server, err, errlen);
}

void api_service_set_fetcher(api_service *svc, const api_model_fetcher *fetcher) {
    if (fetcher) svc->gen.fetcher = *fetcher;
    else memset(&svc->gen.fetcher, 0, sizeof svc->gen.fetcher);
}

api_server *api_service_server(api_service *s) { return s->server; }
instances *api_service_instances(api_service *s) { return s->instances; }

void api_service_free(api_service *s) {
    if (!s) return;
    api_server_stop(s->server);
    instances_free(s->instances);
    api_server_free(s->server);
    free(s);
}
