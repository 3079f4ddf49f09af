/* tokenizer_encode — text to token ids, step for step as Hugging Face tokenizers does it:
 * added tokens are found in the raw text first (leftmost-longest, with lstrip/rstrip/single_word),
 * the text between them is normalized (then normalized added tokens are found), pre-tokenized
 * into words, each word is BPE-merged by rank, and the post-processor adds BOS/EOS.
 * It keeps no state between calls (no word cache), so one tokenizer serves many threads.
 * It does not produce offsets, truncation, padding or pairs of sequences. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/array.h"
#include "base/strbuf.h"
#include "text/tokenizer_internal.h"

/* ------------------------------------------------------------------------------------------ */
/* Scratch memory for one encode call                                                           */

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    char data[];
} arena_block;

typedef struct piece {
    const char *s;
    uint32_t len;
    uint8_t origin; /* starts at offset 0 of the original text (Metaspace prepend_scheme "first") */
} piece;

typedef struct piece_list {
    piece *v;
    size_t n, cap;
} piece_list;

typedef struct ids_vec {
    int32_t *v;
    size_t n, cap;
} ids_vec;

typedef struct bpe_symbol {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    uint8_t alive;
} bpe_symbol;

typedef struct bpe_merge_cand {
    int32_t rank, pos, left, right;
} bpe_merge_cand;

/* Per-call cache of BPE results for short words: natural text repeats words a lot, and the
 * merge loop is the expensive part. Lives only for one encode call (no locking needed). */
typedef struct word_cache_entry {
    const char *w; /* points into the text or the arena: stable for the call */
    uint32_t n, hash;
    uint32_t ids_off, ids_n;
} word_cache_entry;

#define WORD_CACHE_MAX_LEN 64

typedef struct encode_ctx {
    const tokenizer *t;
    arena_block *arena;
    pcre2_match_data *md;
    ids_vec out;
    bpe_symbol *sym;
    size_t sym_cap;
    bpe_merge_cand *heap;
    size_t heap_n, heap_cap;
    word_cache_entry *cache;
    size_t cache_cap, cache_n; /* cap: power of two or 0 */
    ids_vec cache_ids;
    int oom;
} encode_ctx;

static char *arena_alloc(encode_ctx *c, size_t n) {
    arena_block *b = c->arena;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        arena_block *nb = malloc(sizeof(arena_block) + cap);
        if (!nb) {
            c->oom = 1;
            return NULL;
        }
        nb->next = b;
        nb->used = 0;
        nb->cap = cap;
        c->arena = nb;
        b = nb;
    }
    char *p = b->data + b->used;
    b->used += n;
    return p;
}

static const char *arena_copy(encode_ctx *c, const char *s, size_t n) {
    char *p = arena_alloc(c, n ? n : 1);
    if (p && n) memcpy(p, s, n);
    return p;
}

/* array_reserve_one, recording a failure in c->oom. */
static void *grow_for_one(encode_ctx *c, void *v, size_t n, size_t *cap, size_t first,
                          size_t elem) {
    void *p = array_reserve_one(v, n, cap, first, elem);
    if (!p) c->oom = 1;
    return p;
}

static void push_piece(encode_ctx *c, piece_list *l, const char *s, size_t n, int origin) {
    if (n == 0) return;
    piece *v = grow_for_one(c, l->v, l->n, &l->cap, 64, sizeof *v);
    if (!v) return;
    l->v = v;
    l->v[l->n++] = (piece){s, (uint32_t)n, (uint8_t)origin};
}

static void push_id(encode_ctx *c, int32_t id) {
    ids_vec *o = &c->out;
    int32_t *v = grow_for_one(c, o->v, o->n, &o->cap, 256, sizeof *v);
    if (!v) return;
    o->v = v;
    o->v[o->n++] = id;
}

/* ------------------------------------------------------------------------------------------ */
/* Splitting with Hugging Face's delimiter behaviours                                          */

typedef struct span {
    size_t start, end;
    uint8_t is_match;
} span;

typedef struct span_list {
    span *v;
    size_t n, cap;
    encode_ctx *c;
} span_list;

