/* One model over several ranks, each a forked process on loopback with its own engine, joined by
 * the real data plane (dist/, a directory store): pipeline on 2 and 3 ranks and tensor parallel
 * on 2 and 4, for dense and MoE models in bf16 and MLX 4-bit. Rank 0 serves concurrent requests
 * with staggered arrivals, chunked prefill (prompts longer than a step), a prefix-cache hit and
 * a cancellation, exactly as a one-process engine does: the same greedy tokens, logprobs within
 * 1e-3, the same finish reasons and cached-prefix counts. A follower killed mid-generation makes
 * rank 0's next step fail with an error naming the failure, within the data plane's timeout
 * (never a hang); a rank 0 that goes away ends the followers' loop with an error; ranks whose
 * scheduler settings differ are refused at open, naming the rank. Tensor parallel asked to run on
 * the GPU is refused at open, on every rank, with a message (never a crash).
 * Constrained requests (a stateful token mask, as a grammar is) give the one-process tokens on
 * every split: the sampling rank rebuilds each request's constraint from its spec, masks with it
 * and advances it with the tokens in order; every constraint built is released; an instance
 * whose sampling rank cannot build constraints refuses them at submit, naming that rank.
 * Speculative decoding on every split (the n-gram drafter, and an oracle of the one-process
 * outputs that is always right) is lossless: greedy, the one-process tokens without speculation;
 * sampled, the one-process tokens with the same drafter (tensor and serial pipeline, whose
 * schedule is one process's); the oracle's drafts are all accepted; ranks that would draft
 * differently are refused at open. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tiny_model.h"

#include "base/clock.h"
#include "dist/dist.h"
#include "infer/drafter.h"
#include "infer/engine.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define N_REQ 6
#define MAX_TOK 10
#define CANCELLED_REQ 5
#define CANCEL_STEP 4
#define TIMEOUT_MS 8000

typedef struct result {
    int n;
    int32_t tokens[MAX_TOK];
    float logprobs[MAX_TOK];
    engine_finish finish;
    int cached_tokens;
} result;

/* Lives in a MAP_SHARED page: rank 0 (a child) writes, the test reads. */
typedef struct shared {
    result results[N_REQ];
    int rank0_ok;           /* the driver ran to the end */
    int step_failed;        /* a step returned -1 */
    char error[256];        /* engine_last_error then */
    int tokens_seen;        /* kill test: tokens produced so far */
    volatile int paused;    /* kill test: rank 0 waits here until the test killed a follower */
    volatile int go_on;
    engine_stats stats;     /* rank 0's, at the end */
} shared;

static const int prompt_len[N_REQ] = {3, 40, 17, 44, 9, 12};
static const int arrive_step[N_REQ] = {0, 0, 2, 8, 9, 0};
static int32_t prompts[N_REQ][64];
static result alone[4][N_REQ], full[4][N_REQ]; /* full: the same without the cancellation */
static char model_dirs[4][256];
static const char *rank_device; /* engine_options.device of the forked ranks (NULL = auto) */

/* Speculation in the runs that follow (every rank and the one-process references alike). */
typedef enum spec_kind { SPEC_OFF = 0, SPEC_NGRAM, SPEC_ORACLE } spec_kind;
static spec_kind speculation;
static int sampled;               /* requests sample (temperature 0.3, a seed each: the tiny
                                     models' distributions are flat, so drafts are sometimes
                                     kept and sometimes not) */
static drafter *oracle;           /* SPEC_ORACLE: the one-process outputs of the current model */
static int rank1_no_speculation;  /* a test's rank 1 that does not speculate */

/* ---- a constraint as a grammar is one: stateful, advanced by each accepted token. Spec "M K":
 * the first token is K mod M, each next one the previous plus one mod M. */
typedef struct step_constraint {
    int mod, next;
} step_constraint;

static int constrained;            /* drive() submits every request with a step constraint */
static result alone_c[4][N_REQ];   /* constrained ground truth, one process */
static int constraints_made, constraints_released; /* in this process */

static void step_mask(void *ctx, float *logits, int n) {
    const step_constraint *c = ctx;
    for (int t = 0; t < n; t++)
        if (t % c->mod != c->next) logits[t] = -INFINITY;
}

static void step_accept(void *ctx, int32_t token) {
    step_constraint *c = ctx;
    c->next = (token + 1) % c->mod;
}

static void step_release(void *ctx) {
    constraints_released++;
    free(ctx);
}

