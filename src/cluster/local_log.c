/* cluster local log — this node's copy of the replicated event log: appending ordered entries,
 * folding them into epochs, per-session sequence numbers and State, snapshots of State on disk,
 * and rebuilding all of that when the master's log forks from ours. It never talks to peers
 * (replication.c decides what to append or cut). */
#include "cluster/cluster_internal.h"

#include "base/log.h"
#include "cluster/state.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

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
    while (json_array_size(c->pending) > 0 && (uint64_t)json_integer_value(json_object_get(
                                                  json_array_get(c->pending, 0), "seq")) <= seq)
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

int local_log_append(cluster *c, const json_t *entry) {
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

json_t *local_log_epochs_json(cluster *c) {
    json_t *a = json_array();
    for (size_t i = 0; i < c->n_epochs; i++)
        json_array_append_new(a, json_pack("[I, s, I]", (json_int_t)c->epochs[i].term,
                                           c->epochs[i].master, (json_int_t)c->epochs[i].first));
    return a;
}

void local_log_snapshot(cluster *c) {
    uint64_t idx = local_log_count(c);
    if (!idx || idx == c->snapshot_idx) return;
    eventlog_sync(c->log);
    json_t *snap = json_pack("{s:I, s:o, s:O, s:O}", "idx", (json_int_t)idx, "epochs",
                             local_log_epochs_json(c), "seqs", c->seqs, "state", c->state);
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
void local_log_rebuild(cluster *c, uint64_t keep) {
    uint64_t count = local_log_count(c);
    for (uint64_t i = keep + 1; i <= count; i++) {
        json_t *e = read_entry(c, i);
        if (e && !strcmp(json_string_value(json_object_get(e, "sess")), c->sess)) {
            json_int_t seq = json_integer_value(json_object_get(e, "seq"));
            size_t at = 0;
            int dup = 0;
            for (; at < json_array_size(c->pending); at++) {
                json_int_t s =
                    json_integer_value(json_object_get(json_array_get(c->pending, at), "seq"));
                if (s == seq) dup = 1;
                if (s >= seq) break;
            }
            if (!dup)
                json_array_insert_new(
                    c->pending, at,
                    json_pack("{s:I, s:O}", "seq", seq, "e", json_object_get(e, "event")));
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
    for (uint64_t i = from; i <= local_log_count(c); i++) {
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
    if (c->broadcast_upto > local_log_count(c)) c->broadcast_upto = local_log_count(c);
}

int local_log_open(cluster *c) {
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
    local_log_rebuild(c, local_log_count(c));
    c->started_with_log = local_log_count(c) > 0;
    log_info("cluster: event log has %llu entries (replayed from %s)",
             (unsigned long long)local_log_count(c), c->snapshot_idx ? "a snapshot" : "the start");
    return 0;
}
