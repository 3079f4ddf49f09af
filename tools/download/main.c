/* download — developer/test front end to download/ without a running node.
 *   download get MODEL --models-dir DIR [--parallel N] [--offline] [--layers A:B] [--peer URL]...
 *                [--retries N] [--backoff-ms N] [--interval-ms N] [--json] [--min-free BYTES]
 *   download serve --models-dir DIR [--models-path P] --port N   (peer-transfer routes only)
 *   download search QUERY [--limit N]
 *   download delete MODEL --models-dir DIR
 * `get` prints progress (a bar, or one JSON object per line with --json) and exits with the
 * download_error code (0 = ok). SIGINT/SIGTERM cancel a download (exit 6). */
#include "download/download.h"
#include "download/serve.h"
#include "model/store.h"

#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile int cancel_flag;
static void on_signal(int sig) {
    (void)sig;
    cancel_flag = 1;
}

static void json_progress(const download_progress *p, void *ud) {
    (void)ud;
    json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:i, s:i}", "event", "progress",
                          "status",
                          p->status == DOWNLOAD_COMPLETED ? "completed"
                          : p->status == DOWNLOAD_FAILED  ? "failed"
                                                          : "ongoing",
                          "downloaded_bytes", (json_int_t)p->downloaded_bytes, "total_bytes",
                          (json_int_t)p->total_bytes, "fetched_bytes", (json_int_t)p->fetched_bytes,
                          "speed", p->speed, "eta_seconds", p->eta_seconds, "files_done",
                          p->files_done, "files_total", p->files_total);
    char *s = json_dumps(j, JSON_COMPACT);
    printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(j);
}

static int usage(void) {
    fprintf(stderr, "usage: download get MODEL --models-dir DIR [options] | serve --models-dir DIR "
                    "--port N | search QUERY [--limit N]\n");
    return 2;
}

static int cmd_get(int argc, char **argv) {
    if (argc < 2) return usage();
    download_request req = {.model_id = argv[1]};
    const char *peers[16];
    int json = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--models-dir") && v) req.models_dir = argv[++i];
        else if (!strcmp(a, "--parallel") && v) req.parallel = atoi(argv[++i]);
        else if (!strcmp(a, "--offline")) req.offline = 1;
        else if (!strcmp(a, "--retries") && v) req.max_retries = atoi(argv[++i]);
        else if (!strcmp(a, "--backoff-ms") && v) req.backoff_ms = atoi(argv[++i]);
        else if (!strcmp(a, "--interval-ms") && v) req.progress_interval_ms = atoi(argv[++i]);
        else if (!strcmp(a, "--min-free") && v) req.min_free_bytes = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--peer") && v && req.n_peers < 16) peers[req.n_peers++] = argv[++i];
        else if (!strcmp(a, "--layers") && v) {
            if (sscanf(argv[++i], "%d:%d", &req.layer_start, &req.layer_end) != 2 ||
                req.layer_start < 0 || req.layer_end <= req.layer_start) {
                fprintf(stderr, "download: --layers wants START:END with START < END\n");
                return 2;
            }
        } else {
            fprintf(stderr, "download: unknown or incomplete option %s\n", a);
            return 2;
        }
    }
    if (!req.models_dir) return usage();
    req.peers = peers;
    req.cancel = &cancel_flag;
    req.progress = json ? json_progress : download_progress_bar;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    download_result res;
    enum download_error e = download_model(&req, &res);
    if (json) {
        json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:i, s:i}", "event", "result", "error",
                              download_error_name(e), "message", res.message, "model_dir",
                              res.model_dir, "bytes_fetched", (json_int_t)res.bytes_fetched,
                              "bytes_from_peers", (json_int_t)res.bytes_from_peers,
                              "files_fetched", res.files_fetched, "files_planned", res.files_planned);
        char *s = json_dumps(j, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else if (e) {
        fprintf(stderr, "download: %s\n", res.message);
    }
    return (int)e;
}

static model_store serve_store;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)cls, (void)version, (void)upload, (void)upload_size, (void)con_cls;
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) return MHD_NO;
    return (enum MHD_Result)serve_mhd(c, &serve_store, url);
}

static int cmd_serve(int argc, char **argv) {
    const char *dir = NULL, *path = NULL;
    int port = 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--models-dir")) dir = argv[++i];
        else if (!strcmp(argv[i], "--models-path")) path = argv[++i];
        else if (!strcmp(argv[i], "--port")) port = atoi(argv[++i]);
    }
    char err[256];
    if (!dir || port <= 0 || store_init(&serve_store, dir, path, err, sizeof err) < 0) return usage();
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION,
                                            (uint16_t)port, NULL, NULL, on_request, NULL, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "download: cannot listen on port %d\n", port);
        return 1;
    }
    printf("serving %s on port %d\n", dir, port);
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    while (!cancel_flag) pause();
    MHD_stop_daemon(d);
    return 0;
}

static int cmd_delete(int argc, char **argv) {
    if (argc < 4 || strcmp(argv[2], "--models-dir")) return usage();
    model_store st;
    char err[512];
    if (store_init(&st, argv[3], NULL, err, sizeof err) < 0 || store_delete(&st, argv[1], err, sizeof err) < 0) {
        fprintf(stderr, "download: %s\n", err);
        return DOWNLOAD_ERR_BAD_INPUT;
    }
    return 0;
}

static int cmd_search(int argc, char **argv) {
    if (argc < 2) return usage();
    int limit = 20;
    for (int i = 2; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--limit")) limit = atoi(argv[++i]);
    hf_config hf;
    hf_config_from_env(&hf);
    char err[512];
    json_t *r = hf_search(&hf, argv[1], limit, err, sizeof err);
    if (!r) {
        fprintf(stderr, "download: %s\n", err);
        return 1;
    }
    char *s = json_dumps(r, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(r);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (!strcmp(argv[1], "get")) return cmd_get(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(argv[1], "search")) return cmd_search(argc - 1, argv + 1);
    if (!strcmp(argv[1], "delete")) return cmd_delete(argc - 1, argv + 1);
    return usage();
}
