/* instances — runner child processes, their status, and the generation calls in flight on them
 * (see instances.h). One lock guards the whole table: it is touched a few times per request,
 * never per token (tokens flow from a reader thread per runner straight to the caller).
 *
 * A watchdog thread checks, a few times per second, every runner with calls in flight: one that
 * has sent nothing for watchdog_s (stopped, deadlocked, swapping to death) is killed; its reader
 * thread then fails the calls and starts a replacement. The same thread kills a runner that was
 * asked to stop (instance deleted, node exiting) and is still alive INSTANCES_STOP_GRACE_S later,
 * so no runner outlives its instance. */
#include "worker/instances.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/paths.h"
#include "base/strbuf.h"
#include "model/gguf.h"
#include "model/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

enum runner_status {
    RUNNER_IDLE, RUNNER_CONNECTING, RUNNER_CONNECTED, RUNNER_LOADING, RUNNER_LOADED,
    RUNNER_WARMING_UP, RUNNER_READY, RUNNER_RUNNING, RUNNER_SHUTTING_DOWN, RUNNER_SHUTDOWN,
    RUNNER_FAILED,
};
static const char *STATUS_NAMES[] = {"Idle", "Connecting", "Connected", "Loading", "Loaded",
                                     "WarmingUp", "Ready", "Running", "ShuttingDown", "Shutdown",
                                     "Failed"};

typedef struct call {
    uint64_t id;
    instances_message_fn fn;
    void *arg;
    struct call *next;
} call;

typedef struct instance {
    char id[40], runner_id[40];
    char model_id[512], model_dir[1024];
    pid_t pid;
    int fd;
    enum runner_status status;
    int layers_loaded, total_layers;
    char error[512];
    json_t *info;
    call *calls;
    int n_calls;
    /* the runner's last kv_stats (runner/protocol.h); has_kv_stats = 0 until the first */
    int has_kv_stats, kv_total, kv_free, kv_cached, kv_block_tokens, sched_running, sched_waiting;
    long long preemptions;
    long long spec_verifies, spec_drafted, spec_accepted; /* speculative decoding totals */
    int refs;
    int removed;
    int exited;  /* the reader saw EOF and reaped the process */
    int hung;    /* killed by the watchdog: its reader starts a replacement */
    uint64_t kill_at_ns;            /* asked to stop: SIGKILL if still alive then */
    struct instance *next_stopping; /* in instances.stopping, which holds the table's reference */
    _Atomic uint64_t last_rx_ns; /* when the runner last sent anything */
    _Atomic uint64_t step_ms;    /* its last heartbeat: how long its current engine step ran */
    uint64_t busy_since_ns;      /* when n_calls last went from 0 to 1 */
    pthread_mutex_t send_lock;
    /* One rank of a multi-node instance placed through the cluster State (NULL: this node's own
     * single-runner instance): the State's tagged instance, its rank and size. */
    json_t *state_instance;
    int rank, world_size;
    struct instance *next;
} instance;

struct instances {
    char *runner_exe, *models_dir, *models_path, *node_id;
    char *speculative; /* "" = off */
    int spec_tokens;
    size_t kv_cache_bytes;
    char kv_cache_dtype[8]; /* "" = the runner's default */
    char device[8];
    int ready_timeout_s;
    int watchdog_s;
    int max_runners;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    instance *list;
    instance *stopping; /* asked to stop, not yet exited (see sweep_stopping_locked) */
    uint64_t next_call_id;
    int live_readers;
    pthread_t watchdog;
    int watchdog_started, closing; /* closing: instances_free has begun */
    instances_rendezvous rendezvous; /* where ranks' store_set/store_get go (zero: nowhere) */
    instances_router router;         /* generations for models served by other nodes */
};

