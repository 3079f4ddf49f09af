/* models_api — model list, custom cards, search and download control (see models_api.h). */
#include "download/models_api.h"

#include "base/log.h"
#include "base/paths.h"
#include "model/model_config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *phrase(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 409: return "Conflict";
    case 429: return "Too Many Requests";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Internal Server Error" : "Error";
    }
}

json_t *models_api_error(int status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", msg, "type", phrase(status),
                     "param", "code", status);
}

models_service *models_service_new(const models_service_options *o, char *err, size_t errlen) {
    models_service *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (store_init(&s->store, o->models_dir, o->models_path, err, errlen) < 0) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    char custom[sizeof s->cards.custom_dir] = "";
    if (o->data_dir && *o->data_dir) {
        int w = snprintf(custom, sizeof custom, "%s/custom_cards", o->data_dir);
        if (w < 0 || (size_t)w >= sizeof custom) {
            snprintf(err, errlen, "data dir path is too long");
            free(s);
            return NULL;
        }
    }
    if (card_catalog_load(&s->cards, o->cards_dir, custom[0] ? custom : NULL) < 0) {
        log_warn("models: built-in model cards not found (set EXO_CARDS_DIR); the catalog is empty");
        card_catalog_free(&s->cards);
        memcpy(s->cards.custom_dir, custom, sizeof custom);
    }
    hf_config_from_env(&s->hf);
    snprintf(s->node_id, sizeof s->node_id, "%s", o->node_id ? o->node_id : "");
    s->offline = o->offline;
    download_manager_options dm = {.models_dir = o->models_dir,
                                   .node_id = o->node_id,
                                   .offline = o->offline,
                                   .hf = &s->hf,
                                   .peer_token = o->api_key};
    s->downloads = download_manager_new(&dm);
    if (!s->downloads) {
        snprintf(err, errlen, "cannot create the download manager");
        card_catalog_free(&s->cards);
        free(s);
        return NULL;
    }
    return s;
}

void models_service_free(models_service *s) {
    if (!s) return;
    download_manager_free(s->downloads);
    card_catalog_free(&s->cards);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

int models_service_has_card(models_service *s, const char *model_id) {
    pthread_mutex_lock(&s->lock);
    int known = card_catalog_find(&s->cards, model_id) != NULL;
    pthread_mutex_unlock(&s->lock);
    return known;
}

int models_service_offline(const models_service *s) { return s->offline; }

download_manager *models_service_downloads(models_service *s) { return s->downloads; }

/* ---- GET /models ---- */

struct list_ctx {
    models_service *s;
    json_t *data;
    int downloaded_only;
};

static json_t *find_entry(json_t *data, const char *id) {
    size_t i;
    json_t *v;
    json_array_foreach(data, i, v) if (!strcmp(json_string_value(json_object_get(v, "id")), id)) return v;
    return NULL;
}

/* A model on disk with no card: describe it from its config.json. */
static json_t *local_entry(const char *id, const char *dir) {
    size_t len;
    char *cfg = model_config_read_json(dir, &len, NULL, 0); /* config.json, or a GGUF's */
    model_card c;
    char err[256];
    json_t *e = NULL;
    if (cfg && card_from_hf_config(id, cfg, store_dir_bytes(dir), &c, err, sizeof err) == 0) {
        c.is_custom = 0;
        e = card_to_json(&c);
    }
    free(cfg);
    if (!e)
        e = json_pack("{s:s, s:s, s:I, s:s, s:s, s:s}", "id", id, "object", "model", "created",
                      (json_int_t)0, "owned_by", "exo", "hugging_face_id", id, "name", id);
    return e;
}

static void on_local(const char *id, const char *dir, enum store_state st, void *ud) {
    struct list_ctx *c = ud;
    json_t *e = find_entry(c->data, id);
    if (!e) {
        e = local_entry(id, dir);
        json_array_append_new(c->data, e);
    }
    json_object_set_new(e, "downloaded", json_boolean(st == STORE_COMPLETE));
    json_object_set_new(e, "local_path", json_string(dir));
    /* Only a copy in the writable models dir can be deleted (DELETE /download/...): the
     * built-in models and --models-path are read-only. */
    char writable[2048];
    json_object_set_new(e, "deletable",
                        json_boolean(store_write_dir(&c->s->store, id, writable,
                                                     sizeof writable) == 0 &&
                                     paths_is_dir(writable)));
}

int models_api_list(models_service *s, const char *status_filter, json_t **body) {
    int downloaded_only = status_filter && !strcmp(status_filter, "downloaded");
    if (status_filter && *status_filter && !downloaded_only) {
        *body = models_api_error(400, "unknown status filter '%s' (use status=downloaded)", status_filter);
        return 400;
    }
    json_t *data = json_array();
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->cards.n; i++) {
        json_t *e = card_to_json(&s->cards.cards[i]);
        json_object_set_new(e, "downloaded", json_false());
        json_object_set_new(e, "deletable", json_false());
        json_array_append_new(data, e);
    }
    pthread_mutex_unlock(&s->lock);
    struct list_ctx c = {.s = s, .data = data};
    store_list(&s->store, on_local, &c);
    if (downloaded_only) {
        json_t *kept = json_array();
        size_t i;
        json_t *v;
        json_array_foreach(data, i, v) if (json_is_true(json_object_get(v, "downloaded")))
            json_array_append(kept, v);
        json_decref(data);
        data = kept;
    }
    *body = json_pack("{s:s, s:o}", "object", "list", "data", data);
    return 200;
}

