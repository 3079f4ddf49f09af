/* cluster discovery — how a member finds peers: UDP beacons on the discovery port (the
 * namespace hash and our ROUTER port, broadcast on every interface), --peer bootstrap addresses
 * for networks without broadcast, and gossip of the live peer list so that every member
 * connects to every other. It only creates connections (transport.c); membership decides who
 * is alive. */
#include "cluster/cluster_internal.h"
#include "cluster/nodeinfo.h"

#include "base/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

void discovery_beacon_send(cluster *c) {
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

void discovery_beacon_receive(cluster *c) {
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
        peer *p = peer_find(c, b.node_id);
        if (p && p->alive) continue;
        peer_ensure(c, b.node_id, addr, b.port);
    }
}

void discovery_gossip_send(cluster *c, uint64_t now) {
    json_t *list = json_array();
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (!p->alive || !p->id[0]) continue;
        json_array_append_new(
            list, json_pack("{s:s, s:s, s:i}", "id", p->id, "addr", p->addr, "port", p->port));
    }
    json_t *msg = cluster_message_new(CLUSTER_MSG_PEERS, c->identity.node_id);
    json_object_set_new(msg, "peers", list);
    peers_send_alive(c, msg);
    json_decref(msg);
    c->last_gossip_ns = now;
    c->gossip_pending = 0;
    c->gossip_now = 0;
}

void discovery_gossip_handle(cluster *c, const json_t *m) {
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(m, "peers"), i, p) {
        const char *id = json_string_value(json_object_get(p, "id"));
        if (peer_find(c, id) || !strcmp(id, c->identity.node_id)) continue;
        peer_ensure(c, id, json_string_value(json_object_get(p, "addr")),
                    (int)json_integer_value(json_object_get(p, "port")));
    }
}

int discovery_open(cluster *c) {
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
        peer_add(c, "", host, atoi(colon + 1));
    }
    return 0;
}

/* Every member the replicated State lists gets a connection, whether or not gossip or a beacon
 * told us of it: members that met only through a node that has since died still find each other
 * through the State they folded while it was alive. Addresses: the member's published interfaces
 * (non-loopback first; loopback when that is all it has, i.e. one host) and its listen port. */
void discovery_dial_state_members(cluster *c, uint64_t now) {
    if (now < c->next_state_dial_ns) return;
    c->next_state_dial_ns = now + STATE_DIAL_INTERVAL_NS;
    const char *id;
    json_t *ident;
    json_object_foreach(json_object_get(c->state, "nodeIdentities"), id, ident) {
        if (!strcmp(id, c->identity.node_id) || peer_find(c, id)) continue;
        json_int_t port = json_integer_value(json_object_get(ident, "listenPort"));
        if (port <= 0 || port > 65535) continue;
        json_t *ifs = json_object_get(json_object_get(json_object_get(c->state, "nodeNetwork"), id),
                                      "interfaces");
        const char *addr = nodeinfo_reachable_ipv4(ifs);
        if (!addr) continue;
        log_debug("cluster: dialing %s at %s:%d (listed in State)", id, addr, (int)port);
        peer_ensure(c, id, addr, (int)port);
    }
}
