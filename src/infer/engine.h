/* engine — the inference runtime's public door: load a model (or a shard of one), accept
 * generation requests as token ids, and advance all of them together one batched step at a time.
 *
 * Used by the runner process (runner/) and by `exo run` / `exo bench`. Text never crosses this
 * door: callers tokenize, render chat templates and detokenize (text/). One engine instance is
 * driven by one thread: engine_submit/engine_cancel/engine_step are not thread-safe with each
 * other; the engine uses its own worker threads inside a step.
 *
 * Scheduling (continuous batching, chunked prefill, paged KV cache, prefix cache, preemption) is
 * the engine's business; a caller only submits, cancels and steps.
 *
 * Several ranks (processes) can run one model together (docs/distributed.md): pipeline parallel
 * (each rank holds a layer range) or tensor parallel (each rank holds a slice of every layer).
 * Rank 0 is the door: engine_submit / engine_cancel / engine_step as above. Every other rank
 * calls engine_follow, which mirrors rank 0's steps until rank 0's engine_close. Each step, rank
 * 0 sends the requests and cancellations it received since the last one; every rank runs the
 * same deterministic scheduler on the same KV cache capacity, so they agree on the batch, the
 * block tables and the prefix-cache hits without shipping them; the rank holding the lm_head
 * samples and sends the tokens to the others. A dead or silent rank fails the step within the
 * data plane's timeout (engine_step returns -1, engine_last_error says why). */
#ifndef EXO_INFER_ENGINE_H
#define EXO_INFER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#define ENGINE_MAX_TOP_LOGPROBS 20

typedef struct engine engine;

struct dist_group; /* dist/dist.h */
struct drafter;    /* infer/drafter.h */

#define ENGINE_SPEC_DEFAULT_TOKENS 4
#define ENGINE_SPEC_MAX_TOKENS 16

typedef enum engine_parallel {
    ENGINE_SINGLE = 0, /* one process runs the whole model */
    ENGINE_PIPELINE,   /* each rank holds layers [layer_start, layer_end); ranks in layer order */
    ENGINE_TENSOR,     /* each rank holds 1/size of every layer (heads, FFN and expert dims) */
} engine_parallel;

/* A constraint on what a sequence may generate (structured outputs): before each sample the
 * engine lets it mask the logits of the tokens that may not come next, and tells it the token
 * chosen. The engine knows nothing of what it enforces (the runner binds grammars, text/grammar.h,
 * to it). Several ranks: the rank that samples may be another process (a pipeline's last stage),
 * so a constraint travels as its description (engine_request.constraint_spec) and the sampling
 * rank rebuilds it with its engine_options.make_constraint; rank 0 releases the caller's at once. */
typedef struct engine_constraint {
    /* Sets logits[t] = -INFINITY for every token t that may not come next (n = vocab size). */
    void (*mask)(void *ctx, float *logits, int n);
    /* The token sampled after mask (or an eos the sampler chose). */
    void (*accept)(void *ctx, int32_t token);
    /* The sequence is gone (finished, cancelled or failed); called once. */
    void (*release)(void *ctx);
    void *ctx; /* NULL: no constraint */
} engine_constraint;

/* Builds the constraint that spec describes (engine_request.constraint_spec) for one sequence.
 * 0, or -1 with err. */
typedef int (*engine_constraint_maker)(void *ctx, const char *spec, engine_constraint *out,
                                       char *err, size_t errlen);