/* ---- search ---- */

int models_api_search(models_service *s, const char *query, const char *limit_s, json_t **body) {
    int limit = limit_s ? atoi(limit_s) : 20;
    if (limit <= 0 || limit > 100) {
        *body = models_api_error(400, "limit must be between 1 and 100");
        return 400;
    }
    if (s->offline) {
        *body = models_api_error(503, "this node is offline (--offline): Hugging Face search is unavailable");
        return 503;
    }
    char err[512];
    json_t *r = hf_search(&s->hf, query ? query : "", limit, err, sizeof err);
    if (!r) {
        *body = models_api_error(502, "Hugging Face search failed: %s", err);
        return 502;
    }
    *body = r;
    return 200;
}

/* ---- custom cards ---- */

static int error_status(enum download_error e) {
    switch (e) {
    case DOWNLOAD_ERR_NOT_FOUND: return 404;
    case DOWNLOAD_ERR_AUTH: return 401;
    case DOWNLOAD_ERR_BAD_INPUT: return 400;
    case DOWNLOAD_ERR_RATE_LIMIT: return 429;
    default: return 502;
    }
}

/* Total weight bytes: the index's metadata.total_size, else the tree's *.safetensors sizes. */
static uint64_t weight_bytes(models_service *s, const char *id) {
    hf_file_list list;
    char err[256];
    uint64_t total = 0;
    if (hf_list_files(&s->hf, id, &list, err, sizeof err) == DOWNLOAD_OK) {
        for (size_t i = 0; i < list.n; i++) {
            size_t n = strlen(list.files[i].path);
            if (n > 12 && !strcmp(list.files[i].path + n - 12, ".safetensors")) total += list.files[i].size;
        }
        hf_file_list_free(&list);
    }
    return total;
}

int models_api_add(models_service *s, json_t *req, json_t **body) {
    const char *id = json_string_value(json_object_get(req, "model_id"));
    char why[256];
    if (!id) {
        *body = models_api_error(400, "model_id (string) is required");
        return 400;
    }
    if (store_id_valid(id, why, sizeof why) < 0) {
        *body = models_api_error(400, "invalid model_id '%s': %s", id, why);
        return 400;
    }
    pthread_mutex_lock(&s->lock);
    const model_card *existing = card_catalog_find(&s->cards, id);
    int builtin = existing && !existing->is_custom;
    pthread_mutex_unlock(&s->lock);
    if (builtin) {
        *body = models_api_error(409, "%s is already a built-in model", id);
        return 409;
    }
    /* config.json: from a local copy if we have one, else from the Hub */
    char dir[2048], err[512];
    char *cfg = NULL;
    if (store_locate(&s->store, id, dir, sizeof dir) != STORE_ABSENT) {
        size_t len;
        cfg = model_config_read_json(dir, &len, NULL, 0); /* config.json, or a GGUF's */
    }
    uint64_t bytes = 0;
    if (!cfg) {
        if (s->offline) {
            *body = models_api_error(503, "offline: %s is not on this node, cannot fetch its config.json", id);
            return 503;
        }
        size_t len;
        enum download_error e = hf_get_small(&s->hf, id, "config.json", 16 << 20, &cfg, &len, err, sizeof err);
        if (e != DOWNLOAD_OK) {
            int st = error_status(e);
            *body = models_api_error(st, "cannot fetch config.json of %s: %s", id, err);
            return st;
        }
        bytes = weight_bytes(s, id);
    } else {
        bytes = store_dir_bytes(dir);
    }
    model_card c;
    int rc = card_from_hf_config(id, cfg, bytes, &c, err, sizeof err);
    free(cfg);
    if (rc < 0) {
        *body = models_api_error(422, "cannot build a card for %s: %s", id, err);
        return 422;
    }
    pthread_mutex_lock(&s->lock);
    rc = card_catalog_add_custom(&s->cards, &c, err, sizeof err);
    pthread_mutex_unlock(&s->lock);
    if (rc < 0) {
        *body = models_api_error(500, "%s", err);
        return 500;
    }
    *body = json_pack("{s:s, s:o}", "message", "Model added.", "model_card", card_to_json(&c));
    return 200;
}

