/* Draft-model drafter (drafter.h): a second, smaller model with the same tokenizer drafts
 * greedily. It is an engine of its own (weights, backend, paged KV cache: engine_open with no
 * speculation), driven here directly rather than through engine_step: per target sequence it
 * keeps a sequence record whose tokens are exactly those whose K/V its cache holds.
 *
 * A call first rolls each record back to the longest common prefix of what it computed and the
 * target's tokens now (the drafts the target rejected drop out; a preempted or restarted target
 * sequence just shares less), feeds what is missing (catch-up chunks, all sequences in one
 * forward), then feeds its own greedy tokens one at a time until each query has max_draft. So
 * drafting k tokens costs k forwards of the draft model over every drafting sequence at once.
 *
 * Refuses: a draft model whose vocabulary differs from the target's, and a hybrid one (its
 * recurrent state would keep the target's rejected drafts). Running out of draft-cache
 * blocks is no error: the sequences not drafting this step give theirs back, and a query that
 * still does not fit gets no draft. */
#include "infer/drafter.h"
#include "infer/engine_internal.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

typedef struct model_drafter {
    drafter base;
    engine *draft;     /* the draft model's engine (its kv, transformer, staging) */
    sequence **seqs;   /* one record per target sequence drafted for */
    int n_seqs, cap;
    /* this call */
    drafter_query **query_of; /* [cap] the query each record serves, or NULL */
} model_drafter;

static sequence *find_record(model_drafter *m, uint64_t serial, int *index) {
    for (int i = 0; i < m->n_seqs; i++)
        if (m->seqs[i]->serial == serial) {
            if (index) *index = i;
            return m->seqs[i];
        }
    return NULL;
}

static void drop_record(model_drafter *m, int index) {
    engine_free_sequence(m->draft, m->seqs[index]);
    m->seqs[index] = m->seqs[--m->n_seqs];
    m->query_of[index] = m->query_of[m->n_seqs];
}

/* The record for q (made if new) with room for q's tokens and its drafts, rolled back to what it
 * shares with q's tokens, one token at least left to feed. NULL when out of memory. */
static sequence *record_for(model_drafter *m, drafter_query *q) {
    int index;
    sequence *s = find_record(m, q->serial, &index);
    if (!s) {
        if (m->n_seqs == m->cap) {
            int cap = m->cap ? m->cap * 2 : 16;
            sequence **n = realloc(m->seqs, (size_t)cap * sizeof *n);
            drafter_query **nq = n ? realloc(m->query_of, (size_t)cap * sizeof *nq) : NULL;
            if (n) m->seqs = n;
            if (!nq) return NULL;
            m->query_of = nq;
            m->cap = cap;
        }
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        s->serial = q->serial;
        /* a draft record holds no recurrent-state slot (engine_free_sequence releases them) */
        s->state_slot = s->spare_slot = -1;
        index = m->n_seqs;
        m->seqs[m->n_seqs++] = s;
    }
    int need = q->n_tokens + q->max_draft;
    if (need > s->cap) {
        int32_t *t = realloc(s->tokens, (size_t)need * 2 * sizeof *t);
        if (!t) return NULL;
        s->tokens = t;
        s->cap = need * 2;
    }
    int same = 0;
    while (same < s->n_computed && same < q->n_tokens && s->tokens[same] == q->tokens[same]) same++;
    s->n_computed = same < q->n_tokens ? same : q->n_tokens - 1;
    memcpy(s->tokens, q->tokens, (size_t)q->n_tokens * sizeof *s->tokens);
    s->n_tokens = q->n_tokens;
    m->query_of[index] = q;
    return s;
}

/* Blocks for s's positions < n_pos; when the cache is full, records no query uses this call
 * give theirs back first. 0, or -1 when it still does not fit. */
