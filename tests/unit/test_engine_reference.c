/* The engine against Hugging Face transformers (tests/fixtures/reference/, float32 CPU, eager
 * attention) on the tiny models of tools/mkmodel/tiny-models.json: qwen3 (untied, tied, 4-bit),
 * llama with llama3 rope scaling (bf16, 4-bit), qwen3_moe (HF and mlx switch_mlp layouts, bf16
 * and 4-bit), gpt_oss (bf16 and MXFP4 experts: attention sinks, a sliding window of 4 on layer 0,
 * YaRN, biased router and experts; Harmony chat prompts with tools and reasoning effort), and the
 * hybrids qwen3_next (MoE + shared expert, fused projections), qwen3_5 (dense) and qwen3_5_moe
 * (mlx switch_mlp 4-bit), bf16 and 4-bit. Each model is regenerated with mkmodel from the
 * recorded args into
 * .cache/reference-models/ and checked against the recorded sha256 first.
 *
 * Teacher forcing: every prompt position's top-10 logits and logsumexp within TF_TOL.
 * Greedy (the engine as users run it: f16 KV cache, batched scheduler): tokens equal while the
 * reference's top-1/top-2 gap is >= 1e-2 (below that a float32 summation-order difference may
 * legitimately flip a near-tie); every step's top-5 logprobs within 1e-3.
 *
 * Where a CUDA GPU is present (and the build has CUDA) every fixture runs twice more on the GPU:
 * with EXO_CUDA_MATMUL=exact (float32 activations in every matmul) to the same bars as the exact
 * CPU kernels, and as the GPU runs by default (prefill matmuls of more than 8 tokens as bf16
 * GEMMs) to GEMM_TOL, tokens equal while the gap is >= GEMM_GAP_MIN. EXO_TEST_DEVICE=cuda runs
 * the GPU passes only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "arch/transformer.h"
#include "compute/cpu/cpu.h"
#include "compute/cpu/matmul_amx.h"
#include "compute/device.h"
#include "base/paths.h"
#include "infer/engine.h"
#include "infer/kv_cache.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"

#include "reference_models.h"

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances. With the generic or AVX2 kernels and an f32 KV cache the engine agrees with
 * transformers to 1e-5 on every fixture (measured: max |dlogit| 1.4e-5, max |dlogprob| 4e-5), so
 * 1e-3 -- the bar -- leaves two orders of magnitude for summation order.
 * Two deliberate approximations are measured separately:
 *  - the AVX-512 MLX matvec rounds activations to int16 per group (2^-16 relative) to use
 *    VNNI integer dot products: up to 1.8e-3 on logits/logprobs of the 4-bit tiny models, so
 *    QUANT_INT16_TOL = 3e-3 applies to MLX models when cpu_simd_level() is "avx512";
 *  - the default f16 KV cache rounds K and V to 11 significant bits: up to 3.3e-3 on logprobs
 *    (tokens still all equal), so F16_KV_TOL = 6e-3 for the run with the default cache.
 *    The AVX2 level's 16-row interleaved 4-bit kernel and the NEON dotprod level round the same
 *    way (level_quantizes_activations).
 * On an AVX-512 machine the whole suite then runs a second time with the exact kernels
 * (EXO_CPU_SIMD=avx2 EXO_Q4_LAYOUT=mlx, in a child process: the level is chosen once per
 * process), where every fixture, 4-bit included, must meet the 1e-3 bar with the f32 KV cache.
 * The hybrids (Qwen3-Next, Qwen3.5: GatedDeltaNet layers) amplify that int16 rounding: their
 * linear attention normalises per head a vector much smaller than its inputs, and the 4-layer
 * tiny models carry it further (their q/k/v projection already runs on float activations,
 * weights.c). Measured at the AVX-512 level: logits up to 1.3e-2 (Qwen3-Next MoE), 4.8e-3 (Qwen3.5
 * dense), logprobs up to 8.7e-3, every greedy token equal; HYBRID_INT16_TOL = 2e-2 applies to
 * them at such levels. With the exact kernels they meet 1e-3 like every other fixture (measured:
 * logits <= 1.6e-4, logprobs <= 6.6e-5). */
#define TF_TOL 1e-3
#define LOGPROB_TOL 1e-3
#define QUANT_INT16_TOL 3e-3
#define F16_KV_TOL 6e-3
#define HYBRID_INT16_TOL 2e-2
#define GAP_MIN 1e-2
/* bf16 activations (and 4-bit weights dequantized to bf16) in prefill GEMMs: 2^-9 relative per
 * product; measured on one H200: teacher-forced logits 1.8e-2..2.1e-2 (bf16 models) and 3.3e-2..
 * 3.6e-2 (4-bit), greedy logprobs <= 4.1e-5, every token equal */
