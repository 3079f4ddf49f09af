/* cluster — one node's member of the control plane: discovery, CURVE transport, liveness,
 * election, log replication and node-info publishing, run by one thread (see cluster.h).
 *
 * Transport: every node binds a ROUTER (CURVE server) on --listen-port and connects one DEALER
 * (CURVE client) to each peer's ROUTER; a node sends on its DEALERs and receives on its ROUTER.
 * Every member holds the same keypair derived from the cluster secret; a ZAP handler admits only
 * clients presenting it, and clients only talk to servers that prove they hold it.
 *
 * The thread holds `lock` while it works and releases it only while it waits on sockets, so
 * public functions called from other threads see a consistent state, log and peer table.
 * It refuses to run two members in one process (one ZAP handler per ZeroMQ context). */
#include "cluster/cluster.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/paths.h"
#include "base/strbuf.h"
#include "cluster/election.h"
#include "cluster/eventlog.h"
#include "cluster/identity.h"
#include "cluster/message.h"
#include "cluster/nodeinfo.h"
#include "cluster/state.h"

#include <arpa/inet.h>
#include <czmq.h>
#include <errno.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef EXO_VERSION
#define EXO_VERSION "0.0.0"
#endif

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
    int64_t their_ts_us;          /* their clock, echoed back for latency */
    uint64_t their_ts_recv_ns;    /* when we got it */
    double rtt_ms;                /* smoothed round trip; < 0 until measured */
    double bandwidth_mbps;        /* < 0 until measured */
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
    char dir[1100]; /* data_dir/cluster */
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

static cluster *self;
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t env_ms(const char *name, uint64_t def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return *end || x == 0 ? def : x;
}

/* ---------- sending ---------- */

static void send_json(cluster *c, zsock_t *dealer, json_t *msg) {
    if (!dealer) return;
    char *text = json_dumps(msg, JSON_COMPACT);
    if (!text) return;
    size_t len = strlen(text);
    if (zmq_send(zsock_resolve(dealer), text, len, ZMQ_DONTWAIT) < 0) {
        c->send_failures++;
    } else {
        c->msgs_out++;
        c->bytes_out += len;
    }
    free(text);
}

static peer *find_peer(cluster *c, const char *id) {
    for (size_t i = 0; i < c->n_peers; i++)
        if (c->peers[i].id[0] && !strcmp(c->peers[i].id, id)) return &c->peers[i];
    return NULL;
}

static void send_to_alive(cluster *c, json_t *msg) {
    char *text = json_dumps(msg, JSON_COMPACT);
    if (!text) return;
    size_t len = strlen(text);
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (!p->alive || !p->id[0] || !p->dealer) continue;
        if (zmq_send(zsock_resolve(p->dealer), text, len, ZMQ_DONTWAIT) < 0) {
            c->send_failures++;
        } else {
            c->msgs_out++;
            c->bytes_out += len;
        }
    }
    free(text);
}

/* ---------- peers and sockets ---------- */

static void peer_close(peer *p) {
    if (p->dealer) zmq_socket_monitor(zsock_resolve(p->dealer), NULL, 0);
    zsock_destroy(&p->monitor);
    zsock_destroy(&p->dealer);
}

static int peer_connect(cluster *c, peer *p) {
    char endpoint[128];
    snprintf(endpoint, sizeof endpoint, "tcp://%s:%d", p->addr, p->port);
    p->dealer = zsock_new(ZMQ_DEALER);
    if (!p->dealer) return -1;
    void *s = zsock_resolve(p->dealer);
    int one = 1, zero = 0, hwm = 1000, ivl = 200, ivl_max = 2000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_IMMEDIATE, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, c->secret.public_key, 32);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, c->secret.public_key, 32);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, c->secret.secret_key, 32);
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://exo-cluster-monitor-%d", ++c->monitor_seq);
    if (zmq_socket_monitor(s, mon,
                           ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
        p->monitor = zsock_new(ZMQ_PAIR);
        if (p->monitor && zsock_connect(p->monitor, "%s", mon)) zsock_destroy(&p->monitor);
    }
    p->connected_ns = clock_now_ns();
    if (zsock_connect(p->dealer, "%s", endpoint)) {
        log_warn("cluster: cannot connect to %s", endpoint);
        peer_close(p);
        return -1;
    }
    return 0;
}

static peer *add_peer(cluster *c, const char *id, const char *addr, int port) {
    if (c->n_peers >= MAX_PEERS) return NULL;
    peer *p = &c->peers[c->n_peers];
    memset(p, 0, sizeof *p);
    snprintf(p->id, sizeof p->id, "%s", id);
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    p->port = port;
    p->rtt_ms = -1;
    p->bandwidth_mbps = -1;
    if (peer_connect(c, p)) return NULL;
    c->n_peers++;
    log_debug("cluster: connecting to %s at %s:%d", id[0] ? id : "bootstrap peer", addr, port);
    c->next_hello_ns = 0; /* say hello right away */
    return p;
}

/* Makes sure we have a connection to node id at addr:port (from a beacon, heartbeat or gossip). */
static peer *ensure_peer(cluster *c, const char *id, const char *addr, int port) {
    if (!strcmp(id, c->identity.node_id)) return NULL;
    peer *p = find_peer(c, id);
    /* A node is reachable at several addresses (loopback and LAN beacons): keep the first
     * unless it stops answering there, or its port changed (it restarted elsewhere). */
    if (p && !p->alive &&
        (p->port != port ||
         (strcmp(p->addr, addr) && clock_now_ns() - p->connected_ns > 3 * 1000 * MS))) {
        peer_close(p);
        snprintf(p->addr, sizeof p->addr, "%s", addr);
        p->port = port;
        if (peer_connect(c, p)) p->dealer = NULL;
    }
    if (p) return p;
    return add_peer(c, id, addr, port);
}

static void membership_changed(cluster *c, uint64_t now) {
    c->membership_changed_ns = now;
    c->gossip_pending = 1;
}

static void mark_gone(cluster *c, peer *p, uint64_t now, const char *why) {
    if (!p->alive) return;
    p->alive = 0;
    p->gone_since_ns = now;
    log_info("cluster: peer %s (%s) is gone: %s", p->id, p->name, why);
    membership_changed(c, now);
}

static void handle_monitor(cluster *c, peer *p, uint64_t now) {
    zmsg_t *m = zmsg_recv(p->monitor);
    if (!m) return;
    zframe_t *f = zmsg_first(m);
    if (f && zframe_size(f) >= 2) {
        uint16_t event;
        memcpy(&event, zframe_data(f), 2);
        if (event == ZMQ_EVENT_DISCONNECTED) {
            mark_gone(c, p, now, "connection closed");
        } else if (!p->auth_warned) {
            p->auth_warned = 1;
            log_warn("cluster: %s:%d refused this node's cluster key, or does not hold it: check "
                     "that both use the same --namespace and --cluster-key",
                     p->addr, p->port);
        }
    }
    zmsg_destroy(&m);
}

/* ZAP: admit a CURVE client only if it presents the cluster public key. */
static void handle_zap(cluster *c) {
    zmsg_t *req = zmsg_recv(c->zap);
    if (!req) return;
    char *version = zmsg_popstr(req), *request_id = zmsg_popstr(req);
    char *domain = zmsg_popstr(req), *address = zmsg_popstr(req);
    zframe_t *identity = zmsg_pop(req);
    char *mechanism = zmsg_popstr(req);
    zframe_t *key = zmsg_pop(req);
    int ok = mechanism && !strcmp(mechanism, "CURVE") && key && zframe_size(key) == 32 &&
             !sodium_memcmp(zframe_data(key), c->secret.public_key, 32);
    if (!ok) {
        c->handshakes_rejected++;
        if (clock_now_ns() - c->last_reject_warn_ns > 10000 * MS) {
            c->last_reject_warn_ns = clock_now_ns();
            log_warn("cluster: rejected a connection from %s: it does not hold this cluster's key",
                     address ? address : "?");
        }
    }
    zmsg_t *rep = zmsg_new();
    zmsg_addstr(rep, "1.0");
    zmsg_addstr(rep, request_id ? request_id : "");
    zmsg_addstr(rep, ok ? "200" : "400");
    zmsg_addstr(rep, ok ? "OK" : "not a cluster member");
    zmsg_addstr(rep, "");
    zmsg_addmem(rep, NULL, 0);
    zmsg_send(&rep, c->zap);
    free(version);
    free(request_id);
    free(domain);
    free(address);
    free(mechanism);
    zframe_destroy(&identity);
    zframe_destroy(&key);
    zmsg_destroy(&req);
}

static void handle_router_monitor(cluster *c) {
    zmsg_t *m = zmsg_recv(c->router_monitor);
    if (!m) return;
    zframe_t *f = zmsg_first(m);
    if (f && zframe_size(f) >= 2) {
        uint16_t event;
        memcpy(&event, zframe_data(f), 2);
        if (event & (ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)) {
            c->handshakes_rejected++;
            if (clock_now_ns() - c->last_reject_warn_ns < 10000 * MS) goto out;
            c->last_reject_warn_ns = clock_now_ns();
            log_warn("cluster: rejected a connection that failed the CURVE handshake (a node "
                     "without this cluster's key, or not an exo node)");
        }
    }
out:
    zmsg_destroy(&m);
}

