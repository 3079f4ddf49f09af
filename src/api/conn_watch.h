/* conn_watch — deadlines for HTTP requests that arrive too slowly (private to api/server.c).
 *
 * libmicrohttpd's own connection timeout is an idle timeout: every byte restarts it, so a client
 * that drip-feeds its headers (one byte every few seconds) holds a connection, and its thread,
 * for ever. This module gives each connection an absolute deadline per phase instead:
 *   - waiting for a request (from accept, or from the end of the previous response on a
 *     keep-alive connection) until its headers are complete: header_timeout_s;
 *   - receiving the body, from the end of the headers: body_timeout_s;
 *   - handling (the handler runs, a response streams): no deadline here, so a long generation
 *     streams as long as it needs.
 * A thread checks twice a second and ends connections past their deadline by shutting their
 * socket down (a client that had started a request first gets "408 Request Timeout"); the server
 * then sees the closed socket and frees the connection as for any client that left.
 *
 * Each entry holds its own dup of the socket, so a shutdown can never reach a descriptor the
 * server closed and the kernel handed to a new connection.
 *
 * It refuses: parsing HTTP (the server tells it the phase), and deadlines on handlers. */
#ifndef EXO_API_CONN_WATCH_H
#define EXO_API_CONN_WATCH_H

typedef struct conn_watch conn_watch;
typedef struct conn_watch_entry conn_watch_entry;

enum conn_phase {
    CONN_WAITING,  /* no request line yet */
    CONN_HEADERS,  /* request line read, headers not complete */
    CONN_BODY,     /* headers complete, body arriving */
    CONN_HANDLING, /* the request is whole: a handler or a response owns the connection */
};

/* Starts the checking thread. Returns NULL when it cannot start. */
conn_watch *conn_watch_start(unsigned header_timeout_s, unsigned body_timeout_s);
/* Stops the thread and frees every entry left (call after the server closed its connections). */
void conn_watch_stop(conn_watch *w);

/* A new connection on socket fd, in CONN_WAITING. NULL when out of memory or descriptors (the
 * connection then has no deadline). */
conn_watch_entry *conn_watch_add(conn_watch *w, int fd);
/* The connection moved to phase; CONN_WAITING and CONN_BODY restart its clock. NULL e: no-op. */
void conn_watch_set_phase(conn_watch *w, conn_watch_entry *e, enum conn_phase phase);
/* The connection closed. NULL e: no-op. */
void conn_watch_remove(conn_watch *w, conn_watch_entry *e);

/* Connections ended for arriving too slowly, since start (for /metrics). */
unsigned long long conn_watch_timeouts(const conn_watch *w);

#endif
