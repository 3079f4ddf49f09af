/* cpus — usable and fast CPUs (see cpus.h). */
#include "base/cpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The first line of a small sysfs file (NULL when absent or empty). */
static char *read_line(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *line = fgets(buf, (int)n, f);
    fclose(f);
    return line && line[0] && line[0] != '\n' ? line : NULL;
}

int cpus_parse_list(const char *text, cpu_set_t *out) {
    CPU_ZERO(out);
    const char *p = text;
    while (*p && *p != '\n') {
        char *end;
        if (*p < '0' || *p > '9') goto bad;
        long a = strtol(p, &end, 10), b = a;
        p = end;
        if (*p == '-') {
            if (p[1] < '0' || p[1] > '9') goto bad;
            b = strtol(p + 1, &end, 10);
            p = end;
        }
        if (a < 0 || b < a || b >= CPU_SETSIZE) goto bad;
        for (long c = a; c <= b; c++) CPU_SET((int)c, out);
        if (*p == ',') p++;
        else if (*p && *p != '\n') goto bad;
    }
    if (CPU_COUNT(out) > 0) return 0;
bad:
    CPU_ZERO(out);
    return -1;
}

void cpus_format_list(const cpu_set_t *set, char *buf, int n) {
    int len = 0;
    buf[0] = 0;
    for (int c = 0; c < CPU_SETSIZE && len < n; c++) {
        if (!CPU_ISSET(c, set)) continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set)) e++;
        len += e > c ? snprintf(buf + len, (size_t)(n - len), "%s%d-%d", len ? "," : "", c, e)
                     : snprintf(buf + len, (size_t)(n - len), "%s%d", len ? "," : "", c);
        c = e;
    }
}

/* Arm: fast = capacity more than half the largest among the usable CPUs; 0 when any usable CPU
 * has no readable capacity. */
static int fast_by_capacity(const char *sysfs, const cpu_set_t *usable, cpu_set_t *fast) {
    static long cap[CPU_SETSIZE];
    long max = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, usable)) continue;
        char path[512], buf[64], *end;
        snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d/cpu_capacity", sysfs, c);
        if (!read_line(path, buf, sizeof buf)) return 0;
        cap[c] = strtol(buf, &end, 10);
        if (end == buf || (*end && *end != '\n') || cap[c] <= 0 || cap[c] > 1 << 20) return 0;
        if (cap[c] > max) max = cap[c];
    }
    CPU_ZERO(fast);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, usable) && 2 * cap[c] > max) CPU_SET(c, fast);
    return 1;
}

/* Intel hybrid: the P-cores the kernel lists for the cpu_core PMU; 0 without such a list or
 * when no usable CPU is on it. */
static int fast_by_core_type(const char *sysfs, const cpu_set_t *usable, cpu_set_t *fast) {
    char path[512], buf[1024];
    cpu_set_t p_cores;
    snprintf(path, sizeof path, "%s/devices/cpu_core/cpus", sysfs);
    if (!read_line(path, buf, sizeof buf) || cpus_parse_list(buf, &p_cores)) return 0;
    CPU_AND(fast, &p_cores, usable);
    return CPU_COUNT(fast) > 0;
}

void cpus_detect_in(const char *sysfs, const cpu_set_t *usable, cpus *out) {
    memset(out, 0, sizeof *out);
    cpu_set_t all;
    if (CPU_COUNT(usable) > 0) {
        all = *usable;
    } else { /* nothing known: CPU 0 */
        CPU_ZERO(&all);
        CPU_SET(0, &all);
    }
    out->n_usable = CPU_COUNT(&all);
    if (!fast_by_capacity(sysfs, &all, &out->fast) && !fast_by_core_type(sysfs, &all, &out->fast))
        out->fast = all;
    out->n_fast = CPU_COUNT(&out->fast);
    out->mixed = out->n_fast < out->n_usable;
}

void cpus_detect(cpus *out) {
    cpu_set_t usable;
    CPU_ZERO(&usable);
    if (sched_getaffinity(0, sizeof usable, &usable) != 0) { /* every online CPU */
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        for (long c = 0; c < n && c < CPU_SETSIZE; c++) CPU_SET((int)c, &usable);
    }
    const char *sysfs = getenv("EXO_SYSFS"); /* tests: a fake tree */
    cpus_detect_in(sysfs && sysfs[0] ? sysfs : "/sys", &usable, out);
}
