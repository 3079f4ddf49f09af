/* cluster membership — heartbeats (who is alive, their log position and clock, link latency),
 * the election (bully-style ranking from election.h, debounced while membership changes) and,
 * on the master, removing nodes that stay gone past the node timeout. */
#include "cluster/cluster_internal.h"

#include "base/log.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef EXO_VERSION
#define EXO_VERSION "0.0.0"
#endif

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
        json_object_set_new(hb, "lt", json_integer((json_int_t)local_log_last_term(c)));
        json_object_set_new(hb, "li", json_integer((json_int_t)local_log_count(c)));
        json_object_set_new(hb, "m", json_boolean(c->is_master));
        json_object_set_new(hb, "ts", json_integer(now_us));
        if (p->their_ts_recv_ns && p->alive) {
            json_object_set_new(hb, "ets", json_integer(p->their_ts_us));
            json_object_set_new(hb, "edl",
                                json_integer((json_int_t)((now - p->their_ts_recv_ns) / 1000)));
        }
        peer_send(c, p->dealer, hb);
        json_decref(hb);
    }
}

void membership_send_heartbeats(cluster *c, uint64_t now, int all) {
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (!p->dealer || (!all && p->alive)) continue;
        send_heartbeat_to(c, p, now);
    }
}

void membership_handle_heartbeat(cluster *c, const json_t *m, const char *from, const char *addr,
                                 uint64_t now) {
    int port = (int)json_integer_value(json_object_get(m, "port"));
    peer *p = peer_find(c, from);
    if (!p) p = peer_ensure(c, from, addr[0] ? addr : "127.0.0.1", port);
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
        /* Gossip at join, not after a quiet period: nodes that bootstrapped through this one
         * must learn of each other even if it dies a moment later. */
        c->gossip_now = 1;
        membership_changed(c, now);
    }
    if (json_is_true(json_object_get(m, "hello"))) send_heartbeat_to(c, p, now);
}

static void become_master(cluster *c, uint64_t now) {
    uint64_t term = c->max_term;
    if (local_log_last_term(c) > term) term = local_log_last_term(c);
    for (size_t i = 0; i < c->n_peers; i++)
        if (c->peers[i].term > term) term = c->peers[i].term;
    c->my_term = term + 1;
    c->max_term = c->my_term;
    c->is_master = 1;
    snprintf(c->master_id, sizeof c->master_id, "%s", c->identity.node_id);
    c->elections_won++;
    json_object_clear(c->absent_since);
    c->broadcast_upto = local_log_count(c);
    log_info("cluster: this node is master (term %llu, log at %llu)",
             (unsigned long long)c->my_term, (unsigned long long)local_log_count(c));
    replication_master_event(c, json_pack("{s:{s:s, s:I}}", "MasterElected", "nodeId",
                                          c->identity.node_id, "term", (json_int_t)c->my_term));
    c->next_heartbeat_ns = now;
}

void membership_elect(cluster *c, uint64_t now) {
    cluster_rank_key keys[MAX_PEERS + 1];
    size_t n = 0;
    keys[n++] = (cluster_rank_key){local_log_last_term(c), local_log_count(c), c->is_master,
                                   c->started_at_ms, c->identity.node_id};
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
            peer *p = peer_find(c, keys[i].node_id);
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
    uint64_t debounce =
        now - c->started_ns < 5000 * MS ? 3 * ELECTION_DEBOUNCE_NS : ELECTION_DEBOUNCE_NS;
    if (now - c->membership_changed_ns < debounce) return;
    if (now - c->candidate_since_ns < ELECTION_DEBOUNCE_NS) return;
    become_master(c, now);
}

void membership_check_liveness(cluster *c, uint64_t now) {
    for (size_t i = 0; i < c->n_peers; i++) {
        peer *p = &c->peers[i];
        if (p->alive && now - p->last_heard_ns > c->peer_timeout_ns)
            peer_mark_gone(c, p, now, "no heartbeat within the peer timeout");
    }
}

/* Master: a node in State that stays gone for the node timeout is removed (NodeTimedOut). */
void membership_time_out_nodes(cluster *c, int64_t now_ms) {
    json_t *ids = json_object_get(c->state, "nodeIdentities");
    const char *id;
    json_t *v;
    json_object_foreach(ids, id, v) {
        if (!strcmp(id, c->identity.node_id)) continue;
        peer *p = peer_find(c, id);
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
        replication_master_event(c, json_pack("{s:{s:s}}", "NodeTimedOut", "nodeId", gone));
        free(gone);
        break; /* the iterator is invalid once State changes; the rest wait a tick */
    }
}
