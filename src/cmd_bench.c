#include "cmd.h"

#include <stdio.h>

int cmd_bench_main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "exo bench: not built yet\n");
    return 1;
}