/* ---------- beacons ---------- */

static int beacon_open(cluster *c) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)c->options.discovery_port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static void beacon_send(cluster *c) {
    cluster_beacon b = {.protocol = CLUSTER_PROTOCOL_VERSION, .port = c->options.listen_port};
    memcpy(b.namespace_hash, c->secret.beacon_hash, 8);
    snprintf(b.node_id, sizeof b.node_id, "%s", c->identity.node_id);
    unsigned char buf[CLUSTER_BEACON_MAX_BYTES];
    size_t n = cluster_beacon_encode(&b, buf);
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs)) return;
    int sent_loopback = 0;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
        struct sockaddr_in dst = {.sin_family = AF_INET,
                                  .sin_port = htons((uint16_t)c->options.discovery_port)};
        if (i->ifa_flags & IFF_LOOPBACK) {
            if (sent_loopback++) continue;
            dst.sin_addr.s_addr = htonl(0x7fffffff); /* 127.255.255.255: every process here */
        } else if ((i->ifa_flags & IFF_BROADCAST) && i->ifa_broadaddr) {
            dst.sin_addr = ((struct sockaddr_in *)i->ifa_broadaddr)->sin_addr;
        } else {
            continue;
        }
        if (sendto(c->udp_fd, buf, n, 0, (struct sockaddr *)&dst, sizeof dst) == (ssize_t)n) {
            c->beacons_out++;
            c->beacon_bytes_out += n;
        }
    }
    freeifaddrs(ifs);
}

static void beacon_receive(cluster *c) {
    for (int k = 0; k < 256; k++) {
        unsigned char buf[256];
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(c->udp_fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
        if (n < 0) return;
        c->beacons_in++;
        c->beacon_bytes_in += (uint64_t)n;
        cluster_beacon b;
        if (cluster_beacon_decode(buf, (size_t)n, &b)) {
            c->beacons_foreign++;
            continue;
        }
        if (b.protocol != CLUSTER_PROTOCOL_VERSION ||
            memcmp(b.namespace_hash, c->secret.beacon_hash, 8)) {
            c->beacons_foreign++;
            continue;
        }
        if (!strcmp(b.node_id, c->identity.node_id)) continue;
        char addr[64];
        inet_ntop(AF_INET, &from.sin_addr, addr, sizeof addr);
        peer *p = find_peer(c, b.node_id);
        if (p && p->alive) continue;
        ensure_peer(c, b.node_id, addr, b.port);
    }
}

/* ---------- the log ---------- */

static uint64_t log_count(cluster *c) {
    return eventlog_count(c->log);
}

static uint64_t last_term(cluster *c) {
    return c->n_epochs ? c->epochs[c->n_epochs - 1].term : 0;
}

static void epochs_note(cluster *c, uint64_t term, const char *master, uint64_t idx) {
    if (c->n_epochs) {
        cluster_epoch *last = &c->epochs[c->n_epochs - 1];
        if (last->term == term && !strcmp(last->master, master)) return;
    }
    if (c->n_epochs == c->cap_epochs) {
        size_t cap = c->cap_epochs ? c->cap_epochs * 2 : 16;
        cluster_epoch *e = realloc(c->epochs, cap * sizeof *e);
        if (!e) return;
        c->epochs = e;
        c->cap_epochs = cap;
    }
    cluster_epoch *e = &c->epochs[c->n_epochs++];
    e->term = term;
    snprintf(e->master, sizeof e->master, "%s", master);
    e->first = idx;
    if (term > c->max_term) c->max_term = term;
}

/* Drops own pending submissions the log now holds. */
static void pending_seen(cluster *c, uint64_t seq) {
    while (json_array_size(c->pending) > 0 &&
           (uint64_t)json_integer_value(json_object_get(json_array_get(c->pending, 0), "seq")) <=
               seq)
        json_array_remove(c->pending, 0);
}

/* Folds an entry that is already in the log file into memory: epochs, seqs, state. */
static void fold_entry(cluster *c, const json_t *entry) {
    uint64_t idx = (uint64_t)json_integer_value(json_object_get(entry, "idx"));
    uint64_t term = (uint64_t)json_integer_value(json_object_get(entry, "term"));
    const char *sess = json_string_value(json_object_get(entry, "sess"));
    json_int_t seq = json_integer_value(json_object_get(entry, "seq"));
    epochs_note(c, term, json_string_value(json_object_get(entry, "master")), idx);
    if (json_integer_value(json_object_get(c->seqs, sess)) < seq)
        json_object_set_new(c->seqs, sess, json_integer(seq));
    char err[256];
    enum cluster_apply_result r = cluster_state_apply(c->state, entry, err, sizeof err);
    if (r != CLUSTER_APPLY_OK) {
        c->events_ignored++;
        log_debug("cluster: entry %llu: %s", (unsigned long long)idx, err);
    }
    if (!strcmp(sess, c->sess)) pending_seen(c, (uint64_t)seq);
}

static int append_entry(cluster *c, const json_t *entry) {
    char *text = json_dumps(entry, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text) return -1;
    char err[256];
    uint64_t idx = (uint64_t)json_integer_value(json_object_get(entry, "idx"));
    int rc = eventlog_append(c->log, idx, text, strlen(text), err, sizeof err);
    if (rc) {
        free(text);
        log_error("cluster: %s", err);
        return -1;
    }
    c->appended_since_sync = 1;
    /* Fold the canonical text, so every node's State has the same key order too. */
    json_t *canonical = json_loads(text, 0, NULL);
    free(text);
    fold_entry(c, canonical ? canonical : entry);
    json_decref(canonical);
    return 0;
}

/* Reads entry idx back from the log file. */
static json_t *read_entry(cluster *c, uint64_t idx) {
    size_t len;
    char *text = eventlog_read(c->log, idx, &len);
    if (!text) return NULL;
    json_t *e = json_loadb(text, len, 0, NULL);
    free(text);
    char err[128];
    if (e && cluster_entry_validate(e, err, sizeof err)) {
        json_decref(e);
        return NULL;
    }
    return e;
}

static void snapshot_path(cluster *c, char *out, size_t n) {
    snprintf(out, n, "%s/snapshot.json", c->dir);
}

static json_t *epochs_json(cluster *c) {
    json_t *a = json_array();
    for (size_t i = 0; i < c->n_epochs; i++)
        json_array_append_new(a, json_pack("[I, s, I]", (json_int_t)c->epochs[i].term,
                                           c->epochs[i].master, (json_int_t)c->epochs[i].first));
    return a;
}

static void write_snapshot(cluster *c) {
    uint64_t idx = log_count(c);
    if (!idx || idx == c->snapshot_idx) return;
    eventlog_sync(c->log);
    json_t *snap = json_pack("{s:I, s:o, s:O, s:O}", "idx", (json_int_t)idx, "epochs",
                             epochs_json(c), "seqs", c->seqs, "state", c->state);
    char path[1200], tmp[1300];
    snapshot_path(c, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(snap, tmp, JSON_COMPACT) == 0) {
        FILE *f = fopen(tmp, "r+");
        if (f) {
            fsync(fileno(f));
            fclose(f);
        }
        if (rename(tmp, path) == 0) c->snapshot_idx = idx;
    }
    json_decref(snap);
}

/* Loads the snapshot if it matches the log's first `keep` entries. */
static int load_snapshot(cluster *c, uint64_t keep) {
    char path[1200];
    snapshot_path(c, path, sizeof path);
    json_t *snap = json_load_file(path, 0, NULL);
    if (!snap) return -1;
    json_t *jidx = json_object_get(snap, "idx"), *eps = json_object_get(snap, "epochs");
    json_t *seqs = json_object_get(snap, "seqs"), *state = json_object_get(snap, "state");
    uint64_t idx = (uint64_t)json_integer_value(jidx);
    int ok = json_is_integer(jidx) && idx >= 1 && idx <= keep && json_is_array(eps) &&
             json_is_object(seqs) && json_is_object(state) &&
             (uint64_t)json_integer_value(json_object_get(state, "lastEventAppliedIdx")) == idx;
    json_t *at = ok ? read_entry(c, idx) : NULL;
    ok = ok && at;
    c->n_epochs = 0;
    size_t i;
    json_t *ep;
    json_array_foreach(eps, i, ep) {
        if (!ok) break;
        const char *m = json_string_value(json_array_get(ep, 1));
        uint64_t first = (uint64_t)json_integer_value(json_array_get(ep, 2));
        if (!m || first > idx) {
            ok = 0;
            break;
        }
        epochs_note(c, (uint64_t)json_integer_value(json_array_get(ep, 0)), m, first);
    }
    if (ok) { /* the snapshot's last epoch must be the entry's own */
        const cluster_epoch *e = cluster_epoch_at(c->epochs, c->n_epochs, idx);
        ok = e && e->term == (uint64_t)json_integer_value(json_object_get(at, "term")) &&
             !strcmp(e->master, json_string_value(json_object_get(at, "master")));
    }
    json_decref(at);
    if (!ok) {
        c->n_epochs = 0;
        json_decref(snap);
        return -1;
    }
    json_decref(c->state);
    json_decref(c->seqs);
    c->state = json_incref(state);
    c->seqs = json_incref(seqs);
    c->snapshot_idx = idx;
    json_decref(snap);
    return 0;
}

/* Rebuilds epochs, seqs and State from disk for the first `keep` entries, then cuts the file
 * there. Own submissions found in the cut part go back to pending, so they are ordered again. */
static void rebuild(cluster *c, uint64_t keep) {
    uint64_t count = log_count(c);
    for (uint64_t i = keep + 1; i <= count; i++) {
        json_t *e = read_entry(c, i);
        if (e && !strcmp(json_string_value(json_object_get(e, "sess")), c->sess)) {
            json_int_t seq = json_integer_value(json_object_get(e, "seq"));
            size_t at = 0;
            int dup = 0;
            for (; at < json_array_size(c->pending); at++) {
                json_int_t s = json_integer_value(json_object_get(json_array_get(c->pending, at), "seq"));
                if (s == seq) dup = 1;
                if (s >= seq) break;
            }
            if (!dup)
                json_array_insert_new(c->pending, at,
                                      json_pack("{s:I, s:O}", "seq", seq, "e",
                                                json_object_get(e, "event")));
        }
        json_decref(e);
    }
    if (keep < count) {
        if (eventlog_truncate(c->log, keep)) log_error("cluster: cannot truncate the event log");
        c->truncations++;
        log_info("cluster: dropped log entries %llu..%llu that the master does not hold",
                 (unsigned long long)keep + 1, (unsigned long long)count);
    }
    json_decref(c->state);
    json_decref(c->seqs);
    c->state = cluster_state_new();
    c->seqs = json_object();
    c->n_epochs = 0;
    uint64_t from = 1;
    if (load_snapshot(c, keep) == 0) {
        from = c->snapshot_idx + 1;
    } else {
        char path[1200];
        snapshot_path(c, path, sizeof path);
        unlink(path);
        c->snapshot_idx = 0;
    }
    for (uint64_t i = from; i <= log_count(c); i++) {
        json_t *e = read_entry(c, i);
        if (!e || (uint64_t)json_integer_value(json_object_get(e, "idx")) != i) {
            log_warn("cluster: log entry %llu is unreadable; keeping the %llu before it",
                     (unsigned long long)i, (unsigned long long)i - 1);
            json_decref(e);
            eventlog_truncate(c->log, i - 1);
            break;
        }
        fold_entry(c, e);
        json_decref(e);
    }
    if (c->broadcast_upto > log_count(c)) c->broadcast_upto = log_count(c);
}

/* ---------- master: ordering ---------- */

static void master_append(cluster *c, const char *origin, const char *sess, uint64_t seq,
                          json_t *event) {
    json_t *entry = json_pack("{s:I, s:I, s:s, s:I, s:s, s:s, s:I, s:O}", "idx",
                              (json_int_t)log_count(c) + 1, "term", (json_int_t)c->my_term,
                              "master", c->identity.node_id, "time", (json_int_t)clock_unix_ms(),
                              "origin", origin, "sess", sess, "seq", (json_int_t)seq, "event",
                              event);
    append_entry(c, entry);
    json_decref(entry);
}

/* Orders a session's submissions: exactly once, in sequence order. */
static void master_take(cluster *c, const char *origin, const char *sess, json_t *list) {
    json_t *items = json_copy(list); /* appending our own events shrinks c->pending */
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        uint64_t seq = (uint64_t)json_integer_value(json_object_get(it, "seq"));
        uint64_t last = (uint64_t)json_integer_value(json_object_get(c->seqs, sess));
        if (seq != last + 1) continue; /* duplicate, or a gap the sender will fill */
        master_append(c, origin, sess, seq, json_object_get(it, "e"));
    }
    json_decref(items);
}

