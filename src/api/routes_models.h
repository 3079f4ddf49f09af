/* routes_models — plugs download/models_api (model list, custom cards, search, download
 * control) and download/serve (peer transfer of model files) into the API server.
 * It refuses nothing on its own: every check lives in models_api / serve. DELETE
 * /download/{node_id}/{model_id...} also tells the cluster (DownloadDeleted), so no node takes
 * this one for a peer that holds the model. */
#ifndef EXO_API_ROUTES_MODELS_H
#define EXO_API_ROUTES_MODELS_H

#include "api/router.h"
#include "download/models_api.h"

/* Registers the model and download routes (called once, by api_service_new); models must
 * outlive the server. Returns the number that failed. */
int routes_models_add(api_server *server, models_service *models);

#endif