#define GEMM_TOL 5e-2
/* The CPU's AMX tiles with their default 2 products (matmul_amx.c): prompts of 40+ tokens of the
 * 4-bit models run with bf16 activations, as the GPU GEMMs above. Measured (gguf5, dev VM):
 * logits <= 1.9e-3, logprobs <= 9.0e-3 (f32 KV) and 1.1e-2 (f16 KV), every greedy token equal;
 * with EXO_AMX_PRODUCTS=3 they meet QUANT_INT16_TOL. */
#define AMX_BF16_TOL 2e-2
#define GEMM_GAP_MIN 5e-2

/* The pass being run: which device, and the bars it is held to. */
typedef struct pass {
    const char *device; /* engine_options.device */
    const char *label;
    double gap_min;
    double tol; /* > 0: replaces TF_TOL, LOGPROB_TOL and F16_KV_TOL */
} pass;
static pass cur = {"cpu", "cpu", GAP_MIN, 0};

typedef struct stats {
    double tf_max;     /* teacher-forced: max |logit - reference| */
    double lp_max;     /* greedy: max |logprob - reference| over top-5 */
    int steps_compared, tokens_equal;
    int routing_flips; /* MoE, approximate passes: sequences no longer compared after a step
                          where the rounding changed which experts a token took (see greedy) */
} stats;

static void teacher_forced(const char *dir, json_t *prompts, stats *st) {
    model_config c;
    char err[512];
    assert_int_equal(model_config_load(dir, &c, err, sizeof err), 0);
    safetensors_set *set = safetensors_set_open(dir, err, sizeof err);
    assert_non_null(set);
    model_weights w;
    assert_int_equal(model_weights_load(set, &c, 0, 0, &w, err, sizeof err), 0);
    compute_device dev;
    assert_int_equal(compute_device_parse(cur.device, &dev, err, sizeof err), 0);
    compute_backend *be = compute_backend_open(dev, 0, err, sizeof err);
    assert_non_null(be);
    transformer *t = transformer_create(&c, &w, be, 256, 256, err, sizeof err);
    assert_non_null(t);
    float *logits = malloc(sizeof(float) * 256 * (size_t)c.vocab_size);
    size_t pi;
    json_t *p;
    json_array_foreach(prompts, pi, p) {
        json_t *ids = json_object_get(p, "prompt_ids");
        int n = (int)json_array_size(ids);
        assert_true(n > 0 && n <= 256);
        int32_t tok[256], pos[256], seq[256], slots[256], rows[256], table[16], start = 0;
        for (int i = 0; i < n; i++) {
            tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
            pos[i] = slots[i] = rows[i] = i;
            seq[i] = 0;
        }
        for (int i = 0; i < 16; i++) table[i] = i;
        kv_cache *kv = kv_cache_create(be, c.n_layers, (int64_t)c.n_kv_heads * c.head_dim, 16,
                                       16, DTYPE_F32, err, sizeof err);
        transformer_batch b = {.n_tokens = n, .tokens = tok, .positions = pos,
                               .seq_of_token = seq, .slots = slots, .n_seqs = 1,
                               .block_table_start = &start, .block_tables = table,
                               .n_block_entries = 16, .n_logits = n, .logit_rows = rows};
        assert_int_equal(transformer_forward(t, kv->layers, 16, &b, logits, err, sizeof err), 0);
        kv_cache_destroy(kv);
        json_t *tf = json_object_get(p, "teacher_forced");
        json_t *top10 = json_object_get(tf, "top10"), *lse = json_object_get(tf, "logsumexp");
        for (int i = 0; i < n; i++) {
            const float *l = logits + (size_t)i * c.vocab_size;
            size_t k;
            json_t *e;
            json_array_foreach(json_array_get(top10, (size_t)i), k, e) {
                int id = (int)json_integer_value(json_array_get(e, 0));
                double d = fabs(l[id] - json_number_value(json_array_get(e, 1)));
                st->tf_max = d > st->tf_max ? d : st->tf_max;
            }
            double m = -INFINITY, z = 0;
            for (int v = 0; v < c.vocab_size; v++) m = l[v] > m ? l[v] : m;
            for (int v = 0; v < c.vocab_size; v++) z += exp((double)l[v] - m);
            double d = fabs(m + log(z) - json_number_value(json_array_get(lse, (size_t)i)));
            st->tf_max = d > st->tf_max ? d : st->tf_max;
        }
    }
    free(logits);
    transformer_destroy(t);
    be->destroy(be);
    model_weights_free(&w);
    safetensors_set_close(set);
}

