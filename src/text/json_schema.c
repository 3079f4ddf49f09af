/* json_schema — see json_schema.h. Each sub-schema becomes one rule `sN ::= ...`; shared pieces
 * (strings, numbers, any JSON value) are fixed rules emitted once at the end. Property lists
 * with optional members use two rules per position (nothing written yet / something written, so
 * the comma goes only between members): linear in the number of properties, where listing every
 * subset would be exponential. */
#include "text/json_schema.h"

#include "base/error.h"
#include "base/strbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_INT_DIGITS 16 /* digits of an unbounded integer part or fraction */

typedef struct ref_rule {
    const json_t *root;
    char *ref;
    int rule;
} ref_rule;

typedef struct compiler {
    strbuf rules;
    int next_rule;
    const json_t *root; /* $ref resolution */
    ref_rule *refs;
    int n_refs, cap_refs;
    int depth;
    char *err;
    size_t errlen;
    int failed;
} compiler;

/* Fixed rules every grammar may use (unused ones are harmless). */
static const char fixed_rules[] =
    "ws ::= \" \"?\n"
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ( string \":\" ws value ( \",\" ws string \":\" ws value )* )? \"}\"\n"
    "array ::= \"[\" ( value ( \",\" ws value )* )? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CefEF] hex hex "
    "hex "
    "| [dD] [0-7] hex hex ) )\n"
    "hex ::= [0-9a-fA-F]\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "number ::= integer ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "patchar ::= [^\"\\\\\\x00-\\x1f]\n"
    "date ::= [0-9]{4} \"-\" ( ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | \"1\" [0-9] | "
    "\"2\" [0-8] ) | ( \"0\" [13-9] | \"1\" [0-2] ) \"-\" ( \"29\" | \"30\" ) | ( \"0\" [13578] | "
    "\"1\" [02] ) \"-31\" )\n"
    "time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,3} "
    ")? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"
    "uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n"
    "email ::= [a-z0-9]{1,20} ( \".\" [a-z0-9]{1,20} )? \"@\" [a-z0-9]{1,20} \".\" [a-z]{2,6}\n"
    "octet ::= [0-9] | [1-9] [0-9] | \"1\" [0-9] [0-9] | \"2\" [0-4] [0-9] | \"25\" [0-5]\n"
    "ipv4 ::= octet \".\" octet \".\" octet \".\" octet\n";

static const char *const annotations[] = {
    "title",    "description", "default",          "examples",  "$schema", "$id",
    "$comment", "deprecated",  "readOnly",         "writeOnly", "$defs",   "definitions",
    "strict",   "$anchor",     "contentMediaType", NULL};

static const char *const known[] = {"type",
                                    "enum",
                                    "const",
                                    "properties",
                                    "required",
                                    "additionalProperties",
                                    "items",
                                    "prefixItems",
                                    "minItems",
                                    "maxItems",
                                    "anyOf",
                                    "oneOf",
                                    "allOf",
                                    "$ref",
                                    "minLength",
                                    "maxLength",
                                    "pattern",
                                    "format",
                                    "minimum",
                                    "maximum",
                                    "exclusiveMinimum",
                                    "exclusiveMaximum",
                                    NULL};

static int in_list(const char *const *list, const char *key) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], key)) return 1;
    return 0;
}

__attribute__((format(printf, 3, 4))) static void fail(compiler *c, const char *where,
                                                       const char *fmt, ...) {
    if (c->failed) return;
    c->failed = 1;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    error_set(c->err, c->errlen, "%s at '%s'", msg, where);
}

/* s as a GBNF literal: "..." with quote, backslash and control bytes escaped. */
static void gbnf_literal(strbuf *out, const char *s, size_t n) {
    strbuf_append_char(out, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            strbuf_append_char(out, '\\');
            strbuf_append_char(out, (char)ch);
        } else if (ch < 0x20 || ch == 0x7f)
            strbuf_appendf(out, "\\x%02x", ch);
        else
            strbuf_append_char(out, (char)ch);
    }
    strbuf_append_char(out, '"');
}

/* A JSON value as the GBNF literal of its compact text. */
static void json_literal(strbuf *out, const json_t *v) {
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    gbnf_literal(out, text ? text : "null", text ? strlen(text) : 4);
    free(text);
}

static int rule_new(compiler *c) {
    return c->next_rule++;
}

static void rule_emit(compiler *c, int rule, const char *body) {
    strbuf_appendf(&c->rules, "s%d ::= %s\n", rule, body);
}

static void path_join(char *out, size_t n, const char *path, const char *a, const char *b) {
    snprintf(out, n, "%s/%s%s%s", path, a, b ? "/" : "", b ? b : "");
}

static int compile(compiler *c, const json_t *schema, const char *path);

/* ------------------------------------------------------------------ integers */

static void append_digit_range(strbuf *out, int lo, int hi) {
    if (lo == hi)
        strbuf_appendf(out, "\"%d\"", lo);
    else
        strbuf_appendf(out, "[%d-%d]", lo, hi);
}

