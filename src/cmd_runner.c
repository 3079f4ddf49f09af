#include "cmd.h"

#include <stdio.h>

int cmd_runner_main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "exo runner: internal command, started by a node\n");
    return 2;
}
