/* server — the node's HTTP server (libmicrohttpd, one thread per connection): CORS (open, with
 * OPTIONS preflight), request body limit (413), optional API key (401), keep-alive, chunked
 * streaming, static files from a web directory at "/", and dispatch through the router.
 *
 * It refuses: TLS (put a proxy in front), HTTP/2, and request bodies over max_body_bytes. */
#ifndef EXO_API_SERVER_H
#define EXO_API_SERVER_H

#include "api/router.h"

#include <stddef.h>

typedef struct api_server_options {
    int port;                /* 0 = any free port (see api_server_port) */
    const char *api_key;     /* NULL or "" = no auth */
    size_t max_body_bytes;   /* 0 = 32 MiB */
    const char *web_dir;     /* static files; NULL = none (a minimal page at "/") */
    unsigned idle_timeout_s; /* idle keep-alive connections are closed after this; 0 = 300 */
} api_server_options;

/* Creates a server (not listening yet). Strings in options are copied. */
api_server *api_server_new(const api_server_options *options);
/* Starts listening. Returns 0, or -1 with a message (e.g. "port 52415 is in use"). */
int api_server_start(api_server *s, char *err, size_t errlen);
/* The port actually bound (after start). */
int api_server_port(const api_server *s);
/* Stops accepting, closes connections and joins their threads. */
void api_server_stop(api_server *s);
void api_server_free(api_server *s);

/* Connections currently open (for /metrics). */
int api_server_open_connections(const api_server *s);

#endif