/* An event the master itself decides (election, node timeout): ordered at once. */
static void master_event(cluster *c, json_t *event) {
    uint64_t seq = (uint64_t)json_integer_value(json_object_get(c->seqs, c->msess)) + 1;
    master_append(c, c->identity.node_id, c->msess, seq, event);
    json_decref(event);
}

static json_t *entries_message(cluster *c, uint64_t from, uint64_t upto, int trunc,
                               uint64_t *sent_upto) {
    json_t *msg = cluster_message_new(CLUSTER_MSG_ENTRIES, c->identity.node_id);
    if (from > 1) {
        const cluster_epoch *e = cluster_epoch_at(c->epochs, c->n_epochs, from - 1);
        json_object_set_new(msg, "prev", json_pack("[I, I, s]", (json_int_t)from - 1,
                                                   (json_int_t)(e ? e->term : 1),
                                                   e ? e->master : c->identity.node_id));
    } else {
        json_object_set_new(msg, "prev", json_null());
    }
    json_t *ents = json_array();
    size_t bytes = 0;
    uint64_t i = from;
    for (; i <= upto && bytes < BATCH_MAX_BYTES; i++) {
        size_t len;
        char *text = eventlog_read(c->log, i, &len);
        json_t *e = text ? json_loadb(text, len, 0, NULL) : NULL;
        free(text);
        if (!e) break;
        json_array_append_new(ents, e);
        bytes += len;
    }
    json_object_set_new(msg, "ents", ents);
    json_object_set_new(msg, "more", json_boolean(i <= upto));
    json_object_set_new(msg, "trunc", json_boolean(trunc && i > upto));
    *sent_upto = i - 1;
    return msg;
}

static void master_broadcast(cluster *c) {
    while (c->broadcast_upto < log_count(c)) {
        uint64_t sent;
        json_t *msg = entries_message(c, c->broadcast_upto + 1, log_count(c), 0, &sent);
        if (sent <= c->broadcast_upto) {
            json_decref(msg);
            break;
        }
        json_object_set_new(msg, "more", json_false());
        send_to_alive(c, msg);
        json_decref(msg);
        c->broadcast_upto = sent;
    }
}

static void handle_sync(cluster *c, peer *p, const json_t *m) {
    if (!c->is_master || !p) return;
    json_t *eps = json_object_get(m, "epochs");
    size_t n = json_array_size(eps);
    cluster_epoch *theirs = calloc(n ? n : 1, sizeof *theirs);
    if (!theirs) return;
    for (size_t i = 0; i < n; i++) {
        json_t *ep = json_array_get(eps, i);
        theirs[i].term = (uint64_t)json_integer_value(json_array_get(ep, 0));
        snprintf(theirs[i].master, sizeof theirs[i].master, "%s",
                 json_string_value(json_array_get(ep, 1)));
        theirs[i].first = (uint64_t)json_integer_value(json_array_get(ep, 2));
    }
    uint64_t since = (uint64_t)json_integer_value(json_object_get(m, "since"));
    uint64_t fork = cluster_fork_point(theirs, n, since, c->epochs, c->n_epochs, log_count(c));
    free(theirs);
    uint64_t sent;
    json_t *msg = entries_message(c, fork + 1, log_count(c), 1, &sent);
    send_json(c, p->dealer, msg);
    json_decref(msg);
}

/* ---------- follower: taking entries ---------- */

static void request_sync(cluster *c) {
    c->sync_now = 1;
}

static void send_sync(cluster *c, uint64_t now) {
    peer *m = find_peer(c, c->master_id);
    if (!m || !m->alive) return;
    json_t *msg = cluster_message_new(CLUSTER_MSG_SYNC, c->identity.node_id);
    json_object_set_new(msg, "since", json_integer((json_int_t)log_count(c)));
    json_object_set_new(msg, "epochs", epochs_json(c));
    send_json(c, m->dealer, msg);
    json_decref(msg);
    c->last_sync_ns = now;
    c->sync_now = 0;
}

static int same_epoch_at(cluster *c, uint64_t idx, uint64_t term, const char *master) {
    const cluster_epoch *e = cluster_epoch_at(c->epochs, c->n_epochs, idx);
    return e && e->term == term && !strcmp(e->master, master);
}

static void handle_entries(cluster *c, const char *from, const json_t *m) {
    if (c->is_master || strcmp(from, c->master_id)) return; /* only our master orders */
    json_t *prev = json_object_get(m, "prev");
    uint64_t pi = json_is_null(prev) ? 0 : (uint64_t)json_integer_value(json_array_get(prev, 0));
    if (pi > log_count(c)) {
        request_sync(c);
        return;
    }
    if (pi > 0 && !same_epoch_at(c, pi, (uint64_t)json_integer_value(json_array_get(prev, 1)),
                                 json_string_value(json_array_get(prev, 2)))) {
        request_sync(c);
        return;
    }
    json_t *ents = json_object_get(m, "ents");
    size_t i;
    json_t *e;
    json_array_foreach(ents, i, e) {
        uint64_t idx = pi + 1 + i;
        uint64_t term = (uint64_t)json_integer_value(json_object_get(e, "term"));
        const char *master = json_string_value(json_object_get(e, "master"));
        if (idx <= log_count(c)) {
            if (same_epoch_at(c, idx, term, master)) continue;
            rebuild(c, idx - 1);
        }
        if (append_entry(c, e)) return;
    }
    uint64_t end = pi + json_array_size(ents);
    peer *mp = find_peer(c, from);
    if (mp && end > mp->last_idx) { /* it holds what it sent, even if its heartbeat lags */
        mp->last_idx = end;
        if (json_array_size(ents))
            mp->last_term = (uint64_t)json_integer_value(
                json_object_get(json_array_get(ents, json_array_size(ents) - 1), "term"));
    }
    if (json_is_true(json_object_get(m, "trunc")) && log_count(c) > end) rebuild(c, end);
    if (json_is_true(json_object_get(m, "more"))) request_sync(c);
}

