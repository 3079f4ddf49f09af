/* node — `exo` with no subcommand: wires the node's services from its options and runs until
 * SIGINT/SIGTERM, then stops them in reverse order. --model places a model at start.
 *
 * The cluster member (cluster/) starts first: its persistent node id is the API's node id.
 * Then the models service (download/: store, catalog, downloads), the worker (worker/: runners,
 * download-then-place, publishing to the cluster) and the HTTP API (api/: every route). With
 * --no-api the node is a cluster member only. Each service gets its own config struct built
 * here; none of them sees exo_options. */
#include "cmd/cmd.h"

#include "api/api.h"
#include "base/log.h"
#include "base/paths.h"
#include "cluster/cluster.h"
#include "cluster/nodeinfo.h"
#include "compute/device.h"
#include "download/models_api.h"
#include "worker/worker.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert(OPTIONS_MAX_PEERS <= CLUSTER_MAX_PEERS, "every --peer fits the cluster config");

void node_cluster_config(const exo_options *o, cluster_config *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->data_dir, sizeof out->data_dir, "%s", o->data_dir);
    snprintf(out->namespace_name, sizeof out->namespace_name, "%s", o->namespace_name);
    snprintf(out->cluster_key_file, sizeof out->cluster_key_file, "%s", o->cluster_key_file);
    out->listen_port = o->listen_port;
    out->api_port = o->no_api ? 0 : o->api_port;
    out->discovery_port = o->discovery_port;
    for (int i = 0; i < o->n_peers; i++) out->peers[i] = o->peers[i];
    out->n_peers = o->n_peers;
}

/* EXO_RUNNER_WATCHDOG_S: seconds; "0" turns the watchdog off; unset = the default. */
static int runner_watchdog_s(void) {
    const char *env = getenv("EXO_RUNNER_WATCHDOG_S");
    if (!env) return 0;
    int s = atoi(env);
    return s == 0 ? -1 : s;
}

/* EXO_HTTP_HEADER_TIMEOUT_S / EXO_HTTP_BODY_TIMEOUT_S: seconds a request's headers / body may
 * take to arrive (api/server.h); unset or 0 = the server's default. Tests shorten them. */
static unsigned env_seconds(const char *name) {
    const char *env = getenv(name);
    int s = env ? atoi(env) : 0;
    return s > 0 ? (unsigned)s : 0u;
}

/* A models dir the node cannot write fails every download later, far from the cause: say so at
 * start. (A probe file rather than access(2): root passes access() on a read-only mount.) */
static void warn_if_unwritable(const char *models_dir) {
    char probe[PATH_MAX];
    int fd = -1;
    if (paths_mkdir_p(models_dir) == 0 &&
        snprintf(probe, sizeof probe, "%s/.exo-write-probe-XXXXXX", models_dir) < (int)sizeof probe)
        fd = mkstemp(probe);
    if (fd >= 0) {
        close(fd);
        unlink(probe);
        return;
    }
    log_warn("the models directory %s is not writable (%s): downloads will fail; choose another "
             "with --models-dir or EXO_MODELS_DIR",
             models_dir, strerror(errno));
}

/* The services of a node with an API, in the order they start (and stop in reverse). */
typedef struct node_services {
    models_service *models;
    worker *worker;
    api_service *api;
} node_services;

static void services_free(node_services *n) {
    worker_stop(n->worker);    /* no more publishing; downloads waiting to be placed cancelled */
    api_service_stop(n->api);  /* no more requests */
    worker_free(n->worker);    /* every runner stopped */
    api_service_free(n->api);
    models_service_free(n->models);
}

static int services_start(node_services *n, const exo_options *o, const char *node_id, char *err,
                          size_t errlen) {
    memset(n, 0, sizeof *n);
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        snprintf(err, errlen, "cannot find the exo binary (/proc/self/exe)");
        return -1;
    }
    exe[len] = 0;
    models_service_options mo = {.models_dir = o->models_dir,
                                 .models_path = o->models_path,
                                 .data_dir = o->data_dir,
                                 .node_id = node_id,
                                 .offline = o->offline,
                                 .api_key = o->api_key};
    warn_if_unwritable(o->models_dir);
    n->models = models_service_new(&mo, err, errlen);
    if (!n->models) return -1;
    worker_config wc = {.runner_exe = exe,
                        .models_dir = o->models_dir,
                        .models_path = o->models_path,
                        .data_dir = o->data_dir,
                        .node_id = node_id,
                        .kv_cache_bytes = o->kv_cache_bytes,
                        .kv_cache_dtype = o->kv_cache_dtype,
                        .device = o->device,
                        .speculative = o->speculative,
                        .spec_tokens = o->spec_tokens,
                        .watchdog_s = runner_watchdog_s(),
                        .max_runners = o->max_runners,
                        .api_port = o->api_port,
                        .api_key = o->api_key};
    n->worker = worker_new(&wc, n->models, err, errlen);
    api_config ac = {.port = o->api_port,
                     .api_key = o->api_key,
                     .max_body_bytes = o->max_body_bytes,
                     .max_connections_per_ip =
                         o->max_connections_per_ip ? o->max_connections_per_ip : -1,
                     .header_timeout_s = env_seconds("EXO_HTTP_HEADER_TIMEOUT_S"),
                     .body_timeout_s = env_seconds("EXO_HTTP_BODY_TIMEOUT_S"),
                     .models_dir = o->models_dir,
                     .models_path = o->models_path,
                     .data_dir = o->data_dir};
    if (n->worker) n->api = api_service_new(&ac, node_id, n->worker, n->models, err, errlen);
    if (!n->api || api_service_start(n->api, err, errlen)) {
        services_free(n);
        return -1;
    }
    return 0;
}

