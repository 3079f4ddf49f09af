/* libFuzzer target: the tokenizer.json loader on arbitrary (mostly malformed) JSON. A file that
 * loads is then used to encode and decode a fixed multilingual text, so odd but accepted
 * pipelines (regexes, strip counts, replacement chars, added tokens) are exercised too.
 *   make fuzz && build/fuzz/bin/fuzz_tokenizer_json -max_total_time=300 tests/fuzz/corpus/tokenizer_json */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static const char SAMPLE[] = "Hello  world\t\n123 caf\xc3\xa9 \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80 <s> <|x|> a\xe2\x96\x81" "b";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    /* the config is the tail after a NUL byte, if any */
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    const char *cfg = nul ? (const char *)nul + 1 : NULL;
    size_t clen = nul ? size - jlen - 1 : 0;
    tokenizer *t = tokenizer_load_from_json((const char *)data, jlen, cfg, clen, err, sizeof err);
    if (!t) {
        if (!err[0]) __builtin_trap(); /* a failure must say why */
        return 0;
    }
    int32_t *ids;
    int n = tokenizer_encode(t, SAMPLE, sizeof SAMPLE - 1, 1, &ids, err, sizeof err);
    if (n >= 0) {
        size_t len;
        char *s = tokenizer_decode(t, ids, (size_t)n, 0, &len);
        free(s);
        detokenizer *d = detokenizer_new(t, 1);
        char buf[256];
        for (int i = 0; i < n; i++) detokenizer_push(d, ids[i], buf, sizeof buf);
        while (detokenizer_flush(d, buf, sizeof buf) || detokenizer_pending(d)) {
        }
        detokenizer_free(d);
        free(ids);
    }
    (void)tokenizer_token_id(t, "a");
    (void)tokenizer_chat_template(t);
    tokenizer_free(t);
    return 0;
}
