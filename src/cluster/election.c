/* cluster/election — ranking and fork points (see election.h). */
#include "cluster/election.h"

#include <string.h>

int cluster_rank_compare(const cluster_rank_key *a, const cluster_rank_key *b) {
    if (a->last_term != b->last_term) return a->last_term > b->last_term ? 1 : -1;
    if (a->last_idx != b->last_idx) return a->last_idx > b->last_idx ? 1 : -1;
    if (!a->is_master != !b->is_master) return a->is_master ? 1 : -1;
    if (a->started_at_ms != b->started_at_ms) return a->started_at_ms < b->started_at_ms ? 1 : -1;
    int c = strcmp(a->node_id, b->node_id);
    return c > 0 ? 1 : c < 0 ? -1 : 0;
}

size_t cluster_rank_best(const cluster_rank_key *keys, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (cluster_rank_compare(&keys[i], &keys[best]) > 0) best = i;
    return best;
}

const cluster_epoch *cluster_epoch_at(const cluster_epoch *epochs, size_t n, uint64_t idx) {
    size_t lo = 0, hi = n; /* last epoch with first <= idx */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (epochs[mid].first <= idx) lo = mid + 1;
        else hi = mid;
    }
    return lo ? &epochs[lo - 1] : NULL;
}

/* First index after idx where a new epoch starts in the list, or UINT64_MAX. */
static uint64_t next_boundary(const cluster_epoch *e, size_t n, uint64_t idx) {
    for (size_t i = 0; i < n; i++)
        if (e[i].first > idx) return e[i].first;
    return UINT64_MAX;
}

uint64_t cluster_fork_point(const cluster_epoch *a, size_t na, uint64_t count_a,
                            const cluster_epoch *b, size_t nb, uint64_t count_b) {
    uint64_t limit = count_a < count_b ? count_a : count_b;
    uint64_t i = 1;
    while (i <= limit) {
        const cluster_epoch *ea = cluster_epoch_at(a, na, i), *eb = cluster_epoch_at(b, nb, i);
        if (!ea || !eb || ea->term != eb->term || strcmp(ea->master, eb->master)) return i - 1;
        uint64_t na_next = next_boundary(a, na, i), nb_next = next_boundary(b, nb, i);
        i = na_next < nb_next ? na_next : nb_next;
    }
    return limit;
}
