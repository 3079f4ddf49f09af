/* exo bench --model — end-to-end prefill/decode speed of one model through the engine door.
 * Placeholder until the engine lands on main. */
#include <stdio.h>

int bench_model_main(const char *model_dir, int argc, char **argv, double read_gbs);

int bench_model_main(const char *model_dir, int argc, char **argv, double read_gbs) {
    (void)argc;
    (void)argv;
    (void)read_gbs;
    fprintf(stderr, "exo bench: cannot benchmark %s: the inference engine is not built yet\n", model_dir);
    return 1;
}
