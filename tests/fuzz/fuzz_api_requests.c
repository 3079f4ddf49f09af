/* libFuzzer target for the request parsers of all four APIs (OpenAI chat + legacy completions,
 * Responses, Claude Messages, Ollama chat + generate) and the runner protocol: any bytes must
 * parse or fail with a message naming the problem, never crash, leak or read out of bounds.
 * An accepted request must survive the runner-protocol round trip (gen_request -> JSON ->
 * gen_request), and the adapter's encoders must handle a synthetic stream built from it. */
#include "api/gen.h"
#include "runner/protocol.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const gen_adapter *ADAPTERS[] = {
    &gen_adapter_openai_chat, &gen_adapter_openai_completions, &gen_adapter_responses,
    &gen_adapter_claude,      &gen_adapter_ollama_chat,        &gen_adapter_ollama_generate,
};

/* Drives the stream encoders with a delta carrying text taken from the request itself. */
static void encode_stream(gen_state *st) {
    strbuf out = {0};
    json_t *accepted = json_pack("{s:s,s:i,s:i}", "type", "accepted", "id", 1, "prompt_tokens", 3);
    gen_state_accumulate(st, accepted);
    st->adapter->stream->begin(st, &out);
    json_t *delta = json_pack("{s:s,s:i,s:s,s:s,s:[{s:s,s:s,s:s}]}", "type", "delta", "id", 1,
                              "content", st->req.model, "reasoning", "r", "tool_calls", "id",
                              "call_1", "name", st->req.model, "arguments", "{\"a\":1}");
    gen_state_accumulate(st, delta);
    st->adapter->stream->delta(st, delta, &out);
    /* a text-only delta (OpenAI chat encodes it from a template): its frame must be valid JSON
     * carrying exactly the text */
    json_t *text = json_pack("{s:s,s:i,s:s,s:i}", "type", "delta", "id", 1, "content",
                             st->req.model, "tokens", 2);
    strbuf frame = {0};
    st->adapter->stream->delta(st, text, &frame);
    if (st->adapter == &gen_adapter_openai_chat) {
        if (frame.len < 8 || memcmp(frame.data, "data: ", 6)) abort();
        json_t *c = json_loadb(frame.data + 6, frame.len - 8, 0, NULL);
        json_t *content = json_object_get(
            json_object_get(json_array_get(json_object_get(c, "choices"), 0), "delta"), "content");
        if (!json_is_string(content) || strcmp(json_string_value(content), st->req.model))
            abort(); /* the template lost or mangled the text */
        json_decref(c);
    }
    strbuf_free(&frame);
    json_decref(text);
    json_t *done = json_pack("{s:s,s:i,s:s,s:{s:i,s:i}}", "type", "done", "id", 1,
                             "finish_reason", "tool_calls", "usage", "prompt_tokens", 3,
                             "completion_tokens", 2);
    gen_state_accumulate(st, done);
    st->adapter->stream->end(st, &out);
    json_decref(st->adapter->final(st));
    json_decref(accepted);
    json_decref(delta);
    json_decref(done);
    strbuf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the runner protocol's incremental reader over the same bytes */
    protocol_reader pr = {0};
    protocol_reader_feed(&pr, data, size);
    int bad = 0;
    json_t *m;
    while ((m = protocol_reader_next(&pr, &bad))) json_decref(m);
    protocol_reader_free(&pr);

    json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(body)) {
        json_decref(body);
        return 0;
    }
    for (size_t i = 0; i < sizeof ADAPTERS / sizeof ADAPTERS[0]; i++) {
        gen_state *st = gen_state_new(ADAPTERS[i], NULL);
        char err[512];
        int status = ADAPTERS[i]->parse(body, st, err, sizeof err);
        if (status == 0) {
            json_t *wire = gen_request_to_json(&st->req);
            gen_request back;
            if (gen_request_from_json(wire, &back, err, sizeof err) == 0) {
                if (strcmp(back.model, st->req.model) || back.n_stop != st->req.n_stop ||
                    back.max_tokens != st->req.max_tokens)
                    abort(); /* the protocol lost part of an accepted request */
                gen_request_free(&back);
            }
            json_decref(wire);
            encode_stream(st);
        } else if (status < 400 || status > 599 || !err[0]) {
            abort(); /* a rejection must be an HTTP error with a message */
        }
        gen_state_release(st);
    }
    json_decref(body);
    return 0;
}