/* ---------- heartbeats and election ---------- */

/* all = 0: only peers that have not answered yet (their connection may not have been ready
 * for the last hello; ZMQ_IMMEDIATE drops what cannot be sent). */
static void send_heartbeat_to(cluster *c, peer *p, uint64_t now) {
    int64_t now_us = (int64_t)(now / 1000);
    {
        json_t *hb = cluster_message_new(CLUSTER_MSG_HEARTBEAT, c->identity.node_id);
        /* A hello asks for an immediate answer: we have not heard from this peer yet. */
        if (!p->alive) json_object_set_new(hb, "hello", json_true());
        if (!p->alive || p->hellos_left > 0) { /* a hello: who we are, on (re)connection */
            if (p->alive) p->hellos_left--;
            json_object_set_new(hb, "ver", json_string(EXO_VERSION));
            json_object_set_new(hb, "name", json_string(c->identity.friendly_name));
        }
        json_object_set_new(hb, "port", json_integer(c->options.listen_port));
        json_object_set_new(hb, "sess", json_string(c->sess));
        json_object_set_new(hb, "sa", json_integer(c->started_at_ms));
        json_object_set_new(hb, "term", json_integer((json_int_t)c->max_term));
        json_object_set_new(hb, "lt", json_integer((json_int_t)last_term(c)));
        json_object_set_new(hb, "li", json_integer((json_int_t)log_count(c)));
        json_object_set_new(hb, "m", json_boolean(c->is_master));
        json_object_set_new(hb, "ts", json_integer(now_us));
        if (p->their_ts_recv_ns && p->alive) {
            json_object_set_new(hb, "ets", json_integer(p->their_ts_us));
            json_object_set_new(hb, "edl",
                                json_integer((json_int_t)((now - p->their_ts_recv_ns) / 1000)));
        }
        send_json(c, p->dealer, hb);
        json_decref(hb);
    }
}

static void send_heartbeats(cluster *c, uint64_t now, int all) {
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (!p->dealer || (!all && p->alive)) continue;
        send_heartbeat_to(c, p, now);
    }
}

static void handle_heartbeat(cluster *c, const json_t *m, const char *from, const char *addr,
                             uint64_t now) {
    int port = (int)json_integer_value(json_object_get(m, "port"));
    peer *p = find_peer(c, from);
    if (!p) p = ensure_peer(c, from, addr[0] ? addr : "127.0.0.1", port);
    if (!p) return;
    const char *sess = json_string_value(json_object_get(m, "sess"));
    if (p->sess[0] && strcmp(p->sess, sess)) {
        log_info("cluster: peer %s restarted", from);
        p->hellos_left = 3;
        p->their_ts_recv_ns = 0;
    }
    snprintf(p->sess, sizeof p->sess, "%s", sess);
    json_t *name = json_object_get(m, "name");
    if (name) snprintf(p->name, sizeof p->name, "%s", json_string_value(name));
    p->started_at_ms = json_integer_value(json_object_get(m, "sa"));
    p->term = (uint64_t)json_integer_value(json_object_get(m, "term"));
    p->last_term = (uint64_t)json_integer_value(json_object_get(m, "lt"));
    p->last_idx = (uint64_t)json_integer_value(json_object_get(m, "li"));
    p->claims_master = json_is_true(json_object_get(m, "m"));
    if (p->term > c->max_term) c->max_term = p->term;
    p->their_ts_us = json_integer_value(json_object_get(m, "ts"));
    p->their_ts_recv_ns = now;
    json_t *ets = json_object_get(m, "ets");
    if (ets) {
        int64_t rtt_us = (int64_t)(now / 1000) - json_integer_value(ets) -
                         json_integer_value(json_object_get(m, "edl"));
        if (rtt_us >= 0 && rtt_us < 60000000) {
            double ms = (double)rtt_us / 1000.0;
            p->rtt_ms = p->rtt_ms < 0 ? ms : 0.8 * p->rtt_ms + 0.2 * ms;
        }
    }
    p->last_heard_ns = now;
    if (!p->alive) {
        p->alive = 1;
        p->alive_since_ns = now;
        p->hellos_left = 3;
        p->next_probe_ns = now + PROBE_DELAY_NS + randombytes_uniform(3000) * MS;
        log_info("cluster: peer %s (%s) joined from %s:%d", from, p->name, p->addr, p->port);
        membership_changed(c, now);
        /* Gossip at join, not after a quiet period: nodes that bootstrapped through this one
         * must learn of each other even if it dies a moment later. */
        c->gossip_now = 1;
    }
    if (json_is_true(json_object_get(m, "hello"))) send_heartbeat_to(c, p, now);
}

static void become_master(cluster *c, uint64_t now) {
    uint64_t term = c->max_term;
    if (last_term(c) > term) term = last_term(c);
    for (size_t i = 0; i < c->n_peers; i++)
        if (c->peers[i].term > term) term = c->peers[i].term;
    c->my_term = term + 1;
    c->max_term = c->my_term;
    c->is_master = 1;
    snprintf(c->master_id, sizeof c->master_id, "%s", c->identity.node_id);
    c->elections_won++;
    json_object_clear(c->absent_since);
    c->broadcast_upto = log_count(c);
    log_info("cluster: this node is master (term %llu, log at %llu)",
             (unsigned long long)c->my_term, (unsigned long long)log_count(c));
    master_event(c, json_pack("{s:{s:s, s:I}}", "MasterElected", "nodeId", c->identity.node_id,
                              "term", (json_int_t)c->my_term));
    c->next_heartbeat_ns = now;
}

static void elect(cluster *c, uint64_t now) {
    cluster_rank_key keys[MAX_PEERS + 1];
    size_t n = 0;
    keys[n++] = (cluster_rank_key){last_term(c), log_count(c), c->is_master, c->started_at_ms,
                                   c->identity.node_id};
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (!p->alive || !p->id[0]) continue;
        keys[n++] = (cluster_rank_key){p->last_term, p->last_idx, p->claims_master,
                                       p->started_at_ms, p->id};
    }
    const char *best = keys[cluster_rank_best(keys, n)].node_id;
    if (strcmp(best, c->candidate)) {
        snprintf(c->candidate, sizeof c->candidate, "%s", best);
        c->candidate_since_ns = now;
    }
    if (strcmp(best, c->identity.node_id)) {
        if (c->is_master) {
            log_info("cluster: stepping down: %s ranks higher", best);
            c->is_master = 0;
        }
        /* Our master: the best-ranked live peer that says it is master. */
        const char *m = "";
        cluster_rank_key *mk = NULL;
        for (size_t i = 1; i < n; i++) {
            peer *p = find_peer(c, keys[i].node_id);
            if (!p || !p->claims_master) continue;
            if (!mk || cluster_rank_compare(&keys[i], mk) > 0) {
                mk = &keys[i];
                m = keys[i].node_id;
            }
        }
        if (strcmp(m, c->master_id)) {
            if (m[0]) log_info("cluster: following master %s", m);
            snprintf(c->master_id, sizeof c->master_id, "%s", m);
            c->submit_now = 1;
            c->sync_now = 1;
        }
        return;
    }
    if (c->is_master) return;
    if (c->master_id[0] && strcmp(c->master_id, c->identity.node_id)) c->master_id[0] = 0;
    /* A node that restarts with a log must not found a rival cluster before it has heard the
     * one it left (its term could collide with the term they moved on to): wait longer. */
    uint64_t grace = c->started_with_log ? 3 * STARTUP_GRACE_NS : STARTUP_GRACE_NS;
    if (now - c->started_ns < grace) return;
    /* Nor while a peer we just discovered has not answered yet (it may be the master); peers
     * that refused our key are outsiders and do not count. */
    for (size_t i = 0; c->started_with_log && i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (p->id[0] && !p->alive && !p->alive_since_ns && !p->auth_warned &&
            now - p->connected_ns < c->peer_timeout_ns)
            return;
    }
    /* While a cluster is booting, peers keep appearing: wait for a calmer membership. */
    uint64_t debounce = now - c->started_ns < 5000 * MS ? 3 * ELECTION_DEBOUNCE_NS
                                                        : ELECTION_DEBOUNCE_NS;
    if (now - c->membership_changed_ns < debounce) return;
    if (now - c->candidate_since_ns < ELECTION_DEBOUNCE_NS) return;
    become_master(c, now);
}

static void check_liveness(cluster *c, uint64_t now) {
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (p->alive && now - p->last_heard_ns > c->peer_timeout_ns)
            mark_gone(c, p, now, "no heartbeat within the peer timeout");
    }
}

