/* dist_bench — `exo bench --section dist` (dist_bench.c): our all-reduce beside a bare Gloo
 * ring on the same pairs, N local ranks, optionally through tools/netproxy. */
#ifndef EXO_DIST_BENCH_H
#define EXO_DIST_BENCH_H

/* argv as given to `exo bench` (argv[0] = "bench"); returns the exit status. */
int dist_bench_main(int argc, char **argv);

#endif
