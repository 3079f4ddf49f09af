/* store_node — a dist_store (dist/dist.h) that asks the runner's node: the rendezvous of ranks on
 * different machines goes through the cluster's replicated State (see store_node.c). Messages
 * (runner/protocol.h): runner -> node {"type":"store_set","key","value":HEX} and
 * {"type":"store_get","key"}; node -> runner {"type":"store_value","key","value"?:HEX} (no value:
 * not in State yet; the runner asks again until its timeout). */
#ifndef EXO_RUNNER_STORE_NODE_H
#define EXO_RUNNER_STORE_NODE_H

#include "dist/dist.h"
#include "runner/protocol.h"

typedef struct store_node {
    int fd;
    protocol_reader reader;
    int shutdown; /* the node asked the runner to stop while it was connecting */
} store_node;

/* out then uses s (which must outlive it) over the node socket fd. */
void store_node_init(store_node *s, int fd, dist_store *out);
void store_node_free(store_node *s);

#endif