typedef struct engine_options {
    const char *model_dir;  /* Hugging Face layout: config.json, *.safetensors, tokenizer files */
    int n_threads;          /* 0 = all cores */
    size_t kv_cache_bytes;  /* 0 = automatic (a fraction of free memory) */
    const char *kv_cache_dtype; /* "f16" (NULL = default), "bf16" or "f32" */
    int max_batch_tokens;   /* tokens per forward step (prefill chunk), 0 = default 512 */
    int max_sequences;      /* concurrent sequences, 0 = default 64 */
    int context_length;     /* 0 = the model's own max_position_embeddings */
    /* Pipeline shard: layers [layer_start, layer_end) of the model; both 0 = the whole model (or,
     * with ENGINE_PIPELINE, an even split by rank). */
    int layer_start, layer_end;
    const char *device;     /* "cpu", "cuda" or "auto" (NULL = auto: the GPU when there is one;
                               tensor parallel runs on the CPU: auto picks it, cuda is refused) */
    /* Several ranks: the connected data plane of this instance (the caller keeps it and closes
     * it after engine_close), and how the model is split. NULL / ENGINE_SINGLE: one process. */
    struct dist_group *dist;
    engine_parallel parallel;
    int dist_timeout_ms;    /* the timeout the group was connected with (0 = 30000): rank 0
                               keeps idle followers alive well within it */
    int pipeline_serial;    /* pipeline: one step at a time through all stages (else each stage
                               works on its own step; the default) */
    /* Speculative decoding (docs/engine.md): "ngram", "draft:DIR" (a small model of the same
     * tokenizer), or NULL / "off". A caller-made drafter (e.g. an oracle) goes in `drafter`
     * instead; the caller keeps it and destroys it after engine_close. spec_tokens: the most
     * tokens drafted per sequence and step (0 = 4, at most ENGINE_SPEC_MAX_TOKENS); the engine
     * adapts it per sequence to the acceptance rate. Several ranks: every rank drafts, so each
     * needs the same setting (checked at open); "draft:DIR" is off there. */
    const char *speculative;
    struct drafter *drafter;
    int spec_tokens;
    /* Several ranks: how the sampling rank turns a request's constraint_spec into a constraint
     * (every rank of an instance sets it alike; NULL: constrained requests are refused). */
    engine_constraint_maker make_constraint;
    void *make_constraint_ctx;
} engine_options;

typedef struct sampling_params {
    float temperature;        /* 0 = greedy (argmax) */
    float top_p;              /* 1 = off */
    int top_k;                /* 0 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off; applied over the last repetition_window tokens */
    int repetition_window;    /* 0 = whole context */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    uint64_t seed;            /* same seed + same request -> same output */
    int logprobs;             /* report the sampled token's logprob */
    int top_logprobs;         /* 0..ENGINE_MAX_TOP_LOGPROBS alternatives to report */
} sampling_params;

/* The defaults every API starts from (temperature 0.7, top_p 1, min_p 0.05, seed 42 as exo). */
sampling_params sampling_params_default(void);

typedef struct engine_request {
    const int32_t *prompt; /* copied by engine_submit */
    int n_prompt;
    sampling_params sampling;
    int max_tokens;              /* > 0 */
    const int32_t *stop_tokens;  /* extra stop ids besides the model's eos ids; copied */
    int n_stop_tokens;
    int ban_eos;                 /* never sample eos/stop ids: exactly max_tokens (benchmarks) */
    int no_prefix_cache;         /* do not reuse or store cached prefixes for this request */
    engine_constraint constraint; /* ctx NULL: none. On success the engine owns it (release);
                                     on failure the caller still does */
    const char *constraint_spec; /* what `constraint` enforces, as text make_constraint reads
                                    (the runner: the grammar); copied. Needed with several
                                    ranks, ignored by one process */
    int spec_tokens;             /* speculation: 0 = the engine's setting, -1 = none for this
                                    request, n > 0 = at most n drafted tokens per step */
} engine_request;

typedef enum engine_finish {
    ENGINE_FINISH_NONE = 0,  /* more tokens follow */
    ENGINE_FINISH_STOP,      /* eos or a stop token was produced (the token is included) */
    ENGINE_FINISH_LENGTH,    /* max_tokens or the context length reached */
    ENGINE_FINISH_CANCELLED, /* engine_cancel */
    ENGINE_FINISH_ERROR,     /* see engine_event.error */
} engine_finish;

