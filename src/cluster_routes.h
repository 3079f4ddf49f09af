/* cluster_routes — the node's HTTP door onto the cluster: GET /state, /state/{path...},
 * /events[?since=N] and /cluster/status, added to the API server by node.c. It lives beside
 * node.c (not in api/ or cluster/) because it joins the two: api -> cluster, never back.
 * Until the worker publishes instances and runners as cluster events, /state also shows the
 * ones this node's local instance manager runs (cluster entries win on a clash). */
#ifndef EXO_CLUSTER_ROUTES_H
#define EXO_CLUSTER_ROUTES_H

#include "api/instances.h"
#include "api/router.h"

void cluster_routes_add(api_server *server, instances *local);

#endif
