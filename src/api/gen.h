/* gen — the one generation path every API adapter shares (private to api/).
 *
 * An adapter only translates: its request JSON -> gen_request (parse), and the runner's messages
 * -> its own wire format (stream for SSE/NDJSON frames, final for the non-streamed body,
 * error for its error shape). gen_handle does everything else: JSON parsing errors, model lookup
 * and auto-placement, submitting to the runner, waiting, accumulating the result, streaming,
 * keep-alive, client disconnect -> cancel, /v1/cancel, metrics.
 *
 * It refuses: generation logic inside adapters (no adapter sees the runner or a socket). */
#ifndef EXO_API_GEN_H
#define EXO_API_GEN_H

#include "api/api.h"
#include "worker/instances.h"
#include "api/router.h"
#include "base/strbuf.h"
#include "runner/protocol.h"

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

typedef struct gen_state gen_state;

/* How an API streams a response: its framing and the frames it writes. Adapters whose
 * endpoints stream alike (Ollama's /api/chat and /api/generate) share one. */
typedef struct gen_stream_format {
    enum gen_framing {
        GEN_FRAMING_SSE,   /* text/event-stream; SSE comments (keep-alive, prefill progress) */
        GEN_FRAMING_NDJSON /* application/x-ndjson */
    } framing;
    void (*begin)(gen_state *st, strbuf *out);
    /* A "delta" message from the runner (content/reasoning/tool_calls/logprobs). */
    void (*delta)(gen_state *st, const json_t *delta, strbuf *out);
    /* After "done": st->finish_reason etc. are set. */
    void (*end)(gen_state *st, strbuf *out);
    void (*error)(gen_state *st, const char *message, strbuf *out);
} gen_stream_format;

/* A stream format whose frames <prefix>_stream_begin, _delta, _end and _error write. */
#define GEN_STREAM_FORMAT(prefix, framing_)                                                        \
    {                                                                                              \
        .framing = (framing_), .begin = prefix##_stream_begin, .delta = prefix##_stream_delta,     \
        .end = prefix##_stream_end, .error = prefix##_stream_error                                 \
    }

/* An adapter table is one line, {name, id_prefix, parse, error, stream, final} in this order:
 * past the two strings every field has its own type, so the compiler refuses one in the wrong
 * place. */
typedef struct gen_adapter {
    const char *name;      /* metrics label: openai, completions, responses, claude, ollama */
    const char *id_prefix; /* of the response id: "chatcmpl-", "msg_", ... (gen_state_new) */
    /* Fills st->req from body. Returns 0, or an HTTP status with err (field named). */
    int (*parse)(const json_t *body, gen_state *st, char *err, size_t errlen);
    /* Answers an error in the API's own shape. */
    void (*error)(api_request *r, int status, const char *message);
    const gen_stream_format *stream;
    /* The non-streamed response body (new reference) from the accumulated st. */
    json_t *(*final)(gen_state *st);
} gen_adapter;

/* The Content-Type of a stream in this format. */
const char *gen_stream_content_type(const gen_stream_format *f);

struct gen_state {
    const gen_adapter *adapter;
    gen_request req;
    char id[64];     /* chatcmpl-..., msg_..., resp_... : also the /v1/cancel id */
    int64_t created; /* unix seconds */
    /* accumulated from the runner's messages */
    strbuf content, reasoning;
    json_t *tool_calls; /* [{id, name, arguments}] */
    json_t *logprobs;   /* [{token, logprob, bytes, top_logprobs}] */
    int prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens;
    char finish_reason[24]; /* stop|length|tool_calls|cancelled|error */
    char *stop_sequence;
    char *error;
    int error_status;
    json_t *stats;
    /* adapter scratch */
    int include_usage;  /* openai stream_options.include_usage */
    int bench;          /* /bench/chat/completions */
    int raw;            /* ollama generate raw / legacy completions */
    int sequence;       /* responses sequence_number, claude block index */
    int open_block;     /* claude/responses: kind of the open block (0 none) */
    int n_blocks;
    int n_tool_calls_streamed;
    json_t *scratch;    /* adapter-owned (freed with the state) */
    strbuf frame_prefix; /* adapter-owned: the constant head of its per-token frame */
    /* driver */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int accepted, done, stream_ready;
    json_t *backlog;
    api_stream *stream;
    instances *instances;
    uint64_t call_id;
    uint64_t t_start_ns, t_first_ns, t_last_ns;
    _Atomic int refs;
};

typedef struct gen_context {
    instances *instances;
    api_model_fetcher fetcher; /* models not on disk (see api.h); zeroed = none */
} gen_context;

/* A fresh state for one request (refcount 1) and its release; gen_handle uses these, and so do
 * tests and the fuzzer to drive an adapter's parse and encoders directly. */
gen_state *gen_state_new(const gen_adapter *adapter, instances *m);
void gen_state_release(gen_state *st);
/* The adapters' shared folding of one runner message into st (accepted/delta/done). */
void gen_state_accumulate(gen_state *st, const json_t *message);

/* Runs one generation request end to end with the given adapter. */
void gen_handle(api_request *r, const gen_adapter *adapter, gen_context *ctx, int bench);
/* POST /v1/cancel/{id}: 0 if a generation with that id was found and cancelled. */
int gen_cancel(const char *api_id);
/* A random id with a prefix, e.g. "chatcmpl-" + 24 hex. */
void gen_make_id(char *out, size_t n, const char *prefix);

/* ---- helpers for adapters: typed field reads that name the field in the error ---- */
/* Returns 0 (absent: *out untouched, or present and valid), or 400 with err. */
int gen_get_number(const json_t *o, const char *field, double lo, double hi, double *out,
                   char *err, size_t errlen);
