/* jinja arena — bump allocation for syntax trees and render values, freed in one go.
 * Refuses to grow past its limit: a runaway template fails instead of eating the machine. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

struct jarena_chunk {
    jarena_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

void *jarena_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->limit && a->used_total + n > a->limit) return NULL;
    jarena_chunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > 60000 ? n : 64000;
        h = malloc(sizeof *h + cap);
        if (!h) return NULL;
        h->used = 0;
        h->cap = cap;
        h->next = a->head;
        a->head = h;
    }
    void *p = (char *)h->data + h->used;
    h->used += n;
    a->used_total += n;
    memset(p, 0, n);
    return p;
}

void jarena_free(jarena *a) {
    jarena_chunk *h = a->head;
    while (h) {
        jarena_chunk *next = h->next;
        free(h);
        h = next;
    }
    a->head = NULL;
    a->used_total = 0;
}

void *jalloc(jctx *c, size_t n) {
    void *p = jarena_alloc(&c->arena, n);
    if (!p) jfail(c, 0, "template rendering used more than %zu bytes of memory", c->arena.limit);
    return p;
}

char *jstrdup_n(jctx *c, const char *s, size_t n) {
    char *p = jalloc(c, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jfail(jctx *c, int line, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->errlen) {
        if (line > 0)
            snprintf(c->err, c->errlen, "template line %d: %s", line, msg);
        else
            snprintf(c->err, c->errlen, "template: %s", msg);
    }
    longjmp(c->fail, 1);
}

strbuf *jcapture_begin(jctx *c, int line) {
    if (c->ncaptures >= (int)(sizeof c->captures / sizeof c->captures[0]))
        jfail(c, line, "template nests too deeply");
    strbuf *sb = &c->captures[c->ncaptures++];
    *sb = (strbuf){0};
    c->out = sb;
    return sb;
}

jval jcapture_end(jctx *c, strbuf *previous_out) {
    strbuf *sb = &c->captures[c->ncaptures - 1];
    jval r = jv_str_copy(c, sb->data ? sb->data : "", sb->len);
    strbuf_free(sb);
    c->ncaptures--;
    c->out = previous_out;
    return r;
}
