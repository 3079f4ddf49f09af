/* engine_dist — one model over several ranks: the engine's agreement protocol and the parallel
 * forward. See engine.h for the contract and docs/distributed.md for the design.
 *
 * Per step, in this order on every rank (collectives must match one for one):
 *   1. inputs: rank 0 broadcasts a fixed header {max_events, payload length, shutdown}, then the
 *      payload (requests and cancellations in call order) when there is one; every rank applies
 *      it, so every rank holds the same sequences, and the scheduler (deterministic, same KV
 *      capacity everywhere) plans the same batch on each; a constrained request carries its
 *      constraint's spec, from which the sampling rank builds the constraint it masks with;
 *   2. forward: tensor parallel, two all-reduces per layer inside transformer_forward, then each
 *      rank's share of the vocabulary's logits to rank 0; pipeline, hidden states
 *      [n_tokens][dim] from rank r to r + 1 (dist_send/dist_recv);
 *   3. tokens: the sampling rank (tensor: 0, pipeline: the last) samples every sequence that
 *      reached its last known token and broadcasts the sampler results.
 * That is the tensor-parallel step and the serial pipeline's; the overlapped pipeline (the
 * default) spreads a step over S ticks, one stage each (see its section below).
 * Idle rank 0 still runs step 1 every engine_idle_step_ms, so followers never wait past the data
 * plane's timeout; a failed call fails the engine for good (the group is broken).
 *
 * Refuses: splits the model does not allow (model_config_tensor_split_check, layer ranges that do
 * not chain 0..n_layers in rank order), ranks whose scheduler settings differ. */
#include "infer/engine_internal.h"
#include "base/error.h"

#include "base/clock.h"
#include "dist/dist.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INPUTS_MAGIC 0x45584f53u /* "EXOS" */

enum { INPUT_SUBMIT = 1, INPUT_CANCEL = 2 };

/* ---- timed data-plane calls: the time goes to comm_ns; a failure fails the engine ---------- */

static int comm_done(engine *e, uint64_t t0, int rc, const char *what, const char *err) {
    e->comm_ns += clock_now_ns() - t0;
    if (rc == 0) return 0;
    engine_set_error(e, "rank %d of %d: %s failed: %s", e->d.rank, e->d.size, what, err);
    e->failed = 1;
    return -1;
}

static int bcast(engine *e, int root, void *buf, size_t bytes, const char *what) {
    char err[200] = "";
    uint64_t t0 = clock_now_ns();
    int rc = dist_broadcast(e->dist, root, buf, bytes, err, sizeof err);
    return comm_done(e, t0, rc, what, err);
}

static int allreduce(void *ctx, float *buf, size_t n, char *err, size_t errlen) {
    engine *e = ctx;
    uint64_t t0 = clock_now_ns();
    int rc = dist_allreduce_sum(e->dist, buf, n, err, errlen);
    e->comm_ns += clock_now_ns() - t0;
    return rc;
}

/* ---- setup ----------------------------------------------------------------------------------- */

int engine_dist_init(engine *e, const engine_options *o, model_shard *shard, char *err,
                     size_t errlen) {
    engine_dist_state *d = &e->d;
    e->dist = o->dist;
    d->rank = dist_rank(o->dist);
    d->size = dist_size(o->dist);
    d->parallel = o->parallel;
    d->timeout_ms = o->dist_timeout_ms > 0 ? o->dist_timeout_ms : 30000;
    e->make_constraint = o->make_constraint;
    e->make_constraint_ctx = o->make_constraint_ctx;
    int n_layers = e->cfg.n_layers;
    if (d->parallel == ENGINE_TENSOR) {
        *shard = (model_shard){.tp_rank = d->rank, .tp_size = d->size};
        d->head_rank = 0;
        return model_config_tensor_split_check(&e->cfg, d->size, err, errlen);
    }
    if (d->parallel != ENGINE_PIPELINE) {
        error_set(err, errlen, "a group of %d ranks needs a split: pipeline or tensor", d->size);
        return -1;
    }
    if (d->size > n_layers) {
        error_set(err, errlen, "cannot split %d layers into %d pipeline stages", n_layers, d->size);
        return -1;
    }
    if (o->layer_start == 0 && o->layer_end == 0) { /* even split by rank */
        shard->layer_start = n_layers * d->rank / d->size;
        shard->layer_end = n_layers * (d->rank + 1) / d->size;
    }
    d->head_rank = d->size - 1;
    d->overlap = d->size > 1 && !o->pipeline_serial;
    e->pipeline_steps = d->overlap ? d->size : 0;
    return 0;
}

