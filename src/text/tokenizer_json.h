/* tokenizer_json — strict streaming reads of the big members of tokenizer.json (model.vocab,
 * model.merges) without building a JSON tree. Private to src/text/tokenizer*.c. */
#ifndef EXO_TEXT_TOKENIZER_JSON_H
#define EXO_TEXT_TOKENIZER_JSON_H

#include <stddef.h>

typedef struct tok_json_spans {
    size_t vocab, vocab_len;   /* byte span of model.vocab when it is an object (len 0: absent) */
    size_t merges, merges_len; /* byte span of model.merges when it is an array (len 0: absent) */
} tok_json_spans;

/* Validates the whole document's syntax and finds the spans. -1 (with *err_at the byte offset)
 * on malformed JSON. */
int tok_json_find_spans(const char *s, size_t n, tok_json_spans *sp, size_t *err_at);

/* Calls fn for each member of the vocab object: decoded key and integer value. A non-zero
 * return from fn stops with that value; a non-integer value stops with -2. */
typedef int (*tok_json_entry_fn)(void *user, const char *key, size_t klen, long long value);
int tok_json_vocab(const char *s, size_t n, tok_json_entry_fn fn, void *user);

/* Calls fn for each merge, "a b" strings split at the first space or ["a", "b"] pairs; an element
 * of another shape, or a string without a space, gives a == NULL or b == NULL. */
typedef int (*tok_json_merge_fn)(void *user, size_t index, const char *a, size_t alen, const char *b, size_t blen);
int tok_json_merges(const char *s, size_t n, tok_json_merge_fn fn, void *user);

#endif
