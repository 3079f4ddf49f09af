/* cluster — one node's member of the control plane: discovery, CURVE transport, liveness,
 * election, log replication and node-info publishing, run by one thread (see cluster.h).
 *
 * This file owns the member's life (start, the thread's poll loop and timers, stop), reads the
 * ROUTER and dispatches each message to the concern that handles it, and serves the public
 * reads. The concerns live beside it behind cluster_internal.h: transport.c (sockets, ZAP,
 * monitors), discovery.c (beacons, --peer, gossip), membership.c (heartbeats, election, node
 * timeouts), replication.c (submissions, master ordering, follower sync), local_log.c (the log
 * file, State, snapshots) and publish.c (node info and link measurements). Only this file
 * calls into all of them; they call only downward (transport, local_log).
 *
 * The thread holds `lock` while it works and releases it only while it waits on sockets, so
 * public functions called from other threads see a consistent state, log and peer table.
 * It refuses to run two members in one process (one ZAP handler per ZeroMQ context). */
#include "cluster/cluster.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/paths.h"
#include "base/strbuf.h"
#include "cluster/cluster_internal.h"
#include "cluster/state.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef EXO_VERSION
#define EXO_VERSION "0.0.0"
#endif

static cluster *self;
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t env_ms(const char *name, uint64_t def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return *end || x == 0 ? def : x;
}

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
    peer *p = peer_find(c, m.from);
    if (m.type == CLUSTER_MSG_HEARTBEAT) {
        membership_handle_heartbeat(c, m.root, m.from, addr, now);
    } else if (m.type == CLUSTER_MSG_PEERS) {
        /* Addresses to dial are taken from any member that passed the CURVE handshake, also
         * before its hello reached us: a node gossips the moment a peer joins it, and it may
         * be gone before our hello round trip with it completes. */
        discovery_gossip_handle(c, m.root);
    } else if (!p || !p->alive) {
        /* Only peers that said hello take part. */
    } else {
        p->last_heard_ns = now;
        switch (m.type) {
        case CLUSTER_MSG_PEERS: break;
        case CLUSTER_MSG_SUBMIT:
            if (c->is_master)
                replication_take(c, m.from, json_string_value(json_object_get(m.root, "sess")),
                                 json_object_get(m.root, "ev"));
            break;
        case CLUSTER_MSG_ENTRIES:
            replication_handle_entries(c, m.from, m.root);
            break;
        case CLUSTER_MSG_SYNC:
            replication_handle_sync(c, p, m.root);
            break;
        case CLUSTER_MSG_PROBE:
            publish_handle_probe(c, p, m.root, len);
            break;
        case CLUSTER_MSG_PROBE_ACK:
            publish_handle_probe_ack(p, m.root, now);
            break;
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

static void tick(cluster *c, uint64_t now) {
    if (now >= c->next_beacon_ns) {
        discovery_beacon_send(c);
        /* Beacon faster for the first seconds, so a starting cluster finds itself quickly. */
        uint64_t up = now - c->started_ns;
        c->next_beacon_ns = now + (up < 3000 * MS    ? BEACON_INTERVAL_NS / 4
                                   : up < 20000 * MS ? BEACON_INTERVAL_NS
                                                     : BEACON_INTERVAL_NS * 4);
    }
    membership_check_liveness(c, now);
    membership_elect(c, now);
    if (now >= c->next_heartbeat_ns) {
        membership_send_heartbeats(c, now, 1);
        c->next_heartbeat_ns = now + HEARTBEAT_INTERVAL_NS;
        c->next_hello_ns = now + HELLO_INTERVAL_NS;
    } else if (now >= c->next_hello_ns) {
        membership_send_heartbeats(c, now, 0);
        c->next_hello_ns = now + HELLO_INTERVAL_NS;
    }
    publish_node_info_tick(c, now);
    if (c->is_master) membership_time_out_nodes(c, clock_unix_ms());
    replication_send_pending(c, now);
    if (c->is_master) replication_master_broadcast(c);
    replication_follower_tick(c, now);
    publish_send_probes(c, now);
    discovery_dial_state_members(c, now);
    if (c->gossip_off) {
        /* tests: membership must come from beacons, --peer and State alone */
    } else if (now >= c->next_gossip_ns || c->gossip_now ||
               (c->gossip_pending && now - c->last_gossip_ns >= GOSSIP_MIN_GAP_NS)) {
        discovery_gossip_send(c, now);
        c->next_gossip_ns = now + GOSSIP_INTERVAL_NS;
    }
    if (c->appended_since_sync) {
        eventlog_sync(c->log);
        c->appended_since_sync = 0;
    }
    if (local_log_count(c) >= c->snapshot_idx + c->snapshot_every) local_log_snapshot(c);
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
            if (items[1].revents & ZMQ_POLLIN) transport_handle_zap(c);
            if (items[mon0].revents & ZMQ_POLLIN) transport_handle_router_monitor(c);
            size_t np = c->n_peers < n - peer0 ? c->n_peers : n - peer0;
            for (size_t i = 0; i < np; i++)
                if (items[peer0 + i].revents & ZMQ_POLLIN)
                    transport_handle_peer_monitor(c, &c->peers[i], now);
            if (items[0].revents & ZMQ_POLLIN) receive_router(c, now);
            if (items[2].revents & ZMQ_POLLIN) discovery_beacon_receive(c);
        }
        tick(c, now);
    }
    local_log_snapshot(c);
    eventlog_sync(c->log);
    pthread_mutex_unlock(&c->lock);
    free(items);
    return NULL;
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
    if (local_log_open(c) || transport_open(c) || discovery_open(c)) goto fail;
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

int cluster_state_has(const char *subpath) {
    cluster *c = self;
    if (!c) return 0;
    pthread_mutex_lock(&c->lock);
    int found = cluster_state_lookup(c->state, subpath) != NULL;
    pthread_mutex_unlock(&c->lock);
    return found;
}

char *cluster_events_json(uint64_t since) {
    cluster *c = self;
    if (!c) return NULL;
    strbuf sb = {0};
    strbuf_append_char(&sb, '[');
    pthread_mutex_lock(&c->lock);
    uint64_t count = local_log_count(c);
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
    uint64_t count = local_log_count(c), i = since + 1;
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
    json_t *st = json_pack(
        "{s:s, s:s, s:s, s:b, s:s?, s:I, s:I, s:I, s:I, s:o, s:o}", "nodeId", c->identity.node_id,
        "friendlyName", c->identity.friendly_name, "namespace", c->options.namespace_name,
        "isMaster", c->is_master, "masterNodeId", c->master_id[0] ? c->master_id : NULL, "term",
        (json_int_t)c->max_term, "lastIdx", (json_int_t)local_log_count(c), "pendingEvents",
        (json_int_t)json_array_size(c->pending), "uptimeMs",
        (json_int_t)((clock_now_ns() - c->started_ns) / MS), "peers", peers, "counters", counters);
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
    replication_submit(c, event);
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
