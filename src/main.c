/* exo — command-line entry. Dispatches to a subcommand; everything else is a node.
 *   exo [flags]               node: HTTP API + cluster + worker (cmd/node.c)
 *   exo run MODEL [PROMPT]    one model in this terminal (cmd/run.c)
 *   exo bench                 benchmarks (cmd/bench.c)
 *   exo runner ...            internal: the model runner process (cmd/runner.c, runner/) */
#include "base/log.h"
#include "cmd/cmd.h"
#include "cmd/options.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "run")) return cmd_run_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "bench")) return cmd_bench_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "runner")) return cmd_runner_main(argc - 1, argv + 1);

    exo_options options;
    options_defaults(&options);
    char err[512] = "";
    switch (options_parse(&options, argc, argv, err, sizeof err)) {
    case OPTIONS_EXIT:
        return 0;
    case OPTIONS_ERROR:
        fprintf(stderr, "exo: %s\n", err);
        return 2;
    case OPTIONS_OK:
        break;
    }
    log_set_level(options.verbosity >= 1   ? LOG_LEVEL_DEBUG
                  : options.verbosity < 0 ? LOG_LEVEL_WARN
                                          : LOG_LEVEL_INFO);
    log_set_tag("node");
    return node_main(&options);
}
