/* cluster/state — the cluster State and the pure fold `apply(state, entry)`.
 *
 * State is a JSON object in exo's camelCase shape (what GET /state serves):
 *   instances{id: instance}, runners{id: status}, downloads{nodeId: [progress]}, tasks{id: task},
 *   lastSeen{nodeId: ISO-8601}, topology{nodes:[id], connections:[{source,sink,latencyMs,
 *   bandwidthMbps}]}, nodeIdentities, nodeMemory, nodeDisk, nodeSystem, nodeNetwork{nodeId:
 *   {interfaces:[..]}}, customModelCards{}, masterNodeId, term, lastEventAppliedIdx.
 *
 * apply() reads only the state and the entry: no clock, no I/O, no randomness, so every node that
 * folds the same log gets the same state. Events are tagged unions {"EventName": {...}}. An
 * event of an unknown type, or one whose fields are wrong, changes nothing but the applied index
 * (and is reported), so one bad event cannot wedge the log. Events are listed in docs/cluster.md. */
#ifndef EXO_CLUSTER_STATE_H
#define EXO_CLUSTER_STATE_H

#include <jansson.h>
#include <stddef.h>

json_t *cluster_state_new(void);

enum cluster_apply_result {
    CLUSTER_APPLY_OK = 0,
    CLUSTER_APPLY_IGNORED = 1, /* unknown event type or bad fields: only lastEventAppliedIdx moved */
    CLUSTER_APPLY_OUT_OF_ORDER = 2, /* entry idx != lastEventAppliedIdx + 1: nothing changed */
};

/* Folds one log entry (validated by cluster_entry_validate) into state. err gets the reason for
 * IGNORED / OUT_OF_ORDER. */
enum cluster_apply_result cluster_state_apply(json_t *state, const json_t *entry, char *err,
                                              size_t errlen);

/* The value at a '/'-separated path ("nodeMemory/<id>/ramTotal", "topology/nodes/0"), borrowed;
 * NULL when absent. An empty path or "/" is the whole state. */
json_t *cluster_state_lookup(json_t *state, const char *path);

/* Formats a Unix time in milliseconds as ISO-8601 UTC with milliseconds. */
void cluster_format_time(long long unix_ms, char *out, size_t n);

#endif
