/* cluster transport — the member's sockets: one CURVE DEALER per peer (sending), the ROUTER
 * every peer sends to, the ZAP handler that admits only holders of the cluster key, and the
 * socket monitors that tell when a peer's connection closes or its handshake fails.
 *
 * It owns the peer table's connections and liveness flag; it does not decide what to send
 * (membership, replication and publish do) nor read messages (cluster.c dispatches them). */
#include "cluster/cluster_internal.h"

#include "base/clock.h"
#include "base/log.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void peer_send(cluster *c, zsock_t *dealer, json_t *msg) {
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

peer *peer_find(cluster *c, const char *id) {
    for (size_t i = 0; i < c->n_peers; i++)
        if (c->peers[i].id[0] && !strcmp(c->peers[i].id, id)) return &c->peers[i];
    return NULL;
}

void peers_send_alive(cluster *c, json_t *msg) {
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

void peer_close(peer *p) {
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

peer *peer_add(cluster *c, const char *id, const char *addr, int port) {
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
peer *peer_ensure(cluster *c, const char *id, const char *addr, int port) {
    if (!strcmp(id, c->identity.node_id)) return NULL;
    peer *p = peer_find(c, id);
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
    return peer_add(c, id, addr, port);
}

void membership_changed(cluster *c, uint64_t now) {
    c->membership_changed_ns = now;
    c->gossip_pending = 1;
}

void peer_mark_gone(cluster *c, peer *p, uint64_t now, const char *why) {
    if (!p->alive) return;
    p->alive = 0;
    p->gone_since_ns = now;
    log_info("cluster: peer %s (%s) is gone: %s", p->id, p->name, why);
    membership_changed(c, now);
}

/* Reads one event from a socket monitor: its ZMQ_EVENT_* number, or 0 when there is none. */
static uint16_t monitor_event(zsock_t *monitor) {
    zmsg_t *m = zmsg_recv(monitor);
    if (!m) return 0;
    zframe_t *f = zmsg_first(m);
    uint16_t event = 0;
    if (f && zframe_size(f) >= 2) memcpy(&event, zframe_data(f), 2);
    zmsg_destroy(&m);
    return event;
}

void transport_handle_peer_monitor(cluster *c, peer *p, uint64_t now) {
    uint16_t event = monitor_event(p->monitor);
    if (!event) return;
    if (event == ZMQ_EVENT_DISCONNECTED) {
        peer_mark_gone(c, p, now, "connection closed");
    } else if (!p->auth_warned) {
        p->auth_warned = 1;
        log_warn("cluster: %s:%d refused this node's cluster key, or does not hold it: check "
                 "that both use the same --namespace and --cluster-key",
                 p->addr, p->port);
    }
}

/* ZAP: admit a CURVE client only if it presents the cluster public key. */
void transport_handle_zap(cluster *c) {
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

void transport_handle_router_monitor(cluster *c) {
    uint16_t event = monitor_event(c->router_monitor);
    if (!(event & (ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)))
        return;
    c->handshakes_rejected++;
    if (clock_now_ns() - c->last_reject_warn_ns < 10000 * MS) return;
    c->last_reject_warn_ns = clock_now_ns();
    log_warn("cluster: rejected a connection that failed the CURVE handshake (a node without "
             "this cluster's key, or not an exo node)");
}

int transport_open(cluster *c) {
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
    return 0;
}