static void make_uuid(char *out, size_t n) {
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        uint64_t t = clock_now_ns() ^ (uint64_t)getpid();
        for (int i = 0; i < 16; i++) b[i] = (unsigned char)(t >> ((i % 8) * 8)) ^ (unsigned char)i;
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    snprintf(out, n, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

static void *watchdog_main(void *arg);

instances *instances_new(const instances_options *o) {
    instances *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->runner_exe = strdup(o->runner_exe ? o->runner_exe : "/proc/self/exe");
    m->models_dir = strdup(o->models_dir ? o->models_dir : "");
    m->models_path = strdup(o->models_path ? o->models_path : "");
    m->node_id = strdup(o->node_id ? o->node_id : "node");
    m->kv_cache_bytes = o->kv_cache_bytes;
    snprintf(m->kv_cache_dtype, sizeof m->kv_cache_dtype, "%s", o->kv_cache_dtype ? o->kv_cache_dtype : "");
    m->speculative = strdup(o->speculative ? o->speculative : "");
    m->spec_tokens = o->spec_tokens;
    snprintf(m->device, sizeof m->device, "%s", o->device && o->device[0] ? o->device : "auto");
    m->ready_timeout_s = o->ready_timeout_s ? o->ready_timeout_s : 600;
    m->max_runners = o->max_runners > 0 ? o->max_runners : INSTANCES_MAX_RUNNERS_DEFAULT;
    m->next_call_id = 1;
    pthread_mutex_init(&m->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cond, &ca);
    pthread_condattr_destroy(&ca);
    m->watchdog_s = o->watchdog_s ? o->watchdog_s : INSTANCES_WATCHDOG_DEFAULT_S;
    /* Runs even with the hang check off (watchdog_s < 0): it also enforces the stop grace. */
    m->watchdog_started = pthread_create(&m->watchdog, NULL, watchdog_main, m) == 0;
    return m;
}

/* ------------------------------------------------------------------ models on disk */

static int is_model_dir(const char *dir) {
    char p[1400];
    if (gguf_model_file(dir, p, sizeof p)) return 1;
    int n = snprintf(p, sizeof p, "%s/config.json", dir);
    return n > 0 && (size_t)n < sizeof p && paths_is_file(p);
}

/* One way to find a model on disk: the model store (models dir, --models-path, built-in). */
int instances_resolve_model(const instances *m, const char *model_id, char *dir, size_t n) {
    model_store store;
    char err[256];
    if (!model_id || !model_id[0]) return -1;
    if (store_init(&store, m->models_dir[0] ? m->models_dir : "/nonexistent", m->models_path, err,
                   sizeof err))
        return -1;
    if (model_id[0] != '/' && store_id_valid(model_id, err, sizeof err)) return -1;
    if (store_locate(&store, model_id, dir, n) != STORE_COMPLETE) return -1;
    return is_model_dir(dir) ? 0 : -1;
}

int instances_canonical_model(const instances *m, const char *requested, char *id, size_t n,
                              char *err, size_t errlen) {
    model_store store;
    if (store_init(&store, m->models_dir[0] ? m->models_dir : "/nonexistent", m->models_path, err,
                   errlen))
        return -1;
    return store_canonical_id(&store, requested, id, n, err, errlen);
}

void instances_missing_reason(const instances *m, const char *model_id, char *out, size_t n) {
    model_store store;
    char err[256];
    snprintf(out, n, "it is not on disk");
    if (store_init(&store, m->models_dir[0] ? m->models_dir : "/nonexistent", m->models_path, err,
                   sizeof err) == 0)
        store_missing_reason(&store, model_id, out, n);
}

/* Every complete model the store can see. */
static void add_listed_model(const char *id, const char *dir, enum store_state st, void *ud) {
    (void)dir;
    if (st == STORE_COMPLETE) json_array_append_new(ud, json_string(id));
}

json_t *instances_local_models(const instances *m) {
    json_t *out = json_array();
    model_store store;
    char err[256];
    if (store_init(&store, m->models_dir[0] ? m->models_dir : "/nonexistent", m->models_path, err,
                   sizeof err) == 0)
        store_list(&store, add_listed_model, out);
    return out;
}

/* ------------------------------------------------------------------ runner processes */

static void instance_unref_locked(instances *m, instance *in) {
    (void)m;
    if (--in->refs) return;
    json_decref(in->info);
    json_decref(in->state_instance);
    if (in->fd >= 0) close(in->fd);
    pthread_mutex_destroy(&in->send_lock);
    free(in);
}

/* Takes in out of the table. Returns 1 when it was still there: the caller then owns the
 * table's reference and must drop it. */
static int unlink_locked(instances *m, instance *in) {
    if (in->removed) return 0;
    in->removed = 1;
    for (instance **pp = &m->list; *pp; pp = &(*pp)->next)
        if (*pp == in) {
            *pp = in->next;
            break;
        }
    return 1;
}

static int send_message(instance *in, json_t *msg) {
    pthread_mutex_lock(&in->send_lock);
    int rc = protocol_send(in->fd, msg);
    pthread_mutex_unlock(&in->send_lock);
    json_decref(msg);
    return rc;
}

static void reap(instance *in, char *why, size_t n) {
    int st = 0;
    pid_t r = 0;
    for (int i = 0; i < 40 && (r = waitpid(in->pid, &st, WNOHANG)) == 0; i++) clock_sleep_ms(50);
    if (r == 0) {
        kill(in->pid, SIGKILL);
        r = waitpid(in->pid, &st, 0);
    }
    if (r == in->pid && WIFSIGNALED(st))
        snprintf(why, n, "killed by signal %d", WTERMSIG(st));
    else if (r == in->pid && WIFEXITED(st))
        snprintf(why, n, "exited with status %d", WEXITSTATUS(st));
    else
        snprintf(why, n, "ended");
}

static void handle_status(instances *m, instance *in, const json_t *msg) {
    const char *s = json_string_value(json_object_get(msg, "status"));
    if (!s) return;
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i <= RUNNER_FAILED; i++)
        if (!strcmp(s, STATUS_NAMES[i]) && in->status != RUNNER_SHUTTING_DOWN) in->status = i;
    in->layers_loaded = (int)json_integer_value(json_object_get(msg, "layers_loaded"));
    in->total_layers = (int)json_integer_value(json_object_get(msg, "total_layers"));
    json_t *info = json_object_get(msg, "info");
    if (info) {
        json_decref(in->info);
        in->info = json_incref(info);
    }
    const char *e = json_string_value(json_object_get(msg, "error"));
    if (e) snprintf(in->error, sizeof in->error, "%s", e);
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->lock);
    if (in->status == RUNNER_FAILED) log_error("runner for %s failed: %s", in->model_id, in->error);
    else log_info("runner for %s: %s", in->model_id, s);
}

