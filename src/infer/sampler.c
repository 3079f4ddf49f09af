/* Token sampling. See sampler.h for the order of operations. */
#include "infer/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sampling_params sampling_params_default(void) {
    return (sampling_params){.temperature = 0.7f, .top_p = 1.0f, .top_k = 0, .min_p = 0.05f,
                             .repetition_penalty = 1.0f, .seed = 42};
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sampler_rng_seed(sampler_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

double sampler_rng_uniform(sampler_rng *r) { /* xoshiro256** */
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(result >> 11) * (1.0 / 9007199254740992.0);
}

int sampler_params_check(const sampling_params *p, char *err, size_t errlen) {
    const char *bad = NULL;
    if (!(p->temperature >= 0 && p->temperature <= 100)) bad = "temperature must be in [0, 100]";
    else if (!(p->top_p > 0 && p->top_p <= 1)) bad = "top_p must be in (0, 1]";
    else if (p->top_k < 0) bad = "top_k must be >= 0";
    else if (!(p->min_p >= 0 && p->min_p <= 1)) bad = "min_p must be in [0, 1]";
    else if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 10))
        bad = "repetition_penalty must be in (0, 10]";
    else if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        bad = "presence_penalty must be in [-2, 2]";
    else if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        bad = "frequency_penalty must be in [-2, 2]";
    else if (p->top_logprobs < 0 || p->top_logprobs > ENGINE_MAX_TOP_LOGPROBS)
        bad = "top_logprobs must be in [0, 20]";
    else if (p->repetition_window < 0) bad = "repetition_window must be >= 0";
    if (bad) snprintf(err, errlen, "%s", bad);
    return bad ? -1 : 0;
}

int sampler_scratch_init(sampler_scratch *s, int vocab) {
    s->vocab = vocab;
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    s->candidates = malloc((size_t)vocab * sizeof *s->candidates);
    s->counts = calloc((size_t)vocab, sizeof *s->counts);
    if (s->probs && s->candidates && s->counts) return 0;
    sampler_scratch_free(s);
    return -1;
}

void sampler_scratch_free(sampler_scratch *s) {
    free(s->probs);
    free(s->candidates);
    free(s->counts);
    memset(s, 0, sizeof *s);
}

static void apply_penalties(sampler_scratch *s, float *logits, const sampler_input *in) {
    const sampling_params *p = in->params;
    int vocab = s->vocab;
    if (p->repetition_penalty != 1.0f) {
        int from = 0;
        if (p->repetition_window > 0 && in->n_history > p->repetition_window)
            from = in->n_history - p->repetition_window;
        for (int i = from; i < in->n_history; i++) { /* each distinct id once */
            int32_t id = in->history[i];
            if (id < 0 || id >= vocab || s->counts[id] < 0) continue;
            float *l = &logits[id];
            *l = *l > 0 ? *l / p->repetition_penalty : *l * p->repetition_penalty;
            s->counts[id] = -1;
        }
        for (int i = from; i < in->n_history; i++)
            if (in->history[i] >= 0 && in->history[i] < vocab) s->counts[in->history[i]] = 0;
    }
    if (p->presence_penalty != 0 || p->frequency_penalty != 0) {
        for (int i = in->n_prompt; i < in->n_history; i++)
            if (in->history[i] >= 0 && in->history[i] < vocab) s->counts[in->history[i]]++;
        for (int i = in->n_prompt; i < in->n_history; i++) {
            int32_t id = in->history[i];
            if (id < 0 || id >= vocab || s->counts[id] == 0) continue;
            logits[id] -= p->presence_penalty + p->frequency_penalty * (float)s->counts[id];
            s->counts[id] = 0;
        }
    }
    for (int i = 0; i < in->n_banned; i++)
        if (in->banned[i] >= 0 && in->banned[i] < vocab) logits[in->banned[i]] = -INFINITY;
}

