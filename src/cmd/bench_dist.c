/* exo bench --model DIR --tp N | --pp-ranks N — decode speed of one model split over N ranks on
 * this host (tensor or pipeline parallel), each rank a process pinned to its own cores, joined by
 * the real data plane on loopback:
 *
 *   exo bench --model DIR --tp 2 [--batch 1,4] [--tg 64] [--reps 2] [--cores 0-7/8-15]
 *             [--threads-per-rank T] [--pp-serial 1] [--rank-mem-mib 256] [--prefill P]
 *             [--dist-bind HOST --dist-advertise HOST --dist-port-base P --dist-advertise-offset O]
 *
 * First each rank measures its read bandwidth with its own threads, alone and with all ranks
 * reading at once (--rank-mem-mib N, default 256; 0 skips). Then it prints, per batch size,
 * rank 0's decode tok/s and the time of one step split into compute and
 * communication (rank 0's time inside dist calls: the messages themselves plus waiting for slower
 * ranks), then each rank's own split over its whole run. With --cores each rank is pinned
 * (sched_setaffinity) to one '/'-separated CPU list; the threads per rank default to its CPU
 * count (else cores / N). The --dist-* address options put a proxy in the data path (dist.h:
 * rank r listens on bind:port_base + r*N + p for peer p, the others dial advertise:that + offset;
 * tools/netproxy, bench/dist_scaling.sh), for latency and bandwidth runs.
 * --pp-serial 1 runs a pipeline one step at a time through the stages (the schedule without
 * overlap, for comparison). --tp 1 / --pp-ranks 1 is the one-rank baseline through the same path.
 * --prefill P also measures prefill: per batch size B, B distinct P-token prompts submitted at
 * once (512-token chunks), prompt tokens per second until all are done (--tg 0: prefill only).
 *
 * How: this process only coordinates. It execs N copies of exo (`exo bench --threads T --mem-mib
 * 1 --model DIR --rank K ...`, so each rank's thread pool is its own and sized to its cores),
 * with a fresh directory store for the rendezvous, relays their "dist " lines and waits for them.
 * A rank: connect, open its shard; rank 0 measures, the others follow until it closes.
 * Refuses: more ranks than 64, a --cores list whose count differs from N. */
#include "base/clock.h"
#include "dist/dist.h"
#include "infer/engine.h"
#include "model/model_config.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_RANKS 64

int bench_dist_main(const char *model_dir, int argc, char **argv);
double bench_run_decode(engine *e, int batch, int tg, int vocab, engine_stats *window);
double bench_run_prefill(engine *e, int batch, int pp, int vocab, int salt, engine_stats *window);
double bench_read_gbs(size_t bytes, int reps, double *median_gbs);

typedef struct dist_bench {
    int ranks, rank;          /* rank -1: the coordinator */
    engine_parallel parallel;
    const char *batch, *tg, *reps, *kv, *cores, *store, *threads;
    const char *prefill;      /* prompt length of the prefill measurement ("0": none) */
    const char *bind, *advertise; /* data-plane addresses (default 127.0.0.1, = bind) */
    int timeout_ms, port_base, advertise_offset;
    int serial; /* pipeline: one step at a time through the stages */
    int mem_mib; /* each rank's read-bandwidth probe (0 = none) */
} dist_bench;

