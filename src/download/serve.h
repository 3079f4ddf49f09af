/* serve — this node's side of peer transfer: other nodes fetch model files from our API port.
 *   GET /models/{org}/{name}/manifest        the model's .exo-manifest.json (files, sizes, hashes)
 *   GET /models/{org}/{name}/files/{path}    one file, with Range support (206/416)
 * Only complete models in the store are served, only files their manifest lists, and only by
 * safe relative paths: a request can never read outside a model directory, a .partial file,
 * or a model that is still downloading. */
#ifndef EXO_DOWNLOAD_SERVE_H
#define EXO_DOWNLOAD_SERVE_H

#include "model/store.h"

#include <stdint.h>

struct MHD_Connection;

typedef struct serve_target {
    int status;         /* 200 if found, else the HTTP error status */
    int is_manifest;
    char file[4096];    /* absolute path of the file to send */
    uint64_t size;
    char message[256];  /* when status != 200 */
} serve_target;

/* 1 if url_path is one of the peer-transfer routes above (whatever the outcome), else 0. */
int serve_is_peer_route(const char *url_path);
/* Resolves a route to a file. Always fills status (and message on errors). */
void serve_resolve(const model_store *store, const char *url_path, serve_target *out);

/* Parses a Range header ("bytes=A-B", "bytes=A-", "bytes=-N"; one range only) against a file
 * size. Returns 200 (no/ignored header: whole file), 206 (start/len set) or 416. */
int serve_parse_range(const char *header, uint64_t size, uint64_t *start, uint64_t *len);

/* Answers a GET on a libmicrohttpd connection (status, headers, body from the file).
 * Returns the MHD_Result of MHD_queue_response. */
int serve_mhd(struct MHD_Connection *conn, const model_store *store, const char *url_path);

#endif
