/* cluster replication — how events get into every node's log. Any node queues its own
 * submissions (pending, resent until seen ordered); the master orders each session's
 * submissions exactly once and in sequence, appends them and broadcasts new entries; a follower
 * takes entries only from its master, checks they continue its log (epoch of the previous
 * entry), and asks for a sync from the fork point when they do not. */
#include "cluster/cluster_internal.h"

#include "base/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void replication_submit(cluster *c, json_t *event) {
    json_array_append_new(c->pending,
                          json_pack("{s:I, s:o}", "seq", (json_int_t)c->next_seq++, "e", event));
    c->submit_now = 1;
}

static void master_append(cluster *c, const char *origin, const char *sess, uint64_t seq,
                          json_t *event) {
    json_t *entry =
        json_pack("{s:I, s:I, s:s, s:I, s:s, s:s, s:I, s:O}", "idx",
                  (json_int_t)local_log_count(c) + 1, "term", (json_int_t)c->my_term, "master",
                  c->identity.node_id, "time", (json_int_t)clock_unix_ms(), "origin", origin,
                  "sess", sess, "seq", (json_int_t)seq, "event", event);
    local_log_append(c, entry);
    json_decref(entry);
}

/* Orders a session's submissions: exactly once, in sequence order. */
void replication_take(cluster *c, const char *origin, const char *sess, json_t *list) {
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
void replication_master_event(cluster *c, json_t *event) {
    uint64_t seq = (uint64_t)json_integer_value(json_object_get(c->seqs, c->msess)) + 1;
    master_append(c, c->identity.node_id, c->msess, seq, event);
    json_decref(event);
}

static json_t *entries_message(cluster *c, uint64_t from, uint64_t upto, int trunc,
                               uint64_t *sent_upto) {
    json_t *msg = cluster_message_new(CLUSTER_MSG_ENTRIES, c->identity.node_id);
    if (from > 1) {
        const cluster_epoch *e = cluster_epoch_at(c->epochs, c->n_epochs, from - 1);
        json_object_set_new(msg, "prev",
                            json_pack("[I, I, s]", (json_int_t)from - 1,
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

void replication_master_broadcast(cluster *c) {
    while (c->broadcast_upto < local_log_count(c)) {
        uint64_t sent;
        json_t *msg = entries_message(c, c->broadcast_upto + 1, local_log_count(c), 0, &sent);
        if (sent <= c->broadcast_upto) {
            json_decref(msg);
            break;
        }
        json_object_set_new(msg, "more", json_false());
        peers_send_alive(c, msg);
        json_decref(msg);
        c->broadcast_upto = sent;
    }
}

void replication_handle_sync(cluster *c, peer *p, const json_t *m) {
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
    uint64_t fork =
        cluster_fork_point(theirs, n, since, c->epochs, c->n_epochs, local_log_count(c));
    free(theirs);
    uint64_t sent;
    json_t *msg = entries_message(c, fork + 1, local_log_count(c), 1, &sent);
    peer_send(c, p->dealer, msg);
    json_decref(msg);
}

void replication_send_pending(cluster *c, uint64_t now) {
    if (c->is_master) {
        replication_take(c, c->identity.node_id, c->sess, c->pending);
        return;
    }
    if (!json_array_size(c->pending) || !c->master_id[0]) return;
    if (!c->submit_now && now - c->last_submit_ns < SUBMIT_RESEND_NS) return;
    peer *m = peer_find(c, c->master_id);
    if (!m || !m->alive) return;
    json_t *msg = cluster_message_new(CLUSTER_MSG_SUBMIT, c->identity.node_id);
    json_object_set_new(msg, "sess", json_string(c->sess));
    json_t *ev = json_array();
    for (size_t i = 0; i < json_array_size(c->pending) && i < 256; i++)
        json_array_append(ev, json_array_get(c->pending, i));
    json_object_set_new(msg, "ev", ev);
    peer_send(c, m->dealer, msg);
    json_decref(msg);
    c->last_submit_ns = now;
    c->submit_now = 0;
}

static void request_sync(cluster *c) {
    c->sync_now = 1;
}

static void send_sync(cluster *c, uint64_t now) {
    peer *m = peer_find(c, c->master_id);
    if (!m || !m->alive) return;
    json_t *msg = cluster_message_new(CLUSTER_MSG_SYNC, c->identity.node_id);
    json_object_set_new(msg, "since", json_integer((json_int_t)local_log_count(c)));
    json_object_set_new(msg, "epochs", local_log_epochs_json(c));
    peer_send(c, m->dealer, msg);
    json_decref(msg);
    c->last_sync_ns = now;
    c->sync_now = 0;
}

static int same_epoch_at(cluster *c, uint64_t idx, uint64_t term, const char *master) {
    const cluster_epoch *e = cluster_epoch_at(c->epochs, c->n_epochs, idx);
    return e && e->term == term && !strcmp(e->master, master);
}

void replication_handle_entries(cluster *c, const char *from, const json_t *m) {
    if (c->is_master || strcmp(from, c->master_id)) return; /* only our master orders */
    json_t *prev = json_object_get(m, "prev");
    uint64_t pi = json_is_null(prev) ? 0 : (uint64_t)json_integer_value(json_array_get(prev, 0));
    if (pi > local_log_count(c)) {
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
        if (idx <= local_log_count(c)) {
            if (same_epoch_at(c, idx, term, master)) continue;
            local_log_rebuild(c, idx - 1);
        }
        if (local_log_append(c, e)) return;
    }
    uint64_t end = pi + json_array_size(ents);
    peer *mp = peer_find(c, from);
    if (mp && end > mp->last_idx) { /* it holds what it sent, even if its heartbeat lags */
        mp->last_idx = end;
        if (json_array_size(ents))
            mp->last_term = (uint64_t)json_integer_value(
                json_object_get(json_array_get(ents, json_array_size(ents) - 1), "term"));
    }
    if (json_is_true(json_object_get(m, "trunc")) && local_log_count(c) > end)
        local_log_rebuild(c, end);
    if (json_is_true(json_object_get(m, "more"))) request_sync(c);
}

void replication_follower_tick(cluster *c, uint64_t now) {
    if (c->is_master || !c->master_id[0]) return;
    peer *m = peer_find(c, c->master_id);
    if (!m || !m->alive) return;
    if (m->last_idx != local_log_count(c) || m->last_term != local_log_last_term(c))
        c->sync_now = 1;
    if (c->sync_now && now - c->last_sync_ns >= SYNC_INTERVAL_NS) send_sync(c, now);
}
