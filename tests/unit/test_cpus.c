/* cpus: the usable CPUs (affinity mask) and the fast ones on cores of two speeds, from a fake
 * sysfs tree: Arm capacities (RK3588-like 4 little + 4 big, uniform Pi 5, three tiers), Intel
 * hybrid P-core lists, a process limited to the little cores, and malformed files (ignored:
 * one speed). And the CPU backend's pool on such a machine: as many threads as fast cores,
 * pinned to them. */
#include "base/cpus.h"
#include "compute/cpu/cpu.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <pthread.h>
#include <unistd.h>

static char root[256];

static void put(const char *rel, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(path, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void fresh_root(void) {
    char cmd[300];
    if (root[0]) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        assert_int_equal(system(cmd), 0);
    }
    snprintf(root, sizeof root, "/tmp/exo-test-cpus-XXXXXX");
    assert_non_null(mkdtemp(root));
}

static void capacities(const int *cap, int n) {
    for (int c = 0; c < n; c++) {
        char rel[128], text[32];
        snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/cpu_capacity", c);
        snprintf(text, sizeof text, "%d\n", cap[c]);
        put(rel, text);
    }
}

static cpu_set_t range(int a, int b) {
    cpu_set_t s;
    CPU_ZERO(&s);
    for (int c = a; c <= b; c++) CPU_SET(c, &s);
    return s;
}

static void expect(const char *sysfs, cpu_set_t usable, int n_usable, int n_fast, int mixed,
                   const char *fast_list) {
    cpus m;
    cpus_detect_in(sysfs, &usable, &m);
    char list[128];
    cpus_format_list(&m.fast, list, sizeof list);
    assert_int_equal(m.n_usable, n_usable);
    assert_int_equal(m.n_fast, n_fast);
    assert_int_equal(m.mixed, mixed);
    assert_string_equal(list, fast_list);
}

static void test_parse_and_format_lists(void **s) {
    (void)s;
    cpu_set_t set;
    char out[128];
    assert_int_equal(cpus_parse_list("0-3,8,10-11\n", &set), 0);
    assert_int_equal(CPU_COUNT(&set), 7);
    cpus_format_list(&set, out, sizeof out);
    assert_string_equal(out, "0-3,8,10-11");
    assert_int_equal(cpus_parse_list("5", &set), 0);
    cpus_format_list(&set, out, sizeof out);
    assert_string_equal(out, "5");
    const char *bad[] = {"", "\n", "a", "3-", "-3", "5-2", "1,,2", "1 2", "0-99999999", "1-2x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(cpus_parse_list(bad[i], &set), -1);
        assert_int_equal(CPU_COUNT(&set), 0);
    }
}

static void test_no_information_means_one_speed(void **s) {
    (void)s;
    fresh_root();
    expect(root, range(0, 7), 8, 8, 0, "0-7");
    expect("/nonexistent-sysfs", range(2, 3), 2, 2, 0, "2-3");
}

static void test_arm_big_little(void **s) {
    (void)s;
    fresh_root();
    const int rk3588[8] = {414, 414, 414, 414, 1024, 1024, 1024, 1024};
    capacities(rk3588, 8);
    expect(root, range(0, 7), 8, 4, 1, "4-7");
    /* limited to the little cores (taskset 0-3): they are the fastest this process has */
    expect(root, range(0, 3), 4, 4, 0, "0-3");
    /* one big and two little usable */
    cpu_set_t some = range(2, 4);
    expect(root, some, 3, 1, 1, "4");
}

static void test_arm_uniform_and_three_tiers(void **s) {
    (void)s;
    fresh_root();
    const int pi5[4] = {1024, 1024, 1024, 1024};
    capacities(pi5, 4);
    expect(root, range(0, 3), 4, 4, 0, "0-3");
    fresh_root();
    /* prime + middle cores more than half the prime's speed count as fast, the small ones not */
    const int tiers[8] = {325, 325, 325, 870, 870, 870, 870, 1024};
    capacities(tiers, 8);
    expect(root, range(0, 7), 8, 5, 1, "3-7");
}

static void test_intel_hybrid(void **s) {
    (void)s;
    fresh_root();
    put("devices/cpu_core/cpus", "0-7\n");
    put("devices/cpu_atom/cpus", "8-15\n");
    expect(root, range(0, 15), 16, 8, 1, "0-7");
    expect(root, range(8, 15), 8, 8, 0, "8-15"); /* E-cores only: nothing faster usable */
    expect(root, range(6, 9), 4, 2, 1, "6-7");
}

static void test_malformed_files_are_ignored(void **s) {
    (void)s;
    fresh_root();
    const int caps[4] = {1024, 1024, 300, 300};
    capacities(caps, 4);
    put("devices/system/cpu/cpu3/cpu_capacity", "fast\n"); /* one unreadable: no capacities */
    expect(root, range(0, 3), 4, 4, 0, "0-3");
    put("devices/system/cpu/cpu3/cpu_capacity", "-5\n");
    expect(root, range(0, 3), 4, 4, 0, "0-3");
    put("devices/system/cpu/cpu3/cpu_capacity", "300\n");
    expect(root, range(0, 3), 4, 2, 1, "0-1");
    fresh_root();
    put("devices/cpu_core/cpus", "garbage\n");
    expect(root, range(0, 3), 4, 4, 0, "0-3");
    put("devices/cpu_core/cpus", "");
    expect(root, range(0, 3), 4, 4, 0, "0-3");
}

/* The real process: its affinity mask decides how many CPUs are usable. */
static void test_this_process_follows_its_affinity(void **s) {
    (void)s;
    cpu_set_t was;
    assert_int_equal(sched_getaffinity(0, sizeof was, &was), 0);
    cpus m;
    cpus_detect(&m);
    assert_int_equal(m.n_usable, CPU_COUNT(&was));
    int first = 0;
    while (!CPU_ISSET(first, &was)) first++;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    cpus_detect(&m);
    assert_int_equal(sched_setaffinity(0, sizeof was, &was), 0);
    assert_int_equal(m.n_usable, 1);
    assert_int_equal(m.n_fast, 1);
    assert_int_equal(m.mixed, 0);
}

/* The CPU backend on a (faked) machine whose first usable CPU is a little core: the default
 * thread count is the number of big ones and the pool's threads keep to them. Runs last: the
 * pool lives until exit. */
static void test_cpu_pool_keeps_to_the_fast_cores(void **s) {
    (void)s;
    cpu_set_t usable;
    assert_int_equal(sched_getaffinity(0, sizeof usable, &usable), 0);
    if (CPU_COUNT(&usable) < 2) skip(); /* one CPU: nothing to choose */
    fresh_root();
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &usable)) continue;
        char rel[128];
        snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/cpu_capacity", c);
        put(rel, first < 0 ? "400\n" : "1024\n");
        if (first < 0) first = c;
    }
    setenv("EXO_SYSFS", root, 1);
    assert_int_equal(cpu_threads(), CPU_COUNT(&usable) - 1);
    assert_non_null(cpu_thread_pool());
    unsetenv("EXO_SYSFS");
    cpu_set_t now;
    assert_int_equal(pthread_getaffinity_np(pthread_self(), sizeof now, &now), 0);
    assert_int_equal(CPU_COUNT(&now), CPU_COUNT(&usable) - 1);
    assert_false(CPU_ISSET(first, &now));
    assert_int_equal(sched_setaffinity(0, sizeof usable, &usable), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_and_format_lists),
        cmocka_unit_test(test_no_information_means_one_speed),
        cmocka_unit_test(test_arm_big_little),
        cmocka_unit_test(test_arm_uniform_and_three_tiers),
        cmocka_unit_test(test_intel_hybrid),
        cmocka_unit_test(test_malformed_files_are_ignored),
        cmocka_unit_test(test_this_process_follows_its_affinity),
        cmocka_unit_test(test_cpu_pool_keeps_to_the_fast_cores),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (root[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd)) failed++;
    }
    return failed;
}