int engine_dist_start(engine *e, char *err, size_t errlen) {
    if (e->d.parallel == ENGINE_TENSOR && e->d.size > 1) {
        transformer_set_allreduce(e->tf, allreduce, e);
        int64_t share = e->cfg.vocab_size / e->d.size + 1; /* the largest rank's share */
        e->d.part_logits = malloc((size_t)e->max_logit_rows * (size_t)share * sizeof(float));
        if (!e->d.part_logits) {
            error_set(err, errlen, "out of memory for the lm_head's outputs");
            return -1;
        }
        return 0;
    }
    if (e->d.parallel != ENGINE_PIPELINE) return 0;
    engine_dist_state *d = &e->d;
    size_t hidden = (size_t)e->max_batch_tokens * (size_t)e->cfg.hidden_size * sizeof(float);
    d->hidden = malloc(hidden);
    int fail = !d->hidden;
    if (d->overlap) {
        d->hidden_in = malloc(hidden);
        d->ring_size = 2 * d->size + 2; /* a step lives from its plan to its results' apply */
        d->ring = calloc((size_t)d->ring_size, sizeof *d->ring);
        fail |= !d->hidden_in || !d->ring;
        for (int i = 0; !fail && i < d->ring_size; i++) {
            step_record *r = &d->ring[i];
            size_t n = (size_t)e->max_sequences;
            r->step = r->inputs_step = -1;
            r->serials = calloc(n, sizeof *r->serials);
            r->chunks = calloc(n, sizeof *r->chunks);
            r->logit_index = calloc(n, sizeof *r->logit_index);
            r->samples = calloc((size_t)e->max_logit_rows, sizeof *r->samples);
            fail |= !r->serials || !r->chunks || !r->logit_index || !r->samples;
        }
    }
    if (fail) {
        error_set(err, errlen, "out of memory for the pipeline's hidden states");
        return -1;
    }
    return 0;
}

/* What each rank states at open; every rank checks every other's. */
typedef struct rank_report {
    int32_t parallel, size, n_layers, vocab;
    int32_t layer_start, layer_end, has_head;
    int32_t max_batch_tokens, max_sequences, context_length, block_size;
    int32_t n_blocks;
    int32_t can_constrain; /* has make_constraint: may sample constrained requests */
    int32_t spec_tokens;   /* speculation: the most drafted tokens per step (0: off) */
    char drafter[16];      /* and its drafter ("" when off): every rank drafts alike */
} rank_report;

static int check_reports(const engine *e, const rank_report *r, char *err, size_t errlen) {
    const rank_report *a = &r[0];
    for (int i = 1; i < e->d.size; i++) {
        const rank_report *b = &r[i];
        if (b->parallel != a->parallel || b->size != a->size || b->n_layers != a->n_layers ||
            b->vocab != a->vocab || b->max_batch_tokens != a->max_batch_tokens ||
            b->max_sequences != a->max_sequences || b->context_length != a->context_length ||
            b->block_size != a->block_size || b->spec_tokens != a->spec_tokens ||
            strcmp(b->drafter, a->drafter)) {
            error_set(err, errlen, "rank %d runs a different model or scheduler settings than "
                    "rank 0 (layers %d/%d, vocab %d/%d, batch %d/%d, sequences %d/%d, context "
                    "%d/%d, speculation '%s' x%d/'%s' x%d)", i, b->n_layers, a->n_layers,
                    b->vocab, a->vocab, b->max_batch_tokens, a->max_batch_tokens,
                    b->max_sequences, a->max_sequences, b->context_length, a->context_length,
                    b->drafter, b->spec_tokens, a->drafter, a->spec_tokens);
            return -1;
        }
    }
    if (e->d.parallel != ENGINE_PIPELINE) return 0;
    for (int i = 0; i < e->d.size; i++) {
        int want = i ? r[i - 1].layer_end : 0;
        if (r[i].layer_start != want || r[i].layer_end <= r[i].layer_start) {
            error_set(err, errlen, "pipeline stage %d holds layers [%d, %d); it must start at "
                    "layer %d (stages hold consecutive ranges in rank order)", i,
                    r[i].layer_start, r[i].layer_end, want);
            return -1;
        }
    }
    if (r[e->d.size - 1].layer_end != a->n_layers) {
        error_set(err, errlen, "the last pipeline stage ends at layer %d of %d",
                r[e->d.size - 1].layer_end, a->n_layers);
        return -1;
    }
    return 0;
}

