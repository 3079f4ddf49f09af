/* cmd — the subcommands main.c dispatches to. Each returns the process exit code
 * (0 ok, 1 failure, 2 bad usage) and parses its own flags from argv[1..]. */
#ifndef EXO_CMD_H
#define EXO_CMD_H

#include "options.h"

int cmd_run_main(int argc, char **argv);
int cmd_bench_main(int argc, char **argv);
int cmd_runner_main(int argc, char **argv);
/* Runs a node until SIGINT/SIGTERM. */
int node_main(const exo_options *options);

#endif
