/* cmd/runner — `exo runner --fd N --model DIR [--model-id ID] [--kv-cache-mem BYTES]
 * [--kv-cache-dtype f16|bf16|f32] [--threads N] [--device cpu|cuda|auto]`: the model runner
 * process (EXO_RUNNER_THREADS=N also sets the engine's threads). Started by a node, never by
 * hand: it speaks the runner protocol (runner/protocol.h) on fd N and exits when the node closes
 * it.
 * One rank of a model split over several runners (docs/distributed.md) adds
 *   --rank R --ranks N --parallel pipeline|tensor [--layers START:END] --dist-store DIR
 *   [--instance ID] [--dist-host HOST] [--dist-advertise HOST] [--dist-timeout-ms MS]
 *   [--dist-transport tcp|ibverbs]   (ibverbs: the instance is MlxJaccl and every node has RDMA)
 * The rendezvous store: `--dist-store node` asks the node over the runner socket (the node keeps
 * the keys in the cluster's replicated State: ranks on different machines), `--dist-store DIR` is
 * a directory shared by the ranks (one host: tests, bench). */
#include "cmd/cmd.h"

#include "base/log.h"
#include "dist/dist.h"
#include "runner/runner.h"
#include "runner/store_node.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One --rank/--ranks/... flag into o->dist; 1 if a was one of them, -1 on a bad value. */
static int parse_dist_flag(runner_options *o, const char *a, const char *v, const char **store_dir) {
    runner_dist *d = &o->dist;
    if (!strcmp(a, "--rank")) d->rank = atoi(v);
    else if (!strcmp(a, "--ranks")) d->size = atoi(v);
    else if (!strcmp(a, "--dist-store")) *store_dir = v;
    else if (!strcmp(a, "--instance")) d->instance = v;
    else if (!strcmp(a, "--dist-host")) d->bind_host = v;
    else if (!strcmp(a, "--dist-advertise")) d->advertise_host = v;
    else if (!strcmp(a, "--dist-timeout-ms")) d->timeout_ms = atoi(v);
    else if (!strcmp(a, "--dist-transport")) {
        if (strcmp(v, "tcp") && strcmp(v, "ibverbs")) return -1;
        d->transport = v;
    }
    else if (!strcmp(a, "--layers"))
        return sscanf(v, "%d:%d", &d->layer_start, &d->layer_end) == 2 ? 1 : -1;
    else if (!strcmp(a, "--parallel")) {
        if (!strcmp(v, "pipeline")) d->parallel = ENGINE_PIPELINE;
        else if (!strcmp(v, "tensor")) d->parallel = ENGINE_TENSOR;
        else return -1;
    } else return 0;
    return 1;
}

int cmd_runner_main(int argc, char **argv) {
    runner_options o = {.fd = -1};
    const char *store_dir = NULL;
    int dist_flag;
    const char *threads = getenv("EXO_RUNNER_THREADS"); /* engine threads; default all cores */
    if (threads) o.n_threads = atoi(threads);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--fd") && v) o.fd = atoi(argv[++i]);
        else if (!strcmp(a, "--model") && v) o.model_dir = argv[++i];
        else if (!strcmp(a, "--model-id") && v) o.model_id = argv[++i];
        else if (!strcmp(a, "--kv-cache-mem") && v) {
            if (options_parse_size(argv[++i], &o.kv_cache_bytes)) o.kv_cache_bytes = 0;
        }
        else if (!strcmp(a, "--kv-cache-dtype") && v) o.kv_cache_dtype = argv[++i];
        else if (!strcmp(a, "--threads") && v) o.n_threads = atoi(argv[++i]);
        else if (!strcmp(a, "--device") && v) o.device = argv[++i];
        else if (!strcmp(a, "--speculative") && v) o.speculative = argv[++i];
        else if (!strcmp(a, "--spec-k") && v) o.spec_tokens = atoi(argv[++i]);
        else if (v && (dist_flag = parse_dist_flag(&o, a, v, &store_dir)) != 0) {
            i++;
            if (dist_flag < 0) {
                fprintf(stderr, "exo runner: bad value '%s' for %s\n", v, a);
                return 2;
            }
        } else {
            fprintf(stderr, "exo runner: internal command, started by a node (unknown argument "
                            "'%s')\n", a);
            return 2;
        }
    }
    if (o.fd < 0 || !o.model_dir) {
        fprintf(stderr, "exo runner: internal command, started by a node (needs --fd and "
                        "--model)\n");
        return 2;
    }
    dist_store store;
    store_node node_store;
    int via_node = store_dir && !strcmp(store_dir, "node");
    if (o.dist.size > 1) {
        if (via_node) store_node_init(&node_store, o.fd, &store);
        if (!store_dir || (!via_node && dist_store_dir(&store, store_dir) != 0) || o.dist.rank < 0 ||
            o.dist.rank >= o.dist.size || o.dist.parallel == ENGINE_SINGLE) {
            fprintf(stderr, "exo runner: --ranks N needs --rank in 0..N-1, --parallel and a "
                            "usable --dist-store DIR|node\n");
            return 2;
        }
        o.dist.store = &store;
    }
    signal(SIGPIPE, SIG_IGN);
    char tag[64];
    snprintf(tag, sizeof tag, "runner %d", (int)getpid());
    if (o.dist.size > 1) snprintf(tag, sizeof tag, "runner %d rank %d", (int)getpid(), o.dist.rank);
    log_set_tag(tag);
    int rc = runner_run(&o);
    if (o.dist.store && via_node) store_node_free(&node_store);
    else if (o.dist.store) dist_store_dir_free(&store);
    return rc;
}
