#include "cluster/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *placement_sharding_name(placement_sharding s) {
    return s == PLACEMENT_TENSOR ? "Tensor" : "Pipeline";
}

uint64_t placement_kv_bytes(const placement_model *m) {
    uint64_t head_dim = m->head_dim > 0 ? (uint64_t)m->head_dim : 128;
    uint64_t kv_heads = m->n_kv_heads > 0 ? (uint64_t)m->n_kv_heads : 1;
    uint64_t ctx = m->context_length > 0 ? (uint64_t)m->context_length : 0;
    return 2ull * (uint64_t)m->n_layers * kv_heads * head_dim * 2ull * ctx;
}

/* Files first, then the most free memory, then the id (a total order: every node agrees). */
static int node_before(const placement_node *x, const placement_node *y) {
    if (x->has_files != y->has_files) return x->has_files;
    if (x->memory_available != y->memory_available)
        return x->memory_available > y->memory_available;
    return strcmp(x->id, y->id) < 0;
}

/* Indices of nodes in preference order (insertion sort: at most PLACEMENT_MAX_NODES). */
static void order_nodes(const placement_node *nodes, int n, int *order) {
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && node_before(&nodes[i], &nodes[order[j - 1]])) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
}

/* The latency between nodes a and b (either direction measured; the smaller), 0 = unknown. */
static float link_between(const placement_node *nodes, int a, int b) {
    float x = nodes[a].link_ms[b], y = nodes[b].link_ms[a];
    if (x > 0 && y > 0) return x < y ? x : y;
    return x > 0 ? x : y > 0 ? y : 0;
}

enum { LINK_FAST, LINK_UNKNOWN, LINK_SLOW };

static int link_class(const placement_node *nodes, int a, int b, float fastest) {
    float ms = link_between(nodes, a, b);
    if (ms <= 0) return LINK_UNKNOWN;
    return ms <= 2 * fastest + 0.5f ? LINK_FAST : LINK_SLOW;
}

/* The chain of placement.h: from the first node in order, each next node holds the files if one
 * can, then has a fast link to the previous one, then comes first in order. Returns 0 when no
 * link is measured (the chain would be the order itself). */
static int choose_by_links(const placement_node *nodes, int n_available, const int *order,
                           int n_nodes, int *chosen) {
    float fastest = 0;
    for (int a = 0; a < n_available; a++)
        for (int b = 0; b < n_available; b++) {
            float ms = a == b ? 0 : link_between(nodes, a, b);
            if (ms > 0 && (fastest == 0 || ms < fastest)) fastest = ms;
        }
    if (fastest == 0) return 0;
    int used[PLACEMENT_MAX_NODES] = {0};
    chosen[0] = order[0];
    used[order[0]] = 1;
    for (int k = 1; k < n_nodes; k++) {
        int best = -1, best_key = 0;
        for (int i = 0; i < n_available; i++) {
            int c = order[i];
            if (used[c]) continue;
            int key = (nodes[c].has_files ? 0 : 3) + link_class(nodes, chosen[k - 1], c, fastest);
            if (best < 0 || key < best_key) best = c, best_key = key;
        }
        chosen[k] = best;
        used[best] = 1;
    }
    return 1;
}

static void fmt_gb(char *out, size_t n, uint64_t bytes) {
    snprintf(out, n, "%.2f GB", (double)bytes / 1e9);
}

/* The speed rule of placement.h: one layer each, then each next layer to the node whose stage
 * would be fastest with it, among those whose memory holds it; when none does, among all (the
 * fit check then says which node is short). */
