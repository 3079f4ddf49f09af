/* jinja arena — bump allocation for syntax trees and render values, freed in one go.
 * Refuses to grow past its limit: a runaway template fails instead of eating the machine. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

#include "base/error.h"

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

void *jarena_grow(jarena *a, void *items, size_t n, size_t *cap, size_t elem, size_t first_cap) {
    if (n < *cap) return items;
    size_t grown_cap = *cap ? *cap * 2 : first_cap;
    void *grown = jarena_alloc(a, grown_cap * elem);
    if (!grown) return NULL;
    if (n) memcpy(grown, items, n * elem);
    *cap = grown_cap;
    return grown;
}

static _Noreturn void fail_memory(jctx *c) {
    jfail(c, 0, "template rendering used more than %zu bytes of memory", c->arena.limit);
}

void *jalloc(jctx *c, size_t n) {
    void *p = jarena_alloc(&c->arena, n);
    if (!p) fail_memory(c);
    return p;
}

void *jgrow(jctx *c, void *items, size_t n, size_t *cap, size_t elem) {
    void *p = jarena_grow(&c->arena, items, n, cap, elem, 8);
    if (!p) fail_memory(c);
    return p;
}

char *jstrdup_n(jctx *c, const char *s, size_t n) {
    char *p = jalloc(c, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jfail(jctx *c, int line, const char *fmt, ...) {
    char where[32] = "template";
    if (line > 0) snprintf(where, sizeof where, "template line %d", line);
    va_list ap;
    va_start(ap, fmt);
    error_vset_at(c->err, c->errlen, where, fmt, ap);
    va_end(ap);
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