/* Alternatives matching the decimal strings from a to b, both of n digits (may start with 0). */
static void same_length_range(strbuf *out, const char *a, const char *b, int n) {
    if (n == 0) {
        strbuf_append_str(out, "\"\"");
        return;
    }
    if (a[0] == b[0]) {
        strbuf_appendf(out, "\"%c\" ( ", a[0]);
        same_length_range(out, a + 1, b + 1, n - 1);
        strbuf_append_str(out, " )");
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n);
    memset(zeros, '0', (size_t)n);
    int rest_low_is_min = !strncmp(a + 1, zeros, (size_t)n - 1);
    int rest_high_is_max = !strncmp(b + 1, nines, (size_t)n - 1);
    int lo = a[0] - '0' + (rest_low_is_min ? 0 : 1), hi = b[0] - '0' - (rest_high_is_max ? 0 : 1);
    strbuf_append_str(out, "( ");
    int any = 0;
    if (!rest_low_is_min) {
        strbuf_appendf(out, "\"%c\" ( ", a[0]);
        same_length_range(out, a + 1, nines, n - 1);
        strbuf_append_str(out, " )");
        any = 1;
    }
    if (lo <= hi) {
        if (any) strbuf_append_str(out, " | ");
        append_digit_range(out, lo, hi);
        if (n > 1) strbuf_appendf(out, " [0-9]{%d}", n - 1);
        any = 1;
    }
    if (!rest_high_is_max) {
        if (any) strbuf_append_str(out, " | ");
        strbuf_appendf(out, "\"%c\" ( ", b[0]);
        same_length_range(out, zeros, b + 1, n - 1);
        strbuf_append_str(out, " )");
    }
    strbuf_append_str(out, " )");
}

static int digits_of(unsigned long long v) {
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static unsigned long long pow10u(int n) {
    unsigned long long p = 1;
    while (n-- > 0)
        p *= 10;
    return p;
}

/* Alternatives matching the non-negative integers in [lo, hi] without leading zeros. */
static void magnitude_range(strbuf *out, unsigned long long lo, unsigned long long hi) {
    int first = 1;
    while (lo <= hi) {
        int n = digits_of(lo);
        unsigned long long top = n >= 19 ? hi : pow10u(n) - 1;
        if (top > hi) top = hi;
        char a[24], b[24];
        snprintf(a, sizeof a, "%llu", lo);
        snprintf(b, sizeof b, "%llu", top); /* n digits too: lo <= top < 10^n */
        if (!first) strbuf_append_str(out, " | ");
        same_length_range(out, a, b, n);
        first = 0;
        if (top == hi) break;
        lo = top + 1;
    }
}

/* The integers in [lo, hi] (has_lo/has_hi 0: unbounded, within 16 digits). */
static void integer_range(strbuf *out, int has_lo, long long lo, int has_hi, long long hi) {
    const long long big = 9999999999999999LL;
    if (!has_lo || lo < -big) lo = -big;
    if (!has_hi || hi > big) hi = big;
    strbuf_append_str(out, "( ");
    int any = 0;
    if (hi >= 0) {
        magnitude_range(out, (unsigned long long)(lo > 0 ? lo : 0), (unsigned long long)hi);
        any = 1;
    }
    if (lo < 0) {
        if (any) strbuf_append_str(out, " | ");
        strbuf_append_str(out, "\"-\" ( ");
        magnitude_range(out, (unsigned long long)(hi < 0 ? -hi : 1), (unsigned long long)-lo);
        strbuf_append_str(out, " )");
    }
    strbuf_append_str(out, " )");
}

typedef struct bounds {
    int has_lo, has_hi, lo_exclusive, hi_exclusive;
    double lo, hi;
} bounds;

static int read_bounds(compiler *c, const json_t *s, const char *path, bounds *b) {
    memset(b, 0, sizeof *b);
    const json_t *v;
    if ((v = json_object_get(s, "minimum"))) b->has_lo = 1, b->lo = json_number_value(v);
    if ((v = json_object_get(s, "maximum"))) b->has_hi = 1, b->hi = json_number_value(v);
    if ((v = json_object_get(s, "exclusiveMinimum")) && json_is_number(v) &&
        (!b->has_lo || json_number_value(v) >= b->lo))
        b->has_lo = b->lo_exclusive = 1, b->lo = json_number_value(v);
    if ((v = json_object_get(s, "exclusiveMaximum")) && json_is_number(v) &&
        (!b->has_hi || json_number_value(v) <= b->hi))
        b->has_hi = b->hi_exclusive = 1, b->hi = json_number_value(v);
    const char *names[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++)
        if ((v = json_object_get(s, names[i])) && !json_is_number(v)) {
            fail(c, path, "'%s' must be a number", names[i]);
            return -1;
        }
    if ((b->has_lo && fabs(b->lo) > 1e15) || (b->has_hi && fabs(b->hi) > 1e15)) {
        fail(c, path, "%s", "number bounds beyond 1e15 are not supported");
        return -1;
    }
    return 0;
}

/* The integer bounds of b: the least and greatest integers inside. */
static void integer_bounds(const bounds *b, long long *lo, long long *hi) {
    *lo = 0;
    *hi = 0;
    if (b->has_lo) {
        double x = ceil(b->lo);
        if (b->lo_exclusive && x == b->lo) x += 1;
        *lo = (long long)x;
    }
    if (b->has_hi) {
        double x = floor(b->hi);
        if (b->hi_exclusive && x == b->hi) x -= 1;
        *hi = (long long)x;
    }
}

static void compile_integer(compiler *c, const json_t *s, const char *path, strbuf *body) {
    bounds b;
    if (read_bounds(c, s, path, &b)) return;
    if (!b.has_lo && !b.has_hi) {
        strbuf_append_str(body, "integer");
        return;
    }
    long long lo, hi;
    integer_bounds(&b, &lo, &hi);
    if (b.has_lo && b.has_hi && lo > hi) {
        fail(c, path, "%s", "no integer lies between the bounds");
        return;
    }
    integer_range(body, b.has_lo, lo, b.has_hi, hi);
}

/* Bounded numbers: the integers inside, and k.fraction where the whole interval (k, k+1) is
 * inside (so every fraction is valid). No exponents. */
static void compile_number(compiler *c, const json_t *s, const char *path, strbuf *body) {
    bounds b;
    if (read_bounds(c, s, path, &b)) return;
    if (!b.has_lo && !b.has_hi) {
        strbuf_append_str(body, "number");
        return;
    }
    long long lo, hi;
    integer_bounds(&b, &lo, &hi);
    const long long big = 9999999999999999LL;
    if (!b.has_lo) lo = -big;
    if (!b.has_hi) hi = big;
    /* k.f with k >= 0 lies in (k, k+1): k >= lo and k + 1 <= hi bound (inclusive of both ends
     * is fine: the value never equals them). Negative -k.f lies in (-k-1, -k). */
    double lo_v = b.has_lo ? b.lo : -1e16, hi_v = b.has_hi ? b.hi : 1e16;
    long long pos_lo = (long long)ceil(lo_v > 0 ? lo_v : 0), pos_hi = (long long)floor(hi_v) - 1;
    long long neg_lo = (long long)ceil(-hi_v > 0 ? -hi_v : 0), neg_hi = (long long)floor(-lo_v) - 1;
    int alts = 0;
    strbuf_append_str(body, "( ");
    if (lo <= hi) {
        integer_range(body, 1, lo, 1, hi);
        alts++;
    }
    if (pos_lo <= pos_hi) {
        strbuf_append_str(body, alts++ ? " | " : "");
        integer_range(body, 1, pos_lo, 1, pos_hi);
        strbuf_append_str(body, " \".\" [0-9]{0,15} [1-9]");
    }
    if (neg_lo <= neg_hi) {
        strbuf_append_str(body, alts++ ? " | " : "");
        strbuf_append_str(body, "\"-\" ");
        integer_range(body, 1, neg_lo, 1, neg_hi);
        strbuf_append_str(body, " \".\" [0-9]{0,15} [1-9]");
    }
    strbuf_append_str(body, " )");
    if (!alts)
        fail(c, path, "%s", "the number bounds are too narrow (no integer or whole unit inside)");
}

/* ------------------------------------------------------------------ strings */

typedef struct cp_range {
    long lo, hi;
} cp_range;

typedef struct range_set {
    cp_range *v;
    int n, cap;
} range_set;

static void range_add(range_set *r, long lo, long hi) {
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 8;
        r->v = realloc(r->v, sizeof *r->v * (size_t)r->cap);
        if (!r->v) abort();
    }
    r->v[r->n++] = (cp_range){lo, hi};
}

