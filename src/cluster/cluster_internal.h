/* cluster_internal — the private shape of one cluster member, shared by the files of
 * src/cluster/ that run it: cluster.c (life, poll loop, dispatch, public reads) and the
 * concerns it calls: transport.c, discovery.c, membership.c, replication.c, local_log.c and
 * publish.c. Nothing outside src/cluster/ includes this; the door is cluster.h.
 *
 * Transport: every node binds a ROUTER (CURVE server) on --listen-port and connects one DEALER
 * (CURVE client) to each peer's ROUTER; a node sends on its DEALERs and receives on its ROUTER.
 * Every member holds the same keypair derived from the cluster secret; a ZAP handler admits only
 * clients presenting it, and clients only talk to servers that prove they hold it.
 *
 * Every function below runs on the member's thread with `lock` held (or before the thread
 * starts); none takes the lock itself. Calls go one way: cluster.c -> the concerns ->
 * replication/local_log -> transport; transport and local_log call no sibling. */
#ifndef EXO_CLUSTER_INTERNAL_H
#define EXO_CLUSTER_INTERNAL_H

#include "cluster/cluster.h"
#include "cluster/election.h"
#include "cluster/eventlog.h"
#include "cluster/identity.h"
#include "cluster/message.h"

#include <czmq.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define MS 1000000ull
#define BEACON_INTERVAL_NS (500 * MS)
#define HEARTBEAT_INTERVAL_NS (1000 * MS)
#define HELLO_INTERVAL_NS (150 * MS)
#define ELECTION_DEBOUNCE_NS (300 * MS)
#define STARTUP_GRACE_NS (1500 * MS)
#define SUBMIT_RESEND_NS (1000 * MS)
#define SYNC_INTERVAL_NS (400 * MS)
#define GOSSIP_INTERVAL_NS (30000 * MS)
#define GOSSIP_MIN_GAP_NS (3000 * MS)
#define STATE_DIAL_INTERVAL_NS (1000 * MS)
#define PROBE_BYTES 16384
#define PROBE_DELAY_NS (2000 * MS)
#define PROBE_INTERVAL_NS (600000 * MS)
#define EDGES_CHECK_NS (500 * MS)
#define EDGES_MIN_GAP_NS (3000 * MS)
#define EDGES_SETTLE_NS (2000 * MS)
#define EDGES_REFRESH_NS (300000 * MS)
#define MEMORY_CHECK_NS (10000 * MS)
#define MEMORY_REFRESH_NS (300000 * MS)
#define DISK_CHECK_NS (60000 * MS)
#define NETWORK_CHECK_NS (30000 * MS)
#define BATCH_MAX_BYTES (512u << 10)
#define MAX_PEERS 1024

typedef struct peer {
    char id[CLUSTER_NODE_ID_MAX + 1]; /* "" for a --peer bootstrap connection */
    char addr[64];
    int port;
    char name[128];
    zsock_t *dealer;
    zsock_t *monitor;
    int alive;
    uint64_t last_heard_ns;
    uint64_t alive_since_ns;
    uint64_t gone_since_ns;
    int auth_warned;
    /* What its last heartbeat said. */
    char sess[33];
    int64_t started_at_ms;
    uint64_t term, last_term, last_idx;
    int claims_master;
    int64_t their_ts_us;       /* their clock, echoed back for latency */
    uint64_t their_ts_recv_ns; /* when we got it */
    double rtt_ms;             /* smoothed round trip; < 0 until measured */
    double bandwidth_mbps;     /* < 0 until measured */
    uint64_t next_probe_ns;
    uint64_t connected_ns; /* when the DEALER was (re)created */
    int hellos_left;       /* heartbeats that still carry our version and name */
} peer;

typedef struct cluster {
    cluster_config options;
    cluster_identity identity;
    cluster_secret secret;
    char sess[17];  /* this run's session: orders our own submissions */
    char msess[17]; /* the master's own events (elections, timeouts) */
    int64_t started_at_ms;
    uint64_t started_ns;
    int started_with_log; /* it restarted: it had been in a cluster before */
    char dir[1100];       /* data_dir/cluster */
    int lock_fd;
    uint64_t peer_timeout_ns, node_timeout_ns, snapshot_every;

    pthread_t thread;
    atomic_int stop;
    pthread_mutex_t lock;

    /* Log and state. */
    eventlog *log;
    cluster_epoch *epochs;
    size_t n_epochs, cap_epochs;
    json_t *state;
    json_t *seqs; /* session -> last seq ordered */
    uint64_t max_term;
    uint64_t snapshot_idx;
    uint64_t broadcast_upto;
    int appended_since_sync;

    /* Election. */
    int is_master;
    uint64_t my_term;
    char master_id[CLUSTER_NODE_ID_MAX + 1];
    uint64_t membership_changed_ns;
    char candidate[CLUSTER_NODE_ID_MAX + 1];
    uint64_t candidate_since_ns;
    json_t *absent_since; /* master: node id -> first ms seen absent */

    /* Own submissions not yet seen ordered: [{"seq":k,"e":event}], by seq. */
    json_t *pending;
    uint64_t next_seq;
    uint64_t last_submit_ns;
    int submit_now;
    uint64_t last_sync_ns;
    int sync_now;

    /* Sockets. */
    zsock_t *router, *router_monitor, *zap;
    int udp_fd;
    peer *peers;
    size_t n_peers;
    int monitor_seq;

    /* Timers and last published info. */
    uint64_t next_beacon_ns, next_heartbeat_ns, next_hello_ns, next_gossip_ns, last_gossip_ns;
    uint64_t next_edges_ns, last_edges_ns, next_memory_ns, next_disk_ns, next_network_ns;
    uint64_t last_republish_ns, edges_refresh_ns, memory_published_ns;
    json_t *published_edges, *published_network, *seen_edges;
    uint64_t edges_settled_ns;
    uint64_t published_mem_avail, published_swap_free, published_disk_avail, mem_total;
    uint64_t published_gpu_avail;
    double published_bandwidth_gbs; /* in the last SystemInfo */
    int gossip_pending;
    int gossip_now; /* a member joined: introduce it to the others (and them to it) at once */
    int gossip_off; /* EXO_CLUSTER_NO_GOSSIP=1 (tests of the State-driven dialing) */
    uint64_t next_state_dial_ns;

    /* Counters. */
    uint64_t msgs_in, msgs_out, bytes_in, bytes_out, beacons_in, beacons_out, beacon_bytes_in,
        beacon_bytes_out, dropped_malformed, dropped_oversized, dropped_version, beacons_foreign,
        handshakes_rejected, send_failures, elections_won, truncations, events_ignored;
    uint64_t last_version_warn_ns, last_reject_warn_ns;
} cluster;

