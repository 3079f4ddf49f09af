/* fdio — moving a whole buffer through a file descriptor: read(2) and write(2) may stop short or
 * be interrupted by a signal, and every caller wants "all of it, or an error". Knows nothing of
 * what the bytes are; refuses sockets' special cases (MSG_NOSIGNAL, non-blocking). */
#ifndef EXO_BASE_FDIO_H
#define EXO_BASE_FDIO_H

#include <stddef.h>

/* Writes all n bytes of data. Returns 0, or -1 (errno set when write failed; 0 written counts as
 * failure too). */
int fdio_write_all(int fd, const void *data, size_t n);
/* Reads exactly n bytes into data. Returns 0, or -1 on an error or end of file first. */
int fdio_read_all(int fd, void *data, size_t n);

#endif
