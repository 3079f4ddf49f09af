/* server — libmicrohttpd glue: connection state, body accumulation with a size limit, CORS,
 * auth, dispatch to routes, static files, and streamed responses (see server.h, router.h).
 *
 * Streams: a stream is written by any thread. The connection's own thread (MHD content-reader
 * callback) waits on an eventfd and on the client socket (POLLRDHUP) at once, so a disconnect is
 * noticed at once even while no bytes flow, and idle keep-alive text is written on a timer.
 *
 * Direct writes (the per-token path): once MHD has sent the headers and calls the content reader
 * for the first time, its own buffer is empty and it does nothing with the socket until the
 * callback returns. From then on the callback owns the socket and keeps MHD parked in it: a
 * producer (the thread that reads runner messages) frames its bytes as one HTTP chunk and sends
 * them itself with one non-blocking sendmsg, under the stream's lock. No thread wake-up, no copy
 * into MHD. Only what the socket does not take at once is queued for the connection thread, which
 * flushes it when the socket is writable. When the stream is closed the callback returns
 * END_OF_STREAM and MHD writes the last chunk. Requests that are not plain HTTP/1.1 keep-alive
 * (where MHD might not use chunked encoding) stay on the queued path through MHD. */
#include "api/server.h"

#include "api/conn_watch.h"
#include "api/metrics.h"
#include "base/log.h"
#include "base/paths.h"
#include "base/strbuf.h"

#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/resource.h>
#include <unistd.h>

#define ROUTE_MAX_SEGMENTS 16
#define REQUEST_MAX_PARAMS 8
#define REQUEST_MAX_HEADERS 8
#define STREAM_BLOCK 16384

typedef struct route {
    char method[8];
    char *pattern;
    char *segments[ROUTE_MAX_SEGMENTS];
    int n_segments;
    int rest; /* last segment is {name...} */
    api_handler handler;
    void *ctx;
    int flags;
} route;

struct api_server {
    api_server_options options;
    char *api_key, *web_dir;
    struct MHD_Daemon *daemon;
    int port;
    pthread_mutex_t routes_lock;
    route *routes;
    int n_routes, cap_routes;
    atomic_int open_connections;
    conn_watch *watch; /* request deadlines for slow clients (conn_watch.h) */
};

struct api_request {
    api_server *server;
    struct MHD_Connection *conn;
    char method[16];
    char *path;
    char *param_names[REQUEST_MAX_PARAMS];
    char *param_values[REQUEST_MAX_PARAMS];
    int n_params;
    strbuf body;
    int started;
    int body_too_large;
    int answered;
    char *header_names[REQUEST_MAX_HEADERS];
    char *header_values[REQUEST_MAX_HEADERS];
    int n_headers;
    int http11; /* HTTP/1.1 without "Connection: close": MHD streams it chunked */
};

struct api_stream {
    pthread_mutex_t lock;
    int refs;
    int event_fd;
    int client_fd;
    strbuf queue;
    size_t sent; /* bytes of queue already handed to MHD (or, direct, to the socket) */
    int closed;  /* producer called api_stream_close */
    int gone;    /* client disconnected */
    int can_direct;  /* chunked HTTP/1.1: producers may write to the socket themselves */
    int direct;      /* MHD is parked in the callback: queue holds framed bytes for the socket */
    int send_failed; /* a direct send saw the client gone (the connection thread reports it) */
    struct MHD_Connection *conn;
    unsigned idle_timeout_s;
    int disconnect_notified;
    char *keepalive_text;
    int keepalive_ms;
    void (*on_disconnect)(void *);
    void *on_disconnect_arg;
    void (*release)(void *);
};

/* ------------------------------------------------------------------ routes */

static void route_clear(route *r) {
    free(r->pattern);
    for (int i = 0; i < r->n_segments; i++) free(r->segments[i]);
    memset(r, 0, sizeof *r);
}

static int route_parse(route *r, const char *pattern) {
    if (pattern[0] != '/') return -1;
    r->pattern = strdup(pattern);
    const char *p = pattern + 1;
    while (*p) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (r->n_segments == ROUTE_MAX_SEGMENTS || r->rest) return -1;
        char *seg = strndup(p, n);
        r->segments[r->n_segments++] = seg;
        if (n > 5 && seg[0] == '{' && !strcmp(seg + n - 4, "...}")) r->rest = 1;
        p += n;
        if (*p == '/') p++;
    }
    return 0;
}

