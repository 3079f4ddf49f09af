/* stop_strings — cuts generated text at the first stop string, even when the match spans
 * several tokens: text that could still be the start of a stop string is held back until the
 * next piece decides it. Pure string logic, no engine knowledge.
 *
 * It refuses: regex stops and matching inside text already released. */
#ifndef EXO_RUNNER_STOP_STRINGS_H
#define EXO_RUNNER_STOP_STRINGS_H

#include "base/strbuf.h"

#include <stddef.h>

typedef struct stop_strings {
    char **stops; /* owned copies */
    int n;
    strbuf held;  /* text not yet released */
    int matched;  /* index of the stop string that matched, or -1 */
} stop_strings;

/* Copies the n strings (empty ones are ignored). */
void stop_strings_init(stop_strings *s, char *const *stops, int n);
void stop_strings_free(stop_strings *s);
/* Adds generated text; appends to out what is now certain to be output. Returns 1 when a stop
 * string matched: out got the text before it and everything after is dropped (further pushes
 * are ignored). */
int stop_strings_push(stop_strings *s, const char *text, size_t len, strbuf *out);
/* End of generation: releases whatever is held (it did not become a stop string). */
void stop_strings_flush(stop_strings *s, strbuf *out);

#endif