static int parse(dist_bench *b, int argc, char **argv) {
    *b = (dist_bench){.rank = -1, .batch = "1", .tg = "64", .reps = "2", .prefill = "0",
                      .timeout_ms = 60000,
                      .mem_mib = 256, .bind = "127.0.0.1"};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "exo bench --model: %s needs a value\n", a);
            return -1;
        }
        if (!strcmp(a, "--tp")) b->ranks = atoi(v), b->parallel = ENGINE_TENSOR;
        else if (!strcmp(a, "--pp-ranks")) b->ranks = atoi(v), b->parallel = ENGINE_PIPELINE;
        else if (!strcmp(a, "--parallel"))
            b->parallel = !strcmp(v, "tensor") ? ENGINE_TENSOR : ENGINE_PIPELINE;
        else if (!strcmp(a, "--ranks")) b->ranks = atoi(v);
        else if (!strcmp(a, "--rank")) b->rank = atoi(v);
        else if (!strcmp(a, "--batch")) b->batch = v;
        else if (!strcmp(a, "--tg")) b->tg = v;
        else if (!strcmp(a, "--prefill")) b->prefill = v;
        else if (!strcmp(a, "--reps")) b->reps = v;
        else if (!strcmp(a, "--kv-dtype")) b->kv = v;
        else if (!strcmp(a, "--cores")) b->cores = v;
        else if (!strcmp(a, "--threads-per-rank")) b->threads = v;
        else if (!strcmp(a, "--dist-store")) b->store = v;
        else if (!strcmp(a, "--dist-timeout-ms")) b->timeout_ms = atoi(v);
        else if (!strcmp(a, "--dist-port-base")) b->port_base = atoi(v);
        else if (!strcmp(a, "--dist-advertise-offset")) b->advertise_offset = atoi(v);
        else if (!strcmp(a, "--pp-serial")) b->serial = atoi(v);
        else if (!strcmp(a, "--rank-mem-mib")) b->mem_mib = atoi(v);
        else if (!strcmp(a, "--dist-bind")) b->bind = v;
        else if (!strcmp(a, "--dist-advertise")) b->advertise = v;
        else {
            fprintf(stderr, "exo bench --model: unknown option %s with --tp/--pp-ranks (--batch "
                    "--tg --reps --kv-dtype --cores --threads-per-rank --dist-timeout-ms "
                    "--dist-port-base --dist-advertise-offset --dist-bind --dist-advertise --pp-serial 0|1 "
                    "--rank-mem-mib N --prefill P)\n", a);
            return -1;
        }
    }
    if (b->ranks < 1 || b->ranks > MAX_RANKS || (b->rank >= 0 && (b->rank >= b->ranks || !b->store))) {
        fprintf(stderr, "exo bench --model: --tp/--pp-ranks wants 1..%d ranks\n", MAX_RANKS);
        return -1;
    }
    return 0;
}

/* ---- one rank ------------------------------------------------------------------------------ */

static void print_split(const char *what, const engine_stats *s) {
    double steps = s->steps ? (double)s->steps : 1;
    printf("dist %s: %llu steps, %.2f ms per step = compute %.2f ms + communication and waiting "
           "%.2f ms (%.0f%%)\n", what, (unsigned long long)s->steps, s->step_ns / steps / 1e6,
           (double)(s->step_ns - s->comm_ns) / steps / 1e6, s->comm_ns / steps / 1e6,
           s->step_ns ? 100.0 * (double)s->comm_ns / (double)s->step_ns : 0);
    fflush(stdout);
}

static const char *mode_name(const dist_bench *b) {
    return b->parallel == ENGINE_TENSOR ? "tensor" : b->serial ? "pipeline (serial)" : "pipeline";
}

/* Rank 0: prefill (with --prefill) and decode at each batch size, best of reps, with the step
 * split of the best. */
static void measure(engine *e, const dist_bench *b, const model_config *c) {
    const char *p = b->batch;
    int tg = atoi(b->tg), reps = atoi(b->reps), pp = atoi(b->prefill);
    while (*p) {
        int batch = atoi(p);
        double best = 0;
        engine_stats window = {0}, w;
        char what[64];
        for (int r = 0; pp > 0 && r < reps; r++) {
            double t = bench_run_prefill(e, batch, pp, c->vocab_size, 7000 + 100 * r, &w);
            double rate = t > 0 ? batch * pp / t : 0;
            if (rate > best) best = rate, window = w;
        }
        if (pp > 0) {
            printf("dist %s x%d prefill pp%d b%d: %.1f tok/s\n", mode_name(b), b->ranks, pp,
                   batch, best);
            snprintf(what, sizeof what, "  rank 0, prefill b%d", batch);
            print_split(what, &window);
        }
        best = 0;
        for (int r = 0; tg > 0 && r < reps; r++) {
            double rate = bench_run_decode(e, batch, tg, c->vocab_size, &w);
            if (rate > best) best = rate, window = w;
        }
        if (tg > 0) {
            printf("dist %s x%d decode tg%d b%d: %.1f tok/s\n", mode_name(b), b->ranks, tg,
                   batch, best);
            snprintf(what, sizeof what, "  rank 0, decode b%d", batch);
            print_split(what, &window);
        }
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
    }
}

/* Each rank's read bandwidth with its own threads: alone (one rank at a time, the others
 * waiting at a barrier) and with every rank reading at once (what decode sees). */
