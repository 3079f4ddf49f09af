/* peers — other nodes that can serve a model's files (see peers.h). */
#include "worker/peers.h"

#include "cluster/cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *json_of(char *text) {
    json_t *v = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    free(text);
    return v;
}

int peers_node_holds(json_t *downloads, const char *node, const char *model_id) {
    size_t i;
    json_t *entry;
    json_array_foreach(json_object_get(downloads, node), i, entry) {
        json_t *done = json_object_get(entry, "DownloadCompleted");
        const char *mid = json_string_value(json_object_get(done, "modelId"));
        if (mid && !strcmp(mid, model_id) && !json_object_get(done, "endLayer")) return 1;
    }
    return 0;
}

int peers_find(const char *model_id, int default_api_port, char urls[][96], int max) {
    json_t *downloads = json_of(cluster_state_json("downloads"));
    json_t *identities = json_of(cluster_state_json("nodeIdentities"));
    json_t *status = json_of(cluster_status_json());
    int n = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(status, "peers"), i, p) {
        const char *id = json_string_value(json_object_get(p, "nodeId"));
        const char *addr = json_string_value(json_object_get(p, "address"));
        if (n >= max || !id || !addr || !strcmp(id, cluster_node_id()) ||
            !json_is_true(json_object_get(p, "alive")) ||
            !peers_node_holds(downloads, id, model_id))
            continue;
        json_int_t port =
            json_integer_value(json_object_get(json_object_get(identities, id), "apiPort"));
        if (port <= 0 || port > 65535) port = default_api_port;
        snprintf(urls[n++], sizeof urls[0], "http://%s:%d", addr, (int)port);
    }
    json_decref(downloads);
    json_decref(identities);
    json_decref(status);
    return n;
}
