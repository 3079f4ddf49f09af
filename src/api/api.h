/* api — the node's HTTP API as one service: the server, the single-node instance manager, and
 * every route of the OpenAI, Responses, Claude, Ollama and exo APIs. node.c starts and stops it;
 * other modules add their own routes through api_service_server() + router.h.
 *
 * It refuses: running model math (runners do that) and cluster state (the cluster module). */
#ifndef EXO_API_API_H
#define EXO_API_API_H

#include "api/instances.h"
#include "api/router.h"
#include "options.h"

typedef struct api_service api_service;

/* Creates the server and instance manager and registers every route; does not listen yet.
 * node_id is this node's id (copied). */
api_service *api_service_new(const exo_options *options, const char *node_id, char *err,
                             size_t errlen);
int api_service_start(api_service *svc, char *err, size_t errlen);
api_server *api_service_server(api_service *svc);
instances *api_service_instances(api_service *svc);
/* Where generation requests get a model that is not on disk (the node's downloader; NULL
 * members = none: such a request is a 404). start: 0 when a download of model_id is running
 * (started now or before), else an HTTP status (404 not in the catalog, offline, ...) with err.
 * poll: 0 still running, 1 complete, -1 failed (err says why); *progress = the
 * state.downloads entry (new reference) or NULL. Called from request threads. */
typedef struct api_model_fetcher {
    int (*start)(void *ud, const char *model_id, char *err, size_t errlen);
    int (*poll)(void *ud, const char *model_id, json_t **progress, char *err, size_t errlen);
    void *ud;
} api_model_fetcher;
/* Call before api_service_start. */
void api_service_set_fetcher(api_service *svc, const api_model_fetcher *fetcher);

/* Stops the server, then every runner. */
void api_service_free(api_service *svc);

#endif
