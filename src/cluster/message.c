/* cluster/message — decoding and validation of cluster messages (see message.h). */
#include "cluster/message.h"

#include <stdio.h>
#include <string.h>

static const struct {
    enum cluster_message_type type;
    const char *name;
} message_types[] = {
    {CLUSTER_MSG_HEARTBEAT, "hb"}, {CLUSTER_MSG_PEERS, "peers"}, {CLUSTER_MSG_SUBMIT, "sub"},
    {CLUSTER_MSG_ENTRIES, "ents"}, {CLUSTER_MSG_SYNC, "sync"},   {CLUSTER_MSG_PROBE, "bw"},
    {CLUSTER_MSG_PROBE_ACK, "bwa"},
};

#define MAX_ARRAY_ITEMS 100000

const char *cluster_message_type_name(enum cluster_message_type type) {
    for (size_t i = 0; i < sizeof message_types / sizeof message_types[0]; i++)
        if (message_types[i].type == type) return message_types[i].name;
    return "?";
}

int cluster_node_id_valid(const char *id) {
    size_t n = strlen(id);
    if (n == 0 || n > CLUSTER_NODE_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c <= ' ' || c >= 127 || c == '/') return 0;
    }
    return 1;
}

static int fail(char *err, size_t errlen, const char *fmt, const char *field) {
    snprintf(err, errlen, fmt, field);
    return -1;
}

static int need_int(const json_t *o, const char *key, json_int_t min, json_int_t max, char *err,
                    size_t errlen) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return fail(err, errlen, "field '%s' missing or not an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > max) return fail(err, errlen, "field '%s' out of range", key);
    return 0;
}

static int need_string(const json_t *o, const char *key, size_t max_len, char *err,
                       size_t errlen) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return fail(err, errlen, "field '%s' missing or not a string", key);
    if (json_string_length(v) > max_len) return fail(err, errlen, "field '%s' too long", key);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail(err, errlen, "field '%s' contains NUL", key);
    return 0;
}

static int need_node_id(const json_t *o, const char *key, char *err, size_t errlen) {
    if (need_string(o, key, CLUSTER_NODE_ID_MAX, err, errlen)) return -1;
    if (!cluster_node_id_valid(json_string_value(json_object_get(o, key))))
        return fail(err, errlen, "field '%s' is not a node id", key);
    return 0;
}

#define INT_MAX_JSON ((json_int_t)1 << 53)

int cluster_entry_validate(const json_t *e, char *err, size_t errlen) {
    if (!json_is_object(e)) return fail(err, errlen, "%s", "entry is not an object");
    if (need_int(e, "idx", 1, INT_MAX_JSON, err, errlen) ||
        need_int(e, "term", 1, INT_MAX_JSON, err, errlen) ||
        need_node_id(e, "master", err, errlen) ||
        need_int(e, "time", 0, INT_MAX_JSON, err, errlen) ||
        need_node_id(e, "origin", err, errlen) || need_string(e, "sess", 32, err, errlen) ||
        need_int(e, "seq", 1, INT_MAX_JSON, err, errlen))
        return -1;
    if (!json_is_object(json_object_get(e, "event")))
        return fail(err, errlen, "%s", "entry has no event object");
    return 0;
}

static int validate_heartbeat(const json_t *m, char *err, size_t errlen) {
    /* Version and name ride on hellos only (the first heartbeats to a peer). */
    if ((json_object_get(m, "ver") && need_string(m, "ver", 128, err, errlen)) ||
        (json_object_get(m, "name") && need_string(m, "name", 256, err, errlen)) ||
        need_int(m, "port", 1, 65535, err, errlen) || need_string(m, "sess", 32, err, errlen) ||
        need_int(m, "sa", 0, INT_MAX_JSON, err, errlen) ||
        need_int(m, "term", 0, INT_MAX_JSON, err, errlen) ||
        need_int(m, "lt", 0, INT_MAX_JSON, err, errlen) ||
        need_int(m, "li", 0, INT_MAX_JSON, err, errlen) ||
        need_int(m, "ts", 0, INT64_MAX, err, errlen))
        return -1;
    json_t *hello = json_object_get(m, "hello");
    if (hello && !json_is_boolean(hello))
        return fail(err, errlen, "field '%s' is not a boolean", "hello");
    if (!json_is_boolean(json_object_get(m, "m")))
        return fail(err, errlen, "field '%s' missing or not a boolean", "m");
    /* Optional echo of the receiver's last timestamp (link latency). */
    if (json_object_get(m, "ets") && (need_int(m, "ets", 0, INT64_MAX, err, errlen) ||
                                      need_int(m, "edl", 0, INT64_MAX, err, errlen)))
        return -1;
    return 0;
}