/* Whether two patterns match the same paths: equal literal segments, a "{name}" where the other
 * has a "{name}" (whatever the names), and both or neither ending in "{name...}". */
static int is_capture(const char *segment) {
    size_t n = strlen(segment);
    return n >= 2 && segment[0] == '{' && segment[n - 1] == '}';
}

static int same_paths(const route *a, const route *b) {
    if (a->n_segments != b->n_segments || a->rest != b->rest) return 0;
    for (int i = 0; i < a->n_segments; i++) {
        int ca = is_capture(a->segments[i]), cb = is_capture(b->segments[i]);
        if (ca != cb || (!ca && strcmp(a->segments[i], b->segments[i]))) return 0;
    }
    return 1;
}

int api_route_add(api_server *s, const char *method, const char *pattern, api_handler handler,
                  void *ctx, int flags) {
    route r = {0};
    if (!method || strlen(method) >= sizeof r.method || !handler || route_parse(&r, pattern)) {
        route_clear(&r);
        log_error("api: bad route %s %s", method ? method : "?", pattern ? pattern : "?");
        return -1;
    }
    snprintf(r.method, sizeof r.method, "%s", method);
    r.handler = handler;
    r.ctx = ctx;
    r.flags = flags;
    pthread_mutex_lock(&s->routes_lock);
    for (int i = 0; i < s->n_routes; i++) {
        if (!strcmp(s->routes[i].method, method) && same_paths(&s->routes[i], &r)) {
            log_error("api: route %s %s is registered twice (the first as %s): each route has "
                      "one handler, registered once in api/",
                      method, pattern, s->routes[i].pattern);
            pthread_mutex_unlock(&s->routes_lock);
            route_clear(&r);
            return -1;
        }
    }
    if (s->n_routes == s->cap_routes) {
        int cap = s->cap_routes ? s->cap_routes * 2 : 32;
        route *grown = realloc(s->routes, (size_t)cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&s->routes_lock);
            route_clear(&r);
            return -1;
        }
        s->routes = grown;
        s->cap_routes = cap;
    }
    s->routes[s->n_routes++] = r;
    pthread_mutex_unlock(&s->routes_lock);
    return 0;
}

/* Matches path against r; on success fills the request's params. Literal segments beat
 * captures because routes are tried literal-first by the caller's scoring. */
static int route_match(const route *r, const char *path, api_request *req, int *score) {
    const char *p = path[0] == '/' ? path + 1 : path;
    int n = 0;
    *score = 0;
    char *names[REQUEST_MAX_PARAMS], *values[REQUEST_MAX_PARAMS];
    for (int i = 0; i < r->n_segments; i++) {
        const char *seg = r->segments[i];
        size_t seglen = strlen(seg);
        if (r->rest && i == r->n_segments - 1) {
            if (!*p || n == REQUEST_MAX_PARAMS) goto fail;
            names[n] = strndup(seg + 1, seglen - 5);
            values[n++] = strdup(p);
            p += strlen(p);
            break;
        }
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (seg[0] == '{' && seg[seglen - 1] == '}') {
            if (len == 0 || n == REQUEST_MAX_PARAMS) goto fail;
            names[n] = strndup(seg + 1, seglen - 2);
            values[n++] = strndup(p, len);
        } else {
            if (len != seglen || memcmp(seg, p, len)) goto fail;
            *score += 1;
        }
        p += len;
        if (*p == '/') {
            p++;
            if (!*p && i == r->n_segments - 1) break; /* tolerate one trailing slash */
            if (!*p) goto fail;
        } else if (i < r->n_segments - 1) {
            goto fail;
        }
    }
    if (*p) goto fail;
    if (r->n_segments == 0 && strcmp(path, "/") && path[0]) goto fail;
    for (int i = 0; i < n; i++) {
        req->param_names[i] = names[i];
        req->param_values[i] = values[i];
    }
    req->n_params = n;
    return 1;
fail:
    for (int i = 0; i < n; i++) {
        free(names[i]);
        free(values[i]);
    }
    return 0;
}

