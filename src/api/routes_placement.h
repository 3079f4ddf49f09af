/* routes_placement — GET /instance/previews and GET /instance/placement: where a model would
 * run on this cluster and how much memory each node would need, or why it cannot run.
 * Glue between the HTTP router, the model store/cards (what the model is) and cluster State
 * (which nodes have how much free memory); the decisions are cluster/placement.c's. */
#ifndef EXO_API_ROUTES_PLACEMENT_H
#define EXO_API_ROUTES_PLACEMENT_H

#include "api/router.h"

/* Where a model's facts are read from: its config.json in the model store, else its card. */
typedef struct routes_placement_dirs {
    char models_dir[1024];
    char models_path[4096]; /* colon-separated, read-only */
    char data_dir[1024];    /* custom cards under <data_dir>/custom_cards; "" = none */
} routes_placement_dirs;

/* Registers the routes (called once, by api_service_new); dirs must outlive the server.
 * Returns the number that failed. */
int routes_placement_add(api_server *server, const routes_placement_dirs *dirs);

#endif
