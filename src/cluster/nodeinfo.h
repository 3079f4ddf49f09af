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

/* {ramTotal:{inBytes}, ramAvailable, swapTotal, swapAvailable}; with gpu (a node whose runners
 * compute on GPU 0) also gpuTotal and gpuAvailable, GPU 0's memory (placement's limit there). */
json_t *nodeinfo_memory_json(int gpu);
json_t *nodeinfo_disk_json(const char *path); /* {path, total:{inBytes}, available:{inBytes}} */
/* {cpuModel, cpuCores, simd, gpus[{index, name, memoryTotal, memoryBandwidthGBs}], backends[],
 * os, arch}; with device ("cpu" or "cuda": what this node's runners compute on) also device and
 * memoryBandwidthGBs, that device's read bandwidth: GPU 0's from NVML (bus width x memory
 * clock), else cpu_bandwidth_gbs when > 0 (measured by the node). */
json_t *nodeinfo_system_json(const char *device, double cpu_bandwidth_gbs);

typedef struct nodeinfo_gpu {
    int index;
    char name[96];
    uint64_t memory_total, memory_free; /* bytes */
    double bandwidth_gbs;               /* bus width x max memory clock x 2; 0 = not reported */
} nodeinfo_gpu;
/* The GPUs NVML lists (loaded with dlopen; 0 without the driver), the first max into out
 * (NULL: count only). */
int nodeinfo_gpus(nodeinfo_gpu *out, int max);
json_t *nodeinfo_network_json(void); /* {interfaces:[{name, ipAddress, isLoopback}]} */
/* The IPv4 address other nodes reach a node at, from its interfaces list (as published in
 * nodeNetwork): the first non-loopback one, else loopback (every node on one host); NULL when
 * there is none. Borrowed from interfaces. */
const char *nodeinfo_reachable_ipv4(const json_t *interfaces);

/* "avx512", "avx2", "sse4.2", "neon" or "generic": the best CPU vector level usable here. */
const char *nodeinfo_simd_level(void);

#endif
