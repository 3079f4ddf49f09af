/* json_schema — JSON Schema -> GBNF grammar (text/grammar.h) for structured outputs: the output
 * of the grammar is compact JSON (an optional space after ':' and ',') that validates against the
 * schema.
 *
 * Supported: type (one or a list), enum, const, properties/required (declared order; optional
 * properties may be left out), additionalProperties (false; a schema or true for objects without
 * properties: a map), items, prefixItems, minItems/maxItems, anyOf, oneOf (branches are not
 * checked for overlap), allOf of one schema, $ref into the same document (#, #/$defs/..,
 * #/definitions/.., recursion allowed), minLength/maxLength, pattern (a regular subset: classes,
 * groups, |, quantifiers, \d \w \s), format (date, time, date-time, uuid, email, ipv4),
 * minimum/maximum/exclusiveMinimum/exclusiveMaximum on integers and numbers, and annotations
 * (title, description, default, examples, ...), which are ignored. Numbers have at most 16
 * digits before and after the point, so a sampler cannot run away in them.
 *
 * Refuses: every other keyword (uniqueItems, multipleOf, patternProperties, not, if/then/else,
 * minProperties, ...), remote $refs, lookaround and backreferences in patterns, with a message
 * naming the keyword and where it is (as a JSON pointer). */
#ifndef EXO_TEXT_JSON_SCHEMA_H
#define EXO_TEXT_JSON_SCHEMA_H

#include <jansson.h>
#include <stddef.h>

/* The grammar (malloc'd GBNF text) of JSON values valid against schema; a NULL schema means
 * any JSON object (OpenAI's json_object mode). NULL with err on an unsupported schema. */
char *json_schema_to_grammar(const json_t *schema, char *err, size_t errlen);

/* The grammar of one tool call {"name": N, "arguments": A} where N is one of names[i] and A
 * validates against schemas[i] (NULL: any object). Each schema resolves its own $refs. */
char *json_schema_tool_call_grammar(const char *const *names, const json_t *const *schemas, int n,
                                    char *err, size_t errlen);

#endif