static int make_step_constraint(void *ctx, const char *spec, engine_constraint *out, char *err,
                                size_t errlen) {
    (void)ctx;
    step_constraint *c = calloc(1, sizeof *c);
    if (!c || sscanf(spec, "%d %d", &c->mod, &c->next) != 2 || c->mod < 2) {
        snprintf(err, errlen, "bad spec '%s'", spec);
        free(c);
        return -1;
    }
    constraints_made++;
    *out = (engine_constraint){step_mask, step_accept, step_release, c};
    return 0;
}

static const char *step_spec(int r) {
    static char spec[N_REQ][16];
    snprintf(spec[r], sizeof spec[r], "%d %d", 3 + r % 3, r % (3 + r % 3));
    return spec[r];
}

/* The tokens of request r keep its constraint. */
static void expect_constraint_kept(const result *res, int r) {
    int mod = 3 + r % 3, next = r % mod;
    for (int i = 0; i < res->n; i++) {
        assert_int_equal(res->tokens[i] % mod, next);
        next = (res->tokens[i] + 1) % mod;
    }
}

static void make_prompts(void) {
    for (int r = 0; r < N_REQ; r++)
        for (int i = 0; i < prompt_len[r]; i++) prompts[r][i] = 4 + (r * 31 + i * 7) % 80;
    /* request 3 starts with request 1's first 32 tokens: two cached blocks once 1 is in */
    memcpy(prompts[3], prompts[1], 32 * sizeof(int32_t));
}

static engine_request request(int r) {
    engine_request q = {.prompt = prompts[r], .n_prompt = prompt_len[r], .max_tokens = MAX_TOK,
                        .ban_eos = 1};
    q.sampling = sampling_params_default();
    q.sampling.temperature = sampled ? 0.3f : 0;
    q.sampling.seed = (uint64_t)(100 + r);
    q.sampling.logprobs = 1;
    q.sampling.top_logprobs = 2;
    return q;
}

static engine_options options(const char *dir) {
    engine_options o = {.model_dir = dir, .n_threads = 1, .max_batch_tokens = 32,
                        .max_sequences = 4, .kv_cache_bytes = 0};
    if (speculation == SPEC_NGRAM) o.speculative = "ngram";
    if (speculation == SPEC_ORACLE) o.drafter = oracle;
    return o;
}

/* Rank 0's (or the one process's) side: submits, cancels, steps to the end. kill_after > 0:
 * after that many tokens, waits for the test to kill a follower, then keeps stepping. */
static void drive(engine *e, shared *sh, int kill_after, int cancel_step) {
    engine_event ev[64];
    char err[256];
    int submitted = 0;
    for (int step = 0; step < 2000; step++) {
        for (int r = 0; r < N_REQ; r++)
            if (arrive_step[r] == step) {
                engine_request q = request(r);
                if (constrained) {
                    q.constraint_spec = step_spec(r);
                    if (make_step_constraint(NULL, q.constraint_spec, &q.constraint, err,
                                             sizeof err))
                        return;
                }
                if (engine_submit(e, (uint64_t)r, &q, err, sizeof err)) {
                    if (q.constraint.ctx) q.constraint.release(q.constraint.ctx);
                    snprintf(sh->error, sizeof sh->error, "%s", err);
                    return;
                }
                submitted++;
            }
        if (step == cancel_step) engine_cancel(e, CANCELLED_REQ);
        if (kill_after && sh->tokens_seen >= kill_after && !sh->go_on) {
            sh->paused = 1;
            while (!sh->go_on) clock_sleep_ms(5);
        }
        int n = engine_step(e, ev, 64);
        if (n < 0) {
            sh->step_failed = 1;
            snprintf(sh->error, sizeof sh->error, "%s", engine_last_error(e));
            return;
        }
        for (int i = 0; i < n; i++) {
            result *res = &sh->results[ev[i].seq_id];
            if (ev[i].token >= 0 && res->n < MAX_TOK) {
                res->logprobs[res->n] = ev[i].logprob;
                res->tokens[res->n++] = ev[i].token;
                sh->tokens_seen++;
            }
            if (ev[i].finish) res->finish = ev[i].finish;
            if (ev[i].finish == ENGINE_FINISH_ERROR) fprintf(stderr, "request %d: %s\n", (int)ev[i].seq_id, ev[i].error);
            res->cached_tokens = ev[i].cached_tokens;
        }
        if (submitted == N_REQ && engine_pending(e) == 0) {
            sh->rank0_ok = 1;
            engine_get_stats(e, &sh->stats);
            return;
        }
    }
}

