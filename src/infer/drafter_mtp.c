/* MTP drafter (drafter.h): the multi-token-prediction head a Qwen3-Next / Qwen3.5 checkpoint
 * carries (mtp.*), run on the target engine's backend with the target's embedding and lm_head.
 *
 * The head is one decoder layer after the model's: its input at position p is
 * fc([norm_e(embed(token p + 1)), norm_h(h_p)]), where h_p is the target's hidden state at p
 * after its final norm, and its output after mtp.norm and the lm_head predicts the token at
 * p + 2. It attends over its own K/V of every earlier position, so it keeps a one-layer paged KV
 * cache per sequence, filled from real pairs (target hidden state, accepted token) as the target
 * computes them (observe hands over the hidden states; they wait here until the next propose,
 * which feeds them all in one batched forward). The last real pair drafts the first token; each
 * further draft feeds the previous draft with the head's own normed output as the hidden state.
 * Drafted positions are never kept: the next call overwrites them with real pairs.
 *
 * Positions the target took from its prefix cache were never computed, so they have no hidden
 * state: the head sees a zero hidden state there (its drafts get worse, never the output). The
 * same holds for the oldest of more than MTP_MAX_PENDING waiting rows (a long prompt), which
 * bounds what a sequence keeps here.
 *
 * Refuses: a checkpoint without an MTP head. Running out of its cache is no error: a query that
 * does not fit gets no draft. */
#include "infer/drafter.h"
#include "infer/engine_internal.h"

#include "base/error.h"
#include "base/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MTP_MAX_PENDING 4096 /* hidden-state rows a sequence keeps waiting for the next propose */

typedef struct mtp_record {
    uint64_t serial;
    int n_real;         /* positions [0, n_real) hold K/V of real pairs */
    int n_zero;         /* then n_zero positions without a hidden state (fed as zeros) */
    float *pending;     /* [n_pending][dim] then the normed target hidden states that follow */
    int n_pending, pending_cap;
    int32_t *blocks;    /* block table of its cache */
    int n_blocks, blocks_cap;
    /* this call */
    drafter_query *query;
    int feed_from, feed_to; /* positions this round feeds */
    int logit_index;        /* row of its logits this round, or -1 */
    float *draft_hidden;    /* [dim] the head's normed output at the last fed position */
} mtp_record;

typedef struct mtp_drafter {
    drafter base;
    engine *target;
    model_weights w;    /* the head; lm_head is the target's */
    transformer *tf;
    kv_cache *kv;       /* one layer */
    int block_size, max_tokens, max_rows, dim, vocab;
    float eps;
    float *norm_final, *norm_embedding, *norm_hidden, *norm_head; /* host [dim], as used */
    float *zero_row;    /* [dim] the hidden state of a position that has none */
    mtp_record **recs;
    int n_recs, recs_cap;
    /* staging (host) */
    float *fc_in;       /* [max_tokens][2 * dim] */
    float *x;           /* [max_tokens][dim] */
    float *logits;      /* [max_rows][vocab] */
    float *out_hidden;  /* [max_rows][dim] */
    int32_t *positions, *seq_of_token, *slots, *table_start, *logit_rows, *row_rec;
    int32_t *tables;
    int tables_cap;
    float *dev_in, *dev_out; /* backend [max_tokens][2 * dim], [max_tokens][dim] (fc) */
} mtp_drafter;

/* A norm's weights as used (zero-centred ones: 1 + w). NULL when out of memory. */
static float *norm_values(const weight_matrix *m, int plus_one, int dim) {
    float *v = malloc((size_t)dim * sizeof *v);
    if (!v) return NULL;
    weight_matrix_row_to_f32(m, 0, v);
    for (int i = 0; plus_one && i < dim; i++) v[i] += 1.0f;
    return v;
}

static void rmsnorm_row(const float *x, const float *w, int dim, float eps, float *out) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = 0; i < dim; i++) out[i] = x[i] * inv * w[i];
}

static mtp_record *find_record(mtp_drafter *m, uint64_t serial, int *index) {
    for (int i = 0; i < m->n_recs; i++)
        if (m->recs[i]->serial == serial) {
            if (index) *index = i;
            return m->recs[i];
        }
    return NULL;
}