/* ---------- local_log.c: this node's log, State and snapshots ---------- */

static inline uint64_t local_log_count(const cluster *c) {
    return eventlog_count(c->log);
}

/* The term of the last entry (0 for an empty log). */
static inline uint64_t local_log_last_term(const cluster *c) {
    return c->n_epochs ? c->epochs[c->n_epochs - 1].term : 0;
}

/* Takes the lock file under data_dir/cluster, opens the log and replays it (from the snapshot
 * when it matches). Returns 0, or -1 after logging why. */
int local_log_open(cluster *c);
/* Appends an ordered entry (its "idx" must be the next one) and folds it in. 0 or -1. */
int local_log_append(cluster *c, const json_t *entry);
/* Keeps the first `keep` entries, cuts the rest and rebuilds epochs, seqs and State; own
 * submissions found in the cut part go back to pending. */
void local_log_rebuild(cluster *c, uint64_t keep);
/* Writes State at the current index to snapshot.json (atomically), if it moved. */
void local_log_snapshot(cluster *c);
/* The epochs as [[term, master, first idx], ...] (a new reference). */
json_t *local_log_epochs_json(cluster *c);

/* ---------- transport.c: sockets and the peer table ---------- */

/* Binds the ROUTER and starts the ZAP handler. Returns 0, or -1 after logging why. */
int transport_open(cluster *c);
void transport_handle_zap(cluster *c);
void transport_handle_router_monitor(cluster *c);
void transport_handle_peer_monitor(cluster *c, peer *p, uint64_t now);
/* Sends msg on one DEALER without blocking (dropped, and counted, when it cannot). */
void peer_send(cluster *c, zsock_t *dealer, json_t *msg);
/* Sends msg to every live peer that has an id. */
void peers_send_alive(cluster *c, json_t *msg);
peer *peer_find(cluster *c, const char *id);
/* A new connection to addr:port; id "" for a --peer bootstrap address. NULL when full or it
 * cannot connect. */
peer *peer_add(cluster *c, const char *id, const char *addr, int port);
/* Makes sure we have a connection to node id at addr:port (from a beacon, heartbeat or gossip);
 * NULL for our own id. */
peer *peer_ensure(cluster *c, const char *id, const char *addr, int port);
void peer_close(peer *p);
void peer_mark_gone(cluster *c, peer *p, uint64_t now, const char *why);
/* Peers came or went: the election debounces, gossip goes out soon. */
void membership_changed(cluster *c, uint64_t now);

/* ---------- discovery.c: beacons, --peer, gossip ---------- */

/* Opens the discovery port and connects to the --peer addresses. 0, or -1 after logging why. */
int discovery_open(cluster *c);
void discovery_beacon_send(cluster *c);
void discovery_beacon_receive(cluster *c);
void discovery_gossip_send(cluster *c, uint64_t now);
void discovery_gossip_handle(cluster *c, const json_t *m);
/* Dials, once a second, every member State lists that we have no connection to. */
void discovery_dial_state_members(cluster *c, uint64_t now);

/* ---------- membership.c: heartbeats, election, node timeouts ---------- */

/* all = 0: only peers that have not answered yet. */
void membership_send_heartbeats(cluster *c, uint64_t now, int all);
void membership_handle_heartbeat(cluster *c, const json_t *m, const char *from, const char *addr,
                                 uint64_t now);
void membership_elect(cluster *c, uint64_t now);
void membership_check_liveness(cluster *c, uint64_t now);
/* Master: a node in State that stays gone for the node timeout is removed (NodeTimedOut). */
void membership_time_out_nodes(cluster *c, int64_t now_ms);

/* ---------- replication.c: submissions, ordering, follower sync ---------- */

/* Queues one of our own events (takes ownership) for the master to order. */
void replication_submit(cluster *c, json_t *event);
/* An event the master itself decides (election, node timeout): ordered at once; takes
 * ownership. */
void replication_master_event(cluster *c, json_t *event);
/* Master: orders a session's submissions, exactly once and in sequence order. */
void replication_take(cluster *c, const char *origin, const char *sess, json_t *list);
void replication_handle_entries(cluster *c, const char *from, const json_t *m);
void replication_handle_sync(cluster *c, peer *p, const json_t *m);
void replication_send_pending(cluster *c, uint64_t now);
void replication_master_broadcast(cluster *c);
void replication_follower_tick(cluster *c, uint64_t now);

/* ---------- publish.c: node info and link measurements ---------- */

void publish_node_info_tick(cluster *c, uint64_t now);
void publish_send_probes(cluster *c, uint64_t now);
void publish_handle_probe(cluster *c, peer *p, const json_t *m, size_t len);
void publish_handle_probe_ack(peer *p, const json_t *m, uint64_t now);

#endif
