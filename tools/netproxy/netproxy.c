/* netproxy — a TCP forwarder that behaves like a slower network: a one-way delay and a rate
 * limit, in both directions, so the data plane can be measured at 0.1 ms / 10 Gbit/s on a
 * machine whose kernel has no netem.
 *
 *   netproxy --listen HOST:PORT --target HOST:PORT [--count N] [--delay-ms X] [--rate-gbit Y]
 *            [--busy-poll]
 *
 * With --count N it forwards N ports: listen PORT+i -> target PORT+i, which is the layout of a
 * dist group with port_base set (rank r listens for peer p on port_base + r*size + p; ranks
 * bind one address, e.g. 127.0.0.2, and advertise the proxy's, e.g. 127.0.0.1, with
 * advertise_port_offset = listen PORT - target PORT).
 *
 * Each direction of a connection is a link: bytes read at time t leave once the link has
 * serialized what was ahead of them at the given rate, and arrive `delay` later. Chunks wait in
 * a timestamped FIFO per direction; one epoll loop with a nanosecond timerfd (timer slack set
 * to 1 ns) writes each when it is due. A queue past its cap stops reading from its source
 * (TCP back-pressure) instead of growing. With --busy-poll the loop never sleeps: it polls epoll
 * without blocking and writes due chunks as soon as the clock passes them. A sleeping loop pays
 * two wake-ups per message (the read, then the timer), tens of microseconds each on a virtual
 * machine, which on a 0.1 ms link made every message take ~0.2 ms; busy-polling keeps the delay
 * what was asked, at the price of one core (give the proxy cores of its own, as a real network
 * would not run on the nodes' cores). Owns: its sockets and queues. Refuses: anything but
 * TCP, and buffering without bound. Exits on SIGINT/SIGTERM, printing the bytes it moved. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

/* QUEUE_CAP bounds each direction's backlog: 64 MB is 50 ms at 10 Gbit/s, far above any
 * bandwidth-delay product this is used at. */
enum { MAX_PORTS = 4096, READ_CHUNK = 256 * 1024, QUEUE_CAP = 64 * 1024 * 1024, MAX_EVENTS = 64 };

typedef struct chunk {
    struct chunk *next;
    uint64_t due_ns; /* when its first byte may be written to the destination */
    size_t len, sent;
    unsigned char data[];
} chunk;

/* One direction of a connection: from `src` to `dst`. */
typedef struct direction {
    int src, dst;
    chunk *head, *tail;
    size_t queued;       /* bytes waiting */
    uint64_t free_at_ns; /* when the link finishes serializing what is queued */
    int src_eof;         /* source closed its side; shut dst's write side once drained */
    int dst_shut;
    int dst_blocked; /* dst's socket buffer was full: wait for EPOLLOUT */
} direction;

struct conn;

/* What an epoll event points at: a listener (port_index), the timer, or one socket of a
 * connection. */
typedef struct handle {
    enum { H_LISTENER, H_TIMER, H_SOCKET } kind;
    int fd;
    int port_index;
    struct conn *c;
    uint32_t interest; /* the events registered now (to skip redundant epoll_ctl calls) */
    int hung;          /* the peer closed both ways: out of epoll, nothing more goes into it */
} handle;

typedef struct conn {
    handle client, server;
    int server_connecting;
    int closed;
    direction up, down; /* up: client -> server; down: server -> client */
    struct conn *next;
} conn;

static struct {
    double delay_ms, rate_gbit;
    int busy_poll;
    struct sockaddr_storage target;
    socklen_t target_len;
    int epoll, timer;
    conn *conns;
    uint64_t armed_ns;
    volatile sig_atomic_t stop;
    uint64_t moved;
} P;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void on_signal(int sig) {
    (void)sig;
    P.stop = 1;
}

static void *xmalloc(size_t n) {
    void *p = calloc(1, n);
    if (!p) {
        perror("netproxy: out of memory");
        exit(1);
    }
    return p;
}

static int parse_hostport(const char *s, struct sockaddr_storage *out, socklen_t *len) {
    char host[256];
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || (size_t)(colon - s) >= sizeof host) return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || port < 0 || port > 65535) return -1;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) return -1;
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    if (out->ss_family == AF_INET)
        ((struct sockaddr_in *)out)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)out)->sin6_port = htons((uint16_t)port);
    return 0;
}

static int addr_port(const struct sockaddr_storage *a) {
    return ntohs(a->ss_family == AF_INET ? ((const struct sockaddr_in *)a)->sin_port
                                         : ((const struct sockaddr_in6 *)a)->sin6_port);
}

