/* speculative — drafting and verification inside the engine's continuous batching.
 *
 * A decoding sequence normally feeds its one pending token to the step. With a drafter, the step
 * also feeds up to k drafted tokens after it (stored past the end of its token array) and asks
 * for the logits of all 1 + k positions; the forward pass is the same one every other sequence
 * is in (a draft is a short prefill chunk). Verification walks the rows in order: row i scores
 * draft i (sampler_sample_draft: greedy keeps exact matches, sampling applies the rejection rule
 * with residual resampling), the first rejection yields the model's own token there and ends the
 * walk, and when every draft is kept the last row adds one more token. So a step emits between 1
 * and k + 1 tokens, always exactly the tokens (greedy) or the distribution (sampling) of plain
 * decoding.
 *
 * Rollback: only the K/V of accepted positions count as computed (n_computed); the rejected
 * drafts' K/V stay in their slots, unread, until the next step overwrites them, and blocks that
 * held nothing but rejected drafts go back to the pool. The prefix cache registers full blocks of
 * computed tokens only, so a rejected draft never reaches it.
 *
 * Adaptive k, per sequence: a request starts with one drafted token; all drafts kept -> ask for
 * one more next time (up to the request's maximum); some kept -> one more than were kept; none
 * kept -> half as many. At 0 the sequence
 * decodes plainly and probes with a single draft after a cooldown that doubles after every
 * failed probe, so a drafter that is never right costs a few verification rows per hundred steps.
 *
 * Several ranks: every rank plans the same drafts (the drafter runs on each, over the same tokens:
 * only drafters that are pure functions of the tokens, n-gram and a caller's oracle, are used
 * there), the sampling rank verifies, and the rows past a member's last kept token go out with
 * token -1, so every rank applies the same number of tokens (spec_emitted). An overlapped
 * pipeline's sequence sits out the steps while its verified step is in flight, as without drafts.
 *
 * Refuses: the draft-model drafter on several ranks (each rank would run the whole draft model,
 * and ranks with other thread counts or devices could disagree on its drafts), hybrid models (no
 * recurrent-state rollback): switched off with a warning. */
#include "infer/engine_internal.h"

#include "base/error.h"
#include "base/log.h"

#include <stdlib.h>
#include <string.h>

#define SPEC_FIRST_BACKOFF 4  /* steps without drafts after k reaches 0 */
#define SPEC_LAST_BACKOFF 64  /* the longest wait between probes */
#define SPEC_ROW_SEQUENCES 16 /* verification rows are reserved for this many sequences' drafts */

static drafter *drafter_from_name(engine *e, const engine_options *o, char *err, size_t errlen) {
    const char *m = o->speculative;
    if (!strcmp(m, "ngram")) return drafter_ngram_create(0, 0);
    if (!strncmp(m, "draft:", 6) && m[6]) {
        drafter_model_options mo = {.model_dir = m + 6, .device = o->device,
                                    .n_threads = o->n_threads,
                                    .max_sequences = e->max_sequences,
                                    .context_length = e->info.context_length,
                                    .vocab_size = e->cfg.vocab_size};
        return drafter_model_create(&mo, err, errlen);
    }
    error_set(err, errlen, "speculative method '%.64s' is not one of off, ngram, draft:DIR", m);
    return NULL;
}

