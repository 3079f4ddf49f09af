/* grammar — constrained decoding: a GBNF grammar (the dialect of llama.cpp's `grammar`
 * parameter) compiled to a byte-level pushdown automaton, and the per-step mask of the tokens of a
 * vocabulary that can continue a valid output.
 *
 * GBNF: `name ::= alternatives` rules (`root` is the start), "literals" (escapes \n \r \t \\ \"
 * \xHH \uHHHH \UHHHHHHHH), [character classes] with ranges and ^ negation, `.` (any character),
 * ( groups ), `|`, postfix `*` `+` `?` `{m}` `{m,}` `{m,n}`, `#` comments. Matching is over the
 * UTF-8 bytes of the output: character classes become byte sequences, so a token may end in the
 * middle of a character.
 *
 * A state is a set of parser stacks (interned, so equal states are equal pointers-to-ids); the
 * mask of a state walks a trie of the vocabulary's token bytes once, pruning every subtree no
 * stack can enter, and is cached per state in the grammar: JSON output revisits the same states
 * (inside a string, after a comma) at every step and in every request with the same grammar.
 *
 * A grammar with its caches is used by one thread at a time (the engine's sampling thread).
 * Refuses: left-recursive rules (they would expand forever), undefined rules, grammars past
 * GRAMMAR_MAX_ELEMENTS elements; all with a message naming the rule or the offset. */
#ifndef EXO_TEXT_GRAMMAR_H
#define EXO_TEXT_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_MAX_ELEMENTS 1000000 /* after expanding repetitions */
#define GRAMMAR_MAX_REPEAT 10000     /* m and n of x{m,n} */

typedef struct grammar grammar;
typedef struct grammar_state grammar_state;
typedef struct grammar_vocab grammar_vocab;

/* Compiles GBNF text. Returns NULL with err ("line 3: ..." / "rule 'x' ...") on bad input.
 * The result has one reference. */
grammar *grammar_parse(const char *text, size_t len, char *err, size_t errlen);
grammar *grammar_ref(grammar *g);
void grammar_unref(grammar *g);
/* Elements and rules after expansion (for tests and size limits). */
int grammar_n_rules(const grammar *g);

/* The start state (before any output). NULL only when out of memory. Holds a reference to g. */
grammar_state *grammar_state_new(grammar *g);
void grammar_state_free(grammar_state *s);
/* Consumes bytes. Returns 0, or -1 when they cannot continue a valid output (or the grammar's
 * stack limit was reached): then the state is unchanged. */
int grammar_state_advance(grammar_state *s, const uint8_t *bytes, size_t n);
/* 1 when the output so far is complete (a whole `root`). */
int grammar_state_accepting(const grammar_state *s);
/* 1 when no byte can follow (complete and nothing may be added). */
int grammar_state_finished(const grammar_state *s);

/* The vocabulary a mask is computed over: the bytes of each token (tokens with none, such as
 * special tokens, are never allowed) and the end-of-sequence ids, allowed once the output is
 * complete. n_vocab is the model's logit count (may exceed the token count). */
grammar_vocab *grammar_vocab_new(int n_vocab, const uint8_t *const *token_bytes,
                                 const uint32_t *token_lens, int n_tokens, const int32_t *eos_ids,
                                 int n_eos, char *err, size_t errlen);
void grammar_vocab_free(grammar_vocab *v);
int grammar_vocab_size(const grammar_vocab *v);
/* The bytes of token id (len 0: a token the grammar never allows). */
const uint8_t *grammar_vocab_token(const grammar_vocab *v, int32_t id, uint32_t *len);
int grammar_vocab_is_eos(const grammar_vocab *v, int32_t id);

/* The tokens that may come next from state s: bit t of the result (64-bit words, little end
 * first; (n_vocab + 63) / 64 of them) is set when token t can continue a valid output, or t is an
 * eos id and the output is complete. The result is owned by the grammar's cache and valid until
 * the next call on any state of the same grammar. NULL when out of memory. */
const uint64_t *grammar_state_mask(grammar_state *s, const grammar_vocab *v);
/* How many states a grammar interns (with their transitions and masks) before it forgets them
 * all and starts over (default 16384). For tests: a tiny limit makes every walk start over. */
void grammar_set_state_limit(grammar *g, int max_states);
/* Consumes a token (its bytes; an eos id consumes nothing). Returns 0 or -1 as advance. */
int grammar_state_accept_token(grammar_state *s, const grammar_vocab *v, int32_t id);

#endif