static int rank1_max_sequences; /* a test's rank 1 with other scheduler settings (0 = same) */
static int no_maker_rank = -1;  /* a test's rank without make_constraint */

static shared *shared_new(void) {
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    return sh;
}

/* One rank's process: connect, open its shard, drive (rank 0) or follow. Exit code 0 = clean. */
static void rank_main(const char *model, const char *store_dir, int rank, int size,
                      engine_parallel mode, int serial, shared *sh, int kill_after) {
    alarm(120); /* a hang fails the test instead of stalling it */
    char err[256] = "";
    dist_store st;
    if (dist_store_dir(&st, store_dir)) _exit(10);
    dist_config c = {.rank = rank, .size = size, .prefix = "test", .bind_host = "127.0.0.1",
                     .timeout_ms = TIMEOUT_MS};
    dist_group *g = dist_connect(&c, &st, err, sizeof err);
    if (!g) {
        fprintf(stderr, "rank %d: connect: %s\n", rank, err);
        _exit(11);
    }
    engine_options o = options(model);
    if (rank == 1 && rank1_max_sequences) o.max_sequences = rank1_max_sequences;
    if (rank == 1 && rank1_no_speculation) o.speculative = NULL, o.drafter = NULL;
    o.dist = g;
    o.parallel = mode;
    o.dist_timeout_ms = TIMEOUT_MS;
    o.pipeline_serial = serial;
    o.device = rank_device;
    if (rank != no_maker_rank) o.make_constraint = make_step_constraint;
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) {
        if (rank == 0) snprintf(sh->error, sizeof sh->error, "%s", err);
        dist_close(g);
        _exit(12);
    }
    int rc = 0;
    if (rank == 0) {
        drive(e, sh, kill_after, CANCEL_STEP);
    } else if (engine_follow(e) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, engine_last_error(e));
        rc = 13;
    }
    engine_close(e);
    dist_close(g);
    dist_store_dir_free(&st);
    if (!rc && constraints_made != constraints_released) {
        fprintf(stderr, "rank %d: %d constraints built, %d released\n", rank, constraints_made,
                constraints_released);
        rc = 14;
    }
    _exit(rc);
}

static void store_dir(char *out, size_t n, const char *name) {
    static int serial;
    char sub[96];
    snprintf(sub, sizeof sub, "store_%s_%d", name, serial++);
    tiny_dir(out, n, sub);
    assert_int_equal(paths_mkdir_p(out), 0);
}

static void spawn(pid_t *pids, const char *model, const char *store, int size,
                  engine_parallel mode, int serial, shared *sh, int kill_after) {
    fflush(stdout);
    fflush(stderr);
    for (int k = 0; k < size; k++) {
        pids[k] = fork();
        assert_true(pids[k] >= 0);
        if (pids[k] == 0) rank_main(model, store, k, size, mode, serial, sh, kill_after);
    }
}