static void handle_kv_stats(instances *m, instance *in, const json_t *msg) {
#define FIELD(name) (int)json_integer_value(json_object_get(msg, name))
    pthread_mutex_lock(&m->lock);
    in->has_kv_stats = 1;
    in->kv_total = FIELD("blocks_total");
    in->kv_free = FIELD("blocks_free");
    in->kv_cached = FIELD("blocks_cached");
    in->kv_block_tokens = FIELD("block_tokens");
    in->sched_running = FIELD("running");
    in->sched_waiting = FIELD("waiting");
    in->preemptions = (long long)json_integer_value(json_object_get(msg, "preemptions"));
    in->spec_verifies = (long long)json_integer_value(json_object_get(msg, "spec_verifies"));
    in->spec_drafted = (long long)json_integer_value(json_object_get(msg, "spec_drafted"));
    in->spec_accepted = (long long)json_integer_value(json_object_get(msg, "spec_accepted"));
    pthread_mutex_unlock(&m->lock);
#undef FIELD
}

static void dispatch_call_message(instances *m, instance *in, const json_t *msg) {
    uint64_t id = (uint64_t)json_integer_value(json_object_get(msg, "id"));
    int done = !strcmp(json_string_value(json_object_get(msg, "type")), "done");
    pthread_mutex_lock(&m->lock);
    call *c = NULL;
    for (call **pp = &in->calls; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            c = *pp;
            if (done) {
                *pp = c->next;
                in->n_calls--;
            }
            break;
        }
    pthread_mutex_unlock(&m->lock);
    if (!c) return;
    c->fn(c->arg, msg);
    if (done) free(c);
}

/* A rank's rendezvous (runner/store_node.h): set goes to the cluster, get is answered from it. */
static void handle_store(instances *m, instance *in, const json_t *msg) {
    const char *type = json_string_value(json_object_get(msg, "type"));
    const char *key = json_string_value(json_object_get(msg, "key"));
    instances_rendezvous *rv = &m->rendezvous;
    if (!key || !rv->set) return;
    if (!strcmp(type, "store_set")) {
        const char *value = json_string_value(json_object_get(msg, "value"));
        if (value) rv->set(rv->ctx, in->id, key, value);
        return;
    }
    if (strcmp(type, "store_get")) return;
    char *value = rv->get(rv->ctx, in->id, key);
    json_t *answer = json_pack("{s:s,s:s}", "type", "store_value", "key", key);
    if (value) json_object_set_new(answer, "value", json_string(value));
    free(value);
    send_message(in, answer);
}

static instance *place_locked(instances *m, const char *model_id, int *status, char *err,
                              size_t errlen);

static void *reader_main(void *arg) {
    void **args = arg;
    instances *m = args[0];
    instance *in = args[1];
    free(args);
    /* Buffered: one read takes every message the runner wrote for an engine step. */
    protocol_reader pr = {0};
    char *buf = malloc(1 << 16);
    for (int bad = 0; buf && !bad;) {
        ssize_t n = read(in->fd, buf, 1 << 16);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        atomic_store(&in->last_rx_ns, clock_now_ns());
        protocol_reader_feed(&pr, buf, (size_t)n);
        json_t *msg;
        while ((msg = protocol_reader_next(&pr, &bad))) {
            const char *type = json_string_value(json_object_get(msg, "type"));
            if (type && !strcmp(type, "status")) handle_status(m, in, msg);
            else if (type && !strcmp(type, "alive"))
                atomic_store(&in->step_ms, (uint64_t)json_integer_value(json_object_get(msg, "step_ms")));
            else if (type && !strcmp(type, "kv_stats")) handle_kv_stats(m, in, msg);
            else if (type && !strncmp(type, "store_", 6)) handle_store(m, in, msg);
            else if (type) dispatch_call_message(m, in, msg);
            json_decref(msg);
        }
    }
    free(buf);
    protocol_reader_free(&pr);
    char why[128];
    reap(in, why, sizeof why);
    pthread_mutex_lock(&m->lock);
    int expected = in->status == RUNNER_SHUTTING_DOWN;
    if (!expected && in->status != RUNNER_FAILED) {
        in->status = RUNNER_FAILED;
        snprintf(in->error, sizeof in->error, "the runner process %s", why);
    } else if (expected) {
        in->status = RUNNER_SHUTDOWN;
    }
    in->exited = 1;
    /* A failed runner stays in the table (RunnerFailed with its error in /state) until its
     * instance is deleted or replaced; a hung one is replaced at once, below. */
    int table_ref = expected || (in->hung && !in->state_instance) ? unlink_locked(m, in) : 0;
    call *calls = in->calls;
    in->calls = NULL;
    in->n_calls = 0;
    char message[1200];
    if (snprintf(message, sizeof message, "%s for model %s%s%s", expected ? "the instance was deleted"
                                                                      : "the runner stopped",
             in->model_id, expected ? "" : ": ", expected ? "" : in->error) < 0)
        message[0] = 0;
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->lock);
    if (!expected) log_error("runner for %s: %s", in->model_id, in->error);
    for (call *c = calls, *next; c; c = next) {
        next = c->next;
        json_t *done = json_pack("{s:s,s:I,s:s,s:s,s:i}", "type", "done", "id", (json_int_t)c->id,
                                 "finish_reason", "error", "error", message, "error_status",
                                 in->hung ? 504 : 500);
        c->fn(c->arg, done);
        json_decref(done);
        free(c);
    }
    pthread_mutex_lock(&m->lock);
    if (in->hung && table_ref && !m->closing && !in->state_instance) {
        int status = 0;
        char err[256];
        log_warn("restarting the runner for %s", in->model_id);
        if (!place_locked(m, in->model_id, &status, err, sizeof err))
            log_error("cannot restart the runner for %s: %s", in->model_id, err);
    }
    in->refs -= table_ref; /* the table's reference, when this thread unlinked it */
    instance_unref_locked(m, in);
    m->live_readers--;
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