static int cmp_cp(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Emits a GBNF class of the code points of r (negated if negate), never a quote, backslash
 * or control character (those need JSON escapes; patterns get them only as literals). Returns
 * the number of ranges written (0: the class is empty, nothing written). */
static int emit_class(strbuf *out, range_set *r, int negate) {
    qsort(r->v, (size_t)r->n, sizeof *r->v, cmp_cp);
    range_set merged = {0}, chosen = {0};
    for (int i = 0; i < r->n; i++) {
        if (merged.n && r->v[i].lo <= merged.v[merged.n - 1].hi + 1) {
            if (r->v[i].hi > merged.v[merged.n - 1].hi) merged.v[merged.n - 1].hi = r->v[i].hi;
        } else
            range_add(&merged, r->v[i].lo, r->v[i].hi);
    }
    if (negate) {
        long next = 0;
        for (int i = 0; i < merged.n; i++) {
            if (merged.v[i].lo > next) range_add(&chosen, next, merged.v[i].lo - 1);
            next = merged.v[i].hi + 1;
        }
        if (next <= 0x10ffff) range_add(&chosen, next, 0x10ffff);
    } else {
        for (int i = 0; i < merged.n; i++)
            range_add(&chosen, merged.v[i].lo, merged.v[i].hi);
    }
    static const long forbidden[][2] = {{0, 0x1f}, {'"', '"'}, {'\\', '\\'}, {0xd800, 0xdfff}};
    strbuf text = {0};
    int written = 0;
    for (int i = 0; i < chosen.n; i++) {
        long cur = chosen.v[i].lo, hi = chosen.v[i].hi;
        for (int f = 0; f < 4 && cur <= hi; f++) {
            if (forbidden[f][1] < cur) continue;
            if (forbidden[f][0] > hi) break;
            if (forbidden[f][0] > cur) {
                strbuf_appendf(&text, "\\U%08lx-\\U%08lx", cur, forbidden[f][0] - 1);
                written++;
            }
            cur = forbidden[f][1] + 1;
        }
        if (cur <= hi) {
            strbuf_appendf(&text, "\\U%08lx-\\U%08lx", cur, hi);
            written++;
        }
    }
    if (written) strbuf_appendf(out, "[%s]", text.data);
    strbuf_free(&text);
    free(merged.v);
    free(chosen.v);
    return written;
}

typedef struct regex {
    const char *p, *end;
    compiler *c;
    const char *path;
    int depth;
} regex;

static long regex_char(regex *x) {
    const unsigned char *s = (const unsigned char *)x->p;
    unsigned ch = s[0];
    int n = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 1;
    if (x->end - x->p < n) n = 1;
    long cp = n == 1 ? ch : n == 2 ? (ch & 0x1f) : n == 3 ? (ch & 0x0f) : (ch & 0x07);
    for (int i = 1; i < n; i++)
        cp = (cp << 6) | (s[i] & 0x3f);
    x->p += n;
    return cp;
}

/* Adds the ranges of a class escape (\d \w \s); returns 1 if negated (\D \W \S), -1 unknown. */
static int class_escape(char e, range_set *r) {
    switch (e) {
    case 'd':
    case 'D':
        range_add(r, '0', '9');
        break;
    case 'w':
    case 'W':
        range_add(r, '0', '9');
        range_add(r, 'A', 'Z');
        range_add(r, 'a', 'z');
        range_add(r, '_', '_');
        break;
    case 's':
    case 'S':
        range_add(r, ' ', ' ');
        break;
    default:
        return -1;
    }
    return e >= 'A' && e <= 'Z';
}

static long escaped_char(char e) {
    switch (e) {
    case 'n':
        return '\n';
    case 't':
        return '\t';
    case 'r':
        return '\r';
    case 'f':
        return '\f';
    case 'v':
        return '\v';
    }
    if (strchr("\\/.^$|?*+()[]{}-\"'", e)) return e;
    return -1;
}

/* One literal code point of a pattern as JSON string text: quote, backslash and controls as
 * their escapes. */
static void regex_literal(strbuf *out, long cp) {
    char buf[8];
    if (cp == '"')
        strbuf_append_str(out, "\"\\\\\\\"\"");
    else if (cp == '\\')
        strbuf_append_str(out, "\"\\\\\\\\\"");
    else if (cp < 0x20) {
        snprintf(buf, sizeof buf, "%04lx", cp);
        strbuf_appendf(out, "\"\\\\u%s\"", buf);
    } else
        strbuf_appendf(out, "[\\U%08lx]", cp);
}

static void regex_alternatives(regex *x, strbuf *out);

static void regex_class(regex *x, strbuf *out) {
    x->p++; /* [ */
    int negate = 0;
    if (x->p < x->end && *x->p == '^') {
        negate = 1;
        x->p++;
    }
    range_set r = {0};
    int first = 1;
    while (x->p < x->end && (*x->p != ']' || first)) {
        first = 0;
        long lo;
        if (*x->p == '\\' && x->p + 1 < x->end) {
            char e = x->p[1];
            x->p += 2;
            if (class_escape(e, &r) == 1) {
                fail(x->c, x->path, "%s", "negated class escapes inside [...] are not supported");
                break;
            } else if (strchr("dws", e))
                continue;
            lo = escaped_char(e);
            if (lo < 0) {
                fail(x->c, x->path, "unsupported escape '\\%c' in pattern", e);
                break;
            }
        } else
            lo = regex_char(x);
        long hi = lo;
        if (x->end - x->p >= 2 && x->p[0] == '-' && x->p[1] != ']') {
            x->p++;
            if (*x->p == '\\' && x->p + 1 < x->end) {
                hi = escaped_char(x->p[1]);
                x->p += 2;
            } else
                hi = regex_char(x);
            if (hi < lo) {
                fail(x->c, x->path, "%s", "backwards range in a pattern class");
                break;
            }
        }
        range_add(&r, lo, hi);
    }
    if (x->p >= x->end)
        fail(x->c, x->path, "%s", "unterminated [ in pattern");
    else
        x->p++;
    if (!x->c->failed && !emit_class(out, &r, negate))
        fail(x->c, x->path, "%s",
             "a pattern class matches no character a JSON string may hold "
             "unescaped");
    free(r.v);
}

static void regex_atom(regex *x, strbuf *out) {
    char ch = *x->p;
    if (ch == '(') {
        if (++x->depth > 50) {
            fail(x->c, x->path, "%s", "pattern groups nested too deeply");
            return;
        }
        x->p++;
        if (x->end - x->p >= 2 && x->p[0] == '?') {
            if (x->p[1] != ':') {
                fail(x->c, x->path, "%s",
                     "lookaround and named groups are not supported in "
                     "patterns");
                return;
            }
            x->p += 2;
        }
        strbuf_append_str(out, "( ");
        regex_alternatives(x, out);
        x->depth--;
        if (x->p >= x->end || *x->p != ')') {
            fail(x->c, x->path, "%s", "unbalanced ( in pattern");
            return;
        }
        x->p++;
        strbuf_append_str(out, " )");
    } else if (ch == '[') {
        regex_class(x, out);
    } else if (ch == '.') {
        x->p++;
        strbuf_append_str(out, "patchar");
    } else if (ch == '\\') {
        if (x->p + 1 >= x->end) {
            fail(x->c, x->path, "%s", "pattern ends in a backslash");
            return;
        }
        char e = x->p[1];
        x->p += 2;
        range_set r = {0};
        int neg = class_escape(e, &r);
        if (neg >= 0)
            emit_class(out, &r, neg); /* \\d \\w \\s and negations: never empty */
        else {
            long cp = escaped_char(e);
            if (cp < 0)
                fail(x->c, x->path, "unsupported escape '\\%c' in pattern", e);
            else
                regex_literal(out, cp);
        }
        free(r.v);
    } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
        fail(x->c, x->path, "%s", "quantifier without anything before it in pattern");
    } else {
        regex_literal(out, regex_char(x));
    }
}

