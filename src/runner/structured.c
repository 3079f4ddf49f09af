/* structured — see structured.h. */
#include "runner/structured.h"

#include "base/error.h"
#include "text/grammar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GRAMMAR_CACHE 8 /* compiled grammars kept; the least recently used one goes */

typedef struct cached_grammar {
    char *text;
    grammar *g;
    uint64_t used; /* use counter stamp */
} cached_grammar;

struct structured {
    const tokenizer *tok;
    const engine_info *info;
    grammar_vocab *vocab; /* built on first use */
    cached_grammar cache[GRAMMAR_CACHE];
    uint64_t clock;
};

/* One sequence's side of the constraint. */
typedef struct sequence_constraint {
    grammar_state *state;
    const grammar_vocab *vocab;
    int dead; /* a token the grammar refused was taken: only eos from here on */
} sequence_constraint;

structured *structured_new(const tokenizer *tok, const engine_info *info) {
    structured *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->tok = tok;
    s->info = info;
    return s;
}

void structured_free(structured *s) {
    if (!s) return;
    for (int i = 0; i < GRAMMAR_CACHE; i++) {
        free(s->cache[i].text);
        grammar_unref(s->cache[i].g);
    }
    grammar_vocab_free(s->vocab);
    free(s);
}

/* The bytes of every token as the detokenizer writes them (special tokens: none, so the grammar
 * never allows them; the eos ids end a complete output instead). */
static int build_vocab(structured *s, char *err, size_t errlen) {
    int n = tokenizer_vocab_size(s->tok);
    if (n > s->info->vocab_size) n = s->info->vocab_size;
    uint8_t **bytes = calloc((size_t)n, sizeof *bytes);
    uint32_t *lens = calloc((size_t)n, sizeof *lens);
    for (int id = 0; id < n; id++) {
        if (tokenizer_is_special(s->tok, id)) continue;
        uint8_t buf[512];
        size_t len = tokenizer_token_bytes(s->tok, id, buf, sizeof buf);
        if (len > sizeof buf) continue; /* longer than any JSON needs: never allowed */
        bytes[id] = malloc(len ? len : 1);
        memcpy(bytes[id], buf, len);
        lens[id] = (uint32_t)len;
    }
    s->vocab = grammar_vocab_new(s->info->vocab_size, (const uint8_t *const *)bytes, lens, n,
                                 s->info->eos_ids, s->info->n_eos, err, errlen);
    for (int id = 0; id < n; id++)
        free(bytes[id]);
    free(bytes);
    free(lens);
    return s->vocab ? 0 : -1;
}

/* The compiled grammar for text (a new reference), from the cache or compiled now. */
static grammar *grammar_for(structured *s, const char *text, char *err, size_t errlen) {
    int oldest = 0;
    for (int i = 0; i < GRAMMAR_CACHE; i++) {
        if (s->cache[i].text && !strcmp(s->cache[i].text, text)) {
            s->cache[i].used = ++s->clock;
            return grammar_ref(s->cache[i].g);
        }
        if (s->cache[i].used < s->cache[oldest].used) oldest = i;
    }
    grammar *g = grammar_parse(text, strlen(text), err, errlen);
    if (!g) return NULL;
    cached_grammar *c = &s->cache[oldest];
    free(c->text);
    grammar_unref(c->g);
    *c = (cached_grammar){strdup(text), grammar_ref(g), ++s->clock};
    return g;
}

/* Every token the grammar does not allow now gets -inf. When nothing is allowed (the grammar's
 * stack limit was hit), eos is, so the sequence ends instead of sampling garbage. */
static void constraint_mask(void *ctx, float *logits, int n) {
    sequence_constraint *c = ctx;
    const uint64_t *bits = c->dead ? NULL : grammar_state_mask(c->state, c->vocab);
    int words = (grammar_vocab_size(c->vocab) + 63) / 64, any = 0;
    for (int w = 0; bits && w < words && !any; w++)
        any = bits[w] != 0;
    if (!any) {
        for (int t = 0; t < n; t++)
            if (!grammar_vocab_is_eos(c->vocab, t)) logits[t] = -INFINITY;
        return;
    }
    for (int w = 0; w < words; w++) {
        uint64_t b = bits[w];
        if (b == ~0ull) continue;
        int base = w * 64, end = base + 64 < n ? base + 64 : n;
        for (int t = base; t < end; t++)
            if (!((b >> (t - base)) & 1)) logits[t] = -INFINITY;
    }
    for (int t = words * 64; t < n; t++)
        logits[t] = -INFINITY;
}

static void constraint_accept(void *ctx, int32_t token) {
    sequence_constraint *c = ctx;
    /* a token outside the grammar only follows the eos fallback above: the output ends there */
    if (grammar_state_accept_token(c->state, c->vocab, token) != 0 &&
        !grammar_vocab_is_eos(c->vocab, token))
        c->dead = 1;
}

static void constraint_release(void *ctx) {
    sequence_constraint *c = ctx;
    grammar_state_free(c->state);
    free(c);
}

int structured_constraint(structured *s, const char *grammar_text, engine_constraint *out,
                          char *err, size_t errlen) {
    if (!s->vocab && build_vocab(s, err, errlen)) return -1;
    grammar *g = grammar_for(s, grammar_text, err, errlen);
    if (!g) return -1;
    sequence_constraint *c = calloc(1, sizeof *c);
    c->state = grammar_state_new(g);
    c->vocab = s->vocab;
    grammar_unref(g);
    if (!c->state) {
        free(c);
        error_set(err, errlen, "out of memory for the grammar");
        return -1;
    }
    *out = (engine_constraint){.mask = constraint_mask,
                               .accept = constraint_accept,
                               .release = constraint_release,
                               .ctx = c};
    return 0;
}