/* Drops the runners asked to stop that have exited; SIGKILLs those past their grace. */
static void sweep_stopping_locked(instances *m, uint64_t now) {
    for (instance **pp = &m->stopping; *pp;) {
        instance *in = *pp;
        if (in->exited) {
            *pp = in->next_stopping;
            instance_unref_locked(m, in);
            continue;
        }
        if (in->kill_at_ns && now >= in->kill_at_ns) {
            log_warn("runner for %s (pid %d) did not stop within %d s: killing it", in->model_id,
                     (int)in->pid, INSTANCES_STOP_GRACE_S);
            kill(in->pid, SIGKILL);
            in->kill_at_ns = 0; /* once; its reader reaps it and sets exited */
        }
        pp = &in->next_stopping;
    }
}

/* Kills runners that have calls in flight but have sent nothing for watchdog_s, and runners
 * that outlive their stop grace. */
static void *watchdog_main(void *arg) {
    instances *m = arg;
    uint64_t limit = (uint64_t)(m->watchdog_s > 0 ? m->watchdog_s : 0) * 1000000000ull;
    long tick_ms = m->watchdog_s >= 4 || m->watchdog_s <= 0 ? 1000 : 250;
    pthread_mutex_lock(&m->lock);
    while (!m->closing) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        t.tv_nsec += tick_ms * 1000000L;
        t.tv_sec += t.tv_nsec / 1000000000L;
        t.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&m->cond, &m->lock, &t);
        uint64_t now = clock_now_ns();
        sweep_stopping_locked(m, now);
        for (instance *in = m->list; in && !m->closing && limit; in = in->next) {
            if (!in->n_calls || in->hung || in->exited || in->status == RUNNER_FAILED ||
                in->status == RUNNER_SHUTTING_DOWN)
                continue;
            uint64_t rx = atomic_load(&in->last_rx_ns);
            uint64_t since = rx > in->busy_since_ns ? rx : in->busy_since_ns;
            uint64_t step_ms = atomic_load(&in->step_ms);
            int silent = now > since && now - since >= limit;
            int stuck = step_ms / 1000 >= (uint64_t)m->watchdog_s * INSTANCES_WATCHDOG_STEP_FACTOR;
            if (!silent && !stuck) continue;
            in->hung = 1;
            in->status = RUNNER_FAILED;
            if (silent)
                snprintf(in->error, sizeof in->error,
                         "it did not answer for %d s (hung; watchdog EXO_RUNNER_WATCHDOG_S) and "
                         "was restarted",
                         m->watchdog_s);
            else
                snprintf(in->error, sizeof in->error,
                         "one engine step ran for %llu s (stuck; watchdog %d x "
                         "EXO_RUNNER_WATCHDOG_S) and it was restarted",
                         (unsigned long long)(step_ms / 1000),
                         INSTANCES_WATCHDOG_STEP_FACTOR);
            log_error("runner for %s (pid %d) with %d request(s) in flight: %s; killing it",
                      in->model_id, (int)in->pid, in->n_calls, in->error);
            kill(in->pid, SIGKILL);
        }
    }
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

