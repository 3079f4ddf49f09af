/* cluster-node — a node with the cluster control plane and nothing else, for the multi-node
 * tests and the scale benchmark: `cluster-node [exo node flags]`. It serves the cluster's HTTP
 * endpoints (GET /node_id, /state, /state/{path}, /events, /cluster/status) on --api-port and,
 * for tests only, POST /cluster/submit {"EventName": {...}} to submit an event as this node.
 * It runs no models and no worker; it is not the `exo` binary (cmd/node.c wires the full node). */
#include "base/log.h"
#include "cluster/cluster.h"
#include "cmd/cmd.h"

#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct upload {
    char *data;
    size_t len;
} upload;

static enum MHD_Result answer(struct MHD_Connection *conn, int status, char *body) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *data,
                              size_t *data_size, void **con_cls) {
    (void)cls;
    (void)version;
    if (!strcmp(method, "POST")) {
        upload *u = *con_cls;
        if (!u) {
            *con_cls = calloc(1, sizeof *u);
            return *con_cls ? MHD_YES : MHD_NO;
        }
        if (*data_size) {
            if (u->len + *data_size > (1 << 20)) return MHD_NO;
            char *d = realloc(u->data, u->len + *data_size + 1);
            if (!d) return MHD_NO;
            memcpy(d + u->len, data, *data_size);
            u->data = d;
            u->len += *data_size;
            u->data[u->len] = 0;
            *data_size = 0;
            return MHD_YES;
        }
        if (strcmp(url, "/cluster/submit"))
            return answer(conn, 404, strdup("{\"error\":{\"message\":\"not found\"}}"));
        json_t *ev = u->data ? json_loads(u->data, 0, NULL) : NULL;
        int rc = cluster_submit(ev);
        return answer(conn, rc ? 400 : 200,
                      strdup(rc ? "{\"error\":{\"message\":\"an event is {\\\"Name\\\": {...}}\"}}"
                                : "{\"ok\":true}"));
    }
    if (strcmp(method, "GET"))
        return answer(conn, 405, strdup("{\"error\":{\"message\":\"method not allowed\"}}"));
    int status;
    char *body;
    const char *since = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "since");
    char query[64] = "";
    if (since) snprintf(query, sizeof query, "since=%s", since);
    if (!cluster_http_get(url, query, &status, &body))
        return answer(conn, 404, strdup("{\"error\":{\"message\":\"not found\"}}"));
    return answer(conn, status, body);
}

static void done(void *cls, struct MHD_Connection *conn, void **con_cls,
                 enum MHD_RequestTerminationCode code) {
    (void)cls;
    (void)conn;
    (void)code;
    upload *u = *con_cls;
    if (u) {
        free(u->data);
        free(u);
    }
    *con_cls = NULL;
}

int main(int argc, char **argv) {
    exo_options o;
    options_defaults(&o);
    char err[512];
    switch (options_parse(&o, argc, argv, err, sizeof err)) {
    case OPTIONS_EXIT: return 0;
    case OPTIONS_ERROR: fprintf(stderr, "cluster-node: %s\n", err); return 2;
    case OPTIONS_OK: break;
    }
    log_set_level(o.verbosity >= 1 ? LOG_LEVEL_DEBUG : o.verbosity < 0 ? LOG_LEVEL_WARN : LOG_LEVEL_INFO);
    log_set_tag("node");
    sigset_t stop;
    node_block_stop_signals(&stop);
    cluster_config cc;
    node_cluster_config(&o, &cc);
    if (cluster_start(&cc)) return 1;
    struct MHD_Daemon *d = NULL;
    if (!o.no_api) {
        d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION,
                             (uint16_t)o.api_port, NULL, NULL, handle, NULL,
                             MHD_OPTION_NOTIFY_COMPLETED, done, NULL, MHD_OPTION_END);
        if (!d) {
            log_error("cannot serve HTTP on port %d", o.api_port);
            cluster_stop();
            return 1;
        }
    }
    int sig = 0;
    sigwait(&stop, &sig);
    if (d) MHD_stop_daemon(d);
    cluster_stop();
    return 0;
}
