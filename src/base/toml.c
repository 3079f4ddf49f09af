/* toml — recursive-descent reader for the card subset of TOML (see toml.h for what it refuses).
 * The parser keeps one cursor over the input and a line counter for messages; every value it
 * builds is owned by its parent, so toml_free on the root releases everything. */
#include "base/toml.h"

#include "base/error.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOML_MAX_DEPTH 64

typedef struct parser {
    const char *p, *end;
    int line;
    char *err;
    size_t errlen;
    int failed;
} parser;

static void fail(parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(parser *ps, const char *fmt, ...) {
    if (ps->failed) return;
    ps->failed = 1;
    char where[32];
    snprintf(where, sizeof where, "line %d", ps->line);
    va_list ap;
    va_start(ap, fmt);
    error_vset_at(ps->err, ps->errlen, where, fmt, ap);
    va_end(ap);
}

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) abort(); /* out of memory: nothing sensible to do (same policy as strbuf) */
    return p;
}

static void *xrealloc(void *p, size_t sz) {
    void *q = realloc(p, sz ? sz : 1);
    if (!q) abort();
    return q;
}

static toml_value *value_new(enum toml_type t) {
    toml_value *v = xcalloc(1, sizeof *v);
    v->type = t;
    return v;
}

void toml_free(toml_value *v) {
    if (!v) return;
    switch (v->type) {
    case TOML_STRING:
        free(v->u.string.data);
        break;
    case TOML_ARRAY:
        for (size_t i = 0; i < v->u.array.n; i++) toml_free(v->u.array.items[i]);
        free(v->u.array.items);
        break;
    case TOML_TABLE:
        for (size_t i = 0; i < v->u.table.n; i++) {
            free(v->u.table.keys[i]);
            toml_free(v->u.table.values[i]);
        }
        free(v->u.table.keys);
        free(v->u.table.values);
        break;
    default:
        break;
    }
    free(v);
}

static toml_value *table_find(const toml_value *t, const char *key) {
    for (size_t i = 0; i < t->u.table.n; i++)
        if (!strcmp(t->u.table.keys[i], key)) return t->u.table.values[i];
    return NULL;
}

/* Takes ownership of key and value. */
static void table_add(toml_value *t, char *key, toml_value *v) {
    if (t->u.table.n == t->u.table.cap) {
        t->u.table.cap = t->u.table.cap ? t->u.table.cap * 2 : 8;
        t->u.table.keys = xrealloc(t->u.table.keys, t->u.table.cap * sizeof(char *));
        t->u.table.values = xrealloc(t->u.table.values, t->u.table.cap * sizeof(toml_value *));
    }
    t->u.table.keys[t->u.table.n] = key;
    t->u.table.values[t->u.table.n] = v;
    t->u.table.n++;
}

static void array_add(toml_value *a, toml_value *v) {
    if (a->u.array.n == a->u.array.cap) {
        a->u.array.cap = a->u.array.cap ? a->u.array.cap * 2 : 8;
        a->u.array.items = xrealloc(a->u.array.items, a->u.array.cap * sizeof(toml_value *));
    }
    a->u.array.items[a->u.array.n++] = v;
}

/* ---- lexing helpers ---- */

static int at_end(parser *ps) { return ps->p >= ps->end; }

static void skip_ws(parser *ps) {
    while (!at_end(ps) && (*ps->p == ' ' || *ps->p == '\t')) ps->p++;
}

static void skip_comment(parser *ps) {
    if (!at_end(ps) && *ps->p == '#') {
        while (!at_end(ps) && *ps->p != '\n') {
            unsigned char c = (unsigned char)*ps->p;
            if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f) {
                fail(ps, "control character in comment");
                return;
            }
            ps->p++;
        }
    }
}

/* Consumes an end of line (optionally preceded by spaces/comment). */
static int expect_eol(parser *ps) {
    skip_ws(ps);
    skip_comment(ps);
    if (ps->failed) return -1;
    if (at_end(ps)) return 0;
    if (*ps->p == '\r' && ps->p + 1 < ps->end && ps->p[1] == '\n') ps->p++;
    if (*ps->p == '\n') {
        ps->p++;
        ps->line++;
        return 0;
    }
    fail(ps, "expected end of line, found '%c'", *ps->p);
    return -1;
}