static int reserve_blocks(model_drafter *m, sequence *s, int n_pos) {
    if (engine_ensure_blocks(m->draft, s, n_pos) == 0) return 0;
    for (int i = m->n_seqs - 1; i >= 0; i--)
        if (!m->query_of[i]) drop_record(m, i);
    return engine_ensure_blocks(m->draft, s, n_pos);
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* One forward of every record still drafting: catch-up chunks within the token budget, then one
 * drafted token each. Returns how many records took part, or -1 on a failed forward. */
static int draft_round(model_drafter *m, char *err, size_t errlen) {
    engine *d = m->draft;
    int budget = d->max_batch_tokens, n_members = 0;
    for (int i = 0; i < m->n_seqs && budget > 0 && n_members < d->max_sequences; i++) {
        sequence *s = m->seqs[i];
        drafter_query *q = m->query_of[i];
        if (!q || q->n_draft >= q->max_draft) continue;
        int left = s->n_tokens - s->n_computed;
        s->chunk = left < budget ? left : budget;
        s->n_draft = 0;
        s->logit_index = -1;
        if (reserve_blocks(m, s, s->n_computed + s->chunk) != 0) {
            m->query_of[i] = NULL; /* no room in the draft cache: no draft for this one */
            continue;
        }
        budget -= s->chunk;
        d->b_members[n_members++] = s;
    }
    if (!n_members) return 0;
    transformer_batch b;
    if (engine_stage_batch(d, n_members, &b) != 0) {
        error_set(err, errlen, "out of memory staging the draft model's batch");
        return -1;
    }
    char ferr[200];
    if (transformer_forward(d->tf, d->kv->layers, d->block_size, &b, d->logits, ferr,
                            sizeof ferr) != 0) {
        error_set(err, errlen, "draft model forward: %s", ferr);
        return -1;
    }
    for (int i = 0; i < m->n_seqs; i++) {
        sequence *s = m->seqs[i];
        drafter_query *q = m->query_of[i];
        if (!q || !s->chunk) continue;
        s->n_computed += s->chunk;
        s->chunk = 0;
        if (s->logit_index < 0) continue; /* a catch-up chunk that did not reach the end */
        const float *row = d->logits + (size_t)s->logit_index * (size_t)d->cfg.vocab_size;
        int32_t t = argmax(row, d->cfg.vocab_size);
        q->draft[q->n_draft++] = t;
        s->tokens[s->n_tokens++] = t; /* fed next round, unless the draft is complete */
    }
    return n_members;
}

static int model_propose(drafter *base, drafter_query *queries, int n_queries, char *err,
                         size_t errlen) {
    model_drafter *m = (model_drafter *)base;
    for (int i = 0; i < m->n_seqs; i++) m->query_of[i] = NULL;
    for (int i = 0; i < n_queries; i++) {
        drafter_query *q = &queries[i];
        q->n_draft = 0;
        if (q->n_tokens < 1 || q->max_draft < 1) continue;
        if (!record_for(m, q)) {
            error_set(err, errlen, "out of memory for the draft model's sequences");
            return -1;
        }
    }
    for (int n; (n = draft_round(m, err, errlen)) != 0;)
        if (n < 0) return -1;
    return 0;
}

static void model_release(drafter *base, uint64_t serial) {
    model_drafter *m = (model_drafter *)base;
    int index;
    if (find_record(m, serial, &index)) drop_record(m, index);
}

static void model_destroy(drafter *base) {
    model_drafter *m = (model_drafter *)base;
    while (m->n_seqs) drop_record(m, m->n_seqs - 1);
    engine_close(m->draft);
    free(m->seqs);
    free(m->query_of);
    free(m);
}

drafter *drafter_model_create(const drafter_model_options *o, char *err, size_t errlen) {
    engine_options eo = {.model_dir = o->model_dir, .device = o->device,
                         .n_threads = o->n_threads, .max_sequences = o->max_sequences,
                         .context_length = o->context_length};
    char derr[256];
    engine *d = engine_open(&eo, derr, sizeof derr);
    if (!d) {
        error_set(err, errlen, "draft model %s: %s", o->model_dir, derr);
        return NULL;
    }
    if (d->cfg.vocab_size != o->vocab_size) {
        error_set(err, errlen,
                  "draft model %s has a vocabulary of %d tokens, the model %d: a draft model "
                  "needs the same tokenizer",
                  o->model_dir, d->cfg.vocab_size, o->vocab_size);
        engine_close(d);
        return NULL;
    }
    if (d->hybrid) { /* its records roll back K/V only (record_for), not a recurrent state */
        error_set(err, errlen,
                  "draft model %s is a hybrid linear-attention model: a draft model must be a "
                  "plain transformer",
                  o->model_dir);
        engine_close(d);
        return NULL;
    }
    model_drafter *m = calloc(1, sizeof *m);
    if (!m) {
        engine_close(d);
        error_set(err, errlen, "out of memory making the draft model's drafter");
        return NULL;
    }
    m->draft = d;
    m->base = (drafter){.name = "draft", .propose = model_propose, .release = model_release,
                        .destroy = model_destroy};
    return &m->base;
}