static void regex_quantifier(regex *x, strbuf *out) {
    if (x->p >= x->end) return;
    char ch = *x->p;
    if (ch == '*' || ch == '+' || ch == '?') {
        strbuf_append_char(out, ch);
        x->p++;
    } else if (ch == '{') {
        const char *close = memchr(x->p, '}', (size_t)(x->end - x->p));
        if (!close) {
            fail(x->c, x->path, "%s", "unterminated { in pattern");
            return;
        }
        /* {m}, {m,} or {m,n} with m <= n <= 10000 (the grammar's own limits) */
        long m = -1, n = -1;
        int comma = 0, digits = 0;
        for (const char *q = x->p + 1; q < close; q++) {
            if (*q == ',' && !comma && digits) {
                comma = 1;
                digits = 0;
            } else if (*q >= '0' && *q <= '9' && digits < 6) {
                long *v = comma ? &n : &m;
                *v = (*v < 0 ? 0 : *v * 10) + (*q - '0');
                digits++;
            } else {
                m = -2;
                break;
            }
        }
        if (m < 0 || m > 10000 || n > 10000 || (n >= 0 && n < m)) {
            fail(x->c, x->path, "%s", "malformed {m,n} in pattern (need m <= n <= 10000)");
            return;
        }
        if (!comma)
            strbuf_appendf(out, "{%ld}", m);
        else if (n < 0)
            strbuf_appendf(out, "{%ld,}", m);
        else
            strbuf_appendf(out, "{%ld,%ld}", m, n);
        x->p = close + 1;
    } else
        return;
    if (x->p < x->end && (*x->p == '?' || *x->p == '+')) x->p++; /* lazy/possessive: same set */
}

