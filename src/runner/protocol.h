/* protocol — the small message types a node and its runner process exchange, and their framing.
 *
 * Transport: one SOCK_STREAM Unix socket per runner. The node makes it with socketpair() and
 * starts `exo runner --fd N --model DIR`, so no path on disk is involved and the runner's death is
 * seen by the node as EOF at once.
 *
 * Frame: 4-byte little-endian payload length (at most PROTOCOL_MAX_FRAME), then that many bytes
 * of one JSON object whose "type" says what it is:
 *
 *   node -> runner
 *     {"type":"generate","id":U64,"request":{gen_request}}   start a generation
 *     {"type":"cancel","id":U64}                             stop it; its KV cache is freed
 *     {"type":"shutdown"}                                    finish and exit 0
 *   runner -> node
 *     {"type":"status","status":"Loading","layers_loaded":N,"total_layers":N}
 *     {"type":"status","status":"WarmingUp"|"Ready","info":{context_length,architecture,n_layers}}
 *     {"type":"status","status":"Failed","error":"..."}          then the runner exits
 *     {"type":"accepted","id":U64,"prompt_tokens":N}              prompt rendered, tokenized, queued
 *     {"type":"progress","id":U64,"processed":N,"total":N}        prefill progress
 *     {"type":"alive","step_ms":N}     every second from a heartbeat thread; N = how long the engine
 *                                      step in progress has run (0 between steps): the node's
 *                                      watchdog restarts a runner that is silent or stuck in a step
 *     {"type":"delta","id":U64,"content"?,"reasoning"?,"tool_calls"?:[{id,name,arguments}],
 *      "logprobs"?:[{token,logprob,bytes:[..],top_logprobs:[{token,logprob,bytes}]}],"tokens":N}
 *     {"type":"done","id":U64,"finish_reason":"stop|length|tool_calls|cancelled|error",
 *      "stop_sequence"?,"error"?,"error_status"?,"usage":{prompt_tokens,completion_tokens,
 *      cached_tokens,reasoning_tokens},"stats":{prompt_tps,generation_tps,ttft_ms,peak_memory}}
 *     {"type":"kv_stats","blocks_total":N,"blocks_free":N,"blocks_cached":N,"block_tokens":N,
 *      "running":N,"waiting":N,"preemptions":N}   scheduler and KV cache state, on change
 *      (free counts cached blocks too: they are evictable; used = total - free)
 *   rendezvous of a multi-node instance (runner/store_node.h; only while the ranks connect)
 *     runner -> node {"type":"store_set","key":K,"value":HEX}   publish K for every rank
 *     runner -> node {"type":"store_get","key":K}
 *     node -> runner {"type":"store_value","key":K,"value"?:HEX} no value: not there yet
 *   A request rejected before it starts (e.g. prompt longer than the context) gets only "done"
 *   with finish_reason "error" and error_status 400.
 *
 * It refuses: frames over PROTOCOL_MAX_FRAME and payloads that are not JSON objects. */
#ifndef EXO_RUNNER_PROTOCOL_H
#define EXO_RUNNER_PROTOCOL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define PROTOCOL_MAX_FRAME (64u << 20)
#define GEN_MAX_STOP 16

/* One generation request, API-independent: every adapter produces this. */
typedef struct gen_request {
    char model[512];       /* the model id the client asked for */
    json_t *messages;      /* OpenAI-shaped messages array (owned), or NULL when prompt is set */
    json_t *tools;         /* OpenAI-shaped tools array (owned) or NULL */
    char *prompt;          /* raw prompt, no chat template (legacy completions, ollama raw) */
    int max_tokens;        /* 0 = as many as the context allows */
    /* Sampling: a negative value (or has_* = 0) means "the default". */
    double temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    int top_k;
    int has_seed;
    uint64_t seed;
    char *stop[GEN_MAX_STOP]; /* stop strings (owned) */
    int n_stop;
    int logprobs;          /* report logprobs of sampled tokens */
    int top_logprobs;      /* 0..20 alternatives */
    int enable_thinking;   /* -1 = model default, 0/1 */
    char reasoning_effort[8]; /* "low", "medium", "high", or "" = the template's default (gpt-oss) */
    int ban_eos;           /* exactly max_tokens (benchmarks) */
    int engine_only;       /* benchmarks: the runner only counts and times tokens (no detokenizing,
                              no deltas), so the engine's own pace is measured in the same process */
    int no_prefix_cache;
    /* Structured output: the whole output matches this GBNF grammar (text/grammar.h; owned),
     * NULL = free text. The API compiles response formats and forced tool calls into it. */
    char *grammar;
    /* The output is one tool call {"name":..,"arguments":{..}} (the grammar says which tools):
     * the runner reports it as a tool call, not as content. */
    int forced_tool_call;
    int spec_tokens;       /* speculative decoding: 0 = the instance's setting, -1 = none for this
                              request, n > 0 = at most n drafted tokens per step */
    int stream;            /* API-side only: answer as a stream */
} gen_request;

void gen_request_init(gen_request *r);
void gen_request_free(gen_request *r);
json_t *gen_request_to_json(const gen_request *r);
/* Returns 0, or -1 with err naming the bad field. */
int gen_request_from_json(const json_t *j, gen_request *r, char *err, size_t errlen);

/* Framing over a blocking fd. protocol_send: 0 or -1 (peer gone). protocol_recv: a new JSON
 * object, or NULL on EOF/error (err says which). */
int protocol_send(int fd, const json_t *message);
json_t *protocol_recv(int fd, char *err, size_t errlen);

/* Appends one framed message to out (for writers that batch several messages per write). */
struct strbuf;
void protocol_append(struct strbuf *out, const json_t *message);

/* Incremental decoder for non-blocking readers: feed bytes, pop complete messages. */
typedef struct protocol_reader {
    unsigned char *buf;
    size_t len, cap;
} protocol_reader;
void protocol_reader_feed(protocol_reader *r, const void *data, size_t n);
/* Returns the next message (new reference), NULL when none is complete yet; sets *bad = 1 on a
 * malformed stream (oversized frame or a payload that is not a JSON object). */
json_t *protocol_reader_next(protocol_reader *r, int *bad);
void protocol_reader_free(protocol_reader *r);

#endif