int spec_open(engine *e, const engine_options *o, int *extra_rows, char *err, size_t errlen) {
    *extra_rows = 0;
    const char *m = o->speculative;
    if (!o->drafter && (!m || !*m || !strcmp(m, "off"))) return 0;
    if (o->spec_tokens < 0 || o->spec_tokens > ENGINE_SPEC_MAX_TOKENS) {
        error_set(err, errlen, "speculative tokens must be in 1..%d (got %d)",
                  ENGINE_SPEC_MAX_TOKENS, o->spec_tokens);
        return -1;
    }
    if (o->dist && !o->drafter && strcmp(m, "ngram")) {
        log_warn("engine: the %s drafter runs in one process only; speculative decoding is off "
                 "for this instance (ngram works across ranks)", m);
        return 0;
    }
    if (e->hybrid) { /* rejected drafts would stay in the recurrent state: no rollback yet */
        log_warn("engine: speculative decoding cannot roll back a hybrid model's recurrent "
                 "state; off for this instance");
        return 0;
    }
    e->drafter = o->drafter ? o->drafter : drafter_from_name(e, o, err, errlen);
    if (!e->drafter) {
        if (!err[0]) error_set(err, errlen, "out of memory making the drafter");
        return -1;
    }
    e->drafter_owned = !o->drafter;
    e->spec_tokens = o->spec_tokens > 0 ? o->spec_tokens : ENGINE_SPEC_DEFAULT_TOKENS;
    e->spec_queries = calloc((size_t)e->max_sequences, sizeof *e->spec_queries);
    e->spec_asking = calloc((size_t)e->max_sequences, sizeof *e->spec_asking);
    if (!e->spec_queries || !e->spec_asking) {
        error_set(err, errlen, "out of memory for speculative decoding");
        return -1;
    }
    int seqs = e->max_sequences < SPEC_ROW_SEQUENCES ? e->max_sequences : SPEC_ROW_SEQUENCES;
    *extra_rows = e->spec_tokens * seqs;
    log_info("engine: speculative decoding with the %s drafter, up to %d tokens per step",
             e->drafter->name, e->spec_tokens);
    return 0;
}

void spec_close(engine *e) {
    if (e->drafter && e->drafter_owned) e->drafter->destroy(e->drafter);
    e->drafter = NULL;
    free(e->spec_queries);
    free(e->spec_asking);
    e->spec_queries = NULL;
    e->spec_asking = NULL;
}

void spec_init_sequence(const engine *e, sequence *s, const engine_request *r) {
    int most = e->drafter ? e->spec_tokens : 0;
    /* a constrained request (grammar) samples each token through its mask: drafts would bypass it */
    if (r->spec_tokens < 0 || r->constraint.ctx || r->constraint_spec) most = 0;
    else if (r->spec_tokens > 0 && r->spec_tokens < most) most = r->spec_tokens;
    s->spec_max = most;
    s->spec_k = most < 1 ? most : 1; /* one draft first: more are earned by acceptance */
    s->spec_backoff = SPEC_FIRST_BACKOFF;
}

/* How many tokens to draft for s now (0: none this step). */
static int wanted_drafts(sequence *s) {
    if (s->spec_max == 0) return 0;
    if (s->spec_k > 0) return s->spec_k;
    if (s->spec_cooldown > 0) {
        s->spec_cooldown--;
        return 0;
    }
    return 1; /* a probe */
}

void spec_plan_drafts(engine *e, int n_members, int event_room) {
    if (!e->drafter) return;
    int tokens_left = e->max_batch_tokens, rows_left = e->max_logit_rows;
    int events_left = event_room;
    for (int m = 0; m < n_members; m++) {
        const sequence *s = e->b_members[m];
        tokens_left -= s->chunk;
        if (s->n_computed + s->chunk == s->n_tokens) rows_left--, events_left--;
    }
    int n_queries = 0;
    sequence **asking = e->spec_asking;
    for (int m = 0; m < n_members; m++) {
        sequence *s = e->b_members[m];
        if (s->chunk != 1 || s->n_tokens - s->n_computed != 1) continue; /* not decoding */
        int want = wanted_drafts(s), room = s->cap - s->n_tokens - 1;
        if (room < want) want = room;
        if (tokens_left < want) want = tokens_left;
        if (rows_left < want) want = rows_left;
        if (events_left < want) want = events_left;
        if (want <= 0) continue;
        tokens_left -= want, rows_left -= want, events_left -= want;
        e->spec_queries[n_queries] = (drafter_query){.serial = s->serial, .tokens = s->tokens,
                                                     .n_tokens = s->n_tokens, .max_draft = want,
                                                     .draft = s->tokens + s->n_tokens};
        asking[n_queries++] = s;
    }
    if (!n_queries) return;
    char err[256] = "";
    if (e->drafter->propose(e->drafter, e->spec_queries, n_queries, err, sizeof err) != 0) {
        log_warn("engine: the %s drafter failed (%s); decoding this step without drafts",
                 e->drafter->name, err);
        return;
    }
    for (int i = 0; i < n_queries; i++) {
        sequence *s = asking[i];
        const drafter_query *q = &e->spec_queries[i];
        int n = 0, max = q->n_draft < q->max_draft ? q->n_draft : q->max_draft;
        while (n < max && q->draft[n] >= 0 && q->draft[n] < e->cfg.vocab_size) n++;
        if (n > 0 && engine_ensure_blocks(e, s, s->n_tokens + n) != 0) {
            int have = s->n_blocks * e->block_size - s->n_tokens; /* drafts never preempt */
            n = have < n ? (have > 0 ? have : 0) : n;
        }
        s->n_draft = n;
        s->chunk = 1 + n;
    }
}

