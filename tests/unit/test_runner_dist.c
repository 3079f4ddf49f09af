/* Real runner processes (`exo runner`, as a node starts them) holding one model together: this
 * test plays the node, speaking the runner protocol over a socketpair to each rank, with a
 * directory store for the rendezvous. Concurrent chat-less generations (raw prompts, greedy,
 * logprobs) through rank 0 of a pipeline on 2 and 3 ranks and tensor parallel on 2 and 4 give
 * the same text, token logprobs within 1e-3 and finish reasons as one runner; every rank reports
 * Ready; closing rank 0 ends the followers cleanly. A follower killed mid-stream ends rank 0's
 * live streams with an error "done" (finish_reason error, a message naming the failure) and
 * rank 0 exits; a follower whose node closes its socket exits, and rank 0 fails the same way. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tiny_model.h"

#include "base/clock.h"
#include "runner/protocol.h"

#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#define N_REQ 3
#define MAX_TOK 8
#define MAX_RANKS 4

static char model_dir[256], exo_path[512];
static const char *prompts[N_REQ] = {"Hello there, how", "The capital of France is",
                                     "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22"};

typedef struct stream {
    char text[4096];
    double logprobs[MAX_TOK * 4];
    int n_logprobs;
    char finish[32];
    char error[256];
} stream;

static stream alone[N_REQ];

typedef struct rank_proc {
    pid_t pid;
    int fd; /* our end of its node socket */
} rank_proc;

/* Starts `exo runner` for rank k of n (n = 1: the whole model, no data plane). */
static rank_proc spawn_runner_timeout(int k, int n, const char *parallel, const char *store,
                                      const char *timeout_ms) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    char fd[16], rank[16], ranks[16];
    snprintf(fd, sizeof fd, "%d", sv[1]);
    snprintf(rank, sizeof rank, "%d", k);
    snprintf(ranks, sizeof ranks, "%d", n);
    const char *argv[32] = {"exo", "runner", "--fd", fd, "--model", model_dir, "--threads", "1",
                            "--kv-cache-mem", "16000000"};
    int a = 10;
    if (n > 1) {
        const char *more[] = {"--rank", rank, "--ranks", ranks, "--parallel", parallel,
                              "--dist-store", store, "--instance", "test-instance",
                              "--dist-timeout-ms", timeout_ms};
        for (size_t i = 0; i < sizeof more / sizeof *more; i++) argv[a++] = more[i];
    }
    argv[a] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        alarm(120); /* a hung runner fails the test instead of stalling it */
        execv(exo_path, (char *const *)argv);
        _exit(127);
    }
    close(sv[1]);
    return (rank_proc){pid, sv[0]};
}

static rank_proc spawn_runner(int k, int n, const char *parallel, const char *store) {
    return spawn_runner_timeout(k, n, parallel, store, "5000");
}

/* The next message from fd within 30 s (NULL: none, or the runner closed the socket). */
static json_t *next_message(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 30000) != 1) return NULL;
    char err[128];
    return protocol_recv(fd, err, sizeof err);
}

static const char *type_of(const json_t *m) {
    return json_string_value(json_object_get(m, "type"));
}

static void wait_ready(const rank_proc *r) {
    for (;;) {
        json_t *m = next_message(r->fd);
        assert_non_null(m);
        const char *status = json_string_value(json_object_get(m, "status"));
        int ready = status && !strcmp(type_of(m), "status") && !strcmp(status, "Ready");
        if (status && !strcmp(status, "Failed"))
            fail_msg("runner failed: %s", json_string_value(json_object_get(m, "error")));
        json_decref(m);
        if (ready) return;
    }
}

static void send_generate(int fd, uint64_t id, const char *prompt, int max_tokens) {
    gen_request q;
    gen_request_init(&q);
    q.prompt = strdup(prompt);
    q.max_tokens = max_tokens;
    q.temperature = 0;
    q.logprobs = 1;
    q.ban_eos = 1;
    json_t *m = json_pack("{s:s,s:I,s:o}", "type", "generate", "id", (json_int_t)id, "request",
                          gen_request_to_json(&q));
    assert_int_equal(protocol_send(fd, m), 0);
    json_decref(m);
    gen_request_free(&q);
}

/* Reads rank 0's messages into streams until every request is done. on_first_delta (may be
 * NULL) runs once, at the first delta. */
