/* routes_models — HTTP glue for the model and download endpoints (see routes_models.h). */
#include "api/routes_models.h"

#include "cluster/cluster.h"
#include "download/serve.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void answer(api_request *r, int status, json_t *body) { api_respond_json(r, status, body); }

static json_t *body_json(api_request *r) {
    size_t len = 0;
    api_request_body(r, &len);
    if (len == 0) return json_object();
    return api_request_json(r); /* answers 400 itself on bad JSON */
}

/* A models_api call that takes the request's JSON body (an empty body reads as {}). */
typedef int (*models_body_call)(models_service *s, json_t *request, json_t **body);

static void answer_body_call(api_request *r, models_service *s, models_body_call call) {
    json_t *req = body_json(r), *b;
    if (!req) return;
    int st = call(s, req, &b);
    json_decref(req);
    answer(r, st, b);
}

static void h_list(api_request *r, void *ctx) {
    json_t *b;
    int st = models_api_list(ctx, api_request_query(r, "status"), &b);
    answer(r, st, b);
}

static void h_search(api_request *r, void *ctx) {
    json_t *b;
    int st = models_api_search(ctx, api_request_query(r, "query"), api_request_query(r, "limit"), &b);
    answer(r, st, b);
}

static void h_add(api_request *r, void *ctx) { answer_body_call(r, ctx, models_api_add); }

static void h_delete_custom(api_request *r, void *ctx) {
    json_t *b;
    int st = models_api_delete_custom(ctx, api_request_param(r, "model_id"), &b);
    answer(r, st, b);
}

static void h_download_start(api_request *r, void *ctx) { answer_body_call(r, ctx, models_api_download_start); }

static void h_download_cancel(api_request *r, void *ctx) { answer_body_call(r, ctx, models_api_download_cancel); }

/* DELETE /download/{node_id}/{model_id}: as models_api, and State forgets the download, so no
 * node takes this one for a peer that holds the model. */
static void h_download_delete(api_request *r, void *ctx) {
    const char *node = api_request_param(r, "node_id"), *model = api_request_param(r, "model_id");
    json_t *b;
    int st = models_api_download_delete(ctx, node, model, &b);
    if (st == 200 && cluster_node_id()[0])
        cluster_submit(json_pack("{s:{s:s,s:s}}", "DownloadDeleted", "nodeId", node, "modelId",
                                 model));
    answer(r, st, b);
}

static void h_download_status(api_request *r, void *ctx) {
    json_t *b;
    int st = models_api_download_status(ctx, &b);
    answer(r, st, b);
}

/* Peer transfer: the manifest and (ranged) files of complete models. */
static void h_peer(api_request *r, void *ctx) {
    models_service *s = ctx;
    char path[4096];
    const char *file = api_request_param(r, "path");
    snprintf(path, sizeof path, "/models/%s/%s/%s%s", api_request_param(r, "org"),
             api_request_param(r, "name"), file ? "files/" : "manifest", file ? file : "");
    serve_target t;
    serve_resolve(&s->store, path, &t);
    if (t.status != 200) {
        api_respond_error(r, t.status, "%s", t.message);
        return;
    }
    unsigned long long start = 0, len = t.size;
    uint64_t a = 0, n = t.size;
    int status = t.is_manifest ? 200 : serve_parse_range(api_request_header(r, "Range"), t.size, &a, &n);
    if (status == 416) {
        char cr[64];
        snprintf(cr, sizeof cr, "bytes */%llu", (unsigned long long)t.size);
        api_request_add_response_header(r, "Content-Range", cr);
        api_respond_error(r, 416, "range outside the file (%llu bytes)", (unsigned long long)t.size);
        return;
    }
    if (status == 206) {
        start = a;
        len = n;
        char cr[96];
        snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", start, start + len - 1, (unsigned long long)t.size);
        api_request_add_response_header(r, "Content-Range", cr);
    }
    int fd = open(t.file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        api_respond_error(r, 404, "file not readable");
        return;
    }
    api_request_add_response_header(r, "Accept-Ranges", "bytes");
    api_respond_file(r, status, t.is_manifest ? "application/json" : "application/octet-stream", fd,
                     start, len);
}

int routes_models_add(api_server *sv, models_service *s) {
    int failed = 0;
#define ROUTE(method, pattern, handler) failed += api_route_add(sv, method, pattern, handler, s, 0) != 0
    ROUTE("GET", "/models", h_list);
    ROUTE("GET", "/v1/models", h_list);
    ROUTE("GET", "/models/search", h_search);
    ROUTE("POST", "/models/add", h_add);
    ROUTE("DELETE", "/models/custom/{model_id...}", h_delete_custom);
    ROUTE("POST", "/download/start", h_download_start);
    ROUTE("POST", "/download/cancel", h_download_cancel);
    ROUTE("GET", "/download/status", h_download_status);
    ROUTE("DELETE", "/download/{node_id}/{model_id...}", h_download_delete);
    ROUTE("GET", "/models/{org}/{name}/manifest", h_peer);
    ROUTE("GET", "/models/{org}/{name}/files/{path...}", h_peer);
#undef ROUTE
    return failed;
}