void spec_verify_member(engine *e, sequence *s) {
    size_t vocab = (size_t)e->cfg.vocab_size;
    for (int i = 0; i <= s->n_draft; i++) {
        sampler_input in = engine_sampler_input(s, s->n_tokens + i);
        float *logits = e->logits + (size_t)(s->logit_index + i) * vocab;
        sampler_result *out = &e->samples[s->logit_index + i];
        if (i == s->n_draft) { /* every draft kept: the last row gives one more token */
            sampler_sample(&e->sampler, logits, &in, &s->rng, out);
        } else if (!sampler_sample_draft(&e->sampler, logits, &in, s->tokens[s->n_tokens + i],
                                         &s->rng, out)) {
            /* rejected: out holds the model's own token; the later rows are discarded */
            for (int j = i + 1; j <= s->n_draft; j++) e->samples[s->logit_index + j].token = -1;
            return;
        }
    }
}

int spec_emitted(const sequence *s, const sampler_result *rows) {
    int n = 1;
    while (n <= s->n_draft && rows[n].token >= 0) n++;
    return n;
}

/* Gives back the blocks past the one holding s's last token: only rejected drafts used them. */
static void release_draft_blocks(engine *e, sequence *s) {
    int keep = (s->n_tokens + e->block_size - 1) / e->block_size;
    while (s->n_blocks > keep) kv_cache_release_block(e->kv, s->blocks[--s->n_blocks]);
}

void spec_after_member(engine *e, sequence *s, int n_accepted) {
    int used = s->n_draft;
    e->spec_verifies++;
    e->spec_drafted += (uint64_t)used;
    e->spec_accepted += (uint64_t)n_accepted;
    s->spec_drafted += (uint64_t)used;
    s->spec_accepted += (uint64_t)n_accepted;
    if (n_accepted == used) {
        int grown = used + 1 > s->spec_k ? used + 1 : s->spec_k;
        s->spec_k = grown < s->spec_max ? grown : s->spec_max;
        s->spec_backoff = SPEC_FIRST_BACKOFF;
    } else if (n_accepted > 0) {
        s->spec_k = n_accepted + 1;
        s->spec_backoff = SPEC_FIRST_BACKOFF;
    } else {
        s->spec_k = (used < s->spec_k ? used : s->spec_k) / 2;
        if (s->spec_k == 0) {
            s->spec_cooldown = s->spec_backoff;
            s->spec_backoff = s->spec_backoff * 2 < SPEC_LAST_BACKOFF ? s->spec_backoff * 2
                                                                      : SPEC_LAST_BACKOFF;
        }
    }
    s->n_draft = 0;
    release_draft_blocks(e, s);
}

void spec_forget_sequence(engine *e, const sequence *s) {
    if (!e->drafter) return;
    if (e->drafter->release) e->drafter->release(e->drafter, s->serial);
    if (s->spec_drafted)
        log_info("engine: request %llu: %s drafter, %llu of %llu drafted tokens accepted (%.0f%%)",
                 (unsigned long long)s->id, e->drafter->name,
                 (unsigned long long)s->spec_accepted, (unsigned long long)s->spec_drafted,
                 100.0 * (double)s->spec_accepted / (double)s->spec_drafted);
}
