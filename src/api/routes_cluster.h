/* cluster_routes — the node's HTTP door onto the cluster: GET /state, /state/{path...},
 * /events[?since=N] and /cluster/status, added to the API server by node.c. It lives beside
 * node.c (not in api/ or cluster/) because it joins the two: api -> cluster, never back.
 * Instances and runners reach State as events (cluster_sync.h); only when the cluster is not
 * running does /state fold in this node's own. GET/DELETE /instance/{id} also reach instances
 * of other nodes through State. */
#ifndef EXO_CLUSTER_ROUTES_H
#define EXO_CLUSTER_ROUTES_H

#include "api/instances.h"
#include "api/router.h"

void cluster_routes_add(api_server *server, instances *local);

#endif