int engine_dist_agree(engine *e, int *n_blocks, char *err, size_t errlen) {
    int size = e->d.size;
    rank_report *r = calloc((size_t)size, sizeof *r);
    if (!r) {
        error_set(err, errlen, "out of memory");
        return -1;
    }
    r[e->d.rank] = (rank_report){.parallel = e->d.parallel, .size = size,
                                 .n_layers = e->cfg.n_layers, .vocab = e->cfg.vocab_size,
                                 .layer_start = e->w.layer_start, .layer_end = e->w.layer_end,
                                 .has_head = e->w.has_head,
                                 .max_batch_tokens = e->max_batch_tokens,
                                 .max_sequences = e->max_sequences,
                                 .context_length = e->info.context_length,
                                 .block_size = e->block_size, .n_blocks = *n_blocks,
                                 .can_constrain = e->make_constraint != NULL,
                                 .spec_tokens = e->drafter ? e->spec_tokens : 0};
    if (e->drafter) snprintf(r[e->d.rank].drafter, sizeof r[0].drafter, "%s", e->drafter->name);
    int rc = 0;
    for (int i = 0; i < size && rc == 0; i++) /* an all-gather: each rank's report in turn */
        rc = bcast(e, i, &r[i], sizeof r[i], "exchanging shard reports at open");
    if (rc) {
        error_set(err, errlen, "%s", e->error);
    } else if ((rc = check_reports(e, r, err, errlen)) == 0) {
        for (int i = 0; i < size; i++)
            if (r[i].n_blocks < *n_blocks) *n_blocks = r[i].n_blocks;
        e->d.head_constrains = r[e->d.head_rank].can_constrain;
    }
    e->comm_ns = 0; /* waiting for the other ranks to load is not a step's communication */
    e->d.agreed = rc == 0;
    free(r);
    return rc;
}

/* ---- step inputs: rank 0 serializes, every rank applies ------------------------------------- */

static int put(engine *e, const void *p, size_t n) {
    engine_dist_state *d = &e->d;
    if (d->inputs_len + n > d->inputs_cap) {
        size_t cap = d->inputs_cap ? d->inputs_cap * 2 : 4096;
        while (cap < d->inputs_len + n) cap *= 2;
        unsigned char *b = realloc(d->inputs, cap);
        if (!b) return -1;
        d->inputs = b;
        d->inputs_cap = cap;
    }
    memcpy(d->inputs + d->inputs_len, p, n);
    d->inputs_len += n;
    return 0;
}

/* A request as it travels (then n_prompt prompt ids, n_stop stop ids and n_constraint bytes of
 * its constraint_spec). sampling_params is copied as bytes: every rank runs the same build. */
typedef struct submit_record {
    uint64_t id;
    sampling_params sampling;
    int32_t max_tokens, ban_eos, no_prefix_cache, n_prompt, n_stop, n_constraint, spec_tokens;
} submit_record;

/* A constrained request: the rank that samples rebuilds the caller's constraint from its spec
 * (the caller's is a pointer into this process, and a pipeline samples on its last stage). */
static int check_constraint(const engine *e, const engine_request *r, char *err, size_t errlen) {
    if (!r->constraint.ctx) return 0;
    if (!r->constraint_spec) {
        error_set(err, errlen, "a constrained request to several ranks needs its "
                               "constraint_spec (the sampling rank rebuilds the constraint)");
        return -1;
    }
    if (!e->d.head_constrains) {
        error_set(err, errlen, "structured outputs are not available on this instance: rank %d, "
                               "which samples, cannot build constraints", e->d.head_rank);
        return -1;
    }
    size_t n = strlen(r->constraint_spec);
    if (n > INT32_MAX / 2) {
        error_set(err, errlen, "the constraint is too long (%zu bytes)", n);
        return -1;
    }
    return 0;
}