static void collect(int fd, stream *out, void (*on_first_delta)(void *), void *ctx) {
    int done = 0, seen_delta = 0;
    while (done < N_REQ) {
        json_t *m = next_message(fd);
        assert_non_null(m);
        const char *type = type_of(m);
        int64_t id = json_integer_value(json_object_get(m, "id"));
        stream *s = id >= 0 && id < N_REQ ? &out[id] : NULL;
        if (s && !strcmp(type, "delta")) {
            const char *c = json_string_value(json_object_get(m, "content"));
            if (c) strncat(s->text, c, sizeof s->text - strlen(s->text) - 1);
            size_t i;
            json_t *lp;
            json_array_foreach(json_object_get(m, "logprobs"), i, lp)
                if (s->n_logprobs < MAX_TOK * 4)
                    s->logprobs[s->n_logprobs++] = json_real_value(json_object_get(lp, "logprob"));
            if (!seen_delta++ && on_first_delta) on_first_delta(ctx);
        } else if (s && !strcmp(type, "done")) {
            snprintf(s->finish, sizeof s->finish, "%s",
                     json_string_value(json_object_get(m, "finish_reason")));
            const char *e = json_string_value(json_object_get(m, "error"));
            if (e) snprintf(s->error, sizeof s->error, "%s", e);
            done++;
        }
        json_decref(m);
    }
}

