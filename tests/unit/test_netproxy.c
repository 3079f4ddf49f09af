/* tools/netproxy: bytes pushed through it arrive intact and in order, in both directions at
 * once, with a delay and a rate limit imposed and without; with --count N, port i of the proxy
 * reaches port i of the target; a closed side is passed on as end of stream. (No timing is
 * asserted: the proxy's timing is what bench/ measures.) Runs $EXO_BUILD/tools/netproxy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "netproxy_spawn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A server on 127.0.0.1:port that answers every byte b with b ^ tag, until end of stream. */
typedef struct echo_server {
    int listen_fd;
    unsigned char tag;
    pthread_t thread;
} echo_server;

static void *echo_main(void *p) {
    echo_server *s = p;
    int c = accept(s->listen_fd, NULL, NULL);
    if (c < 0) return NULL;
    unsigned char buf[65536];
    for (;;) {
        ssize_t r = recv(c, buf, sizeof buf, 0);
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++)
            buf[i] ^= s->tag;
        for (ssize_t off = 0; off < r;) {
            ssize_t w = send(c, buf + off, (size_t)(r - off), MSG_NOSIGNAL);
            if (w <= 0) goto done;
            off += w;
        }
    }
done:
    close(c);
    return NULL;
}

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    return a;
}

static void echo_start(echo_server *s, int port, unsigned char tag) {
    s->tag = tag;
    s->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = loopback(port);
    assert_int_equal(bind(s->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s->listen_fd, 4), 0);
    assert_int_equal(pthread_create(&s->thread, NULL, echo_main, s), 0);
}

static void echo_stop(echo_server *s) {
    pthread_join(s->thread, NULL);
    close(s->listen_fd);
}

static pid_t proxy_start(int listen_port, int target_port, int count, const char *delay_ms,
                         const char *rate_gbit, int busy_poll) {
    pid_t pid = netproxy_spawn("127.0.0.1", listen_port, "127.0.0.1", target_port, count, delay_ms,
                               rate_gbit, busy_poll);
    assert_true(pid >= 0);
    return pid;
}

static int proxy_connect(int port) {
    struct sockaddr_in a = loopback(port);
    for (int tries = 0; tries < 500; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
        close(fd);
        usleep(10000);
    }
    fail_msg("netproxy never listened on %d", port);
    return -1;
}

static void proxy_stop(pid_t pid) {
    kill(pid, SIGTERM);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

typedef struct sender {
    int fd;
    const unsigned char *data;
    size_t len;
} sender;

static void *send_all(void *p) {
    sender *s = p;
    for (size_t off = 0; off < s->len;) {
        ssize_t w = send(s->fd, s->data + off, s->len - off, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += (size_t)w;
    }
    shutdown(s->fd, SHUT_WR);
    return NULL;
}

/* Sends len pseudo-random bytes through fd while reading the answer; checks every byte came
 * back transformed by the server's tag, then end of stream. */
static void roundtrip(int fd, size_t len, unsigned char tag) {
    unsigned char *out = malloc(len), *in = malloc(len);
    assert_non_null(out);
    assert_non_null(in);
    uint32_t x = 12345;
    for (size_t i = 0; i < len; i++)
        out[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 16);
    sender s = {.fd = fd, .data = out, .len = len};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, send_all, &s), 0);
    size_t got = 0;
    while (got < len) {
        ssize_t r = recv(fd, in + got, len - got, 0);
        assert_true(r > 0);
        got += (size_t)r;
    }
    char extra;
    assert_int_equal(recv(fd, &extra, 1, 0), 0); /* the server's close came through */
    pthread_join(t, NULL);
    for (size_t i = 0; i < len; i++)
        if (in[i] != (out[i] ^ tag)) fail_msg("byte %zu: %u, want %u", i, in[i], out[i] ^ tag);
    free(out);
    free(in);
    close(fd);
}

