/* routes_placement — GET /instance/previews and GET /instance/placement: where a model would
 * run on this cluster and how much memory each node would need, or why it cannot run.
 * Glue between the HTTP router, the model store/cards (what the model is) and cluster State
 * (which nodes have how much free memory); the decisions are cluster/placement.c's. */
#ifndef EXO_API_ROUTES_PLACEMENT_H
#define EXO_API_ROUTES_PLACEMENT_H

#include "api/router.h"
#include "cluster/placement.h"
#include "worker/placer.h"

/* Where a model's facts are read from: its config.json in the model store, else its card. */
typedef placer_dirs routes_placement_dirs;

/* Checks sharding ("Pipeline"|"Tensor"|NULL), instance_meta (exo's values) and min_nodes; 0 with
 * *s set, or -1 after answering 400 with the accepted values. */
int routes_placement_options(api_request *r, const char *sharding, const char *meta,
                             int min_nodes, placement_sharding *s);

/* Registers the routes (called once, by api_service_new); dirs must outlive the server.
 * Returns the number that failed. */
int routes_placement_add(api_server *server, const routes_placement_dirs *dirs);

#endif
