/* output_check — the streaming check every output-parser test uses: a text is parsed whole,
 * split in two at every byte, and byte by byte; all must give the same content, reasoning and
 * tool calls ("name(args);" each). Test-only, included by test_output_*.c. */
#ifndef EXO_TESTS_OUTPUT_CHECK_H
#define EXO_TESTS_OUTPUT_CHECK_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "text/output_parser.h"

/* The request's tools given to parsers made by run_cuts (argument schemas), or NULL. */
static json_t *check_tools;

typedef struct result {
    strbuf content, reasoning, calls; /* calls as "name(args);" */
    int n_calls;
    int max_held; /* not used for assertions of timing, only of holding behaviour */
} result;

static void take(result *r, output_delta *d) {
    if (d->content) strbuf_append_str(&r->content, d->content);
    if (d->reasoning) strbuf_append_str(&r->reasoning, d->reasoning);
    for (int i = 0; i < d->n_tool_calls; i++) {
        strbuf_appendf(&r->calls, "%s(%s);", d->tool_calls[i].name, d->tool_calls[i].arguments);
        r->n_calls++;
    }
    output_delta_free(d);
}

static const char *s(strbuf *b) {
    return b->data ? b->data : "";
}

static void result_free(result *r) {
    strbuf_free(&r->content);
    strbuf_free(&r->reasoning);
    strbuf_free(&r->calls);
}

/* feeds text cut at the given positions (sorted, may be empty) */
static void run_cuts(output_format f, int think, int tools, const char *text, const size_t *cuts,
                     int ncuts, result *r) {
    memset(r, 0, sizeof *r);
    output_parser *p = output_parser_new(f, think, tools);
    assert_non_null(p);
    output_parser_set_tools(p, check_tools);
    size_t prev = 0, n = strlen(text);
    output_delta d;
    for (int i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : n;
        output_parser_feed(p, text + prev, end - prev, &d);
        take(r, &d);
        prev = end;
    }
    output_parser_finish(p, &d);
    take(r, &d);
    output_parser_free(p);
}

/* Whether r matches; with trim, content and reasoning are compared without the whitespace
 * around them (templates put newlines around blocks). */
static int result_matches(result *r, const char *content, const char *reasoning, const char *calls, int trim) {
    const char *got[2] = {s(&r->content), s(&r->reasoning)}, *want[2] = {content, reasoning};
    for (int i = 0; i < 2; i++) {
        const char *g = got[i];
        size_t n = strlen(g);
        if (trim) {
            while (n && strchr(" \n\r\t", *g)) g++, n--;
            while (n && strchr(" \n\r\t", g[n - 1])) n--;
        }
        if (n != strlen(want[i]) || memcmp(g, want[i], n)) return 0;
    }
    return !strcmp(s(&r->calls), calls);
}

/* checks the whole-text result against expectations, then every split must agree */
static void check_text(output_format f, int think, int tools, const char *text, const char *content,
                       const char *reasoning, const char *calls, int trim) {
    size_t n = strlen(text);
    size_t *all = malloc((n + 1) * sizeof *all);
    for (size_t i = 1; i < n; i++)
        all[i - 1] = i;
    /* whole, then split at each byte, then byte by byte */
    for (size_t cut = 0; cut <= n; cut++) {
        result r;
        if (cut == n) run_cuts(f, think, tools, text, all, (int)(n ? n - 1 : 0), &r);
        else run_cuts(f, think, tools, text, &cut, cut ? 1 : 0, &r);
        if (!result_matches(&r, content, reasoning, calls, trim))
            fail_msg("%s of [%s]: content [%s] reasoning [%s] calls [%s], want [%s] [%s] [%s]",
                     cut == 0 ? "whole" : cut == n ? "byte by byte" : "a split", text, s(&r.content),
                     s(&r.reasoning), s(&r.calls), content, reasoning, calls);
        result_free(&r);
    }
    free(all);
}

static void check(output_format f, int think, int tools, const char *text, const char *content,
                  const char *reasoning, const char *calls) {
    check_text(f, think, tools, text, content, reasoning, calls, 0);
}

#endif