/* Starts a runner for model; m->lock held. */
static instance *spawn_locked(instances *m, const char *model_id, const char *dir,
                              const instances_shard *shard, char *err, size_t errlen) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
        snprintf(err, errlen, "socketpair: %s", strerror(errno));
        return NULL;
    }
    char kv[32], rank[16], ranks[16], layers[32], timeout[16], spec_k[16];
    snprintf(kv, sizeof kv, "%zu", m->kv_cache_bytes);
    char *argv[40] = {m->runner_exe, "runner", "--fd", "3", "--model", (char *)dir, "--model-id",
                      (char *)model_id, "--kv-cache-mem", kv, "--device", m->device};
    int argc = 12;
    if (m->kv_cache_dtype[0]) {
        argv[argc++] = "--kv-cache-dtype";
        argv[argc++] = m->kv_cache_dtype;
    }
    if (m->speculative[0]) {
        snprintf(spec_k, sizeof spec_k, "%d", m->spec_tokens);
        argv[argc++] = "--speculative";
        argv[argc++] = m->speculative;
        argv[argc++] = "--spec-k";
        argv[argc++] = spec_k;
    }
    if (shard && shard->world_size > 1) {
        snprintf(rank, sizeof rank, "%d", shard->rank);
        snprintf(ranks, sizeof ranks, "%d", shard->world_size);
        snprintf(layers, sizeof layers, "%d:%d", shard->layer_start, shard->layer_end);
        snprintf(timeout, sizeof timeout, "%d", shard->dist_timeout_ms);
        char *dist[] = {"--rank", rank, "--ranks", ranks, "--parallel",
                        shard->tensor ? "tensor" : "pipeline", "--dist-store", "node",
                        "--instance", (char *)shard->instance_id, "--dist-host",
                        (char *)shard->dist_host};
        for (size_t i = 0; i < sizeof dist / sizeof dist[0]; i++) argv[argc++] = dist[i];
        if (!shard->tensor) {
            argv[argc++] = "--layers";
            argv[argc++] = layers;
        }
        if (shard->dist_timeout_ms > 0) {
            argv[argc++] = "--dist-timeout-ms";
            argv[argc++] = timeout;
        }
        if (shard->transport && !strcmp(shard->transport, "ibverbs")) {
            argv[argc++] = "--dist-transport";
            argv[argc++] = "ibverbs";
        }
    }
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        return NULL;
    }
    if (pid == 0) {
        /* No PR_SET_PDEATHSIG: it fires when the forking *thread* exits (a connection thread
         * here). The runner exits on EOF of its socket instead, which also covers node death. */
        if (sv[1] == 3) fcntl(3, F_SETFD, 0);
        else dup2(sv[1], 3);
        execv(m->runner_exe, argv);
        _exit(127);
    }
    close(sv[1]);
    instance *in = calloc(1, sizeof *in);
    if (shard) {
        snprintf(in->id, sizeof in->id, "%s", shard->instance_id);
        snprintf(in->runner_id, sizeof in->runner_id, "%s", shard->runner_id);
        in->state_instance = json_deep_copy(shard->instance);
        in->rank = shard->rank;
        in->world_size = shard->world_size;
    } else {
        make_uuid(in->id, sizeof in->id);
        make_uuid(in->runner_id, sizeof in->runner_id);
    }
    snprintf(in->model_id, sizeof in->model_id, "%s", model_id);
    snprintf(in->model_dir, sizeof in->model_dir, "%s", dir);
    in->pid = pid;
    in->fd = sv[0];
    in->status = RUNNER_CONNECTING;
    in->refs = 2; /* the table and the reader thread */
    pthread_mutex_init(&in->send_lock, NULL);
    void **args = malloc(2 * sizeof *args);
    args[0] = m;
    args[1] = in;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, reader_main, args)) {
        pthread_attr_destroy(&attr);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        free(args);
        in->refs = 1;
        instance_unref_locked(m, in);
        snprintf(err, errlen, "cannot start a reader thread");
        return NULL;
    }
    pthread_attr_destroy(&attr);
    m->live_readers++;
    in->next = m->list;
    m->list = in;
    if (shard && shard->world_size > 1)
        log_info("started rank %d of %d of %s (instance %s, runner pid %d)", shard->rank,
                 shard->world_size, model_id, in->id, (int)pid);
    else
        log_info("placed %s (instance %s, runner pid %d)", model_id, in->id, (int)pid);
    return in;
}

/* 0 for a State-placed rank whose instance State no longer holds (deleted through another node;
 * the cluster sync stops it on its next tick). */
static int still_placed_locked(const instances *m, const instance *in) {
    return !in->state_instance || !m->rendezvous.held ||
           m->rendezvous.held(m->rendezvous.ctx, in->id);
}

/* This node's serving instance of the model: its own, or rank 0 of a multi-node one (the least
 * busy when there are several). */
static instance *find_model_locked(instances *m, const char *model_id) {
    instance *best = NULL;
    for (instance *in = m->list; in; in = in->next)
        if (!strcmp(in->model_id, model_id) && in->status != RUNNER_FAILED &&
            in->status != RUNNER_SHUTTING_DOWN && in->rank == 0 &&
            (!best || in->n_calls < best->n_calls) && still_placed_locked(m, in))
            best = in;
    return best;
}

/* This node's own (not State-placed) instance of the model, for placement. */
static instance *find_own_model_locked(instances *m, const char *model_id) {
    for (instance *in = m->list; in; in = in->next)
        if (!strcmp(in->model_id, model_id) && in->status != RUNNER_FAILED &&
            in->status != RUNNER_SHUTTING_DOWN && !in->state_instance)
            return in;
    return NULL;
}

static instance *find_id_locked(instances *m, const char *id) {
    for (instance *in = m->list; in; in = in->next)
        if (!strcmp(in->id, id)) return in;
    return NULL;
}

/* m->lock held. 1 (with err) when this node runs as many runners as it may start. */
static int runner_cap_reached_locked(const instances *m, char *err, size_t errlen) {
    int live = 0;
    for (const instance *in = m->list; in; in = in->next)
        live += in->status != RUNNER_FAILED && in->status != RUNNER_SHUTTING_DOWN &&
                in->status != RUNNER_SHUTDOWN;
    if (live < m->max_runners) return 0;
    snprintf(err, errlen, "this node already runs %d model runners, the most it starts "
                          "(--max-runners): delete an instance (DELETE /instance/ID) first",
             live);
    return 1;
}

static instance *place_locked(instances *m, const char *requested, int *status, char *err,
                              size_t errlen) {
    char model_id[512]; /* one model, one identity: every alias of a path gives the same id */
    if (instances_canonical_model(m, requested, model_id, sizeof model_id, err, errlen)) {
        *status = 404;
        return NULL;
    }
    instance *in = find_model_locked(m, model_id);
    if (in) return in;
    in = find_own_model_locked(m, model_id);
    if (in) return in;
    char dir[1024];
    if (instances_resolve_model(m, model_id, dir, sizeof dir)) {
        char why[1024];
        instances_missing_reason(m, model_id, why, sizeof why);
        *status = 404;
        snprintf(err, errlen, "model '%s' not found: %s (looked in the models directory %s, "
                              "--models-path and the built-in models)",
                 model_id, why, m->models_dir);
        return NULL;
    }
    /* A failed instance of this model (kept for /state) is replaced by the new one. */
    for (instance *f = m->list, *next; f; f = next) {
        next = f->next;
        if (strcmp(f->model_id, model_id) || f->status != RUNNER_FAILED || f->state_instance)
            continue;
        if (!f->exited) kill(f->pid, SIGKILL);
        if (unlink_locked(m, f)) instance_unref_locked(m, f);
    }
    if (runner_cap_reached_locked(m, err, errlen)) {
        *status = 503;
        return NULL;
    }
    in = spawn_locked(m, model_id, dir, NULL, err, errlen);
    if (!in) *status = 500;
    return in;
}

