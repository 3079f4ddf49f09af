/* Streamed responses of the API server over a real TCP socket: producers write chunks from
 * their own thread straight to the client socket, and what the socket does not take (a client
 * that reads slowly, with a tiny receive buffer) is queued and sent later. Every byte must reach
 * the client, in order, as valid HTTP/1.1 chunked encoding; the keep-alive connection must
 * serve the next request afterwards; an HTTP/1.0 client gets the plain body. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "api/server.h"
#include "base/strbuf.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define N_LINES 32768 /* 32768 lines of 256 bytes: 8 MiB, more than socket buffers hold */
#define LINE 256

static void make_line(char *out, int i) {
    memset(out, 'a' + i % 26, LINE);
    snprintf(out, 12, "%010d", i);
    out[10] = ' ';
    out[LINE - 1] = '\n';
}

static void *producer(void *arg) {
    api_stream *s = arg;
    char line[LINE];
    for (int i = 0; i < N_LINES; i++) {
        make_line(line, i);
        if (api_stream_write(s, line, LINE)) break;
    }
    api_stream_close(s);
    return NULL;
}

static void h_big(api_request *r, void *ctx) {
    (void)ctx;
    api_stream *s = api_respond_stream(r, 200, "text/plain");
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, producer, s), 0);
    pthread_detach(t);
}

static void h_small(api_request *r, void *ctx) {
    (void)ctx;
    api_respond_bytes(r, 200, "text/plain", "small", 5);
}

static int connect_slow(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    int small = 4096; /* before connect: the window stays small */
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Reads one response: headers, then the chunked (or, if !chunked, close-delimited) body. */
static void read_response(int fd, int chunked, strbuf *headers, strbuf *body) {
    strbuf in = {0};
    char buf[8192];
    size_t pos = 0;
    int slow = 0;
    for (;;) {
        /* parse what we have */
        if (!headers->len) {
            char *end = in.data ? strstr(in.data, "\r\n\r\n") : NULL;
            if (end) {
                strbuf_append(headers, in.data, (size_t)(end - in.data) + 4);
                pos = (size_t)(end - in.data) + 4;
            }
        }
        while (headers->len && chunked) {
            char *nl = in.len > pos ? memmem(in.data + pos, in.len - pos, "\r\n", 2) : NULL;
            if (!nl) break;
            size_t size = strtoul(in.data + pos, NULL, 16);
            size_t start = (size_t)(nl - in.data) + 2;
            if (in.len < start + size + 2) break;
            assert_memory_equal(in.data + start + size, "\r\n", 2);
            if (size == 0) {
                strbuf_free(&in);
                return;
            }
            strbuf_append(body, in.data + start, size);
            pos = start + size + 2;
        }
        if (slow++ < 20) {
            struct timespec ts = {0, 10 * 1000000L}; /* a slow reader at first */
            nanosleep(&ts, NULL);
        }
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) {
            assert_false(chunked); /* a chunked body must end with its last chunk */
            strbuf_append(body, in.data + pos, in.len - pos);
            strbuf_free(&in);
            return;
        }
        strbuf_append(&in, buf, (size_t)n);
    }
}

static void check_body(const strbuf *body) {
    assert_int_equal(body->len, (size_t)N_LINES * LINE);
    char want[LINE];
    for (int i = 0; i < N_LINES; i++) {
        make_line(want, i);
        if (memcmp(body->data + (size_t)i * LINE, want, LINE))
            fail_msg("line %d differs (bytes lost or out of order)", i);
    }
}

static void test_stream_to_slow_client(void **state) {
    (void)state;
    api_server_options o = {.port = 0};
    api_server *srv = api_server_new(&o);
    api_route_add(srv, "GET", "/big", h_big, NULL, 0);
    api_route_add(srv, "GET", "/small", h_small, NULL, 0);
    char err[256];
    assert_int_equal(api_server_start(srv, err, sizeof err), 0);
    int port = api_server_port(srv);

    /* HTTP/1.1 keep-alive: chunked, written by the producer thread */
    int fd = connect_slow(port);
    const char *get = "GET /big HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_int_equal(write(fd, get, strlen(get)), (ssize_t)strlen(get));
    strbuf headers = {0}, body = {0};
    read_response(fd, 1, &headers, &body);
    assert_non_null(strstr(headers.data, "HTTP/1.1 200"));
    assert_non_null(strcasestr(headers.data, "Transfer-Encoding: chunked"));
    check_body(&body);
    /* the same connection serves the next request */
    const char *get2 = "GET /small HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_int_equal(write(fd, get2, strlen(get2)), (ssize_t)strlen(get2));
    char buf[1024];
    strbuf rest = {0};
    while (!rest.data || !strstr(rest.data, "\r\n\r\nsmall")) {
        ssize_t n = read(fd, buf, sizeof buf);
        assert_true(n > 0);
        strbuf_append(&rest, buf, (size_t)n);
    }
    close(fd);
    strbuf_free(&rest);
    strbuf_free(&headers);
    strbuf_free(&body);

    /* HTTP/1.0: no chunked encoding; the body ends when the server closes */
    fd = connect_slow(port);
    const char *get10 = "GET /big HTTP/1.0\r\n\r\n";
    assert_int_equal(write(fd, get10, strlen(get10)), (ssize_t)strlen(get10));
    read_response(fd, 0, &headers, &body);
    assert_null(strcasestr(headers.data, "chunked"));
    check_body(&body);
    close(fd);
    strbuf_free(&headers);
    strbuf_free(&body);

    api_server_stop(srv);
    api_server_free(srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_to_slow_client),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