/* Master: a node in State that stays gone for the node timeout is removed (NodeTimedOut). */
static void master_time_out_nodes(cluster *c, int64_t now_ms) {
    json_t *ids = json_object_get(c->state, "nodeIdentities");
    const char *id;
    json_t *v;
    json_object_foreach(ids, id, v) {
        if (!strcmp(id, c->identity.node_id)) continue;
        peer *p = find_peer(c, id);
        if (p && p->alive) {
            json_object_del(c->absent_since, id);
            continue;
        }
        json_t *since = json_object_get(c->absent_since, id);
        if (!since) {
            json_object_set_new(c->absent_since, id, json_integer(now_ms));
            continue;
        }
        if ((uint64_t)(now_ms - json_integer_value(since)) * MS < c->node_timeout_ns) continue;
        json_object_del(c->absent_since, id);
        log_info("cluster: node %s gone for %llu s: removing it from the cluster state", id,
                 (unsigned long long)(c->node_timeout_ns / 1000000000ull));
        char *gone = strdup(id);
        master_event(c, json_pack("{s:{s:s}}", "NodeTimedOut", "nodeId", gone));
        free(gone);
        break; /* the iterator is invalid once State changes; the rest wait a tick */
    }
}

/* ---------- node info ---------- */

static void submit_locked(cluster *c, json_t *event) {
    json_array_append_new(c->pending,
                          json_pack("{s:I, s:o}", "seq", (json_int_t)c->next_seq++, "e", event));
    c->submit_now = 1;
}

static void publish_info(cluster *c, const char *kind, json_t *info) {
    if (!info) return;
    submit_locked(c, json_pack("{s:{s:s, s:{s:o}}}", "NodeGatheredInfo", "nodeId",
                               c->identity.node_id, "info", kind, info));
}

static uint64_t json_bytes(json_t *o, const char *key) {
    return (uint64_t)json_integer_value(json_object_get(json_object_get(o, key), "inBytes"));
}

static void publish_memory(cluster *c, int force) {
    json_t *m = nodeinfo_memory_json();
    if (!m) return;
    uint64_t total = json_bytes(m, "ramTotal"), avail = json_bytes(m, "ramAvailable");
    uint64_t swap = json_bytes(m, "swapAvailable");
    uint64_t d1 = avail > c->published_mem_avail ? avail - c->published_mem_avail
                                                 : c->published_mem_avail - avail;
    uint64_t d2 = swap > c->published_swap_free ? swap - c->published_swap_free
                                                : c->published_swap_free - swap;
    /* Placement needs the rough picture; a busy host moves by a few percent all the time. */
    int stale = clock_now_ns() - c->memory_published_ns > MEMORY_REFRESH_NS;
    if (!force && !stale && d1 * 20 < total && d2 * 20 < total) {
        json_decref(m);
        return;
    }
    c->mem_total = total;
    c->memory_published_ns = clock_now_ns();
    c->published_mem_avail = avail;
    c->published_swap_free = swap;
    publish_info(c, "MemoryUsage", m);
}

static void publish_disk(cluster *c, int force) {
    json_t *d = nodeinfo_disk_json(c->options.data_dir);
    if (!d) return;
    uint64_t total = json_bytes(d, "total"), avail = json_bytes(d, "available");
    uint64_t delta = avail > c->published_disk_avail ? avail - c->published_disk_avail
                                                     : c->published_disk_avail - avail;
    if (!force && delta * 100 < total) {
        json_decref(d);
        return;
    }
    c->published_disk_avail = avail;
    publish_info(c, "DiskUsage", d);
}

static void publish_network(cluster *c, int force) {
    json_t *n = nodeinfo_network_json();
    if (!n) return;
    if (!force && c->published_network && json_equal(n, c->published_network)) {
        json_decref(n);
        return;
    }
    json_decref(c->published_network);
    c->published_network = json_deep_copy(n);
    publish_info(c, "NetworkInterfaces", n);
}

static void publish_identity(cluster *c) {
    char started[48];
    cluster_format_time(c->started_at_ms, started, sizeof started);
    publish_info(c, "NodeIdentity",
                 json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i}", "friendlyName", c->identity.friendly_name,
                           "publicKey", c->identity.public_key, "version", EXO_VERSION,
                           "namespace", c->options.namespace_name, "startedAt", started,
                           "listenPort", c->options.listen_port, "apiPort", c->options.api_port));
}

static json_t *current_edges(cluster *c) {
    json_t *edges = json_array();
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (!p->alive || !p->id[0] || p->rtt_ms < 0) continue;
        json_t *e = json_pack("{s:s, s:f}", "sink", p->id, "latencyMs",
                              round(p->rtt_ms * 1000.0) / 1000.0);
        if (p->bandwidth_mbps >= 0)
            json_object_set_new(e, "bandwidthMbps", json_real(round(p->bandwidth_mbps)));
        json_array_append_new(edges, e);
    }
    return edges;
}

/* Whether a fresh edge list is worth an event now. Link measurements on a busy host jitter by
 * large factors, so value changes alone never trigger one (the periodic refresh carries them):
 * only a new or lost peer, or a peer's first bandwidth measurement, does. */
static int edges_changed(json_t *old, json_t *cur) {
    if (!old || json_array_size(old) != json_array_size(cur)) return 1;
    size_t i;
    json_t *e;
    json_array_foreach(cur, i, e) {
        json_t *o = NULL;
        size_t j;
        json_t *x;
        json_array_foreach(old, j, x) {
            if (json_equal(json_object_get(x, "sink"), json_object_get(e, "sink"))) o = x;
        }
        if (!o) return 1;
        if (!json_object_get(o, "bandwidthMbps") != !json_object_get(e, "bandwidthMbps")) return 1;
    }
    return 0;
}

static void publish_edges(cluster *c, uint64_t now) {
    json_t *cur = current_edges(c);
    int due = now - c->last_edges_ns >= c->edges_refresh_ns;
    /* Debounce: while peers are still joining (or first probes still arriving), wait until the
     * set of links has been stable for a while, then publish once. */
    if (!c->seen_edges || edges_changed(c->seen_edges, cur)) {
        json_decref(c->seen_edges);
        c->seen_edges = json_deep_copy(cur);
        c->edges_settled_ns = now;
    }
    int settled = now - c->edges_settled_ns >= EDGES_SETTLE_NS;
    if (now - c->last_edges_ns < EDGES_MIN_GAP_NS ||
        (!due && !(settled && edges_changed(c->published_edges, cur)))) {
        json_decref(cur);
        return;
    }
    json_decref(c->published_edges);
    c->published_edges = json_deep_copy(cur);
    c->last_edges_ns = now;
    /* Spread the refreshes of many nodes over time: 4/5..6/5 of the period. */
    c->edges_refresh_ns = EDGES_REFRESH_NS * 4 / 5 + randombytes_uniform(1000) * (EDGES_REFRESH_NS / 2500);
    submit_locked(c, json_pack("{s:{s:s, s:o}}", "TopologyEdgesMeasured", "source",
                               c->identity.node_id, "edges", cur));
}

static void node_info_tick(cluster *c, uint64_t now) {
    if (!c->master_id[0]) return; /* nothing to publish to yet */
    /* Our identity missing from State (first join, or timed out while away): publish all. */
    if (!json_object_get(json_object_get(c->state, "nodeIdentities"), c->identity.node_id) &&
        json_array_size(c->pending) == 0 && now - c->last_republish_ns > 2000 * MS) {
        c->last_republish_ns = now;
        publish_identity(c);
        publish_memory(c, 1);
        publish_disk(c, 1);
        publish_info(c, "SystemInfo", nodeinfo_system_json());
        publish_network(c, 1);
        json_decref(c->published_edges);
        c->published_edges = NULL;
        c->last_edges_ns = 0;
        c->next_memory_ns = now + MEMORY_CHECK_NS;
        c->next_disk_ns = now + DISK_CHECK_NS;
        c->next_network_ns = now + NETWORK_CHECK_NS;
        return;
    }
    if (now >= c->next_memory_ns) {
        publish_memory(c, 0);
        c->next_memory_ns = now + MEMORY_CHECK_NS;
    }
    if (now >= c->next_disk_ns) {
        publish_disk(c, 0);
        c->next_disk_ns = now + DISK_CHECK_NS;
    }
    if (now >= c->next_network_ns) {
        publish_network(c, 0);
        c->next_network_ns = now + NETWORK_CHECK_NS;
    }
    if (now >= c->next_edges_ns) {
        publish_edges(c, now);
        c->next_edges_ns = now + EDGES_CHECK_NS;
    }
}

/* ---------- probes and gossip ---------- */

static void send_probes(cluster *c, uint64_t now) {
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (!p->alive || !p->id[0] || now < p->next_probe_ns) continue;
        p->next_probe_ns = now + PROBE_INTERVAL_NS;
        char *pad = malloc(PROBE_BYTES + 1);
        if (!pad) continue;
        memset(pad, 'x', PROBE_BYTES);
        pad[PROBE_BYTES] = 0;
        json_t *msg = cluster_message_new(CLUSTER_MSG_PROBE, c->identity.node_id);
        json_object_set_new(msg, "ts", json_integer((json_int_t)(now / 1000)));
        json_object_set_new(msg, "pad", json_string(pad));
        free(pad);
        send_json(c, p->dealer, msg);
        json_decref(msg);
    }
}

