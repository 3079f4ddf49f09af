/* The sampler on hand-made logits: greedy and its logprobs, top_k/top_p/min_p truncation,
 * penalties, banned ids, the sampled frequencies of a known distribution, seed determinism. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "infer/sampler.h"

#include <math.h>
#include <string.h>

#define V 6

static sampler_scratch scratch;

static int32_t sample(const float *logits_in, const sampling_params *p, const int32_t *hist,
                      int n_hist, int n_prompt, sampler_rng *rng, sampler_result *r) {
    float l[V];
    memcpy(l, logits_in, sizeof l);
    sampler_input in = {.params = p, .history = hist, .n_history = n_hist, .n_prompt = n_prompt};
    sampler_sample(&scratch, l, &in, rng, r);
    return r->token;
}

static sampling_params params(float temp) {
    sampling_params p = sampling_params_default();
    p.temperature = temp;
    p.min_p = 0;
    return p;
}

static void test_greedy_logprobs(void **s) {
    (void)s;
    float l[V] = {1, 3, 2, -1, 0, 2.5f};
    sampling_params p = params(0);
    p.top_logprobs = 3;
    sampler_rng rng;
    sampler_rng_seed(&rng, 1);
    sampler_result r;
    assert_int_equal(sample(l, &p, NULL, 0, 0, &rng, &r), 1);
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(l[i]);
    assert_float_equal(r.logprob, 3 - log(z), 1e-6);
    assert_int_equal(r.n_top, 3);
    assert_int_equal(r.top_ids[0], 1);
    assert_int_equal(r.top_ids[1], 5);
    assert_int_equal(r.top_ids[2], 2);
    assert_float_equal(r.top_logprobs[1], 2.5 - log(z), 1e-6);
}

static void test_truncation(void **s) {
    (void)s;
    float l[V] = {1, 3, 2, -1, 0, 2.5f};
    sampler_rng rng;
    sampler_rng_seed(&rng, 5);
    sampler_result r;
    sampling_params p = params(1.0f);
    p.top_k = 1; /* only the best survives */
    for (int i = 0; i < 50; i++) assert_int_equal(sample(l, &p, NULL, 0, 0, &rng, &r), 1);
    p.top_k = 0;
    p.top_p = 0.5f; /* p(1) = 0.44, p(5) = 0.27: nucleus {1, 5} */
    int seen[V] = {0};
    for (int i = 0; i < 400; i++) seen[sample(l, &p, NULL, 0, 0, &rng, &r)]++;
    assert_true(seen[1] > 0 && seen[5] > 0);
    assert_int_equal(seen[1] + seen[5], 400);
    p.top_p = 1;
    p.min_p = 0.5f; /* keep p >= 0.5 * p(1): ids 1 (1.0), 5 (0.61); id 2 (0.37) is out */
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 400; i++) seen[sample(l, &p, NULL, 0, 0, &rng, &r)]++;
    assert_int_equal(seen[1] + seen[5], 400);
}

static void test_frequencies(void **s) {
    (void)s;
    float l[V] = {logf(0.5f), logf(0.3f), logf(0.2f), -INFINITY, -INFINITY, -INFINITY};
    sampling_params p = params(1.0f);
    sampler_rng rng;
    sampler_rng_seed(&rng, 11);
    sampler_result r;
    int seen[V] = {0}, n = 20000;
    for (int i = 0; i < n; i++) seen[sample(l, &p, NULL, 0, 0, &rng, &r)]++;
    /* 5 standard deviations of a binomial at n = 20000 is under 0.018 */
    assert_float_equal(seen[0] / (double)n, 0.5, 0.018);
    assert_float_equal(seen[1] / (double)n, 0.3, 0.018);
    assert_float_equal(seen[2] / (double)n, 0.2, 0.018);
    assert_int_equal(seen[3] + seen[4] + seen[5], 0);
    /* temperature 0.5 squares the odds: 0.25:0.09:0.04 */
    p.temperature = 0.5f;
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < n; i++) seen[sample(l, &p, NULL, 0, 0, &rng, &r)]++;
    assert_float_equal(seen[0] / (double)n, 0.25 / 0.38, 0.018);
}

static void test_penalties_and_ban(void **s) {
    (void)s;
    float l[V] = {1, 3, 2, -1, 0, 2.5f};
    sampler_rng rng;
    sampler_rng_seed(&rng, 1);
    sampler_result r;
    sampling_params p = params(0);
    int32_t hist[] = {1, 4, 1}; /* prompt {1, 4}, output {1} */
    p.repetition_penalty = 2.0f; /* 3 -> 1.5: id 5 (2.5) wins */
    assert_int_equal(sample(l, &p, hist, 3, 2, &rng, &r), 5);
    p.repetition_penalty = 1;
    p.presence_penalty = 0.6f; /* output token 1: 3 - 0.6 = 2.4 < 2.5 */
    assert_int_equal(sample(l, &p, hist, 3, 2, &rng, &r), 5);
    p.presence_penalty = 0.4f; /* 2.6 > 2.5 */
    assert_int_equal(sample(l, &p, hist, 3, 2, &rng, &r), 1);
    p.presence_penalty = 0;
    p.frequency_penalty = 0.3f; /* counts only output tokens: once -> 2.7 */
    assert_int_equal(sample(l, &p, hist, 3, 2, &rng, &r), 1);
    int32_t hist2[] = {1, 4, 1, 1};
    assert_int_equal(sample(l, &p, hist2, 4, 2, &rng, &r), 5); /* twice -> 2.4 */
    p.frequency_penalty = 0;
    float l2[V];
    memcpy(l2, l, sizeof l2);
    int32_t ban[] = {1, 5};
    sampler_input in = {.params = &p, .banned = ban, .n_banned = 2};
    sampler_sample(&scratch, l2, &in, &rng, &r);
    assert_int_equal(r.token, 2);
}

static void test_seeded(void **s) {
    (void)s;
    float l[V] = {0.1f, 0.2f, 0.3f, 0.2f, 0.1f, 0.0f};
    sampling_params p = params(1.0f);
    sampler_rng a, b, c;
    sampler_rng_seed(&a, 99);
    sampler_rng_seed(&b, 99);
    sampler_rng_seed(&c, 100);
    sampler_result r;
    int same = 1, diff = 0;
    for (int i = 0; i < 64; i++) {
        int32_t x = sample(l, &p, NULL, 0, 0, &a, &r), y = sample(l, &p, NULL, 0, 0, &b, &r);
        same &= x == y;
        diff += x != sample(l, &p, NULL, 0, 0, &c, &r);
    }
    assert_true(same);
    assert_true(diff > 0);
    char err[128];
    p.top_p = 0;
    assert_int_equal(sampler_params_check(&p, err, sizeof err), -1);
    assert_non_null(strstr(err, "top_p"));
}

static int setup(void **s) {
    (void)s;
    return sampler_scratch_init(&scratch, V);
}

static int teardown(void **s) {
    (void)s;
    sampler_scratch_free(&scratch);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_logprobs), cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_frequencies),     cmocka_unit_test(test_penalties_and_ban),
        cmocka_unit_test(test_seeded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