/* All prompts at once through one engine: batching is part of what is being checked. */
/* flip_tol > 0 (MoE models in a pass that rounds: f16 KV cache, int16 activations): routing is
 * discontinuous -- a rounding that moves a router logit across a near-tie sends the token to
 * another expert and changes its logprobs by far more than the rounding. A step whose top-5 is
 * off by more than flip_tol (or missing from the engine's top 20) then ends that sequence's
 * comparison, counted in routing_flips; the exact f32 pass holds every step to the bar. (Measured
 * on gpt-oss-tiny, prompt 6 step 14: numpy in float64 with only K and V rounded to f16 moves the
 * top logprob from -2.663 to -3.569, exactly as the engine does.) */
static void greedy(const char *dir, json_t *prompts, const char *kv_dtype, double flip_tol, stats *st) {
    engine_options o = {.model_dir = dir, .max_batch_tokens = 64, .kv_cache_dtype = kv_dtype,
                        .device = cur.device};
    char err[512];
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) fprintf(stderr, "%s\n", err);
    assert_non_null(e);
    size_t n_prompts = json_array_size(prompts);
    for (size_t pi = 0; pi < n_prompts; pi++) {
        json_t *ids = json_object_get(json_array_get(prompts, pi), "prompt_ids");
        int n = (int)json_array_size(ids);
        int32_t tok[256];
        for (int i = 0; i < n; i++) tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
        engine_request r = {.prompt = tok, .n_prompt = n, .max_tokens = 32};
        r.sampling = sampling_params_default();
        r.sampling.temperature = 0;
        r.sampling.top_logprobs = ENGINE_MAX_TOP_LOGPROBS;
        assert_int_equal(engine_submit(e, pi, &r, err, sizeof err), 0);
    }
    int step_of[16] = {0}, diverged[16] = {0};
    engine_event ev[16];
    while (engine_pending(e)) {
        int n = engine_step(e, ev, 16);
        assert_true(n >= 0);
        for (int i = 0; i < n; i++) {
            if (ev[i].token < 0) continue;
            size_t pi = ev[i].seq_id;
            json_t *steps = json_object_get(json_object_get(json_array_get(prompts, pi), "greedy"), "steps");
            json_t *ref = json_array_get(steps, (size_t)step_of[pi]++);
            if (diverged[pi] || !ref) continue;
            json_t *top5 = json_object_get(ref, "top5");
            size_t k;
            json_t *entry;
            double step_max = 0;
            int missing = 0;
            json_array_foreach(top5, k, entry) {
                int id = (int)json_integer_value(json_array_get(entry, 0));
                int found = 0;
                for (int j = 0; j < ev[i].n_top; j++)
                    if (ev[i].top_ids[j] == id) {
                        double d = fabs(ev[i].top_logprobs[j] - json_number_value(json_array_get(entry, 1)));
                        step_max = d > step_max ? d : step_max;
                        found = 1;
                    }
                missing += !found;
            }
            if (flip_tol > 0 && (missing || step_max > flip_tol)) {
                st->routing_flips++;
                diverged[pi] = 1;
                continue;
            }
            assert_int_equal(missing, 0);
            st->lp_max = step_max > st->lp_max ? step_max : st->lp_max;
            st->steps_compared++;
            int want = (int)json_integer_value(json_object_get(ref, "token"));
            if (ev[i].token == want) {
                st->tokens_equal++;
            } else {
                /* only a near-tie may flip */
                double gap = json_number_value(json_object_get(ref, "gap"));
                if (gap >= cur.gap_min)
                    fprintf(stderr, "prompt %zu step %d: token %d, reference %d (gap %g)\n", pi,
                            step_of[pi] - 1, ev[i].token, want, gap);
                assert_true(gap < cur.gap_min);
                diverged[pi] = 1;
            }
        }
    }
    engine_close(e);
}

/* Whether the level in use rounds activations to int16 for some 4-bit matrices: AVX-512 and
 * NEON dotprod always may; AVX2 for the 16-row interleaved layout (unless EXO_Q4_LAYOUT=mlx). */
static int level_quantizes_activations(void) {
    const char *level = cpu_simd_level(), *layout = getenv("EXO_Q4_LAYOUT");
    if (!strcmp(level, "avx512") || !strcmp(level, "neon-dotprod")) return 1;
    return !strcmp(level, "avx2") && !(layout && !strcmp(layout, "mlx"));
}

