/* libFuzzer target for the JSON Schema -> grammar compiler: any JSON must compile or fail with a
 * message, and what compiles must be a grammar the GBNF compiler accepts (only a schema that
 * refers to itself before any character, or one too large, may still be refused there): a
 * syntax error would be a bug in the generated text. */
#include "text/grammar.h"
#include "text/json_schema.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t jerr;
    json_t *schema = json_loadb((const char *)data, size, JSON_DECODE_ANY, &jerr);
    if (!schema) return 0;
    char err[512];
    char *text = json_schema_to_grammar(schema, err, sizeof err);
    if (text) {
        grammar *g = grammar_parse(text, strlen(text), err, sizeof err);
        if (!g && !strstr(err, "left-recursive") && !strstr(err, "without matching") &&
            !strstr(err, "too large") && !strstr(err, "matches no character"))
            __builtin_trap();
        if (g) {
            grammar_state *s = grammar_state_new(g);
            grammar_state_advance(s, (const uint8_t *)"{\"a\":1}", 7);
            grammar_state_free(s);
            grammar_unref(g);
        }
        free(text);
    }
    const char *name = "tool";
    const json_t *schemas[1] = {schema};
    char *call = json_schema_tool_call_grammar(&name, schemas, 1, err, sizeof err);
    free(call);
    json_decref(schema);
    return 0;
}