static int probe_bandwidth(dist_group *g, const dist_bench *b) {
    char err[256] = "";
    size_t bytes = (size_t)b->mem_mib << 20;
    double alone = 0, together = 0;
    for (int k = 0; k < b->ranks; k++) {
        if (dist_barrier(g, err, sizeof err)) goto fail;
        if (k == b->rank) alone = bench_read_gbs(bytes, 3, NULL);
    }
    if (dist_barrier(g, err, sizeof err)) goto fail;
    together = bench_read_gbs(bytes, 3, NULL);
    if (dist_barrier(g, err, sizeof err)) goto fail;
    printf("dist   rank %d memory read (%d MiB): alone %.1f GB/s, all ranks at once %.1f GB/s\n",
           b->rank, b->mem_mib, alone, together);
    fflush(stdout);
    return 0;
fail:
    fprintf(stderr, "exo bench rank %d: %s\n", b->rank, err);
    return -1;
}

static int run_rank(const char *model_dir, const dist_bench *b) {
    char err[512] = "";
    model_config c;
    if (model_config_load(model_dir, &c, err, sizeof err)) {
        fprintf(stderr, "exo bench rank %d: %s\n", b->rank, err);
        return 1;
    }
    dist_store store;
    if (dist_store_dir(&store, b->store)) {
        fprintf(stderr, "exo bench rank %d: cannot use the store %s\n", b->rank, b->store);
        return 1;
    }
    dist_config dc = {.rank = b->rank, .size = b->ranks, .prefix = "bench",
                      .bind_host = b->bind, .advertise_host = b->advertise,
                      .timeout_ms = b->timeout_ms,
                      .port_base = b->port_base, .advertise_port_offset = b->advertise_offset};
    dist_group *g = dist_connect(&dc, &store, err, sizeof err);
    if (!g) {
        fprintf(stderr, "exo bench rank %d: %s\n", b->rank, err);
        dist_store_dir_free(&store);
        return 1;
    }
    if (b->mem_mib > 0 && probe_bandwidth(g, b)) {
        dist_close(g);
        dist_store_dir_free(&store);
        return 1;
    }
    int max_b = 1;
    for (const char *p = b->batch; *p; p++)
        if (atoi(p) > max_b) max_b = atoi(p);
    int tg = atoi(b->tg), pp = atoi(b->prefill), ctx = 16 + (tg > 4 ? tg : 4) + 16;
    if (pp + 16 > ctx) ctx = pp + 16;
    size_t kv_bytes = (size_t)((double)(max_b + 1) * ctx * c.n_layers * 2 * c.n_kv_heads *
                               c.head_dim * 4) + (64u << 20);
    /* ranks pinned to cores, measured against their own read bandwidth: a CPU benchmark */
    engine_options o = {.model_dir = model_dir, .max_batch_tokens = 512, .max_sequences = max_b,
                        .context_length = ctx, .kv_cache_bytes = kv_bytes,
                        .kv_cache_dtype = b->kv, .dist = g, .parallel = b->parallel,
                        .dist_timeout_ms = b->timeout_ms, .pipeline_serial = b->serial,
                        .device = "cpu"};
    engine *e = engine_open(&o, err, sizeof err);
    int rc = 0;
    if (!e) {
        fprintf(stderr, "exo bench rank %d: %s\n", b->rank, err);
        rc = 1;
    } else if (b->rank == 0) {
        bench_run_decode(e, 1, 4, c.vocab_size, NULL); /* fault the weights in, on every rank */
        measure(e, b, &c);
    } else if (engine_follow(e)) {
        fprintf(stderr, "exo bench rank %d: %s\n", b->rank, engine_last_error(e));
        rc = 1;
    }
    if (e) {
        engine_stats s;
        engine_get_stats(e, &s);
        char what[64];
        snprintf(what, sizeof what, "  rank %d, whole run", b->rank);
        print_split(what, &s);
        engine_close(e);
    }
    dist_close(g);
    dist_store_dir_free(&store);
    return rc;
}

/* ---- the coordinator ----------------------------------------------------------------------- */

/* Parses one CPU list ("0-3,8") into set; returns its CPU count, or -1. */
static int parse_cpus(const char *s, size_t len, cpu_set_t *set) {
    CPU_ZERO(set);
    int n = 0;
    const char *end = s + len;
    while (s < end) {
        char *e;
        long a = strtol(s, &e, 10), z = a;
        if (e == s || a < 0 || a >= CPU_SETSIZE) return -1;
        if (*e == '-') {
            s = e + 1;
            z = strtol(s, &e, 10);
            if (e == s || z < a || z >= CPU_SETSIZE) return -1;
        }
        for (long k = a; k <= z; k++) CPU_SET((int)k, set), n++;
        s = e;
        if (s < end && *s == ',') s++;
        else if (s < end) return -1;
    }
    return n;
}

