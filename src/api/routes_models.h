/* routes_models — plugs download/models_api (model list, custom cards, search, download
 * control) and download/serve (peer transfer of model files) into the API server.
 * It refuses nothing on its own: every check lives in models_api / serve. */
#ifndef EXO_API_ROUTES_MODELS_H
#define EXO_API_ROUTES_MODELS_H

#include "api/router.h"
#include "download/models_api.h"
#include "options.h"

/* Creates the models service for this node and registers its routes (taking over /models and
 * /v1/models). Returns NULL with a message on failure. Free with models_service_free after the
 * server has stopped. */
models_service *routes_models_install(api_server *server, const exo_options *options,
                                      const char *node_id, char *err, size_t errlen);

#endif