static void check_fixture(const char *file) {
    char path[512], dir[512];
    snprintf(path, sizeof path, "tests/fixtures/reference/%s", file);
    json_error_t jerr;
    json_t *fx = json_load_file(path, 0, &jerr);
    assert_non_null(fx);
    const char *name = json_string_value(json_object_get(fx, "model"));
    const char *type = json_string_value(json_object_get(json_object_get(fx, "config"), "model_type"));
    int hybrid = type && (!strcmp(type, "qwen3_next") || !strncmp(type, "qwen3_5", 7));
    snprintf(dir, sizeof dir, ".cache/reference-models/%s", name);
    assert_int_equal(paths_mkdir_p(".cache/reference-models"), 0);
    ensure_model(fx, dir);
    json_t *prompts = json_object_get(fx, "prompts");
    stats st = {0}, st16 = {0};
    teacher_forced(dir, prompts, &st);
    int int16_kernels = json_array_size(json_object_get(fx, "mkmodel_args")) > 0 &&
                        (strstr(name, "4bit") || strstr(name, "mxfp4")) && level_quantizes_activations() &&
                        !strcmp(cur.device, "cpu");
    int amx_bf16 = int16_kernels && !strcmp(cpu_simd_level(), "avx512") && cpu_amx_available() &&
                   cpu_amx_products() == 2;
    double int16_tol = hybrid ? HYBRID_INT16_TOL : amx_bf16 ? AMX_BF16_TOL : QUANT_INT16_TOL;
    double f16_tol = int16_kernels && (hybrid || amx_bf16) ? int16_tol : F16_KV_TOL;
    /* MoE: a step past the bar may be a routing switch (see greedy), not an error */
    int moe = strstr(name, "moe") || strstr(name, "gpt-oss");
    greedy(dir, prompts, "f32", moe && (int16_kernels || cur.tol > 0) ? int16_tol : 0, &st);
    greedy(dir, prompts, NULL, moe ? f16_tol : 0, &st16); /* the default: f16 KV cache */
    double tol = cur.tol > 0 ? cur.tol : int16_kernels ? int16_tol : TF_TOL;
    printf("%-24s [%s] logits %.1e | f32 KV: %d/%d tokens, logprobs %.1e | f16 KV: %d/%d, %.1e",
           name, !strcmp(cur.device, "cpu") ? cpu_simd_level() : cur.label, st.tf_max,
           st.tokens_equal, st.steps_compared, st.lp_max, st16.tokens_equal, st16.steps_compared,
           st16.lp_max);
    if (st.routing_flips || st16.routing_flips)
        printf(" | routing flips %d (f32 KV), %d (f16 KV)", st.routing_flips, st16.routing_flips);
    printf("\n");
    assert_true(st.tf_max <= tol);
    assert_true(st.lp_max <= (cur.tol > 0 ? cur.tol : int16_kernels ? int16_tol : LOGPROB_TOL));
    assert_true(st16.lp_max <= (cur.tol > 0 ? cur.tol : f16_tol));
    assert_true(st.steps_compared >= 5 * 8 && st16.steps_compared >= 5 * 8);
    json_decref(fx);
}

REFERENCE_FIXTURES(REFERENCE_FIXTURE_TEST)

int main(void) {
    if (sodium_init() < 0) return 1;
    /* EXO_TEST_FILTER: a glob over the test names (the aarch64 pass under qemu runs a subset:
     * emulation is ~20x slower, and the kernels themselves are covered by test_cpu_matmul). */
    const char *filter = getenv("EXO_TEST_FILTER");
    if (filter) cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        REFERENCE_FIXTURES(REFERENCE_FIXTURE_ENTRY)
    };
    const char *only = getenv("EXO_TEST_DEVICE");
    int failed = 0, gpu_only = only && !strcmp(only, "cuda");
    if (!gpu_only) failed = cmocka_run_group_tests_name("cpu", tests, NULL, NULL);
    if (!getenv("EXO_CPU_SIMD")) { /* the GPU passes, once (not again in the exact-CPU child) */
        if (compute_gpu_count() == 0) {
            printf("GPU passes skipped: %s\n", compute_cuda_built()
                                                    ? "no CUDA GPU on this machine"
                                                    : "this build has no CUDA (make CUDA=1)");
        } else {
            setenv("EXO_CUDA_MATMUL", "exact", 1);
            cur = (pass){"cuda", "cuda exact", GAP_MIN, 0};
            failed += cmocka_run_group_tests_name("cuda exact", tests, NULL, NULL);
            unsetenv("EXO_CUDA_MATMUL");
            cur = (pass){"cuda", "cuda", GEMM_GAP_MIN, GEMM_TOL};
            failed += cmocka_run_group_tests_name("cuda", tests, NULL, NULL);
            cur = (pass){"cpu", "cpu", GAP_MIN, 0};
        }
    }
    if (gpu_only || strcmp(cpu_simd_level(), "avx512") || getenv("EXO_CPU_SIMD")) return failed;
    printf("again with the exact kernels (EXO_CPU_SIMD=avx2 EXO_Q4_LAYOUT=mlx):\n");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("EXO_CPU_SIMD", "avx2", 1);
        setenv("EXO_Q4_LAYOUT", "mlx", 1);
        execl("/proc/self/exe", "test_engine_reference", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) failed++;
    return failed;
}