void instances_set_cluster_hooks(instances *m, const instances_rendezvous *rendezvous,
                                 const instances_router *router) {
    pthread_mutex_lock(&m->lock);
    if (rendezvous) m->rendezvous = *rendezvous;
    if (router) m->router = *router;
    pthread_mutex_unlock(&m->lock);
}

int instances_serves(instances *m, const char *model_id) {
    pthread_mutex_lock(&m->lock);
    int found = find_model_locked(m, model_id) || find_own_model_locked(m, model_id);
    pthread_mutex_unlock(&m->lock);
    return found;
}

int instances_serves_anywhere(instances *m, const char *model_id) {
    if (instances_serves(m, model_id)) return 1;
    pthread_mutex_lock(&m->lock);
    instances_router router = m->router;
    pthread_mutex_unlock(&m->lock);
    return router.serves && router.serves(router.ctx, model_id);
}

int instances_has(instances *m, const char *instance_id) {
    pthread_mutex_lock(&m->lock);
    int found = find_id_locked(m, instance_id) != NULL;
    pthread_mutex_unlock(&m->lock);
    return found;
}

int instances_start_shard(instances *m, const instances_shard *shard, char *err, size_t errlen) {
    char dir[1024];
    if (shard->model_dir && shard->model_dir[0]) {
        snprintf(dir, sizeof dir, "%s", shard->model_dir);
    } else if (instances_resolve_model(m, shard->model_id, dir, sizeof dir)) {
        snprintf(err, errlen, "model '%s' is not on this node (models directory %s or "
                              "EXO_MODELS_PATH)", shard->model_id, m->models_dir);
        return 404;
    }
    pthread_mutex_lock(&m->lock);
    instance *in = find_id_locked(m, shard->instance_id) ? NULL
                                                          : spawn_locked(m, shard->model_id, dir,
                                                                         shard, err, errlen);
    pthread_mutex_unlock(&m->lock);
    return in ? 0 : 500;
}

int instances_place(instances *m, const char *model_id, char *instance_id, size_t n, char *err,
                    size_t errlen) {
    int status = 0;
    pthread_mutex_lock(&m->lock);
    instance *in = place_locked(m, model_id, &status, err, errlen);
    if (in) snprintf(instance_id, n, "%s", in->id);
    pthread_mutex_unlock(&m->lock);
    return in ? 0 : status;
}

static int submit_locked(instances *m, instance *in, const gen_request *request,
                         instances_message_fn fn, void *arg, uint64_t *call_id, char *err,
                         size_t errlen);

int instances_generate(instances *m, const gen_request *request, instances_message_fn fn,
                       void *arg, uint64_t *call_id, char *err, size_t errlen) {
    int status = 0;
    pthread_mutex_lock(&m->lock);
    if (m->router.generate) {
        instance *here = find_model_locked(m, request->model);
        int load = here && (here->status == RUNNER_READY || here->status == RUNNER_RUNNING)
                       ? here->n_calls
                       : -1;
        uint64_t id = m->next_call_id++;
        instances_router router = m->router;
        pthread_mutex_unlock(&m->lock);
        int routed = router.generate(router.ctx, request, load, fn, arg, id, err, errlen);
        if (routed >= 0) {
            *call_id = id;
            return routed;
        }
        pthread_mutex_lock(&m->lock);
    }
    instance *in = place_locked(m, request->model, &status, err, errlen);
    if (!in) {
        pthread_mutex_unlock(&m->lock);
        return status;
    }
    return submit_locked(m, in, request, fn, arg, call_id, err, errlen);
}

int instances_generate_instance(instances *m, const char *instance_id, const gen_request *request,
                                instances_message_fn fn, void *arg, uint64_t *call_id, char *err,
                                size_t errlen) {
    pthread_mutex_lock(&m->lock);
    instance *in = find_id_locked(m, instance_id);
    if (!in || in->rank != 0) {
        pthread_mutex_unlock(&m->lock);
        snprintf(err, errlen, "instance %s has no rank-0 runner on this node", instance_id);
        return 404;
    }
    return submit_locked(m, in, request, fn, arg, call_id, err, errlen);
}

