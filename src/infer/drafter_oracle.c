/* Oracle drafter (drafter.h): drafts what follows the query's tokens in a sequence recorded
 * beforehand. With the model's own greedy output recorded, every draft is accepted: the upper
 * bound of what speculation can gain on a machine (exo bench --spec oracle). Refuses: nothing; a
 * query matching no recorded sequence gets no draft. */
#include "infer/drafter.h"

#include <stdlib.h>
#include <string.h>

typedef struct oracle_sequence {
    int32_t *tokens;
    int n_tokens;
} oracle_sequence;

typedef struct oracle_drafter {
    drafter base;
    oracle_sequence *known;
    int n_known, cap;
} oracle_drafter;

static int oracle_propose(drafter *d, drafter_query *queries, int n_queries, char *err,
                          size_t errlen) {
    (void)err;
    (void)errlen;
    const oracle_drafter *o = (const oracle_drafter *)d;
    for (int i = 0; i < n_queries; i++) {
        drafter_query *q = &queries[i];
        q->n_draft = 0;
        for (int k = 0; k < o->n_known; k++) {
            const oracle_sequence *s = &o->known[k];
            if (s->n_tokens <= q->n_tokens ||
                memcmp(s->tokens, q->tokens, (size_t)q->n_tokens * sizeof *q->tokens))
                continue;
            int avail = s->n_tokens - q->n_tokens;
            q->n_draft = avail < q->max_draft ? avail : q->max_draft;
            memcpy(q->draft, s->tokens + q->n_tokens, (size_t)q->n_draft * sizeof *q->draft);
            break;
        }
    }
    return 0;
}

static void oracle_destroy(drafter *d) {
    oracle_drafter *o = (oracle_drafter *)d;
    for (int k = 0; k < o->n_known; k++) free(o->known[k].tokens);
    free(o->known);
    free(o);
}

drafter *drafter_oracle_create(void) {
    oracle_drafter *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->base = (drafter){.name = "oracle", .propose = oracle_propose, .destroy = oracle_destroy};
    return &o->base;
}

int drafter_oracle_add(drafter *d, const int32_t *tokens, int n_tokens) {
    oracle_drafter *o = (oracle_drafter *)d;
    if (o->n_known == o->cap) {
        int cap = o->cap ? o->cap * 2 : 8;
        oracle_sequence *n = realloc(o->known, (size_t)cap * sizeof *n);
        if (!n) return -1;
        o->known = n;
        o->cap = cap;
    }
    oracle_sequence *s = &o->known[o->n_known];
    s->tokens = malloc((size_t)(n_tokens > 0 ? n_tokens : 1) * sizeof *s->tokens);
    if (!s->tokens) return -1;
    memcpy(s->tokens, tokens, (size_t)n_tokens * sizeof *tokens);
    s->n_tokens = n_tokens;
    o->n_known++;
    return 0;
}