static void regex_sequence(regex *x, strbuf *out) {
    int any = 0;
    while (x->p < x->end && *x->p != '|' && *x->p != ')' && !x->c->failed) {
        if (*x->p == '$' && x->p + 1 == x->end) break; /* the end anchor, handled by the caller */
        if (*x->p == '^' || *x->p == '$') {
            fail(x->c, x->path, "%s",
                 "anchors are supported only at the start and end of a "
                 "pattern");
            return;
        }
        strbuf_append_str(out, any ? " " : "");
        regex_atom(x, out);
        regex_quantifier(x, out);
        any = 1;
    }
    if (!any) strbuf_append_str(out, "\"\"");
}

static void regex_alternatives(regex *x, strbuf *out) {
    regex_sequence(x, out);
    while (x->p < x->end && *x->p == '|' && !x->c->failed) {
        x->p++;
        strbuf_append_str(out, " | ");
        regex_sequence(x, out);
    }
}

static void compile_pattern(compiler *c, const char *pattern, const char *path, strbuf *body) {
    regex x = {.p = pattern, .end = pattern + strlen(pattern), .c = c, .path = path};
    int anchored_start = x.p < x.end && *x.p == '^';
    if (anchored_start) x.p++;
    int anchored_end = x.end > x.p && x.end[-1] == '$' && (x.end - x.p < 2 || x.end[-2] != '\\');
    strbuf_append_str(body, "\"\\\"\" ");
    if (!anchored_start) strbuf_append_str(body, "patchar* ");
    strbuf_append_str(body, "( ");
    regex_alternatives(&x, body);
    if (x.p < x.end && !(anchored_end && x.p + 1 == x.end) && !c->failed)
        fail(c, path, "%s", "unbalanced ) in pattern");
    strbuf_append_str(body, " )");
    if (!anchored_end) strbuf_append_str(body, " patchar*");
    strbuf_append_str(body, " \"\\\"\"");
}

static void compile_string(compiler *c, const json_t *s, const char *path, strbuf *body) {
    const json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    const json_t *minl = json_object_get(s, "minLength"), *maxl = json_object_get(s, "maxLength");
    if ((minl && !json_is_integer(minl)) || (maxl && !json_is_integer(maxl))) {
        fail(c, path, "%s", "minLength and maxLength must be integers");
        return;
    }
    long lo = minl ? (long)json_integer_value(minl) : 0,
         hi = maxl ? (long)json_integer_value(maxl) : -1;
    if (fmt) {
        static const char *const formats[] = {"date",  "time", "date-time", "uuid",
                                              "email", "ipv4", NULL};
        const char *f = json_string_value(fmt);
        if (!f || !in_list(formats, f)) {
            fail(c, path,
                 "format '%s' is not supported (supported: date, time, date-time, "
                 "uuid, email, ipv4)",
                 f ? f : "?");
            return;
        }
        if (pat || minl || maxl) {
            fail(c, path, "%s", "format together with pattern or lengths is not supported");
            return;
        }
        strbuf_appendf(body, "\"\\\"\" %s \"\\\"\"",
                       !strcmp(f, "date-time") ? "date \"T\" time" : f);
        return;
    }
    if (pat) {
        if (!json_is_string(pat)) {
            fail(c, path, "%s", "'pattern' must be a string");
            return;
        }
        if (minl || maxl) {
            fail(c, path, "%s", "pattern together with minLength/maxLength is not supported");
            return;
        }
        compile_pattern(c, json_string_value(pat), path, body);
        return;
    }
    if (lo < 0 || (hi >= 0 && hi < lo) || lo > 10000 || hi > 10000) {
        fail(c, path, "%s",
             "minLength/maxLength must satisfy 0 <= minLength <= maxLength <= 10000");
        return;
    }
    if (!minl && !maxl)
        strbuf_append_str(body, "string");
    else if (hi < 0)
        strbuf_appendf(body, "\"\\\"\" char{%ld,} \"\\\"\"", lo);
    else
        strbuf_appendf(body, "\"\\\"\" char{%ld,%ld} \"\\\"\"", lo, hi);
}

/* ------------------------------------------------------------------ objects and arrays */

static int sub_rule(compiler *c, const json_t *schema, const char *path, const char *a,
                    const char *b) {
    char sub[512];
    path_join(sub, sizeof sub, path, a, b);
    return compile(c, schema, sub);
}

static void key_literal(strbuf *out, const char *key) {
    json_t *k = json_string(key);
    json_literal(out, k);
    json_decref(k);
}

