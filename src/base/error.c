/* error — see error.h. */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

void error_vset_at(char *err, size_t errlen, const char *where, const char *fmt, va_list ap) {
    if (!err || !errlen) return;
    int n = where ? snprintf(err, errlen, "%s: ", where) : 0;
    if (n < 0 || (size_t)n >= errlen) return;
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
}

void error_set(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset_at(err, errlen, NULL, fmt, ap);
    va_end(ap);
}
