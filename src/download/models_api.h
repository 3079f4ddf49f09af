/* models_api — the node's model and download endpoints as functions from request data to a
 * status code and a JSON body, so any HTTP layer can serve them (api/routes_models.c does):
 *   GET    /models, /v1/models            [?status=downloaded]
 *   GET    /models/search                 ?query&limit
 *   POST   /models/add                    {"model_id"}
 *   DELETE /models/custom/{model_id}
 *   POST   /download/start                {"model_id", "start_layer"?, "end_layer"?, "peers"?}
 *   POST   /download/cancel               {"model_id"}
 *   DELETE /download/{node_id}/{model_id}
 *   GET    /download/status               this node's downloads (exo state.downloads entries)
 * Errors come back as {"error":{"message","type","param":null,"code"}} with the status.
 * It refuses model ids that store_id_valid rejects, and deleting read-only model dirs. */
#ifndef EXO_DOWNLOAD_MODELS_API_H
#define EXO_DOWNLOAD_MODELS_API_H

#include "download/manager.h"
#include "model/cards.h"
#include "model/store.h"

#include <jansson.h>
#include <pthread.h>

typedef struct models_service {
    model_store store;
    card_catalog cards;     /* guarded by lock (custom cards change it) */
    pthread_mutex_t lock;
    download_manager *downloads;
    hf_config hf;
    char node_id[128];
    int offline;
} models_service;

typedef struct models_service_options {
    const char *models_dir, *models_path, *data_dir, *node_id;
    const char *cards_dir; /* NULL = card_builtin_dir() */
    int offline;
    /* The node's --api-key: every node of a cluster runs with the same one, so its downloads
     * send it to the peers they fetch from (never to the Hub). NULL or "" = none. */
    const char *api_key;
} models_service_options;

/* Returns NULL with a message if the models dir is unusable. Missing built-in cards are only a
 * warning (the catalog is then empty). */
models_service *models_service_new(const models_service_options *o, char *err, size_t errlen);
void models_service_free(models_service *s);
/* For the worker's download-then-place, which must not reach into the struct: whether the
 * catalog (built-in and custom cards) has model_id (takes the lock), whether this node is
 * offline (--offline), and the node's download manager (owned by s). */
int models_service_has_card(models_service *s, const char *model_id);
int models_service_offline(const models_service *s);
download_manager *models_service_downloads(models_service *s);

/* Each returns the HTTP status and sets *body (a new reference). */
int models_api_list(models_service *s, const char *status_filter, json_t **body);
int models_api_search(models_service *s, const char *query, const char *limit, json_t **body);
int models_api_add(models_service *s, json_t *request, json_t **body);
int models_api_delete_custom(models_service *s, const char *model_id, json_t **body);
int models_api_download_start(models_service *s, json_t *request, json_t **body);
int models_api_download_cancel(models_service *s, json_t *request, json_t **body);
int models_api_download_delete(models_service *s, const char *node_id, const char *model_id,
                               json_t **body);
int models_api_download_status(models_service *s, json_t **body);

/* The exo error body for a status and message. New reference. */
json_t *models_api_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