/* Waits for in to be Ready and sends the request; m->lock held on entry, released on return. */
static int submit_locked(instances *m, instance *in, const gen_request *request,
                         instances_message_fn fn, void *arg, uint64_t *call_id, char *err,
                         size_t errlen) {
    in->refs++;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += m->ready_timeout_s;
    int timed_out = 0;
    while (!in->removed && in->status != RUNNER_READY && in->status != RUNNER_RUNNING &&
           in->status != RUNNER_FAILED && !timed_out)
        timed_out = pthread_cond_timedwait(&m->cond, &m->lock, &deadline) == ETIMEDOUT;
    if (in->removed || in->status == RUNNER_FAILED || timed_out) {
        snprintf(err, errlen, "the runner for %s %s%s", request->model,
                 timed_out ? "was not ready in time" : "failed: ",
                 timed_out ? "" : (in->error[0] ? in->error : "it stopped"));
        instance_unref_locked(m, in);
        pthread_mutex_unlock(&m->lock);
        return 503;
    }
    call *c = calloc(1, sizeof *c);
    c->id = m->next_call_id++;
    c->fn = fn;
    c->arg = arg;
    c->next = in->calls;
    in->calls = c;
    if (!in->n_calls++) in->busy_since_ns = clock_now_ns();
    *call_id = c->id;
    pthread_mutex_unlock(&m->lock);

    json_t *msg = json_pack("{s:s,s:I,s:o}", "type", "generate", "id", (json_int_t)c->id,
                            "request", gen_request_to_json(request));
    int rc = send_message(in, msg);
    pthread_mutex_lock(&m->lock);
    if (rc) {
        /* The reader thread delivers "done" to every call when it sees the EOF, this one
         * included, so the caller hears about it the normal way. */
        log_warn("could not send a request to the runner for %s", request->model);
    }
    instance_unref_locked(m, in);
    pthread_mutex_unlock(&m->lock);
    return 0;
}

void instances_cancel(instances *m, uint64_t call_id) {
    pthread_mutex_lock(&m->lock);
    instance *target = NULL;
    for (instance *in = m->list; in && !target; in = in->next)
        for (call *c = in->calls; c; c = c->next)
            if (c->id == call_id) {
                target = in;
                break;
            }
    if (target) target->refs++;
    instances_router router = m->router;
    pthread_mutex_unlock(&m->lock);
    if (!target) {
        if (router.cancel) router.cancel(router.ctx, call_id);
        return;
    }
    send_message(target, json_pack("{s:s,s:I}", "type", "cancel", "id", (json_int_t)call_id));
    pthread_mutex_lock(&m->lock);
    instance_unref_locked(m, target);
    pthread_mutex_unlock(&m->lock);
}

/* ------------------------------------------------------------------ state */

static json_t *runner_status_json(const instance *in) {
    enum runner_status st = in->status;
    if (st == RUNNER_READY && in->n_calls) st = RUNNER_RUNNING;
    char tag[64];
    snprintf(tag, sizeof tag, "Runner%s", STATUS_NAMES[st]);
    json_t *body = json_object();
    if (st == RUNNER_LOADING) {
        json_object_set_new(body, "layersLoaded", json_integer(in->layers_loaded));
        json_object_set_new(body, "totalLayers", json_integer(in->total_layers));
    }
    if (st == RUNNER_FAILED) json_object_set_new(body, "errorMessage", json_string(in->error));
    return json_pack("{s:o}", tag, body);
}

static json_t *instance_json(const instances *m, const instance *in) {
    if (in->state_instance) return json_deep_copy(in->state_instance);
    int n_layers = in->info ? (int)json_integer_value(json_object_get(in->info, "n_layers")) : 0;
    if (!n_layers) n_layers = in->total_layers;
    json_t *shard = json_pack("{s:{s:s,s:i,s:i,s:i,s:i,s:i}}", "PipelineShardMetadata", "modelId",
                              in->model_id, "deviceRank", 0, "worldSize", 1, "startLayer", 0,
                              "endLayer", n_layers, "nLayers", n_layers);
    json_t *body = json_pack("{s:s,s:{s:s,s:{s:o},s:{s:s}},s:s}", "instanceId", in->id,
                             "shardAssignments", "modelId", in->model_id, "runnerToShard",
                             in->runner_id, shard, "nodeToRunner", m->node_id, in->runner_id,
                             "modelPath", in->model_dir);
    return json_pack("{s:o}", "LocalInstance", body);
}

json_t *instances_state_json(instances *m) {
    json_t *insts = json_object(), *runners = json_object(), *from_state = json_object();
    pthread_mutex_lock(&m->lock);
    for (instance *in = m->list; in; in = in->next) {
        json_object_set_new(insts, in->id, instance_json(m, in));
        json_object_set_new(runners, in->runner_id, runner_status_json(in));
        if (in->state_instance) json_object_set_new(from_state, in->id, json_true());
    }
    pthread_mutex_unlock(&m->lock);
    return json_pack("{s:o,s:o,s:o}", "instances", insts, "runners", runners, "fromState",
                     from_state);
}

json_t *instances_get_json(instances *m, const char *id) {
    pthread_mutex_lock(&m->lock);
    instance *in = find_id_locked(m, id);
    json_t *j = in ? instance_json(m, in) : NULL;
    pthread_mutex_unlock(&m->lock);
    return j;
}

static void shutdown_instance(instances *m, instance *in) {
    /* m->lock held on entry and exit; in was just unlinked: the table's reference moves to the
     * stopping list, where the watchdog kills it if it is still alive after the grace. */
    in->status = RUNNER_SHUTTING_DOWN;
    in->kill_at_ns = clock_now_ns() + (uint64_t)INSTANCES_STOP_GRACE_S * 1000000000ull;
    in->next_stopping = m->stopping;
    m->stopping = in;
    in->refs++; /* held across the unlocked send */
    pthread_mutex_unlock(&m->lock);
    send_message(in, json_pack("{s:s}", "type", "shutdown"));
    pthread_mutex_lock(&m->lock);
    instance_unref_locked(m, in);
}

