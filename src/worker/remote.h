/* remote — private to worker/: generations for models whose instance has its rank 0 on another
 * node. It is the instance table's router (instances.h): for a request it picks, among the
 * State's multi-node instances of the model whose runners are all Ready, the one with the fewest
 * requests this node has in flight on it (this node's own rank-0 instance competes with its
 * in-flight count), and forwards the request to that instance's rank-0 node:
 * POST http://<node>:<apiPort>/internal/generate {"instance_id", "request"} answers with the
 * runner's messages (runner/protocol.h) as NDJSON, streamed as they come, plus {"type":"alive"}
 * every second. Tokens go node to node, never through the master or the event log. With
 * --api-key the call carries this node's key ("Authorization: Bearer"): the nodes of a cluster
 * share one key, and the serving node asks for it on /internal/generate like on every route.
 *
 * A forwarding connection that breaks, or stays silent for REMOTE_SILENCE_S (the node died or
 * was cut off), ends the generation with an error "done" at once: the client's stream ends with
 * an error chunk instead of hanging.
 *
 * Auto-placement: a chat for a model with no instance anywhere that does not fit this node alone
 * places it across the cluster (the best pipeline placement, in State), waits until every rank
 * is Ready and forwards; a model that fits here is placed here the single-node way, as before.
 *
 * It refuses: forwarding a forwarded request (the
 * internal route serves only the named instance's rank 0 on that node). */
#ifndef EXO_WORKER_REMOTE_H
#define EXO_WORKER_REMOTE_H

#include "worker/instances.h"
#include "worker/placer.h"

#define REMOTE_SILENCE_S 3
/* How long a chat waits for the instance it auto-placed across nodes to be Ready. */
#define REMOTE_PLACE_WAIT_S 600

typedef struct remote remote;

/* api_key: this node's --api-key, sent with every forwarded call (NULL or "" = none; copied). */
remote *remote_new(instances *local, const placer_dirs *dirs, const char *api_key);
/* Waits for the calls in flight to end (each one's "done" delivered). Safe with NULL. */
void remote_free(remote *r);
instances_router remote_router(remote *r);

#endif
