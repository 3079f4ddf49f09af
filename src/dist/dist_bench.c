/* dist_bench — `exo bench --section dist`: the data plane's cost per all-reduce, measured
 * beside a bare Gloo ring on the same pairs in the same run, so the wrapper's overhead is a
 * difference of two numbers taken seconds apart on the same (noisy) machine.
 *
 * Forks N local ranks (a directory store in a fresh temporary directory); for each message size
 * every rank runs, in alternating rounds, dist_allreduce_sum and gloo::AllreduceRing built
 * directly on the group's context (dist_bench_bare_ring); rank 0 prints the median and best
 * round of each, their difference and ratio. With --delay-ms/--rate-gbit it starts
 * tools/netproxy (found beside the exo binary) and puts it in the data path: ranks bind
 * 127.0.0.2 at fixed ports and advertise the proxy on 127.0.0.1. Reports the CPU steal seen
 * during the run (on a shared VM it explains outliers). Refuses: more than 16 ranks, sizes
 * outside 4 bytes .. 1 GiB; it never writes files. */
#include "dist/dist_bench.h"

#include "base/clock.h"
#include "dist/dist.h"
#include "dist/dist_internal.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MAX_RANKS = 16, MAX_SIZES = 32 };

typedef struct dist_bench_options {
    int ranks;
    size_t sizes[MAX_SIZES]; /* bytes */
    int n_sizes;
    int rounds;
    double round_seconds; /* target duration of one timed round, per variant */
    double delay_ms, rate_gbit;
    int proxy;
    int timeout_ms;
} dist_bench_options;

/* Steal and total jiffies from /proc/stat's cpu line (0 when unreadable). */
static void read_steal(unsigned long long *steal, unsigned long long *total) {
    *steal = *total = 0;
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return;
    unsigned long long v[8] = {0};
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
               &v[5], &v[6], &v[7]) == 8) {
        for (int i = 0; i < 8; i++)
            *total += v[i];
        *steal = v[7];
    }
    fclose(f);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double min_of(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] < m) m = v[i];
    return m;
}

/* Times `iterations` of our all-reduce; every rank returns the same count of seconds only
 * approximately, rank 0's is the one printed. */
static int time_ours(dist_group *g, float *buf, size_t n, int iterations, double *seconds,
                     char *err, size_t errlen) {
    uint64_t t0 = clock_now_ns();
    for (int i = 0; i < iterations; i++)
        if (dist_allreduce_sum(g, buf, n, err, errlen) < 0) return -1;
    *seconds = (double)(clock_now_ns() - t0) * 1e-9;
    return 0;
}

/* How many iterations make a round last about round_seconds (decided by rank 0 from a probe and
 * broadcast, so every rank runs the same count). */
static int agree_iterations(dist_group *g, float *buf, size_t n, double round_seconds, char *err,
                            size_t errlen) {
    double warm = 0, probe = 0;
    int iterations = 10;
    /* The first runs build the cached collective and warm the connections. */
    if (time_ours(g, buf, n, 3, &warm, err, errlen) < 0 ||
        time_ours(g, buf, n, iterations, &probe, err, errlen) < 0)
        return -1;
    int32_t want =
        (int32_t)(round_seconds / (probe / iterations > 1e-7 ? probe / iterations : 1e-7));
    /* Bounded both ways: a probe that caught a quiet moment must not make a round last minutes
     * when the machine gets busy again. */
    if (want < 5) want = 5;
    if (want > 2000) want = 2000;
    if (dist_broadcast(g, 0, &want, sizeof want, err, errlen) < 0) return -1;
    return want;
}

