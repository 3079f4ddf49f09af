/* cluster/election — the pure parts of master election and log reconciliation.
 *
 * Bully election: every node ranks the live members (itself included) by
 *   1. log position: the term of its last log entry, then its last index (a node that lacks
 *      entries others have can never win, so a master change never drops ordered events);
 *   2. incumbency: a node that is master already wins ties (no churn when nodes join);
 *   3. seniority: the earlier start time wins;
 *   4. node id: the larger wins (total order: exactly one best).
 * The best live node is master. cluster.c adds the debounce and the liveness view.
 *
 * The log is a sequence of epochs: runs of entries ordered by one master in one term. Two logs
 * agree up to the first index where their (term, master) differ; cluster_fork_point finds it
 * from the epoch lists alone, so a follower that diverged during a partition keeps exactly the
 * common prefix and takes the rest from the master. No I/O, no clocks. */
#ifndef EXO_CLUSTER_ELECTION_H
#define EXO_CLUSTER_ELECTION_H

#include <stddef.h>
#include <stdint.h>

typedef struct cluster_rank_key {
    uint64_t last_term;
    uint64_t last_idx;
    int is_master;
    int64_t started_at_ms;
    const char *node_id;
} cluster_rank_key;

/* > 0 when a ranks above b, < 0 below, 0 only for identical keys. */
int cluster_rank_compare(const cluster_rank_key *a, const cluster_rank_key *b);
/* Index of the best of n >= 1 keys. */
size_t cluster_rank_best(const cluster_rank_key *keys, size_t n);

typedef struct cluster_epoch {
    uint64_t term;
    char master[72];
    uint64_t first; /* index of the epoch's first entry; strictly increasing along a list */
} cluster_epoch;

/* The epoch holding entry idx (1..count), or NULL. */
const cluster_epoch *cluster_epoch_at(const cluster_epoch *epochs, size_t n, uint64_t idx);
/* The length of the longest common prefix of two logs given as epoch lists and entry counts. */
uint64_t cluster_fork_point(const cluster_epoch *a, size_t na, uint64_t count_a,
                            const cluster_epoch *b, size_t nb, uint64_t count_b);

#endif