static void addr_set_port(struct sockaddr_storage *a, int port) {
    if (a->ss_family == AF_INET)
        ((struct sockaddr_in *)a)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)a)->sin6_port = htons((uint16_t)port);
}

/* ---- links -------------------------------------------------------------------------------- */

/* Appends what was just read: it leaves the link after everything ahead of it has been
 * serialized at the rate, and arrives delay later. */
static void direction_push(direction *l, const unsigned char *data, size_t len, uint64_t now) {
    chunk *k = xmalloc(sizeof *k + len);
    memcpy(k->data, data, len);
    k->len = len;
    uint64_t start = l->free_at_ns > now ? l->free_at_ns : now;
    /* bits / (Gbit/s) = nanoseconds */
    uint64_t serialize_ns = P.rate_gbit > 0 ? (uint64_t)((double)len * 8.0 / P.rate_gbit) : 0;
    l->free_at_ns = start + serialize_ns;
    k->due_ns = l->free_at_ns + (uint64_t)(P.delay_ms * 1e6);
    if (l->tail)
        l->tail->next = k;
    else
        l->head = k;
    l->tail = k;
    l->queued += len;
}

/* Reads what the source has, up to the queue cap. Returns -1 on an error. */
static int direction_read(direction *l, uint64_t now) {
    static unsigned char buf[READ_CHUNK];
    while (!l->src_eof && l->queued < QUEUE_CAP) {
        ssize_t r = recv(l->src, buf, sizeof buf, 0);
        if (r > 0)
            direction_push(l, buf, (size_t)r, now);
        else if (r == 0)
            l->src_eof = 1;
        else if (errno == EINTR)
            continue;
        else
            return errno == EAGAIN ? 0 : -1;
    }
    return 0;
}

/* Writes every chunk that is due, as far as the destination takes it; once the source has
 * closed and everything is delivered, closes the destination's write side. -1 on an error. */
static int direction_flush(direction *l, uint64_t now) {
    while (l->head && l->head->due_ns <= now) {
        chunk *k = l->head;
        ssize_t w = send(l->dst, k->data + k->sent, k->len - k->sent, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) {
            l->dst_blocked = 1;
            return 0;
        }
        if (w < 0) return -1;
        l->dst_blocked = 0;
        k->sent += (size_t)w;
        P.moved += (uint64_t)w;
        if (k->sent < k->len) continue;
        l->queued -= k->len;
        l->head = k->next;
        if (!l->head) l->tail = NULL;
        free(k);
    }
    if (!l->head && l->src_eof && !l->dst_shut) {
        shutdown(l->dst, SHUT_WR);
        l->dst_shut = 1;
    }
    return 0;
}

static void direction_free(direction *l) {
    while (l->head) {
        chunk *k = l->head;
        l->head = k->next;
        free(k);
    }
    l->tail = NULL;
    l->queued = 0;
}

/* ---- connections -------------------------------------------------------------------------- */

static void set_interest(handle *h, uint32_t events) {
    if (h->hung || h->interest == events) return;
    struct epoll_event e = {.events = events, .data.ptr = h};
    epoll_ctl(P.epoll, EPOLL_CTL_MOD, h->fd, &e);
    h->interest = events;
}

/* A socket is read while its outgoing link has room, and watched for writability while a due
 * chunk could not be written to it (or while the connect to the target is in progress). */
static void conn_update_interest(conn *c) {
    int connecting = c->server_connecting;
    set_interest(&c->client, (!c->up.src_eof && c->up.queued < QUEUE_CAP ? EPOLLIN : 0) |
                                 (c->down.dst_blocked ? EPOLLOUT : 0));
    set_interest(&c->server,
                 (!connecting && !c->down.src_eof && c->down.queued < QUEUE_CAP ? EPOLLIN : 0) |
                     (connecting || c->up.dst_blocked ? EPOLLOUT : 0));
}

/* Stops the connection's events now; the memory goes after the current batch of events (a
 * later event of the same batch may still point at it). */
static void conn_close(conn *c) {
    if (c->closed) return;
    c->closed = 1;
    if (!c->client.hung) epoll_ctl(P.epoll, EPOLL_CTL_DEL, c->client.fd, NULL);
    if (!c->server.hung) epoll_ctl(P.epoll, EPOLL_CTL_DEL, c->server.fd, NULL);
    close(c->client.fd);
    close(c->server.fd);
    direction_free(&c->up);
    direction_free(&c->down);
}

