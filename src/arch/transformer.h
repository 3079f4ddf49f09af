/* transformer — the forward pass shared by every supported family (Llama/Mistral, Qwen2, Qwen3,
 * Qwen3-MoE, gpt-oss, the Qwen3-Next / Qwen3.5 hybrids), written over compute_backend ops so it
 * runs on any backend. Families differ only where the math differs: q/k/v biases (Qwen2),
 * per-head q/k RMSNorm (Qwen3), sparse MoE MLP; for gpt-oss o_proj and router biases, attention
 * sinks, a sliding window on the layers layer_types names, and biased experts with a clamped
 * SwiGLU (backend features it checks); for the hybrids GatedDeltaNet layers in place of attention
 * in most layers, a sigmoid output gate on attention, (1 + w) norms and a gated shared expert.
 *
 * Hybrid models carry a recurrent state per sequence (conv inputs + the delta rule's matrix per
 * linear layer), kept here in `max_logits` slots: the caller says which slot each sequence of a
 * batch continues (transformer_batch.state_slots); a sequence whose first token in the batch is
 * at position 0 starts from a zero state, so a new or recomputed sequence needs no reset call.
 * A prefix can therefore not be skipped through the KV cache alone (infer/ does not reuse cached
 * prefixes for these models).
 *
 * One call processes a flat batch of tokens from many sequences (a prefill chunk of one and
 * decode steps of others together): token ids, positions, and per-sequence block tables into
 * the paged KV cache (the caller, infer/, owns the cache and its bookkeeping).
 *
 * Shard-aware: a transformer holds layers [layer_start, layer_end). The first stage embeds
 * tokens; later stages take hidden states; the last stage returns logits, others hidden states.
 * Tensor parallel (weights loaded as a tensor-parallel slice, see model/weights.h): each rank
 * computes its heads and its share of the FFN; the partial outputs of o_proj and of the MLP's
 * down projection are summed across ranks by the all-reduce the caller installs
 * (transformer_set_allreduce): two per layer. The residual stream is whole on every rank.
 *
 * Refuses: loading what the config does not describe; batches over max_tokens. */
#ifndef EXO_ARCH_TRANSFORMER_H
#define EXO_ARCH_TRANSFORMER_H

#include "compute/backend.h"
#include "model/model_config.h"
#include "model/weights.h"

typedef struct transformer transformer;

/* One forward step's inputs (host memory; copied to the backend by transformer_forward). */
typedef struct transformer_batch {
    int n_tokens;
    const int32_t *tokens;            /* [n_tokens] (first stage) */
    const float *hidden_in;           /* [n_tokens][dim] (other stages), else NULL */
    const int32_t *positions;         /* [n_tokens] */
    const int32_t *seq_of_token;      /* [n_tokens] index of the token's sequence in this batch */
    const int32_t *slots;             /* [n_tokens] KV cache slot the token is written to */
    int n_seqs;
    const int32_t *block_table_start; /* [n_seqs] offsets into block_tables */
    const int32_t *block_tables;      /* [n_block_entries] */
    int n_block_entries;
    int n_logits;                     /* last stage: tokens whose logits are wanted */
    const int32_t *logit_rows;        /* [n_logits] indices into the batch */
    const int32_t *state_slots;       /* [n_seqs] hybrid models: each sequence's recurrent-state
                                         slot (< max_logits); NULL: sequence i uses slot i */
} transformer_batch;

/* Builds the forward for `w` (which must outlive it) on backend `be`. max_tokens bounds
 * n_tokens per call, max_logits bounds n_logits (and the recurrent-state slots of a hybrid).
 * NULL with err when out of memory, or for a hybrid on a backend without its ops. */
transformer *transformer_create(const model_config *c, const model_weights *w,
                                compute_backend *be, int max_tokens, int max_logits, char *err,
                                size_t errlen);
void transformer_destroy(transformer *t);

/* Whether `be` implements every op variant the model needs (gpt-oss: attention sinks and windows,
 * biased clamped-SwiGLU experts). Returns 0, or -1 with err naming what is missing. */
int transformer_backend_check(const model_config *c, const compute_backend *be, char *err, size_t errlen);
/* Hybrid models: makes room for n recurrent-state slots (the first max_logits are there from
 * transformer_create; more hold snapshots for the prefix cache). Existing slots keep their state.
 * Returns 0, or -1 with err when out of memory (the old slots stay). */
int transformer_reserve_state_slots(transformer *t, int n, char *err, size_t errlen);
/* Hybrid models: copies every local linear layer's recurrent state of slot src into slot dst. */
void transformer_copy_state(transformer *t, int dst_slot, int src_slot);

/* Sums n floats of backend memory in place across the tensor-parallel ranks (every rank gets
 * the same sum). Returns 0, or -1 with err (a rank died or timed out). */
typedef int (*transformer_allreduce_fn)(void *ctx, float *buf, size_t n, char *err, size_t errlen);
/* Installs the all-reduce of a tensor-parallel shard (required when the weights are a slice). */
void transformer_set_allreduce(transformer *t, transformer_allreduce_fn fn, void *ctx);

/* Runs the layers over the batch, writing K/V of every token into `kv` (one kv_layer per local
 * layer). Last stage: out = logits [n_logits][lm_head rows] (the whole vocabulary, or a tensor-
 * parallel rank's share of it); otherwise hidden [n_tokens][dim]. Host memory; a last stage's
 * out may be NULL: the logits stay in backend memory (transformer_logits). Returns 0, or -1
 * with err (bad batch, failed all-reduce). */
int transformer_forward(transformer *t, const kv_layer *kv, int block_size,
                        const transformer_batch *b, float *out, char *err, size_t errlen);
/* The last step's logits [n_logits][lm_head rows] in backend memory (transformer_forward with
 * out NULL leaves them there, for a backend that samples them: compute_backend.sample). */
float *transformer_logits(transformer *t);

/* Copies rows [row0, row0 + n) of the last step's final residual stream (every token's hidden
 * state after the last local layer, before the final norm) to host memory out [n][dim]: what a
 * drafter that reads the model's hidden states (MTP) gets. */
void transformer_hidden_rows(transformer *t, int row0, int n, float *out);

/* Inverse frequencies for rot_dims/2 rotary pairs and the cos/sin scale, per rope_scaling. */
void rope_inv_freq(const rope_config *r, int rot_dims, float *inv_freq, float *attn_factor);

#endif
