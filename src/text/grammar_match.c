/* grammar_match — running a compiled grammar: states as sets of interned parser stacks, byte
 * steps, the vocabulary trie and the cached token masks (see grammar.h).
 *
 * A stack is a linked list of interned nodes (element position, node below), so the states the
 * output passes through are small sorted arrays of node ids that compare and hash cheaply. What
 * follows a top node once its byte matched (pop finished rules, expand the next rule reference
 * into its alternatives) is computed once per node and kept: a byte step is then a bit test and
 * a copy per stack. Refuses: growing past GRAMMAR_MAX_NODES stacks (deeply nested output of a
 * recursive grammar); the stacks that would need more are dropped. */
#include "text/grammar_internal.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

#define GRAMMAR_MAX_NODES (1 << 22)
#define GRAMMAR_MAX_STACKS 1024       /* parses one state may hold */
#define GRAMMAR_MASK_WORK (20u << 20) /* stack steps one mask may take (~0.1 s) */
#define MASK_CACHE_BYTES (8u << 20)   /* per grammar */

struct grammar_state {
    grammar *g;
    int32_t *set; /* sorted node ids */
    int n, cap;
};

struct grammar_vocab {
    int n_vocab, n_words;
    uint8_t *blob;       /* token bytes, concatenated */
    uint32_t *off, *len; /* [n_vocab] */
    int32_t *eos;
    int n_eos;
    /* trie of token bytes in preorder: node i is byte[i] at depth[i] (1 = first byte); its
     * subtree ends before skip[i]; tokens sorted[tok_begin[i] ..+ tok_count[i]] end there */
    int n_nodes, max_depth;
    uint8_t *byte;
    uint16_t *depth;
    int32_t *skip, *tok_begin, *tok_count, *sorted;
    /* big subtrees (>= BIG_SUBTREE tokens): big[i] indexes below_bytes (the bytes of every node
     * under node i, 256 bits) and tok_range (its tokens: sorted[lo..hi)), else -1 */
    int32_t *big;
    uint64_t (*below_bytes)[4];
    int32_t (*tok_range)[2];
    int n_big;
};

#define BIG_SUBTREE 32

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) abort(); /* as strbuf: nothing to do without memory for the matcher */
    return q;
}

/* ------------------------------------------------------------------ interned stacks */

static uint64_t node_hash(int32_t pos, int32_t parent) {
    uint64_t h = (uint64_t)(uint32_t)pos * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uint32_t)parent;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static void index_insert(grammar *g, int32_t id) {
    size_t mask = (size_t)g->index_cap - 1;
    size_t i = node_hash(g->nodes[id].pos, g->nodes[id].parent) & mask;
    while (g->node_index[i] >= 0)
        i = (i + 1) & mask;
    g->node_index[i] = id;
}

static int grow_nodes(grammar *g) {
    if (g->n_nodes < g->cap_nodes) return 0;
    if (g->cap_nodes >= GRAMMAR_MAX_NODES) {
        g->overflow = 1;
        return -1;
    }
    int cap = g->cap_nodes ? g->cap_nodes * 2 : 1024;
    g->nodes = xrealloc(g->nodes, sizeof *g->nodes * (size_t)cap);
    g->after_off = xrealloc(g->after_off, sizeof *g->after_off * (size_t)cap);
    g->after_len = xrealloc(g->after_len, sizeof *g->after_len * (size_t)cap);
    g->mark = xrealloc(g->mark, sizeof *g->mark * (size_t)cap);
    g->expand_mark = xrealloc(g->expand_mark, sizeof *g->expand_mark * (size_t)cap);
    memset(g->mark + g->cap_nodes, 0, sizeof *g->mark * (size_t)(cap - g->cap_nodes));
    memset(g->expand_mark + g->cap_nodes, 0, sizeof *g->expand_mark * (size_t)(cap - g->cap_nodes));
    g->cap_nodes = cap;
    g->index_cap = cap * 2;
    g->node_index = xrealloc(g->node_index, sizeof *g->node_index * (size_t)g->index_cap);
    memset(g->node_index, -1, sizeof *g->node_index * (size_t)g->index_cap);
    for (int32_t i = 0; i < g->n_nodes; i++)
        index_insert(g, i);
    return 0;
}