static int validate_peers(const json_t *m, char *err, size_t errlen) {
    json_t *peers = json_object_get(m, "peers");
    if (!json_is_array(peers) || json_array_size(peers) > 4096)
        return fail(err, errlen, "%s", "field 'peers' missing, not an array or too long");
    size_t i;
    json_t *p;
    json_array_foreach(peers, i, p) {
        if (!json_is_object(p) || need_node_id(p, "id", err, errlen) ||
            need_string(p, "addr", 64, err, errlen) || need_int(p, "port", 1, 65535, err, errlen))
            return -1;
    }
    return 0;
}

/* o[key] as an array of at most MAX_ARRAY_ITEMS, or NULL after fail(). */
static json_t *need_array(const json_t *o, const char *key, char *err, size_t errlen) {
    json_t *v = json_object_get(o, key);
    if (json_is_array(v) && json_array_size(v) <= MAX_ARRAY_ITEMS) return v;
    fail(err, errlen, "field '%s' missing or not an array", key);
    return NULL;
}

static int validate_submit(const json_t *m, char *err, size_t errlen) {
    if (need_string(m, "sess", 32, err, errlen)) return -1;
    json_t *evs = need_array(m, "ev", err, errlen);
    if (!evs) return -1;
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e) {
        if (!json_is_object(e) || need_int(e, "seq", 1, INT_MAX_JSON, err, errlen)) return -1;
        if (!json_is_object(json_object_get(e, "e")))
            return fail(err, errlen, "%s", "submitted event is not an object");
    }
    return 0;
}

static int validate_entries(const json_t *m, char *err, size_t errlen) {
    json_t *prev = json_object_get(m, "prev");
    json_int_t prev_idx = 0;
    if (!json_is_null(prev)) {
        if (!json_is_array(prev) || json_array_size(prev) != 3 ||
            !json_is_integer(json_array_get(prev, 0)) ||
            json_integer_value(json_array_get(prev, 0)) < 1 ||
            json_integer_value(json_array_get(prev, 0)) > INT_MAX_JSON ||
            !json_is_integer(json_array_get(prev, 1)) ||
            json_integer_value(json_array_get(prev, 1)) < 1 ||
            !json_is_string(json_array_get(prev, 2)) ||
            !cluster_node_id_valid(json_string_value(json_array_get(prev, 2))))
            return fail(err, errlen, "%s", "field 'prev' must be null or [idx, term, master]");
        prev_idx = json_integer_value(json_array_get(prev, 0));
    }
    json_t *more = json_object_get(m, "more"), *trunc = json_object_get(m, "trunc");
    if ((more && !json_is_boolean(more)) || (trunc && !json_is_boolean(trunc)))
        return fail(err, errlen, "%s", "fields 'more' and 'trunc' must be booleans");
    json_t *ents = need_array(m, "ents", err, errlen);
    if (!ents) return -1;
    size_t i;
    json_t *e;
    json_array_foreach(ents, i, e) {
        if (cluster_entry_validate(e, err, errlen)) return -1;
        if (json_integer_value(json_object_get(e, "idx")) != prev_idx + 1 + (json_int_t)i)
            return fail(err, errlen, "%s", "entries do not follow 'prev' consecutively");
    }
    return 0;
}

static int validate_sync(const json_t *m, char *err, size_t errlen) {
    if (need_int(m, "since", 0, INT_MAX_JSON, err, errlen)) return -1;
    json_t *epochs = json_object_get(m, "epochs");
    if (!json_is_array(epochs) || json_array_size(epochs) > MAX_ARRAY_ITEMS)
        return fail(err, errlen, "%s", "field 'epochs' missing or not an array");
    size_t i;
    json_t *ep;
    json_int_t last_first = 0;
    json_array_foreach(epochs, i, ep) {
        if (!json_is_array(ep) || json_array_size(ep) != 3 ||
            !json_is_integer(json_array_get(ep, 0)) || !json_is_string(json_array_get(ep, 1)) ||
            !json_is_integer(json_array_get(ep, 2)) ||
            !cluster_node_id_valid(json_string_value(json_array_get(ep, 1))))
            return fail(err, errlen, "%s", "an epoch is not [term, master, first]");
        json_int_t term = json_integer_value(json_array_get(ep, 0));
        json_int_t first = json_integer_value(json_array_get(ep, 2));
        if (term < 1 || term > INT_MAX_JSON || first <= last_first || first > INT_MAX_JSON)
            return fail(err, errlen, "%s", "epochs out of order");
        last_first = first;
    }
    return 0;
}

