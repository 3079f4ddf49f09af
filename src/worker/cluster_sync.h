/* cluster_sync — private to worker/: keeps the replicated cluster State in step with this node's
 * instance manager.
 *
 * A thread compares the local instances and runner statuses (worker/instances.h) with what it has
 * published and submits exo's events through cluster_submit: InstanceCreated, InstanceDeleted,
 * RunnerStatusUpdated, RunnerDeleted. It also acts on State: an instance of this node that
 * disappears from State (deleted through another node) is stopped here; instances of this node
 * that State holds but this process does not run (left from before a restart) are deleted. On the
 * master it deletes instances placed on nodes that left the cluster (NodeTimedOut).
 *
 * Multi-node instances (placed through State) are shards.h's, and the models this node holds on
 * disk are holdings.h's: this thread runs both each pass.
 * It does not place instances or decide where models run. */
#ifndef EXO_WORKER_CLUSTER_SYNC_H
#define EXO_WORKER_CLUSTER_SYNC_H

#include "worker/instances.h"
#include "download/manager.h"
#include "worker/placer.h"

typedef struct cluster_sync cluster_sync;

/* Starts the thread (poll period EXO_CLUSTER_SYNC_MS, default 200); it also runs this node's
 * ranks of multi-node instances (shards.h; dirs: where the master reads models it re-places;
 * downloads and api_port: where a rank's missing files come from). NULL on failure. */
cluster_sync *cluster_sync_start(instances *local, const placer_dirs *dirs,
                                 download_manager *downloads, int api_port);
/* Stops the thread and frees. Safe with NULL. */
void cluster_sync_stop(cluster_sync *s);

/* Asks the cluster to delete an instance by id (any node's). Returns 0 when State holds it and
 * the deletion was submitted, -1 otherwise. */
int cluster_sync_delete_instance(const char *instance_id);

/* A download_listener_fn (download/manager.h): publishes each (throttled, ~1/s) progress update
 * as NodeDownloadProgress, so State's downloads[nodeId] shows it on every node. ud is unused. */
void cluster_sync_download_listener(const download_progress *p, void *ud);

#endif