static void split_by_speed(const placement_model *m, const placement_node *nodes,
                           const int *chosen, int n, int *layers) {
    double per_layer = (double)(m->weight_bytes + placement_kv_bytes(m)) / m->n_layers;
    int cap[PLACEMENT_MAX_NODES];
    for (int i = 0; i < n; i++) {
        uint64_t mem = nodes[chosen[i]].memory_available;
        double room = mem > PLACEMENT_HEADROOM_BYTES ? (double)(mem - PLACEMENT_HEADROOM_BYTES) : 0;
        cap[i] = per_layer > 0 ? (int)(room / per_layer < m->n_layers ? room / per_layer
                                                                       : m->n_layers)
                               : m->n_layers;
        layers[i] = 1;
    }
    for (int assigned = n; assigned < m->n_layers; assigned++) {
        int best = -1;
        double best_time = 0;
        for (int pass = 0; pass < 2 && best < 0; pass++)
            for (int i = 0; i < n; i++) {
                if (pass == 0 && layers[i] >= cap[i]) continue;
                double t = (layers[i] + 1) / nodes[chosen[i]].bandwidth_gbs;
                if (best < 0 || t < best_time) best = i, best_time = t;
            }
        layers[best]++;
    }
}

/* Whether the speed rule applies: a GPU node among the chosen, every bandwidth known. */
static int weigh_speed(const placement_node *nodes, const int *chosen, int n) {
    int gpu = 0;
    for (int i = 0; i < n; i++) {
        if (nodes[chosen[i]].bandwidth_gbs <= 0) return 0;
        gpu |= nodes[chosen[i]].gpu_memory_available > 0;
    }
    return gpu;
}

/* Splits n_layers over the chosen nodes: by speed with a GPU node among them, else
 * proportionally to their free memory. */
static void split_layers(const placement_model *m, const placement_node *nodes, const int *chosen,
                         int n, placement_result *out) {
    int layers[PLACEMENT_MAX_NODES];
    if (weigh_speed(nodes, chosen, n)) {
        split_by_speed(m, nodes, chosen, n, layers);
    } else {
        uint64_t total = 0;
        for (int i = 0; i < n; i++)
            total += nodes[chosen[i]].memory_available;
        double frac[PLACEMENT_MAX_NODES];
        int assigned = 0;
        for (int i = 0; i < n; i++) {
            double share = total ? (double)m->n_layers *
                                       (double)nodes[chosen[i]].memory_available / (double)total
                                 : (double)m->n_layers / n;
            layers[i] = (int)share;
            if (layers[i] < 1) layers[i] = 1;
            frac[i] = share - (int)share;
            assigned += layers[i];
        }
        while (assigned < m->n_layers) { /* remainder to the largest fractions */
            int best = 0;
            for (int i = 1; i < n; i++)
                if (frac[i] > frac[best]) best = i;
            layers[best]++;
            frac[best] = -1;
            assigned++;
        }
        while (assigned > m->n_layers) { /* minimum-one rule overshot: take from the largest */
            int best = 0;
            for (int i = 1; i < n; i++)
                if (layers[i] > layers[best]) best = i;
            layers[best]--;
            assigned--;
        }
    }
    int start = 0;
    for (int i = 0; i < n; i++) {
        out->layer_start[i] = start;
        out->layer_end[i] = start + layers[i];
        start += layers[i];
    }
}

/* The split over nodes[chosen[0..n_nodes)] in rank order and whether it fits each node's free
 * memory (out->error says which does not). */
