/* engine_internal — the engine's state, shared by the scheduler (engine.c) and the multi-rank
 * glue (engine_dist.c). Private to infer/: nothing outside this folder includes it. */
#ifndef EXO_INFER_ENGINE_INTERNAL_H
#define EXO_INFER_ENGINE_INTERNAL_H

#include "arch/transformer.h"
#include "compute/backend.h"
#include "infer/drafter.h"
#include "infer/engine.h"
#include "infer/kv_cache.h"
#include "infer/sampler.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"

#include <stddef.h>
#include <stdint.h>

#define ENGINE_BLOCK_SIZE 16
#define ENGINE_DIST_MAX_EVENTS 1024 /* events per step of several ranks (followers' buffer) */

typedef enum seq_state { SEQ_WAITING = 0, SEQ_RUNNING } seq_state;

typedef struct sequence {
    uint64_t id;
    seq_state state;
    int32_t *tokens; /* prompt then generated, [cap] */
    int n_tokens, cap, n_prompt;
    int n_computed;  /* tokens whose K/V are in the cache */
    int n_generated, max_tokens;
    sampling_params sampling;
    sampler_rng rng;
    int32_t *stops;  /* eos ids + request stop ids */
    int n_stops;
    int ban_eos;
    engine_constraint constraint; /* ctx NULL: none */
    int32_t *blocks; /* block table */
    int n_blocks, blocks_cap;
    int no_prefix_cache;
    int n_hashed;       /* leading full blocks whose chain hash is known (and registered) */
    uint64_t last_hash; /* chain hash of block n_hashed - 1 (0 before the first) */
    int cached_tokens;  /* prompt tokens served from the prefix cache at admission */
    int admitted;       /* has been admitted once (cached_tokens is final) */
    uint64_t serial;    /* engine-assigned, unique for the engine's life (same on every rank) */
    int in_flight;      /* in a step whose token is not applied yet (pipeline overlap) */
    int state_slot;     /* hybrid models: recurrent-state slot while running, else -1 */
    int spare_slot;     /* hybrid models with speculation: the state before the step that
                           verifies drafts (speculative.c), else -1 */
    int catch_up;       /* hybrid: drafts were rejected and the state rolled back to before
                           the step, so the next step recomputes every token since (no drafts) */
    /* speculative decoding (speculative.c) */
    int spec_max;       /* this request's most drafted tokens per step (0: no speculation) */
    int spec_k;         /* drafted tokens to ask for now (adapts to the acceptance) */
    int spec_cooldown;  /* spec_k 0: steps to wait before probing with one drafted token */
    int spec_backoff;   /* the next cooldown after a failed probe (doubles, capped) */
    uint64_t spec_drafted, spec_accepted; /* this request's totals (logged at its end) */
    /* this step */
    int chunk;       /* tokens in the batch (1 + n_draft when decoding with a draft) */
    int batch_row;   /* the batch row of its first token */
    int logit_index; /* first row in logits, or -1 */
    int n_draft;     /* drafted tokens, stored past the end at tokens[n_tokens..] */
} sequence;

typedef struct state_snapshot {
    uint64_t hash; /* chain hash of the block the state follows (0: unused) */
    uint64_t used; /* last use, for LRU replacement */
} state_snapshot;

/* One step of an overlapped pipeline, from its plan until its results are applied (every rank
 * keeps its own copy; see engine_dist.c). */
typedef struct step_record {
    int64_t step;             /* the step held (-1: none yet) */
    int n_members, n_tokens, n_logits;
    uint64_t *serials;        /* [max_sequences] members, by sequence serial */
    int32_t *chunks, *logit_index; /* [max_sequences] */
    sampler_result *samples;  /* [max_sequences] the step's tokens, by logit row */
    int64_t inputs_step;      /* step whose inputs (rank 0's requests/cancels) are held, or -1 */
    unsigned char *inputs;
    size_t inputs_len, inputs_cap;
} step_record;

/* Multi-rank state (engine_dist.c); e->dist == NULL in a single-process engine. */
typedef struct engine_dist_state {
    int rank, size;
    engine_parallel parallel;
    int head_rank;      /* the rank that holds the lm_head and samples */
    int head_constrains; /* the sampling rank can build constraints (engine_options.make_constraint) */
    int timeout_ms;
    /* rank 0: requests and cancellations since the last step, serialized in call order; every
     * rank applies them at the start of the next step, so all hold the same sequences */
    unsigned char *inputs;
    size_t inputs_len, inputs_cap;
    int queued_submits;
    int agreed;         /* the ranks agreed at open: steps (and the shutdown) may follow */
    int shut_down;      /* rank 0 closed its engine: followers stop */
    _Atomic int stop_following; /* engine_stop_following (from another thread) */
    float *hidden;      /* pipeline: [max_batch_tokens][dim] hidden states between stages */
    float *part_logits; /* tensor: [max_sequences][a rank's vocab share] lm_head outputs */
    /* overlapped pipeline: one step per stage in flight */
    int overlap;
    int64_t tick;       /* engine_step calls so far: the same count on every rank */
    float *hidden_in;   /* [max_batch_tokens][dim] received for the next step */
    transformer_batch staged; /* ranks > 0: the step planned for the next tick's forward */
    step_record *ring;  /* steps by index % ring_size */
    int ring_size;
} engine_dist_state;