/* The id of node (pos, parent), made if new; -1 past the node limit. */
static int32_t intern(grammar *g, int32_t pos, int32_t parent) {
    if (!g->cap_nodes && grow_nodes(g)) return -1;
    size_t mask = (size_t)g->index_cap - 1;
    for (size_t i = node_hash(pos, parent) & mask;; i = (i + 1) & mask) {
        int32_t id = g->node_index[i];
        if (id < 0) break;
        if (g->nodes[id].pos == pos && g->nodes[id].parent == parent) return id;
    }
    if (grow_nodes(g)) return -1;
    int32_t id = g->n_nodes++;
    g->nodes[id] = (grammar_node){pos, parent};
    g->after_off[id] = -1;
    g->after_len[id] = 0;
    index_insert(g, id);
    return id;
}

static void ensure_empty_stack(grammar *g) {
    if (!g->n_nodes) intern(g, -1, -1); /* node 0: the empty stack */
}

static void list_add(id_list *l, int32_t id) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = xrealloc(l->v, sizeof *l->v * (size_t)l->cap);
    }
    l->v[l->n++] = id;
}

/* Adds to out the top nodes reached from "at element pos, with parent below": a byte element
 * is a top; an END pops to the element after the parent's reference (the empty stack: node 0);
 * a reference pushes each alternative of its rule. No left recursion (grammar_parse refused it),
 * so this ends. */
static void expand(grammar *g, int32_t pos, int32_t parent, id_list *out) {
    while (g->elements[pos].kind == GRAMMAR_END && parent != 0) {
        pos = g->nodes[parent].pos + 1;
        parent = g->nodes[parent].parent;
    }
    const grammar_element *e = &g->elements[pos];
    int32_t id = -1;
    if (e->kind == GRAMMAR_END)
        id = 0;
    else if (e->kind == GRAMMAR_BYTES)
        id = intern(g, pos, parent);
    if (e->kind != GRAMMAR_REF) {
        if (id >= 0 && g->expand_mark[id] != g->expand_gen) {
            g->expand_mark[id] = g->expand_gen;
            list_add(out, id);
        }
        return;
    }
    /* a reference last in its alternative returns straight to the parent (a tail call): no
     * frame for it, so right recursion (x* is R ::= x R) keeps stacks, and states, from
     * growing with every repetition */
    int32_t below = g->elements[pos + 1].kind == GRAMMAR_END ? parent : intern(g, pos, parent);
    if (below < 0) return;
    int r = e->value;
    for (int a = 0; a < g->alt_count[r]; a++)
        expand(g, g->alt_start[g->alt_first[r] + a], below, out);
}

static void expand_begin(grammar *g) {
    if (++g->expand_gen == 0) { /* wrapped: clear the stamps */
        memset(g->expand_mark, 0, sizeof *g->expand_mark * (size_t)g->cap_nodes);
        g->expand_gen = 1;
    }
}

/* The successors of top node id once its byte matched: offset into after_pool and count. */
static void after(grammar *g, int32_t id, int32_t *off, int32_t *len) {
    if (g->after_off[id] < 0) {
        id_list out = {0};
        expand_begin(g);
        expand(g, g->nodes[id].pos + 1, g->nodes[id].parent, &out);
        if (g->after_n + (size_t)out.n > g->after_cap) {
            g->after_cap = (g->after_cap + (size_t)out.n) * 2;
            g->after_pool = xrealloc(g->after_pool, sizeof *g->after_pool * g->after_cap);
        }
        if (out.n) memcpy(g->after_pool + g->after_n, out.v, sizeof *out.v * (size_t)out.n);
        g->after_off[id] = (int32_t)g->after_n;
        g->after_len[id] = out.n;
        g->after_n += (size_t)out.n;
        free(out.v);
    }
    *off = g->after_off[id];
    *len = g->after_len[id];
}

static int node_takes(const grammar *g, int32_t id, uint8_t byte) {
    if (id == 0) return 0;
    const uint64_t *set = g->byte_sets[g->elements[g->nodes[id].pos].value];
    return (int)(set[byte >> 6] >> (byte & 63)) & 1;
}