int engine_dist_queue_submit(engine *e, uint64_t seq_id, const engine_request *r, char *err,
                             size_t errlen) {
    if (e->d.rank != 0) {
        error_set(err, errlen, "rank %d cannot take requests: rank 0 serves them", e->d.rank);
        return -1;
    }
    if (check_constraint(e, r, err, errlen)) return -1;
    size_t mark = e->d.inputs_len;
    uint8_t kind = INPUT_SUBMIT;
    submit_record rec = {.id = seq_id, .sampling = r->sampling, .max_tokens = r->max_tokens,
                         .ban_eos = r->ban_eos, .no_prefix_cache = r->no_prefix_cache,
                         .n_prompt = r->n_prompt,
                         .n_stop = r->n_stop_tokens > 0 ? r->n_stop_tokens : 0,
                         .n_constraint = r->constraint.ctx ? (int32_t)strlen(r->constraint_spec)
                                                           : 0,
                         .spec_tokens = r->spec_tokens};
    if (put(e, &kind, 1) || put(e, &rec, sizeof rec) ||
        put(e, r->prompt, (size_t)rec.n_prompt * sizeof *r->prompt) ||
        (rec.n_stop && put(e, r->stop_tokens, (size_t)rec.n_stop * sizeof *r->stop_tokens)) ||
        (rec.n_constraint && put(e, r->constraint_spec, (size_t)rec.n_constraint))) {
        e->d.inputs_len = mark;
        error_set(err, errlen, "out of memory queueing a request");
        return -1;
    }
    e->d.queued_submits++;
    /* the engine owns it now; the sampling rank (rank 0 too, in tensor parallel) builds its own */
    if (r->constraint.ctx && r->constraint.release) r->constraint.release(r->constraint.ctx);
    return 0;
}

void engine_dist_queue_cancel(engine *e, uint64_t seq_id) {
    uint8_t kind = INPUT_CANCEL;
    size_t mark = e->d.inputs_len;
    if (e->d.rank != 0) return;
    if (put(e, &kind, 1) || put(e, &seq_id, sizeof seq_id)) e->d.inputs_len = mark;
}

/* The sampling rank's constraint for a request with a constraint_spec (other ranks: none). Rank 0
 * built the same one before sending, so a failure here is the machine's (memory): it fails the
 * engine, as every rank would have to agree to drop the request otherwise. */
static int build_constraint(engine *e, uint64_t id, engine_request *r) {
    if (!r->constraint_spec || e->d.rank != e->d.head_rank) return 0;
    char err[200] = "no make_constraint on this rank";
    if (e->make_constraint &&
        e->make_constraint(e->make_constraint_ctx, r->constraint_spec, &r->constraint, err,
                           sizeof err) == 0)
        return 0;
    engine_set_error(e, "rank %d: cannot build the constraint of request %llu: %s", e->d.rank,
                     (unsigned long long)id, err);
    return -1;
}

/* Applies a payload of records; bounds-checked (a short or garbled payload is an error). */
static int apply_inputs(engine *e, const unsigned char *p, size_t len) {
    size_t off = 0;
    while (off < len) {
        uint8_t kind = p[off++];
        if (kind == INPUT_CANCEL && len - off >= sizeof(uint64_t)) {
            uint64_t id;
            memcpy(&id, p + off, sizeof id);
            off += sizeof id;
            engine_cancel_local(e, id);
            continue;
        }
        submit_record rec;
        if (kind != INPUT_SUBMIT || len - off < sizeof rec) break;
        memcpy(&rec, p + off, sizeof rec);
        off += sizeof rec;
        size_t ids = ((size_t)rec.n_prompt + (size_t)rec.n_stop) * sizeof(int32_t);
        if (rec.n_prompt < 1 || rec.n_stop < 0 || rec.n_constraint < 0 ||
            len - off < ids + (size_t)rec.n_constraint)
            break;
        int32_t *tok = malloc(ids + (size_t)rec.n_constraint + 1);
        if (!tok) {
            engine_set_error(e, "rank %d: out of memory applying a request", e->d.rank);
            return -1;
        }
        memcpy(tok, p + off, ids + (size_t)rec.n_constraint);
        off += ids + (size_t)rec.n_constraint;
        char *spec = (char *)tok + ids;
        spec[rec.n_constraint] = 0;
        engine_request r = {.prompt = tok, .n_prompt = rec.n_prompt, .sampling = rec.sampling,
                            .max_tokens = rec.max_tokens, .stop_tokens = tok + rec.n_prompt,
                            .n_stop_tokens = rec.n_stop, .ban_eos = rec.ban_eos,
                            .no_prefix_cache = rec.no_prefix_cache,
                            .constraint_spec = rec.n_constraint ? spec : NULL,
                            .spec_tokens = rec.spec_tokens};
        int rc = build_constraint(e, rec.id, &r);
        if (rc == 0 && (rc = engine_add_sequence(e, rec.id, &r)) != 0) {
            if (r.constraint.ctx) r.constraint.release(r.constraint.ctx);
            engine_set_error(e, "rank %d: out of memory applying a request", e->d.rank);
        }
        free(tok);
        if (rc) return -1;
    }
    if (off == len) return 0;
    engine_set_error(e, "rank %d: step inputs from rank 0 are malformed", e->d.rank);
    return -1;
}

