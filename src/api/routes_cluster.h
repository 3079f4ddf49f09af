/* routes_cluster — the node's HTTP door onto the cluster: GET /state, /state/{path...},
 * /events[?since=N], /cluster/status, and GET / DELETE /instance/{id}. The State served is the
 * worker's view of it (worker_state_json: this node's runners with their live status, or only
 * this node's own instances when the cluster is not running); GET/DELETE /instance/{id} reach
 * instances of other nodes through State. Handlers translate; the worker and the cluster act. */
#ifndef EXO_API_ROUTES_CLUSTER_H
#define EXO_API_ROUTES_CLUSTER_H

#include "api/router.h"
#include "worker/worker.h"

/* Registers the routes (called once, by api_service_new). Returns the number that failed. */
int routes_cluster_add(api_server *server, worker *w);

#endif
