/* structured — structured outputs in the runner: binds a request's grammar (GBNF text the API
 * compiled from a JSON schema, a forced tool call or the client's own grammar) to the engine's
 * sampling as an engine_constraint.
 *
 * It owns the vocabulary trie of the runner's tokenizer (the bytes of every token, built once)
 * and a small cache of compiled grammars keyed by their text, so requests with the same schema
 * share one grammar and its cached masks. Used from the runner's one thread.
 * Refuses: grammars that do not compile (the request ends with a 400 naming the problem). */
#ifndef EXO_RUNNER_STRUCTURED_H
#define EXO_RUNNER_STRUCTURED_H

#include "infer/engine.h"
#include "text/tokenizer.h"

#include <stddef.h>

typedef struct structured structured;

/* Nothing is built until the first constrained request. */
structured *structured_new(const tokenizer *tok, const engine_info *info);
/* After engine_close (the engine's sequences hold constraints into it). */
void structured_free(structured *s);

/* A fresh constraint for one request following grammar_text. Returns 0, or -1 with err. The
 * engine releases it with the sequence; a caller whose engine_submit failed calls
 * out->release(out->ctx) itself. */
int structured_constraint(structured *s, const char *grammar_text, engine_constraint *out,
                          char *err, size_t errlen);

#endif
