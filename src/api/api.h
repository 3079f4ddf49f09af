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
/* Stops the server, then every runner. */
void api_service_free(api_service *svc);

#endif
