/* protocol — gen_request JSON codec and length-prefixed framing (see protocol.h). */
#include "runner/protocol.h"

#include "base/fdio.h"
#include "base/strbuf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void gen_request_init(gen_request *r) {
    memset(r, 0, sizeof *r);
    r->temperature = r->top_p = r->min_p = -1;
    r->repetition_penalty = r->presence_penalty = r->frequency_penalty = -1;
    r->top_k = -1;
    r->enable_thinking = -1;
}

void gen_request_free(gen_request *r) {
    json_decref(r->messages);
    json_decref(r->tools);
    free(r->prompt);
    free(r->grammar);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    gen_request_init(r);
}

static void put_real(json_t *o, const char *k, double v) {
    if (v >= 0) json_object_set_new(o, k, json_real(v));
}

json_t *gen_request_to_json(const gen_request *r) {
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(r->model));
    if (r->messages) json_object_set(o, "messages", r->messages);
    if (r->tools) json_object_set(o, "tools", r->tools);
    if (r->prompt) json_object_set_new(o, "prompt", json_string(r->prompt));
    json_object_set_new(o, "max_tokens", json_integer(r->max_tokens));
    put_real(o, "temperature", r->temperature);
    put_real(o, "top_p", r->top_p);
    put_real(o, "min_p", r->min_p);
    put_real(o, "repetition_penalty", r->repetition_penalty);
    put_real(o, "presence_penalty", r->presence_penalty);
    put_real(o, "frequency_penalty", r->frequency_penalty);
    if (r->top_k >= 0) json_object_set_new(o, "top_k", json_integer(r->top_k));
    if (r->has_seed) json_object_set_new(o, "seed", json_integer((json_int_t)r->seed));
    if (r->n_stop) {
        json_t *a = json_array();
        for (int i = 0; i < r->n_stop; i++) json_array_append_new(a, json_string(r->stop[i]));
        json_object_set_new(o, "stop", a);
    }
    if (r->logprobs) json_object_set_new(o, "logprobs", json_true());
    if (r->top_logprobs) json_object_set_new(o, "top_logprobs", json_integer(r->top_logprobs));
    if (r->enable_thinking >= 0)
        json_object_set_new(o, "enable_thinking", json_boolean(r->enable_thinking));
    if (r->reasoning_effort[0]) json_object_set_new(o, "reasoning_effort", json_string(r->reasoning_effort));
    if (r->ban_eos) json_object_set_new(o, "ban_eos", json_true());
    if (r->engine_only) json_object_set_new(o, "engine_only", json_true());
    if (r->no_prefix_cache) json_object_set_new(o, "no_prefix_cache", json_true());
    if (r->grammar) json_object_set_new(o, "grammar", json_string(r->grammar));
    if (r->forced_tool_call) json_object_set_new(o, "forced_tool_call", json_true());
    if (r->spec_tokens) json_object_set_new(o, "spec_tokens", json_integer(r->spec_tokens));
    return o;
}

static double get_real(const json_t *o, const char *k, int *bad) {
    json_t *v = json_object_get(o, k);
    if (!v) return -1;
    if (!json_is_number(v)) *bad = 1;
    return json_number_value(v);
}