static void compile_object(compiler *c, const json_t *s, const char *path, strbuf *body) {
    static const char *const unsupported[] = {
        "patternProperties", "minProperties",    "maxProperties",         "propertyNames",
        "dependentRequired", "dependentSchemas", "unevaluatedProperties", NULL};
    for (int i = 0; unsupported[i]; i++)
        if (json_object_get(s, unsupported[i])) {
            fail(c, path, "unsupported JSON Schema keyword '%s'", unsupported[i]);
            return;
        }
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *extra = json_object_get(s, "additionalProperties");
    if ((props && !json_is_object(props)) || (req && !json_is_array(req)) ||
        (extra && !json_is_object(extra) && !json_is_boolean(extra))) {
        fail(c, path, "%s",
             "'properties' must be an object, 'required' an array and "
             "'additionalProperties' a boolean or a schema");
        return;
    }
    /* members: declared properties in order, then required names not declared */
    const char **names = NULL;
    const json_t **schemas = NULL;
    int *required = NULL, n = 0;
    size_t cap = json_object_size(props) + json_array_size(req) + 1;
    names = calloc(cap, sizeof *names);
    schemas = calloc(cap, sizeof *schemas);
    required = calloc(cap, sizeof *required);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)props, key, v) {
        names[n] = key;
        schemas[n] = v;
        n++;
    }
    size_t i;
    json_array_foreach(req, i, v) {
        const char *name = json_string_value(v);
        if (!name) {
            fail(c, path, "%s", "'required' must list strings");
            goto out;
        }
        int k = 0;
        while (k < n && strcmp(names[k], name))
            k++;
        if (k == n) {
            if (json_is_false(extra)) {
                fail(c, path,
                     "required property '%s' is neither declared nor allowed by "
                     "additionalProperties",
                     name);
                goto out;
            }
            names[n] = name;
            schemas[n] = json_is_object(extra) ? extra : NULL;
            n++;
        }
        required[k] = 1;
    }
    if (n == 0) {
        if (json_is_false(extra))
            strbuf_append_str(body, "\"{}\"");
        else if (json_is_object(extra)) {
            int r = sub_rule(c, extra, path, "additionalProperties", NULL);
            strbuf_appendf(body,
                           "\"{\" ( string \":\" ws s%d ( \",\" ws string \":\" ws s%d )* )? \"}\"",
                           r, r);
        } else
            strbuf_append_str(body, "object");
        goto out;
    }
    /* first[k]: members from k on, none written yet; later[k]: some written (comma first) */
    int base = c->next_rule;
    c->next_rule += 2 * (n + 1);
    for (int k = 0; k < n && !c->failed; k++) {
        int value = schemas[k] ? sub_rule(c, schemas[k], path, "properties", names[k]) : -1;
        strbuf kv = {0};
        key_literal(&kv, names[k]);
        if (value >= 0)
            strbuf_appendf(&kv, " \":\" ws s%d", value);
        else
            strbuf_append_str(&kv, " \":\" ws value");
        strbuf first = {0}, later = {0};
        strbuf_appendf(&first, "%s s%d", kv.data, base + 2 * (k + 1) + 1);
        strbuf_appendf(&later, "\",\" ws %s s%d", kv.data, base + 2 * (k + 1) + 1);
        if (!required[k]) {
            strbuf_appendf(&first, " | s%d", base + 2 * (k + 1));
            strbuf_appendf(&later, " | s%d", base + 2 * (k + 1) + 1);
        }
        rule_emit(c, base + 2 * k, first.data);
        rule_emit(c, base + 2 * k + 1, later.data);
        strbuf_free(&kv);
        strbuf_free(&first);
        strbuf_free(&later);
    }
    rule_emit(c, base + 2 * n, "\"\"");
    rule_emit(c, base + 2 * n + 1, "\"\"");
    strbuf_appendf(body, "\"{\" s%d \"}\"", base);
out:
    free(names);
    free(schemas);
    free(required);
}

static int read_count(compiler *c, const json_t *s, const char *key, const char *path, long *out) {
    const json_t *v = json_object_get(s, key);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 10000) {
        fail(c, path, "'%s' must be an integer in [0, 10000]", key);
        return -1;
    }
    *out = (long)json_integer_value(v);
    return 0;
}

static void compile_array(compiler *c, const json_t *s, const char *path, strbuf *body) {
    static const char *const unsupported[] = {"uniqueItems", "contains",         "minContains",
                                              "maxContains", "unevaluatedItems", NULL};
    for (int i = 0; unsupported[i]; i++) {
        const json_t *u = json_object_get(s, unsupported[i]);
        if (u && !json_is_false(u)) {
            fail(c, path, "unsupported JSON Schema keyword '%s'", unsupported[i]);
            return;
        }
    }
    long lo = 0, hi = -1;
    if (read_count(c, s, "minItems", path, &lo) || read_count(c, s, "maxItems", path, &hi)) return;
    if (hi >= 0 && hi < lo) {
        fail(c, path, "%s", "maxItems is less than minItems");
        return;
    }
    const json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    if ((prefix && !json_is_array(prefix)) ||
        (items && !json_is_object(items) && !json_is_boolean(items))) {
        fail(c, path, "%s", "'prefixItems' must be an array and 'items' a schema");
        return;
    }
    long n_prefix = (long)json_array_size(prefix);
    if (hi >= 0 && n_prefix > hi) n_prefix = hi;
    strbuf_append_str(body, "\"[\" ");
    size_t i;
    const json_t *v;
    int written = 0;
    json_array_foreach(prefix, i, v) {
        if ((long)i >= n_prefix) break;
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        int r = sub_rule(c, v, path, "prefixItems", idx);
        strbuf_appendf(body, "%ss%d ", written++ ? "\",\" ws " : "", r);
    }
    long more_lo = lo > n_prefix ? lo - n_prefix : 0, more_hi = hi < 0 ? -1 : hi - n_prefix;
    if (json_is_false(items) || more_hi == 0) {
        if (more_lo > 0) fail(c, path, "%s", "minItems needs more items than the schema allows");
        strbuf_append_str(body, "\"]\"");
        return;
    }
    int item = items && json_is_object(items) && json_object_size(items)
                   ? sub_rule(c, items, path, "items", NULL)
                   : -1;
    char elem[32];
    snprintf(elem, sizeof elem, item >= 0 ? "s%d" : "value", item);
    if (written) { /* every further item takes a comma */
        if (more_hi < 0)
            strbuf_appendf(body, "( \",\" ws %s ){%ld,}", elem, more_lo);
        else
            strbuf_appendf(body, "( \",\" ws %s ){%ld,%ld}", elem, more_lo, more_hi);
    } else if (more_lo == 0) {
        if (more_hi < 0)
            strbuf_appendf(body, "( %s ( \",\" ws %s )* )?", elem, elem);
        else
            strbuf_appendf(body, "( %s ( \",\" ws %s ){0,%ld} )?", elem, elem, more_hi - 1);
    } else {
        if (more_hi < 0)
            strbuf_appendf(body, "%s ( \",\" ws %s ){%ld,}", elem, elem, more_lo - 1);
        else
            strbuf_appendf(body, "%s ( \",\" ws %s ){%ld,%ld}", elem, elem, more_lo - 1,
                           more_hi - 1);
    }
    strbuf_append_str(body, " \"]\"");
}