static void mark_begin(grammar *g) {
    if (++g->mark_gen == 0) {
        memset(g->mark, 0, sizeof *g->mark * (size_t)g->cap_nodes);
        g->mark_gen = 1;
    }
}

/* Sets out to the state after `byte` from the n_in ids of in (unsorted, no duplicates). A
 * grammar so ambiguous that one state would hold more than GRAMMAR_MAX_STACKS parses (nested
 * repetitions of repetitions) gets none: the output cannot continue, rather than the engine
 * thread working for minutes. */
static void step(grammar *g, const int32_t *in, int n_in, uint8_t byte, id_list *out) {
    out->n = 0;
    if (n_in > GRAMMAR_MAX_STACKS) return;
    g->work += (uint64_t)n_in;
    mark_begin(g);
    for (int i = 0; i < n_in; i++) {
        int32_t id = in[i];
        if (!node_takes(g, id, byte)) continue;
        int32_t off, len;
        after(g, id, &off, &len);
        for (int k = 0; k < len; k++) {
            int32_t s = g->after_pool[off + k];
            if (g->mark[s] == g->mark_gen) continue;
            g->mark[s] = g->mark_gen;
            list_add(out, s);
        }
    }
    if (out->n > GRAMMAR_MAX_STACKS) {
        g->overflow = 1;
        out->n = 0;
    }
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* ------------------------------------------------------------------ states */

grammar_state *grammar_state_new(grammar *g) {
    ensure_empty_stack(g);
    if (!g->start) {
        id_list out = {0};
        expand_begin(g);
        for (int a = 0; a < g->alt_count[g->root]; a++)
            expand(g, g->alt_start[g->alt_first[g->root] + a], 0, &out);
        if (out.n) qsort(out.v, (size_t)out.n, sizeof *out.v, cmp_id);
        g->start = out.v ? out.v : xrealloc(NULL, sizeof *g->start);
        g->n_start = out.n;
    }
    grammar_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->g = grammar_ref(g);
    s->cap = g->n_start + 8;
    s->set = xrealloc(NULL, sizeof *s->set * (size_t)s->cap);
    memcpy(s->set, g->start, sizeof *s->set * (size_t)g->n_start);
    s->n = g->n_start;
    return s;
}

void grammar_state_free(grammar_state *s) {
    if (!s) return;
    grammar_unref(s->g);
    free(s->set);
    free(s);
}

int grammar_state_advance(grammar_state *s, const uint8_t *bytes, size_t n) {
    grammar *g = s->g;
    id_list cur = {0}, next = {0};
    for (int i = 0; i < s->n; i++)
        list_add(&cur, s->set[i]);
    for (size_t i = 0; i < n && cur.n; i++) {
        step(g, cur.v, cur.n, bytes[i], &next);
        id_list t = cur;
        cur = next;
        next = t;
    }
    free(next.v);
    if (!cur.n) {
        free(cur.v);
        return -1;
    }
    qsort(cur.v, (size_t)cur.n, sizeof *cur.v, cmp_id);
    free(s->set);
    s->set = cur.v;
    s->n = cur.n;
    s->cap = cur.cap;
    return 0;
}

int grammar_state_accepting(const grammar_state *s) {
    return s->n > 0 && s->set[0] == 0; /* sorted: node 0 first */
}

int grammar_state_finished(const grammar_state *s) {
    return s->n == 1 && s->set[0] == 0;
}

/* ------------------------------------------------------------------ vocabulary */

typedef struct sort_ctx {
    const grammar_vocab *v;
} sort_ctx;

static int cmp_token_bytes(const void *a, const void *b, void *ctx) {
    const grammar_vocab *v = ((const sort_ctx *)ctx)->v;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->blob + v->off[x], v->blob + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

/* For every subtree holding BIG_SUBTREE tokens or more: which bytes occur under its root and
 * which tokens it holds (a contiguous run of the sorted tokens: the trie is in sorted order).
 * A mask walk takes such a subtree whole when every byte under it keeps the state where it is
 * (inside an unbounded JSON string: every plain ASCII byte). */
static void mark_big_subtrees(grammar_vocab *v) {
    size_t n = (size_t)(v->n_nodes ? v->n_nodes : 1);
    v->big = xrealloc(NULL, sizeof *v->big * n);
    int32_t *before = xrealloc(NULL, sizeof *before * (n + 1)); /* tokens ending before node j */
    before[0] = 0;
    for (int j = 0; j < v->n_nodes; j++)
        before[j + 1] = before[j] + v->tok_count[j];
    int cap = 0;
    for (int i = 0; i < v->n_nodes; i++) {
        v->big[i] = -1;
        int lo = before[i], hi = before[v->skip[i]];
        if (hi - lo < BIG_SUBTREE) continue;
        if (v->n_big == cap) {
            cap = cap ? cap * 2 : 256;
            v->below_bytes = xrealloc(v->below_bytes, sizeof *v->below_bytes * (size_t)cap);
            v->tok_range = xrealloc(v->tok_range, sizeof *v->tok_range * (size_t)cap);
        }
        uint64_t *set = v->below_bytes[v->n_big];
        memset(set, 0, sizeof v->below_bytes[0]);
        for (int j = i + 1; j < v->skip[i]; j++)
            set[v->byte[j] >> 6] |= 1ull << (v->byte[j] & 63);
        v->tok_range[v->n_big][0] = lo;
        v->tok_range[v->n_big][1] = hi;
        v->big[i] = v->n_big++;
    }
    free(before);
}

static void build_trie(grammar_vocab *v) {
    int n_tok = 0;
    v->sorted = xrealloc(NULL, sizeof *v->sorted * (size_t)v->n_vocab);
    for (int i = 0; i < v->n_vocab; i++)
        if (v->len[i]) v->sorted[n_tok++] = i;
    sort_ctx ctx = {v};
    qsort_r(v->sorted, (size_t)n_tok, sizeof *v->sorted, cmp_token_bytes, &ctx);
    size_t cap = 1024;
    v->byte = xrealloc(NULL, cap);
    v->depth = xrealloc(NULL, sizeof *v->depth * cap);
    v->tok_begin = xrealloc(NULL, sizeof *v->tok_begin * cap);
    v->tok_count = xrealloc(NULL, sizeof *v->tok_count * cap);
    int32_t *path = NULL; /* path[d]: node of the current token's prefix of length d */
    size_t path_cap = 0;
    int n = 0;
    for (int k = 0; k < n_tok; k++) {
        int32_t t = v->sorted[k];
        const uint8_t *s = v->blob + v->off[t];
        uint32_t len = v->len[t], common = 0;
        if (k) {
            int32_t p = v->sorted[k - 1];
            uint32_t lp = v->len[p];
            const uint8_t *ps = v->blob + v->off[p];
            while (common < len && common < lp && ps[common] == s[common])
                common++;
        }
        if (len + 1 > path_cap) {
            path_cap = (len + 1) * 2;
            path = xrealloc(path, sizeof *path * path_cap);
        }
        for (uint32_t d = common; d < len; d++) {
            if ((size_t)n == cap) {
                cap *= 2;
                v->byte = xrealloc(v->byte, cap);
                v->depth = xrealloc(v->depth, sizeof *v->depth * cap);
                v->tok_begin = xrealloc(v->tok_begin, sizeof *v->tok_begin * cap);
                v->tok_count = xrealloc(v->tok_count, sizeof *v->tok_count * cap);
            }
            v->byte[n] = s[d];
            v->depth[n] = (uint16_t)(d + 1);
            v->tok_begin[n] = 0;
            v->tok_count[n] = 0;
            path[d + 1] = n++;
        }
        int32_t end = path[len];
        if (!v->tok_count[end]) v->tok_begin[end] = k;
        v->tok_count[end]++;
        if ((int)len > v->max_depth) v->max_depth = (int)len;
    }
    free(path);
    v->n_nodes = n;
    v->skip = xrealloc(NULL, sizeof *v->skip * (size_t)(n ? n : 1));
    int32_t *stack = xrealloc(NULL, sizeof *stack * (size_t)(v->max_depth + 1));
    int sp = 0;
    for (int i = 0; i < n; i++) {
        while (sp && v->depth[stack[sp - 1]] >= v->depth[i])
            v->skip[stack[--sp]] = i;
        stack[sp++] = i;
    }
    while (sp)
        v->skip[stack[--sp]] = n;
    free(stack);
    mark_big_subtrees(v);
}

grammar_vocab *grammar_vocab_new(int n_vocab, const uint8_t *const *token_bytes,
                                 const uint32_t *token_lens, int n_tokens, const int32_t *eos_ids,
                                 int n_eos, char *err, size_t errlen) {
    if (n_vocab <= 0 || n_tokens < 0 || n_eos < 0) {
        error_set(err, errlen, "grammar vocabulary: bad sizes (%d logits, %d tokens)", n_vocab,
                  n_tokens);
        return NULL;
    }
    grammar_vocab *v = calloc(1, sizeof *v);
    v->n_vocab = n_vocab;
    v->n_words = (n_vocab + 63) / 64;
    v->off = calloc((size_t)n_vocab, sizeof *v->off);
    v->len = calloc((size_t)n_vocab, sizeof *v->len);
    size_t total = 0;
    for (int i = 0; i < n_tokens && i < n_vocab; i++)
        total += token_lens[i];
    v->blob = xrealloc(NULL, total);
    size_t at = 0;
    for (int i = 0; i < n_tokens && i < n_vocab; i++) {
        v->off[i] = (uint32_t)at;
        v->len[i] = token_lens[i] > 0xffff ? 0 : token_lens[i]; /* absurd tokens: never */
        if (v->len[i]) memcpy(v->blob + at, token_bytes[i], v->len[i]); /* none: may be NULL */
        at += v->len[i];
    }
    v->eos = xrealloc(NULL, sizeof *v->eos * (size_t)(n_eos ? n_eos : 1));
    for (int i = 0; i < n_eos; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < n_vocab) {
            v->eos[v->n_eos++] = eos_ids[i];
            v->len[eos_ids[i]] = 0; /* an eos id ends the output, its text never appears */
        }
    build_trie(v);
    return v;
}

void grammar_vocab_free(grammar_vocab *v) {
    if (!v) return;
    free(v->blob);
    free(v->off);
    free(v->len);
    free(v->eos);
    free(v->byte);
    free(v->depth);
    free(v->skip);
    free(v->tok_begin);
    free(v->tok_count);
    free(v->sorted);
    free(v->big);
    free(v->below_bytes);
    free(v->tok_range);
    free(v);
}

int grammar_vocab_size(const grammar_vocab *v) {
    return v->n_vocab;
}

const uint8_t *grammar_vocab_token(const grammar_vocab *v, int32_t id, uint32_t *len) {
    if (id < 0 || id >= v->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = v->len[id];
    return v->blob + v->off[id];
}

int grammar_vocab_is_eos(const grammar_vocab *v, int32_t id) {
    for (int i = 0; i < v->n_eos; i++)
        if (v->eos[i] == id) return 1;
    return 0;
}

/* ------------------------------------------------------------------ interned states */

#define MAX_SETS (1 << 14) /* past this many states (16 MB of transitions), start over */

static uint64_t set_hash(const int32_t *set, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint32_t)set[i]) * 1099511628211ull;
    return h ^ (h >> 31);
}

static void masks_clear(grammar *g) {
    for (int k = 0; k < g->n_sets; k++) {
        free(g->set_mask[k]);
        g->set_mask[k] = NULL;
    }
    g->n_masks = 0;
}

/* Forgets every interned set (states hold node ids, not set ids, so nothing dangles). */
static void sets_clear(grammar *g) {
    masks_clear(g);
    g->epoch++; /* every set id held anywhere is void */
    g->n_sets = 0;
    g->set_pool_n = 0;
    if (g->set_index) memset(g->set_index, -1, sizeof *g->set_index * (size_t)g->set_index_cap);
}

static void set_index_insert(grammar *g, int32_t k) {
    size_t mask = (size_t)g->set_index_cap - 1;
    size_t i = set_hash(g->set_pool + g->set_off[k], g->set_len[k]) & mask;
    while (g->set_index[i] >= 0)
        i = (i + 1) & mask;
    g->set_index[i] = k;
}

/* The id of the sorted node set ids[0..n). */
static int32_t intern_set(grammar *g, const int32_t *ids, int n) {
    if (g->set_index_cap) {
        size_t mask = (size_t)g->set_index_cap - 1;
        for (size_t i = set_hash(ids, n) & mask;; i = (i + 1) & mask) {
            int32_t k = g->set_index[i];
            if (k < 0) break;
            if (g->set_len[k] == n &&
                !memcmp(g->set_pool + g->set_off[k], ids, sizeof *ids * (size_t)n))
                return k;
        }
    }
    if (g->n_sets >= (g->max_sets ? g->max_sets : MAX_SETS)) sets_clear(g);
    if (g->n_sets == g->cap_sets) {
        int cap = g->cap_sets ? g->cap_sets * 2 : 256;
        g->set_off = xrealloc(g->set_off, sizeof *g->set_off * (size_t)cap);
        g->set_len = xrealloc(g->set_len, sizeof *g->set_len * (size_t)cap);
        g->set_mask = xrealloc(g->set_mask, sizeof *g->set_mask * (size_t)cap);
        g->trans = xrealloc(g->trans, sizeof *g->trans * 256 * (size_t)cap);
        g->cap_sets = cap;
        g->set_index_cap = cap * 2;
        g->set_index = xrealloc(g->set_index, sizeof *g->set_index * (size_t)g->set_index_cap);
        memset(g->set_index, -1, sizeof *g->set_index * (size_t)g->set_index_cap);
        for (int32_t k = 0; k < g->n_sets; k++)
            set_index_insert(g, k);
    }
    if (g->set_pool_n + (size_t)n > g->set_pool_cap) {
        g->set_pool_cap = (g->set_pool_n + (size_t)n) * 2;
        g->set_pool = xrealloc(g->set_pool, sizeof *g->set_pool * g->set_pool_cap);
    }
    int32_t k = g->n_sets++;
    if (n) memcpy(g->set_pool + g->set_pool_n, ids, sizeof *ids * (size_t)n);
    g->set_off[k] = (int32_t)g->set_pool_n;
    g->set_len[k] = n;
    g->set_pool_n += (size_t)n;
    g->set_mask[k] = NULL;
    for (int b = 0; b < 256; b++)
        g->trans[(size_t)k * 256 + (size_t)b] = -2;
    set_index_insert(g, k);
    return k;
}

/* The set after `byte` from set k, or -1 when no stack takes it. May start the tables over
 * (then the returned id belongs to the new tables: callers re-intern what they hold). */
static int32_t transition(grammar *g, int32_t k, uint8_t byte) {
    int32_t t = g->trans[(size_t)k * 256 + byte];
    if (t != -2) return t;
    step(g, g->set_pool + g->set_off[k], g->set_len[k], byte, &g->step_out);
    if (!g->step_out.n)
        t = -1;
    else {
        qsort(g->step_out.v, (size_t)g->step_out.n, sizeof *g->step_out.v, cmp_id);
        uint32_t epoch = g->epoch;
        t = intern_set(g, g->step_out.v, g->step_out.n);
        if (g->epoch != epoch) return t; /* the tables started over: k is gone */
    }
    g->trans[(size_t)k * 256 + byte] = t;
    return t;
}

/* ------------------------------------------------------------------ masks */

/* 1 when every byte under big subtree b leads set k back to itself (so every token there ends
 * in k), 0 when one does not; -1 when finding out started the tables over. */
static int subtree_stays(grammar *g, const grammar_vocab *v, int b, int32_t k) {
    const uint64_t *below = v->below_bytes[b];
    uint32_t epoch = g->epoch;
    for (int w = 0; w < 4; w++)
        for (uint64_t bits = below[w]; bits; bits &= bits - 1) {
            int32_t t = transition(g, k, (uint8_t)(w * 64 + __builtin_ctzll(bits)));
            if (g->epoch != epoch) return -1;
            if (t != k) return 0;
        }
    return 1;
}

/* The walk: a trie node's state is its parent's after the node's byte (one table read once
 * known); no state prunes the subtree. */
/* Returns 0, or -1 when the tables started over during the walk (the caller walks again). */
static int compute_mask(grammar *g, const grammar_vocab *v, int32_t start, uint64_t *bits) {
    memset(bits, 0, sizeof *bits * (size_t)v->n_words);
    if (g->level_cap < v->max_depth + 2) {
        g->level_cap = v->max_depth + 2;
        g->level = xrealloc(g->level, sizeof *g->level * (size_t)g->level_cap);
    }
    int accepting = g->set_len[start] && g->set_pool[g->set_off[start]] == 0;
    uint32_t epoch = g->epoch;
    g->level[0] = start;
    uint64_t work_start = g->work;
    for (int i = 0; i < v->n_nodes;) {
        if (g->work - work_start > GRAMMAR_MASK_WORK) { /* far past any sane grammar */
            g->overflow = 1;
            memset(bits, 0, sizeof *bits * (size_t)v->n_words);
            return 0;
        }
        int d = v->depth[i];
        int32_t next = transition(g, g->level[d - 1], v->byte[i]);
        if (g->epoch != epoch) return -1;
        if (next < 0) {
            i = v->skip[i];
            continue;
        }
        g->level[d] = next;
        int stays = v->big[i] >= 0 ? subtree_stays(g, v, v->big[i], next) : 0;
        if (stays < 0) return -1;
        if (stays) { /* every token under node i ends in this same state: all allowed */
            for (int k = v->tok_range[v->big[i]][0]; k < v->tok_range[v->big[i]][1]; k++) {
                int32_t t = v->sorted[k];
                bits[t >> 6] |= 1ull << (t & 63);
            }
            i = v->skip[i];
            continue;
        }
        for (int k = 0; k < v->tok_count[i]; k++) {
            int32_t t = v->sorted[v->tok_begin[i] + k];
            bits[t >> 6] |= 1ull << (t & 63);
        }
        i++;
    }
    if (accepting)
        for (int k = 0; k < v->n_eos; k++)
            bits[v->eos[k] >> 6] |= 1ull << (v->eos[k] & 63);
    return 0;
}

const uint64_t *grammar_state_mask(grammar_state *s, const grammar_vocab *v) {
    grammar *g = s->g;
    if (g->mask_vocab != v) {
        masks_clear(g);
        g->mask_vocab = v;
        size_t per = sizeof(uint64_t) * (size_t)v->n_words;
        g->max_masks = (int)(MASK_CACHE_BYTES / per) > 4 ? (int)(MASK_CACHE_BYTES / per) : 4;
    }
    for (int attempt = 0; attempt < 3; attempt++) {
        int32_t k = intern_set(g, s->set, s->n);
        if (g->set_mask[k]) return g->set_mask[k];
        if (g->n_masks >= g->max_masks) masks_clear(g); /* the states of the moment come back */
        uint64_t *bits = xrealloc(NULL, sizeof *bits * (size_t)v->n_words);
        if (compute_mask(g, v, k, bits) == 0) {
            g->set_mask[k] = bits;
            g->n_masks++;
            return bits;
        }
        free(bits); /* the tables started over during the walk (k is void): on fresh ones */
    }
    return NULL;
}

void grammar_set_state_limit(grammar *g, int max_states) {
    g->max_sets = max_states > 1 ? max_states : 2;
}

int grammar_state_accept_token(grammar_state *s, const grammar_vocab *v, int32_t id) {
    if (grammar_vocab_is_eos(v, id)) return grammar_state_accepting(s) ? 0 : -1;
    uint32_t len;
    const uint8_t *bytes = grammar_vocab_token(v, id, &len);
    if (!len) return -1;
    return grammar_state_advance(s, bytes, len);
}

void grammar_match_free(grammar *g) {
    masks_clear(g);
    free(g->set_pool);
    free(g->set_off);
    free(g->set_len);
    free(g->set_mask);
    free(g->trans);
    free(g->set_index);
    free(g->level);
    free(g->nodes);
    free(g->node_index);
    free(g->after_off);
    free(g->after_len);
    free(g->after_pool);
    free(g->mark);
    free(g->expand_mark);
    free(g->start);
    free(g->step_out.v);
}
