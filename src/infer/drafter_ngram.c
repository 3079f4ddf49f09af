/* Prompt-lookup drafter (drafter.h): the sequence's last n tokens (n from max_ngram down to
 * min_ngram) are looked up in everything before them; the latest earlier occurrence wins and the
 * tokens that followed it are the draft (continued past the end as the same repeat). No weights, no state between calls: a rejected draft
 * needs no rollback. Refuses: nothing (a context without a repeat gets no draft). */
#include "infer/drafter.h"

#include <stdlib.h>
#include <string.h>

typedef struct ngram_drafter {
    drafter base;
    int max_ngram, min_ngram;
} ngram_drafter;

/* Start of the latest occurrence of the last n tokens that ends before them, or -1. */
static int latest_earlier_match(const int32_t *t, int n_tokens, int n) {
    const int32_t *tail = t + n_tokens - n;
    for (int start = n_tokens - n - 1; start >= 0; start--)
        if (t[start] == tail[0] && !memcmp(t + start, tail, (size_t)n * sizeof *t)) return start;
    return -1;
}

static void propose_one(const ngram_drafter *g, drafter_query *q) {
    q->n_draft = 0;
    for (int n = g->max_ngram; n >= g->min_ngram; n--) {
        if (n >= q->n_tokens) continue;
        int start = latest_earlier_match(q->tokens, q->n_tokens, n);
        if (start < 0) continue;
        /* copy what followed; a match close to the end runs into the draft itself, which
         * continues a repeating pattern (a period shorter than the draft) */
        int from = start + n;
        for (int j = 0; j < q->max_draft; j++) {
            int src = from + j;
            q->draft[j] = src < q->n_tokens ? q->tokens[src] : q->draft[src - q->n_tokens];
        }
        q->n_draft = q->max_draft;
        return;
    }
}

static int ngram_propose(drafter *d, drafter_query *queries, int n_queries, char *err,
                         size_t errlen) {
    (void)err;
    (void)errlen;
    for (int i = 0; i < n_queries; i++) propose_one((const ngram_drafter *)d, &queries[i]);
    return 0;
}

static void ngram_destroy(drafter *d) { free(d); }

drafter *drafter_ngram_create(int max_ngram, int min_ngram) {
    ngram_drafter *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->max_ngram = max_ngram > 0 ? max_ngram : 3;
    g->min_ngram = min_ngram > 0 ? min_ngram : 2;
    if (g->min_ngram > g->max_ngram) g->min_ngram = g->max_ngram;
    g->base = (drafter){.name = "ngram", .propose = ngram_propose, .destroy = ngram_destroy};
    return &g->base;
}