static int wait_exit(pid_t pid) {
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void expect_same(const result *got, const result *want, const char *what) {
    for (int r = 0; r < N_REQ; r++) {
        if (got[r].n != want[r].n || got[r].finish != want[r].finish ||
            got[r].cached_tokens != want[r].cached_tokens ||
            memcmp(got[r].tokens, want[r].tokens, (size_t)want[r].n * sizeof(int32_t)))
            fprintf(stderr, "%s: request %d differs (%d tokens, finish %d, cached %d; one process: "
                    "%d, %d, %d)\n", what, r, got[r].n, got[r].finish, got[r].cached_tokens,
                    want[r].n, want[r].finish, want[r].cached_tokens);
        assert_int_equal(got[r].n, want[r].n);
        assert_int_equal(got[r].finish, want[r].finish);
        assert_int_equal(got[r].cached_tokens, want[r].cached_tokens);
        assert_memory_equal(got[r].tokens, want[r].tokens, (size_t)want[r].n * sizeof(int32_t));
        for (int i = 0; i < want[r].n; i++)
            assert_true(fabsf(got[r].logprobs[i] - want[r].logprobs[i]) <= 1e-3f);
    }
}

/* An overlapped pipeline plans different batches than one process (a sequence sits out the
 * steps its token is in flight), so a cancellation lands after a different number of tokens and
 * a prefix may be registered later: the tokens every request gets are still the same. */
static void expect_same_tokens(const result *got, const result *want, const result *full,
                               const char *what) {
    for (int r = 0; r < N_REQ; r++) {
        const result *ref = r == CANCELLED_REQ ? full : want;
        int n = r == CANCELLED_REQ ? got[r].n : want[r].n;
        if (r != CANCELLED_REQ && got[r].n != want[r].n) {
            fprintf(stderr, "%s: request %d: %d tokens (finish %d), want %d:", what, r, got[r].n,
                    got[r].finish, want[r].n);
            for (int i = 0; i < got[r].n; i++) fprintf(stderr, " %d/%d", got[r].tokens[i], want[r].tokens[i]);
            fprintf(stderr, "\n");
        }
        if (r != CANCELLED_REQ) assert_int_equal(got[r].n, want[r].n);
        assert_int_equal(got[r].finish, want[r].finish);
        if (memcmp(got[r].tokens, ref[r].tokens, (size_t)n * sizeof(int32_t)))
            fprintf(stderr, "%s: request %d differs\n", what, r);
        assert_memory_equal(got[r].tokens, ref[r].tokens, (size_t)n * sizeof(int32_t));
        for (int i = 0; i < n; i++)
            assert_true(fabsf(got[r].logprobs[i] - ref[r].logprobs[i]) <= 1e-3f);
    }
}

/* Runs model over `size` forked ranks (the current constraint and speculation settings) and waits
 * for all of them: every rank exits cleanly and rank 0's driver ran to the end. The caller
 * checks sh->results and unmaps sh. */
static shared *run_ranks(const char *what, const char *store_name, int model, int size,
                         engine_parallel mode, int serial) {
    char store[256];
    store_dir(store, sizeof store, store_name);
    shared *sh = shared_new();
    pid_t pids[4];
    spawn(pids, model_dirs[model], store, size, mode, serial, sh, 0);
    for (int k = 0; k < size; k++) {
        int rc = wait_exit(pids[k]);
        if (rc) fprintf(stderr, "%s: rank %d exited with %d\n", what, k, rc);
        assert_int_equal(rc, 0);
    }
    if (sh->step_failed || !sh->rank0_ok) fprintf(stderr, "%s: %s\n", what, sh->error);
    assert_true(sh->rank0_ok);
    return sh;
}

/* "<model> tensor x2", "<model> pipeline (serial) x3", ... */
static void split_name(char *out, size_t n, const char *prefix, int model, int size,
                       engine_parallel mode, int serial) {
    /* The check keeps gcc -O2's format-truncation warning quiet: a long name is only cut. */
    if (snprintf(out, n, "%s%s %s%s x%d", prefix, model_dirs[model],
                 mode == ENGINE_TENSOR ? "tensor" : "pipeline", serial ? " (serial)" : "",
                 size) >= (int)n)
        out[n - 1] = '\0';
}

/* Constrained requests on a split: the one-process tokens, each keeping its constraint; the one
 * cancelled midway releases its constraint too (each rank checks at exit). */
static void run_constrained_split(int model, int size, engine_parallel mode, int serial) {
    char what[160];
    split_name(what, sizeof what, "constrained ", model, size, mode, serial);
    constrained = 1;
    shared *sh = run_ranks(what, "constrained", model, size, mode, serial);
    constrained = 0;
    for (int r = 0; r < N_REQ; r++) { /* the ground truth ran without the cancellation */
        const result *got = &sh->results[r], *want = &alone_c[model][r];
        assert_int_equal(got->finish, r == CANCELLED_REQ ? ENGINE_FINISH_CANCELLED : want->finish);
        if (r != CANCELLED_REQ) assert_int_equal(got->n, want->n);
        expect_constraint_kept(got, r);
        if (memcmp(got->tokens, want->tokens, (size_t)got->n * sizeof(int32_t)))
            fprintf(stderr, "%s: request %d differs\n", what, r);
        assert_memory_equal(got->tokens, want->tokens, (size_t)got->n * sizeof(int32_t));
        for (int i = 0; i < got->n; i++) {
            if (!(fabsf(got->logprobs[i] - want->logprobs[i]) <= 1e-3f))
                fprintf(stderr, "%s: request %d token %d logprob %g, one process %g\n", what, r,
                        i, got->logprobs[i], want->logprobs[i]);
            assert_true(fabsf(got->logprobs[i] - want->logprobs[i]) <= 1e-3f);
        }
    }
    printf("%s: same tokens as one process, constraints kept, one cancelled\n", what);
    munmap(sh, sizeof *sh);
}

static void run_split(int model, int size, engine_parallel mode, int serial) {
    char what[160];
    split_name(what, sizeof what, "", model, size, mode, serial);
    shared *sh = run_ranks(what, "split", model, size, mode, serial);
    if (mode == ENGINE_PIPELINE && !serial)
        expect_same_tokens(sh->results, alone[model], full[model], what);
    else
        expect_same(sh->results, alone[model], what);
    printf("%s: same tokens as one process\n", what);
    munmap(sh, sizeof *sh);
}

static const tiny_spec specs[4] = {
    {.arch = "Qwen3ForCausalLM", .vocab = 96, .dim = 64, .layers = 4, .heads = 8, .kv_heads = 4,
     .head_dim = 16, .inter = 128, .dtype = ST_BF16, .max_pos = 256, .seed = 21},
    {.arch = "LlamaForCausalLM", .vocab = 96, .dim = 64, .layers = 4, .heads = 8, .kv_heads = 4,
     .head_dim = 16, .inter = 256, .quant_bits = 4, .group_size = 32, .max_pos = 256, .seed = 22},
    {.arch = "Qwen3MoeForCausalLM", .vocab = 96, .dim = 64, .layers = 4, .heads = 4,
     .kv_heads = 4, .head_dim = 32, .inter = 128, .experts = 8, .topk = 2, .moe_inter = 128,
     .norm_topk = 1, .dtype = ST_BF16, .max_pos = 256, .seed = 23},
    {.arch = "Qwen3MoeForCausalLM", .vocab = 96, .dim = 64, .layers = 4, .heads = 4,
     .kv_heads = 4, .head_dim = 32, .inter = 128, .experts = 8, .topk = 2, .moe_inter = 128,
     .norm_topk = 1, .stacked_experts = 1, .quant_bits = 4, .group_size = 32, .max_pos = 256,
     .seed = 24},
};

static int setup(void **s) {
    (void)s;
    make_prompts();
    static const char *names[4] = {"dist_dense_bf16", "dist_dense_4bit", "dist_moe_bf16",
                                   "dist_moe_4bit"};
    for (int m = 0; m < 4; m++) {
        tiny_dir(model_dirs[m], sizeof model_dirs[m], names[m]);
        if (tiny_model_write(model_dirs[m], &specs[m])) return -1;
        /* the ground truth: one process, same arrivals, same scheduler settings */
        engine_options o = options(model_dirs[m]);
        char err[256];
        engine *e = engine_open(&o, err, sizeof err);
        if (!e) {
            fprintf(stderr, "%s\n", err);
            return -1;
        }
        shared sh = {0};
        drive(e, &sh, 0, CANCEL_STEP);
        if (!sh.rank0_ok) return -1;
        memcpy(alone[m], sh.results, sizeof alone[m]);
        memset(&sh, 0, sizeof sh);
        drive(e, &sh, 0, -1);
        engine_close(e);
        if (!sh.rank0_ok) return -1;
        memcpy(full[m], sh.results, sizeof full[m]);
        memset(&sh, 0, sizeof sh);
        constrained = 1;
        e = engine_open(&o, err, sizeof err);
        if (e) drive(e, &sh, 0, -1);
        engine_close(e);
        constrained = 0;
        if (!sh.rank0_ok) return -1;
        memcpy(alone_c[m], sh.results, sizeof alone_c[m]);
    }
    return 0;
}

static int teardown(void **s) {
    (void)s;
    tiny_cleanup();
    return 0;
}

static void test_ground_truth_is_rich(void **s) {
    (void)s; /* the scenario exercises what it claims to */
    for (int m = 0; m < 4; m++) {
        assert_true(alone[m][3].cached_tokens >= 32);      /* a prefix-cache hit */
        assert_int_equal(alone[m][CANCELLED_REQ].finish, ENGINE_FINISH_CANCELLED);
        assert_true(alone[m][CANCELLED_REQ].n < MAX_TOK);
        for (int r = 0; r < N_REQ; r++)
            if (r != CANCELLED_REQ) assert_int_equal(alone[m][r].finish, ENGINE_FINISH_LENGTH);
        int distinct = 0;
        for (int r = 1; r < N_REQ; r++)
            distinct += memcmp(alone[m][r].tokens, alone[m][0].tokens, sizeof alone[m][0].tokens) != 0;
        assert_true(distinct >= 3);
    }
}

static void test_pipeline_2(void **s) {
    (void)s;
    for (int m = 0; m < 4; m++) run_split(m, 2, ENGINE_PIPELINE, 0);
}

static void test_pipeline_3(void **s) {
    (void)s;
    for (int m = 0; m < 4; m++) run_split(m, 3, ENGINE_PIPELINE, 0);
}

static void test_pipeline_serial_2_and_3(void **s) {
    (void)s; /* one step at a time through the stages: the one-process schedule exactly */
    for (int m = 0; m < 4; m++) run_split(m, 2, ENGINE_PIPELINE, 1);
    for (int m = 0; m < 4; m++) run_split(m, 3, ENGINE_PIPELINE, 1);
}

static void test_tensor_2(void **s) {
    (void)s;
    for (int m = 0; m < 4; m++) run_split(m, 2, ENGINE_TENSOR, 0);
}

static void test_tensor_4(void **s) {
    (void)s;
    for (int m = 0; m < 4; m++) run_split(m, 4, ENGINE_TENSOR, 0);
}

/* Kills follower `victim` once rank 0 has produced a few tokens; rank 0's next step must fail
 * with a message (the step returns -1, no hang: the children's alarm would fail the test). */
static void kill_follower(int size, engine_parallel mode, int victim) {
    char store[256];
    store_dir(store, sizeof store, "kill");
    shared *sh = shared_new();
    pid_t pids[4];
    spawn(pids, model_dirs[0], store, size, mode, 0, sh, 3);
    while (!sh->paused) clock_sleep_ms(5);
    kill(pids[victim], SIGKILL);
    assert_int_equal(wait_exit(pids[victim]), 128 + SIGKILL);
    uint64_t t0 = clock_now_ns();
    sh->go_on = 1;
    assert_int_equal(wait_exit(pids[0]), 0);
    double waited_s = (double)(clock_now_ns() - t0) / 1e9;
    for (int k = 1; k < size; k++)
        if (k != victim) assert_int_not_equal(wait_exit(pids[k]), 0); /* their step failed too */
    printf("%s x%d, rank %d killed: rank 0 failed after %.2f s: %s\n",
           mode == ENGINE_TENSOR ? "tensor" : "pipeline", size, victim, waited_s, sh->error);
    assert_true(sh->step_failed);
    assert_false(sh->rank0_ok);
    assert_true(strlen(sh->error) > 0);
    munmap(sh, sizeof *sh);
}

static void test_constrained_one_process(void **s) {
    (void)s; /* the ground truth keeps the constraints, and they change what is generated */
    for (int m = 0; m < 4; m++)
        for (int r = 0; r < N_REQ; r++) {
            assert_int_equal(alone_c[m][r].n, MAX_TOK);
            expect_constraint_kept(&alone_c[m][r], r);
            assert_memory_not_equal(alone_c[m][r].tokens, full[m][r].tokens, sizeof full[m][r].tokens);
        }
}

static void test_constrained_pipeline_and_tensor(void **s) {
    (void)s;
    for (int m = 0; m < 4; m += 2) { /* dense and MoE */
        run_constrained_split(m, 2, ENGINE_PIPELINE, 0);
        run_constrained_split(m, 3, ENGINE_PIPELINE, 0);
        run_constrained_split(m, 2, ENGINE_PIPELINE, 1);
        run_constrained_split(m, 2, ENGINE_TENSOR, 0);
    }
}

/* ---- speculative decoding ---- */

/* An oracle of model m's one-process greedy outputs (prompt then tokens, no cancellation). */
static drafter *oracle_of(int m) {
    drafter *d = drafter_oracle_create();
    assert_non_null(d);
    for (int r = 0; r < N_REQ; r++) {
        int32_t seq[64 + MAX_TOK];
        memcpy(seq, prompts[r], (size_t)prompt_len[r] * sizeof(int32_t));
        memcpy(seq + prompt_len[r], full[m][r].tokens, (size_t)full[m][r].n * sizeof(int32_t));
        assert_int_equal(drafter_oracle_add(d, seq, prompt_len[r] + full[m][r].n), 0);
    }
    return d;
}

/* One process with the current speculation and sampling, the usual arrivals and cancellation. */
static void one_process(int m, result *out, engine_stats *stats) {
    engine_options o = options(model_dirs[m]);
    char err[256];
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) fprintf(stderr, "%s\n", err);
    assert_non_null(e);
    shared sh = {0};
    drive(e, &sh, 0, CANCEL_STEP);
    engine_close(e);
    assert_true(sh.rank0_ok);
    memcpy(out, sh.results, sizeof sh.results);
    *stats = sh.stats;
}