/* ------------------------------------------------------------------ responses */

const char *api_status_phrase(int status) {
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Error";
    }
}

static void add_common_headers(api_request *r, struct MHD_Response *resp) {
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "*");
    int custom_allow = 0;
    for (int i = 0; i < r->n_headers; i++)
        custom_allow |= !strcasecmp(r->header_names[i], "Access-Control-Allow-Headers");
    if (!custom_allow) MHD_add_response_header(resp, "Access-Control-Allow-Headers", "*");
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "*");
    for (int i = 0; i < r->n_headers; i++)
        MHD_add_response_header(resp, r->header_names[i], r->header_values[i]);
}

static void queue(api_request *r, int status, struct MHD_Response *resp) {
    if (r->answered) {
        log_error("api: %s %s answered twice (bug)", r->method, r->path);
        MHD_destroy_response(resp);
        return;
    }
    r->answered = status;
    add_common_headers(r, resp);
    MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
}

void api_request_add_response_header(api_request *r, const char *name, const char *value) {
    if (r->n_headers == REQUEST_MAX_HEADERS) return;
    r->header_names[r->n_headers] = strdup(name);
    r->header_values[r->n_headers++] = strdup(value);
}

void api_respond_file(api_request *r, int status, const char *content_type, int fd,
                      unsigned long long offset, unsigned long long len) {
    struct MHD_Response *resp = MHD_create_response_from_fd_at_offset64(len, fd, offset);
    if (!resp) {
        close(fd);
        api_respond_error(r, 500, "cannot send the file");
        return;
    }
    if (content_type) MHD_add_response_header(resp, "Content-Type", content_type);
    queue(r, status, resp);
}

void api_respond_bytes(api_request *r, int status, const char *content_type, const void *data,
                       size_t len) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (content_type) MHD_add_response_header(resp, "Content-Type", content_type);
    queue(r, status, resp);
}

void api_respond_json(api_request *r, int status, json_t *body) {
    char *text = body ? json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(body);
    if (!text) text = strdup("null");
    size_t len = strlen(text);
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    queue(r, status, resp);
}

void api_respond_error(api_request *r, int status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_respond_json(r, status,
                     json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", msg, "type",
                               api_status_phrase(status), "param", "code", status));
}

/* ------------------------------------------------------------------ streams */