static void handle_probe(cluster *c, peer *p, const json_t *m, size_t len) {
    if (!p) return;
    json_t *ack = cluster_message_new(CLUSTER_MSG_PROBE_ACK, c->identity.node_id);
    json_object_set(ack, "ts", json_object_get(m, "ts"));
    json_object_set_new(ack, "n", json_integer((json_int_t)len));
    send_json(c, p->dealer, ack);
    json_decref(ack);
}

static void handle_probe_ack(peer *p, const json_t *m, uint64_t now) {
    if (!p) return;
    int64_t elapsed_us = (int64_t)(now / 1000) - json_integer_value(json_object_get(m, "ts"));
    if (elapsed_us <= 0 || elapsed_us > 60000000) return;
    double transfer_us = (double)elapsed_us - (p->rtt_ms > 0 ? p->rtt_ms * 1000.0 : 0);
    if (transfer_us < (double)elapsed_us * 0.1) transfer_us = (double)elapsed_us * 0.1;
    double bits = (double)json_integer_value(json_object_get(m, "n")) * 8.0;
    p->bandwidth_mbps = bits / transfer_us; /* bits per microsecond = Mbit/s */
}

static void send_gossip(cluster *c, uint64_t now) {
    json_t *list = json_array();
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (!p->alive || !p->id[0]) continue;
        json_array_append_new(list,
                              json_pack("{s:s, s:s, s:i}", "id", p->id, "addr", p->addr, "port", p->port));
    }
    json_t *msg = cluster_message_new(CLUSTER_MSG_PEERS, c->identity.node_id);
    json_object_set_new(msg, "peers", list);
    send_to_alive(c, msg);
    json_decref(msg);
    c->last_gossip_ns = now;
    c->gossip_pending = 0;
    c->gossip_now = 0;
}

static void handle_gossip(cluster *c, const json_t *m) {
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(m, "peers"), i, p) {
        const char *id = json_string_value(json_object_get(p, "id"));
        if (find_peer(c, id) || !strcmp(id, c->identity.node_id)) continue;
        ensure_peer(c, id, json_string_value(json_object_get(p, "addr")),
                    (int)json_integer_value(json_object_get(p, "port")));
    }
}

/* ---------- receiving ---------- */

static void handle_message(cluster *c, const char *bytes, size_t len, const char *addr,
                           uint64_t now) {
    c->msgs_in++;
    c->bytes_in += len;
    cluster_message m;
    char err[256];
    enum cluster_decode_result r = cluster_message_decode(bytes, len, &m, err, sizeof err);
    if (r != CLUSTER_DECODE_OK) {
        if (r == CLUSTER_DECODE_OVERSIZED) c->dropped_oversized++;
        else if (r == CLUSTER_DECODE_VERSION) c->dropped_version++;
        else c->dropped_malformed++;
        if (r == CLUSTER_DECODE_VERSION && now - c->last_version_warn_ns > 30000 * MS) {
            c->last_version_warn_ns = now;
            log_warn("cluster: ignoring %s: %s (exo %s)", addr, err, EXO_VERSION);
        } else {
            log_debug("cluster: dropped a message from %s: %s", addr, err);
        }
        return;
    }
    if (!strcmp(m.from, c->identity.node_id)) { /* our own id from elsewhere: misconfigured */
        cluster_message_free(&m);
        return;
    }
    peer *p = find_peer(c, m.from);
    if (m.type == CLUSTER_MSG_HEARTBEAT) {
        handle_heartbeat(c, m.root, m.from, addr, now);
    } else if (m.type == CLUSTER_MSG_PEERS) {
        /* Addresses to dial are taken from any member that passed the CURVE handshake, also
         * before its hello reached us: a node gossips the moment a peer joins it, and it may
         * be gone before our hello round trip with it completes. */
        handle_gossip(c, m.root);
    } else if (!p || !p->alive) {
        /* Only peers that said hello take part. */
    } else {
        p->last_heard_ns = now;
        switch (m.type) {
        case CLUSTER_MSG_PEERS: break;
        case CLUSTER_MSG_SUBMIT:
            if (c->is_master)
                master_take(c, m.from, json_string_value(json_object_get(m.root, "sess")),
                            json_object_get(m.root, "ev"));
            break;
        case CLUSTER_MSG_ENTRIES: handle_entries(c, m.from, m.root); break;
        case CLUSTER_MSG_SYNC: handle_sync(c, p, m.root); break;
        case CLUSTER_MSG_PROBE: handle_probe(c, p, m.root, len); break;
        case CLUSTER_MSG_PROBE_ACK: handle_probe_ack(p, m.root, now); break;
        case CLUSTER_MSG_HEARTBEAT: break;
        }
    }
    cluster_message_free(&m);
}

static void receive_router(cluster *c, uint64_t now) {
    void *s = zsock_resolve(c->router);
    for (int k = 0; k < 10000; k++) {
        zmq_msg_t frame;
        zmq_msg_init(&frame);
        if (zmq_msg_recv(&frame, s, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&frame);
            return;
        }
        /* First frame: routing id. Then the payload (one frame; extra frames are dropped). */
        zmq_msg_close(&frame);
        int more = 1;
        int first = 1;
        while (more) {
            zmq_msg_t body;
            zmq_msg_init(&body);
            if (zmq_msg_recv(&body, s, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&body);
                break;
            }
            more = zmq_msg_more(&body);
            if (first) {
                const char *addr = zmq_msg_gets(&body, "Peer-Address");
                handle_message(c, zmq_msg_data(&body), zmq_msg_size(&body), addr ? addr : "",
                               now);
            } else {
                c->dropped_malformed++;
            }
            first = 0;
            zmq_msg_close(&body);
        }
    }
}

/* ---------- the loop ---------- */

static void send_pending(cluster *c, uint64_t now) {
    if (c->is_master) {
        master_take(c, c->identity.node_id, c->sess, c->pending);
        return;
    }
    if (!json_array_size(c->pending) || !c->master_id[0]) return;
    if (!c->submit_now && now - c->last_submit_ns < SUBMIT_RESEND_NS) return;
    peer *m = find_peer(c, c->master_id);
    if (!m || !m->alive) return;
    json_t *msg = cluster_message_new(CLUSTER_MSG_SUBMIT, c->identity.node_id);
    json_object_set_new(msg, "sess", json_string(c->sess));
    json_t *ev = json_array();
    for (size_t i = 0; i < json_array_size(c->pending) && i < 256; i++)
        json_array_append(ev, json_array_get(c->pending, i));
    json_object_set_new(msg, "ev", ev);
    send_json(c, m->dealer, msg);
    json_decref(msg);
    c->last_submit_ns = now;
    c->submit_now = 0;
}

static void follower_sync_tick(cluster *c, uint64_t now) {
    if (c->is_master || !c->master_id[0]) return;
    peer *m = find_peer(c, c->master_id);
    if (!m || !m->alive) return;
    if (m->last_idx != log_count(c) || m->last_term != last_term(c)) c->sync_now = 1;
    if (c->sync_now && now - c->last_sync_ns >= SYNC_INTERVAL_NS) send_sync(c, now);
}

/* Every member the replicated State lists gets a connection, whether or not gossip or a beacon
 * told us of it: members that met only through a node that has since died still find each other
 * through the State they folded while it was alive. Addresses: the member's published interfaces
 * (non-loopback first; loopback when that is all it has, i.e. one host) and its listen port. */
static void dial_state_members(cluster *c, uint64_t now) {
    if (now < c->next_state_dial_ns) return;
    c->next_state_dial_ns = now + STATE_DIAL_INTERVAL_NS;
    const char *id;
    json_t *ident;
    json_object_foreach(json_object_get(c->state, "nodeIdentities"), id, ident) {
        if (!strcmp(id, c->identity.node_id) || find_peer(c, id)) continue;
        json_int_t port = json_integer_value(json_object_get(ident, "listenPort"));
        if (port <= 0 || port > 65535) continue;
        json_t *ifs = json_object_get(json_object_get(json_object_get(c->state, "nodeNetwork"), id),
                                      "interfaces");
        const char *addr = NULL, *loopback = NULL;
        size_t i;
        json_t *itf;
        json_array_foreach(ifs, i, itf) {
            const char *ip = json_string_value(json_object_get(itf, "ipAddress"));
            if (!ip || strchr(ip, ':')) continue; /* IPv4 only, as the beacons */
            if (json_is_true(json_object_get(itf, "isLoopback"))) {
                if (!loopback) loopback = ip;
            } else if (!addr) {
                addr = ip;
            }
        }
        if (!addr) addr = loopback;
        if (!addr) continue;
        log_debug("cluster: dialing %s at %s:%d (listed in State)", id, addr, (int)port);
        ensure_peer(c, id, addr, (int)port);
    }
}