int instances_delete(instances *m, const char *id) {
    pthread_mutex_lock(&m->lock);
    instance *in = find_id_locked(m, id);
    if (!in) {
        pthread_mutex_unlock(&m->lock);
        return -1;
    }
    unlink_locked(m, in);
    if (in->exited) instance_unref_locked(m, in); /* a failed runner: nothing left to stop */
    else shutdown_instance(m, in);
    pthread_mutex_unlock(&m->lock);
    return 0;
}

int instances_in_flight(instances *m) {
    int n = 0;
    pthread_mutex_lock(&m->lock);
    for (instance *in = m->list; in; in = in->next) n += in->n_calls;
    pthread_mutex_unlock(&m->lock);
    return n;
}

/* A model id as a Prometheus label value (backslash, quote and newline escaped). */
static void append_label(strbuf *out, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') strbuf_appendf(out, "\\%c", *v);
        else if (*v == '\n') strbuf_appendf(out, "\\n");
        else strbuf_appendf(out, "%c", *v);
    }
}

void instances_render_metrics(instances *m, strbuf *out) {
    static const char *names[][2] = {
        {"exo_kv_blocks_total", "KV cache blocks of the instance's runner."},
        {"exo_kv_blocks_used", "KV cache blocks held by queued or running sequences."},
        {"exo_kv_blocks_cached", "Unused KV cache blocks kept for the prefix cache (evictable)."},
        {"exo_kv_blocks_free", "KV cache blocks an allocation can take now (free + cached)."},
        {"exo_kv_block_tokens", "Token positions per KV cache block."},
        {"exo_scheduler_running", "Sequences holding KV blocks."},
        {"exo_scheduler_waiting", "Sequences queued for admission (new or preempted)."},
        {"exo_scheduler_preemptions_total", "Sequences preempted because the KV cache was full."},
        {"exo_spec_verify_steps_total", "Speculative decoding: sequence steps that verified drafts."},
        {"exo_spec_drafted_tokens_total", "Speculative decoding: tokens drafted."},
        {"exo_spec_accepted_tokens_total", "Speculative decoding: drafted tokens accepted."},
    };
    enum { N_METRICS = sizeof names / sizeof names[0], FIRST_COUNTER = 7 };
    pthread_mutex_lock(&m->lock);
    for (int k = 0; k < N_METRICS; k++) {
        strbuf_appendf(out, "# HELP %s %s\n# TYPE %s %s\n", names[k][0], names[k][1],
                       names[k][0], k >= FIRST_COUNTER ? "counter" : "gauge");
        for (instance *in = m->list; in; in = in->next) {
            if (!in->has_kv_stats) continue;
            long long v[N_METRICS] = {in->kv_total, in->kv_total - in->kv_free, in->kv_cached,
                                      in->kv_free, in->kv_block_tokens, in->sched_running,
                                      in->sched_waiting, in->preemptions, in->spec_verifies,
                                      in->spec_drafted, in->spec_accepted};
            strbuf_appendf(out, "%s{model=\"", names[k][0]);
            append_label(out, in->model_id);
            strbuf_appendf(out, "\"} %lld\n", v[k]);
        }
    }
    pthread_mutex_unlock(&m->lock);
}

json_t *instances_running_models(instances *m) {
    json_t *a = json_array();
    pthread_mutex_lock(&m->lock);
    for (instance *in = m->list; in; in = in->next)
        if (in->status == RUNNER_READY || in->status == RUNNER_RUNNING)
            json_array_append_new(a, json_string(in->model_id));
    pthread_mutex_unlock(&m->lock);
    return a;
}

void instances_free(instances *m) {
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    m->closing = 1;
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->lock);
    if (m->watchdog_started) pthread_join(m->watchdog, NULL);
    pthread_mutex_lock(&m->lock);
    while (m->list) {
        instance *in = m->list;
        unlink_locked(m, in);
        if (in->exited) instance_unref_locked(m, in);
        else shutdown_instance(m, in);
    }
    /* The watchdog has stopped: sweep here until every runner asked to stop has been reaped
     * (one still alive after the grace, busy in a long engine step or stopped, gets SIGKILL),
     * plus 2 s for the readers to reap the killed ones. */
    uint64_t give_up = clock_now_ns() + (uint64_t)(INSTANCES_STOP_GRACE_S + 2) * 1000000000ull;
    for (uint64_t now = clock_now_ns(); (m->stopping || m->live_readers) && now < give_up;
         now = clock_now_ns()) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        t.tv_nsec += 100 * 1000000L;
        t.tv_sec += t.tv_nsec / 1000000000L;
        t.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&m->cond, &m->lock, &t);
        sweep_stopping_locked(m, clock_now_ns());
    }
    sweep_stopping_locked(m, clock_now_ns());
    int left = m->live_readers;
    pthread_mutex_unlock(&m->lock);
    if (left) return; /* a reader is still reaping; leave the table to the exiting process */
    pthread_mutex_destroy(&m->lock);
    pthread_cond_destroy(&m->cond);
    free(m->runner_exe);
    free(m->models_dir);
    free(m->models_path);
    free(m->node_id);
    free(m->speculative);
    free(m);
}
