/* cluster/message — the wire format between nodes: versioned JSON objects, one per ZeroMQ frame.
 *
 * Every message is {"v":1,"t":TYPE,"f":FROM_NODE_ID, ...type fields}. The decoder is the only
 * code that looks at bytes from the network: it enforces the size limit, the protocol version,
 * the message type and the presence and JSON type of every field the receiver will read, so the
 * rest of the cluster code can trust a decoded message's shape. It refuses anything else (the
 * caller drops the message and counts it); it never trusts a length or index from the peer.
 * It does not authenticate: CURVE (transport) does that before bytes reach here. */
#ifndef EXO_CLUSTER_MESSAGE_H
#define EXO_CLUSTER_MESSAGE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define CLUSTER_PROTOCOL_VERSION 1
/* The largest message a node accepts; bigger ones are dropped and counted. */
#define CLUSTER_MESSAGE_MAX_BYTES (4u << 20)
/* Node ids are printable ASCII (UUIDs in practice); anything longer is refused. */
#define CLUSTER_NODE_ID_MAX 64

enum cluster_message_type {
    CLUSTER_MSG_HEARTBEAT = 1, /* "hb": liveness + election key, every second; the first ones
                                * to a peer (hellos) also carry "ver" and "name" */
    CLUSTER_MSG_PEERS,         /* "peers": gossip of known peer addresses */
    CLUSTER_MSG_SUBMIT,        /* "sub": local events for the master to order */
    CLUSTER_MSG_ENTRIES,       /* "ents": log entries from the master (broadcast or sync reply) */
    CLUSTER_MSG_SYNC,          /* "sync": a follower asks for the log after its fork point */
    CLUSTER_MSG_PROBE,         /* "bw": bandwidth probe (padding) */
    CLUSTER_MSG_PROBE_ACK,     /* "bwa": its answer */
};

enum cluster_decode_result {
    CLUSTER_DECODE_OK = 0,
    CLUSTER_DECODE_OVERSIZED = 1,
    CLUSTER_DECODE_MALFORMED = 2,  /* not JSON, or a field missing / of the wrong type */
    CLUSTER_DECODE_VERSION = 3,    /* a protocol version we do not speak */
};

typedef struct cluster_message {
    enum cluster_message_type type;
    int version;
    const char *from; /* node id, points into root */
    json_t *root;     /* owned; the whole message object */
} cluster_message;

/* Decodes one frame. On CLUSTER_DECODE_OK the caller owns out->root (cluster_message_free).
 * On failure nothing is allocated and err says why (for logs). */
enum cluster_decode_result cluster_message_decode(const void *bytes, size_t len,
                                                  cluster_message *out, char *err, size_t errlen);
void cluster_message_free(cluster_message *m);

/* Checks that a log entry has the shape the log and apply() rely on:
 * {"idx":N>=1,"term":N>=1,"master":ID,"time":N,"origin":ID,"sess":STR,"seq":N>=1,"event":{..}}.
 * Returns 0 or -1 with err set. */
int cluster_entry_validate(const json_t *entry, char *err, size_t errlen);

/* A node id is 1..CLUSTER_NODE_ID_MAX printable ASCII characters without '/' or spaces. */
int cluster_node_id_valid(const char *id);

/* Starts a message object {"v":..,"t":type,"f":from}; the caller adds fields. */
json_t *cluster_message_new(enum cluster_message_type type, const char *from);
const char *cluster_message_type_name(enum cluster_message_type type);

/* Discovery beacon (UDP): "EXOB" | protocol u8 | namespace hash (8) | listen port u16 (big
 * endian) | node id (the rest, 1..CLUSTER_NODE_ID_MAX bytes). */
#define CLUSTER_BEACON_MAX_BYTES (15 + CLUSTER_NODE_ID_MAX)
typedef struct cluster_beacon {
    int protocol;
    unsigned char namespace_hash[8];
    int port;
    char node_id[CLUSTER_NODE_ID_MAX + 1];
} cluster_beacon;
/* Returns the encoded length (<= CLUSTER_BEACON_MAX_BYTES). */
size_t cluster_beacon_encode(const cluster_beacon *b, unsigned char *out);
/* Returns 0, or -1 for anything that is not a well-formed beacon. */
int cluster_beacon_decode(const unsigned char *bytes, size_t len, cluster_beacon *out);

#endif
