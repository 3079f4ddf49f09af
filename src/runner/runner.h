/* runner — the model runner process's main loop: load a model with the engine, then serve the
 * node's generation requests (runner/protocol.h) over one socket, many at once: render the chat
 * template, tokenize, submit, step the engine, detokenize, cut at stop strings, split reasoning
 * and tool calls with the output parser, and stream deltas back.
 *
 * Several runners can hold one model together (runner_options.dist): every rank connects to the
 * instance's data plane and opens its shard; rank 0 then serves as above, the others follow its
 * steps until it shuts down. A failed rank ends rank 0's live sequences with an error (within
 * the data plane's timeout) and the runner exits non-zero, like an engine failure.
 *
 * It refuses: talking HTTP, knowing about API formats, and running without a node (the socket
 * closing ends the process). */
#ifndef EXO_RUNNER_RUNNER_H
#define EXO_RUNNER_RUNNER_H

#include "dist/dist.h"
#include "infer/engine.h"

#include <stddef.h>

/* One rank of a model split over several runners (docs/distributed.md). Rank 0 serves the
 * node's requests; the other ranks only mirror its steps (they answer no "generate"). */
typedef struct runner_dist {
    int rank, size;             /* size 0 or 1: this runner holds the whole model */
    engine_parallel parallel;   /* ENGINE_PIPELINE or ENGINE_TENSOR */
    int layer_start, layer_end; /* pipeline: this rank's layers (0, 0 = an even split) */
    const dist_store *store;    /* the rendezvous (a directory for tests and bench; the cluster
                                   state in production): pluggable */
    const char *instance;       /* key prefix in the store: the instance id */
    const char *bind_host;      /* NULL = 127.0.0.1 */
    const char *advertise_host; /* NULL = bind_host */
    int timeout_ms;             /* every data-plane call (0 = 30000) */
    const char *transport;      /* "tcp" (NULL) or "ibverbs" (RDMA: the instance's MlxJaccl) */
} runner_dist;

typedef struct runner_options {
    int fd;                 /* the node's socket */
    const char *model_dir;  /* Hugging Face layout */
    const char *model_id;   /* for messages */
    size_t kv_cache_bytes;  /* 0 = automatic */
    const char *kv_cache_dtype; /* f16, bf16 or f32 (NULL = the engine's default) */
    const char *speculative; /* ngram, mtp, draft:DIR, off (NULL = off): engine_options.speculative */
    int spec_tokens;        /* most drafted tokens per step, 0 = the engine's default */
    const char *device;     /* cpu, cuda or auto (NULL = auto) */
    int n_threads;          /* 0 = all cores */
    runner_dist dist;
} runner_options;

/* Runs until shutdown or the node goes away. Returns the process exit code. */
int runner_run(const runner_options *options);

#endif
