/* error — the one way exo code reports an error to its caller: a message the user can act on,
 * written into a caller-supplied buffer (char *err, size_t errlen), next to a -1 or NULL
 * return. It refuses to allocate, log or abort: what to do with the message is the caller's. */
#ifndef EXO_BASE_ERROR_H
#define EXO_BASE_ERROR_H

#include <stdarg.h>
#include <stddef.h>

/* Formats the message into err (truncated to errlen, always NUL-terminated). Does nothing when
 * err is NULL or errlen is 0, so callers that do not want a message may pass NULL, 0. */
void error_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same, as "<where>: <message>" (where names the file or line; NULL: the message alone). */
void error_vset_at(char *err, size_t errlen, const char *where, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#endif
