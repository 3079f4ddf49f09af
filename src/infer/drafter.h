/* drafter — proposes the tokens a sequence is likely to continue with, for speculative decoding.
 *
 * The engine (engine.c, speculative.c) asks a drafter for up to k tokens per decoding sequence,
 * scores those k tokens plus one more in the same batched forward as every other sequence, and
 * keeps the longest prefix the model itself would have produced (greedy: exact match; sampling:
 * the speculative-sampling rejection rule), so a drafter can only change the speed, never the
 * output. Every drafter here is deterministic: its proposal is a single token per position (a
 * point mass), which is what the engine's acceptance rule assumes.
 *
 * Drafters:
 *   ngram  prompt lookup: the tokens that followed the latest earlier occurrence of the
 *          sequence's last few tokens (no weights; code edits, RAG and summaries repeat text);
 *   draft  a second, smaller model with the same tokenizer, run greedily (its own paged KV cache,
 *          rolled back to the accepted tokens on the next call);
 *   oracle the continuation of known token sequences (a benchmark's 100%-acceptance drafter: the
 *          model's own greedy output, recorded beforehand).
 *   mtp    the checkpoint's multi-token-prediction head (Qwen3-Next / Qwen3.5 mtp.*): one
 *          decoder layer over the target's hidden state at position p and the token at p + 1
 *          predicts the token at p + 2, then runs on its own output for the next drafts (its
 *          own one-layer paged KV cache; the hidden states come through `observe`).
 *
 * Refuses: text; a drafter sees token ids only. Not thread-safe: the engine's thread calls it. */
#ifndef EXO_INFER_DRAFTER_H
#define EXO_INFER_DRAFTER_H

#include <stddef.h>
#include <stdint.h>

/* One sequence asking for a draft. */
typedef struct drafter_query {
    uint64_t serial;       /* the engine's id for the sequence, unique for the engine's life */
    const int32_t *tokens; /* prompt + output so far (every token the model has accepted) */
    int n_tokens;
    int max_draft;         /* propose at most this many (>= 1) */
    int32_t *draft;        /* [max_draft] out: the proposed continuation */
    int n_draft;           /* out: how many were proposed (0: no guess) */
} drafter_query;

typedef struct drafter drafter;
struct drafter {
    const char *name; /* "ngram", "draft", "oracle", ... (logs, bench output) */
    /* Fills draft/n_draft of every query (all sequences of one step together, so a model can
     * batch them). Returns 0, or -1 with err when the drafter failed (the engine then decodes
     * without drafts; a failure never changes the output). */
    int (*propose)(drafter *d, drafter_query *queries, int n_queries, char *err, size_t errlen);
    /* The target computed positions [first, first + n) of sequence `serial` (a prefill chunk,
     * a decode step with its kept drafts); hidden holds their hidden states after the last
     * layer, before the final norm, [n][the model's hidden size], host memory valid during the
     * call. Positions before `first` that were never observed came from the prefix cache. Called
     * for every speculating sequence after each step, before the next propose. May be NULL (the
     * engine then skips fetching hidden states). */
    void (*observe)(drafter *d, uint64_t serial, int first, int n, const float *hidden);
    /* The sequence ended: drop whatever the drafter keeps for it. May be NULL. */
    void (*release)(drafter *d, uint64_t serial);
    void (*destroy)(drafter *d);
};

/* Prompt lookup: matches the last max_ngram down to min_ngram tokens (defaults 3 and 2 when 0). */
drafter *drafter_ngram_create(int max_ngram, int min_ngram);

/* Drafts from known sequences: a query whose tokens are a prefix of one of them gets what
 * follows. drafter_oracle_add copies the sequence; returns 0, or -1 when out of memory. */
drafter *drafter_oracle_create(void);
int drafter_oracle_add(drafter *d, const int32_t *tokens, int n_tokens);

/* A small model of the same tokenizer in model_dir, run greedily on `device` with n_threads.
 * vocab_size is the target model's: a draft model with a different vocabulary is refused.
 * max_sequences and context_length bound the sequences it drafts for (its KV cache holds them). */
typedef struct drafter_model_options {
    const char *model_dir;
    const char *device;
    int n_threads;
    int max_sequences;
    int context_length;
    int vocab_size;
} drafter_model_options;
drafter *drafter_model_create(const drafter_model_options *o, char *err, size_t errlen);

/* The MTP head of the target engine's checkpoint (which must have one: mtp.*), sharing its
 * weights (embedding, lm_head), backend and threads. */
struct engine;
drafter *drafter_mtp_create(struct engine *target, char *err, size_t errlen);

#endif