static int base_port(void) {
    return 30000 + (int)(getpid() % 300) * 8;
}

static void check_through_proxy(const char *delay_ms, const char *rate_gbit, size_t len,
                                int busy_poll) {
    int target = base_port(), listen_port = target + 4;
    echo_server e;
    echo_start(&e, target, 0x5a);
    pid_t proxy = proxy_start(listen_port, target, 1, delay_ms, rate_gbit, busy_poll);
    roundtrip(proxy_connect(listen_port), len, 0x5a);
    echo_stop(&e);
    proxy_stop(proxy);
}

static void test_bytes_arrive_intact_unshaped(void **state) {
    (void)state;
    check_through_proxy("0", "0", 8u << 20, 0);
}

static void test_bytes_arrive_intact_delayed_and_rate_limited(void **state) {
    (void)state;
    check_through_proxy("0.2", "2", 4u << 20, 0);
    check_through_proxy("1", "0", 1u << 10, 0);
    check_through_proxy("0.2", "2", 4u << 20, 1);
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A message and its answer cross the link twice: the round trip can never be shorter than two
 * delays, sleeping or busy-polling (a lower bound only: a loaded machine may add any amount). */
static void check_round_trip_at_least_two_delays(int busy_poll) {
    int target = base_port(), listen_port = target + 4;
    echo_server e;
    echo_start(&e, target, 0x33);
    pid_t proxy = proxy_start(listen_port, target, 1, "20", "0", busy_poll);
    int fd = proxy_connect(listen_port);
    unsigned char b = 7;
    double t0 = seconds_now();
    assert_int_equal(send(fd, &b, 1, 0), 1);
    assert_int_equal(recv(fd, &b, 1, 0), 1);
    double rtt = seconds_now() - t0;
    assert_int_equal(b, 7 ^ 0x33);
    if (rtt < 0.040) fail_msg("round trip %.1f ms through a 20 ms link (busy_poll %d)", rtt * 1e3, busy_poll);
    shutdown(fd, SHUT_WR);
    close(fd);
    echo_stop(&e);
    proxy_stop(proxy);
}

static void test_delay_is_imposed_each_way(void **state) {
    (void)state;
    check_round_trip_at_least_two_delays(0);
    check_round_trip_at_least_two_delays(1);
}

static void test_port_range_maps_port_to_port(void **state) {
    (void)state;
    int target = base_port(), listen_port = target + 4;
    echo_server e0, e1;
    echo_start(&e0, target, 0x11);
    echo_start(&e1, target + 1, 0x22);
    pid_t proxy = proxy_start(listen_port, target, 2, "0.1", "10", 0);
    /* The tag in the answer says which server the proxy's port reached. */
    roundtrip(proxy_connect(listen_port + 1), 100000, 0x22);
    roundtrip(proxy_connect(listen_port), 100000, 0x11);
    echo_stop(&e0);
    echo_stop(&e1);
    proxy_stop(proxy);
}

static void test_bad_arguments_are_refused(void **state) {
    (void)state;
    const char *build = getenv("EXO_BUILD");
    char cmd[1024];
    const char *bad[] = {"", "--listen 127.0.0.1:1", "--listen nohost --target 127.0.0.1:2",
                         "--listen 127.0.0.1:1 --target 127.0.0.1:2 --delay-ms fast",
                         "--listen 127.0.0.1:65535 --target 127.0.0.1:2 --count 4"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cmd, sizeof cmd, "%s/tools/netproxy %s 2>/dev/null",
                 build && *build ? build : "build", bad[i]);
        int st = system(cmd);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_arrive_intact_unshaped),
        cmocka_unit_test(test_bytes_arrive_intact_delayed_and_rate_limited),
        cmocka_unit_test(test_delay_is_imposed_each_way),
        cmocka_unit_test(test_port_range_maps_port_to_port),
        cmocka_unit_test(test_bad_arguments_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