static void conns_free_closed(void) {
    for (conn **p = &P.conns; *p;) {
        conn *c = *p;
        if (c->closed) {
            *p = c->next;
            free(c);
        } else {
            p = &c->next;
        }
    }
}

static void accept_one(handle *listener) {
    int client = accept4(listener->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (client < 0) return;
    struct sockaddr_storage target = P.target;
    addr_set_port(&target, addr_port(&P.target) + listener->port_index);
    int server = socket(target.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (server < 0 ||
        (connect(server, (struct sockaddr *)&target, P.target_len) < 0 && errno != EINPROGRESS)) {
        if (server >= 0) close(server);
        close(client);
        return;
    }
    int one = 1;
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conn *c = xmalloc(sizeof *c);
    c->client = (handle){.kind = H_SOCKET, .fd = client, .c = c, .interest = EPOLLIN};
    c->server = (handle){.kind = H_SOCKET, .fd = server, .c = c, .interest = EPOLLOUT};
    c->server_connecting = 1;
    c->up = (direction){.src = client, .dst = server};
    c->down = (direction){.src = server, .dst = client};
    c->next = P.conns;
    P.conns = c;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &c->client};
    epoll_ctl(P.epoll, EPOLL_CTL_ADD, client, &e);
    e = (struct epoll_event){.events = EPOLLOUT, .data.ptr = &c->server};
    epoll_ctl(P.epoll, EPOLL_CTL_ADD, server, &e);
}

/* One readiness event on a connection's socket: finish the connect, read, write what is due.
 * A failure or a fully finished exchange closes both sides. */
static void conn_event(handle *h, uint32_t events, uint64_t now) {
    conn *c = h->c;
    if (c->closed) return;
    if (h == &c->server && c->server_connecting) {
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        getsockopt(c->server.fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr || (events & EPOLLERR)) {
            conn_close(c);
            return;
        }
        c->server_connecting = 0;
    }
    direction *from = h == &c->client ? &c->up : &c->down,
              *into = h == &c->client ? &c->down : &c->up;
    if ((events & EPOLLERR) || direction_read(from, now) < 0) {
        conn_close(c);
        return;
    }
    if ((events & EPOLLHUP) && from->src_eof) {
        /* Closed both ways: what it sent still goes out after its delay; what was queued for it
         * cannot be delivered, and the other side's further bytes have nowhere to go. */
        epoll_ctl(P.epoll, EPOLL_CTL_DEL, h->fd, NULL);
        h->hung = 1;
        direction_free(into);
        into->src_eof = into->dst_shut = 1;
        into->dst_blocked = 0;
    }
    if (direction_flush(&c->up, now) < 0 || direction_flush(&c->down, now) < 0 ||
        (c->up.dst_shut && c->down.dst_shut)) {
        conn_close(c);
        return;
    }
    conn_update_interest(c);
}

/* Arms the timer for the earliest chunk waiting to be written (none: disarmed). One that fell
 * due while the batch was handled is in the past: the timer then fires at once. */
static void arm_timer(void) {
    uint64_t next = 0;
    for (conn *c = P.conns; c; c = c->next) {
        const direction *ls[2] = {&c->up, &c->down};
        for (int i = 0; i < 2; i++)
            if (ls[i]->head && !ls[i]->dst_blocked && (!next || ls[i]->head->due_ns < next))
                next = ls[i]->head->due_ns;
    }
    if (next == P.armed_ns) return;
    P.armed_ns = next;
    struct itimerspec its = {0};
    its.it_value.tv_sec = (time_t)(next / 1000000000u);
    its.it_value.tv_nsec = (long)(next % 1000000000u);
    timerfd_settime(P.timer, TFD_TIMER_ABSTIME, &its, NULL);
}

/* Writes what is due on every connection. */
static void flush_due(uint64_t now) {
    for (conn *c = P.conns; c; c = c->next) {
        if (c->closed) continue;
        if (direction_flush(&c->up, now) < 0 || direction_flush(&c->down, now) < 0 ||
            (c->up.dst_shut && c->down.dst_shut)) {
            conn_close(c);
            continue;
        }
        conn_update_interest(c);
    }
}

static void on_timer(uint64_t now) {
    uint64_t expirations;
    ssize_t r = read(P.timer, &expirations, sizeof expirations);
    (void)r;
    P.armed_ns = 0;
    flush_due(now);
}

static int listen_on(const struct sockaddr_storage *addr, socklen_t len) {
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0) return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (const struct sockaddr *)addr, len) < 0 || listen(fd, 64) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void usage(void) {
    fprintf(stderr, "usage: netproxy --listen HOST:PORT --target HOST:PORT [--count N] [--delay-ms "
                    "X] [--rate-gbit Y] [--busy-poll]\n"
                    "  forwards TCP from HOST:PORT+i to the target's PORT+i (i < N, default 1), "
                    "each direction\n"
                    "  delayed by X ms (one way) and limited to Y Gbit/s (0 = unlimited);\n"
                    "  --busy-poll: never sleep (exact delays, one core spent)\n");
}

