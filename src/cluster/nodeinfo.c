/* cluster/nodeinfo — gathering node facts from /proc, statvfs, getifaddrs and NVML. */
#include "cluster/nodeinfo.h"

#include "base/cpus.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

/* /proc files report size 0, so read them to the end (at most max bytes). */
static char *read_proc(const char *path, size_t max) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max, f) : 0;
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    return buf;
}

static json_t *bytes_json(uint64_t n) {
    return json_pack("{s:I}", "inBytes", (json_int_t)n);
}

int nodeinfo_parse_meminfo(const char *text, nodeinfo_memory *out) {
    memset(out, 0, sizeof *out);
    int have_total = 0, have_avail = 0;
    for (const char *line = text; line && *line;) {
        char key[64];
        unsigned long long kb;
        if (sscanf(line, "%63[^:]: %llu", key, &kb) == 2 && kb < (1ull << 50)) {
            uint64_t b = (uint64_t)kb * 1024;
            if (!strcmp(key, "MemTotal")) out->total = b, have_total = 1;
            else if (!strcmp(key, "MemAvailable")) out->available = b, have_avail = 1;
            else if (!strcmp(key, "SwapTotal")) out->swap_total = b;
            else if (!strcmp(key, "SwapFree")) out->swap_free = b;
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    return have_total && have_avail ? 0 : -1;
}

json_t *nodeinfo_memory_json(int gpu) {
    char *text = read_proc("/proc/meminfo", 64 << 10);
    if (!text) return NULL;
    nodeinfo_memory m;
    int rc = nodeinfo_parse_meminfo(text, &m);
    free(text);
    if (rc) return NULL;
    /* EXO_NODE_MEMORY_BYTES: report this much memory (at most the real amount; host and GPU
     * alike): a small machine for placement tests, or memory kept back for other programs. */
    const char *cap = getenv("EXO_NODE_MEMORY_BYTES");
    uint64_t limit = cap && *cap ? strtoull(cap, NULL, 10) : 0;
    if (limit && limit < m.total) m.total = limit;
    if (limit && limit < m.available) m.available = limit;
    json_t *out = json_pack("{s:o, s:o, s:o, s:o}", "ramTotal", bytes_json(m.total),
                            "ramAvailable", bytes_json(m.available), "swapTotal",
                            bytes_json(m.swap_total), "swapAvailable", bytes_json(m.swap_free));
    nodeinfo_gpu g;
    if (gpu && nodeinfo_gpus(&g, 1) > 0) {
        if (limit && limit < g.memory_total) g.memory_total = limit;
        if (limit && limit < g.memory_free) g.memory_free = limit;
        json_object_set_new(out, "gpuTotal", bytes_json(g.memory_total));
        json_object_set_new(out, "gpuAvailable", bytes_json(g.memory_free));
    }
    return out;
}

json_t *nodeinfo_disk_json(const char *path) {
    struct statvfs s;
    if (statvfs(path, &s)) return NULL;
    return json_pack("{s:s, s:o, s:o}", "path", path, "total",
                     bytes_json((uint64_t)s.f_blocks * s.f_frsize), "available",
                     bytes_json((uint64_t)s.f_bavail * s.f_frsize));
}

const char *nodeinfo_simd_level(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return "avx512";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
    if (__builtin_cpu_supports("sse4.2")) return "sse4.2";
    return "generic";
#elif defined(__aarch64__)
    return "neon";
#else
    return "generic";
#endif
}

static void cpu_model(char *out, size_t n) {
    snprintf(out, n, "unknown");
    char *text = read_proc("/proc/cpuinfo", 64 << 10);
    if (!text) return;
    const char *keys[] = {"model name", "Model", "Hardware"};
    for (size_t k = 0; k < 3; k++) {
        char *p = strstr(text, keys[k]);
        if (!p || (p != text && p[-1] != '\n')) continue;
        char *colon = strchr(p, ':'), *end = strchr(p, '\n');
        if (!colon || (end && colon > end)) continue;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        size_t m = end ? (size_t)(end - colon) : strlen(colon);
        snprintf(out, n, "%.*s", (int)m, colon);
        break;
    }
    free(text);
}

/* NVML, the NVIDIA driver's management library, with only the calls used here. */
typedef struct {
    unsigned long long total, free, used;
} nvml_memory;

enum { NVML_CLOCK_MEM = 2 };

int nodeinfo_gpus(nodeinfo_gpu *out, int max) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!lib) return 0;
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*shutdown)(void) = (int (*)(void))dlsym(lib, "nvmlShutdown");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(lib, "nvmlDeviceGetCount_v2");
    int (*handle)(unsigned, void **) =
        (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*name)(void *, char *, unsigned) =
        (int (*)(void *, char *, unsigned))dlsym(lib, "nvmlDeviceGetName");
    int (*memory)(void *, nvml_memory *) =
        (int (*)(void *, nvml_memory *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    /* optional: the memory bus, for the bandwidth placement weighs a GPU stage by */
    int (*bus_width)(void *, unsigned *) =
        (int (*)(void *, unsigned *))dlsym(lib, "nvmlDeviceGetMemoryBusWidth");
    int (*max_clock)(void *, int, unsigned *) =
        (int (*)(void *, int, unsigned *))dlsym(lib, "nvmlDeviceGetMaxClockInfo");
    unsigned n = 0;
    int listed = 0;
    if (init && shutdown && count && handle && name && memory && init() == 0) {
        if (count(&n) == 0) {
            for (unsigned i = 0; i < n && i < 64; i++) {
                void *dev;
                nodeinfo_gpu g;
                memset(&g, 0, sizeof g);
                if (handle(i, &dev) || name(dev, g.name, sizeof g.name)) continue;
                g.name[sizeof g.name - 1] = 0;
                g.index = (int)i;
                nvml_memory mem = {0, 0, 0};
                memory(dev, &mem);
                g.memory_total = mem.total;
                g.memory_free = mem.free;
                unsigned bits = 0, mhz = 0;
                /* DDR: two transfers per memory clock (H100 SXM: 5120 bits x 2619 MHz ->
                 * 3.35 TB/s, its data sheet's figure) */
                if (bus_width && max_clock && bus_width(dev, &bits) == 0 &&
                    max_clock(dev, NVML_CLOCK_MEM, &mhz) == 0)
                    g.bandwidth_gbs = (double)bits / 8.0 * (double)mhz * 1e6 * 2.0 / 1e9;
                if (out && listed < max) out[listed] = g;
                listed++;
            }
        }
        shutdown();
    }
    dlclose(lib);
    return listed;
}

static json_t *gpus_json(void) {
    json_t *gpus = json_array();
    nodeinfo_gpu g[16];
    int n = nodeinfo_gpus(g, 16);
    for (int i = 0; i < n && i < 16; i++) {
        json_t *o = json_pack("{s:i, s:s, s:o}", "index", g[i].index, "name", g[i].name,
                              "memoryTotal", bytes_json(g[i].memory_total));
        if (g[i].bandwidth_gbs > 0)
            json_object_set_new(o, "memoryBandwidthGBs", json_real(round(g[i].bandwidth_gbs)));
        json_array_append_new(gpus, o);
    }
    return gpus;
}

json_t *nodeinfo_system_json(const char *device, double cpu_bandwidth_gbs) {
    char model[256];
    cpu_model(model, sizeof model);
    struct utsname u;
    if (uname(&u)) memset(&u, 0, sizeof u);
    json_t *gpus = gpus_json();
    json_t *backends = json_array();
    json_array_append_new(backends, json_string("cpu"));
#ifdef EXO_CUDA
    if (json_array_size(gpus) > 0) json_array_append_new(backends, json_string("cuda"));
#endif
    cpus usable; /* the CPUs this node may compute on (taskset, cgroup cpusets) */
    cpus_detect(&usable);
    long cores = usable.n_usable;
    char os[200];
    snprintf(os, sizeof os, "%s %s", u.sysname, u.release);
    json_t *out = json_pack("{s:s, s:i, s:s, s:o, s:o, s:s, s:s}", "cpuModel", model, "cpuCores",
                            (int)(cores > 0 ? cores : 1), "simd", nodeinfo_simd_level(), "gpus",
                            gpus, "backends", backends, "os", os, "arch", u.machine);
    if (device && device[0]) {
        /* what the runners compute on, and that device's memory bandwidth (placement) */
        int gpu = !strcmp(device, "cuda");
        json_object_set_new(out, "device", json_string(gpu ? "cuda" : "cpu"));
        double gbs = cpu_bandwidth_gbs;
        if (gpu)
            gbs = json_number_value(
                json_object_get(json_array_get(gpus, 0), "memoryBandwidthGBs"));
        if (gbs > 0) json_object_set_new(out, "memoryBandwidthGBs", json_real(round(gbs * 10) / 10));
    }
    return out;
}

const char *nodeinfo_reachable_ipv4(const json_t *interfaces) {
    const char *addr = NULL, *loopback = NULL;
    size_t i;
    json_t *itf;
    json_array_foreach(interfaces, i, itf) {
        const char *ip = json_string_value(json_object_get(itf, "ipAddress"));
        if (!ip || strchr(ip, ':')) continue; /* IPv4 only, as the beacons */
        if (json_is_true(json_object_get(itf, "isLoopback"))) {
            if (!loopback) loopback = ip;
        } else if (!addr) {
            addr = ip;
        }
    }
    return addr ? addr : loopback;
}

json_t *nodeinfo_network_json(void) {
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs)) return NULL;
    json_t *list = json_array();
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
        int fam = i->ifa_addr->sa_family;
        if (fam != AF_INET && fam != AF_INET6) continue;
        char addr[INET6_ADDRSTRLEN] = "";
        const void *src = fam == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
                                         : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
        if (!inet_ntop(fam, src, addr, sizeof addr)) continue;
        json_array_append_new(list, json_pack("{s:s, s:s, s:b}", "name", i->ifa_name, "ipAddress",
                                              addr, "isLoopback",
                                              (i->ifa_flags & IFF_LOOPBACK) != 0));
    }
    freeifaddrs(ifs);
    /* RDMA devices (what Gloo's ibverbs transport opens): placement maps MlxJaccl/MlxIbv to
     * ibverbs only when every node of the instance lists one. */
    json_t *rdma = json_array();
    DIR *d = opendir("/sys/class/infiniband");
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') json_array_append_new(rdma, json_string(e->d_name));
    if (d) closedir(d);
    return json_pack("{s:o,s:o}", "interfaces", list, "rdmaDevices", rdma);
}
