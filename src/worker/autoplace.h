/* autoplace — POST /place_instance for models that are not on disk yet: a model in the catalog
 * is downloaded first (from peers whose State says they hold it, else from HF_ENDPOINT), then
 * placed on this node's instance manager. The same download path serves generation requests
 * for such models (autoplace_fetcher -> api_service_set_fetcher). Progress is in State's downloads[nodeId]. With
 * --offline a missing model is a 404 naming it. Models already on disk are placed at once, as
 * api/ does.
 *
 * It refuses models that are neither on disk nor in the catalog (404), and does not choose
 * other nodes to run on (placement across nodes is the cluster's). */
#ifndef EXO_AUTOPLACE_H
#define EXO_AUTOPLACE_H

#include "api/api.h"
#include "api/instances.h"
#include "api/router.h"
#include "download/models_api.h"

typedef struct autoplace autoplace;

/* Replaces POST /place_instance, and DELETE /download/{node_id}/{model_id} (which now also
 * submits DownloadDeleted). api_port is this node's (peers are assumed to use the same). */
autoplace *autoplace_install(api_server *server, instances *local, models_service *models,
                             int api_port);
/* The fetcher for generation requests (api_service_set_fetcher): a chat request for a catalog
 * model that is not on disk downloads it the same way (peers, then the Hub). */
void autoplace_fetcher(autoplace *a, api_model_fetcher *out);
/* Cancels downloads still waiting to be placed, joins their threads, frees. Call before the
 * instance manager and the models service are freed. Safe with NULL. */
void autoplace_stop(autoplace *a);

#endif