static int exit_code(pid_t pid) {
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void store_dir(char *out, size_t n) {
    static int serial;
    char sub[64];
    snprintf(sub, sizeof sub, "runner_store_%d", serial++);
    tiny_dir(out, n, sub);
    assert_int_equal(paths_mkdir_p(out), 0);
}

/* Starts n ranks, waits until each is Ready, sends the requests to rank 0. */
static void start_instance(rank_proc *ranks, int n, const char *parallel, int max_tokens) {
    char store[256];
    store_dir(store, sizeof store);
    for (int k = 0; k < n; k++) ranks[k] = spawn_runner(k, n, parallel, store);
    for (int k = 0; k < n; k++) wait_ready(&ranks[k]);
    for (int r = 0; r < N_REQ; r++) send_generate(ranks[0].fd, (uint64_t)r, prompts[r], max_tokens);
}

/* Tells rank 0 to shut down: it tells the others, and every rank exits with status 0 (the
 * followers' sockets stay open until then: a follower whose socket closes leaves at once). */
static void stop_instance(rank_proc *ranks, int n) {
    json_t *m = json_pack("{s:s}", "type", "shutdown");
    assert_int_equal(protocol_send(ranks[0].fd, m), 0);
    json_decref(m);
    for (int k = 0; k < n; k++) assert_int_equal(exit_code(ranks[k].pid), 0);
    for (int k = 0; k < n; k++) close(ranks[k].fd);
}

static void run_split(int n, const char *parallel) {
    rank_proc ranks[MAX_RANKS];
    stream got[N_REQ];
    memset(got, 0, sizeof got);
    start_instance(ranks, n, parallel, MAX_TOK);
    collect(ranks[0].fd, got, NULL, NULL);
    stop_instance(ranks, n);
    for (int r = 0; r < N_REQ; r++) {
        if (strcmp(got[r].text, alone[r].text))
            fprintf(stderr, "%s x%d request %d: '%s' vs one runner '%s'\n", parallel, n, r,
                    got[r].text, alone[r].text);
        assert_string_equal(got[r].text, alone[r].text);
        assert_string_equal(got[r].finish, alone[r].finish);
        assert_int_equal(got[r].n_logprobs, alone[r].n_logprobs);
        for (int i = 0; i < got[r].n_logprobs; i++)
            assert_true(fabs(got[r].logprobs[i] - alone[r].logprobs[i]) <= 1e-3);
    }
    printf("%s x%d: same text and logprobs as one runner\n", parallel, n);
}

static int setup(void **s) {
    (void)s;
    const char *build = getenv("EXO_BUILD");
    snprintf(exo_path, sizeof exo_path, "%s/exo", build ? build : "build");
    tiny_dir(model_dir, sizeof model_dir, "runner_dist_model");
    char cmd[1024];
    /* 4 layers (3 pipeline stages), 8 heads and 4 KV heads (4 tensor ranks), a real tokenizer */
    snprintf(cmd, sizeof cmd, "bash scripts/tokenizers.sh qwen3 >/dev/null && %s/tools/mkmodel "
             "--out %s --arch qwen3 --tokenizer qwen3 --seed 5 --layers 4 --heads 8 --kv-heads 4 "
             "--intermediate 256 >/dev/null", build ? build : "build", model_dir);
    if (system(cmd) != 0) return -1;
    rank_proc one[1];
    memset(alone, 0, sizeof alone);
    start_instance(one, 1, NULL, MAX_TOK);
    collect(one[0].fd, alone, NULL, NULL);
    stop_instance(one, 1);
    for (int r = 0; r < N_REQ; r++)
        if (strcmp(alone[r].finish, "length") || alone[r].n_logprobs != MAX_TOK) return -1;
    return 0;
}

static int teardown(void **s) {
    (void)s;
    tiny_cleanup();
    return 0;
}

static void test_pipeline_2(void **s) {
    (void)s;
    run_split(2, "pipeline");
}

static void test_pipeline_3(void **s) {
    (void)s;
    run_split(3, "pipeline");
}

static void test_tensor_2(void **s) {
    (void)s;
    run_split(2, "tensor");
}

static void test_tensor_4(void **s) {
    (void)s;
    run_split(4, "tensor");
}

static void kill_rank1(void *ctx) {
    rank_proc *ranks = ctx;
    kill(ranks[1].pid, SIGKILL);
}

static void test_follower_killed_mid_stream(void **s) {
    (void)s;
    rank_proc ranks[2];
    stream got[N_REQ];
    memset(got, 0, sizeof got);
    start_instance(ranks, 2, "tensor", 400);
    uint64_t t0 = clock_now_ns();
    collect(ranks[0].fd, got, kill_rank1, ranks); /* every stream must end */
    double s_taken = (double)(clock_now_ns() - t0) / 1e9;
    for (int r = 0; r < N_REQ; r++) {
        printf("request %d: %s (%s) after %.2f s\n", r, got[r].finish, got[r].error, s_taken);
        assert_string_equal(got[r].finish, "error");
        assert_non_null(strstr(got[r].error, "rank"));
    }
    assert_int_equal(exit_code(ranks[1].pid), 128 + SIGKILL);
    json_t *m;
    while ((m = next_message(ranks[0].fd))) json_decref(m); /* until rank 0 exits */
    assert_int_not_equal(exit_code(ranks[0].pid), 0);
    close(ranks[0].fd);
    close(ranks[1].fd);
}

static void test_follower_whose_node_leaves_exits(void **s) {
    (void)s; /* the node closing a follower's socket ends that runner; rank 0 then fails */
    rank_proc ranks[2];
    char store[256];
    store_dir(store, sizeof store);
    for (int k = 0; k < 2; k++) ranks[k] = spawn_runner(k, 2, "pipeline", store);
    for (int k = 0; k < 2; k++) wait_ready(&ranks[k]);
    close(ranks[1].fd);
    assert_int_equal(exit_code(ranks[1].pid), 0); /* it left on purpose */
    /* rank 0's next step (an idle keep-alive at the latest) fails: it exits, and its node would
     * fail the instance (streams in flight end with an error: test_follower_killed_mid_stream) */
    json_t *m;
    while ((m = next_message(ranks[0].fd))) json_decref(m);
    assert_int_not_equal(exit_code(ranks[0].pid), 0);
    close(ranks[0].fd);
}

static void test_runner_waiting_for_peers_exits_when_its_node_leaves(void **s) {
    (void)s; /* rank 1 never comes and the data plane would wait 10 min (alarm(120) kills a
              * runner that waits: exit 128 + SIGALRM); the node closing the socket ends it */
    char store[256];
    store_dir(store, sizeof store);
    rank_proc r0 = spawn_runner_timeout(0, 2, "pipeline", store, "600000");
    json_t *m;
    int connecting = 0;
    while (!connecting && (m = next_message(r0.fd))) {
        const char *status = json_string_value(json_object_get(m, "status"));
        connecting = status && !strcmp(status, "Connecting");
        json_decref(m);
    }
    assert_true(connecting);
    close(r0.fd);
    assert_int_equal(exit_code(r0.pid), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_2), cmocka_unit_test(test_pipeline_3),
        cmocka_unit_test(test_tensor_2),   cmocka_unit_test(test_tensor_4),
        cmocka_unit_test(test_follower_killed_mid_stream),
        cmocka_unit_test(test_follower_whose_node_leaves_exits),
        cmocka_unit_test(test_runner_waiting_for_peers_exits_when_its_node_leaves),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