static int cmp_prob_desc(const void *a, const void *b, void *ctx) {
    const float *p = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (p[x] != p[y]) return p[x] > p[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Fills out->top_* with the n best ids by logprob (descending, lower id first on ties). */
static void top_logprobs(const float *logp, int vocab, int n, sampler_result *out) {
    out->n_top = 0;
    for (int v = 0; v < vocab; v++) {
        float lp = logp[v];
        int k = out->n_top;
        if (k == n && !(lp > out->top_logprobs[n - 1])) continue;
        if (k < n) out->n_top++;
        else k = n - 1;
        while (k > 0 && lp > out->top_logprobs[k - 1]) {
            out->top_ids[k] = out->top_ids[k - 1];
            out->top_logprobs[k] = out->top_logprobs[k - 1];
            k--;
        }
        out->top_ids[k] = v;
        out->top_logprobs[k] = lp;
    }
}

/* The distribution a token is drawn from: penalties applied to logits, log_softmax of
 * logits / temperature in s->probs (log-probs, what logprobs report), and for sampling the
 * candidates that survive min_p, top_k and top_p in s->candidates (most likely first), with their
 * unnormalised probabilities written over their logits. */
typedef struct sampling_dist {
    int greedy;      /* temperature 0: the argmax, no candidates */
    int32_t argmax;
    int n;           /* candidates */
    double total;    /* sum of the candidates' probabilities */
    const float *logp;
} sampling_dist;

static void build_dist(sampler_scratch *s, float *logits, const sampler_input *in,
                       sampling_dist *d, sampler_result *out) {
    const sampling_params *p = in->params;
    int vocab = s->vocab;
    apply_penalties(s, logits, in);
    float temp = p->temperature > 0 ? p->temperature : 1.0f;
    float m = -INFINITY;
    int argmax = 0;
    for (int v = 0; v < vocab; v++) {
        if (logits[v] > m) {
            m = logits[v];
            argmax = v;
        }
    }
    memset(out, 0, sizeof *out);
    *d = (sampling_dist){.greedy = p->temperature <= 0, .argmax = argmax};
    if (d->greedy && !p->logprobs && !p->top_logprobs) return; /* nothing needs the distribution */
    /* log_softmax of logits / temp, in s->probs (as log-probs) */
    float inv_t = 1.0f / temp;
    double sum = 0;
    for (int v = 0; v < vocab; v++) sum += expf((logits[v] - m) * inv_t);
    float lse = (float)log(sum);
    float *logp = s->probs;
    for (int v = 0; v < vocab; v++) logp[v] = (logits[v] - m) * inv_t - lse;
    d->logp = logp;
    if (p->top_logprobs > 0) top_logprobs(logp, vocab, p->top_logprobs, out);
    if (d->greedy) return;
    /* min_p in log space: p >= min_p * p_max  <=>  logp >= logp_max + log(min_p) */
    float min_logp = p->min_p > 0 ? logp[argmax] + logf(p->min_p) : -INFINITY;
    int n = 0;
    for (int v = 0; v < vocab; v++)
        if (logp[v] > -INFINITY && logp[v] >= min_logp) s->candidates[n++] = v;
    for (int i = 0; i < n; i++) logits[s->candidates[i]] = expf(logp[s->candidates[i]]);
    qsort_r(s->candidates, (size_t)n, sizeof *s->candidates, cmp_prob_desc, logits);
    if (p->top_k > 0 && n > p->top_k) n = p->top_k;
    if (p->top_p < 1) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += logits[s->candidates[i]];
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    d->n = n;
    for (int i = 0; i < n; i++) d->total += logits[s->candidates[i]];
}

/* A candidate drawn in proportion to its probability, leaving `skip` out (-1: none); u in [0,1). */
static int32_t draw(const sampler_scratch *s, const float *probs, const sampling_dist *d,
                    int32_t skip, double skip_prob, double u) {
    double total = d->total - skip_prob, x = u * total, acc = 0;
    int32_t token = -1;
    for (int i = 0; i < d->n; i++) {
        int32_t c = s->candidates[i];
        if (c == skip) continue;
        token = c; /* the last one standing when rounding leaves x at the very top */
        acc += probs[c];
        if (x < acc) break;
    }
    return token >= 0 ? token : s->candidates[0];
}

static void finish_result(const sampling_dist *d, int32_t token, sampler_result *out) {
    out->token = token;
    out->logprob = d->logp ? d->logp[token] : 0;
}

void sampler_sample(sampler_scratch *s, float *logits, const sampler_input *in, sampler_rng *rng,
                    sampler_result *out) {
    sampling_dist d;
    build_dist(s, logits, in, &d, out);
    int32_t token = d.greedy ? d.argmax : draw(s, logits, &d, -1, 0, sampler_rng_uniform(rng));
    finish_result(&d, token, out);
}

int sampler_sample_draft(sampler_scratch *s, float *logits, const sampler_input *in,
                         int32_t draft, sampler_rng *rng, sampler_result *out) {
    sampling_dist d;
    build_dist(s, logits, in, &d, out);
    if (d.greedy) {
        finish_result(&d, d.argmax, out);
        return d.argmax == draft;
    }
    /* the draft proposed `draft` with probability 1 (q is a point mass): accept it with
     * probability min(1, p/q) = p(draft); else draw from the residual max(0, p - q), which is p
     * without `draft`. Together: exactly p. */
    double p_draft = 0;
    for (int i = 0; i < d.n; i++)
        if (s->candidates[i] == draft) p_draft = logits[draft];
    int accepted = p_draft > 0 && sampler_rng_uniform(rng) * d.total < p_draft;
    if (accepted || p_draft >= d.total) {
        finish_result(&d, draft, out);
        return 1;
    }
    finish_result(&d, draw(s, logits, &d, draft, p_draft, sampler_rng_uniform(rng)), out);
    return 0;
}
