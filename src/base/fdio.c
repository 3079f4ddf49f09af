#include "base/fdio.h"

#include <errno.h>
#include <stdbool.h>
#include <unistd.h>

/* The loop both directions share. p is only read from when writing (hence the cast below). */
static int transfer_all(int fd, char *p, size_t n, bool writing) {
    while (n) {
        ssize_t done = writing ? write(fd, p, n) : read(fd, p, n);
        if (done < 0 && errno == EINTR) continue;
        if (done <= 0) return -1;
        p += done;
        n -= (size_t)done;
    }
    return 0;
}

int fdio_write_all(int fd, const void *data, size_t n) {
    return transfer_all(fd, (char *)data, n, true);
}

int fdio_read_all(int fd, void *data, size_t n) {
    return transfer_all(fd, data, n, false);
}
