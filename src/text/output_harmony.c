/* output_harmony — gpt-oss's Harmony format, as the model writes it after a prompt ending in
 * "<|start|>assistant": messages of a header ("<|channel|>analysis", " to=functions.NAME",
 * "<|constrain|>json" or " json", in any order) then "<|message|>", a body, and an end marker
 * (<|end|> between messages, <|call|> after a tool call, <|return|> after the final answer).
 *
 * analysis -> reasoning; final, and commentary without a recipient (a preamble the user sees)
 * -> content; commentary to=functions.NAME -> a tool call whose body is its JSON arguments (when
 * the request offered tools; otherwise the body is content). Bodies stream as they come; a tool
 * call is held until its end. Markers split across pieces at any byte are still recognised.
 * Refuses: nothing — a header that never reaches <|message|> and a call body that is not a JSON
 * object come out as content, so no output is lost. */
#include "text/output_internal.h"

#include <stdlib.h>
#include <string.h>

enum harmony_channel { CH_FINAL = 0, CH_ANALYSIS, CH_COMMENTARY, CH_CALL };

static const char MESSAGE[] = "<|message|>";
static const char *const BODY_ENDS[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
#define N_BODY_ENDS 4
/* A header longer than this without <|message|> is not Harmony: shown as text. */
#define HEADER_MAX 512

/* The value after `key` in the header, up to whitespace or the next marker. */
static char *header_word(const char *h, size_t n, const char *key) {
    const char *k = memmem(h, n, key, strlen(key));
    if (!k) return NULL;
    const char *v = k + strlen(key), *end = h + n, *e = v;
    while (e < end && !output_is_ws(*e) && *e != '<') e++;
    return e > v ? strndup(v, (size_t)(e - v)) : NULL;
}

static void start_message(output_parser *p, const char *h, size_t n) {
    char *channel = header_word(h, n, "<|channel|>");
    free(p->harmony_recipient);
    p->harmony_recipient = header_word(h, n, "to=");
    p->harmony_channel = CH_FINAL;
    if (channel && !strcmp(channel, "analysis")) p->harmony_channel = CH_ANALYSIS;
    if (channel && !strcmp(channel, "commentary")) p->harmony_channel = CH_COMMENTARY;
    if (p->harmony_recipient && !strncmp(p->harmony_recipient, "functions.", 10) && p->has_tools)
        p->harmony_channel = CH_CALL;
    free(channel);
}

static void emit_body(output_parser *p, delta_builder *d, const char *s, size_t n) {
    if (p->harmony_channel == CH_ANALYSIS) strbuf_append(&d->reasoning, s, n);
    else output_emit_content(p, d, s, n);
}

/* The first end marker in s[0..n): its position and length, or NULL. */
static const char *first_end(const char *s, size_t n, size_t *len) {
    const char *best = NULL;
    for (int i = 0; i < N_BODY_ENDS; i++) {
        const char *hit = memmem(s, n, BODY_ENDS[i], strlen(BODY_ENDS[i]));
        if (hit && (!best || hit < best)) best = hit, *len = strlen(BODY_ENDS[i]);
    }
    return best;
}

static size_t partial_end(const char *s, size_t n) {
    size_t hold = 0;
    for (int i = 0; i < N_BODY_ENDS; i++) {
        size_t h = output_partial_tag(s, n, BODY_ENDS[i]);
        if (h > hold) hold = h;
    }
    return hold;
}

/* A finished tool-call body: the call, or (not a JSON object) the raw message as content. */
static void finish_call(output_parser *p, delta_builder *d, const char *s, size_t n) {
    const char *name = p->harmony_recipient + 10;
    if (!output_add_json_call(name, strlen(name), s, n, d)) output_emit_content(p, d, s, n);
}

void output_harmony_process(output_parser *p, delta_builder *d, bool final) {
    strbuf *b = &p->pending;
    while (b->len) {
        const char *s = b->data;
        size_t n = b->len;
        if (p->state == IN_HARMONY_HEADER) {
            const char *hit = memmem(s, n, MESSAGE, strlen(MESSAGE));
            if (hit) {
                start_message(p, s, (size_t)(hit - s));
                output_consume(b, (size_t)(hit - s) + strlen(MESSAGE));
                p->state = IN_HARMONY_BODY;
                continue;
            }
            if (!final && n <= HEADER_MAX) return;
            output_emit_content(p, d, s, n); /* not Harmony after all */
            output_consume(b, n);
            return;
        }
        size_t mlen = 0;
        const char *end = first_end(s, n, &mlen);
        if (p->harmony_channel == CH_CALL) {
            if (!end && !final) return;
            size_t body = end ? (size_t)(end - s) : n;
            finish_call(p, d, s, body);
        } else {
            size_t body = end ? (size_t)(end - s) : n - (final ? 0 : partial_end(s, n));
            emit_body(p, d, s, body);
            if (!end) {
                output_consume(b, body);
                return;
            }
        }
        /* every marker ends the message; a header ignores "<|start|>" and the role before it */
        output_consume(b, end ? (size_t)(end - s) + mlen : n);
        p->state = IN_HARMONY_HEADER;
    }
}
