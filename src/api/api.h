/* api — the node's HTTP API as one service: the server and every route of the OpenAI,
 * Responses, Claude, Ollama and exo APIs, each registered once, here in api/ (api_route_add
 * refuses a second registration of a route, and the service then does not start). Handlers
 * translate HTTP into calls on the worker (runners, placement, downloads), the cluster (State,
 * log) and the model store, and their results back into responses. cmd/node.c creates it.
 *
 * It refuses: owning processes or threads of its own (the worker runs the runners), model math
 * (runners), and cluster state (the cluster module). */
#ifndef EXO_API_API_H
#define EXO_API_API_H

#include "api/router.h"
#include "download/models_api.h"
#include "worker/worker.h"

/* What the API needs from the node's configuration (cmd/ fills it). Strings are copied. */
typedef struct api_config {
    int port;                /* 0 = any free port */
    const char *api_key;     /* NULL or "": no key required */
    size_t max_body_bytes;
    int max_connections_per_ip; /* 0 = the server's default, < 0 = no limit */
    unsigned header_timeout_s;  /* 0 = the server's defaults (api/server.h) */
    unsigned body_timeout_s;
    const char *models_dir;  /* placement previews read the model store ... */
    const char *models_path;
    const char *data_dir;    /* ... and the custom cards under <data_dir>/custom_cards */
} api_config;

typedef struct api_service api_service;

/* Creates the server and registers every route; does not listen yet. node_id is this node's id
 * (copied); worker and models must outlive the service. NULL with err on failure (a route
 * registered twice among them). */
api_service *api_service_new(const api_config *config, const char *node_id, worker *worker,
                             models_service *models, char *err, size_t errlen);
int api_service_start(api_service *svc, char *err, size_t errlen);
/* The port it listens on (after api_service_start). */
int api_service_port(api_service *svc);
/* Stops answering: new connections are refused and in-flight handlers finish. */
void api_service_stop(api_service *svc);
/* Stops (if still running) and frees. */
void api_service_free(api_service *svc);

/* Where generation requests get a model that is not on disk (the worker's download-then-place;
 * NULL members = none: such a request is a 404). start: 0 when a download of model_id is
 * running (started now or before), else an HTTP status (404 not in the catalog, offline, ...)
 * with err. poll: 0 still running, 1 complete, -1 failed (err says why); *progress = the
 * state.downloads entry (new reference) or NULL. Called from request threads. Private to api/
 * (gen.h); tests and the fuzzer leave it zeroed. */
typedef struct api_model_fetcher {
    int (*start)(void *ud, const char *model_id, char *err, size_t errlen);
    int (*poll)(void *ud, const char *model_id, json_t **progress, char *err, size_t errlen);
    void *ud;
} api_model_fetcher;

#endif
