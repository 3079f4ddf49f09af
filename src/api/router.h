/* router — how any module adds HTTP routes to the node's API server, and how a handler reads
 * its request and answers it (JSON, raw bytes, an error, or a stream).
 *
 * Threading: the server runs one thread per connection (libmicrohttpd THREAD_PER_CONNECTION), so
 * a handler may block (wait for a runner, a download, ...) without stalling other clients.
 * A handler answers by calling exactly one api_respond_* function before it returns; one that
 * returns without answering gets a 500. Streams are written from any thread after the handler
 * returns, until api_stream_close.
 *
 * It refuses: routing by regex, middleware chains, and per-route auth settings (auth is global:
 * every route but those added with API_ROUTE_PUBLIC needs the API key when one is set). */
#ifndef EXO_API_ROUTER_H
#define EXO_API_ROUTER_H

#include <jansson.h>
#include <stddef.h>

typedef struct api_server api_server;
typedef struct api_request api_request;
typedef struct api_stream api_stream;

typedef void (*api_handler)(api_request *request, void *ctx);

enum api_route_flags {
    API_ROUTE_PUBLIC = 1, /* reachable without the API key (e.g. /node_id) */
};

/* Adds a route. method: "GET", "POST", "DELETE", "PUT", "PATCH" ("GET" also answers HEAD).
 * pattern: a path whose segments may be "{name}" (one segment) or, as the last segment,
 * "{name...}" (the rest of the path, slashes included, e.g. "org/model").
 * A route is registered once: adding a method + pattern that matches the same paths as an
 * earlier one (capture names aside) is refused, so which handler serves a route never depends
 * on call order. Safe to call before or after api_server_start. Returns 0, or -1 (logged) on a
 * bad pattern or a route registered twice. */
int api_route_add(api_server *server, const char *method, const char *pattern, api_handler handler,
                  void *ctx, int flags);

/* ---- reading the request (all strings owned by the request, valid until it is answered) ---- */
const char *api_request_method(const api_request *r);
const char *api_request_path(const api_request *r);
/* A "{name}" capture of the matched pattern, URL-decoded, or NULL. */
const char *api_request_param(const api_request *r, const char *name);
/* A query-string argument (?key=value), or NULL. */
const char *api_request_query(const api_request *r, const char *key);
/* A request header (case-insensitive name), or NULL. */
const char *api_request_header(const api_request *r, const char *name);
/* 1 if the client has closed its connection (checked without blocking). */
int api_request_client_gone(api_request *r);
/* The body (NUL-terminated; len may be 0). */
const char *api_request_body(const api_request *r, size_t *len);
/* Parses the body as a JSON object. On failure answers 400 in the exo/OpenAI error format with
 * the line/column of the problem and returns NULL; otherwise returns a new reference. */
json_t *api_request_json(api_request *r);
/* Same, but does not answer: writes the error message to err and returns NULL. */
json_t *api_request_json_quiet(api_request *r, char *err, size_t errlen);

/* ---- answering ---- */
/* body reference is stolen. */
void api_respond_json(api_request *r, int status, json_t *body);
void api_respond_bytes(api_request *r, int status, const char *content_type, const void *data,
                       size_t len);
/* exo / OpenAI error shape: {"error":{"message","type":<HTTP phrase>,"param":null,"code":status}} */
void api_respond_error(api_request *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sends len bytes of an open file from offset (zero-copy where the OS allows; large model files
 * for peer transfer). Takes ownership of fd (closed when the response is done, or on error). */
void api_respond_file(api_request *r, int status, const char *content_type, int fd,
                      unsigned long long offset, unsigned long long len);
/* Adds a header to the response that this request will get (call before api_respond_*). */
void api_request_add_response_header(api_request *r, const char *name, const char *value);
/* The standard reason phrase ("Bad Request"), or "Error". */
const char *api_status_phrase(int status);

/* Starts a streamed (chunked) response. The returned stream has two owners: the connection and
 * the caller; the caller must eventually call api_stream_close exactly once. */
api_stream *api_respond_stream(api_request *r, int status, const char *content_type);
/* Queues bytes for the client. Returns 0, or -1 once the client has gone (writing is then a
 * no-op; the producer should stop). Never blocks on the network. */
int api_stream_write(api_stream *s, const void *data, size_t len);
int api_stream_printf(api_stream *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* When nothing was written for interval_ms, the server writes `text` itself (e.g. the SSE
 * comment ": keep-alive\n\n"). text is copied. */
void api_stream_set_keepalive(api_stream *s, const char *text, int interval_ms);
/* fn is called once, from a server thread, if the client disconnects before api_stream_close
 * (it must not call api_stream_close itself). release (may be NULL) is called with arg when the
 * stream is destroyed, so arg can be kept alive for fn. */
void api_stream_on_disconnect(api_stream *s, void (*fn)(void *arg), void *arg,
                              void (*release)(void *arg));
int api_stream_client_gone(api_stream *s);
/* Ends the response after the queued bytes and drops the caller's reference. */
void api_stream_close(api_stream *s);

#endif