static const char *human_bytes(size_t b, char *out, size_t len) {
    if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(out, len, "%zu MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(out, len, "%zu KiB", b >> 10);
    else
        snprintf(out, len, "%zu B", b);
    return out;
}

/* One rank's whole run; rank 0 prints. Returns 0 or 1. */
static int bench_rank(const dist_bench_options *o, const char *store_dir, int rank, int port_base) {
    dist_store store;
    if (dist_store_dir(&store, store_dir) < 0) return 1;
    dist_config c = {.rank = rank,
                     .size = o->ranks,
                     .prefix = "bench",
                     .bind_host = "127.0.0.1",
                     .timeout_ms = o->timeout_ms};
    if (o->proxy) {
        c.bind_host = "127.0.0.2";
        c.advertise_host = "127.0.0.1";
        c.port_base = port_base;
        c.advertise_port_offset = o->ranks * o->ranks;
    }
    char err[512];
    dist_group *g = dist_connect(&c, &store, err, sizeof err);
    if (!g) {
        fprintf(stderr, "exo bench dist: %s\n", err);
        dist_store_dir_free(&store);
        return 1;
    }
    size_t max_bytes = 0;
    for (int s = 0; s < o->n_sizes; s++)
        if (o->sizes[s] > max_bytes) max_bytes = o->sizes[s];
    float *buf = calloc(max_bytes / sizeof(float) + 1, sizeof(float));
    int rc = buf ? 0 : 1;
    if (rank == 0 && !rc) {
        printf("  %-9s %-8s %10s %10s %10s %10s %9s %7s %6s\n", "size", "algo", "ours_us", "best",
               "bare_us", "best", "over_us", "ratio", "iters");
        fflush(stdout);
    }
    for (int s = 0; s < o->n_sizes && !rc; s++) {
        size_t n = o->sizes[s] / sizeof(float);
        for (size_t i = 0; i < n; i++)
            buf[i] = 1.0f; /* sums stay finite at any iteration count */
        int iterations = agree_iterations(g, buf, n, o->round_seconds, err, sizeof err);
        if (iterations < 0) {
            rc = 1;
            break;
        }
        double ours[64], bare[64];
        for (int r = 0; r < o->rounds && !rc; r++) {
            /* Alternate which goes first, so a slow phase of the machine hits both alike. */
            double a = 0, b = 0;
            if (dist_barrier(g, err, sizeof err) < 0)
                rc = 1;
            else if (r % 2 == 0)
                rc = time_ours(g, buf, n, iterations, &a, err, sizeof err) < 0 ||
                     dist_bench_bare_ring(g, buf, n, iterations, &b, err, sizeof err) < 0;
            else
                rc = dist_bench_bare_ring(g, buf, n, iterations, &b, err, sizeof err) < 0 ||
                     time_ours(g, buf, n, iterations, &a, err, sizeof err) < 0;
            ours[r] = a / iterations * 1e6;
            bare[r] = b / iterations * 1e6;
        }
        if (rc) break;
        if (rank == 0) {
            char hb[32];
            double best_ours = min_of(ours, o->rounds), best_bare = min_of(bare, o->rounds);
            double med_ours = median(ours, o->rounds), med_bare = median(bare, o->rounds);
            printf("  %-9s %-8s %10.1f %10.1f %10.1f %10.1f %+9.1f %7.3f %6d\n",
                   human_bytes(o->sizes[s], hb, sizeof hb), dist_allreduce_algorithm(g, n),
                   med_ours, best_ours, med_bare, best_bare, med_ours - med_bare,
                   med_bare > 0 ? med_ours / med_bare : 0, iterations);
            fflush(stdout);
        }
    }
    if (rc) fprintf(stderr, "exo bench dist (rank %d): %s\n", rank, err);
    free(buf);
    dist_close(g);
    dist_store_dir_free(&store);
    return rc;
}

/* Starts tools/netproxy from the directory of this exo binary; 0 or -1. */
static pid_t start_proxy(const dist_bench_options *o, int port_base) {
    char exe[PATH_MAX], bin[PATH_MAX + 32];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return -1;
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(bin, sizeof bin, "%s/tools/netproxy", exe);
    int ports = o->ranks * o->ranks;
    char listen_arg[64], target_arg[64], count[16], delay[32], rate[32];
    snprintf(listen_arg, sizeof listen_arg, "127.0.0.1:%d", port_base + ports);
    snprintf(target_arg, sizeof target_arg, "127.0.0.2:%d", port_base);
    snprintf(count, sizeof count, "%d", ports);
    snprintf(delay, sizeof delay, "%g", o->delay_ms);
    snprintf(rate, sizeof rate, "%g", o->rate_gbit);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execl(bin, bin, "--listen", listen_arg, "--target", target_arg, "--count", count,
              "--delay-ms", delay, "--rate-gbit", rate, (char *)NULL);
        fprintf(stderr, "exo bench dist: cannot run %s: %s (make builds it)\n", bin,
                strerror(errno));
        _exit(127);
    }
    clock_sleep_ms(300); /* it listens within milliseconds; ranks that dial too early fail loudly */
    return waitpid(pid, NULL, WNOHANG) == 0 ? pid : -1;
}

static int parse_sizes(const char *v, dist_bench_options *o) {
    o->n_sizes = 0;
    for (const char *p = v; *p;) {
        char *e;
        unsigned long long n = strtoull(p, &e, 10);
        if (e == p) return -1;
        if (*e == 'K' || *e == 'k')
            n <<= 10, e++;
        else if (*e == 'M' || *e == 'm')
            n <<= 20, e++;
        if (n < 4 || n > (1ull << 30) || o->n_sizes == MAX_SIZES) return -1;
        o->sizes[o->n_sizes++] = (size_t)n / 4 * 4;
        if (*e && *e != ',') return -1;
        p = *e ? e + 1 : e;
    }
    return o->n_sizes ? 0 : -1;
}

