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

static int by_memory_desc(const void *a, const void *b) {
    const placement_node *x = a, *y = b;
    if (x->has_files != y->has_files) return x->has_files ? -1 : 1;
    if (x->memory_available != y->memory_available)
        return x->memory_available > y->memory_available ? -1 : 1;
    return strcmp(x->id, y->id);
}

static void fmt_gb(char *out, size_t n, uint64_t bytes) {
    snprintf(out, n, "%.2f GB", (double)bytes / 1e9);
}

/* Splits n_layers over the chosen nodes proportionally to their free memory. */
static void split_layers(const placement_model *m, const placement_node *chosen, int n,
                         placement_result *out) {
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += chosen[i].memory_available;
    int layers[PLACEMENT_MAX_NODES];
    double frac[PLACEMENT_MAX_NODES];
    int assigned = 0;
    for (int i = 0; i < n; i++) {
        double share = total ? (double)m->n_layers * (double)chosen[i].memory_available / (double)total
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
    int start = 0;
    for (int i = 0; i < n; i++) {
        out->layer_start[i] = start;
        out->layer_end[i] = start + layers[i];
        start += layers[i];
    }
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
    placement_node *sorted = malloc(sizeof *sorted * (size_t)n_available);
    if (!sorted) {
        snprintf(out->error, sizeof out->error, "out of memory");
        return -1;
    }
    memcpy(sorted, nodes, sizeof *sorted * (size_t)n_available);
    qsort(sorted, (size_t)n_available, sizeof *sorted, by_memory_desc);

    uint64_t kv = placement_kv_bytes(m);
    out->n_nodes = n_nodes;
    if (sharding == PLACEMENT_PIPELINE) {
        split_layers(m, sorted, n_nodes, out);
    } else {
        for (int i = 0; i < n_nodes; i++) {
            out->layer_start[i] = 0;
            out->layer_end[i] = m->n_layers;
        }
    }
    int ok = 1;
    for (int i = 0; i < n_nodes; i++) {
        snprintf(out->node_ids[i], sizeof out->node_ids[i], "%s", sorted[i].id);
        double share = sharding == PLACEMENT_PIPELINE
                           ? (double)(out->layer_end[i] - out->layer_start[i]) / m->n_layers
                           : 1.0 / n_nodes;
        uint64_t need = (uint64_t)((double)(m->weight_bytes + kv) * share) + PLACEMENT_HEADROOM_BYTES;
        out->memory_by_node[i] = need;
        if (need > sorted[i].memory_available && ok) {
            char a[32], b[32];
            fmt_gb(a, sizeof a, need);
            fmt_gb(b, sizeof b, sorted[i].memory_available);
            snprintf(out->error, sizeof out->error,
                     "does not fit: node %.8s needs %s (weights + KV cache for %d tokens), has %s "
                     "free",
                     sorted[i].id, a, m->context_length, b);
            ok = 0;
        }
    }
    free(sorted);
    return ok ? 0 : -1;
}