/* ------------------------------------------------------------------ schemas */

/* Resolves a local $ref ("#", "#/a/b" with ~0 ~1 escapes) in root. */
static const json_t *resolve_ref(const json_t *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *at = root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        p++;
        char token[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof token) {
            if (p[0] == '~' && p[1] == '0')
                token[n++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1')
                token[n++] = '/', p += 2;
            else
                token[n++] = *p++;
        }
        token[n] = 0;
        if (json_is_object(at))
            at = json_object_get(at, token);
        else if (json_is_array(at)) {
            char *end;
            long k = strtol(token, &end, 10);
            at = *end || k < 0 ? NULL : json_array_get(at, (size_t)k);
        } else
            at = NULL;
    }
    return *p ? NULL : at;
}

static int compile_ref(compiler *c, const char *ref, const char *path) {
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].root == c->root && !strcmp(c->refs[i].ref, ref)) return c->refs[i].rule;
    const json_t *target = resolve_ref(c->root, ref);
    /* a chain of bare $refs that comes back to itself describes no value at all */
    const json_t *hop = target;
    for (int k = 0; k < 64 && json_is_string(json_object_get(hop, "$ref")); k++) {
        hop = resolve_ref(c->root, json_string_value(json_object_get(hop, "$ref")));
        if (hop == target) {
            fail(c, path, "$ref '%s' refers to itself without anything in between", ref);
            return -1;
        }
    }
    if (!target) {
        fail(c, path,
             "$ref '%s' does not point into this schema (only local refs like "
             "#/$defs/Name are supported)",
             ref);
        return -1;
    }
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? c->cap_refs * 2 : 8;
        c->refs = realloc(c->refs, sizeof *c->refs * (size_t)c->cap_refs);
        if (!c->refs) abort();
    }
    int rule = rule_new(c);
    c->refs[c->n_refs++] = (ref_rule){c->root, strdup(ref), rule};
    int inner = compile(c, target, ref);
    char body[32];
    snprintf(body, sizeof body, "s%d", inner);
    if (!c->failed) rule_emit(c, rule, body);
    return rule;
}

static void alternatives(compiler *c, const json_t *list, const char *path, const char *key,
                         strbuf *body) {
    if (!json_is_array(list) || !json_array_size(list)) {
        fail(c, path, "'%s' must be a non-empty array of schemas", key);
        return;
    }
    size_t i;
    const json_t *v;
    json_array_foreach(list, i, v) {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        int r = sub_rule(c, v, path, key, idx);
        strbuf_appendf(body, "%ss%d", i ? " | " : "", r);
    }
}

static const char *infer_type(const json_t *s) {
    static const char *const by_type[][6] = {
        {"object", "properties", "required", "additionalProperties", NULL},
        {"array", "items", "prefixItems", "minItems", "maxItems", NULL},
        {"string", "minLength", "maxLength", "pattern", "format", NULL},
        {"number", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL}};
    for (int t = 0; t < 4; t++)
        for (int k = 1; by_type[t][k]; k++)
            if (json_object_get(s, by_type[t][k])) return by_type[t][0];
    return NULL;
}

static void compile_typed(compiler *c, const json_t *s, const char *type, const char *path,
                          strbuf *body) {
    if (!strcmp(type, "object"))
        compile_object(c, s, path, body);
    else if (!strcmp(type, "array"))
        compile_array(c, s, path, body);
    else if (!strcmp(type, "string"))
        compile_string(c, s, path, body);
    else if (!strcmp(type, "integer"))
        compile_integer(c, s, path, body);
    else if (!strcmp(type, "number"))
        compile_number(c, s, path, body);
    else if (!strcmp(type, "boolean"))
        strbuf_append_str(body, "boolean");
    else if (!strcmp(type, "null"))
        strbuf_append_str(body, "null");
    else
        fail(c, path, "unknown type '%s'", type);
}