static void push_span(span_list *l, size_t s, size_t e, int m) {
    span *v = grow_for_one(l->c, l->v, l->n, &l->cap, 64, sizeof *v);
    if (!v) return;
    l->v = v;
    l->v[l->n++] = (span){s, e, (uint8_t)m};
}

typedef struct match_collect {
    span_list *spans;
    size_t last;
} match_collect;

static int collect_match(void *ctx, size_t start, size_t end) {
    match_collect *m = ctx;
    if (start > m->last) push_span(m->spans, m->last, start, 0);
    push_span(m->spans, start, end, 1);
    m->last = end;
    return 0;
}

/* Turns (span, is_match) events into the pieces the behaviour keeps, appended to out. */
static void apply_behavior(encode_ctx *c, const piece *p, span_list *sp, enum tok_split_behavior b, int invert,
                           piece_list *out) {
    if (invert)
        for (size_t i = 0; i < sp->n; i++) sp->v[i].is_match = !sp->v[i].is_match;
    /* fold into kept spans in place; k = number kept */
    size_t k = 0;
    int prev_match = 0;
    switch (b) {
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < sp->n; i++)
            if (!sp->v[i].is_match) sp->v[k++] = sp->v[i];
        break;
    case TOK_SPLIT_ISOLATED:
        k = sp->n;
        break;
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < sp->n; i++) {
            int m = sp->v[i].is_match;
            if (m && !prev_match && k > 0) sp->v[k - 1].end = sp->v[i].end;
            else sp->v[k++] = sp->v[i];
            prev_match = m;
        }
        break;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < sp->n; i++) {
            int m = sp->v[i].is_match;
            if (m == prev_match && k > 0) sp->v[k - 1].end = sp->v[i].end;
            else sp->v[k++] = sp->v[i];
            prev_match = m;
        }
        break;
    case TOK_SPLIT_MERGED_WITH_NEXT: {
        /* walk backwards, merging a match into the span after it; kept spans fill from the end */
        size_t w = sp->n;
        for (size_t i = sp->n; i-- > 0;) {
            span s = sp->v[i];
            int m = s.is_match;
            if (m && !prev_match && w < sp->n) sp->v[w].start = s.start;
            else sp->v[--w] = s;
            prev_match = m;
        }
        memmove(sp->v, sp->v + w, (sp->n - w) * sizeof(span));
        k = sp->n - w;
        break;
    }
    }
    for (size_t i = 0; i < k; i++)
        push_piece(c, out, p->s + sp->v[i].start, sp->v[i].end - sp->v[i].start, p->origin && sp->v[i].start == 0);
}

/* Per-character predicate splitting (Digits, Punctuation, WhitespaceSplit, Metaspace split). */
typedef int (*char_pred)(uint32_t cp, const void *arg);

static void split_by_pred(encode_ctx *c, const piece *p, char_pred pred, const void *arg, enum tok_split_behavior b,
                          span_list *sp, piece_list *out) {
    sp->n = 0;
    size_t last = 0, i = 0;
    const uint8_t *s = (const uint8_t *)p->s;
    while (i < p->len) {
        size_t adv;
        int32_t cp = tok_utf8_decode(s + i, p->len - i, &adv);
        if (cp >= 0 && pred((uint32_t)cp, arg)) {
            if (i > last) push_span(sp, last, i, 0);
            push_span(sp, i, i + adv, 1);
            last = i + adv;
        }
        i += adv;
    }
    if (p->len > last) push_span(sp, last, p->len, 0);
    apply_behavior(c, p, sp, b, 0, out);
}

