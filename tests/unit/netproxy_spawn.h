/* netproxy_spawn.h — starts build/tools/netproxy (or $EXO_BUILD/tools/netproxy) as a child for the
 * tests that put it in a data path (test_dist, test_netproxy). Header-only, like tiny_model.h. */
#ifndef EXO_TEST_NETPROXY_SPAWN_H
#define EXO_TEST_NETPROXY_SPAWN_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

/* Forwards `count` ports from listen_host:listen_port+i to target_host:target_port+i with the
 * given one-way delay and rate (busy_poll: netproxy --busy-poll). Returns the child's pid (the
 * caller waits for it to listen). */
static pid_t netproxy_spawn(const char *listen_host, int listen_port, const char *target_host,
                            int target_port, int count, const char *delay_ms,
                            const char *rate_gbit, int busy_poll) {
    const char *build = getenv("EXO_BUILD");
    char bin[512], l[64], t[64], n[16];
    snprintf(bin, sizeof bin, "%s/tools/netproxy", build && *build ? build : "build");
    snprintf(l, sizeof l, "%s:%d", listen_host, listen_port);
    snprintf(t, sizeof t, "%s:%d", target_host, target_port);
    snprintf(n, sizeof n, "%d", count);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a failed test must not leave it running */
        execl(bin, bin, "--listen", l, "--target", t, "--count", n, "--delay-ms", delay_ms,
              "--rate-gbit", rate_gbit, busy_poll ? "--busy-poll" : (char *)NULL, (char *)NULL);
        _exit(127);
    }
    return pid;
}

#endif
