/* placement_routes — GET /instance/previews and GET /instance/placement: where a model would
 * run on this cluster and how much memory each node would need, or why it cannot run.
 * Glue between the HTTP router, the model store/cards (what the model is) and cluster State
 * (which nodes have how much free memory); the decisions are cluster/placement.c's. */
#ifndef EXO_PLACEMENT_ROUTES_H
#define EXO_PLACEMENT_ROUTES_H

#include "api/router.h"
#include "options.h"

/* options must outlive the server. */
void placement_routes_add(api_server *server, const exo_options *options);

#endif
