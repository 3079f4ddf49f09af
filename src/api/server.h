/* server — the node's HTTP server (libmicrohttpd, one thread per connection): CORS (open, with
 * OPTIONS preflight), request body limit (413), optional API key (401), keep-alive, chunked
 * streaming, static files from a web directory at "/", and dispatch through the router.
 *
 * Slow clients: a thread per connection lets a handler block and a stream write from its own
 * thread, so every connection costs a thread until it closes. Connections are therefore bounded
 * in number (max_connections in all, max_connections_per_ip from one address: more are refused
 * at accept) and in time before their request is whole: headers within header_timeout_s of the
 * connection opening or of the previous response (an idle keep-alive connection closes then
 * too), the body within body_timeout_s of the headers, however the bytes are dripped
 * (conn_watch.h). Once the request is whole, handlers and streams are not limited here.
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
    unsigned idle_timeout_s; /* a connection silent this long while its handler or response
                                runs is closed; 0 = 300 */
    unsigned header_timeout_s;  /* request line and headers must arrive within; 0 = default */
    unsigned body_timeout_s;    /* the body must arrive within, after the headers; 0 = default */
    unsigned max_connections;   /* open connections in all; 0 = default */
    int max_connections_per_ip; /* open connections from one address; 0 = default, < 0 = none */
} api_server_options;

#define API_HEADER_TIMEOUT_S 10
#define API_BODY_TIMEOUT_S 60
#define API_MAX_CONNECTIONS 4096u
#define API_MAX_CONNECTIONS_PER_IP 512

/* Creates a server (not listening yet). Strings in options are copied. */
api_server *api_server_new(const api_server_options *options);
/* Starts listening. Returns 0, or -1 with a message (e.g. "port 52415 is in use"). */
int api_server_start(api_server *s, char *err, size_t errlen);
/* The port actually bound (after start). */
int api_server_port(const api_server *s);
/* Stops accepting, closes connections and joins their threads. */
void api_server_stop(api_server *s);
void api_server_free(api_server *s);

/* Connections currently open, and those closed for sending their request too slowly (for
 * /metrics). */
int api_server_open_connections(const api_server *s);
unsigned long long api_server_request_timeouts(const api_server *s);

#endif
