#include "base/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void strbuf_reserve(strbuf *sb, size_t extra) {
    size_t need = sb->len + extra + 1;
    if (need <= sb->cap) return;
    size_t cap = sb->cap ? sb->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(sb->data, cap);
    if (!p) {
        fprintf(stderr, "out of memory growing a string to %zu bytes\n", cap);
        abort();
    }
    sb->data = p;
    sb->cap = cap;
}

void strbuf_append(strbuf *sb, const char *bytes, size_t n) {
    strbuf_reserve(sb, n);
    if (n) memcpy(sb->data + sb->len, bytes, n);
    sb->len += n;
    sb->data[sb->len] = 0;
}

void strbuf_append_str(strbuf *sb, const char *s) {
    strbuf_append(sb, s, strlen(s));
}

void strbuf_append_char(strbuf *sb, char c) {
    strbuf_append(sb, &c, 1);
}

void strbuf_appendf(strbuf *sb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        strbuf_append(sb, small, (size_t)n);
        return;
    }
    strbuf_reserve(sb, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

void strbuf_clear(strbuf *sb) {
    sb->len = 0;
    if (sb->data) sb->data[0] = 0;
}

char *strbuf_detach(strbuf *sb) {
    char *p = sb->data;
    if (!p) p = calloc(1, 1);
    sb->data = NULL;
    sb->len = sb->cap = 0;
    return p;
}

void strbuf_free(strbuf *sb) {
    free(sb->data);
    sb->data = NULL;
    sb->len = sb->cap = 0;
}
