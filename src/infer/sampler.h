/* sampler — turns one sequence's logits into the next token: penalties, temperature, top_k,
 * top_p, min_p, a seeded RNG (same seed, same request -> same tokens), and the logprobs of the
 * sampled token and its top alternatives.
 *
 * Order, as vLLM: repetition penalty (over prompt + output, optionally the last N tokens),
 * presence/frequency penalties (over output tokens), banned ids, temperature; then top_k, top_p,
 * min_p truncate the candidates. Reported logprobs are log_softmax of the penalised,
 * temperature-scaled logits (temperature 0 counts as 1), before truncation, so alternatives stay
 * finite. Refuses: nothing; out-of-range parameters are clamped by sampler_params_check. */
#ifndef EXO_INFER_SAMPLER_H
#define EXO_INFER_SAMPLER_H

#include "infer/engine.h"

#include <stdint.h>

typedef struct sampler_rng {
    uint64_t s[4];
} sampler_rng;

void sampler_rng_seed(sampler_rng *r, uint64_t seed);
/* Uniform in [0, 1). */
double sampler_rng_uniform(sampler_rng *r);

/* Returns 0 or -1 with err for parameters no API should pass (negative temperature, ...). */
int sampler_params_check(const sampling_params *p, char *err, size_t errlen);

/* Scratch reused across calls (sized for the vocabulary). */
typedef struct sampler_scratch {
    int vocab;
    float *probs;        /* [vocab] */
    int32_t *candidates; /* [vocab] */
    int32_t *counts;     /* [vocab] output-token counts, zero between calls */
} sampler_scratch;

int sampler_scratch_init(sampler_scratch *s, int vocab);
void sampler_scratch_free(sampler_scratch *s);

typedef struct sampler_input {
    const sampling_params *params;
    const int32_t *history; /* prompt + generated so far */
    int n_history;
    int n_prompt;           /* history[n_prompt..] are generated tokens */
    const int32_t *banned;  /* ids never to sample (ban_eos), may be NULL */
    int n_banned;
} sampler_input;

typedef struct sampler_result {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
    float top_logprobs[ENGINE_MAX_TOP_LOGPROBS];
} sampler_result;

/* Samples from logits[vocab] (modified in place). */
void sampler_sample(sampler_scratch *s, float *logits, const sampler_input *in, sampler_rng *rng,
                    sampler_result *out);
/* Speculative verification of one drafted token (a draft proposed with certainty): greedy keeps
 * it when it is the argmax; sampling keeps it with probability p(draft) under the distribution
 * sampler_sample draws from and otherwise draws from that distribution without it, so the
 * token in *out follows exactly sampler_sample's distribution either way. Returns 1 when *out
 * is the draft (accepted), 0 when it is the model's own choice (the draft was rejected). */
int sampler_sample_draft(sampler_scratch *s, float *logits, const sampler_input *in,
                         int32_t draft, sampler_rng *rng, sampler_result *out);

#endif