enum cluster_decode_result cluster_message_decode(const void *bytes, size_t len,
                                                  cluster_message *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (len > CLUSTER_MESSAGE_MAX_BYTES) {
        snprintf(err, errlen, "message of %zu bytes exceeds the %u byte limit", len,
                 CLUSTER_MESSAGE_MAX_BYTES);
        return CLUSTER_DECODE_OVERSIZED;
    }
    json_error_t jerr;
    json_t *root = json_loadb(bytes, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(err, errlen, "not JSON: %s", jerr.text);
        return CLUSTER_DECODE_MALFORMED;
    }
    enum cluster_decode_result rc = CLUSTER_DECODE_MALFORMED;
    if (!json_is_object(root)) {
        snprintf(err, errlen, "not a JSON object");
        goto bad;
    }
    json_t *v = json_object_get(root, "v");
    if (!json_is_integer(v)) {
        snprintf(err, errlen, "no protocol version");
        goto bad;
    }
    if (json_integer_value(v) != CLUSTER_PROTOCOL_VERSION) {
        snprintf(err, errlen, "peer speaks cluster protocol %lld, this node speaks %d",
                 (long long)json_integer_value(v), CLUSTER_PROTOCOL_VERSION);
        rc = CLUSTER_DECODE_VERSION;
        goto bad;
    }
    if (need_node_id(root, "f", err, errlen)) goto bad;
    json_t *t = json_object_get(root, "t");
    if (!json_is_string(t)) {
        snprintf(err, errlen, "no message type");
        goto bad;
    }
    int found = 0;
    for (size_t i = 0; i < sizeof message_types / sizeof message_types[0]; i++) {
        if (!strcmp(json_string_value(t), message_types[i].name)) {
            out->type = message_types[i].type;
            found = 1;
        }
    }
    if (!found) {
        snprintf(err, errlen, "unknown message type '%.32s'", json_string_value(t));
        goto bad;
    }
    int bad = 0;
    switch (out->type) {
    case CLUSTER_MSG_HEARTBEAT: bad = validate_heartbeat(root, err, errlen); break;
    case CLUSTER_MSG_PEERS: bad = validate_peers(root, err, errlen); break;
    case CLUSTER_MSG_SUBMIT: bad = validate_submit(root, err, errlen); break;
    case CLUSTER_MSG_ENTRIES: bad = validate_entries(root, err, errlen); break;
    case CLUSTER_MSG_SYNC: bad = validate_sync(root, err, errlen); break;
    case CLUSTER_MSG_PROBE:
        bad = need_int(root, "ts", 0, INT64_MAX, err, errlen) ||
              need_string(root, "pad", CLUSTER_MESSAGE_MAX_BYTES, err, errlen);
        break;
    case CLUSTER_MSG_PROBE_ACK:
        bad = need_int(root, "ts", 0, INT64_MAX, err, errlen) ||
              need_int(root, "n", 0, CLUSTER_MESSAGE_MAX_BYTES, err, errlen);
        break;
    }
    if (bad) goto bad;
    out->version = (int)json_integer_value(v);
    out->from = json_string_value(json_object_get(root, "f"));
    out->root = root;
    return CLUSTER_DECODE_OK;
bad:
    json_decref(root);
    memset(out, 0, sizeof *out);
    return rc;
}

void cluster_message_free(cluster_message *m) {
    if (m->root) json_decref(m->root);
    memset(m, 0, sizeof *m);
}

json_t *cluster_message_new(enum cluster_message_type type, const char *from) {
    return json_pack("{s:i, s:s, s:s}", "v", CLUSTER_PROTOCOL_VERSION, "t",
                     cluster_message_type_name(type), "f", from);
}

size_t cluster_beacon_encode(const cluster_beacon *b, unsigned char *out) {
    size_t n = strlen(b->node_id);
    if (n > CLUSTER_NODE_ID_MAX) n = CLUSTER_NODE_ID_MAX;
    memcpy(out, "EXOB", 4);
    out[4] = (unsigned char)b->protocol;
    memcpy(out + 5, b->namespace_hash, 8);
    out[13] = (unsigned char)(b->port >> 8);
    out[14] = (unsigned char)(b->port & 0xff);
    memcpy(out + 15, b->node_id, n);
    return 15 + n;
}

int cluster_beacon_decode(const unsigned char *bytes, size_t len, cluster_beacon *out) {
    memset(out, 0, sizeof *out);
    if (len < 16 || len > CLUSTER_BEACON_MAX_BYTES || memcmp(bytes, "EXOB", 4)) return -1;
    out->protocol = bytes[4];
    memcpy(out->namespace_hash, bytes + 5, 8);
    out->port = (bytes[13] << 8) | bytes[14];
    memcpy(out->node_id, bytes + 15, len - 15);
    out->node_id[len - 15] = 0;
    if (out->port == 0 || !cluster_node_id_valid(out->node_id)) return -1;
    return 0;
}
