/* shards — private to worker/: this node's part in the multi-node instances of the cluster State.
 *
 * - shards_follow: every rank the State assigns to this node (nodeToRunner) gets its runner,
 *   started once per instance with that rank's flags (instances_start_shard); the runner finds
 *   the other ranks through the rendezvous below, then they talk to each other directly (Gloo).
 *   A rank whose model is not complete on this node first downloads only its files (a pipeline
 *   stage: its layers' safetensors files, download.h; tensor: all), from peers holding the model
 *   first, then the Hub (progress in State's downloads, with startLayer/endLayer), and the
 *   runner opens just those files. A rank with its files publishes RunnerIdle; runners start
 *   when every rank of the instance has a status, so none waits in the data plane's connect
 *   for a peer still downloading. A download that fails reports RunnerFailed with its reason
 *   (offline, not on the Hub, disk full). An instance deleted while its rank downloads stops
 *   that download (unless another rank here waits for the same model).
 * - shards_rendezvous: the ranks' store (runner/store_node.h) kept in State: a set becomes
 *   InstanceRendezvousSet (stored under the instance, gone with it), a get reads this node's copy.
 * - shards_fail_over (master only): an instance with a failed runner is deleted, and placed again
 *   (same model, sharding and transport, any node count) on the nodes still alive when it fits
 *   there, once a dead node has had time to drop out of the live peers.
 *
 * It refuses: single-node instances of this node (instances.c and cluster_sync.c own those). */
#ifndef EXO_WORKER_SHARDS_H
#define EXO_WORKER_SHARDS_H

#include "download/manager.h"
#include "worker/instances.h"
#include "worker/placer.h"

#include <jansson.h>

typedef struct shards shards;

/* Ranks started here bind and advertise this node's first non-loopback IPv4 address (the one
 * other nodes reach; EXO_DIST_HOST overrides); EXO_DIST_TIMEOUT_MS sets their data-plane timeout. */
shards *shards_new(instances *local, const placer_dirs *dirs, download_manager *downloads,
                   int api_port);
void shards_free(shards *s);

/* The hooks to install with instances_set_cluster_hooks. */
instances_rendezvous shards_rendezvous(shards *s);

/* One pass over State (the caller's copy): start this node's new ranks; forget instances that
 * left State, stopping the download a rank of theirs started (its .partial files stay: a later
 * download of the model resumes them; DELETE /download removes them). */
void shards_follow(shards *s, json_t *state, const char *me);

/* Master: deletes instances with a failed runner and places each again. deleting is the caller's
 * set of instance ids whose deletion is already submitted (updated here). */
void shards_fail_over(shards *s, json_t *state, json_t *deleting);

/* Submits the deletion of an instance and its runners (any node's). */
void shards_submit_delete(json_t *instance, const char *id);

/* "State says so" helpers shared with cluster_sync and the router: the inner object of a tagged
 * value {"Kind": {...}} (borrowed, or NULL), and whether an instance was placed through State
 * (any kind but this node's own LocalInstance). */
json_t *shards_tagged_body(json_t *tagged);
/* The instance's shardAssignments.nodeToRunner (borrowed, or NULL). */
json_t *shards_node_to_runner(json_t *instance);
int shards_is_cluster_instance(json_t *instance);

#endif
