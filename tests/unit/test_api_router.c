/* The router registers each route once: a second registration of the same method and paths
 * (whatever its capture names) is refused, and the first handler keeps serving it, so which
 * handler answers never depends on the order modules register in. Routes that only look alike
 * (another method, a literal segment where the other captures, a rest capture against a
 * one-segment capture) are different routes and both serve. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "api/server.h"
#include "base/strbuf.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Each handler answers with its own name (ctx), so a request shows which one served it. */
static void h_named(api_request *r, void *ctx) {
    const char *name = ctx;
    api_respond_bytes(r, 200, "text/plain", name, strlen(name));
}

/* GET/DELETE path over a fresh connection; returns the body (the handler's name) in out. */
static void request(int port, const char *method, const char *path, char *out, size_t n) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[512];
    int len = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: x\r\n\r\n", method, path);
    assert_int_equal(write(fd, req, (size_t)len), len);
    strbuf resp = {0};
    char buf[4096];
    ssize_t got;
    while ((got = read(fd, buf, sizeof buf)) > 0) strbuf_append(&resp, buf, (size_t)got);
    close(fd);
    assert_non_null(resp.data);
    const char *body = strstr(resp.data, "\r\n\r\n");
    assert_non_null(body);
    snprintf(out, n, "%s", body + 4);
    strbuf_free(&resp);
}

static void test_route_registered_twice_is_refused(void **state) {
    (void)state;
    api_server_options o = {.port = 0};
    api_server *srv = api_server_new(&o);
    assert_int_equal(api_route_add(srv, "GET", "/instance/{id}", h_named, "first", 0), 0);
    /* The same paths under other capture names: refused. */
    assert_int_equal(api_route_add(srv, "GET", "/instance/{id}", h_named, "second", 0), -1);
    assert_int_equal(api_route_add(srv, "GET", "/instance/{name}", h_named, "third", 0), -1);
    /* Another method, or a literal segment where the first captures: a route of its own. */
    assert_int_equal(api_route_add(srv, "DELETE", "/instance/{id}", h_named, "delete", 0), 0);
    assert_int_equal(api_route_add(srv, "GET", "/instance/previews", h_named, "previews", 0), 0);
    /* A rest capture is not a one-segment capture, and vice versa. */
    assert_int_equal(api_route_add(srv, "GET", "/state/{path...}", h_named, "state-rest", 0), 0);
    assert_int_equal(api_route_add(srv, "GET", "/state/{sub...}", h_named, "again", 0), -1);
    assert_int_equal(api_route_add(srv, "GET", "/state/{one}", h_named, "state-one", 0), 0);
    assert_int_equal(api_route_add(srv, "GET", "/state", h_named, "state", 0), 0);
    assert_int_equal(api_route_add(srv, "GET", "/state", h_named, "state-again", 0), -1);

    char err[256];
    assert_int_equal(api_server_start(srv, err, sizeof err), 0);
    int port = api_server_port(srv);
    char body[256];
    request(port, "GET", "/instance/abc", body, sizeof body);
    assert_string_equal(body, "first");
    request(port, "DELETE", "/instance/abc", body, sizeof body);
    assert_string_equal(body, "delete");
    request(port, "GET", "/instance/previews", body, sizeof body);
    assert_string_equal(body, "previews");
    request(port, "GET", "/state", body, sizeof body);
    assert_string_equal(body, "state");
    request(port, "GET", "/state/nodes/n1", body, sizeof body);
    assert_string_equal(body, "state-rest");
    /* Registering after start is refused the same way, and changes nothing. */
    assert_int_equal(api_route_add(srv, "GET", "/instance/{x}", h_named, "late", 0), -1);
    request(port, "GET", "/instance/abc", body, sizeof body);
    assert_string_equal(body, "first");
    api_server_stop(srv);
    api_server_free(srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_registered_twice_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
