/* nodeinfo — prints what this node would publish about itself (memory, disk, system with GPUs,
 * network) as JSON: `nodeinfo [DIR]`. A quick check of node-info gathering on a new machine. */
#include "cluster/nodeinfo.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int gpu = nodeinfo_gpus(NULL, 0) > 0; /* as a node with --device auto (its CPU not measured) */
    json_t *all = json_pack("{s:o*, s:o*, s:o*, s:o*}", "memory", nodeinfo_memory_json(gpu), "disk",
                            nodeinfo_disk_json(argc > 1 ? argv[1] : "."), "system",
                            nodeinfo_system_json(gpu ? "cuda" : "cpu", 0), "network", nodeinfo_network_json());
    char *text = json_dumps(all, JSON_INDENT(2));
    puts(text ? text : "{}");
    free(text);
    json_decref(all);
    return 0;
}