typedef struct inputs_header {
    uint32_t magic;
    int32_t max_events;
    uint64_t len;
    int32_t shutdown;
    int32_t pad;
} inputs_header;

/* The step inputs of this tick: rank 0 sends its log; every rank applies it now, except an
 * overlapped pipeline's followers, which keep it in `keep` for the step's plan. */
static int exchange_into(engine *e, int *max_events, int shutdown, step_record *keep);

static int exchange(engine *e, int *max_events, int shutdown) {
    return exchange_into(e, max_events, shutdown, NULL);
}

static int exchange_into(engine *e, int *max_events, int shutdown, step_record *keep) {
    engine_dist_state *d = &e->d;
    inputs_header h = {0};
    if (d->rank == 0)
        h = (inputs_header){.magic = INPUTS_MAGIC, .max_events = *max_events,
                            .len = d->inputs_len, .shutdown = shutdown};
    if (bcast(e, 0, &h, sizeof h, "sharing the step's inputs (rank 0 to all)")) return -1;
    if (h.magic != INPUTS_MAGIC || h.max_events < 0 || h.max_events > ENGINE_DIST_MAX_EVENTS) {
        engine_set_error(e, "rank %d: a step header from rank 0 is malformed", d->rank);
        return -1;
    }
    if (h.shutdown) {
        d->shut_down = 1;
        return 0;
    }
    *max_events = h.max_events;
    if (keep) {
        keep->inputs_step = d->tick;
        keep->inputs_len = 0;
    }
    if (h.len == 0) return 0;
    if (keep) {
        if (h.len > keep->inputs_cap) {
            unsigned char *b = realloc(keep->inputs, h.len);
            if (!b) {
                engine_set_error(e, "rank %d: out of memory for step inputs", d->rank);
                return -1;
            }
            keep->inputs = b;
            keep->inputs_cap = h.len;
        }
        keep->inputs_len = h.len;
        return bcast(e, 0, keep->inputs, h.len, "sharing the step's new requests (rank 0 to all)");
    }
    if (d->rank != 0) {
        unsigned char *b = h.len > d->inputs_cap ? realloc(d->inputs, h.len) : d->inputs;
        if (!b) {
            engine_set_error(e, "rank %d: out of memory for %llu bytes of step inputs", d->rank,
                             (unsigned long long)h.len);
            return -1;
        }
        if (h.len > d->inputs_cap) d->inputs_cap = h.len;
        d->inputs = b;
    }
    if (bcast(e, 0, d->inputs, h.len, "sharing the step's new requests (rank 0 to all)")) return -1;
    int rc = apply_inputs(e, d->inputs, h.len);
    d->inputs_len = 0;
    d->queued_submits = 0;
    return rc;
}

int engine_dist_exchange_inputs(engine *e, int *max_events) {
    if (*max_events > ENGINE_DIST_MAX_EVENTS) *max_events = ENGINE_DIST_MAX_EVENTS;
    return exchange(e, max_events, 0);
}

/* ---- the parallel forward -------------------------------------------------------------------- */

static int forward_failed(engine *e, const char *err) {
    engine_set_error(e, "rank %d of %d: forward pass: %s", e->d.rank, e->d.size, err);
    e->failed = 1;
    return -1;
}