/* One thing that happened to one sequence during a step. */
typedef struct engine_event {
    uint64_t seq_id;
    int32_t token;      /* the generated token, or -1 for events without one (progress, cancel) */
    float logprob;      /* of `token` under the sampled distribution (after temperature etc.);
                           0 unless sampling.logprobs or top_logprobs asked for it */
    int n_top;
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
    float top_logprobs[ENGINE_MAX_TOP_LOGPROBS];
    engine_finish finish;
    int prompt_tokens;        /* set on every event */
    int cached_tokens;        /* prompt tokens served from the prefix cache */
    int prefill_done;         /* prompt tokens processed so far (progress events) */
    char error[160];          /* when finish == ENGINE_FINISH_ERROR */
} engine_event;

typedef struct engine_info {
    char architecture[64];  /* e.g. "Qwen3ForCausalLM" */
    int vocab_size;
    int context_length;     /* longest prompt + output the engine accepts */
    int n_layers;           /* of the whole model */
    int32_t eos_ids[8];
    int n_eos;
    int32_t bos_id;         /* -1 if none */
    size_t weight_bytes;    /* bytes of weights this engine reads per token */
    char device[128];       /* what runs the model: "cpu", or "cuda (GPU name, memory)" */
    int on_gpu;             /* the CUDA backend */
} engine_info;

engine *engine_open(const engine_options *options, char *err, size_t errlen);
void engine_close(engine *e);
const engine_info *engine_get_info(const engine *e);

/* Queues a request. Returns 0, or -1 with err (e.g. prompt longer than the context). seq_id is
 * the caller's and must be unique among live sequences. */
int engine_submit(engine *e, uint64_t seq_id, const engine_request *request, char *err,
                  size_t errlen);
/* Cancels a queued or running sequence; its KV blocks are freed at once. A
 * ENGINE_FINISH_CANCELLED event is reported by the next engine_step. Unknown ids are ignored. */
void engine_cancel(engine *e, uint64_t seq_id);
/* Runs one batched forward step over the live sequences and writes up to max_events events.
 * With speculation a sequence can get several tokens (several events, in order) in one step;
 * the engine drafts only as many tokens as max_events leaves room for.
 * Returns the number written (0 when idle), or -1 on a fatal engine error (engine_last_error).
 * Rank 0 of several: every call is a step of all ranks, even an idle one. */
int engine_step(engine *e, engine_event *events, int max_events);
/* Rank 0 of several: while idle, call engine_step at least this often (ms) so the other ranks'
 * wait for the next step stays within the data plane's timeout. -1 when there is nothing to
 * keep alive (one process). */
int engine_idle_step_ms(const engine *e);
/* Ranks other than 0: runs rank 0's steps until it closes its engine (returns 0), a rank fails
 * (returns -1, engine_last_error says why) or engine_stop_following is called (returns 0 after
 * the step in progress: at most about engine_idle_step_ms of rank 0 while it is idle). */
int engine_follow(engine *e);
/* Asks engine_follow to return; the one call that may come from another thread. Leaving breaks
 * the instance: rank 0's next step fails (the other ranks cannot go on without this one). */
void engine_stop_following(engine *e);
/* The drafter speculation uses ("ngram", "draft", ... ) or NULL when it is off. */
const char *engine_speculative(const engine *e);
/* Why the last failing call failed ("" if none). */
const char *engine_last_error(const engine *e);
/* Number of sequences queued or running. */
int engine_pending(const engine *e);

/* Scheduler and cache state, for /metrics and tests. */
typedef struct engine_stats {
    int n_running;       /* sequences holding KV blocks this step */
    int n_waiting;       /* queued (not yet admitted, or preempted) */
    int kv_blocks_total;
    int kv_blocks_free;  /* allocatable now: unused + cached (evictable) */
    int kv_blocks_cached; /* unused blocks kept for the prefix cache */
    int kv_block_tokens; /* tokens per block */
    uint64_t preemptions; /* since open */
    /* time since open: steps run, their wall time, and the part spent waiting on other ranks
     * (collectives, sends, receives: communication plus their compute imbalance) */
    uint64_t steps, step_ns, comm_ns;
    /* speculative decoding since open: forwards that verified drafts (one per sequence and
     * step), tokens drafted, drafted tokens accepted */
    uint64_t spec_verifies, spec_drafted, spec_accepted;
} engine_stats;
void engine_get_stats(const engine *e, engine_stats *out);

#endif