struct engine {
    engine_info info;
    model_config cfg;
    safetensors_set *st;
    model_weights w;
    compute_backend *be;
    sample_params *backend_params;   /* [max_sequences] the backend sampler's rows */
    sample_result *backend_results;  /* [max_sequences] */
    transformer *tf;
    kv_cache *kv;
    int max_batch_tokens, max_sequences, block_size;
    sequence **seqs; /* live sequences in arrival order */
    int n_seqs;
    uint64_t *cancelled; /* ids to report as cancelled at the next step */
    int n_cancelled, cancelled_cap;
    uint64_t preemptions;
    /* batch staging (host) */
    int32_t *b_tokens, *b_positions, *b_seq, *b_slots, *b_table_start, *b_logit_rows;
    int32_t *b_tables;
    int b_tables_cap;
    /* hybrid models: recurrent-state slots (one per running sequence, max_sequences of them,
     * and with speculation one more each for the state before a verifying step) */
    int hybrid;
    int32_t *free_slots;      /* stack of unused slots */
    int n_free_slots;
    int n_sequence_slots;     /* slots [0, n_sequence_slots) belong to sequences */
    int32_t *b_state_slots;   /* [max_sequences] slot of each batch member */
    /* hybrid prefix cache: the recurrent state after a prefix, at block boundaries, by the chain
     * hash of the prefix's last block; snapshot i lives in state slot n_sequence_slots + i */
    state_snapshot *snapshots;
    int n_snapshots;
    uint64_t snapshot_tick;
    sequence **b_members;
    float *logits;            /* [max_logit_rows][vocab] (the sampling rank only) */
    sampler_result *samples;  /* [max_logit_rows] this step's sampled tokens, by logit row */
    int max_logit_rows;       /* max_sequences, plus room for verifying drafts */
    /* speculative decoding (speculative.c); drafter NULL: off */
    drafter *drafter;
    int drafter_owned;        /* made from options.speculative: destroyed by engine_close */
    int spec_tokens;          /* the most drafted tokens per sequence and step */
    drafter_query *spec_queries; /* [max_sequences] */
    sequence **spec_asking;      /* [max_sequences] the sequence of each query */
    uint64_t spec_verifies, spec_drafted, spec_accepted;
    float *spec_hidden;          /* [spec_hidden_rows][dim] hidden states handed to the drafter */
    int spec_hidden_rows;
    sampler_scratch sampler;
    /* distribution */
    struct dist_group *dist;  /* NULL: this process runs the whole model */
    engine_constraint_maker make_constraint; /* the sampling rank's, for constraint_spec */
    void *make_constraint_ctx;
    engine_dist_state d;
    int failed;               /* a rank failed: every later step fails at once */
    char error[256];          /* why (engine_last_error) */
    uint64_t steps, step_ns, comm_ns; /* timing totals (engine_get_stats) */
    uint64_t next_serial;
    int pipeline_steps;       /* > 1: steps in flight at once (a pipeline's stages), see plan */
};

