/* cmd_runner — `exo runner --fd N --model DIR [--model-id ID] [--kv-cache-mem BYTES]
 * [--threads N] [--device cpu|cuda|auto]`: the model runner process (EXO_RUNNER_THREADS=N also sets the engine's threads). Started by a node, never by hand: it speaks the
 * runner protocol (runner/protocol.h) on fd N and exits when the node closes it. */
#include "cmd.h"

#include "base/log.h"
#include "runner/runner.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cmd_runner_main(int argc, char **argv) {
    runner_options o = {.fd = -1};
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
        else if (!strcmp(a, "--threads") && v) o.n_threads = atoi(argv[++i]);
        else if (!strcmp(a, "--device") && v) o.device = argv[++i];
        else {
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
    signal(SIGPIPE, SIG_IGN);
    char tag[64];
    snprintf(tag, sizeof tag, "runner %d", (int)getpid());
    log_set_tag(tag);
    return runner_run(&o);
}
