/* routes_internal — node-to-node routes: POST /internal/generate serves a generation forwarded
 * by another node (worker/remote.h) on this node's rank-0 runner of a multi-node instance. */
#ifndef EXO_API_ROUTES_INTERNAL_H
#define EXO_API_ROUTES_INTERNAL_H

#include "api/router.h"
#include "worker/instances.h"

/* Returns the number of routes that failed to register. */
int routes_internal_add(api_server *server, instances *local);

#endif
