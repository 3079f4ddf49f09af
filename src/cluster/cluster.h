/* cluster — the control plane's door: start/stop this node's cluster member, read the
 * replicated State and event log, and submit events for the master to order.
 *
 * One cluster member per process. cluster_start spawns a thread that discovers peers (UDP
 * beacons + --peer), talks to them over CURVE-encrypted ZeroMQ, elects a master, and keeps the
 * event log replica under --data-dir/cluster/. Every function below is safe to call from any
 * thread (HTTP handlers, the worker). It does not place instances, run models or download files:
 * those modules submit events through cluster_submit and read State back.
 *
 * Environment knobs (tests and benchmarks; defaults in parentheses):
 *   EXO_CLUSTER_PEER_TIMEOUT_MS (5000)  a silent peer is gone after this long
 *   EXO_CLUSTER_NODE_TIMEOUT_MS (30000) the master removes a gone node from State after this
 *   EXO_CLUSTER_SNAPSHOT_EVERY (1000)   entries between State snapshots on disk */
#ifndef EXO_CLUSTER_H
#define EXO_CLUSTER_H

#include <jansson.h>
#include <stdint.h>

#define CLUSTER_MAX_PEERS 64

/* What the member needs from the node's configuration (cmd/ fills it from the command line). */
typedef struct cluster_config {
    char data_dir[1024];         /* identity, logs and the event log (under <data_dir>/cluster) */
    char namespace_name[128];    /* nodes join only their own namespace */
    char cluster_key_file[1024]; /* secret for cluster traffic; "" = derived from the namespace */
    int listen_port;             /* cluster traffic (TCP); 0 = any free port */
    int api_port;                /* this node's HTTP API (published: other nodes forward
                                    generations to it); 0 = none */
    int discovery_port;          /* UDP beacons */
    const char *peers[CLUSTER_MAX_PEERS]; /* HOST:PORT of peers beyond broadcast (borrowed) */
    int n_peers;
    /* What this node's runners compute on, "cpu" or "cuda" ("" = no runners: not published).
     * Published in nodeSystem with that device's memory bandwidth, and for "cuda" GPU 0's
     * memory in nodeMemory: placement splits a pipeline by them (cluster/placement.h). */
    char device[8];
} cluster_config;

/* Starts the member. Returns 0, or -1 after logging an error a user can act on (data dir not
 * writable, port in use, bad --cluster-key, ...). */
int cluster_start(const cluster_config *config);
/* Stops the thread, closes sockets and the log. Safe to call when not started. */
void cluster_stop(void);

/* This node's measured CPU memory read bandwidth (GB/s), published in nodeSystem (again, when
 * it arrives after the node joined). Callable from any thread, before or after cluster_start. */
void cluster_set_memory_bandwidth(double gbs);

/* This node's id (stable across restarts), or "" before cluster_start. */
const char *cluster_node_id(void);
int cluster_is_master(void);

/* The State, or the value at a '/'-separated sub-path of it ("nodeMemory/<id>"), as JSON text
 * (malloc'd; free it). NULL when the path does not exist or the cluster is not running. */
char *cluster_state_json(const char *subpath);
/* 1 when the State has a value at the sub-path ("instances/<id>"), 0 when not or not running. */
int cluster_state_has(const char *subpath);
/* The log entries with index > since, as a JSON array (malloc'd). NULL if not running. */
char *cluster_events_json(uint64_t since);
/* One page of the log for streaming: the entries with index in (since, since + max], joined
 * by commas without brackets (malloc'd); *last gets the last index included. NULL when there
 * is none (or not running). */
char *cluster_events_page(uint64_t since, uint64_t max, uint64_t *last);
/* This node's own view, for operators and tests: node id, master, term, live peers with
 * their link latency, log length, and counters (messages, bytes, drops, rejections). */
char *cluster_status_json(void);

/* Queues a local event {"EventName": {...}} for the master to order into the log; takes
 * ownership of event. Returns 0, or -1 (event freed) when the cluster is not running or the
 * event is not a one-key object holding an object. Delivery is at-least-once from here and
 * exactly-once in the log: the node resends until it sees the event ordered. */
int cluster_submit(json_t *event);

/* HTTP glue for GET /node_id, /state, /state/{path}, /events[?since=N], /cluster/status.
 * Returns 1 and sets *status and *body (malloc'd JSON) when path is one of these, else 0. */
int cluster_http_get(const char *path, const char *query, int *status, char **body);

#endif
