/* cmd — the subcommands main.c dispatches to, and the one place that knows the command line:
 * each module below takes its own small config struct, which cmd/ fills from exo_options
 * (options.h) and the environment. Each *_main returns the process exit code (0 ok, 1 failure,
 * 2 bad usage) and parses its own flags from argv[1..].
 *
 * It refuses: logic of its own beyond parsing flags, wiring services together and printing;
 * what a command does lives in the modules it calls. */
#ifndef EXO_CMD_H
#define EXO_CMD_H

#include "cluster/cluster.h"
#include "cmd/options.h"

#include <signal.h>

int cmd_run_main(int argc, char **argv);
int cmd_bench_main(int argc, char **argv);
int cmd_runner_main(int argc, char **argv);
/* Runs a node until SIGINT/SIGTERM. */
int node_main(const exo_options *options);
/* The cluster member's configuration from the node's flags (node.c; tools/cluster-node). The
 * peers point into o (borrowed). */
void node_cluster_config(const exo_options *o, cluster_config *out);
/* Blocks SIGINT/SIGTERM in the calling thread and every thread it starts later (the main thread
 * then sigwait()s on *stop) and ignores SIGPIPE (a peer closing a socket is an error return). */
void node_block_stop_signals(sigset_t *stop);

#endif
