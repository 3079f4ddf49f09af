/* cpus — which CPUs this process may use, and which of them are the fast ones.
 *
 * Why: the number of online cores is the wrong default thread count twice over. A process limited
 * by `taskset`, a cgroup cpuset or a container (`docker --cpuset-cpus`) may run on fewer CPUs
 * than are online, and a pool with more threads than CPUs turns every barrier into a wait for a
 * descheduled thread. And on a CPU with cores of two speeds (Arm big.LITTLE / DynamIQ such as
 * RK3588 boards, Intel P- and E-cores) every data-parallel step waits for its slowest thread:
 * the little cores hold the big ones back, so a pool is faster on the big cores alone.
 *
 * Where the speeds come from (Linux sysfs): Arm's `devices/system/cpu/cpuN/cpu_capacity` (the
 * scheduler's relative core speed, 1024 = the fastest); a CPU counts as fast when its capacity
 * is more than half the largest among the usable ones. Intel hybrid parts list their P-cores in
 * `devices/cpu_core/cpus`. Anything missing or malformed means one speed: every usable CPU is
 * fast.
 *
 * Refuses: NUMA placement, SMT sibling choices, frequency governors. */
#ifndef EXO_BASE_CPUS_H
#define EXO_BASE_CPUS_H

#include <sched.h> /* cpu_set_t (the build defines _GNU_SOURCE) */

typedef struct cpus {
    int n_usable; /* CPUs this process may run on (>= 1) */
    int n_fast;   /* the fast ones among them (== n_usable when all run at one speed) */
    int mixed;    /* 1: some usable CPUs are slower cores */
    cpu_set_t fast;
} cpus;

/* This process: its affinity mask and /sys (EXO_SYSFS: another tree, for tests). */
void cpus_detect(cpus *out);
/* The same from a given sysfs root (e.g. "/sys") and set of usable CPUs (tests). */
void cpus_detect_in(const char *sysfs, const cpu_set_t *usable, cpus *out);
/* A kernel CPU list ("0-3,8,10-11\n") into *out; -1 (out empty) when malformed. */
int cpus_parse_list(const char *text, cpu_set_t *out);
/* The CPUs of a set as a kernel CPU list ("4-7"), into buf of size n. */
void cpus_format_list(const cpu_set_t *set, char *buf, int n);

#endif