/* Tensor parallel: rank r computed logits for vocabulary rows [V*r/N, V*(r+1)/N) of each logit
 * row into part_logits; rank 0 gathers them into whole rows of e->logits (to sample). */
static int64_t vocab_start(const engine *e, int r) {
    return (int64_t)e->cfg.vocab_size * r / e->d.size;
}

static void place_share(engine *e, int r, int n_logits) {
    int64_t v0 = vocab_start(e, r), n = vocab_start(e, r + 1) - v0, vocab = e->cfg.vocab_size;
    for (int i = 0; i < n_logits; i++)
        memcpy(e->logits + (size_t)(i * vocab + v0), e->d.part_logits + (size_t)(i * n),
               (size_t)n * sizeof(float));
}

static int move_share(engine *e, int r, int n_logits) {
    size_t bytes = (size_t)n_logits * (size_t)(vocab_start(e, r + 1) - vocab_start(e, r)) *
                   sizeof(float);
    char err[200] = "";
    uint64_t t0 = clock_now_ns();
    int rc = e->d.rank == 0 ? dist_recv(e->dist, r, e->d.part_logits, bytes, err, sizeof err)
                            : dist_send(e->dist, 0, e->d.part_logits, bytes, err, sizeof err);
    return comm_done(e, t0, rc, "gathering the logits on rank 0", err);
}

static int gather_logits(engine *e, int n_logits) {
    if (e->d.rank != 0) return move_share(e, e->d.rank, n_logits);
    place_share(e, 0, n_logits);
    for (int r = 1; r < e->d.size; r++) {
        if (move_share(e, r, n_logits)) return -1;
        place_share(e, r, n_logits);
    }
    return 0;
}

int engine_dist_forward(engine *e, int n_members, const transformer_batch *b) {
    engine_dist_state *d = &e->d;
    char err[256] = "";
    size_t hidden_bytes = (size_t)b->n_tokens * (size_t)e->cfg.hidden_size * sizeof(float);
    transformer_batch stage = *b;
    if (d->parallel == ENGINE_TENSOR && d->size > 1) {
        if (transformer_forward(e->tf, e->kv->layers, e->block_size, &stage, d->part_logits, err,
                                sizeof err))
            return forward_failed(e, err);
        if (b->n_logits == 0) return 0;
        if (gather_logits(e, b->n_logits)) return -1;
        if (d->rank == 0) engine_sample_all(e, n_members);
        return bcast(e, 0, e->samples, (size_t)b->n_logits * sizeof *e->samples,
                     "sharing the sampled tokens");
    }
    if (d->parallel == ENGINE_PIPELINE) {
        if (d->rank > 0) {
            uint64_t t0 = clock_now_ns();
            int rc = dist_recv(e->dist, d->rank - 1, d->hidden, hidden_bytes, err, sizeof err);
            if (comm_done(e, t0, rc, "receiving hidden states", err)) return -1;
            stage.hidden_in = d->hidden;
        }
    }
    int rc = engine_forward_local(e, n_members, &stage, d->hidden, err, sizeof err);
    if (rc) return rc < 0 ? forward_failed(e, err) : (e->failed = 1, -1);
    if (d->parallel == ENGINE_PIPELINE && d->rank + 1 < d->size) {
        uint64_t t0 = clock_now_ns();
        rc = dist_send(e->dist, d->rank + 1, d->hidden, hidden_bytes, err, sizeof err);
        if (comm_done(e, t0, rc, "sending hidden states", err)) return -1;
    }
    if (b->n_logits == 0) return 0;
    return bcast(e, d->head_rank, e->samples, (size_t)b->n_logits * sizeof *e->samples,
                 "sharing the sampled tokens");
}