static int place_on(const placement_model *m, const placement_node *nodes, const int *chosen_in,
                    placement_sharding sharding, int n_nodes, placement_result *out) {
    memset(out, 0, sizeof *out);
    uint64_t kv = placement_kv_bytes(m);
    out->n_nodes = n_nodes;
    int chosen[PLACEMENT_MAX_NODES];
    memcpy(chosen, chosen_in, (size_t)n_nodes * sizeof *chosen);
    if (sharding == PLACEMENT_PIPELINE && weigh_speed(nodes, chosen, n_nodes)) {
        /* the fastest node takes the last stage: it also reads the lm_head every token (a
         * fifth of a 1B model's weights) and samples */
        int fastest = 0;
        for (int i = 1; i < n_nodes; i++)
            if (nodes[chosen[i]].bandwidth_gbs > nodes[chosen[fastest]].bandwidth_gbs) fastest = i;
        int node = chosen[fastest];
        memmove(chosen + fastest, chosen + fastest + 1,
                (size_t)(n_nodes - 1 - fastest) * sizeof *chosen);
        chosen[n_nodes - 1] = node;
    }
    if (sharding == PLACEMENT_PIPELINE) {
        split_layers(m, nodes, chosen, n_nodes, out);
    } else {
        for (int i = 0; i < n_nodes; i++) {
            out->layer_start[i] = 0;
            out->layer_end[i] = m->n_layers;
        }
    }
    int ok = 1;
    for (int i = 0; i < n_nodes; i++) {
        const placement_node *node = &nodes[chosen[i]];
        snprintf(out->node_ids[i], sizeof out->node_ids[i], "%s", node->id);
        double share = sharding == PLACEMENT_PIPELINE
                           ? (double)(out->layer_end[i] - out->layer_start[i]) / m->n_layers
                           : 1.0 / n_nodes;
        uint64_t need =
            (uint64_t)((double)(m->weight_bytes + kv) * share) + PLACEMENT_HEADROOM_BYTES;
        out->memory_by_node[i] = need;
        if (need > node->memory_available && ok) {
            char a[32], b[32];
            fmt_gb(a, sizeof a, need);
            fmt_gb(b, sizeof b, node->memory_available);
            snprintf(out->error, sizeof out->error,
                     "does not fit: node %.8s needs %s (weights + KV cache for %d tokens), has %s "
                     "free%s",
                     node->id, a, m->context_length, b,
                     node->gpu_memory_available ? " on its GPU" : "");
            ok = 0;
        }
    }
    return ok ? 0 : -1;
}

int placement_place(const placement_model *m, const placement_node *nodes, int n_available,
                    placement_sharding sharding, int n_nodes, placement_result *out) {
    memset(out, 0, sizeof *out);
    if (m->n_layers <= 0) {
        snprintf(out->error, sizeof out->error, "model %.200s: number of layers unknown", m->model_id);
        return -1;
    }
    if (n_nodes < 1 || n_nodes > PLACEMENT_MAX_NODES || n_nodes > n_available) {
        snprintf(out->error, sizeof out->error, "needs %d node%s, the cluster has %d", n_nodes,
                 n_nodes == 1 ? "" : "s", n_available);
        return -1;
    }
    if (sharding == PLACEMENT_PIPELINE && n_nodes > m->n_layers) {
        snprintf(out->error, sizeof out->error, "%d layers cannot be split over %d nodes",
                 m->n_layers, n_nodes);
        return -1;
    }
    if (sharding == PLACEMENT_TENSOR && n_nodes > 1) {
        if (m->n_kv_heads <= 0 || m->n_kv_heads % n_nodes ||
            (m->n_heads > 0 && m->n_heads % n_nodes)) {
            snprintf(out->error, sizeof out->error,
                     "tensor parallel over %d nodes needs the %d KV heads (and the attention "
                     "heads) to divide by %d",
                     n_nodes, m->n_kv_heads, n_nodes);
            return -1;
        }
        char why[200];
        if (m->tensor_check && m->tensor_check(m->tensor_check_ctx, n_nodes, why, sizeof why)) {
            snprintf(out->error, sizeof out->error, "tensor parallel over %d nodes: %s", n_nodes, why);
            return -1;
        }
    }
    int order[PLACEMENT_MAX_NODES], chosen[PLACEMENT_MAX_NODES];
    if (n_available > PLACEMENT_MAX_NODES) n_available = PLACEMENT_MAX_NODES;
    /* Where the model runs on GPUs, a GPU node's memory is its GPU's; elsewhere every node
     * computes on its CPU (gpu_memory_available cleared: no GPU node). */
    placement_node eff[PLACEMENT_MAX_NODES];
    int on_gpus = sharding == PLACEMENT_PIPELINE;
    for (int i = 0; i < n_available; i++) {
        eff[i] = nodes[i];
        if (on_gpus && nodes[i].gpu_memory_available)
            eff[i].memory_available = nodes[i].gpu_memory_available;
        else
            eff[i].gpu_memory_available = 0;
    }
    nodes = eff;
    order_nodes(nodes, n_available, order);
    if (choose_by_links(nodes, n_available, order, n_nodes, chosen) &&
        place_on(m, nodes, chosen, sharding, n_nodes, out) == 0)
        return 0;
    return place_on(m, nodes, order, sharding, n_nodes, out);
}