static const char *const spec_names[] = {"off", "ngram", "oracle"};

/* One split with speculation. Sampled: want (one process with the same drafter) exactly where the
 * schedule is one process's. Greedy, or an overlapped pipeline: the tokens of `want`, and of
 * `full` for the cancelled request (drafts move the point where its cancellation lands). Returns
 * rank 0's statistics. */
static engine_stats run_spec_split(int model, int size, engine_parallel mode, int serial,
                                   const result *want) {
    char prefix[32], what[192];
    snprintf(prefix, sizeof prefix, "%s%s: ", spec_names[speculation], sampled ? " sampled" : "");
    split_name(what, sizeof what, prefix, model, size, mode, serial);
    shared *sh = run_ranks(what, "spec", model, size, mode, serial);
    if (sampled && (mode == ENGINE_TENSOR || serial))
        expect_same(sh->results, want, what);
    else
        expect_same_tokens(sh->results, want, full[model], what);
    engine_stats st = sh->stats;
    printf("%s: lossless, %llu of %llu drafted tokens accepted\n", what,
           (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafted);
    munmap(sh, sizeof *sh);
    return st;
}

static const struct {
    int size;
    engine_parallel mode;
    int serial;
} spec_splits[] = {{2, ENGINE_PIPELINE, 0}, {3, ENGINE_PIPELINE, 0}, {2, ENGINE_PIPELINE, 1},
                   {2, ENGINE_TENSOR, 0}, {4, ENGINE_TENSOR, 0}};

static void test_speculative_greedy_is_lossless(void **s) {
    (void)s; /* greedy with drafts: exactly the tokens without speculation */
    uint64_t ngram_drafted = 0, ngram_accepted = 0;
    for (int m = 0; m < 4; m++)
        for (spec_kind k = SPEC_NGRAM; k <= SPEC_ORACLE; k++) {
            speculation = k;
            oracle = k == SPEC_ORACLE ? oracle_of(m) : NULL;
            for (size_t i = 0; i < sizeof spec_splits / sizeof spec_splits[0]; i++) {
                engine_stats st = run_spec_split(m, spec_splits[i].size, spec_splits[i].mode,
                                                 spec_splits[i].serial, alone[m]);
                if (k == SPEC_ORACLE) { /* always right: every draft kept */
                    assert_true(st.spec_drafted >= N_REQ);
                    assert_int_equal(st.spec_accepted, st.spec_drafted);
                } else {
                    ngram_drafted += st.spec_drafted;
                    ngram_accepted += st.spec_accepted;
                }
            }
            if (oracle) oracle->destroy(oracle);
            oracle = NULL;
        }
    speculation = SPEC_OFF;
    assert_true(ngram_accepted < ngram_drafted); /* rejections were verified too */
}

static void test_speculative_sampled_matches_one_process(void **s) {
    (void)s; /* the sampling rank verifies as one process does: the same tokens, same seeds, on
              * the splits whose schedule is one process's */
    sampled = 1;
    uint64_t drafted = 0, accepted = 0;
    for (spec_kind k = SPEC_NGRAM; k <= SPEC_ORACLE; k++) {
        speculation = k;
        oracle = k == SPEC_ORACLE ? oracle_of(0) : NULL;
        result want[N_REQ];
        engine_stats one;
        one_process(0, want, &one);
        printf("one process, %s sampled: %llu of %llu drafted tokens accepted\n", spec_names[k],
               (unsigned long long)one.spec_accepted, (unsigned long long)one.spec_drafted);
        drafted += one.spec_drafted;
        accepted += one.spec_accepted;
        for (size_t i = 0; i < sizeof spec_splits / sizeof spec_splits[0]; i++)
            if (spec_splits[i].mode == ENGINE_TENSOR || spec_splits[i].serial)
                run_spec_split(0, spec_splits[i].size, spec_splits[i].mode, spec_splits[i].serial,
                               want);
        if (oracle) oracle->destroy(oracle);
        oracle = NULL;
    }
    speculation = SPEC_OFF;
    sampled = 0;
    assert_true(accepted > 0 && accepted < drafted); /* both verdicts of the rejection rule */
}

static void test_speculation_must_match_across_ranks(void **s) {
    (void)s; /* a rank that would not draft would plan other batches: refused at open */
    char store[256];
    store_dir(store, sizeof store, "specmismatch");
    shared *sh = shared_new();
    pid_t pids[2];
    speculation = SPEC_NGRAM;
    rank1_no_speculation = 1;
    spawn(pids, model_dirs[0], store, 2, ENGINE_PIPELINE, 0, sh, 0);
    rank1_no_speculation = 0;
    speculation = SPEC_OFF;
    assert_int_equal(wait_exit(pids[0]), 12);
    assert_int_equal(wait_exit(pids[1]), 12);
    printf("refused: %s\n", sh->error);
    assert_non_null(strstr(sh->error, "speculation '' x0/'ngram' x4"));
    munmap(sh, sizeof *sh);
}

/* The last stage samples: without make_constraint there, rank 0 refuses constrained requests at
 * submit with a message naming it, instead of sampling them unconstrained. */
static void test_constrained_refused_without_maker(void **s) {
    (void)s;
    char store[256];
    store_dir(store, sizeof store, "nomaker");
    shared *sh = shared_new();
    pid_t pids[2];
    no_maker_rank = 1;
    constrained = 1;
    spawn(pids, model_dirs[0], store, 2, ENGINE_PIPELINE, 0, sh, 0);
    constrained = 0;
    no_maker_rank = -1;
    for (int k = 0; k < 2; k++) assert_int_equal(wait_exit(pids[k]), 0);
    printf("refused: %s\n", sh->error);
    assert_false(sh->rank0_ok);
    assert_non_null(strstr(sh->error, "rank 1, which samples, cannot build constraints"));
    munmap(sh, sizeof *sh);
}

static void test_follower_dies_tensor(void **s) {
    (void)s;
    kill_follower(2, ENGINE_TENSOR, 1);
}

/* --device cuda with a tensor split: both ranks refuse at open (the all-reduce sums host memory),
 * before any collective, so neither waits for the other. */
static void test_tensor_on_gpu_refused(void **s) {
    (void)s;
    char store[256];
    store_dir(store, sizeof store, "gpu");
    shared *sh = shared_new();
    pid_t pids[2];
    rank_device = "cuda";
    spawn(pids, model_dirs[0], store, 2, ENGINE_TENSOR, 0, sh, 0);
    rank_device = NULL;
    for (int k = 0; k < 2; k++) assert_int_equal(wait_exit(pids[k]), 12);
    printf("tensor x2 --device cuda: %s\n", sh->error);
    assert_non_null(strstr(sh->error, "tensor parallel runs on the CPU only"));
    munmap(sh, sizeof *sh);
}

static void test_follower_dies_pipeline(void **s) {
    (void)s;
    kill_follower(3, ENGINE_PIPELINE, 1);
}

static void test_ranks_with_other_settings_are_refused(void **s) {
    (void)s; /* different scheduler settings would plan different batches: refused at open */
    char store[256];
    store_dir(store, sizeof store, "mismatch");
    shared *sh = shared_new();
    pid_t pids[2];
    rank1_max_sequences = 8;
    spawn(pids, model_dirs[0], store, 2, ENGINE_TENSOR, 0, sh, 0);
    rank1_max_sequences = 0;
    assert_int_equal(wait_exit(pids[0]), 12);
    assert_int_equal(wait_exit(pids[1]), 12);
    printf("refused: %s\n", sh->error);
    assert_non_null(strstr(sh->error, "rank 1 runs a different model or scheduler settings"));
    munmap(sh, sizeof *sh);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ground_truth_is_rich),
        cmocka_unit_test(test_pipeline_2),
        cmocka_unit_test(test_pipeline_3),
        cmocka_unit_test(test_pipeline_serial_2_and_3),
        cmocka_unit_test(test_tensor_2),
        cmocka_unit_test(test_tensor_4),
        cmocka_unit_test(test_constrained_one_process),
        cmocka_unit_test(test_constrained_pipeline_and_tensor),
        cmocka_unit_test(test_constrained_refused_without_maker),
        cmocka_unit_test(test_speculative_greedy_is_lossless),
        cmocka_unit_test(test_speculative_sampled_matches_one_process),
        cmocka_unit_test(test_speculation_must_match_across_ranks),
        cmocka_unit_test(test_follower_dies_tensor),
        cmocka_unit_test(test_follower_dies_pipeline),
        cmocka_unit_test(test_ranks_with_other_settings_are_refused),
        cmocka_unit_test(test_tensor_on_gpu_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