int gen_get_int(const json_t *o, const char *field, long lo, long hi, long *out, char *err,
                size_t errlen);
int gen_get_bool(const json_t *o, const char *field, int *out, char *err, size_t errlen);
/* A reasoning effort (OpenAI reasoning_effort, Responses reasoning.effort, Ollama think, Claude
 * output_config.effort): "none" turns thinking off; "minimal"/"low", "medium", "high" go to the
 * chat template as reasoning_effort (gpt-oss) and turn thinking on unless the request said
 * otherwise. NULL: nothing. Returns 0, or 400 with err naming `field`. */
int gen_set_reasoning_effort(gen_request *q, const char *effort, const char *field, char *err, size_t errlen);
/* A required string field. */
int gen_get_model(const json_t *o, gen_state *st, char *err, size_t errlen);
/* stop: string or array of strings. */
int gen_get_stop(const json_t *o, const char *field, gen_request *req, char *err, size_t errlen);
/* Text of an OpenAI/Claude/Responses content value (string, or array of text parts). */
int gen_content_text(const json_t *content, const char *field, strbuf *out, char *err,
                     size_t errlen);
/* Builds the usual tool call JSON for templates: {"id","type":"function","function":{"name",
 * "arguments": object}} from a name and arguments (object or JSON string). */
json_t *gen_template_tool_call(const char *id, const char *name, const json_t *arguments);
/* Puts an assistant turn's earlier reasoning (NULL: none) where chat templates read it: Qwen,
 * GLM and DeepSeek templates read `reasoning_content`, gpt-oss's reads `thinking`. */
void gen_template_reasoning(json_t *message, const char *reasoning);

/* ---- request pieces several adapters share (gen_parse.c) ---- */
/* A token limit n read from field (LONG_MIN: absent) into q->max_tokens; it must be >= 1.
 * Returns 0, or 400 with err. */
int gen_set_token_limit(long n, const char *field, gen_request *q, char *err, size_t errlen);
/* The sampling knobs OpenAI and Ollama share (temperature, top_p, min_p, the repetition
 * penalty under the API's own name, presence/frequency penalties, top_k, seed, and exo's
 * spec_tokens) from o into q.
 * Returns 0, or 400 with err. */
int gen_get_sampling(const json_t *o, const char *repetition_field, gen_request *q, char *err,
                     size_t errlen);
/* v must be present and a string. Returns 0, or 400 with err naming field. */
int gen_require_string(const json_t *v, const char *field, char *err, size_t errlen);
/* v must be present and a non-empty array. Returns 0, or 400 with err naming field. */
int gen_require_array(const json_t *v, const char *field, char *err, size_t errlen);
/* How an API spells a flat function tool {name, <schema_key>, description}. */
typedef struct gen_tools_shape {
    const char *schema_key;     /* "input_schema" (Claude), "parameters" (Responses) */
    int function_type_required; /* each tool must say "type":"function" */
    const char *invalid_tool;   /* the 400 message for a bad tools[i], with one %zu for i */
} gen_tools_shape;
/* tools (absent or null: none) -> req->tools in the template's {"type":"function","function"}
 * shape, unless choice_none or empty. Returns 0, or 400 with err. */
int gen_parse_function_tools(const json_t *tools, const gen_tools_shape *shape, int choice_none,
                             gen_request *req, char *err, size_t errlen);
/* Structured outputs. Each compiles the constraint into req->grammar (only one per request)
 * and returns 0, or 400 with err naming field and the problem (an unsupported schema keyword,
 * a grammar syntax error, an unknown tool).
 * The output is JSON valid against schema (NULL: any JSON object, the json_object modes). */
int gen_set_json_output(gen_request *req, const json_t *schema, const char *field, char *err,
                        size_t errlen);
/* A GBNF grammar string (llama.cpp's `grammar`); absent or null: nothing. */
int gen_set_grammar(gen_request *req, const json_t *grammar_value, const char *field, char *err,
                    size_t errlen);
/* The output is one call of the tool `name` (NULL: of any tool in req->tools) with arguments
 * valid against its parameters schema; req->tools must hold it. */
int gen_force_tool_call(gen_request *req, const char *name, const char *field, char *err,
                        size_t errlen);
/* Appends {"role":"tool","content":<text of content>,"tool_call_id"?} to msgs. Returns 0, or
 * 400 with err naming field. */
int gen_append_tool_result(json_t *msgs, const json_t *content, const char *field,
                           const char *call_id, char *err, size_t errlen);

/* s (n bytes of valid UTF-8) as a quoted JSON string, escaped exactly as jansson's json_dumps
 * does (", \\ and control characters), for adapters that build hot frames from templates. */
void gen_json_string(strbuf *out, const char *s, size_t n);
/* Decimal text of v. */
void gen_append_i64(strbuf *out, long long v);

/* JSON -> "data: ...\n\n" / "event: X\ndata: ...\n\n" / "...\n" appended to out; steals j. */
void gen_sse_data(strbuf *out, json_t *j);
void gen_sse_event(strbuf *out, const char *event, json_t *j);
void gen_ndjson(strbuf *out, json_t *j);

/* The adapters. */
extern const gen_adapter gen_adapter_openai_chat;
extern const gen_adapter gen_adapter_openai_completions;
extern const gen_adapter gen_adapter_responses;
extern const gen_adapter gen_adapter_claude;
extern const gen_adapter gen_adapter_ollama_chat;
extern const gen_adapter gen_adapter_ollama_generate;

#endif