/* ---- the overlapped pipeline ----------------------------------------------------------------
 *
 * Stage s works on step t - s during tick t (engine_step call t, counted alike on every rank),
 * so with S stages S steps are in flight and every stage computes at once. Each step k is, on
 * every rank and in this order: apply the results (sampled tokens) of step k - S, apply rank 0's
 * inputs of tick k, plan k. The order is the same everywhere; only the time differs (rank s plans
 * k at tick k + s - 1, rank 0 at tick k), and everything a plan needs has arrived by then:
 * inputs of tick k at tick k, the tokens of step k - S at tick k - 1 (broadcast by the last stage
 * at the end of the tick that computed them). A sequence whose step samples is in flight from
 * its plan until its token applies, and sits out the steps in between; each step decodes its
 * share of the running sequences (plan_batch), so S steps carry them all. A prefill chunk that
 * samples nothing counts as computed at its plan (engine_plan_step), so a long prompt's chunks
 * follow each other through the stages back to back.
 *
 * Tick t on rank s > 0: inputs of tick t (kept), forward step t - s (planned last tick, its hidden
 * states received last tick), send them to s + 1, plan step t + 1 - s, receive its hidden states
 * from s - 1, then the tokens of step t - S + 1 from the last stage. Every send is matched by a
 * receive in the same tick, posted after the receiver's own send: no rank waits in a cycle.
 * Rank 0: inputs (applied), plan step t, forward, send, tokens of step t - S + 1, which it
 * applies at once (they precede tick t + 1's inputs) and reports as this tick's events. */

static step_record *slot(engine *e, int64_t step) {
    return &e->d.ring[step % e->d.ring_size];
}

/* The event budget of a tick: the plan takes at most half of max_events sequences (their tokens
 * come back as events S - 1 ticks later), cancellations a quarter. Not dependent on events
 * already written, so every rank plans the same caps. */
static int tick_cap(const engine *e, int max_events) {
    int cap = max_events / 2 > 0 ? max_events / 2 : 1;
    return cap < e->max_sequences ? cap : e->max_sequences;
}

static int tick_quarter(int max_events) {
    return max_events / 4 > 0 ? max_events / 4 : 1;
}

/* The events a plan's tokens (one per member, plus drafted ones: spec_plan_drafts) may take:
 * they come back in one tick with its cancellations (a quarter) and a plan's error event. */
static int tick_token_room(int max_events) {
    int room = max_events - tick_quarter(max_events) - 1;
    return room > 0 ? room : 0;
}

static void apply_results(engine *e, const step_record *r, engine_event *events, int *n_ev,
                          int max_events) {
    for (int m = 0; m < r->n_members; m++) {
        sequence *s = engine_find_serial(e, r->serials[m]);
        if (s) /* else cancelled while in flight */
            engine_finish_member(e, s, r->chunks[m], r->logit_index[m], r->samples, events, n_ev,
                                 max_events);
    }
}

/* Applies what precedes the plan of step k (on ranks other than 0), then plans it into its
 * record. The staged batch stays in e's staging buffers until the forward at the next tick. */
static int plan_step(engine *e, int64_t k, int max_events, engine_event *events, int *n_ev,
                     transformer_batch *b) {
    engine_dist_state *d = &e->d;
    step_record *r = slot(e, k);
    if (d->rank > 0) {
        if (k >= d->size && slot(e, k - d->size)->step == k - d->size)
            apply_results(e, slot(e, k - d->size), events, n_ev, max_events);
        if (r->inputs_step != k) {
            engine_set_error(e, "rank %d: the inputs of step %lld are missing", d->rank,
                             (long long)k);
            return -1;
        }
        if (apply_inputs(e, r->inputs, r->inputs_len)) return -1;
    }
    int n = engine_plan_step(e, tick_cap(e, max_events), tick_token_room(max_events), b, events,
                             n_ev);
    if (n < 0) return -1;
    r->step = k;
    r->n_members = n;
    r->n_tokens = n ? b->n_tokens : 0;
    r->n_logits = n ? b->n_logits : 0;
    for (int m = 0; m < n; m++) {
        r->serials[m] = e->b_members[m]->serial;
        r->chunks[m] = e->b_members[m]->chunk;
        r->logit_index[m] = e->b_members[m]->logit_index;
    }
    return 0;
}

static int hidden_transfer(engine *e, int send, int peer, float *buf, int n_tokens) {
    char err[200] = "";
    size_t bytes = (size_t)n_tokens * (size_t)e->cfg.hidden_size * sizeof(float);
    uint64_t t0 = clock_now_ns();
    int rc = send ? dist_send(e->dist, peer, buf, bytes, err, sizeof err)
                  : dist_recv(e->dist, peer, buf, bytes, err, sizeof err);
    return comm_done(e, t0, rc, send ? "sending hidden states" : "receiving hidden states", err);
}

