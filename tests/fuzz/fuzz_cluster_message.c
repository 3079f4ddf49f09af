/* libFuzzer target: cluster message decoder, beacon decoder and apply() on decoded entries.
 * Every byte here could come from the network; none of it may crash a node. */
#include "cluster/message.h"
#include "cluster/state.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cluster_beacon b;
    cluster_beacon_decode(data, size, &b);
    cluster_message m;
    char err[256];
    if (cluster_message_decode(data, size, &m, err, sizeof err) != CLUSTER_DECODE_OK) return 0;
    if (m.type == CLUSTER_MSG_ENTRIES) {
        json_t *state = cluster_state_new();
        json_t *ents = json_object_get(m.root, "ents");
        size_t i;
        json_t *e;
        json_array_foreach(ents, i, e) {
            /* Force the order apply() expects so every entry reaches the event handlers. */
            json_object_set_new(state, "lastEventAppliedIdx",
                                json_integer(json_integer_value(json_object_get(e, "idx")) - 1));
            cluster_state_apply(state, e, err, sizeof err);
        }
        cluster_state_lookup(state, "topology/connections/0/sink");
        json_decref(state);
    }
    cluster_message_free(&m);
    return 0;
}
