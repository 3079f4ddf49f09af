/* store_node — the rendezvous store of a multi-node instance: a dist_store whose set/get travel
 * to this runner's node over the runner protocol (runner/protocol.h: store_set, store_get,
 * store_value). The node publishes each key into the cluster's replicated State under the
 * instance, and answers gets from its copy of State, so ranks on different machines find each
 * other's addresses without a shared directory and without anything new listening.
 *
 * Used only while the ranks connect (before the runner's main loop reads its socket), so it owns
 * the socket's read side for that time. It refuses: to wait past the caller's timeout, and to keep
 * going once the node asks the runner to shut down (get then fails, and so does the connect). */
#include "runner/store_node.h"

#include "base/clock.h"
#include "runner/protocol.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How long a get waits between asking the node again while the key is not in State yet. */
#define STORE_NODE_RETRY_MS 100

static char *hex_encode(const void *data, size_t len) {
    static const char digits[] = "0123456789abcdef";
    const unsigned char *p = data;
    char *out = malloc(2 * len + 1);
    if (!out) return NULL;
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * len] = 0;
    return out;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex_decode(const char *text, void **out, size_t *len) {
    size_t n = strlen(text);
    if (n % 2) return -1;
    unsigned char *b = malloc(n / 2 + 1);
    if (!b) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hex_digit(text[2 * i]), lo = hex_digit(text[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(b);
            return -1;
        }
        b[i] = (unsigned char)(hi << 4 | lo);
    }
    *out = b;
    *len = n / 2;
    return 0;
}

static int node_set(void *ctx, const char *key, const void *value, size_t len) {
    store_node *s = ctx;
    char *hex = hex_encode(value, len);
    if (!hex) return -1;
    json_t *m = json_pack("{s:s,s:s,s:s}", "type", "store_set", "key", key, "value", hex);
    free(hex);
    int rc = m ? protocol_send(s->fd, m) : -1;
    json_decref(m);
    return rc;
}

/* Reads frames until the node's answer for key arrives: 1 found (*value set), 0 not there yet,
 * -1 node gone / asked to shut down / deadline passed. */
static int await_answer(store_node *s, const char *key, void **value, size_t *len, uint64_t deadline) {
    for (;;) {
        int bad = 0;
        json_t *m;
        while ((m = protocol_reader_next(&s->reader, &bad))) {
            const char *type = json_string_value(json_object_get(m, "type"));
            const char *k = json_string_value(json_object_get(m, "key"));
            const char *v = json_string_value(json_object_get(m, "value"));
            int rc = 2; /* not ours: keep reading */
            if (type && !strcmp(type, "shutdown")) {
                s->shutdown = 1;
                rc = -1;
            } else if (type && !strcmp(type, "store_value") && k && !strcmp(k, key)) {
                rc = v ? (hex_decode(v, value, len) == 0 ? 1 : -1) : 0;
            }
            json_decref(m);
            if (rc != 2) return rc;
        }
        if (bad) return -1;
        uint64_t now = clock_now_ns();
        if (now >= deadline) return -1;
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        int ready = poll(&p, 1, (int)((deadline - now) / 1000000 + 1));
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) return -1;
        char buf[4096];
        ssize_t n = read(s->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1; /* the node is gone */
        protocol_reader_feed(&s->reader, buf, (size_t)n);
    }
}

static int node_get(void *ctx, const char *key, void **value, size_t *len, int timeout_ms) {
    store_node *s = ctx;
    uint64_t deadline = clock_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    while (!s->shutdown) {
        json_t *m = json_pack("{s:s,s:s}", "type", "store_get", "key", key);
        int sent = m ? protocol_send(s->fd, m) : -1;
        json_decref(m);
        if (sent) return -1;
        int rc = await_answer(s, key, value, len, deadline);
        if (rc != 0) return rc > 0 ? 0 : -1;
        if (clock_now_ns() + STORE_NODE_RETRY_MS * 1000000ull >= deadline) return -1;
        clock_sleep_ms(STORE_NODE_RETRY_MS);
    }
    return -1;
}

void store_node_init(store_node *s, int fd, dist_store *out) {
    memset(s, 0, sizeof *s);
    s->fd = fd;
    out->ctx = s;
    out->set = node_set;
    out->get = node_get;
}

void store_node_free(store_node *s) { protocol_reader_free(&s->reader); }
