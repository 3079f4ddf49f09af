/* conn_watch — per-phase deadlines for slow HTTP clients (see conn_watch.h). One lock guards the
 * list; it is taken a few times per request and twice a second by the checking thread, which
 * walks every open connection (a few thousand at most: the server's connection limit). */
#include "api/conn_watch.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/sync.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHECK_INTERVAL_MS 500

struct conn_watch_entry {
    int fd; /* our own dup of the connection's socket */
    enum conn_phase phase;
    uint64_t since_ns; /* when the current deadline's clock started */
    int ended;         /* shut down by the checker; the server has yet to close it */
    conn_watch_entry *prev, *next;
};

struct conn_watch {
    uint64_t header_ns, body_ns;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int stopping;
    conn_watch_entry *list;
    atomic_ullong timeouts;
    pthread_t thread;
};

static const char REQUEST_TIMEOUT[] = "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
                                      "Content-Length: 0\r\n\r\n";

/* w->lock held. Ends e if its phase's deadline has passed. */
static void check_entry_locked(conn_watch *w, conn_watch_entry *e, uint64_t now) {
    if (e->ended || e->phase == CONN_HANDLING) return;
    uint64_t limit = e->phase == CONN_BODY ? w->body_ns : w->header_ns;
    if (now - e->since_ns < limit) return;
    /* Only a client that started a request hears why; nothing was answered on it yet (an early
     * answer such as 413 is sent while the body phase runs, so the body phase stays silent). */
    if (e->phase == CONN_HEADERS) {
        ssize_t n = send(e->fd, REQUEST_TIMEOUT, sizeof REQUEST_TIMEOUT - 1,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)n;
    }
    shutdown(e->fd, SHUT_RDWR);
    e->ended = 1;
    atomic_fetch_add(&w->timeouts, 1);
}

static void *watch_main(void *arg) {
    conn_watch *w = arg;
    pthread_mutex_lock(&w->lock);
    while (!w->stopping) {
        sync_cond_wait_ms(&w->wake, &w->lock, CHECK_INTERVAL_MS);
        uint64_t now = clock_now_ns();
        for (conn_watch_entry *e = w->list; e; e = e->next) check_entry_locked(w, e, now);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* Frees w once its thread has ended (or never started) and its list is empty. */
static void free_watch(conn_watch *w) {
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

conn_watch *conn_watch_start(unsigned header_timeout_s, unsigned body_timeout_s) {
    conn_watch *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->header_ns = (uint64_t)header_timeout_s * 1000000000ull;
    w->body_ns = (uint64_t)body_timeout_s * 1000000000ull;
    pthread_mutex_init(&w->lock, NULL);
    sync_cond_init_monotonic(&w->wake);
    if (pthread_create(&w->thread, NULL, watch_main, w)) {
        free_watch(w);
        return NULL;
    }
    return w;
}

void conn_watch_stop(conn_watch *w) {
    if (!w) return;
    sync_set_flag_and_wake(&w->lock, &w->wake, &w->stopping);
    pthread_join(w->thread, NULL);
    while (w->list) conn_watch_remove(w, w->list);
    free_watch(w);
}

conn_watch_entry *conn_watch_add(conn_watch *w, int fd) {
    if (!w || fd < 0) return NULL;
    conn_watch_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (e->fd < 0) {
        log_debug("http: no descriptor left to watch a connection (%s)", strerror(errno));
        free(e);
        return NULL;
    }
    e->phase = CONN_WAITING;
    e->since_ns = clock_now_ns();
    pthread_mutex_lock(&w->lock);
    e->next = w->list;
    if (w->list) w->list->prev = e;
    w->list = e;
    pthread_mutex_unlock(&w->lock);
    return e;
}

void conn_watch_set_phase(conn_watch *w, conn_watch_entry *e, enum conn_phase phase) {
    if (!w || !e) return;
    pthread_mutex_lock(&w->lock);
    if (phase == CONN_WAITING || phase == CONN_BODY) e->since_ns = clock_now_ns();
    e->phase = phase;
    pthread_mutex_unlock(&w->lock);
}

void conn_watch_remove(conn_watch *w, conn_watch_entry *e) {
    if (!w || !e) return;
    pthread_mutex_lock(&w->lock);
    if (e->prev) e->prev->next = e->next;
    else w->list = e->next;
    if (e->next) e->next->prev = e->prev;
    pthread_mutex_unlock(&w->lock);
    close(e->fd);
    free(e);
}

unsigned long long conn_watch_timeouts(const conn_watch *w) {
    return w ? atomic_load(&((conn_watch *)w)->timeouts) : 0;
}