static void stream_unref(api_stream *s) {
    pthread_mutex_lock(&s->lock);
    int refs = --s->refs;
    pthread_mutex_unlock(&s->lock);
    if (refs) return;
    if (s->release) s->release(s->on_disconnect_arg);
    close(s->event_fd);
    strbuf_free(&s->queue);
    free(s->keepalive_text);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static void stream_wake(api_stream *s) {
    uint64_t one = 1;
    ssize_t n = write(s->event_fd, &one, sizeof one);
    (void)n;
}

/* Marks the client gone and tells the producer, once, unless it already finished. */
static void stream_mark_gone(api_stream *s) {
    void (*fn)(void *) = NULL;
    void *arg = NULL;
    pthread_mutex_lock(&s->lock);
    s->gone = 1;
    if (!s->closed && !s->disconnect_notified && s->on_disconnect) {
        s->disconnect_notified = 1;
        fn = s->on_disconnect;
        arg = s->on_disconnect_arg;
    }
    pthread_mutex_unlock(&s->lock);
    if (fn) fn(arg);
}

/* Direct mode, s->lock held: sends queue[sent..] without blocking. Returns -1 if the client is
 * gone. */
static int direct_flush_locked(api_stream *s) {
    while (s->sent < s->queue.len) {
        ssize_t n = send(s->client_fd, s->queue.data + s->sent, s->queue.len - s->sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (n <= 0) return -1;
        s->sent += (size_t)n;
    }
    strbuf_clear(&s->queue);
    s->sent = 0;
    return 0;
}

/* Direct mode, s->lock held: data as one chunk, sent at once when nothing is queued before it.
 * Returns 1 when bytes were left queued (the connection thread must be woken to flush them),
 * 0 when all went out, -1 when the client is gone. */
static int direct_write_locked(api_stream *s, const void *data, size_t len) {
    char head[24];
    int hn = snprintf(head, sizeof head, "%zx\r\n", len);
    if (s->sent == s->queue.len) {
        struct iovec iov[3] = {{head, (size_t)hn}, {(void *)data, len}, {"\r\n", 2}};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 3};
        size_t total = (size_t)hn + len + 2;
        ssize_t n;
        do n = sendmsg(s->client_fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        if (n == (ssize_t)total) return 0;
        size_t done = n > 0 ? (size_t)n : 0;
        strbuf_clear(&s->queue);
        s->sent = 0;
        /* queue what the socket did not take */
        for (int i = 0; i < 3; i++) {
            if (done >= iov[i].iov_len) {
                done -= iov[i].iov_len;
                continue;
            }
            strbuf_append(&s->queue, (char *)iov[i].iov_base + done, iov[i].iov_len - done);
            done = 0;
        }
        return 1;
    }
    strbuf_append(&s->queue, head, (size_t)hn);
    strbuf_append(&s->queue, data, len);
    strbuf_append(&s->queue, "\r\n", 2);
    return 1;
}

/* First call in direct mode: MHD's buffer is empty (headers sent). Queued bytes become a chunk;
 * MHD's idle timeout is paused (it sees none of our writes) until the stream ends. */
static void direct_begin_locked(api_stream *s) {
    s->direct = 1;
    if (s->queue.len > s->sent) {
        strbuf framed = {0};
        strbuf_appendf(&framed, "%zx\r\n", s->queue.len - s->sent);
        strbuf_append(&framed, s->queue.data + s->sent, s->queue.len - s->sent);
        strbuf_append(&framed, "\r\n", 2);
        strbuf_free(&s->queue);
        s->queue = framed;
        s->sent = 0;
    }
    MHD_set_connection_option(s->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
}

/* Leaving direct mode: MHD takes the socket back; restoring the timeout restarts its clock. */
static void direct_end(api_stream *s) {
    MHD_set_connection_option(s->conn, MHD_CONNECTION_OPTION_TIMEOUT, s->idle_timeout_s);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    api_stream *s = cls;
    pthread_mutex_lock(&s->lock);
    if (s->can_direct && !s->direct && !s->gone) direct_begin_locked(s);
    pthread_mutex_unlock(&s->lock);
    for (;;) {
        pthread_mutex_lock(&s->lock);
        size_t avail = s->queue.len - s->sent;
        if (s->direct) {
            if (avail && !s->send_failed && direct_flush_locked(s)) s->send_failed = 1;
            avail = s->queue.len - s->sent;
        } else if (avail) {
            size_t n = avail < max ? avail : max;
            memcpy(buf, s->queue.data + s->sent, n);
            s->sent += n;
            if (s->sent == s->queue.len) {
                strbuf_clear(&s->queue);
                s->sent = 0;
            }
            pthread_mutex_unlock(&s->lock);
            return (ssize_t)n;
        }
        int closed = s->closed, gone = s->gone, ka_ms = s->keepalive_ms;
        int failed = s->send_failed, direct = s->direct;
        pthread_mutex_unlock(&s->lock);
        if (failed) stream_mark_gone(s);
        if (gone || failed) {
            if (direct) direct_end(s);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (closed && !avail) {
            if (direct) direct_end(s);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }

        struct pollfd fds[2] = {{.fd = s->event_fd, .events = POLLIN},
                                {.fd = s->client_fd, .events = POLLRDHUP | (avail ? POLLOUT : 0)}};
        int nfds = s->client_fd >= 0 ? 2 : 1;
        int rc = poll(fds, (nfds_t)nfds, ka_ms > 0 ? ka_ms : -1);
        if (rc < 0 && errno != EINTR) {
            /* producers must never write to the socket once this callback has returned */
            stream_mark_gone(s);
            if (direct) direct_end(s);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (rc > 0 && (fds[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t n = read(s->event_fd, &v, sizeof v);
            (void)n;
        }
        if (nfds == 2 && (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            stream_mark_gone(s);
            if (direct) direct_end(s);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (rc == 0 && ka_ms > 0) {
            pthread_mutex_lock(&s->lock);
            if (s->keepalive_text && s->queue.len == s->sent) {
                if (!s->direct)
                    strbuf_append_str(&s->queue, s->keepalive_text);
                else if (direct_write_locked(s, s->keepalive_text, strlen(s->keepalive_text)) < 0)
                    s->send_failed = 1;
            }
            pthread_mutex_unlock(&s->lock);
        }
    }
}

static void stream_free_cb(void *cls) {
    api_stream *s = cls;
    /* The response is destroyed: either fully sent after close, or the connection died. */
    pthread_mutex_lock(&s->lock);
    int finished = s->closed && s->queue.len == s->sent;
    pthread_mutex_unlock(&s->lock);
    if (!finished) stream_mark_gone(s);
    stream_unref(s);
}

api_stream *api_respond_stream(api_request *r, int status, const char *content_type) {
    api_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->lock, NULL);
    s->refs = 2;
    s->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->conn = r->conn;
    s->idle_timeout_s = r->server->options.idle_timeout_s;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    s->client_fd = ci ? ci->connect_fd : -1;
    /* tokens are small writes that must leave at once: no Nagle delay */
    int one = 1;
    if (s->client_fd >= 0)
        setsockopt(s->client_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    s->can_direct = s->client_fd >= 0 && r->http11 && strcmp(r->method, "HEAD") &&
                    !getenv("EXO_API_NO_DIRECT_WRITE");
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_reader, s,
                                          stream_free_cb);
    MHD_add_response_header(resp, "Content-Type", content_type);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    queue(r, status, resp);
    return s;
}

int api_stream_write(api_stream *s, const void *data, size_t len) {
    pthread_mutex_lock(&s->lock);
    int gone = s->gone || s->send_failed, wake = 1;
    if (!gone && !s->closed && len) {
        if (!s->direct) {
            strbuf_append(&s->queue, data, len);
        } else {
            wake = direct_write_locked(s, data, len);
            if (wake < 0) {
                s->send_failed = gone = 1; /* the connection thread reports the disconnect */
                wake = 1;
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (wake) stream_wake(s);
    return gone ? -1 : 0;
}

int api_stream_printf(api_stream *s, const char *fmt, ...) {
    char small[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    if ((size_t)n < sizeof small) return api_stream_write(s, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return -1;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = api_stream_write(s, big, (size_t)n);
    free(big);
    return rc;
}

void api_stream_set_keepalive(api_stream *s, const char *text, int interval_ms) {
    pthread_mutex_lock(&s->lock);
    free(s->keepalive_text);
    s->keepalive_text = text ? strdup(text) : NULL;
    s->keepalive_ms = interval_ms;
    pthread_mutex_unlock(&s->lock);
    stream_wake(s);
}

void api_stream_on_disconnect(api_stream *s, void (*fn)(void *), void *arg,
                              void (*release)(void *)) {
    pthread_mutex_lock(&s->lock);
    s->on_disconnect = fn;
    s->on_disconnect_arg = arg;
    s->release = release;
    int gone = s->gone && !s->disconnect_notified && !s->closed;
    if (gone) s->disconnect_notified = 1;
    pthread_mutex_unlock(&s->lock);
    if (gone && fn) fn(arg);
}

int api_stream_client_gone(api_stream *s) {
    pthread_mutex_lock(&s->lock);
    int gone = s->gone;
    pthread_mutex_unlock(&s->lock);
    return gone;
}

void api_stream_close(api_stream *s) {
    pthread_mutex_lock(&s->lock);
    s->closed = 1;
    pthread_mutex_unlock(&s->lock);
    stream_wake(s);
    stream_unref(s);
}

/* ------------------------------------------------------------------ requests */

const char *api_request_method(const api_request *r) { return r->method; }
const char *api_request_path(const api_request *r) { return r->path; }

const char *api_request_param(const api_request *r, const char *name) {
    for (int i = 0; i < r->n_params; i++)
        if (!strcmp(r->param_names[i], name)) return r->param_values[i];
    return NULL;
}

const char *api_request_query(const api_request *r, const char *key) {
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

const char *api_request_header(const api_request *r, const char *name) {
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

int api_request_client_gone(api_request *r) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

const char *api_request_body(const api_request *r, size_t *len) {
    if (len) *len = r->body.len;
    return r->body.data ? r->body.data : "";
}

json_t *api_request_json_quiet(api_request *r, char *err, size_t errlen) {
    json_error_t je;
    if (r->body.len == 0) {
        snprintf(err, errlen, "request body is empty; expected a JSON object");
        return NULL;
    }
    json_t *j = json_loadb(r->body.data, r->body.len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        snprintf(err, errlen, "malformed JSON at line %d column %d (byte %d): %s", je.line,
                 je.column, je.position, je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(err, errlen, "request body must be a JSON object");
        return NULL;
    }
    return j;
}

json_t *api_request_json(api_request *r) {
    char err[512];
    json_t *j = api_request_json_quiet(r, err, sizeof err);
    if (!j) api_respond_error(r, 400, "%s", err);
    return j;
}

static void request_free(api_request *r) {
    if (!r) return;
    free(r->path);
    for (int i = 0; i < r->n_params; i++) {
        free(r->param_names[i]);
        free(r->param_values[i]);
    }
    for (int i = 0; i < r->n_headers; i++) {
        free(r->header_names[i]);
        free(r->header_values[i]);
    }
    strbuf_free(&r->body);
    free(r);
}

/* ------------------------------------------------------------------ static files */

static const char *content_type_for(const char *path) {
    const char *dot = strrchr(path, '.');
    if (!dot) return "application/octet-stream";
    static const char *map[][2] = {
        {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
        {".mjs", "text/javascript; charset=utf-8"}, {".css", "text/css; charset=utf-8"},
        {".json", "application/json"}, {".svg", "image/svg+xml"}, {".png", "image/png"},
        {".ico", "image/x-icon"}, {".woff2", "font/woff2"}, {".txt", "text/plain; charset=utf-8"},
        {".map", "application/json"}, {".webp", "image/webp"}, {".jpg", "image/jpeg"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcasecmp(dot, map[i][0])) return map[i][1];
    return "application/octet-stream";
}

static const char MINIMAL_PAGE[] =
    "<!doctype html><html><head><meta charset=utf-8><title>exo</title></head><body>"
    "<h1>exo</h1><p>This node serves the OpenAI, Claude, Responses and Ollama APIs. "
    "The dashboard is not installed (no web/index.html).</p>"
    "<p>Try <code>curl localhost:52415/v1/models</code>.</p></body></html>";

/* Returns 1 if a file (or the minimal page) was served. */
static int serve_static(api_request *r) {
    if (strcmp(r->method, "GET") && strcmp(r->method, "HEAD")) return 0;
    const char *path = r->path;
    if (strstr(path, "..") || strchr(path, '\\')) return 0;
    if (r->server->web_dir) {
        char full[4096];
        const char *rel = (!strcmp(path, "/") || !path[0]) ? "/index.html" : path;
        int n = snprintf(full, sizeof full, "%s%s", r->server->web_dir, rel);
        if (n > 0 && (size_t)n < sizeof full && paths_is_file(full)) {
            size_t len;
            char *data = paths_read_file(full, 256u << 20, &len);
            if (data) {
                api_respond_bytes(r, 200, content_type_for(full), data, len);
                free(data);
                return 1;
            }
        }
    }
    if (!strcmp(path, "/") || !strcmp(path, "/index.html")) {
        api_respond_bytes(r, 200, "text/html; charset=utf-8", MINIMAL_PAGE,
                          sizeof MINIMAL_PAGE - 1);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ dispatch */

static int authorized(const api_request *r) {
    const char *key = r->server->api_key;
    if (!key || !key[0]) return 1;
    const char *auth = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Authorization");
    if (auth && !strncasecmp(auth, "Bearer ", 7) && !strcmp(auth + 7, key)) return 1;
    const char *x = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "x-api-key");
    return x && !strcmp(x, key);
}

/* 401 in the error shape of the API the client speaks (Claude and Ollama clients parse theirs). */
static void respond_unauthorized(api_request *r) {
    const char *msg = "missing or wrong API key: send 'Authorization: Bearer KEY' or "
                      "'x-api-key: KEY'";
    if (!strncmp(r->path, "/v1/messages", 12))
        api_respond_json(r, 401, json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                                           "authentication_error", "message", msg));
    else if (!strncmp(r->path, "/ollama", 7))
        api_respond_json(r, 401, json_pack("{s:s}", "error", msg));
    else
        api_respond_error(r, 401, "%s", msg);
}

static void dispatch(api_request *r) {
    if (!strcmp(r->method, "OPTIONS")) {
        const char *want = api_request_header(r, "Access-Control-Request-Headers");
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
        if (want) api_request_add_response_header(r, "Access-Control-Allow-Headers", want);
        queue(r, 204, resp);
        return;
    }
    const char *method = strcmp(r->method, "HEAD") ? r->method : "GET";
    api_server *s = r->server;
    pthread_mutex_lock(&s->routes_lock);
    route *best = NULL;
    int best_score = -1, path_matched = 0;
    for (int i = 0; i < s->n_routes; i++) {
        api_request probe = {0};
        int score;
        if (!route_match(&s->routes[i], r->path, &probe, &score)) continue;
        path_matched = 1;
        int method_ok = !strcmp(s->routes[i].method, method);
        if (method_ok && score > best_score) {
            for (int k = 0; k < r->n_params; k++) {
                free(r->param_names[k]);
                free(r->param_values[k]);
            }
            memcpy(r->param_names, probe.param_names, sizeof probe.param_names);
            memcpy(r->param_values, probe.param_values, sizeof probe.param_values);
            r->n_params = probe.n_params;
            best = &s->routes[i];
            best_score = score;
        } else {
            for (int k = 0; k < probe.n_params; k++) {
                free(probe.param_names[k]);
                free(probe.param_values[k]);
            }
        }
    }
    route chosen = best ? *best : (route){0};
    pthread_mutex_unlock(&s->routes_lock);

    if (!best) {
        if (serve_static(r)) return;
        if (!authorized(r)) {
            respond_unauthorized(r);
            return;
        }
        if (path_matched)
            api_respond_error(r, 405, "%s is not allowed on %s", r->method, r->path);
        else
            api_respond_error(r, 404, "no route for %s %s", r->method, r->path);
        return;
    }
    if (!(chosen.flags & API_ROUTE_PUBLIC) && !authorized(r)) {
        respond_unauthorized(r);
        return;
    }
    chosen.handler(r, chosen.ctx);
    if (!r->answered) {
        log_error("api: handler for %s %s did not answer (bug)", r->method, chosen.pattern);
        api_respond_error(r, 500, "the handler for %s gave no answer", r->path);
    }
}

/* The connection's deadline entry (NULL when it has none). */
static conn_watch_entry *watch_entry(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls) {
    api_server *s = cls;
    api_request *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->server = s;
        r->conn = conn;
        snprintf(r->method, sizeof r->method, "%s", method);
        r->path = strdup(url && url[0] ? url : "/");
        const char *conn_hdr = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Connection");
        r->http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1) &&
                    !(conn_hdr && strcasestr(conn_hdr, "close"));
        *con_cls = r;
        conn_watch_set_phase(s->watch, watch_entry(conn), CONN_BODY);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->options.max_body_bytes) {
            r->body_too_large = 1;
            metrics_request(metrics_api_of_path(r->path), 413);
            api_respond_error(r, 413, "request body of %s bytes is over the limit of %zu bytes "
                                      "(start the node with --max-body-size to raise it)",
                              cl, s->options.max_body_bytes);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!r->body_too_large && r->body.len + *upload_data_size <= s->options.max_body_bytes)
            strbuf_append(&r->body, upload_data, *upload_data_size);
        else
            r->body_too_large = 1;
        *upload_data_size = 0;
        return MHD_YES;
    }
    conn_watch_set_phase(s->watch, watch_entry(conn), CONN_HANDLING);
    if (r->answered) return MHD_YES;
    if (r->body_too_large) {
        metrics_request(metrics_api_of_path(r->path), 413);
        api_respond_error(r, 413, "request body is over the limit of %zu bytes",
                          s->options.max_body_bytes);
        return MHD_YES;
    }
    dispatch(r);
    return MHD_YES;
}

/* A request is over (answered, or the client left): a keep-alive connection waits for the next
 * one, with a fresh header deadline. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    api_server *s = cls;
    (void)toe;
    request_free(*con_cls);
    *con_cls = NULL;
    conn_watch_set_phase(s->watch, watch_entry(conn), CONN_WAITING);
}

/* The request line has arrived (called once per request, before the headers are parsed). */
static void *on_request_line(void *cls, const char *uri, struct MHD_Connection *conn) {
    api_server *s = cls;
    (void)uri;
    conn_watch_set_phase(s->watch, watch_entry(conn), CONN_HEADERS);
    return NULL; /* the first on_access call still sees *con_cls == NULL */
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    api_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&s->open_connections, 1);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? conn_watch_add(s->watch, ci->connect_fd) : NULL;
    } else {
        atomic_fetch_sub(&s->open_connections, 1);
        conn_watch_remove(s->watch, *socket_context);
        *socket_context = NULL;
    }
}

/* ------------------------------------------------------------------ lifecycle */

api_server *api_server_new(const api_server_options *options) {
    api_server *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->options = *options;
    if (!s->options.max_body_bytes) s->options.max_body_bytes = 32u << 20;
    if (!s->options.idle_timeout_s) s->options.idle_timeout_s = 300;
    if (!s->options.header_timeout_s) s->options.header_timeout_s = API_HEADER_TIMEOUT_S;
    if (!s->options.body_timeout_s) s->options.body_timeout_s = API_BODY_TIMEOUT_S;
    if (!s->options.max_connections) s->options.max_connections = API_MAX_CONNECTIONS;
    if (!s->options.max_connections_per_ip)
        s->options.max_connections_per_ip = API_MAX_CONNECTIONS_PER_IP;
    s->api_key = options->api_key && options->api_key[0] ? strdup(options->api_key) : NULL;
    s->web_dir = options->web_dir && options->web_dir[0] ? strdup(options->web_dir) : NULL;
    pthread_mutex_init(&s->routes_lock, NULL);
    return s;
}

/* libmicrohttpd's own messages (mostly clients that went away mid-response) are debug noise for
 * a node; start-up failures are reported by api_server_start itself. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    log_debug("http: %s", buf);
}

static void raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int api_server_start(api_server *s, char *err, size_t errlen) {
    raise_fd_limit();
    s->watch = conn_watch_start(s->options.header_timeout_s, s->options.body_timeout_s);
    if (!s->watch) {
        snprintf(err, errlen, "cannot start the HTTP request deadline thread");
        return -1;
    }
    /* A negative per-IP limit means none (MHD's 0). */
    unsigned per_ip = s->options.max_connections_per_ip < 0
                          ? 0u
                          : (unsigned)s->options.max_connections_per_ip;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    for (int attempt = 0; attempt < 2 && !s->daemon; attempt++) {
        unsigned f = attempt == 0 ? (flags | MHD_USE_DUAL_STACK) : flags;
        s->daemon = MHD_start_daemon(
            f, (uint16_t)s->options.port, NULL, NULL, on_access, s, MHD_OPTION_NOTIFY_COMPLETED,
            on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
            MHD_OPTION_URI_LOG_CALLBACK, on_request_line, s,
            MHD_OPTION_CONNECTION_TIMEOUT, s->options.idle_timeout_s,
            MHD_OPTION_CONNECTION_LIMIT, s->options.max_connections,
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
            MHD_OPTION_THREAD_STACK_SIZE, (size_t)(512u << 10), MHD_OPTION_LISTENING_ADDRESS_REUSE,
            1u, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256u << 10),
            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    }
    if (!s->daemon) {
        conn_watch_stop(s->watch);
        s->watch = NULL;
        snprintf(err, errlen, "cannot listen on port %d (in use, or not permitted); "
                              "choose another with --api-port",
                 s->options.port);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->options.port;
    return 0;
}

int api_server_port(const api_server *s) { return s->port; }

int api_server_open_connections(const api_server *s) {
    return atomic_load(&((api_server *)s)->open_connections);
}

unsigned long long api_server_request_timeouts(const api_server *s) {
    return conn_watch_timeouts(s->watch);
}

void api_server_stop(api_server *s) {
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    conn_watch_stop(s->watch); /* after the daemon: every connection has closed */
    s->watch = NULL;
}

void api_server_free(api_server *s) {
    if (!s) return;
    api_server_stop(s);
    for (int i = 0; i < s->n_routes; i++) route_clear(&s->routes[i]);
    free(s->routes);
    free(s->api_key);
    free(s->web_dir);
    pthread_mutex_destroy(&s->routes_lock);
    free(s);
}