/* ---- engine.c, used by engine_dist.c ---- */
void engine_set_error(engine *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Adds a checked request to the live sequences (every rank, same order). 0, or -1 when out of
 * memory. */
int engine_add_sequence(engine *e, uint64_t seq_id, const engine_request *r);
/* Removes a live sequence and queues its cancellation event (unknown ids: nothing). */
void engine_cancel_local(engine *e, uint64_t seq_id);
/* The step after its inputs are applied: plan, forward, sample, events. */
int engine_step_local(engine *e, engine_event *events, int max_events);
/* Reports queued cancellations as events, at most `limit`; returns how many. */
int engine_report_cancelled(engine *e, engine_event *events, int limit);
/* Plans this step's batch (at most cap sequences) and stages it into *b; marks the members in
 * flight. draft_room: events the step may add for drafted tokens (0: no speculation). Returns the member count (e->b_members), 0 when there is nothing to run (an error event
 * may be added: a request the cache can never hold), or -1. */
int engine_plan_step(engine *e, int cap, int draft_room, transformer_batch *b,
                     engine_event *events, int *n_ev);
/* Applies a member's finished step: its chunk is computed, its sampled token (samples[logit_index]
 * when logit_index >= 0) appended; adds its event (tokens always, progress while there is room)
 * and removes it when finished. chunk 0 and no logits: a prefill chunk an overlapped pipeline
 * counted at its plan (only the event is left). */
void engine_finish_member(engine *e, sequence *s, int chunk, int logit_index,
                          const sampler_result *samples, engine_event *events, int *n_ev,
                          int max_events);
/* The live sequence with this serial, or NULL (cancelled or finished since). */
sequence *engine_find_serial(engine *e, uint64_t serial);
/* What the sampler needs of s, with the first n_history of its tokens as the history. */
sampler_input engine_sampler_input(const sequence *s, int n_history);
/* Samples the next token of every batch member that has logits into e->samples. */
void engine_sample_all(engine *e, int n_members);
/* This process's forward of b (every layer, or a pipeline stage's); holding the head, then
 * every member's token into e->samples, sampled on the backend where it can (a GPU: only the
 * ids come back, not the logits), else on the host. A stage without the head puts its hidden
 * states in hidden. 0; -1 with err (the forward failed); 1 when sampling failed (e's error set). */
int engine_forward_local(engine *e, int n_members, const transformer_batch *b, float *hidden,
                         char *err, size_t errlen);

/* Frees a sequence and its blocks (it must be off the live list). */
void engine_free_sequence(engine *e, sequence *s);
/* Stages e->b_members[0..n_members) with their chunks into *b (the flat batch of a forward).
 * 0, or -1 when out of memory. */
int engine_stage_batch(engine *e, int n_members, transformer_batch *b);
/* Gives s blocks for positions < n_pos. Returns 0, or -1 when the cache ran out (s keeps what
 * it got). */
int engine_ensure_blocks(engine *e, sequence *s, int n_pos);

/* ---- speculative.c ---- */
/* At open: the drafter from options (made from o->speculative, or the caller's o->drafter) and
 * how many logit rows verification may add (*extra_rows). 0, or -1 with err. */
int spec_open(engine *e, const engine_options *o, int *extra_rows, char *err, size_t errlen);
void spec_close(engine *e);
/* A new sequence's speculation settings from its request. */
void spec_init_sequence(const engine *e, sequence *s, const engine_request *r);
/* After planning: gives decoding members drafted tokens (chunk 1 + n_draft) within the step's
 * token budget, the logit rows and event_room events. */
void spec_plan_drafts(engine *e, int n_members, int event_room);
/* Samples a member with drafts: verifies its drafted tokens row by row and writes the tokens it
 * keeps plus the model's own next one to samples[logit_index..]; the rows after those get token
 * -1 (they travel to the other ranks too). */
void spec_verify_member(engine *e, sequence *s);
/* How many tokens a member with drafts produced, from its verified rows (samples[logit_index..]):
 * 1 to 1 + n_draft. */
int spec_emitted(const sequence *s, const sampler_result *rows);
/* Before a member's verified step is applied: a hybrid whose drafts were not all kept gets its
 * recurrent state back from before the step (it holds the rejected drafts); returns 1 then (the
 * step computed nothing that stays: the next one recomputes its kept tokens), else 0. */
int spec_rollback_state(engine *e, sequence *s, int n_accepted);
/* After a member's verified step is applied: adapts its k, counts the statistics and frees the
 * blocks that only rejected drafts used. */
void spec_after_member(engine *e, sequence *s, int n_accepted);
/* After a member's step is applied: a drafter that reads hidden states (MTP) gets those of the
 * positions [first, s->n_computed) the step computed for good. */
void spec_observe(engine *e, const sequence *s, int first);
/* The sequence is gone (finished, cancelled): tells the drafter, logs its acceptance. */
void spec_forget_sequence(engine *e, const sequence *s);

/* ---- engine_dist.c ---- */
/* Before loading: records the group and this rank's part of the model in *shard. */
int engine_dist_init(engine *e, const engine_options *o, model_shard *shard, char *err,
                     size_t errlen);
/* After the transformer exists: installs the tensor-parallel all-reduce, allocates buffers. */
int engine_dist_start(engine *e, char *err, size_t errlen);
/* At open: checks the ranks agree on the scheduler's settings and the shard layout, and lowers
 * *n_blocks to the smallest KV cache of any rank (every rank schedules the same blocks). */
int engine_dist_agree(engine *e, int *n_blocks, char *err, size_t errlen);
int engine_dist_queue_submit(engine *e, uint64_t seq_id, const engine_request *r, char *err,
                             size_t errlen);
void engine_dist_queue_cancel(engine *e, uint64_t seq_id);
/* Start of a step: rank 0 sends its queued inputs, every rank applies them. *max_events becomes
 * rank 0's (plans depend on it, clamped to ENGINE_DIST_MAX_EVENTS); d.shut_down is set when rank
 * 0 closed its engine. 0, or -1 on a failed rank (engine_last_error). */
int engine_dist_exchange_inputs(engine *e, int *max_events);
/* One step of an overlapped pipeline (every stage busy with its own step; engine_dist.c). */
int engine_dist_tick(engine *e, engine_event *events, int max_events);
/* Forward over this rank's part of the model, then the sampling rank's tokens to every rank. */
int engine_dist_forward(engine *e, int n_members, const transformer_batch *b);
void engine_dist_close(engine *e);

#endif
