/* placer — placement against this cluster: reads what a model is (its config.json on disk, else
 * its card), which nodes are alive with how much free memory and which already hold the files
 * (cluster State), asks cluster/placement.c for the split, and writes the result as exo's tagged
 * instance. Used by POST /place_instance, GET /instance/previews and /instance/placement, and by
 * the master when it re-places an instance whose node or runner failed.
 *
 * Instance shape (exo's): {"MlxRingInstance"|"MlxJacclInstance"|...: {"instanceId",
 * "shardAssignments": {"modelId", "runnerToShard": {runnerId: {"PipelineShardMetadata" |
 * "TensorShardMetadata": {"modelId", "deviceRank", "worldSize", "startLayer", "endLayer",
 * "nLayers"}}}, "nodeToRunner": {nodeId: runnerId}}, "sharding", "transport"}}.
 *
 * It refuses: starting anything (the workers do, when they see the instance in State). */
#ifndef EXO_WORKER_PLACER_H
#define EXO_WORKER_PLACER_H

#include "cluster/placement.h"

#include <jansson.h>
#include <stddef.h>

/* Where a model's facts are read from. */
typedef struct placer_dirs {
    char models_dir[1024];
    char models_path[4096]; /* colon-separated, read-only */
    char data_dir[1024];    /* custom cards under <data_dir>/custom_cards; "" = none */
} placer_dirs;

/* The model as placement needs it, plus its tensor-parallel rules when its config is on disk.
 * Free with placer_model_free. */
typedef struct placer_model {
    placement_model facts;
    struct model_config *config; /* NULL: known from its card only */
} placer_model;

/* Returns 0, or -1 with err (unknown model). context_length 0 = the model's own (capped by it). */
int placer_model_load(const placer_dirs *dirs, const char *model_id, int context_length,
                      placer_model *out, char *err, size_t errlen);
void placer_model_free(placer_model *m);

/* The nodes a new instance can use: alive members in State with their free memory (this node
 * alone without a cluster). Returns how many. */
int placer_nodes(const placer_dirs *dirs, const char *model_id, placement_node *nodes, int max);

/* exo's instance_meta values -> the tag of the instance and our transport. Returns 0, or -1 with
 * err naming the accepted values. */
int placer_instance_meta(const char *meta, const char **tag, const char **transport, char *err,
                         size_t errlen);

/* The tagged instance for a placement (new reference); instance_id NULL = a fresh id. Runner ids
 * are fresh too. */
json_t *placer_instance_json(const placement_model *m, placement_sharding s, const char *meta,
                             const placement_result *r, const char *instance_id);

/* The best placement with at least min_nodes nodes (the smallest count that fits): 0 with *out
 * set, or -1 with err (the reason of the smallest count tried). */
int placer_place(const placer_model *m, placement_sharding s, int min_nodes,
                 const placement_node *nodes, int n_nodes, placement_result *out, char *err,
                 size_t errlen);

#endif