static void compile_body(compiler *c, const json_t *s, const char *path, strbuf *body) {
    if (json_is_true(s)) {
        strbuf_append_str(body, "value");
        return;
    }
    if (!json_is_object(s)) {
        fail(c, path, "%s", "a schema must be an object or true");
        return;
    }
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        if (!in_list(known, key) && !in_list(annotations, key)) {
            if (!strcmp(key, "patternProperties") || !strcmp(key, "minProperties") ||
                !strcmp(key, "maxProperties") || !strcmp(key, "uniqueItems") ||
                !strcmp(key, "contains"))
                continue; /* named by the object/array compilers, which know the type */
            fail(c, path, "unsupported JSON Schema keyword '%s'", key);
            return;
        }
    }
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) {
            fail(c, path, "%s", "'$ref' must be a string");
            return;
        }
        int r = compile_ref(c, json_string_value(ref), path);
        strbuf_appendf(body, "s%d", r);
        return;
    }
    if ((v = json_object_get(s, "const"))) {
        json_literal(body, v);
        return;
    }
    if ((v = json_object_get(s, "enum"))) {
        if (!json_is_array(v) || !json_array_size(v)) {
            fail(c, path, "%s", "'enum' must be a non-empty array");
            return;
        }
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) {
            if (i) strbuf_append_str(body, " | ");
            json_literal(body, e);
        }
        return;
    }
    static const char *const combinators[] = {"anyOf", "oneOf", "allOf", NULL};
    for (int k = 0; combinators[k]; k++) {
        if (!json_object_get(s, combinators[k])) continue;
        json_object_foreach((json_t *)s, key, v) {
            if (strcmp(key, combinators[k]) && !in_list(annotations, key)) {
                fail(c, path,
                     "'%s' next to other keywords (here '%s') is not supported: "
                     "move them into each branch",
                     combinators[k], key);
                return;
            }
        }
    }
    if ((v = json_object_get(s, "anyOf")) || (v = json_object_get(s, "oneOf"))) {
        alternatives(c, v, path, json_object_get(s, "anyOf") ? "anyOf" : "oneOf", body);
        return;
    }
    if ((v = json_object_get(s, "allOf"))) {
        if (!json_is_array(v) || json_array_size(v) != 1) {
            fail(c, path, "%s", "'allOf' is supported with exactly one schema");
            return;
        }
        strbuf_appendf(body, "s%d", sub_rule(c, json_array_get(v, 0), path, "allOf", "0"));
        return;
    }
    const json_t *type = json_object_get(s, "type");
    if (json_is_string(type))
        compile_typed(c, s, json_string_value(type), path, body);
    else if (json_is_array(type) && json_array_size(type)) {
        size_t i;
        const json_t *t;
        json_array_foreach(type, i, t) {
            if (!json_is_string(t)) {
                fail(c, path, "%s", "'type' must be a string or an array of strings");
                return;
            }
            strbuf_append_str(body, i ? " | ( " : "( ");
            compile_typed(c, s, json_string_value(t), path, body);
            strbuf_append_str(body, " )");
        }
    } else if (type)
        fail(c, path, "%s", "'type' must be a string or an array of strings");
    else {
        const char *t = infer_type(s);
        if (t)
            compile_typed(c, s, t, path, body);
        else
            strbuf_append_str(body, "value");
    }
}

/* Compiles schema into a new rule; returns its number. */
static int compile(compiler *c, const json_t *schema, const char *path) {
    if (c->failed) return 0;
    if (++c->depth > MAX_DEPTH) {
        fail(c, path, "%s", "schema nested too deeply (over 64 levels)");
        return 0;
    }
    int rule = rule_new(c);
    strbuf body = {0};
    compile_body(c, schema, path, &body);
    if (!c->failed) rule_emit(c, rule, body.data ? body.data : "\"\"");
    strbuf_free(&body);
    c->depth--;
    return rule;
}

static char *finish(compiler *c, int root_rule, const char *root_body) {
    char *out = NULL;
    if (!c->failed) {
        strbuf g = {0};
        if (root_body)
            strbuf_appendf(&g, "root ::= %s\n", root_body);
        else
            strbuf_appendf(&g, "root ::= s%d\n", root_rule);
        strbuf_append(&g, c->rules.data ? c->rules.data : "", c->rules.len);
        strbuf_append_str(&g, fixed_rules);
        out = strbuf_detach(&g);
    }
    strbuf_free(&c->rules);
    for (int i = 0; i < c->n_refs; i++)
        free(c->refs[i].ref);
    free(c->refs);
    return out;
}

char *json_schema_to_grammar(const json_t *schema, char *err, size_t errlen) {
    compiler c = {.err = err, .errlen = errlen, .root = schema};
    if (!schema) return finish(&c, 0, "object");
    int r = compile(&c, schema, "#");
    return finish(&c, r, NULL);
}

char *json_schema_tool_call_grammar(const char *const *names, const json_t *const *schemas, int n,
                                    char *err, size_t errlen) {
    compiler c = {.err = err, .errlen = errlen};
    strbuf root = {0};
    for (int i = 0; i < n && !c.failed; i++) {
        c.root = schemas[i];
        char path[300];
        snprintf(path, sizeof path, "tools[%d]", i);
        int args = schemas[i] ? compile(&c, schemas[i], path) : -1;
        if (root.len) strbuf_append_str(&root, " | ");
        strbuf_append_str(&root, "\"{\\\"name\\\":\" ws ");
        json_t *name = json_string(names[i]);
        json_literal(&root, name);
        json_decref(name);
        if (args >= 0)
            strbuf_appendf(&root, " \",\" ws \"\\\"arguments\\\":\" ws s%d \"}\"", args);
        else
            strbuf_append_str(&root, " \",\" ws \"\\\"arguments\\\":\" ws object \"}\"");
    }
    if (!n) error_set(err, errlen, "no tools to call");
    char *out = n ? finish(&c, 0, root.data) : finish(&c, 0, "\"\"");
    strbuf_free(&root);
    if (!n) {
        free(out);
        return NULL;
    }
    return out;
}