/* Forward of the step planned into r (staged in e's buffers); the last stage samples it. */
static int forward_step(engine *e, step_record *r, const transformer_batch *b) {
    engine_dist_state *d = &e->d;
    char err[256] = "";
    transformer_batch stage = *b;
    if (d->rank > 0) stage.hidden_in = d->hidden_in;
    int rc = engine_forward_local(e, r->n_members, &stage, d->hidden, err, sizeof err);
    if (rc) return rc < 0 ? forward_failed(e, err) : (e->failed = 1, -1);
    e->steps++;
    if (e->w.has_head) {
        memcpy(r->samples, e->samples, (size_t)r->n_logits * sizeof *r->samples);
        return 0;
    }
    return hidden_transfer(e, 1, d->rank + 1, d->hidden, r->n_tokens);
}

int engine_dist_tick(engine *e, engine_event *events, int max_events) {
    engine_dist_state *d = &e->d;
    if (max_events > ENGINE_DIST_MAX_EVENTS) max_events = ENGINE_DIST_MAX_EVENTS;
    int64_t t = d->tick, S = d->size, s = d->rank;
    if (exchange_into(e, &max_events, 0, s > 0 ? slot(e, t) : NULL)) return -1;
    if (d->shut_down) return 0;
    d->tick++;
    int n_ev = engine_report_cancelled(e, events, tick_quarter(max_events));
    transformer_batch b;
    if (s == 0 && plan_step(e, t, max_events, events, &n_ev, &b)) return -1;
    /* rank 0 forwards what it just planned; the others what they planned last tick (the staging
     * buffers still hold it: nothing was planned since) */
    step_record *mine = t - s >= 0 ? slot(e, t - s) : NULL;
    if (mine && mine->step == t - s && mine->n_members > 0) {
        if (s > 0) b = d->staged;
        if (forward_step(e, mine, &b)) return -1;
    }
    if (s > 0 && t + 1 - s >= 0) {
        if (plan_step(e, t + 1 - s, max_events, events, &n_ev, &d->staged)) return -1;
        step_record *next = slot(e, t + 1 - s);
        if (next->n_members > 0 && hidden_transfer(e, 0, s - 1, d->hidden_in, next->n_tokens))
            return -1;
    }
    int64_t j = t - S + 1;
    if (j < 0) return n_ev;
    step_record *done = slot(e, j);
    if (done->step != j) return n_ev;
    if (done->n_logits > 0 &&
        bcast(e, d->head_rank, done->samples, (size_t)done->n_logits * sizeof *done->samples,
              "sharing the sampled tokens"))
        return -1;
    if (s == 0) apply_results(e, done, events, &n_ev, max_events);
    return n_ev;
}

/* ---- followers and shutdown ------------------------------------------------------------------ */

int engine_follow(engine *e) {
    if (!e->dist || e->d.rank == 0) {
        engine_set_error(e, "engine_follow is for ranks other than 0 of a distributed engine");
        return -1;
    }
    engine_event *events = calloc(ENGINE_DIST_MAX_EVENTS, sizeof *events);
    if (!events) {
        engine_set_error(e, "out of memory");
        return -1;
    }
    int rc = 0;
    while (!e->d.shut_down && !atomic_load(&e->d.stop_following) && rc == 0)
        rc = engine_step(e, events, ENGINE_DIST_MAX_EVENTS) < 0 ? -1 : 0;
    free(events);
    return rc;
}

void engine_stop_following(engine *e) {
    atomic_store(&e->d.stop_following, 1);
}

void engine_dist_close(engine *e) {
    engine_dist_state *d = &e->d;
    if (d->rank == 0 && d->agreed && !e->failed && !d->shut_down) {
        int ignored = 0;
        exchange(e, &ignored, 1); /* best effort: a follower that is gone times out anyway */
    }
    for (int i = 0; d->ring && i < d->ring_size; i++) {
        step_record *r = &d->ring[i];
        free(r->serials);
        free(r->chunks);
        free(r->logit_index);
        free(r->samples);
        free(r->inputs);
    }
    free(d->ring);
    free(d->inputs);
    free(d->hidden);
    free(d->hidden_in);
    free(d->part_logits);
}