static void drop_record(mtp_drafter *m, int index) {
    mtp_record *r = m->recs[index];
    for (int i = 0; m->kv && i < r->n_blocks; i++) kv_cache_release_block(m->kv, r->blocks[i]);
    free(r->blocks);
    free(r->pending);
    free(r->draft_hidden);
    free(r);
    m->recs[index] = m->recs[--m->n_recs];
}

static mtp_record *new_record(mtp_drafter *m, uint64_t serial) {
    if (m->n_recs == m->recs_cap) {
        int cap = m->recs_cap ? m->recs_cap * 2 : 16;
        mtp_record **n = realloc(m->recs, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        m->recs = n;
        m->recs_cap = cap;
    }
    mtp_record *r = calloc(1, sizeof *r);
    if (r) r->draft_hidden = malloc((size_t)m->dim * sizeof *r->draft_hidden);
    if (!r || !r->draft_hidden) {
        free(r);
        return NULL;
    }
    r->serial = serial;
    m->recs[m->n_recs++] = r;
    return r;
}

/* Room for `more` pending rows (at most MTP_MAX_PENDING). 0, or -1 when out of memory. */
static int pending_room(mtp_drafter *m, mtp_record *r, int more) {
    if (r->n_pending + more <= r->pending_cap) return 0;
    int cap = (r->n_pending + more) * 2;
    cap = cap < MTP_MAX_PENDING ? cap : MTP_MAX_PENDING;
    float *p = realloc(r->pending, (size_t)cap * (size_t)m->dim * sizeof *p);
    if (!p) return -1;
    r->pending = p;
    r->pending_cap = cap;
    return 0;
}

/* The first `drop` pending rows become positions without a hidden state. */
static void forget_pending(mtp_drafter *m, mtp_record *r, int drop) {
    if (drop <= 0) return; /* (pending may not be allocated yet) */
    size_t dim = (size_t)m->dim;
    memmove(r->pending, r->pending + (size_t)drop * dim,
            (size_t)(r->n_pending - drop) * dim * sizeof(float));
    r->n_pending -= drop;
    r->n_zero += drop;
}

static void mtp_observe(drafter *base, uint64_t serial, int first, int n, const float *hidden) {
    mtp_drafter *m = (mtp_drafter *)base;
    mtp_record *r = find_record(m, serial, NULL);
    if (!r && !(r = new_record(m, serial))) return;
    int kept = first - r->n_real; /* what stays of the zero and pending positions */
    if (kept < 0) { /* the target recomputes (preempted): so does the head */
        r->n_real = first;
        r->n_zero = r->n_pending = 0;
    } else if (kept < r->n_zero + r->n_pending) {
        r->n_pending = kept > r->n_zero ? kept - r->n_zero : 0;
        r->n_zero = kept < r->n_zero ? kept : r->n_zero;
    }
    int gap = first - (r->n_real + r->n_zero + r->n_pending); /* from the prefix cache */
    if (gap > 0) forget_pending(m, r, r->n_pending); /* zeros come before pending rows */
    r->n_zero += gap;
    int skip = n > MTP_MAX_PENDING ? n - MTP_MAX_PENDING : 0; /* the oldest rows go */
    int over = r->n_pending + n - skip - MTP_MAX_PENDING;
    if (over > 0) forget_pending(m, r, over);
    r->n_zero += skip;
    if (pending_room(m, r, n - skip) != 0) { /* no hidden states then: zeros */
        forget_pending(m, r, r->n_pending);
        r->n_zero += n - skip;
        return;
    }
    size_t dim = (size_t)m->dim;
    for (int i = skip; i < n; i++)
        rmsnorm_row(hidden + (size_t)i * dim, m->norm_final, m->dim, m->eps,
                    r->pending + (size_t)r->n_pending++ * dim);
}

/* The head's cache, made at the first call (the target's exists then): as many blocks as the
 * target's, plus each sequence's drafts. 0, or -1 with err. */
static int open_cache(mtp_drafter *m, char *err, size_t errlen) {
    engine *e = m->target;
    int64_t kv_dim = (int64_t)e->cfg.n_kv_heads * e->cfg.head_dim;
    int per_sequence = (ENGINE_SPEC_MAX_TOKENS + m->block_size - 1) / m->block_size + 1;
    int n_blocks = e->kv->n_blocks + e->max_sequences * per_sequence;
    m->kv = kv_cache_create(e->be, 1, kv_dim, m->block_size, n_blocks, e->kv->type, err, errlen);
    return m->kv ? 0 : -1;
}

/* Cache blocks for r's positions < n_pos. 0, or -1 when the cache is full. */
static int reserve_blocks(mtp_drafter *m, mtp_record *r, int n_pos) {
    int need = (n_pos + m->block_size - 1) / m->block_size;
    if (need > r->blocks_cap) {
        int32_t *b = realloc(r->blocks, (size_t)need * 2 * sizeof *b);
        if (!b) return -1;
        r->blocks = b;
        r->blocks_cap = need * 2;
    }
    while (r->n_blocks < need) {
        int32_t b = kv_cache_alloc_block(m->kv);
        if (b < 0) return -1;
        r->blocks[r->n_blocks++] = b;
    }
    return 0;
}

/* The head's input row for position pos of r: [norm_e(embed(token)), norm_h(hidden)]. */
static void input_row(mtp_drafter *m, int32_t token, const float *hidden, float *row) {
    int dim = m->dim;
    weight_matrix_row_to_f32(&m->target->w.embed, token, row + dim); /* scratch half */
    rmsnorm_row(row + dim, m->norm_embedding, dim, m->eps, row);
    rmsnorm_row(hidden, m->norm_hidden, dim, m->eps, row + dim);
}

/* One forward over every record's feed [feed_from, feed_to) (positions; the token at p + 1 and
 * the hidden state of p), logits for the records whose feed ends where they draft. Returns 0,
 * or -1 with err. */
static int run_round(mtp_drafter *m, mtp_record **members, int n_members, char *err,
                     size_t errlen) {
    int n_tok = 0, n_entries = 0, n_logits = 0, dim = m->dim;
    for (int k = 0; k < n_members; k++) n_entries += members[k]->n_blocks;
    if (n_entries > m->tables_cap) {
        int32_t *t = realloc(m->tables, (size_t)n_entries * 2 * sizeof *t);
        if (!t) {
            error_set(err, errlen, "out of memory staging the MTP head's batch");
            return -1;
        }
        m->tables = t;
        m->tables_cap = n_entries * 2;
    }
    n_entries = 0;
    for (int k = 0; k < n_members; k++) {
        mtp_record *r = members[k];
        const drafter_query *q = r->query;
        m->table_start[k] = n_entries;
        memcpy(m->tables + n_entries, r->blocks, (size_t)r->n_blocks * sizeof *r->blocks);
        n_entries += r->n_blocks;
        for (int p = r->feed_from; p < r->feed_to; p++, n_tok++) {
            int drafting = p >= q->n_tokens - 1; /* past the last real pair */
            int32_t token = drafting ? q->draft[q->n_draft - 1] : q->tokens[p + 1];
            int waiting = p - r->n_real - r->n_zero; /* its pending row, if it has one */
            const float *hidden = drafting      ? r->draft_hidden
                                  : waiting < 0 ? m->zero_row
                                                : r->pending + (size_t)waiting * (size_t)dim;
            input_row(m, token, hidden, m->fc_in + (size_t)n_tok * 2 * (size_t)dim);
            m->positions[n_tok] = p;
            m->seq_of_token[n_tok] = k;
            m->slots[n_tok] = r->blocks[p / m->block_size] * m->block_size + p % m->block_size;
        }
        r->logit_index = -1;
        if (r->feed_to >= q->n_tokens - 1) {
            r->logit_index = n_logits;
            m->row_rec[n_logits] = k;
            m->logit_rows[n_logits++] = n_tok - 1;
        }
    }
    compute_backend *be = m->target->be;
    be->upload(be, m->dev_in, m->fc_in, (size_t)n_tok * 2 * (size_t)dim * sizeof(float));
    be->matmul(be, &m->w.mtp_fc, m->dev_in, m->dev_out, n_tok);
    be->download(be, m->x, m->dev_out, (size_t)n_tok * (size_t)dim * sizeof(float));
    transformer_batch b = {.n_tokens = n_tok, .hidden_in = m->x, .positions = m->positions,
                           .seq_of_token = m->seq_of_token, .slots = m->slots,
                           .n_seqs = n_members, .block_table_start = m->table_start,
                           .block_tables = m->tables, .n_block_entries = n_entries,
                           .n_logits = n_logits, .logit_rows = m->logit_rows};
    char ferr[200];
    if (transformer_forward(m->tf, m->kv->layers, m->block_size, &b, m->logits, ferr,
                            sizeof ferr) != 0) {
        error_set(err, errlen, "MTP head forward: %s", ferr);
        return -1;
    }
    for (int i = 0; i < n_logits; i++) { /* the head's own output feeds its next draft */
        transformer_hidden_rows(m->tf, m->logit_rows[i], 1, m->out_hidden);
        rmsnorm_row(m->out_hidden, m->norm_head, dim, m->eps,
                    members[m->row_rec[i]]->draft_hidden);
    }
    return 0;
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Plans r's feed for this round within `budget` tokens: the real pairs it has not fed, else its
 * next draft. Returns the tokens it takes (0: nothing to feed, or no cache room). */
static int plan_feed(mtp_drafter *m, mtp_record *r, int budget) {
    const drafter_query *q = r->query;
    int last_real = q->n_tokens - 2; /* the pair (h_p, token p + 1) needs token p + 1 */
    if (r->n_real + r->n_zero + r->n_pending <= last_real) return 0; /* not observed yet */
    int from = q->n_draft == 0 ? r->n_real : last_real + q->n_draft;
    int to = q->n_draft == 0 ? last_real + 1 : from + 1;
    if (to - from > budget) to = from + budget;
    if (to <= from || reserve_blocks(m, r, to) != 0) return 0;
    r->feed_from = from;
    r->feed_to = to;
    return to - from;
}

static int mtp_propose(drafter *base, drafter_query *queries, int n_queries, char *err,
                       size_t errlen) {
    mtp_drafter *m = (mtp_drafter *)base;
    if (!m->kv && open_cache(m, err, errlen) != 0) return -1;
    for (int i = 0; i < m->n_recs; i++) m->recs[i]->query = NULL;
    for (int i = 0; i < n_queries; i++) {
        drafter_query *q = &queries[i];
        q->n_draft = 0;
        mtp_record *r = find_record(m, q->serial, NULL);
        if (r && q->n_tokens >= 2 && q->max_draft >= 1) r->query = q;
    }
    mtp_record **members = malloc((size_t)(m->n_recs ? m->n_recs : 1) * sizeof *members);
    if (!members) {
        error_set(err, errlen, "out of memory for the MTP head's batch");
        return -1;
    }
    int rc = 0;
    for (;;) { /* catch-up rounds, then one round per drafted token */
        int n_members = 0, budget = m->max_tokens;
        for (int i = 0; i < m->n_recs && budget > 0 && n_members < m->max_rows; i++) {
            mtp_record *r = m->recs[i];
            if (!r->query || r->query->n_draft >= r->query->max_draft) continue;
            int took = plan_feed(m, r, budget);
            if (!took) {
                r->query = NULL;
                continue;
            }
            budget -= took;
            members[n_members++] = r;
        }
        if (!n_members) break;
        if ((rc = run_round(m, members, n_members, err, errlen)) != 0) break;
        for (int k = 0; k < n_members; k++) {
            mtp_record *r = members[k];
            drafter_query *q = r->query;
            if (q->n_draft == 0 && r->feed_to > r->n_real) { /* real pairs are in its cache now */
                int fed = r->feed_to - r->n_real;
                if (fed > r->n_zero) forget_pending(m, r, fed - r->n_zero);
                r->n_zero -= fed;
                r->n_real = r->feed_to;
            }
            if (r->logit_index >= 0)
                q->draft[q->n_draft++] =
                    argmax(m->logits + (size_t)r->logit_index * (size_t)m->vocab, m->vocab);
        }
    }
    free(members);
    return rc;
}

static void mtp_release(drafter *base, uint64_t serial) {
    mtp_drafter *m = (mtp_drafter *)base;
    int index;
    if (find_record(m, serial, &index)) drop_record(m, index);
}

static void mtp_destroy(drafter *base) {
    mtp_drafter *m = (mtp_drafter *)base;
    while (m->n_recs) drop_record(m, m->n_recs - 1);
    compute_backend *be = m->target->be;
    if (m->dev_in) be->free(be, m->dev_in);
    if (m->dev_out) be->free(be, m->dev_out);
    transformer_destroy(m->tf);
    kv_cache_destroy(m->kv);
    model_weights_free(&m->w);
    free(m->norm_final);
    free(m->norm_embedding);
    free(m->norm_hidden);
    free(m->norm_head);
    free(m->zero_row);
    free(m->recs);
    free(m->fc_in);
    free(m->x);
    free(m->logits);
    free(m->out_hidden);
    free(m->positions);
    free(m->seq_of_token);
    free(m->slots);
    free(m->table_start);
    free(m->logit_rows);
    free(m->row_rec);
    free(m->tables);
    free(m);
}

static int prepare_weight(weight_matrix *w, void *backend) {
    compute_backend *be = backend;
    return be->prepare_weight(be, w);
}

/* Weights, forward and cache of the head. 0, or -1 with err. */
static int open_head(mtp_drafter *m, char *err, size_t errlen) {
    engine *e = m->target;
    const model_config *c = &e->cfg;
    if (model_weights_load_mtp(e->st, c, &m->w, err, errlen) != 0) return -1;
    if (e->be->prepare_weight) model_weights_rewrite(&m->w, prepare_weight, e->be);
    m->w.lm_head = e->w.lm_head; /* shared: after placing, so it is not copied */
    int plus_one = e->w.norm_plus_one;
    m->norm_final = norm_values(&e->w.final_norm, plus_one, m->dim);
    m->norm_head = norm_values(&m->w.final_norm, plus_one, m->dim);
    m->norm_embedding = norm_values(&m->w.mtp_norm_embedding, plus_one, m->dim);
    m->norm_hidden = norm_values(&m->w.mtp_norm_hidden, plus_one, m->dim);
    if (!m->norm_final || !m->norm_head || !m->norm_embedding || !m->norm_hidden) {
        error_set(err, errlen, "out of memory loading the MTP head");
        return -1;
    }
    m->tf = transformer_create(c, &m->w, e->be, m->max_tokens, m->max_rows, err, errlen);
    return m->tf ? 0 : -1;
}

static int alloc_staging(mtp_drafter *m) {
    size_t T = (size_t)m->max_tokens, D = (size_t)m->dim, R = (size_t)m->max_rows;
    compute_backend *be = m->target->be;
    m->fc_in = malloc(T * 2 * D * sizeof(float));
    m->x = malloc(T * D * sizeof(float));
    m->logits = malloc(R * (size_t)m->vocab * sizeof(float));
    m->out_hidden = malloc(D * sizeof(float));
    m->zero_row = calloc(D, sizeof(float));
    m->positions = malloc(T * 4);
    m->seq_of_token = malloc(T * 4);
    m->slots = malloc(T * 4);
    m->table_start = malloc(T * 4);
    m->logit_rows = malloc(R * 4);
    m->row_rec = malloc(R * 4);
    m->dev_in = be->alloc(be, T * 2 * D * sizeof(float));
    m->dev_out = be->alloc(be, T * D * sizeof(float));
    return m->fc_in && m->x && m->logits && m->out_hidden && m->zero_row && m->positions &&
                   m->seq_of_token &&
                   m->slots && m->table_start && m->logit_rows && m->row_rec && m->dev_in &&
                   m->dev_out
               ? 0
               : -1;
}

drafter *drafter_mtp_create(engine *target, char *err, size_t errlen) {
    if (!model_weights_has_mtp(target->st)) {
        error_set(err, errlen, "--speculative mtp: %s has no MTP head (mtp.* tensors)",
                  target->cfg.architecture);
        return NULL;
    }
    if (!target->w.has_embed || !target->w.has_head) {
        error_set(err, errlen, "--speculative mtp needs the whole model in one process");
        return NULL;
    }
    mtp_drafter *m = calloc(1, sizeof *m);
    if (!m) {
        error_set(err, errlen, "out of memory making the MTP drafter");
        return NULL;
    }
    m->base = (drafter){.name = "mtp", .propose = mtp_propose, .observe = mtp_observe,
                        .release = mtp_release, .destroy = mtp_destroy};
    m->target = target;
    m->dim = (int)target->cfg.hidden_size;
    m->vocab = target->cfg.vocab_size;
    m->eps = (float)target->cfg.rms_norm_eps;
    m->block_size = ENGINE_BLOCK_SIZE;
    m->max_tokens = target->max_batch_tokens > target->max_sequences ? target->max_batch_tokens
                                                                      : target->max_sequences;
    m->max_rows = target->max_sequences;
    if (open_head(m, err, errlen) != 0 || alloc_staging(m) != 0) {
        if (!err[0]) error_set(err, errlen, "out of memory for the MTP head's buffers");
        mtp_destroy(&m->base);
        return NULL;
    }
    log_info("engine: MTP head loaded (%.1f MB per drafted token)",
             (double)m->w.bytes_per_token / 1e6);
    return &m->base;
}