static void tick(cluster *c, uint64_t now) {
    if (now >= c->next_beacon_ns) {
        beacon_send(c);
        /* Beacon faster for the first seconds, so a starting cluster finds itself quickly. */
        uint64_t up = now - c->started_ns;
        c->next_beacon_ns = now + (up < 3000 * MS    ? BEACON_INTERVAL_NS / 4
                                   : up < 20000 * MS ? BEACON_INTERVAL_NS
                                                     : BEACON_INTERVAL_NS * 4);
    }
    check_liveness(c, now);
    elect(c, now);
    if (now >= c->next_heartbeat_ns) {
        send_heartbeats(c, now, 1);
        c->next_heartbeat_ns = now + HEARTBEAT_INTERVAL_NS;
        c->next_hello_ns = now + HELLO_INTERVAL_NS;
    } else if (now >= c->next_hello_ns) {
        send_heartbeats(c, now, 0);
        c->next_hello_ns = now + HELLO_INTERVAL_NS;
    }
    node_info_tick(c, now);
    if (c->is_master) master_time_out_nodes(c, clock_unix_ms());
    send_pending(c, now);
    if (c->is_master) master_broadcast(c);
    follower_sync_tick(c, now);
    send_probes(c, now);
    dial_state_members(c, now);
    if (c->gossip_off) {
        /* tests: membership must come from beacons, --peer and State alone */
    } else if (now >= c->next_gossip_ns || c->gossip_now ||
               (c->gossip_pending && now - c->last_gossip_ns >= GOSSIP_MIN_GAP_NS)) {
        send_gossip(c, now);
        c->next_gossip_ns = now + GOSSIP_INTERVAL_NS;
    }
    if (c->appended_since_sync) {
        eventlog_sync(c->log);
        c->appended_since_sync = 0;
    }
    if (log_count(c) >= c->snapshot_idx + c->snapshot_every) write_snapshot(c);
}

static void *cluster_thread(void *arg) {
    cluster *c = arg;
    zmq_pollitem_t *items = calloc(MAX_PEERS + 8, sizeof *items);
    if (!items) return NULL;
    pthread_mutex_lock(&c->lock);
    while (!atomic_load(&c->stop)) {
        size_t n = 0;
        items[n++] = (zmq_pollitem_t){zsock_resolve(c->router), 0, ZMQ_POLLIN, 0};
        items[n++] = (zmq_pollitem_t){zsock_resolve(c->zap), 0, ZMQ_POLLIN, 0};
        items[n++] = (zmq_pollitem_t){NULL, c->udp_fd, ZMQ_POLLIN, 0};
        size_t mon0 = n;
        items[n++] = (zmq_pollitem_t){c->router_monitor ? zsock_resolve(c->router_monitor) : NULL,
                                      -1, c->router_monitor ? ZMQ_POLLIN : 0, 0};
        size_t peer0 = n;
        for (size_t i = 0; i < c->n_peers; i++)
            items[n++] = (zmq_pollitem_t){c->peers[i].monitor ? zsock_resolve(c->peers[i].monitor)
                                                              : NULL,
                                          -1, c->peers[i].monitor ? ZMQ_POLLIN : 0, 0};
        pthread_mutex_unlock(&c->lock);
        int rc = zmq_poll(items, (int)n, 50);
        pthread_mutex_lock(&c->lock);
        uint64_t now = clock_now_ns();
        if (rc > 0) {
            if (items[1].revents & ZMQ_POLLIN) handle_zap(c);
            if (items[mon0].revents & ZMQ_POLLIN) handle_router_monitor(c);
            size_t np = c->n_peers < n - peer0 ? c->n_peers : n - peer0;
            for (size_t i = 0; i < np; i++)
                if (items[peer0 + i].revents & ZMQ_POLLIN) handle_monitor(c, &c->peers[i], now);
            if (items[0].revents & ZMQ_POLLIN) receive_router(c, now);
            if (items[2].revents & ZMQ_POLLIN) beacon_receive(c);
        }
        tick(c, now);
    }
    write_snapshot(c);
    eventlog_sync(c->log);
    pthread_mutex_unlock(&c->lock);
    free(items);
    return NULL;
}

/* ---------- start / stop ---------- */

static int open_sockets(cluster *c) {
    c->zap = zsock_new(ZMQ_REP);
    if (!c->zap || zsock_bind(c->zap, "inproc://zeromq.zap.01") < 0) {
        log_error("cluster: cannot start the authentication handler");
        return -1;
    }
    c->router = zsock_new(ZMQ_ROUTER);
    if (!c->router) return -1;
    void *s = zsock_resolve(c->router);
    int one = 1, zero = 0, hwm = 10000;
    int64_t max = (int64_t)CLUSTER_MESSAGE_MAX_BYTES * 2;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof max);
    zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, c->secret.secret_key, 32);
    zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, "exo", 3);
    if (zmq_socket_monitor(s, "inproc://exo-cluster-router-monitor",
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
        c->router_monitor = zsock_new(ZMQ_PAIR);
        if (c->router_monitor &&
            zsock_connect(c->router_monitor, "inproc://exo-cluster-router-monitor"))
            zsock_destroy(&c->router_monitor);
    }
    int bound = c->options.listen_port ? zsock_bind(c->router, "tcp://*:%d", c->options.listen_port)
                                       : zsock_bind(c->router, "tcp://*:*"); /* 0: any free port */
    if (bound > 0) c->options.listen_port = bound;
    if (bound < 0) {
        log_error("cluster: cannot listen on port %d (%s): is another exo running? Use "
                  "--listen-port",
                  c->options.listen_port, zmq_strerror(zmq_errno()));
        return -1;
    }
    c->udp_fd = beacon_open(c);
    if (c->udp_fd < 0) {
        log_error("cluster: cannot open the discovery port %d (%s): use --discovery-port",
                  c->options.discovery_port, strerror(errno));
        return -1;
    }
    for (int i = 0; i < c->options.n_peers; i++) {
        char host[256];
        const char *spec = c->options.peers[i];
        const char *colon = strrchr(spec, ':');
        snprintf(host, sizeof host, "%.*s", (int)(colon - spec), spec);
        add_peer(c, "", host, atoi(colon + 1));
    }
    return 0;
}

static void cluster_free(cluster *c) {
    for (size_t i = 0; i < c->n_peers; i++) peer_close(&c->peers[i]);
    if (c->router) zmq_socket_monitor(zsock_resolve(c->router), NULL, 0);
    zsock_destroy(&c->router_monitor);
    zsock_destroy(&c->router);
    zsock_destroy(&c->zap);
    if (c->udp_fd >= 0) close(c->udp_fd);
    eventlog_close(c->log);
    if (c->lock_fd >= 0) close(c->lock_fd);
    json_decref(c->state);
    json_decref(c->seqs);
    json_decref(c->pending);
    json_decref(c->absent_since);
    json_decref(c->published_edges);
    json_decref(c->seen_edges);
    json_decref(c->published_network);
    free(c->epochs);
    free(c->peers);
    pthread_mutex_destroy(&c->lock);
    sodium_memzero(&c->secret, sizeof c->secret);
    sodium_memzero(&c->identity, sizeof c->identity);
    free(c);
}

static int open_log(cluster *c) {
    char path[1200], err[512];
    snprintf(path, sizeof path, "%s/lock", c->dir);
    c->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (c->lock_fd < 0 || flock(c->lock_fd, LOCK_EX | LOCK_NB)) {
        log_error("cluster: another exo node is using --data-dir %s; give each node its own",
                  c->options.data_dir);
        return -1;
    }
    snprintf(path, sizeof path, "%s/events.log", c->dir);
    uint64_t dropped = 0;
    if (eventlog_open(path, &c->log, &dropped, err, sizeof err)) {
        log_error("cluster: %s", err);
        return -1;
    }
    if (dropped)
        log_warn("cluster: the event log ended in a damaged record (%llu bytes, likely a crash "
                 "mid-write); it was cut and the entries before it kept",
                 (unsigned long long)dropped);
    rebuild(c, log_count(c));
    c->started_with_log = log_count(c) > 0;
    log_info("cluster: event log has %llu entries (replayed from %s)",
             (unsigned long long)log_count(c), c->snapshot_idx ? "a snapshot" : "the start");
    return 0;
}

