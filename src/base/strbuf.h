/* strbuf — a growable byte buffer, always NUL-terminated. The owner frees it with strbuf_free.
 * Allocation failure aborts: exo cannot make progress without memory for strings. */
#ifndef EXO_BASE_STRBUF_H
#define EXO_BASE_STRBUF_H

#include <stddef.h>

typedef struct strbuf {
    char *data; /* NUL-terminated; NULL until the first append */
    size_t len;
    size_t cap;
} strbuf;

void strbuf_append(strbuf *sb, const char *bytes, size_t n);
void strbuf_append_str(strbuf *sb, const char *s);
void strbuf_append_char(strbuf *sb, char c);
void strbuf_appendf(strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void strbuf_clear(strbuf *sb);
/* Gives the buffer to the caller (free() it) and resets sb. Never NULL. */
char *strbuf_detach(strbuf *sb);
void strbuf_free(strbuf *sb);

#endif
