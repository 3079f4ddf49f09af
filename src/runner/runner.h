/* runner — the model runner process's main loop: load a model with the engine, then serve the
 * node's generation requests (runner/protocol.h) over one socket, many at once: render the chat
 * template, tokenize, submit, step the engine, detokenize, cut at stop strings, split reasoning
 * and tool calls with the output parser, and stream deltas back.
 *
 * It refuses: talking HTTP, knowing about API formats, and running without a node (the socket
 * closing ends the process). */
#ifndef EXO_RUNNER_RUNNER_H
#define EXO_RUNNER_RUNNER_H

#include <stddef.h>

typedef struct runner_options {
    int fd;                 /* the node's socket */
    const char *model_dir;  /* Hugging Face layout */
    const char *model_id;   /* for messages */
    size_t kv_cache_bytes;  /* 0 = automatic */
    const char *device;     /* cpu, cuda or auto (NULL = auto) */
    int n_threads;          /* 0 = all cores */
} runner_options;

/* Runs until shutdown or the node goes away. Returns the process exit code. */
int runner_run(const runner_options *options);

#endif