double bench_read_gbs(size_t bytes, int reps, double *median_gbs); /* bench.c */

/* What this node's runners compute on, as engine_open resolves --device for a model the GPU
 * runs: `auto` is the GPU when this binary has CUDA and NVML lists one (NVML, so that the node
 * itself never starts CUDA and takes GPU memory). */
static const char *runner_device(const exo_options *o) {
    if (!strcmp(o->device, "cuda")) return "cuda";
    if (!strcmp(o->device, "cpu")) return "cpu";
    return compute_cuda_built() && nodeinfo_gpus(NULL, 0) > 0 ? "cuda" : "cpu";
}

/* The CPU's read bandwidth, all cores over 256 MiB (bench_read_gbs, ~0.2 s once at start, in
 * the background), for placement (cluster_set_memory_bandwidth). */
static void *measure_bandwidth(void *arg) {
    (void)arg;
    double gbs = bench_read_gbs((size_t)256 << 20, 3, NULL);
    log_info("memory read bandwidth: %.1f GB/s (published for placement)", gbs);
    cluster_set_memory_bandwidth(gbs);
    return NULL;
}

/* EXO_NODE_MEMORY_BANDWIDTH_GBS=X publishes X instead of measuring (tests, or a known figure). */
static void start_bandwidth_probe(void) {
    const char *env = getenv("EXO_NODE_MEMORY_BANDWIDTH_GBS");
    if (env && *env) {
        cluster_set_memory_bandwidth(atof(env));
        return;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, measure_bandwidth, NULL) == 0) pthread_detach(t);
}

void node_block_stop_signals(sigset_t *stop) {
    sigemptyset(stop);
    sigaddset(stop, SIGINT);
    sigaddset(stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, stop, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int node_main(const exo_options *options) {
    /* Block the stop signals in every thread; the main thread waits for them below. */
    sigset_t stop;
    node_block_stop_signals(&stop);

    cluster_config cc;
    node_cluster_config(options, &cc);
    if (!options->no_api) { /* a node with runners: placement weighs its device */
        snprintf(cc.device, sizeof cc.device, "%s", runner_device(options));
        if (!strcmp(cc.device, "cpu")) start_bandwidth_probe();
    }
    /* A node is a cluster member with its stored identity (--data-dir), or nothing: running
     * without the member would mean serving under an id of no cluster's (a random one), which
     * peers and the dashboard would take for another node. */
    if (cluster_start(&cc) != 0) {
        log_error("exo: not starting: the cluster member could not start (the reason is just "
                  "above; --listen-port 0 picks a free cluster port)");
        return 1;
    }
    if (options->no_api) {
        int sig = 0;
        sigwait(&stop, &sig);
        log_info("stopping (%s)", sig == SIGINT ? "SIGINT" : "SIGTERM");
        cluster_stop();
        return 0;
    }
    char node_id[64], err[1024];
    snprintf(node_id, sizeof node_id, "%s", cluster_node_id());
    node_services services;
    if (services_start(&services, options, node_id, err, sizeof err)) {
        log_error("%s", err);
        cluster_stop();
        return 1;
    }
    worker_join_cluster(services.worker);
    log_info("node %s: API and dashboard on http://0.0.0.0:%d", node_id,
             api_service_port(services.api));
    if (options->default_model[0]) {
        char id[64];
        int status = instances_place(worker_instances(services.worker), options->default_model,
                                     id, sizeof id, err, sizeof err);
        if (status) log_error("--model %s: %s", options->default_model, err);
    }
    int sig = 0;
    sigwait(&stop, &sig);
    log_info("stopping (%s)", sig == SIGINT ? "SIGINT" : "SIGTERM");
    services_free(&services);
    cluster_stop();
    return 0;
}
