/* placement — choose the nodes and the split for a model instance. Pure functions: the caller
 * supplies what it knows of the model and of each node's free memory; nothing here reads State,
 * files or the network, so it is tested in isolation and used by /instance/previews,
 * /instance/placement and the master.
 *
 * Memory counted per node: its share of the weights, its share of the KV cache for the
 * requested context length (exo ignores the KV cache; a placement that fits the weights but not
 * the cache fails at the first long prompt), and a fixed activation/runtime headroom.
 * Pipeline: layers split proportionally to free memory (floor, remainder to the largest
 * fractions, at least one layer per node) while every chosen node computes on its CPU. With a
 * GPU node among them (and every node's memory bandwidth known), layers go by speed instead: a
 * decode step reads each stage's weights once, so a stage's time is its layers over its
 * bandwidth, and the overlapped pipeline runs at its slowest stage. Each node starts with one
 * layer; each further layer goes to the node whose stage would then be fastest (fewest layers
 * per GB/s after taking it; ties to the earlier rank) among those whose memory holds one more
 * layer (weights + KV cache per layer, after the headroom). An H200 next to a CPU thus takes
 * all but one layer when the model fits its memory, and as many as fit when it does not. The
 * fastest node takes the last stage: it also reads the lm_head every token (a fifth of a 1B
 * model's weights) and samples. A GPU node's memory is its GPU's free memory; tensor
 * parallelism runs on the CPU everywhere, so there every node counts host memory. Tensor: every node holds 1/N of
 * every layer, which needs the attention heads and the KV heads to divide by N.
 *
 * Which nodes: those already holding the model's files first (no download before the instance
 * can start), then the most free memory. Tensor splits beyond heads and KV heads (FFN and expert
 * dims, quantization groups of column splits) are the model's own rules: the caller passes them
 * as tensor_check (model_config_tensor_split_check for a model on disk).
 *
 * Links: with measured latencies (link_ms), the nodes are chosen as a chain from the first one:
 * each next rank is the candidate holding the files if any does, then over a fast link from the
 * rank before it (fast: within twice the fastest measured link plus 0.5 ms; an unmeasured link
 * ranks between fast and slow), then by the order above. Pipeline stages then hand their hidden
 * states over fast links, and a tensor group avoids a slow member. When that choice does not fit
 * in memory, the memory-first choice is tried. Bandwidth is not weighed (decode-sized messages
 * are latency-bound; DESIGN.md section 6). */
#ifndef EXO_CLUSTER_PLACEMENT_H
#define EXO_CLUSTER_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#define PLACEMENT_MAX_NODES 64

typedef struct placement_model {
    char model_id[256];
    int n_layers;
    int n_heads;        /* 0 = unknown (then only n_kv_heads decides tensor splits) */
    int n_kv_heads;
    int head_dim;       /* 0 = unknown: 128 is assumed for the KV estimate */
    uint64_t weight_bytes;
    int context_length; /* tokens of KV cache to reserve for */
    /* The model's own tensor-parallel rules for n ranks (NULL = heads and KV heads only): 0, or
     * -1 with err saying which dimension does not divide. */
    int (*tensor_check)(const void *ctx, int n, char *err, size_t errlen);
    const void *tensor_check_ctx;
} placement_model;

typedef struct placement_node {
    char id[64];
    uint64_t memory_available; /* host memory (RAM) */
    int has_files; /* the model is on this node's disk already: preferred */
    /* The node computes on a GPU (its runners' --device): that GPU's free memory, 0 = a CPU
     * node. Used where the model runs on GPUs (pipeline). */
    uint64_t gpu_memory_available;
    /* Memory read bandwidth of what the node computes on (its GPU, else its CPU) in GB/s;
     * 0 = unknown. Weighed only where a GPU node takes part in a pipeline. */
    double bandwidth_gbs;
    /* Measured latency to the node at index i of the same array, in ms (0 = not measured). */
    float link_ms[PLACEMENT_MAX_NODES];
} placement_node;

typedef enum placement_sharding { PLACEMENT_PIPELINE = 0, PLACEMENT_TENSOR = 1 } placement_sharding;

typedef struct placement_result {
    int n_nodes;
    char node_ids[PLACEMENT_MAX_NODES][64];
    int layer_start[PLACEMENT_MAX_NODES]; /* pipeline: [start, end); tensor: 0..n_layers */
    int layer_end[PLACEMENT_MAX_NODES];
    uint64_t memory_by_node[PLACEMENT_MAX_NODES];
    char error[256]; /* set when placement fails */
} placement_result;

/* Activation buffers, runtime and allocator slack per node. */
#define PLACEMENT_HEADROOM_BYTES (256ull << 20)

/* KV cache bytes for the whole model at its context length (f16 K and V). */
uint64_t placement_kv_bytes(const placement_model *m);
const char *placement_sharding_name(placement_sharding s);

/* Places the model on exactly n_nodes of the given nodes (the ones with the most free memory).
 * Returns 0 and fills out, or -1 with out->error saying why (too few nodes, heads do not divide,
 * does not fit: how much is needed against how much is free). */
int placement_place(const placement_model *m, const placement_node *nodes, int n_available,
                    placement_sharding sharding, int n_nodes, placement_result *out);

#endif