static int spawn_rank(const char *model_dir, const dist_bench *b, int k, const char *store,
                      const char *cores, size_t cores_len, int out_fd, pid_t *pid) {
    cpu_set_t set;
    int n_cpus = 0;
    if (cores && (n_cpus = parse_cpus(cores, cores_len, &set)) < 1) {
        fprintf(stderr, "exo bench: bad CPU list '%.*s' in --cores\n", (int)cores_len, cores);
        return -1;
    }
    char threads[16], rank[16], ranks[16], timeout[16], port[16], offset[16], serial[16];
    char mem[16];
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int t = b->threads ? atoi(b->threads) : n_cpus ? n_cpus : (int)(online / b->ranks);
    snprintf(threads, sizeof threads, "%d", t > 0 ? t : 1);
    snprintf(rank, sizeof rank, "%d", k);
    snprintf(ranks, sizeof ranks, "%d", b->ranks);
    snprintf(timeout, sizeof timeout, "%d", b->timeout_ms);
    snprintf(port, sizeof port, "%d", b->port_base);
    snprintf(offset, sizeof offset, "%d", b->advertise_offset);
    snprintf(serial, sizeof serial, "%d", b->serial);
    snprintf(mem, sizeof mem, "%d", b->mem_mib);
    const char *args[40] = {"exo", "bench", "--threads", threads, "--mem-mib", "1", "--model",
                            model_dir, "--rank", rank, "--ranks", ranks, "--parallel",
                            b->parallel == ENGINE_TENSOR ? "tensor" : "pipeline", "--dist-store",
                            store, "--batch", b->batch, "--tg", b->tg, "--reps", b->reps,
                            "--dist-timeout-ms", timeout, "--dist-port-base", port,
                            "--dist-advertise-offset", offset, "--pp-serial", serial,
                            "--rank-mem-mib", mem, "--dist-bind", b->bind, "--prefill",
                            b->prefill};
    int n = 36;
    if (b->kv) args[n++] = "--kv-dtype", args[n++] = b->kv;
    if (b->advertise) args[n++] = "--dist-advertise", args[n++] = b->advertise;
    args[n] = NULL;
    fflush(stdout);
    *pid = fork();
    if (*pid < 0) return -1;
    if (*pid == 0) { /* only async-signal-safe calls until exec: this process has threads */
        if (n_cpus) sched_setaffinity(0, sizeof set, &set);
        dup2(out_fd, 1);
        execv("/proc/self/exe", (char *const *)args);
        _exit(127);
    }
    return 0;
}

static int coordinate(const char *model_dir, const dist_bench *b) {
    int lists = 1;
    for (const char *p = b->cores; p && *p; p++) lists += *p == '/';
    if (b->cores && lists != b->ranks) {
        fprintf(stderr, "exo bench: --cores has %d CPU lists for %d ranks\n", lists, b->ranks);
        return 2;
    }
    char store[] = "/tmp/exo-bench-dist-XXXXXX";
    if (!mkdtemp(store)) {
        perror("exo bench: mkdtemp");
        return 1;
    }
    int fds[2];
    if (pipe(fds)) return 1;
    printf("dist %s x%d of %s: ranks are processes on this host, loopback TCP (Gloo)%s%s\n",
           b->parallel == ENGINE_TENSOR ? "tensor" : "pipeline", b->ranks, model_dir,
           b->cores ? ", cores " : "", b->cores ? b->cores : "");
    pid_t pids[MAX_RANKS];
    int spawned = 0, rc = 0;
    const char *c = b->cores;
    for (int k = 0; k < b->ranks && rc == 0; k++) {
        size_t len = 0;
        if (c) len = strcspn(c, "/");
        if (spawn_rank(model_dir, b, k, store, c, len, fds[1], &pids[k])) rc = 1;
        else spawned++;
        if (c) c = c[len] == '/' ? c + len + 1 : c + len;
    }
    close(fds[1]);
    FILE *in = fdopen(fds[0], "r");
    char line[1024];
    while (in && fgets(line, sizeof line, in)) /* the ranks' own lines, relayed */
        if (!strncmp(line, "dist ", 5)) fputs(line, stdout), fflush(stdout);
    if (in) fclose(in);
    for (int k = 0; k < spawned; k++) {
        int status = 0;
        waitpid(pids[k], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status)) rc = 1;
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", store);
    if (system(cmd) != 0) fprintf(stderr, "exo bench: could not remove %s\n", store);
    return rc;
}

int bench_dist_main(const char *model_dir, int argc, char **argv) {
    dist_bench b;
    if (parse(&b, argc, argv)) return 2;
    return b.rank >= 0 ? run_rank(model_dir, &b) : coordinate(model_dir, &b);
}