int gen_request_from_json(const json_t *j, gen_request *r, char *err, size_t errlen) {
    gen_request_init(r);
    if (!json_is_object(j)) {
        snprintf(err, errlen, "request is not an object");
        return -1;
    }
    int bad = 0;
    const char *model = json_string_value(json_object_get(j, "model"));
    snprintf(r->model, sizeof r->model, "%s", model ? model : "");
    json_t *m = json_object_get(j, "messages");
    if (json_is_array(m)) r->messages = json_incref(m);
    json_t *t = json_object_get(j, "tools");
    if (json_is_array(t) && json_array_size(t)) r->tools = json_incref(t);
    const char *p = json_string_value(json_object_get(j, "prompt"));
    if (p) r->prompt = strdup(p);
    if (!r->messages && !r->prompt) {
        snprintf(err, errlen, "request has neither messages nor prompt");
        return -1;
    }
    r->max_tokens = (int)json_integer_value(json_object_get(j, "max_tokens"));
    r->temperature = get_real(j, "temperature", &bad);
    r->top_p = get_real(j, "top_p", &bad);
    r->min_p = get_real(j, "min_p", &bad);
    r->repetition_penalty = get_real(j, "repetition_penalty", &bad);
    r->presence_penalty = get_real(j, "presence_penalty", &bad);
    r->frequency_penalty = get_real(j, "frequency_penalty", &bad);
    json_t *k = json_object_get(j, "top_k");
    if (json_is_integer(k)) r->top_k = (int)json_integer_value(k);
    json_t *seed = json_object_get(j, "seed");
    if (json_is_integer(seed)) {
        r->has_seed = 1;
        r->seed = (uint64_t)json_integer_value(seed);
    }
    json_t *stop = json_object_get(j, "stop");
    size_t i;
    json_t *s;
    json_array_foreach(stop, i, s) {
        if (json_is_string(s) && r->n_stop < GEN_MAX_STOP)
            r->stop[r->n_stop++] = strdup(json_string_value(s));
    }
    r->logprobs = json_is_true(json_object_get(j, "logprobs"));
    r->top_logprobs = (int)json_integer_value(json_object_get(j, "top_logprobs"));
    json_t *th = json_object_get(j, "enable_thinking");
    if (json_is_boolean(th)) r->enable_thinking = json_is_true(th);
    const char *effort = json_string_value(json_object_get(j, "reasoning_effort"));
    if (effort) snprintf(r->reasoning_effort, sizeof r->reasoning_effort, "%s", effort);
    r->ban_eos = json_is_true(json_object_get(j, "ban_eos"));
    r->engine_only = json_is_true(json_object_get(j, "engine_only"));
    r->no_prefix_cache = json_is_true(json_object_get(j, "no_prefix_cache"));
    const char *grammar = json_string_value(json_object_get(j, "grammar"));
    if (grammar) r->grammar = strdup(grammar);
    r->forced_tool_call = json_is_true(json_object_get(j, "forced_tool_call"));
    r->spec_tokens = (int)json_integer_value(json_object_get(j, "spec_tokens"));
    if (bad || r->max_tokens < 0 || r->top_logprobs < 0 || r->top_logprobs > 20 ||
        r->spec_tokens < -1 || r->spec_tokens > 16) {
        snprintf(err, errlen, "request has a field of the wrong type or range");
        gen_request_free(r);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ framing */

static int write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == ENOTSOCK) w = write(fd, p, n);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int protocol_send(int fd, const json_t *message) {
    char *text = json_dumps(message, JSON_COMPACT);
    if (!text) return -1;
    size_t n = strlen(text);
    unsigned char *frame = malloc(n + 4);
    if (!frame) {
        free(text);
        return -1;
    }
    frame[0] = (unsigned char)(n & 0xff);
    frame[1] = (unsigned char)((n >> 8) & 0xff);
    frame[2] = (unsigned char)((n >> 16) & 0xff);
    frame[3] = (unsigned char)((n >> 24) & 0xff);
    memcpy(frame + 4, text, n);
    int rc = write_all(fd, frame, n + 4);
    free(frame);
    free(text);
    return rc;
}

void protocol_append(strbuf *out, const json_t *message) {
    char *text = json_dumps(message, JSON_COMPACT);
    if (!text) return;
    size_t n = strlen(text);
    char hdr[4] = {(char)(n & 0xff), (char)((n >> 8) & 0xff), (char)((n >> 16) & 0xff),
                   (char)((n >> 24) & 0xff)};
    strbuf_append(out, hdr, 4);
    strbuf_append(out, text, n);
    free(text);
}

static json_t *parse_payload(const unsigned char *p, size_t n) {
    json_t *j = json_loadb((const char *)p, n, 0, NULL);
    if (j && !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

json_t *protocol_recv(int fd, char *err, size_t errlen) {
    unsigned char hdr[4];
    if (fdio_read_all(fd, hdr, 4)) {
        snprintf(err, errlen, "connection closed");
        return NULL;
    }
    size_t n = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 | (size_t)hdr[3] << 24;
    if (n > PROTOCOL_MAX_FRAME) {
        snprintf(err, errlen, "frame of %zu bytes is over the limit", n);
        return NULL;
    }
    unsigned char *p = malloc(n ? n : 1);
    if (!p || fdio_read_all(fd, p, n)) {
        free(p);
        snprintf(err, errlen, "connection closed mid-frame");
        return NULL;
    }
    json_t *j = parse_payload(p, n);
    free(p);
    if (!j) snprintf(err, errlen, "frame is not a JSON object");
    return j;
}

void protocol_reader_feed(protocol_reader *r, const void *data, size_t n) {
    if (r->len + n > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n) cap *= 2;
        unsigned char *b = realloc(r->buf, cap);
        if (!b) return;
        r->buf = b;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, data, n);
    r->len += n;
}

json_t *protocol_reader_next(protocol_reader *r, int *bad) {
    *bad = 0;
    if (r->len < 4) return NULL;
    size_t n = (size_t)r->buf[0] | (size_t)r->buf[1] << 8 | (size_t)r->buf[2] << 16 |
               (size_t)r->buf[3] << 24;
    if (n > PROTOCOL_MAX_FRAME) {
        *bad = 1;
        return NULL;
    }
    if (r->len < n + 4) return NULL;
    json_t *j = parse_payload(r->buf + 4, n);
    memmove(r->buf, r->buf + 4 + n, r->len - 4 - n);
    r->len -= 4 + n;
    if (!j) *bad = 1;
    return j;
}

void protocol_reader_free(protocol_reader *r) {
    free(r->buf);
    memset(r, 0, sizeof *r);
}