static int is_numeric_cp(uint32_t cp, const void *arg) {
    (void)arg;
    if (cp < 128) return cp >= '0' && cp <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static int is_punct_cp(uint32_t cp, const void *arg) {
    (void)arg;
    if (cp < 128) return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

static int is_ws_cp(uint32_t cp, const void *arg) {
    (void)arg;
    return tok_is_whitespace(cp);
}

static int is_char_cp(uint32_t cp, const void *arg) { return cp == *(const uint32_t *)arg; }

static int is_letter_cp(int32_t cp) {
    if (cp < 0) return 0;
    utf8proc_category_t k = utf8proc_category(cp);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static int32_t cp_before(const char *s, size_t at) {
    if (at == 0) return -1;
    size_t q = at - 1, adv;
    while (q > 0 && ((uint8_t)s[q] & 0xC0) == 0x80) q--;
    return tok_utf8_decode((const uint8_t *)s + q, at - q, &adv);
}

/* ------------------------------------------------------------------------------------------ */
/* Normalizers                                                                                  */

/* Normalizes s[0..n) into the arena; returns the new string (or s itself when unchanged). */
static const char *normalize(encode_ctx *c, const char *s, size_t n, size_t *out_len) {
    const tokenizer *t = c->t;
    strbuf sb = {0};
    for (int k = 0; k < t->n_norms && !c->oom; k++) {
        const tok_normalizer *nm = &t->norms[k];
        strbuf_clear(&sb);
        switch (nm->kind) {
        case TOK_NORM_NFC:
        case TOK_NORM_NFD:
        case TOK_NORM_NFKC:
        case TOK_NORM_NFKD: {
            if (n == 0) break;
            int opt = UTF8PROC_STABLE;
            opt |= (nm->kind == TOK_NORM_NFC || nm->kind == TOK_NORM_NFKC) ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
            if (nm->kind == TOK_NORM_NFKC || nm->kind == TOK_NORM_NFKD) opt |= UTF8PROC_COMPAT;
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opt);
            if (r < 0) {
                free(dst);
                continue; /* cannot happen on valid UTF-8; keep the text as is */
            }
            s = arena_copy(c, (const char *)dst, (size_t)r);
            n = (size_t)r;
            free(dst);
            continue;
        }
        case TOK_NORM_LOWERCASE:
        case TOK_NORM_STRIP_ACCENTS: {
            size_t i = 0;
            while (i < n) {
                size_t adv;
                int32_t cp = tok_utf8_decode((const uint8_t *)s + i, n - i, &adv);
                char buf[4];
                if (nm->kind == TOK_NORM_LOWERCASE) {
                    if (cp == 0x130) { /* İ lowercases to i + combining dot above */
                        strbuf_append(&sb, "i\xCC\x87", 3);
                    } else if (cp == 0x3A3) { /* Σ: final ς after a letter when no letter follows */
                        size_t adv2;
                        int32_t next = i + adv < n ? tok_utf8_decode((const uint8_t *)s + i + adv, n - i - adv, &adv2) : -1;
                        int final = is_letter_cp(cp_before(s, i)) && !is_letter_cp(next);
                        strbuf_append(&sb, final ? "\xCF\x82" : "\xCF\x83", 2);
                    } else {
                        strbuf_append(&sb, buf, (size_t)tok_utf8_encode((uint32_t)utf8proc_tolower(cp), buf));
                    }
                } else if (utf8proc_category(cp) != UTF8PROC_CATEGORY_MN) {
                    strbuf_append(&sb, s + i, adv);
                }
                i += adv;
            }
            break;
        }
        case TOK_NORM_REPLACE: {
            span_list sp = {.c = c};
            match_collect mc = {&sp, 0};
            if (tok_pattern_find_all(&nm->pattern, s, n, c->md, collect_match, &mc) < 0) {
                free(sp.v);
                continue;
            }
            size_t last = 0;
            for (size_t i = 0; i < sp.n; i++) {
                if (!sp.v[i].is_match) continue;
                strbuf_append(&sb, s + last, sp.v[i].start - last);
                strbuf_append(&sb, nm->content, nm->content_len);
                last = sp.v[i].end;
            }
            strbuf_append(&sb, s + last, n - last);
            free(sp.v);
            break;
        }
        case TOK_NORM_PREPEND:
            if (n == 0) continue;
            strbuf_append(&sb, nm->content, nm->content_len);
            strbuf_append(&sb, s, n);
            break;
        case TOK_NORM_STRIP: {
            size_t a = 0, b = n, adv;
            while (nm->strip_left && a < b) {
                int32_t cp = tok_utf8_decode((const uint8_t *)s + a, b - a, &adv);
                if (cp < 0 || !tok_is_whitespace((uint32_t)cp)) break;
                a += adv;
            }
            while (nm->strip_right && b > a) {
                size_t q = b - 1;
                while (q > a && ((uint8_t)s[q] & 0xC0) == 0x80) q--;
                int32_t cp = tok_utf8_decode((const uint8_t *)s + q, b - q, &adv);
                if (cp < 0 || !tok_is_whitespace((uint32_t)cp)) break;
                b = q;
            }
            s += a;
            n = b - a;
            continue;
        }
        }
        s = arena_copy(c, sb.data ? sb.data : "", sb.len);
        n = sb.len;
    }
    strbuf_free(&sb);
    *out_len = n;
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* Pre-tokenizers                                                                               */

static void pre_tokenize(encode_ctx *c, piece_list *cur, piece_list *next) {
    const tokenizer *t = c->t;
    span_list sp = {.c = c};
    for (int k = 0; k < t->n_pres && !c->oom; k++) {
        const tok_pretokenizer *pt = &t->pres[k];
        next->n = 0;
        for (size_t i = 0; i < cur->n && !c->oom; i++) {
            piece p = cur->v[i];
            switch (pt->kind) {
            case TOK_PRE_SPLIT:
            case TOK_PRE_WHITESPACE: {
                sp.n = 0;
                match_collect mc = {&sp, 0};
                if (tok_pattern_find_all(&pt->pattern, p.s, p.len, c->md, collect_match, &mc) < 0) c->oom = 1;
                if (p.len > mc.last) push_span(&sp, mc.last, p.len, 0);
                if (pt->kind == TOK_PRE_WHITESPACE) apply_behavior(c, &p, &sp, TOK_SPLIT_REMOVED, 1, next);
                else apply_behavior(c, &p, &sp, pt->behavior, pt->invert, next);
                break;
            }
            case TOK_PRE_BYTE_LEVEL: {
                piece_list words = {0};
                piece src = p;
                if (pt->add_prefix_space && (p.len == 0 || p.s[0] != ' ')) {
                    char *q = arena_alloc(c, (size_t)p.len + 1);
                    if (!q) break;
                    q[0] = ' ';
                    memcpy(q + 1, p.s, p.len);
                    src.s = q;
                    src.len = p.len + 1;
                }
                if (pt->use_regex) {
                    sp.n = 0;
                    match_collect mc = {&sp, 0};
                    if (tok_pattern_find_all(&pt->pattern, src.s, src.len, c->md, collect_match, &mc) < 0) c->oom = 1;
                    if (src.len > mc.last) push_span(&sp, mc.last, src.len, 0);
                    apply_behavior(c, &src, &sp, TOK_SPLIT_ISOLATED, 0, &words);
                } else {
                    push_piece(c, &words, src.s, src.len, src.origin);
                }
                for (size_t w = 0; w < words.n; w++) {
                    char *q = arena_alloc(c, (size_t)words.v[w].len * 2);
                    if (!q) break;
                    size_t m = 0;
                    for (uint32_t b = 0; b < words.v[w].len; b++) {
                        uint8_t byte = (uint8_t)words.v[w].s[b];
                        memcpy(q + m, tok_byte_char[byte], tok_byte_char_len[byte]);
                        m += tok_byte_char_len[byte];
                    }
                    push_piece(c, next, q, m, words.v[w].origin);
                }
                free(words.v);
                break;
            }
            case TOK_PRE_METASPACE: {
                strbuf sb = {0};
                /* spaces are replaced first, so a leading space counts as a leading replacement */
                int prepend = pt->prepend == TOK_PREPEND_ALWAYS || (pt->prepend == TOK_PREPEND_FIRST && p.origin);
                if (prepend && !(p.s[0] == ' ' || (p.len >= pt->replacement_len && !memcmp(p.s, pt->replacement, pt->replacement_len))))
                    strbuf_append(&sb, pt->replacement, pt->replacement_len);
                for (uint32_t b = 0; b < p.len; b++) {
                    if (p.s[b] == ' ') strbuf_append(&sb, pt->replacement, pt->replacement_len);
                    else strbuf_append_char(&sb, p.s[b]);
                }
                piece np = {arena_copy(c, sb.data ? sb.data : "", sb.len), (uint32_t)sb.len, p.origin};
                strbuf_free(&sb);
                if (!np.s) break;
                if (pt->split) {
                    size_t adv;
                    uint32_t rc = (uint32_t)tok_utf8_decode((const uint8_t *)pt->replacement, pt->replacement_len, &adv);
                    split_by_pred(c, &np, is_char_cp, &rc, TOK_SPLIT_MERGED_WITH_NEXT, &sp, next);
                } else {
                    push_piece(c, next, np.s, np.len, np.origin);
                }
                break;
            }
            case TOK_PRE_DIGITS:
                split_by_pred(c, &p, is_numeric_cp, NULL, pt->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS,
                              &sp, next);
                break;
            case TOK_PRE_PUNCTUATION:
                split_by_pred(c, &p, is_punct_cp, NULL, pt->behavior, &sp, next);
                break;
            case TOK_PRE_WHITESPACE_SPLIT:
                split_by_pred(c, &p, is_ws_cp, NULL, TOK_SPLIT_REMOVED, &sp, next);
                break;
            }
        }
        piece_list tmp = *cur;
        *cur = *next;
        *next = tmp;
    }
    free(sp.v);
}

/* ------------------------------------------------------------------------------------------ */
/* BPE                                                                                          */

static int cand_less(const bpe_merge_cand *a, const bpe_merge_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

/* A 4-ary min-heap on (rank, pos): half the depth of a binary heap, and the four children of a
 * node share a cache line or two, which matters for the one huge "word" of a SentencePiece
 * text (no pre-tokenizer: every merge of the whole text goes through this heap). */
static void heap_push(encode_ctx *c, bpe_merge_cand m) {
    bpe_merge_cand *heap = grow_for_one(c, c->heap, c->heap_n, &c->heap_cap, 256, sizeof *heap);
    if (!heap) return;
    c->heap = heap;
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 4;
        if (!cand_less(&m, &c->heap[parent])) break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = m;
}

static bpe_merge_cand heap_pop(encode_ctx *c) {
    bpe_merge_cand top = c->heap[0], last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t first = 4 * i + 1, m = i;
        const bpe_merge_cand *best = &last;
        for (size_t k = first; k < first + 4 && k < n; k++)
            if (cand_less(&c->heap[k], best)) m = k, best = &c->heap[k];
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

static void try_pair(encode_ctx *c, int32_t pos) {
    if (pos < 0) return;
    int32_t nx = c->sym[pos].next;
    if (nx < 0) return;
    const tok_merge_entry *e = tok_merges_get(&c->t->merges, c->sym[pos].id, c->sym[nx].id);
    if (e) heap_push(c, (bpe_merge_cand){e->rank, pos, c->sym[pos].id, c->sym[nx].id});
}

static int add_symbol(encode_ctx *c, size_t *ns, int32_t id) {
    bpe_symbol *sym = grow_for_one(c, c->sym, *ns, &c->sym_cap, 256, sizeof *sym);
    if (!sym) return -1;
    c->sym = sym;
    c->sym[*ns] = (bpe_symbol){id, (int32_t)*ns - 1, -1, 1};
    if (*ns > 0) c->sym[*ns - 1].next = (int32_t)*ns;
    (*ns)++;
    return 0;
}

static word_cache_entry *cache_slot(encode_ctx *c, const char *w, size_t n, uint32_t h) {
    size_t i = h & (c->cache_cap - 1);
    for (;; i = (i + 1) & (c->cache_cap - 1)) {
        word_cache_entry *e = &c->cache[i];
        if (!e->w || (e->hash == h && e->n == n && memcmp(e->w, w, n) == 0)) return e;
    }
}

static int cache_grow(encode_ctx *c) {
    size_t cap = c->cache_cap ? c->cache_cap * 2 : 1024;
    word_cache_entry *old = c->cache, *nw = calloc(cap, sizeof *nw);
    if (!nw) return -1;
    size_t old_cap = c->cache_cap;
    c->cache = nw;
    c->cache_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].w) *cache_slot(c, old[i].w, old[i].n, old[i].hash) = old[i];
    free(old);
    return 0;
}

static void bpe_word_uncached(encode_ctx *c, const char *w, size_t n);

static void bpe_word(encode_ctx *c, const char *w, size_t n) {
    if (n == 0) return;
    if (n > WORD_CACHE_MAX_LEN) {
        bpe_word_uncached(c, w, n);
        return;
    }
    if (c->cache_n * 2 >= c->cache_cap && cache_grow(c)) {
        bpe_word_uncached(c, w, n);
        return;
    }
    uint32_t h = (uint32_t)tok_hash(w, n);
    word_cache_entry *e = cache_slot(c, w, n, h);
    if (e->w) {
        for (uint32_t k = 0; k < e->ids_n; k++) push_id(c, c->cache_ids.v[e->ids_off + k]);
        return;
    }
    size_t before = c->out.n;
    bpe_word_uncached(c, w, n);
    if (c->oom) return;
    size_t got = c->out.n - before;
    ids_vec *ci = &c->cache_ids;
    if (ci->n + got > ci->cap) {
        size_t cap = (ci->n + got) * 2 + 256;
        int32_t *p = realloc(ci->v, cap * sizeof(int32_t));
        if (!p) return; /* not cached; the result is already out */
        ci->v = p;
        ci->cap = cap;
    }
    memcpy(ci->v + ci->n, c->out.v + before, got * sizeof(int32_t));
    *e = (word_cache_entry){w, (uint32_t)n, h, (uint32_t)ci->n, (uint32_t)got};
    ci->n += got;
    c->cache_n++;
}

static void bpe_word_uncached(encode_ctx *c, const char *w, size_t n) {
    const tokenizer *t = c->t;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->vocab_map, &t->vocab, w, n);
        if (id >= 0) {
            push_id(c, id);
            return;
        }
    }
    size_t ns = 0, i = 0;
    int last_unk = 0;
    strbuf key = {0};
    while (i < n && !c->oom) {
        size_t adv;
        if (tok_utf8_decode((const uint8_t *)w + i, n - i, &adv) < 0) adv = 1;
        const char *ch = w + i;
        size_t chn = adv;
        if (t->continuing_subword_prefix || (t->end_of_word_suffix && i + adv == n)) {
            strbuf_clear(&key);
            if (t->continuing_subword_prefix && i > 0) strbuf_append_str(&key, t->continuing_subword_prefix);
            strbuf_append(&key, w + i, adv);
            if (t->end_of_word_suffix && i + adv == n) strbuf_append_str(&key, t->end_of_word_suffix);
            ch = key.data;
            chn = key.len;
        }
        i += adv;
        int32_t id = tok_strmap_get(&t->vocab_map, &t->vocab, ch, chn);
        if (id >= 0) {
            add_symbol(c, &ns, id);
            last_unk = 0;
            continue;
        }
        if (t->byte_fallback) {
            int ok = 1;
            for (size_t b = 0; b < adv; b++)
                if (t->byte_token[(uint8_t)w[i - adv + b]] < 0) ok = 0;
            if (ok) {
                for (size_t b = 0; b < adv; b++) add_symbol(c, &ns, t->byte_token[(uint8_t)w[i - adv + b]]);
                last_unk = 0;
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (!(t->fuse_unk && last_unk)) add_symbol(c, &ns, t->unk_id);
            last_unk = 1;
        }
    }
    strbuf_free(&key);
    if (c->oom || ns == 0) return;
    c->heap_n = 0;
    for (size_t s = 0; s + 1 < ns; s++) try_pair(c, (int32_t)s);
    while (c->heap_n > 0 && !c->oom) {
        bpe_merge_cand m = heap_pop(c);
        bpe_symbol *l = &c->sym[m.pos];
        if (!l->alive || l->id != m.left || l->next < 0) continue;
        bpe_symbol *r = &c->sym[l->next];
        if (r->id != m.right) continue;
        const tok_merge_entry *e = tok_merges_get(&t->merges, m.left, m.right);
        l->id = e->result;
        r->alive = 0;
        l->next = r->next;
        if (r->next >= 0) c->sym[r->next].prev = m.pos;
        try_pair(c, l->prev);
        try_pair(c, m.pos);
    }
    for (int32_t s = 0; s >= 0; s = c->sym[s].next) push_id(c, c->sym[s].id);
}

/* ------------------------------------------------------------------------------------------ */
/* Added tokens                                                                                 */

static int is_word_cp(int32_t cp) {
    if (cp < 0) return 0;
    if (cp == '_') return 1;
    utf8proc_category_t k = utf8proc_category(cp);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* Longest added token starting at s[i], or -1; *end gets its end. */
static int32_t trie_longest(const tok_trie *tr, const char *s, size_t n, size_t i, size_t *end) {
    int32_t node = tr->root[(uint8_t)s[i]], best = -1;
    size_t j = i + 1;
    while (node >= 0) {
        if (tr->nodes[node].added >= 0) {
            best = tr->nodes[node].added;
            *end = j;
        }
        if (j >= n) break;
        uint8_t b = (uint8_t)s[j++];
        int32_t ch = tr->nodes[node].first_child;
        while (ch >= 0 && tr->nodes[ch].byte != b) ch = tr->nodes[ch].next_sibling;
        node = ch;
    }
    return best;
}

typedef void (*text_fn)(encode_ctx *c, const char *s, size_t n, int origin);

/* Splits s by the added tokens of tr; text between them goes to fn, tokens become ids. */
static void split_added(encode_ctx *c, const tok_trie *tr, const char *s, size_t n, int origin, text_fn fn) {
    const tokenizer *t = c->t;
    size_t prev = 0, i = 0;
    if (tr->n > 0) {
        while (i < n && !c->oom) {
            size_t end = 0;
            int32_t k = tr->root[(uint8_t)s[i]] >= 0 ? trie_longest(tr, s, n, i, &end) : -1;
            if (k < 0) {
                i++;
                continue;
            }
            const tok_added *a = &t->added[k];
            if (a->single_word) {
                size_t adv;
                int32_t after = end < n ? tok_utf8_decode((const uint8_t *)s + end, n - end, &adv) : -1;
                if (is_word_cp(cp_before(s, i)) || is_word_cp(after)) {
                    i++;
                    continue;
                }
            }
            size_t start = i;
            if (a->lstrip) {
                while (start > prev) {
                    size_t q = start - 1, adv;
                    while (q > prev && ((uint8_t)s[q] & 0xC0) == 0x80) q--;
                    int32_t cp = tok_utf8_decode((const uint8_t *)s + q, start - q, &adv);
                    if (cp < 0 || !tok_is_whitespace((uint32_t)cp)) break;
                    start = q;
                }
            }
            if (a->rstrip) {
                while (end < n) {
                    size_t adv;
                    int32_t cp = tok_utf8_decode((const uint8_t *)s + end, n - end, &adv);
                    if (cp < 0 || !tok_is_whitespace((uint32_t)cp)) break;
                    end += adv;
                }
            }
            if (start > prev) fn(c, s + prev, start - prev, origin && prev == 0);
            push_id(c, a->id);
            prev = i = end;
        }
    }
    if (n > prev || (n == 0 && prev == 0)) fn(c, s + prev, n - prev, origin && prev == 0);
}

static int is_meta_blocker(const tokenizer *t, int32_t cp) {
    size_t lo = 0, hi = (size_t)t->n_meta_blockers;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->meta_blockers[mid] == cp) return 1;
        if (t->meta_blockers[mid] < cp) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

/* SentencePiece-style: a text without pre-tokenizer is one huge word; cut it before each U+2581
 * that no token can straddle (see tokenizer_internal.h) so BPE runs on short, cacheable chunks
 * with the same result. */
static void bpe_text(encode_ctx *c, const char *w, size_t n) {
    const tokenizer *t = c->t;
    if (!t->meta_split || n <= 3) {
        bpe_word(c, w, n);
        return;
    }
    size_t start = 0, i = 0, prev_at = 0, prev_len = 0;
    int32_t prev = -1;
    while (i < n) {
        size_t adv;
        int32_t cp = tok_utf8_decode((const uint8_t *)w + i, n - i, &adv);
        /* a char without its own token becomes <0xXX> or <unk> symbols, whose strings end in
         * other chars: never cut after one */
        if (cp == 0x2581 && i > start && prev != 0x2581 && !is_meta_blocker(t, prev) &&
            tok_strmap_get(&t->vocab_map, &t->vocab, w + prev_at, prev_len) >= 0) {
            bpe_word(c, w + start, i - start);
            start = i;
        }
        prev = cp;
        prev_at = i;
        prev_len = adv;
        i += adv;
    }
    bpe_word(c, w + start, n - start);
}

static void encode_words(encode_ctx *c, const char *s, size_t n, int origin) {
    if (n == 0) return;
    piece_list cur = {0}, next = {0};
    push_piece(c, &cur, s, n, origin);
    pre_tokenize(c, &cur, &next);
    for (size_t i = 0; i < cur.n && !c->oom; i++) bpe_text(c, cur.v[i].s, cur.v[i].len);
    free(cur.v);
    free(next.v);
}

static void encode_raw_segment(encode_ctx *c, const char *s, size_t n, int origin) {
    if (n == 0) return;
    size_t nn = n;
    const char *ns = c->t->n_norms ? normalize(c, s, n, &nn) : s;
    if (c->oom || nn == 0) return;
    split_added(c, &c->t->trie_norm, ns, nn, origin, encode_words);
}

/* ------------------------------------------------------------------------------------------ */
/* Public                                                                                       */

/* Copies text with each invalid UTF-8 byte replaced by U+FFFD; NULL if already valid. */
static char *sanitize_utf8(const char *text, size_t len, size_t *out_len) {
    size_t i = 0, adv;
    while (i < len) {
        if ((uint8_t)text[i] < 0x80) {
            i++;
            continue;
        }
        if (tok_utf8_decode((const uint8_t *)text + i, len - i, &adv) < 0) break;
        i += adv;
    }
    if (i == len) return NULL;
    strbuf sb = {0};
    strbuf_append(&sb, text, i);
    while (i < len) {
        if (tok_utf8_decode((const uint8_t *)text + i, len - i, &adv) < 0) {
            strbuf_append(&sb, "\xEF\xBF\xBD", 3);
            i += 1;
        } else {
            strbuf_append(&sb, text + i, adv);
            i += adv;
        }
    }
    *out_len = sb.len;
    return strbuf_detach(&sb);
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_special_tokens, int32_t **ids_out,
                     char *err, size_t errlen) {
    *ids_out = NULL;
    if (!t || (!text && len)) {
        if (err) snprintf(err, errlen, "tokenizer_encode: no tokenizer or no text");
        return -1;
    }
    size_t clean_len = len;
    char *clean = text ? sanitize_utf8(text, len, &clean_len) : NULL;
    const char *s = clean ? clean : (text ? text : "");
    encode_ctx c = {.t = t};
    c.md = pcre2_match_data_create(8, NULL);
    if (!c.md) c.oom = 1;
    if (add_special_tokens)
        for (int k = 0; k < t->n_post_prefix; k++) push_id(&c, t->post_prefix[k]);
    if (!c.oom) split_added(&c, &t->trie_raw, s, clean_len, 1, encode_raw_segment);
    if (add_special_tokens)
        for (int k = 0; k < t->n_post_suffix; k++) push_id(&c, t->post_suffix[k]);
    pcre2_match_data_free(c.md);
    free(clean);
    free(c.sym);
    free(c.heap);
    free(c.cache);
    free(c.cache_ids.v);
    while (c.arena) {
        arena_block *nx = c.arena->next;
        free(c.arena);
        c.arena = nx;
    }
    if (c.oom) {
        free(c.out.v);
        if (err) snprintf(err, errlen, "tokenizer_encode: out of memory or regex limit on %zu bytes of text", len);
        return -1;
    }
    if (!c.out.v) c.out.v = malloc(sizeof(int32_t));
    *ids_out = c.out.v;
    return (int)c.out.n;
}