int main(int argc, char **argv) {
    const char *listen_arg = NULL, *target_arg = NULL;
    int count = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--listen") && v)
            listen_arg = v, i++;
        else if (!strcmp(a, "--target") && v)
            target_arg = v, i++;
        else if (!strcmp(a, "--count") && v)
            count = (int)strtol(v, &end, 10), i++;
        else if (!strcmp(a, "--delay-ms") && v)
            P.delay_ms = strtod(v, &end), i++;
        else if (!strcmp(a, "--busy-poll"))
            P.busy_poll = 1;
        else if (!strcmp(a, "--rate-gbit") && v)
            P.rate_gbit = strtod(v, &end), i++;
        else {
            usage();
            return 2;
        }
        if (end && *end) {
            fprintf(stderr, "netproxy: '%s' is not a number for %s\n", v, a);
            return 2;
        }
    }
    struct sockaddr_storage listen_addr;
    socklen_t listen_len;
    if (!listen_arg || !target_arg || parse_hostport(listen_arg, &listen_addr, &listen_len) < 0 ||
        parse_hostport(target_arg, &P.target, &P.target_len) < 0) {
        usage();
        return 2;
    }
    if (count < 1 || count > MAX_PORTS || addr_port(&listen_addr) + count > 65536 ||
        addr_port(&P.target) + count > 65536 || P.delay_ms < 0 || P.rate_gbit < 0) {
        fprintf(stderr, "netproxy: --count, --delay-ms or --rate-gbit out of range\n");
        return 2;
    }
    /* The default 50 us timer slack would swallow a 0.1 ms delay's precision. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    P.epoll = epoll_create1(EPOLL_CLOEXEC);
    P.timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (P.epoll < 0 || P.timer < 0) {
        perror("netproxy: epoll/timerfd");
        return 1;
    }
    static handle timer_handle = {.kind = H_TIMER};
    timer_handle.fd = P.timer;
    struct epoll_event te = {.events = EPOLLIN, .data.ptr = &timer_handle};
    epoll_ctl(P.epoll, EPOLL_CTL_ADD, P.timer, &te);
    handle *listeners = xmalloc((size_t)count * sizeof *listeners); /* freed at exit */
    for (int i = 0; i < count; i++) {
        struct sockaddr_storage a = listen_addr;
        addr_set_port(&a, addr_port(&listen_addr) + i);
        int fd = listen_on(&a, listen_len);
        if (fd < 0) {
            fprintf(stderr, "netproxy: cannot listen on port %d: %s\n", addr_port(&a),
                    strerror(errno));
            free(listeners);
            return 1;
        }
        handle *h = &listeners[i];
        *h = (handle){.kind = H_LISTENER, .fd = fd, .port_index = i};
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = h};
        epoll_ctl(P.epoll, EPOLL_CTL_ADD, fd, &e);
    }
    fprintf(stderr, "netproxy: %s (+%d ports) -> %s, delay %.3f ms, rate %s%s\n", listen_arg,
            count - 1, target_arg, P.delay_ms, P.rate_gbit > 0 ? "limited" : "unlimited",
            P.busy_poll ? ", busy-polling" : "");

    while (!P.stop) {
        struct epoll_event evs[MAX_EVENTS];
        int n = epoll_wait(P.epoll, evs, MAX_EVENTS, P.busy_poll ? 0 : -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("netproxy: epoll_wait");
            free(listeners);
            return 1;
        }
        uint64_t now = now_ns();
        for (int i = 0; i < n; i++) {
            handle *h = evs[i].data.ptr;
            if (h->kind == H_LISTENER)
                accept_one(h);
            else if (h->kind == H_TIMER)
                on_timer(now);
            else
                conn_event(h, evs[i].events, now);
        }
        if (P.busy_poll) flush_due(now_ns()); /* the timer is never armed */
        conns_free_closed();
        if (!P.busy_poll) arm_timer();
    }
    fprintf(stderr, "netproxy: moved %llu bytes\n", (unsigned long long)P.moved);
    for (int i = 0; i < count; i++) close(listeners[i].fd);
    free(listeners);
    return 0;
}