int models_api_delete_custom(models_service *s, const char *id, json_t **body) {
    char why[256], err[512];
    if (!id || store_id_valid(id, why, sizeof why) < 0) {
        *body = models_api_error(400, "invalid model id: %s", id ? why : "missing");
        return 400;
    }
    pthread_mutex_lock(&s->lock);
    int rc = card_catalog_remove_custom(&s->cards, id, err, sizeof err);
    pthread_mutex_unlock(&s->lock);
    if (rc == 1) {
        *body = models_api_error(404, "no custom model card for %s", id);
        return 404;
    }
    if (rc < 0) {
        *body = models_api_error(500, "%s", err);
        return 500;
    }
    *body = json_pack("{s:s, s:s}", "message", "Custom model card removed.", "model_id", id);
    return 200;
}

/* ---- downloads ---- */

static const char *request_model(json_t *req) {
    const char *id = json_string_value(json_object_get(req, "model_id"));
    if (!id) id = json_string_value(json_object_get(req, "modelId"));
    return id;
}

int models_api_download_start(models_service *s, json_t *req, json_t **body) {
    const char *id = request_model(req);
    if (!id) {
        *body = models_api_error(400, "model_id (string) is required");
        return 400;
    }
    json_t *a = json_object_get(req, "start_layer"), *b = json_object_get(req, "end_layer");
    if ((a && !json_is_integer(a)) || (b && !json_is_integer(b))) {
        *body = models_api_error(400, "start_layer and end_layer must be integers");
        return 400;
    }
    const char *peers[16];
    int n_peers = 0;
    json_t *pl = json_object_get(req, "peers");
    size_t i;
    json_t *v;
    json_array_foreach(pl, i, v) if (json_is_string(v) && n_peers < 16) peers[n_peers++] = json_string_value(v);
    char err[512];
    int rc = download_manager_start(s->downloads, id, a ? (int)json_integer_value(a) : 0,
                                    b ? (int)json_integer_value(b) : 0, peers, n_peers, err, sizeof err);
    if (rc < 0) {
        *body = models_api_error(400, "%s", err);
        return 400;
    }
    *body = json_pack("{s:s, s:s, s:b}", "message", rc == 1 ? "Download already running." : "Download started.",
                      "model_id", id, "already_running", rc == 1);
    return 200;
}

int models_api_download_cancel(models_service *s, json_t *req, json_t **body) {
    const char *id = request_model(req);
    if (!id) {
        *body = models_api_error(400, "model_id (string) is required");
        return 400;
    }
    if (download_manager_cancel(s->downloads, id) < 0) {
        *body = models_api_error(404, "no download of %s is running on this node", id);
        return 404;
    }
    *body = json_pack("{s:s, s:s}", "message", "Download cancelled.", "model_id", id);
    return 200;
}

int models_api_download_delete(models_service *s, const char *node_id, const char *id, json_t **body) {
    char why[256], err[512];
    if (!id || store_id_valid(id, why, sizeof why) < 0) {
        *body = models_api_error(400, "invalid model id: %s", id ? why : "missing");
        return 400;
    }
    if (node_id && *node_id && s->node_id[0] && strcmp(node_id, s->node_id)) {
        *body = models_api_error(404, "node %s is not this node (%s)", node_id, s->node_id);
        return 404;
    }
    download_manager_cancel(s->downloads, id);
    download_manager_wait(s->downloads, id);
    char dir[2048];
    if (store_write_dir(&s->store, id, dir, sizeof dir) < 0 || !paths_is_dir(dir)) {
        *body = models_api_error(404, "%s is not downloaded on this node", id);
        return 404;
    }
    if (store_delete(&s->store, id, err, sizeof err) < 0) {
        *body = models_api_error(500, "%s", err);
        return 500;
    }
    *body = json_pack("{s:s, s:s}", "message", "Model deleted.", "model_id", id);
    return 200;
}

int models_api_download_status(models_service *s, json_t **body) {
    *body = json_pack("{s:o}", "downloads", download_manager_state_json(s->downloads));
    return 200;
}
