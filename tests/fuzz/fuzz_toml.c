/* libFuzzer target for the TOML reader: any bytes must parse or fail with a message, never
 * crash, leak or read out of bounds; a parsed tree must be walkable. */
#include "base/toml.h"

#include <stddef.h>
#include <stdint.h>

static size_t walk(const toml_value *v, int depth) {
    size_t n = 1;
    if (depth > 200) return n;
    if (v->type == TOML_ARRAY)
        for (size_t i = 0; i < v->u.array.n; i++) n += walk(v->u.array.items[i], depth + 1);
    if (v->type == TOML_TABLE)
        for (size_t i = 0; i < v->u.table.n; i++) n += walk(v->u.table.values[i], depth + 1);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[128];
    toml_value *v = toml_parse((const char *)data, size, err, sizeof err);
    if (v) {
        walk(v, 0);
        const char *s;
        toml_get_string(v, "model_id", &s);
        toml_free(v);
    }
    return 0;
}
