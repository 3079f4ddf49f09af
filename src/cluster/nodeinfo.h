/* cluster/nodeinfo — what a node tells the cluster about itself: memory, disk, CPU, GPUs,
 * backends, network interfaces, identity. Each function returns a new JSON object in exo's
 * camelCase shape (the `info` of a NodeGatheredInfo event), or NULL when the source is
 * unreadable. GPUs come from NVML, loaded with dlopen at run time when the driver is present;
 * nothing here links against CUDA. It only reads; it never changes system settings. */
#ifndef EXO_CLUSTER_NODEINFO_H
#define EXO_CLUSTER_NODEINFO_H

#include <jansson.h>
#include <stdint.h>

typedef struct nodeinfo_memory {
    uint64_t total, available, swap_total, swap_free; /* bytes */
} nodeinfo_memory;

/* Parses /proc/meminfo text. Returns 0, or -1 when MemTotal or MemAvailable is missing. */
int nodeinfo_parse_meminfo(const char *text, nodeinfo_memory *out);

json_t *nodeinfo_memory_json(void); /* {ramTotal:{inBytes}, ramAvailable, swapTotal, swapAvailable} */
json_t *nodeinfo_disk_json(const char *path); /* {path, total:{inBytes}, available:{inBytes}} */
json_t *nodeinfo_system_json(void); /* {cpuModel, cpuCores, simd, gpus[], backends[], os, arch} */
json_t *nodeinfo_network_json(void); /* {interfaces:[{name, ipAddress, isLoopback}]} */
/* The IPv4 address other nodes reach a node at, from its interfaces list (as published in
 * nodeNetwork): the first non-loopback one, else loopback (every node on one host); NULL when
 * there is none. Borrowed from interfaces. */
const char *nodeinfo_reachable_ipv4(const json_t *interfaces);

/* "avx512", "avx2", "sse4.2", "neon" or "generic": the best CPU vector level usable here. */
const char *nodeinfo_simd_level(void);

#endif
