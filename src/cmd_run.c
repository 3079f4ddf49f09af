#include "cmd.h"

#include <stdio.h>

int cmd_run_main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "exo run: the inference engine is not built yet\n");
    return 1;
}