/* Skips blank lines, comments, and whitespace including newlines (for arrays). */
static void skip_ws_nl(parser *ps) {
    for (;;) {
        skip_ws(ps);
        skip_comment(ps);
        if (ps->failed || at_end(ps)) return;
        if (*ps->p == '\r' && ps->p + 1 < ps->end && ps->p[1] == '\n') ps->p++;
        if (*ps->p != '\n') return;
        ps->p++;
        ps->line++;
    }
}

static int is_bare_key_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

static void put_utf8(char **buf, size_t *len, size_t *cap, unsigned long cp) {
    if (*len + 5 > *cap) {
        *cap = (*cap + 5) * 2;
        *buf = xrealloc(*buf, *cap);
    }
    char *o = *buf + *len;
    if (cp < 0x80) {
        o[0] = (char)cp;
        *len += 1;
    } else if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        *len += 2;
    } else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        *len += 3;
    } else {
        o[0] = (char)(0xF0 | (cp >> 18));
        o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (char)(0x80 | (cp & 0x3F));
        *len += 4;
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Parses a "basic" or 'literal' single-line string at the cursor. Returns a malloc'd buffer. */
static char *parse_string(parser *ps, size_t *len_out) {
    char quote = *ps->p;
    if (ps->p + 2 < ps->end && ps->p[1] == quote && ps->p[2] == quote) {
        fail(ps, "multi-line strings are not supported in model cards");
        return NULL;
    }
    ps->p++;
    size_t len = 0, cap = 32;
    char *buf = xcalloc(cap, 1);
    for (;;) {
        if (at_end(ps) || *ps->p == '\n') {
            fail(ps, "unterminated string");
            free(buf);
            return NULL;
        }
        unsigned char c = (unsigned char)*ps->p;
        if (c == (unsigned char)quote) {
            ps->p++;
            break;
        }
        if ((c < 0x20 && c != '\t') || c == 0x7f) {
            fail(ps, "control character in string");
            free(buf);
            return NULL;
        }
        if (c == '\\' && quote == '"') {
            ps->p++;
            if (at_end(ps)) continue; /* reported as unterminated above */
            char e = *ps->p++;
            unsigned long cp = 0;
            int digits = 0;
            switch (e) {
            case 'b': cp = '\b'; break;
            case 't': cp = '\t'; break;
            case 'n': cp = '\n'; break;
            case 'f': cp = '\f'; break;
            case 'r': cp = '\r'; break;
            case 'e': cp = 0x1b; break;
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case 'u': digits = 4; break;
            case 'U': digits = 8; break;
            default:
                fail(ps, "unknown escape '\\%c' in string", e);
                free(buf);
                return NULL;
            }
            for (int i = 0; i < digits; i++) {
                int h = at_end(ps) ? -1 : hexval(*ps->p);
                if (h < 0) {
                    fail(ps, "\\%c escape needs %d hex digits", e, digits);
                    free(buf);
                    return NULL;
                }
                cp = cp * 16 + (unsigned long)h;
                ps->p++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                fail(ps, "escape is not a Unicode scalar value");
                free(buf);
                return NULL;
            }
            put_utf8(&buf, &len, &cap, cp);
            continue;
        }
        if (len + 2 > cap) {
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        buf[len++] = (char)c;
        ps->p++;
    }
    buf[len] = 0;
    *len_out = len;
    return buf;
}

/* One key segment: bare or quoted. */
static char *parse_key_part(parser *ps) {
    skip_ws(ps);
    if (at_end(ps)) {
        fail(ps, "expected a key");
        return NULL;
    }
    if (*ps->p == '"' || *ps->p == '\'') {
        size_t n;
        char *s = parse_string(ps, &n);
        if (s && strlen(s) != n) {
            fail(ps, "key contains a NUL character");
            free(s);
            return NULL;
        }
        return s;
    }
    const char *start = ps->p;
    while (!at_end(ps) && is_bare_key_char(*ps->p)) ps->p++;
    if (ps->p == start) {
        fail(ps, "expected a key, found '%c'", *ps->p);
        return NULL;
    }
    size_t n = (size_t)(ps->p - start);
    char *s = xcalloc(n + 1, 1);
    memcpy(s, start, n);
    return s;
}

/* A dotted key: fills parts (max 64). Returns count, or -1. Caller frees the parts. */
static int parse_key(parser *ps, char **parts, int max) {
    int n = 0;
    for (;;) {
        if (n == max) {
            fail(ps, "key has too many parts");
            goto bad;
        }
        parts[n] = parse_key_part(ps);
        if (!parts[n]) goto bad;
        n++;
        skip_ws(ps);
        if (!at_end(ps) && *ps->p == '.') {
            ps->p++;
            continue;
        }
        return n;
    }
bad:
    for (int i = 0; i < n; i++) free(parts[i]);
    return -1;
}

static toml_value *parse_value(parser *ps, int depth);

static toml_value *parse_number_or_bool(parser *ps) {
    const char *start = ps->p;
    while (!at_end(ps) && (is_bare_key_char(*ps->p) || *ps->p == '+' || *ps->p == '.'))
        ps->p++;
    size_t n = (size_t)(ps->p - start);
    if (n == 0) {
        fail(ps, "expected a value");
        return NULL;
    }
    char tok[128];
    if (n >= sizeof tok) {
        fail(ps, "value too long");
        return NULL;
    }
    memcpy(tok, start, n);
    tok[n] = 0;
    if (!strcmp(tok, "true") || !strcmp(tok, "false")) {
        toml_value *v = value_new(TOML_BOOLEAN);
        v->u.boolean = tok[0] == 't';
        return v;
    }
    const char *t = tok;
    int neg = 0;
    if (*t == '+' || *t == '-') neg = *t++ == '-';
    if (!strcmp(t, "inf") || !strcmp(t, "nan")) {
        toml_value *v = value_new(TOML_FLOAT);
        v->u.floating = t[0] == 'i' ? (neg ? -INFINITY : INFINITY) : NAN;
        return v;
    }
    if (t[0] == '0' && (t[1] == 'x' || t[1] == 'o' || t[1] == 'b')) {
        if (t != tok) {
            fail(ps, "a sign is not allowed on hex/octal/binary integers");
            return NULL;
        }
        int base = t[1] == 'x' ? 16 : t[1] == 'o' ? 8 : 2;
        uint64_t acc = 0;
        const char *q = t + 2;
        int digits = 0, prev_us = 1;
        for (; *q; q++) {
            if (*q == '_') {
                if (prev_us) goto bad_number;
                prev_us = 1;
                continue;
            }
            int d = hexval(*q);
            if (d < 0 || d >= base) goto bad_number;
            if (acc > (UINT64_MAX - (uint64_t)d) / (uint64_t)base || acc * (uint64_t)base + (uint64_t)d > INT64_MAX) {
                fail(ps, "integer out of range");
                return NULL;
            }
            acc = acc * (uint64_t)base + (uint64_t)d;
            digits++;
            prev_us = 0;
        }
        if (!digits || prev_us) goto bad_number;
        toml_value *v = value_new(TOML_INTEGER);
        v->u.integer = (int64_t)acc;
        return v;
    }
    /* decimal integer or float: validate the shape, strip underscores, convert */
    char clean[128];
    size_t cn = 0;
    int is_float = 0, prev_digit = 0, seen_digit = 0;
    if (t != tok) clean[cn++] = tok[0];
    if (t[0] == '0' && t[1] >= '0' && t[1] <= '9') goto bad_number; /* leading zero */
    for (const char *q = t; *q; q++) {
        char c = *q;
        if (c >= '0' && c <= '9') {
            clean[cn++] = c;
            prev_digit = seen_digit = 1;
        } else if (c == '_') {
            if (!prev_digit || !(q[1] >= '0' && q[1] <= '9')) goto bad_number;
            prev_digit = 0;
        } else if (c == '.') {
            if (!prev_digit || !(q[1] >= '0' && q[1] <= '9') || is_float) goto bad_number;
            is_float = 1;
            clean[cn++] = c;
            prev_digit = 0;
        } else if (c == 'e' || c == 'E') {
            if (!prev_digit) goto bad_number;
            is_float = 2;
            clean[cn++] = 'e';
            if (q[1] == '+' || q[1] == '-') clean[cn++] = *++q;
            if (!(q[1] >= '0' && q[1] <= '9')) goto bad_number;
            prev_digit = 0;
        } else {
            goto bad_number;
        }
    }
    clean[cn] = 0;
    if (!seen_digit) goto bad_number;
    errno = 0;
    char *endp;
    if (is_float) {
        double d = strtod(clean, &endp);
        if (*endp) goto bad_number;
        toml_value *v = value_new(TOML_FLOAT);
        v->u.floating = d;
        return v;
    }
    long long ll = strtoll(clean, &endp, 10);
    if (*endp) goto bad_number;
    if (errno == ERANGE) {
        fail(ps, "integer out of range");
        return NULL;
    }
    toml_value *v = value_new(TOML_INTEGER);
    v->u.integer = ll;
    return v;
bad_number:
    if (n >= 10 && tok[4] == '-' && tok[0] >= '0' && tok[0] <= '9')
        fail(ps, "dates and times are not supported in model cards");
    else
        fail(ps, "invalid value '%s'", tok);
    return NULL;
}

static toml_value *parse_array(parser *ps, int depth) {
    ps->p++; /* [ */
    toml_value *a = value_new(TOML_ARRAY);
    for (;;) {
        skip_ws_nl(ps);
        if (ps->failed) break;
        if (at_end(ps)) {
            fail(ps, "unterminated array");
            break;
        }
        if (*ps->p == ']') {
            ps->p++;
            return a;
        }
        toml_value *v = parse_value(ps, depth + 1);
        if (!v) break;
        array_add(a, v);
        skip_ws_nl(ps);
        if (ps->failed) break;
        if (!at_end(ps) && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (!at_end(ps) && *ps->p == ']') {
            ps->p++;
            return a;
        }
        fail(ps, at_end(ps) ? "unterminated array" : "expected ',' or ']' in array");
        break;
    }
    toml_free(a);
    return NULL;
}

static int set_dotted(parser *ps, toml_value *table, char **parts, int n, toml_value *v);

static toml_value *parse_inline_table(parser *ps, int depth) {
    ps->p++; /* { */
    toml_value *t = value_new(TOML_TABLE);
    skip_ws(ps);
    if (!at_end(ps) && *ps->p == '}') {
        ps->p++;
        t->u.table.is_inline = 1;
        return t;
    }
    for (;;) {
        char *parts[TOML_MAX_DEPTH];
        int n = parse_key(ps, parts, TOML_MAX_DEPTH);
        if (n < 0) break;
        skip_ws(ps);
        if (at_end(ps) || *ps->p != '=') {
            fail(ps, "expected '=' after key");
            for (int i = 0; i < n; i++) free(parts[i]);
            break;
        }
        ps->p++;
        skip_ws(ps);
        toml_value *v = parse_value(ps, depth + 1);
        if (!v) {
            for (int i = 0; i < n; i++) free(parts[i]);
            break;
        }
        if (set_dotted(ps, t, parts, n, v) < 0) break;
        skip_ws(ps);
        if (!at_end(ps) && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (!at_end(ps) && *ps->p == '}') {
            ps->p++;
            t->u.table.is_inline = 1;
            return t;
        }
        fail(ps, "expected ',' or '}' in inline table");
        break;
    }
    toml_free(t);
    return NULL;
}

static toml_value *parse_value(parser *ps, int depth) {
    if (depth > TOML_MAX_DEPTH) {
        fail(ps, "values nested more than %d deep", TOML_MAX_DEPTH);
        return NULL;
    }
    if (at_end(ps)) {
        fail(ps, "expected a value");
        return NULL;
    }
    char c = *ps->p;
    if (c == '"' || c == '\'') {
        size_t n;
        char *s = parse_string(ps, &n);
        if (!s) return NULL;
        toml_value *v = value_new(TOML_STRING);
        v->u.string.data = s;
        v->u.string.len = n;
        return v;
    }
    if (c == '[') return parse_array(ps, depth);
    if (c == '{') return parse_inline_table(ps, depth);
    return parse_number_or_bool(ps);
}

/* The table under key *part in t, created when absent (the key's string moves into it: *part
 * becomes NULL). NULL after fail(ps, defined_fmt, key) when the key holds a value or an inline
 * table. */
static toml_value *child_table(parser *ps, toml_value *t, char **part, const char *defined_fmt) {
    toml_value *next = table_find(t, *part);
    if (!next) {
        next = value_new(TOML_TABLE);
        table_add(t, *part, next);
        *part = NULL;
    } else if (next->type != TOML_TABLE || next->u.table.is_inline) {
        fail(ps, defined_fmt, *part);
        return NULL;
    }
    return next;
}

/* Walks/creates intermediate tables for parts[0..n-1] and stores v under the last part.
 * Frees parts; takes v (freed on error). */
static int set_dotted(parser *ps, toml_value *table, char **parts, int n, toml_value *v) {
    toml_value *t = table;
    int rc = -1;
    for (int i = 0; i < n - 1; i++) {
        if (!(t = child_table(ps, t, &parts[i], "key '%s' is already defined as a value"))) goto out;
    }
    if (table_find(t, parts[n - 1])) {
        fail(ps, "duplicate key '%s'", parts[n - 1]);
        goto out;
    }
    table_add(t, parts[n - 1], v);
    parts[n - 1] = NULL;
    v = NULL;
    rc = 0;
out:
    for (int i = 0; i < n; i++) free(parts[i]);
    toml_free(v);
    return rc;
}

/* [a.b.c] — returns the table that following key/values go into. */
static toml_value *open_table(parser *ps, toml_value *root) {
    ps->p++; /* [ */
    if (!at_end(ps) && *ps->p == '[') {
        fail(ps, "arrays of tables ([[...]]) are not supported in model cards");
        return NULL;
    }
    char *parts[TOML_MAX_DEPTH];
    int n = parse_key(ps, parts, TOML_MAX_DEPTH);
    if (n < 0) return NULL;
    toml_value *t = root, *result = NULL;
    skip_ws(ps);
    if (at_end(ps) || *ps->p != ']') {
        fail(ps, "expected ']' to close the table header");
        goto out;
    }
    ps->p++;
    for (int i = 0; i < n; i++) {
        int existed = table_find(t, parts[i]) != NULL;
        toml_value *next = child_table(ps, t, &parts[i], "'%s' is already defined as a value");
        if (!next) goto out;
        if (existed && i == n - 1 && next->u.table.explicit_header) {
            fail(ps, "table [%s] is defined twice", parts[i]);
            goto out;
        }
        t = next;
    }
    t->u.table.explicit_header = 1;
    result = t;
out:
    for (int i = 0; i < n; i++) free(parts[i]);
    return result;
}

toml_value *toml_parse(const char *text, size_t len, char *err, size_t errlen) {
    parser ps = {.p = text, .end = text + len, .line = 1, .err = err, .errlen = errlen};
    if (err && errlen) err[0] = 0;
    toml_value *root = value_new(TOML_TABLE);
    root->u.table.explicit_header = 1;
    toml_value *current = root;
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) ps.p += 3; /* UTF-8 BOM */
    while (!ps.failed) {
        skip_ws_nl(&ps);
        if (ps.failed || at_end(&ps)) break;
        if (*ps.p == '[') {
            current = open_table(&ps, root);
            if (!current) break;
        } else {
            char *parts[TOML_MAX_DEPTH];
            int n = parse_key(&ps, parts, TOML_MAX_DEPTH);
            if (n < 0) break;
            skip_ws(&ps);
            if (at_end(&ps) || *ps.p != '=') {
                fail(&ps, "expected '=' after key '%s'", parts[n - 1]);
                for (int i = 0; i < n; i++) free(parts[i]);
                break;
            }
            ps.p++;
            skip_ws(&ps);
            toml_value *v = parse_value(&ps, 1);
            if (!v) {
                for (int i = 0; i < n; i++) free(parts[i]);
                break;
            }
            if (set_dotted(&ps, current, parts, n, v) < 0) break;
        }
        if (expect_eol(&ps) < 0) break;
    }
    if (ps.failed) {
        toml_free(root);
        return NULL;
    }
    return root;
}

const toml_value *toml_get(const toml_value *table, const char *path) {
    if (!table || !path) return NULL;
    const toml_value *t = table;
    char part[256];
    while (*path) {
        if (!t || t->type != TOML_TABLE) return NULL;
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof part) return NULL;
        memcpy(part, path, n);
        part[n] = 0;
        t = table_find(t, part);
        path += n;
        if (*path == '.') path++;
    }
    return t;
}

int toml_get_string(const toml_value *table, const char *path, const char **out) {
    const toml_value *v = toml_get(table, path);
    if (!v || v->type != TOML_STRING) return -1;
    *out = v->u.string.data;
    return 0;
}

int toml_get_int(const toml_value *table, const char *path, int64_t *out) {
    const toml_value *v = toml_get(table, path);
    if (!v || v->type != TOML_INTEGER) return -1;
    *out = v->u.integer;
    return 0;
}

int toml_get_double(const toml_value *table, const char *path, double *out) {
    const toml_value *v = toml_get(table, path);
    if (!v) return -1;
    if (v->type == TOML_FLOAT) *out = v->u.floating;
    else if (v->type == TOML_INTEGER) *out = (double)v->u.integer;
    else return -1;
    return 0;
}

int toml_get_bool(const toml_value *table, const char *path, int *out) {
    const toml_value *v = toml_get(table, path);
    if (!v || v->type != TOML_BOOLEAN) return -1;
    *out = v->u.boolean;
    return 0;
}