int cluster_start(const cluster_config *options) {
    pthread_mutex_lock(&start_lock);
    if (self) {
        pthread_mutex_unlock(&start_lock);
        log_error("cluster: already running in this process");
        return -1;
    }
    cluster *c = calloc(1, sizeof *c);
    if (!c) {
        pthread_mutex_unlock(&start_lock);
        return -1;
    }
    c->options = *options;
    for (int i = 0; i < options->n_peers; i++) c->options.peers[i] = options->peers[i];
    c->udp_fd = -1;
    c->lock_fd = -1;
    pthread_mutex_init(&c->lock, NULL);
    c->state = cluster_state_new();
    c->seqs = json_object();
    c->pending = json_array();
    c->absent_since = json_object();
    c->peers = calloc(MAX_PEERS, sizeof *c->peers);
    c->next_seq = 1;
    c->peer_timeout_ns = env_ms("EXO_CLUSTER_PEER_TIMEOUT_MS", 5000) * MS;
    c->node_timeout_ns = env_ms("EXO_CLUSTER_NODE_TIMEOUT_MS", 30000) * MS;
    c->snapshot_every = env_ms("EXO_CLUSTER_SNAPSHOT_EVERY", 1000);
    c->gossip_off = env_ms("EXO_CLUSTER_NO_GOSSIP", 0) == 1;
    c->edges_refresh_ns = EDGES_REFRESH_NS;
    c->started_at_ms = clock_unix_ms();
    c->started_ns = clock_now_ns();
    c->membership_changed_ns = c->started_ns;
    char err[512];
    if (!c->peers || !options->data_dir[0]) {
        log_error("cluster: no --data-dir");
        goto fail;
    }
    if (cluster_identity_load(options->data_dir, &c->identity, err, sizeof err) ||
        cluster_secret_derive(options->namespace_name, options->cluster_key_file, &c->secret, err,
                              sizeof err)) {
        log_error("cluster: %s", err);
        goto fail;
    }
    unsigned char r[8];
    randombytes_buf(r, sizeof r);
    for (int i = 0; i < 8; i++) snprintf(c->sess + 2 * i, 3, "%02x", r[i]);
    randombytes_buf(r, sizeof r);
    c->msess[0] = 'M';
    for (int i = 0; i < 7; i++) snprintf(c->msess + 1 + 2 * i, 3, "%02x", r[i]);
    snprintf(c->dir, sizeof c->dir, "%s/cluster", options->data_dir);
    if (paths_mkdir_p(c->dir)) {
        log_error("cluster: cannot create %s: %s", c->dir, strerror(errno));
        goto fail;
    }
    zsys_handler_set(NULL); /* the node handles signals itself */
    zsys_init();
    if (!zsys_has_curve()) {
        log_error("cluster: this libzmq has no CURVE support; install libzmq built with libsodium");
        goto fail;
    }
    if (open_log(c) || open_sockets(c)) goto fail;
    if (pthread_create(&c->thread, NULL, cluster_thread, c)) {
        log_error("cluster: cannot start its thread");
        goto fail;
    }
    log_info("cluster: node %s (%s) in namespace '%s', listening on %d, discovery on %d%s",
             c->identity.node_id, c->identity.friendly_name, options->namespace_name,
             c->options.listen_port, options->discovery_port,
             options->cluster_key_file[0] ? ", with --cluster-key" : "");
    self = c;
    pthread_mutex_unlock(&start_lock);
    return 0;
fail:
    cluster_free(c);
    pthread_mutex_unlock(&start_lock);
    return -1;
}

void cluster_stop(void) {
    pthread_mutex_lock(&start_lock);
    cluster *c = self;
    if (c) {
        atomic_store(&c->stop, 1);
        pthread_join(c->thread, NULL);
        self = NULL;
        cluster_free(c);
    }
    pthread_mutex_unlock(&start_lock);
}

/* ---------- public reads ---------- */

const char *cluster_node_id(void) {
    return self ? self->identity.node_id : "";
}

int cluster_is_master(void) {
    cluster *c = self;
    if (!c) return 0;
    pthread_mutex_lock(&c->lock);
    int m = c->is_master;
    pthread_mutex_unlock(&c->lock);
    return m;
}

char *cluster_state_json(const char *subpath) {
    cluster *c = self;
    if (!c) return NULL;
    pthread_mutex_lock(&c->lock);
    json_t *v = cluster_state_lookup(c->state, subpath);
    char *text = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    pthread_mutex_unlock(&c->lock);
    return text;
}

char *cluster_events_json(uint64_t since) {
    cluster *c = self;
    if (!c) return NULL;
    strbuf sb = {0};
    strbuf_append_char(&sb, '[');
    pthread_mutex_lock(&c->lock);
    uint64_t count = log_count(c);
    for (uint64_t i = since + 1; i <= count; i++) {
        size_t len;
        char *text = eventlog_read(c->log, i, &len);
        if (!text) break;
        if (i > since + 1) strbuf_append_char(&sb, ',');
        strbuf_append(&sb, text, len);
        free(text);
    }
    pthread_mutex_unlock(&c->lock);
    strbuf_append_char(&sb, ']');
    return strbuf_detach(&sb);
}

char *cluster_events_page(uint64_t since, uint64_t max, uint64_t *last) {
    cluster *c = self;
    if (!c) return NULL;
    strbuf sb = {0};
    pthread_mutex_lock(&c->lock);
    uint64_t count = log_count(c), i = since + 1;
    for (; i <= count && i <= since + max; i++) {
        size_t len;
        char *text = eventlog_read(c->log, i, &len);
        if (!text) break;
        if (sb.len) strbuf_append_char(&sb, ',');
        strbuf_append(&sb, text, len);
        free(text);
    }
    pthread_mutex_unlock(&c->lock);
    *last = i - 1;
    if (!sb.len) {
        strbuf_free(&sb);
        return NULL;
    }
    return strbuf_detach(&sb);
}

char *cluster_status_json(void) {
    cluster *c = self;
    if (!c) return NULL;
    pthread_mutex_lock(&c->lock);
    json_t *peers = json_array();
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (!p->id[0]) continue;
        json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:b, s:b}", "nodeId", p->id, "name", p->name,
                              "address", p->addr, "port", p->port, "alive", p->alive,
                              "claimsMaster", p->claims_master);
        if (p->rtt_ms >= 0) json_object_set_new(o, "latencyMs", json_real(p->rtt_ms));
        if (p->bandwidth_mbps >= 0)
            json_object_set_new(o, "bandwidthMbps", json_real(p->bandwidth_mbps));
        json_object_set_new(o, "lastIdx", json_integer((json_int_t)p->last_idx));
        json_array_append_new(peers, o);
    }
    json_t *counters = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
        "messagesIn", (json_int_t)c->msgs_in, "messagesOut", (json_int_t)c->msgs_out, "bytesIn",
        (json_int_t)c->bytes_in, "bytesOut", (json_int_t)c->bytes_out, "beaconsIn",
        (json_int_t)c->beacons_in, "beaconsOut", (json_int_t)c->beacons_out, "beaconBytesIn",
        (json_int_t)c->beacon_bytes_in, "beaconBytesOut", (json_int_t)c->beacon_bytes_out,
        "droppedMalformed", (json_int_t)c->dropped_malformed, "droppedOversized",
        (json_int_t)c->dropped_oversized, "droppedVersion", (json_int_t)c->dropped_version,
        "beaconsForeign", (json_int_t)c->beacons_foreign, "handshakesRejected",
        (json_int_t)c->handshakes_rejected, "sendFailures", (json_int_t)c->send_failures,
        "electionsWon", (json_int_t)c->elections_won, "truncations", (json_int_t)c->truncations,
        "eventsIgnored", (json_int_t)c->events_ignored);
    json_t *st = json_pack("{s:s, s:s, s:s, s:b, s:s?, s:I, s:I, s:I, s:I, s:o, s:o}", "nodeId",
                           c->identity.node_id, "friendlyName", c->identity.friendly_name,
                           "namespace", c->options.namespace_name, "isMaster", c->is_master,
                           "masterNodeId", c->master_id[0] ? c->master_id : NULL, "term",
                           (json_int_t)c->max_term, "lastIdx", (json_int_t)log_count(c),
                           "pendingEvents", (json_int_t)json_array_size(c->pending),
                           "uptimeMs", (json_int_t)((clock_now_ns() - c->started_ns) / MS),
                           "peers", peers, "counters", counters);
    pthread_mutex_unlock(&c->lock);
    char *text = json_dumps(st, JSON_COMPACT);
    json_decref(st);
    return text;
}

int cluster_submit(json_t *event) {
    cluster *c = self;
    if (!c || !json_is_object(event) || json_object_size(event) != 1 ||
        !json_is_object(json_object_iter_value(json_object_iter(event)))) {
        json_decref(event);
        return -1;
    }
    pthread_mutex_lock(&c->lock);
    submit_locked(c, event);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

int cluster_http_get(const char *path, const char *query, int *status, char **body) {
    *body = NULL;
    char *text = NULL;
    if (!strcmp(path, "/node_id")) {
        json_t *s = json_string(cluster_node_id());
        text = json_dumps(s, JSON_ENCODE_ANY);
        json_decref(s);
    } else if (!strcmp(path, "/state") || !strncmp(path, "/state/", 7)) {
        text = cluster_state_json(path + 6);
        if (!text) {
            *status = 404;
            *body = strdup("{\"error\":{\"message\":\"no such path in the cluster state\","
                           "\"type\":\"Not Found\",\"param\":null,\"code\":404}}");
            return 1;
        }
    } else if (!strcmp(path, "/events")) {
        unsigned long long since = 0;
        const char *q = query ? strstr(query, "since=") : NULL;
        if (q) since = strtoull(q + 6, NULL, 10);
        text = cluster_events_json(since);
    } else if (!strcmp(path, "/cluster/status")) {
        text = cluster_status_json();
    } else {
        return 0;
    }
    if (!text) {
        *status = 503;
        *body = strdup("{\"error\":{\"message\":\"the cluster is not running\",\"type\":\"Service "
                       "Unavailable\",\"param\":null,\"code\":503}}");
        return 1;
    }
    *status = 200;
    *body = text;
    return 1;
}
