/* toml — a small TOML reader for the subset exo's model cards use: tables ([a.b]), dotted and
 * quoted keys, basic strings with escapes, literal strings, integers (decimal/hex/octal/binary,
 * underscores), floats (incl. inf/nan), booleans, arrays, inline tables and comments.
 *
 * It refuses (with an error naming the line) multi-line strings, dates/times and arrays of
 * tables ([[x]]): cards do not use them. It never writes TOML. Every byte is untrusted: bad
 * input yields NULL and a message "line N: ...", never a crash. Nesting is capped at 64. */
#ifndef EXO_BASE_TOML_H
#define EXO_BASE_TOML_H

#include <stddef.h>
#include <stdint.h>

enum toml_type { TOML_STRING, TOML_INTEGER, TOML_FLOAT, TOML_BOOLEAN, TOML_ARRAY, TOML_TABLE };

typedef struct toml_value toml_value;
struct toml_value {
    enum toml_type type;
    union {
        struct {
            char *data; /* NUL-terminated UTF-8; may contain NUL via \u0000 (len says) */
            size_t len;
        } string;
        int64_t integer;
        double floating;
        int boolean;
        struct {
            toml_value **items;
            size_t n, cap;
        } array;
        struct {
            char **keys;
            toml_value **values;
            size_t n, cap;
            int explicit_header; /* defined by a [header] (not just implied by a dotted key) */
            int is_inline;       /* an inline table { } — closed to later additions */
        } table;
    } u;
};

/* Parses text[0..len). Returns the root table (free with toml_free) or NULL with a message
 * "line N: what is wrong" in err. */
toml_value *toml_parse(const char *text, size_t len, char *err, size_t errlen);
void toml_free(toml_value *v);

/* Looks a key up in a table; `path` is dot-separated plain keys ("storage_size.in_bytes").
 * NULL when absent or when a step is not a table. */
const toml_value *toml_get(const toml_value *table, const char *path);
/* Typed getters: return 0 and set *out when the key exists with that type (integers are also
 * accepted by toml_get_double), -1 otherwise. */
int toml_get_string(const toml_value *table, const char *path, const char **out);
int toml_get_int(const toml_value *table, const char *path, int64_t *out);
int toml_get_double(const toml_value *table, const char *path, double *out);
int toml_get_bool(const toml_value *table, const char *path, int *out);

#endif
