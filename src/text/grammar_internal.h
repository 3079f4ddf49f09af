/* grammar_internal — the compiled form of a grammar, shared by the GBNF compiler
 * (grammar_parse.c) and the matcher (grammar_match.c). Private to those two files.
 *
 * A grammar is a flat array of elements: rule r has alternatives alt_first[r] ..
 * alt_first[r] + alt_count[r] - 1, and alternative a is the elements from alt_start[a] up to an
 * END. An element matches one byte from a 256-bit set (BYTES) or a whole rule (REF). */
#ifndef EXO_TEXT_GRAMMAR_INTERNAL_H
#define EXO_TEXT_GRAMMAR_INTERNAL_H

#include "text/grammar.h"

#include <stdint.h>

enum { GRAMMAR_END = 0, GRAMMAR_BYTES, GRAMMAR_REF };

typedef struct grammar_element {
    int32_t kind;  /* GRAMMAR_END / _BYTES / _REF */
    int32_t value; /* BYTES: index in byte_sets; REF: rule index */
} grammar_element;

/* One parser stack, interned: `pos` is the element it waits on (a BYTES element at the top of a
 * stack, the REF element being expanded below it), `parent` the node below (0: none). Node 0 is
 * the empty stack: the output is complete. */
typedef struct grammar_node {
    int32_t pos, parent;
} grammar_node;

typedef struct id_list {
    int32_t *v;
    int n, cap;
} id_list;

struct grammar {
    int refs;
    /* compiled form (grammar_parse.c) */
    grammar_element *elements; /* [n_elements] */
    int n_elements;
    int32_t *alt_first, *alt_count; /* [n_rules] */
    int32_t *alt_start;             /* [n_alts] */
    int n_rules, n_alts, root;
    uint64_t (*byte_sets)[4]; /* [n_byte_sets] 256-bit sets */
    int n_byte_sets;
    /* matcher (grammar_match.c): interned stacks and what follows each top node */
    grammar_node *nodes;
    int n_nodes, cap_nodes;
    int32_t *node_index; /* open-addressing table of node ids, [index_cap] (-1 empty) */
    int index_cap;
    int32_t *after_off, *after_len; /* [cap_nodes] successors of a top node once its byte
                                       matched (-1: not computed yet) */
    int32_t *after_pool;
    size_t after_n, after_cap;
    uint32_t *mark, *expand_mark; /* [cap_nodes] generation stamps for de-duplication */
    uint32_t mark_gen, expand_gen;
    int32_t *start; /* the start state's nodes */
    int n_start;
    int overflow;  /* a limit was reached (nodes, stacks per state, work per mask) */
    uint64_t work; /* stack steps taken, for the work limit of a mask */
    id_list step_out;
    /* interned states (sorted node sets) and their byte transitions, so that the trie walk of a
     * mask is one table read per trie node: set k is set_pool[set_off[k] ..+ set_len[k]] */
    int32_t *set_pool;
    size_t set_pool_n, set_pool_cap;
    int32_t *set_off, *set_len; /* [cap_sets] */
    int32_t *trans;             /* [cap_sets][256]: the set after a byte; -1 none, -2 unknown */
    uint64_t **set_mask;        /* [cap_sets]: the cached mask of the set, or NULL */
    int n_sets, cap_sets;
    uint32_t epoch;     /* bumped when the tables start over: held set ids are void */
    int max_sets;       /* 0: the default limit (grammar_set_state_limit) */
    int32_t *set_index; /* open-addressing table of set ids by content, [set_index_cap] */
    int set_index_cap;
    int32_t *level; /* [level_cap]: the set at each trie depth during a walk */
    int level_cap;
    /* masks are for this vocabulary; n_masks of them are held */
    const grammar_vocab *mask_vocab;
    int n_masks, max_masks;
};

/* Frees the matcher's part (grammar_match.c); grammar_unref calls it. */
void grammar_match_free(grammar *g);

#endif
