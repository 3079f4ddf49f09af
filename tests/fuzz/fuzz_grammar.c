/* libFuzzer target for the GBNF grammar compiler and matcher: any bytes must compile or fail with
 * a message; a compiled grammar must then run (byte steps, token masks over a small vocabulary
 * with multi-byte and partial UTF-8 tokens, accepting masked tokens) without crashing, leaking or
 * reading out of bounds, and a masked token must always be accepted. */
#include "text/grammar.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static const char *const tokens[] = {
    "{", "}", "\"", "a",  "ab",   "abc",  "0",    "12",   "-",        ".",
    ",", ":", " ",  "\n", "true", "null", "\xc3", "\xa9", "\xc3\xa9", "\xe2\x82\xac",
    "[", "]", "\\", "x",  "yes",  "no",   "\"}",  "\",",
};
#define N_TOKENS (int)(sizeof tokens / sizeof tokens[0])
#define EOS N_TOKENS

static grammar_vocab *vocab(void) {
    static grammar_vocab *v;
    if (!v) {
        const uint8_t *bytes[N_TOKENS];
        uint32_t lens[N_TOKENS];
        for (int i = 0; i < N_TOKENS; i++) {
            bytes[i] = (const uint8_t *)tokens[i];
            lens[i] = (uint32_t)strlen(tokens[i]);
        }
        int32_t eos = EOS;
        v = grammar_vocab_new(N_TOKENS + 1, bytes, lens, N_TOKENS, &eos, 1, NULL, 0);
    }
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the input: grammar text, then after a NUL byte the choices of which tokens to take */
    const uint8_t *nul = memchr(data, 0, size);
    size_t text_len = nul ? (size_t)(nul - data) : size;
    char err[256];
    grammar *g = grammar_parse((const char *)data, text_len, err, sizeof err);
    if (!g) return 0;
    grammar_state *s = grammar_state_new(g);
    const uint8_t *choice = nul ? nul + 1 : data + size, *end = data + size;
    (void)grammar_state_advance(s, choice, (size_t)(end - choice) < 8 ? (size_t)(end - choice) : 8);
    for (int step = 0; step < 32 && choice < end; step++) {
        const uint64_t *mask = grammar_state_mask(s, vocab());
        if (!mask) break;
        int pick = *choice++ % (N_TOKENS + 1), allowed = -1;
        for (int k = 0; k <= N_TOKENS; k++) { /* the first allowed token from pick on */
            int t = (pick + k) % (N_TOKENS + 1);
            if ((mask[t >> 6] >> (t & 63)) & 1) {
                allowed = t;
                break;
            }
        }
        if (allowed < 0 || allowed == EOS) break;
        if (grammar_state_accept_token(s, vocab(), allowed) != 0) __builtin_trap();
    }
    grammar_state_accepting(s);
    grammar_state_free(s);
    grammar_unref(g);
    return 0;
}
