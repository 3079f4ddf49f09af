/* cluster publish — this node's facts as events: identity, memory, disk, system and network
 * info (gathered by nodeinfo.c), and the measured links to its peers (latency from heartbeats,
 * bandwidth from probes). It decides when a change is worth an event; it never publishes for
 * other nodes. */
#include "cluster/cluster_internal.h"

#include "base/clock.h"
#include "cluster/nodeinfo.h"
#include "cluster/state.h"

#include <math.h>
#include <stdatomic.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef EXO_VERSION
#define EXO_VERSION "0.0.0"
#endif

static void publish_info(cluster *c, const char *kind, json_t *info) {
    if (!info) return;
    replication_submit(c, json_pack("{s:{s:s, s:{s:o}}}", "NodeGatheredInfo", "nodeId",
                                    c->identity.node_id, "info", kind, info));
}

static uint64_t json_bytes(json_t *o, const char *key) {
    return (uint64_t)json_integer_value(json_object_get(json_object_get(o, key), "inBytes"));
}

static uint64_t distance(uint64_t a, uint64_t b) {
    return a > b ? a - b : b - a;
}

static void publish_memory(cluster *c, int force) {
    json_t *m = nodeinfo_memory_json(!strcmp(c->options.device, "cuda"));
    if (!m) return;
    uint64_t total = json_bytes(m, "ramTotal"), avail = json_bytes(m, "ramAvailable");
    uint64_t swap = json_bytes(m, "swapAvailable");
    uint64_t gpu_total = json_bytes(m, "gpuTotal"), gpu = json_bytes(m, "gpuAvailable");
    uint64_t d1 = distance(avail, c->published_mem_avail);
    uint64_t d2 = distance(swap, c->published_swap_free);
    uint64_t d3 = distance(gpu, c->published_gpu_avail);
    /* Placement needs the rough picture; a busy host moves by a few percent all the time. */
    int stale = clock_now_ns() - c->memory_published_ns > MEMORY_REFRESH_NS;
    if (!force && !stale && d1 * 20 < total && d2 * 20 < total && d3 * 20 <= gpu_total) {
        json_decref(m);
        return;
    }
    c->mem_total = total;
    c->memory_published_ns = clock_now_ns();
    c->published_mem_avail = avail;
    c->published_swap_free = swap;
    c->published_gpu_avail = gpu;
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

/* The node's CPU bandwidth (cluster_set_memory_bandwidth), in MB/s: a word, so any thread. */
static _Atomic uint64_t bandwidth_mbs;

void cluster_set_memory_bandwidth(double gbs) {
    atomic_store(&bandwidth_mbs, gbs > 0 ? (uint64_t)(gbs * 1000) : 0);
}

static void publish_system(cluster *c) {
    double gbs = (double)atomic_load(&bandwidth_mbs) / 1000;
    c->published_bandwidth_gbs = gbs;
    publish_info(c, "SystemInfo", nodeinfo_system_json(c->options.device, gbs));
}

static void publish_identity(cluster *c) {
    char started[48];
    cluster_format_time(c->started_at_ms, started, sizeof started);
    publish_info(c, "NodeIdentity",
                 json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i}", "friendlyName",
                           c->identity.friendly_name, "publicKey", c->identity.public_key,
                           "version", EXO_VERSION, "namespace", c->options.namespace_name,
                           "startedAt", started, "listenPort", c->options.listen_port,
                           "apiPort", c->options.api_port));
}

static json_t *current_edges(cluster *c) {
    json_t *edges = json_array();
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (!p->alive || !p->id[0] || p->rtt_ms < 0) continue;
        json_t *e =
            json_pack("{s:s, s:f}", "sink", p->id, "latencyMs", round(p->rtt_ms * 1000.0) / 1000.0);
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
    c->edges_refresh_ns =
        EDGES_REFRESH_NS * 4 / 5 + randombytes_uniform(1000) * (EDGES_REFRESH_NS / 2500);
    replication_submit(c, json_pack("{s:{s:s, s:o}}", "TopologyEdgesMeasured", "source",
                                    c->identity.node_id, "edges", cur));
}

void publish_node_info_tick(cluster *c, uint64_t now) {
    if (!c->master_id[0]) return; /* nothing to publish to yet */
    /* Our identity missing from State (first join, or timed out while away): publish all. */
    if (!json_object_get(json_object_get(c->state, "nodeIdentities"), c->identity.node_id) &&
        json_array_size(c->pending) == 0 && now - c->last_republish_ns > 2000 * MS) {
        c->last_republish_ns = now;
        publish_identity(c);
        publish_memory(c, 1);
        publish_disk(c, 1);
        publish_system(c);
        publish_network(c, 1);
        json_decref(c->published_edges);
        c->published_edges = NULL;
        c->last_edges_ns = 0;
        c->next_memory_ns = now + MEMORY_CHECK_NS;
        c->next_disk_ns = now + DISK_CHECK_NS;
        c->next_network_ns = now + NETWORK_CHECK_NS;
        return;
    }
    /* the CPU's bandwidth is measured while the node starts: published once it is known */
    if ((double)atomic_load(&bandwidth_mbs) / 1000 != c->published_bandwidth_gbs)
        publish_system(c);
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

void publish_send_probes(cluster *c, uint64_t now) {
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
        peer_send(c, p->dealer, msg);
        json_decref(msg);
    }
}

void publish_handle_probe(cluster *c, peer *p, const json_t *m, size_t len) {
    if (!p) return;
    json_t *ack = cluster_message_new(CLUSTER_MSG_PROBE_ACK, c->identity.node_id);
    json_object_set(ack, "ts", json_object_get(m, "ts"));
    json_object_set_new(ack, "n", json_integer((json_int_t)len));
    peer_send(c, p->dealer, ack);
    json_decref(ack);
}

void publish_handle_probe_ack(peer *p, const json_t *m, uint64_t now) {
    if (!p) return;
    int64_t elapsed_us = (int64_t)(now / 1000) - json_integer_value(json_object_get(m, "ts"));
    if (elapsed_us <= 0 || elapsed_us > 60000000) return;
    double transfer_us = (double)elapsed_us - (p->rtt_ms > 0 ? p->rtt_ms * 1000.0 : 0);
    if (transfer_us < (double)elapsed_us * 0.1) transfer_us = (double)elapsed_us * 0.1;
    double bits = (double)json_integer_value(json_object_get(m, "n")) * 8.0;
    p->bandwidth_mbps = bits / transfer_us; /* bits per microsecond = Mbit/s */
}
