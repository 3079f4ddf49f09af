/* node — `exo` with no subcommand: starts the HTTP API (api/) and runs until SIGINT/SIGTERM,
 * then stops the server and every runner it started. --model places a model at start.
 * The cluster member (cluster/) starts first: its persistent node id is the API's node id, and
 * its State and log are served through cluster_routes. With --no-api the node is a cluster
 * member only. */
#include "cmd.h"

#include "api/api.h"
#include "api/routes_models.h"
#include "api/server.h"
#include "base/log.h"
#include "cluster/cluster.h"
#include "cluster_routes.h"
#include "cluster_sync.h"
#include "autoplace.h"
#include "placement_routes.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

static void make_node_id(char *out, size_t n) {
    unsigned char b[16] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) b[0] = 1;
    char hex[33];
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", b[i]);
    snprintf(out, n, "%s", hex);
}

int node_main(const exo_options *options) {
    /* Block the stop signals in every thread; the main thread waits for them below. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* Without the cluster (port taken, data dir locked, bad --cluster-key) a node still serves
     * its own API; the reason is in the log just above. */
    int clustered = cluster_start(options) == 0;
    if (!clustered) log_error("cluster: not joined; this node serves alone");
    if (options->no_api) {
        if (!clustered) return 1;
        int sig = 0;
        sigwait(&stop, &sig);
        log_info("stopping (%s)", sig == SIGINT ? "SIGINT" : "SIGTERM");
        cluster_stop();
        return 0;
    }
    char node_id[64], err[1024];
    if (clustered) snprintf(node_id, sizeof node_id, "%s", cluster_node_id());
    else make_node_id(node_id, sizeof node_id);
    api_service *svc = api_service_new(options, node_id, err, sizeof err);
    if (!svc) {
        log_error("%s", err);
        cluster_stop();
        return 1;
    }
    cluster_routes_add(api_service_server(svc), api_service_instances(svc));
    placement_routes_add(api_service_server(svc), options);
    models_service *models = routes_models_install(api_service_server(svc), options, node_id, err,
                                                   sizeof err);
    if (!models) {
        log_error("%s", err);
        api_service_free(svc);
        cluster_stop();
        return 1;
    }
    autoplace *ap = autoplace_install(api_service_server(svc), api_service_instances(svc), models,
                                      options->api_port);
    api_model_fetcher fetcher;
    autoplace_fetcher(ap, &fetcher);
    api_service_set_fetcher(svc, &fetcher);
    if (api_service_start(svc, err, sizeof err)) {
        log_error("%s", err);
        autoplace_stop(ap);
        api_service_free(svc);
        models_service_free(models);
        cluster_stop();
        return 1;
    }
    cluster_sync *sync = clustered ? cluster_sync_start(api_service_instances(svc)) : NULL;
    if (clustered) download_manager_set_listener(models->downloads, cluster_sync_download_listener, NULL);
    log_info("node %s: API and dashboard on http://0.0.0.0:%d", node_id,
             api_server_port(api_service_server(svc)));
    if (options->default_model[0]) {
        char id[64];
        int status = instances_place(api_service_instances(svc), options->default_model, id,
                                     sizeof id, err, sizeof err);
        if (status) log_error("--model %s: %s", options->default_model, err);
    }
    int sig = 0;
    sigwait(&stop, &sig);
    log_info("stopping (%s)", sig == SIGINT ? "SIGINT" : "SIGTERM");
    cluster_sync_stop(sync);
    autoplace_stop(ap);
    api_service_free(svc);
    models_service_free(models);
    cluster_stop();
    return 0;
}