static void usage(void) {
    fprintf(stderr, "usage: exo bench --section dist [--ranks N] [--sizes 4K,64K,1M] [--rounds N] "
                    "[--round-ms N]\n"
                    "                 [--delay-ms X] [--rate-gbit Y] [--quick]\n"
                    "  N local ranks on loopback; per all-reduce (float sum) our "
                    "dist_allreduce_sum beside a bare\n"
                    "  gloo::AllreduceRing on the same pairs. --delay-ms/--rate-gbit put "
                    "tools/netproxy in the path.\n");
}

int dist_bench_main(int argc, char **argv) {
    dist_bench_options o = {.ranks = 2, .rounds = 7, .round_seconds = 0.25, .timeout_ms = 60000};
    parse_sizes("4K,16K,64K,256K,1M,4M,16M", &o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--section") && v)
            i++; /* "dist": how we got here */
        else if (!strcmp(a, "--ranks") && v)
            o.ranks = atoi(argv[++i]);
        else if (!strcmp(a, "--rounds") && v)
            o.rounds = atoi(argv[++i]);
        else if (!strcmp(a, "--round-ms") && v)
            o.round_seconds = atof(argv[++i]) / 1000;
        else if (!strcmp(a, "--delay-ms") && v)
            o.delay_ms = atof(argv[++i]), o.proxy = 1;
        else if (!strcmp(a, "--rate-gbit") && v)
            o.rate_gbit = atof(argv[++i]), o.proxy = 1;
        else if (!strcmp(a, "--quick"))
            o.rounds = 3, o.round_seconds = 0.02;
        else if (!strcmp(a, "--sizes") && v) {
            if (parse_sizes(argv[++i], &o) < 0) {
                fprintf(stderr, "exo bench dist: --sizes wants byte counts 4..1G, comma-separated "
                                "(K, M suffixes)\n");
                return 2;
            }
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "exo bench dist: unknown argument '%s'\n", a);
            usage();
            return 2;
        }
    }
    if (o.ranks < 2 || o.ranks > MAX_RANKS || o.rounds < 1 || o.rounds > 64 ||
        o.round_seconds <= 0 || o.delay_ms < 0 || o.rate_gbit < 0) {
        fprintf(stderr, "exo bench dist: --ranks 2..%d, --rounds 1..64, positive --round-ms\n",
                MAX_RANKS);
        return 2;
    }
    char dir[] = "/tmp/exo-bench-dist-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("exo bench dist: mkdtemp");
        return 1;
    }
    /* Fixed ports (proxy runs): 2 * ranks^2 <= 512 from a base that differs between runs. */
    int port_base = 20000 + (int)(getpid() % 80) * 512;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("exo bench --section dist: %d ranks on loopback, %ld cores (%s), %d rounds; per "
           "all-reduce of floats:\n"
           "  ours = dist_allreduce_sum, bare = gloo::AllreduceRing on the same pairs; median and "
           "best round\n",
           o.ranks, cores,
           o.ranks <= cores ? "busy-polled pairs" : "more ranks than cores: blocking pairs",
           o.rounds);
    if (o.proxy)
        printf("  through tools/netproxy: one-way delay %g ms, rate %g Gbit/s (0 = unlimited)\n",
               o.delay_ms, o.rate_gbit);
    fflush(stdout);
    pid_t proxy = 0;
    if (o.proxy && (proxy = start_proxy(&o, port_base)) < 0) {
        fprintf(stderr, "exo bench dist: netproxy did not start\n");
        rmdir(dir);
        return 1;
    }
    unsigned long long steal0, total0, steal1, total1;
    read_steal(&steal0, &total0);
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < o.ranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(bench_rank(&o, dir, r, port_base));
    }
    int failed = 0;
    for (int r = 0; r < o.ranks; r++) {
        int status = 0;
        if (pids[r] < 0 || waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) ||
            WEXITSTATUS(status))
            failed = 1;
    }
    read_steal(&steal1, &total1);
    if (proxy > 0) {
        kill(proxy, SIGTERM);
        waitpid(proxy, NULL, 0);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "exo bench dist: could not remove %s\n", dir);
    if (total1 > total0)
        printf("  CPU steal during the run: %.1f%% of all CPU time\n",
               100.0 * (double)(steal1 - steal0) / (double)(total1 - total0));
    return failed;
}
