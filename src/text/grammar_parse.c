/* grammar_parse — GBNF text -> the compiled grammar of grammar_internal.h.
 *
 * Recursive descent over the text. Groups, repetitions and character classes with characters
 * past ASCII become generated rules, so that every element of a sequence matches one byte or one
 * rule. A code-point range becomes the UTF-8 byte sequences that encode it (the split of
 * Russ Cox's utf8 range algorithm), so matching never decodes. After parsing, every rule must be
 * defined and none may be left-recursive (directly or through rules that can match nothing).
 * Refuses: all malformed input, with the line (or the rule) that is wrong. */
#include "text/grammar_internal.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

#define MAX_NESTING 200 /* parentheses inside each other */

typedef struct element_list {
    grammar_element *v;
    int n, cap;
} element_list;

typedef struct rule_def {
    char *name;  /* NULL for generated rules */
    int owner;   /* generated: the named rule it was made in (for messages) */
    int defined; /* named: its `::=` was seen */
    element_list *alts;
    int n_alts, cap_alts;
} rule_def;

typedef struct builder {
    const char *p, *end;
    int line;
    rule_def *rules;
    int n_rules, cap_rules;
    uint64_t (*sets)[4];
    int n_sets, cap_sets;
    int32_t *set_index; /* hash table of set ids, [set_index_cap] (-1: empty) */
    int set_index_cap;
    int32_t single_byte_set[256];
    long n_elements;
    int current; /* the named rule being parsed */
    int depth;
    char *err;
    size_t errlen;
    int failed;
} builder;

static void fail(builder *b, const char *msg) {
    if (!b->failed) error_set(b->err, b->errlen, "grammar line %d: %s", b->line, msg);
    b->failed = 1;
}

static void *grow(void *p, int *cap, int need, size_t elem) {
    if (need <= *cap) return p;
    int c = *cap ? *cap * 2 : 8;
    while (c < need)
        c *= 2;
    void *q = realloc(p, (size_t)c * elem);
    if (!q) abort(); /* as strbuf: no progress without memory for the grammar */
    *cap = c;
    return q;
}

static void list_push(builder *b, element_list *l, int kind, int value) {
    if (++b->n_elements > GRAMMAR_MAX_ELEMENTS) {
        fail(b, "grammar too large (over 1000000 elements after expanding repetitions)");
        return;
    }
    l->v = grow(l->v, &l->cap, l->n + 1, sizeof *l->v);
    l->v[l->n++] = (grammar_element){kind, value};
}

static int rule_new(builder *b, const char *name, size_t len) {
    b->rules = grow(b->rules, &b->cap_rules, b->n_rules + 1, sizeof *b->rules);
    rule_def *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->name = name ? strndup(name, len) : NULL;
    r->owner = b->current;
    return b->n_rules++;
}

static int rule_named(builder *b, const char *name, size_t len) {
    for (int i = 0; i < b->n_rules; i++)
        if (b->rules[i].name && strlen(b->rules[i].name) == len &&
            !memcmp(b->rules[i].name, name, len))
            return i;
    return rule_new(b, name, len);
}

/* Takes ownership of l's elements as a new alternative of rule r. */
static void rule_add_alt(builder *b, int r, element_list *l) {
    rule_def *d = &b->rules[r];
    d->alts = grow(d->alts, &d->cap_alts, d->n_alts + 1, sizeof *d->alts);
    d->alts[d->n_alts++] = *l;
    memset(l, 0, sizeof *l);
}

static uint64_t byte_set_hash(const uint64_t set[4]) {
    uint64_t h = set[0] * 0x9e3779b97f4a7c15ull ^ set[1] * 0xbf58476d1ce4e5b9ull ^
                 set[2] * 0x94d049bb133111ebull ^ set[3];
    return h ^ (h >> 29);
}

/* The index of a 256-bit byte set, added if new (found through a hash table: a grammar may hold
 * many distinct classes, and a linear search would make compiling it quadratic). */
static int byte_set_id(builder *b, const uint64_t set[4]) {
    if (b->set_index_cap) {
        size_t mask = (size_t)b->set_index_cap - 1;
        for (size_t i = byte_set_hash(set) & mask;; i = (i + 1) & mask) {
            int32_t k = b->set_index[i];
            if (k < 0) break;
            if (!memcmp(b->sets[k], set, sizeof b->sets[0])) return k;
        }
    }
    b->sets = grow(b->sets, &b->cap_sets, b->n_sets + 1, sizeof *b->sets);
    memcpy(b->sets[b->n_sets], set, sizeof b->sets[0]);
    int id = b->n_sets++;
    if (b->n_sets * 2 > b->set_index_cap) { /* keep the table at most half full */
        b->set_index_cap = b->set_index_cap ? b->set_index_cap * 2 : 64;
        free(b->set_index);
        b->set_index = malloc(sizeof *b->set_index * (size_t)b->set_index_cap);
        if (!b->set_index) abort();
        memset(b->set_index, -1, sizeof *b->set_index * (size_t)b->set_index_cap);
        for (int k = 0; k < b->n_sets; k++) {
            size_t i = byte_set_hash(b->sets[k]) & ((size_t)b->set_index_cap - 1);
            while (b->set_index[i] >= 0)
                i = (i + 1) & ((size_t)b->set_index_cap - 1);
            b->set_index[i] = k;
        }
    } else {
        size_t i = byte_set_hash(set) & ((size_t)b->set_index_cap - 1);
        while (b->set_index[i] >= 0)
            i = (i + 1) & ((size_t)b->set_index_cap - 1);
        b->set_index[i] = id;
    }
    return id;
}

static int single_byte(builder *b, unsigned c) {
    if (b->single_byte_set[c] < 0) {
        uint64_t set[4] = {0};
        set[c >> 6] |= 1ull << (c & 63);
        b->single_byte_set[c] = byte_set_id(b, set);
    }
    return b->single_byte_set[c];
}

static int byte_range_set(builder *b, unsigned lo, unsigned hi) {
    uint64_t set[4] = {0};
    for (unsigned c = lo; c <= hi; c++)
        set[c >> 6] |= 1ull << (c & 63);
    return byte_set_id(b, set);
}

/* ------------------------------------------------------------------ lexing */

static int at_end(const builder *b) {
    return b->p >= b->end;
}

/* Skips blanks and comments; newlines too when newline_ok (inside parentheses, after `|`). */
static void skip_space(builder *b, int newline_ok) {
    while (!at_end(b)) {
        char c = *b->p;
        if (c == ' ' || c == '\t')
            b->p++;
        else if (c == '#')
            while (!at_end(b) && *b->p != '\n')
                b->p++;
        else if (newline_ok && (c == '\n' || c == '\r')) {
            if (c == '\n') b->line++;
            b->p++;
        } else
            break;
    }
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes one UTF-8 character of the grammar text; -1 if invalid. */
static long decode_utf8(builder *b) {
    const unsigned char *s = (const unsigned char *)b->p;
    size_t left = (size_t)(b->end - b->p);
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || (size_t)n > left) return -1;
    long cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return -1;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    static const long min_of_length[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_of_length[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return -1;
    b->p += n;
    return cp;
}

/* One character of a literal or class: an escape or a UTF-8 character. -1 after fail(). */
static long read_char(builder *b) {
    if (at_end(b)) {
        fail(b, "unexpected end of grammar");
        return -1;
    }
    if (*b->p != '\\') {
        long cp = decode_utf8(b);
        if (cp < 0) fail(b, "invalid UTF-8 in the grammar");
        return cp;
    }
    b->p++;
    if (at_end(b)) {
        fail(b, "unfinished escape");
        return -1;
    }
    char e = *b->p++;
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (!digits) {
        switch (e) {
        case 'n':
            return '\n';
        case 'r':
            return '\r';
        case 't':
            return '\t';
        case '0':
            return 0;
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
        case '.':
        case '(':
        case ')':
        case '|':
        case '*':
        case '+':
        case '?':
        case '{':
        case '}':
            return e;
        }
        fail(b, "unknown escape (use \\n \\r \\t \\\\ \\\" \\xHH \\uHHHH \\UHHHHHHHH)");
        return -1;
    }
    long cp = 0;
    for (int i = 0; i < digits; i++) {
        int h = at_end(b) ? -1 : hex_value(*b->p);
        if (h < 0) {
            fail(b, "bad hexadecimal escape");
            return -1;
        }
        cp = cp * 16 + h;
        b->p++;
    }
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        fail(b, "escape is not a Unicode scalar value");
        return -1;
    }
    return cp;
}

/* ------------------------------------------------------------------ code points -> bytes */

static int utf8_encode(long cp, unsigned char out[4]) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

typedef struct cp_range {
    long lo, hi;
} cp_range;

/* Appends to rule r one alternative per byte-range sequence encoding [lo, hi] (all of one
 * encoded length, no surrogates): split until every byte position varies independently. */
static void add_utf8_sequences(builder *b, int r, long lo, long hi) {
    static const long max_of_length[4] = {0x7f, 0x7ff, 0xffff, 0x10ffff};
    for (int n = 0; n < 3; n++)
        if (lo <= max_of_length[n] && hi > max_of_length[n]) {
            add_utf8_sequences(b, r, lo, max_of_length[n]);
            add_utf8_sequences(b, r, max_of_length[n] + 1, hi);
            return;
        }
    unsigned char a[4], z[4];
    int len = utf8_encode(lo, a);
    for (int i = 1; i < len; i++) {
        long m = (1L << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                add_utf8_sequences(b, r, lo, lo | m);
                add_utf8_sequences(b, r, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                add_utf8_sequences(b, r, lo, (hi & ~m) - 1);
                add_utf8_sequences(b, r, hi & ~m, hi);
                return;
            }
        }
    }
    utf8_encode(hi, z);
    element_list seq = {0};
    for (int i = 0; i < len; i++)
        list_push(b, &seq, GRAMMAR_BYTES, byte_range_set(b, a[i], z[i]));
    rule_add_alt(b, r, &seq);
}

static int cmp_range(const void *x, const void *y) {
    const cp_range *a = x, *c = y;
    return a->lo < c->lo ? -1 : a->lo > c->lo;
}

/* Sorts and merges ranges; with negate, replaces them by their complement. Surrogates are
 * removed either way (no UTF-8 encodes them). Returns the new count. */
static int normalize_ranges(cp_range *r, int n, int negate, cp_range *out) {
    if (n > 1) qsort(r, (size_t)n, sizeof *r, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= out[m - 1].hi + 1) {
            if (r[i].hi > out[m - 1].hi) out[m - 1].hi = r[i].hi;
        } else
            out[m++] = r[i];
    }
    if (negate) {
        cp_range tmp[m + 1];
        int k = 0;
        long next = 0;
        for (int i = 0; i < m; i++) {
            if (out[i].lo > next) tmp[k++] = (cp_range){next, out[i].lo - 1};
            next = out[i].hi + 1;
        }
        if (next <= 0x10ffff) tmp[k++] = (cp_range){next, 0x10ffff};
        memcpy(out, tmp, (size_t)k * sizeof *tmp);
        m = k;
    }
    cp_range split[2 * m + 1];
    int k = 0;
    for (int i = 0; i < m; i++) {
        cp_range x = out[i];
        if (x.hi < 0xd800 || x.lo > 0xdfff)
            split[k++] = x;
        else {
            if (x.lo < 0xd800) split[k++] = (cp_range){x.lo, 0xd7ff};
            if (x.hi > 0xdfff) split[k++] = (cp_range){0xe000, x.hi};
        }
    }
    memcpy(out, split, (size_t)k * sizeof *split);
    return k;
}

/* Appends the element(s) matching one character from the ranges to seq: one byte set for ASCII,
 * else a generated rule with one alternative per byte sequence. */
static void add_class(builder *b, element_list *seq, cp_range *ranges, int n, int negate) {
    cp_range norm[2 * n + 2];
    n = normalize_ranges(ranges, n, negate, norm);
    if (n == 0) {
        fail(b, "character class matches no character");
        return;
    }
    uint64_t ascii[4] = {0};
    int has_ascii = 0, has_wide = 0;
    for (int i = 0; i < n; i++) {
        for (long c = norm[i].lo; c <= norm[i].hi && c < 0x80; c++) {
            ascii[c >> 6] |= 1ull << (c & 63);
            has_ascii = 1;
        }
        if (norm[i].hi >= 0x80) has_wide = 1;
    }
    if (!has_wide) {
        list_push(b, seq, GRAMMAR_BYTES, byte_set_id(b, ascii));
        return;
    }
    int r = rule_new(b, NULL, 0);
    if (has_ascii) {
        element_list one = {0};
        list_push(b, &one, GRAMMAR_BYTES, byte_set_id(b, ascii));
        rule_add_alt(b, r, &one);
    }
    for (int i = 0; i < n; i++)
        if (norm[i].hi >= 0x80)
            add_utf8_sequences(b, r, norm[i].lo < 0x80 ? 0x80 : norm[i].lo, norm[i].hi);
    list_push(b, seq, GRAMMAR_REF, r);
}

/* ------------------------------------------------------------------ syntax */

static void parse_alternates(builder *b, int rule, int nested);

static void parse_literal(builder *b, element_list *seq) {
    b->p++; /* opening quote */
    while (!b->failed) {
        if (at_end(b) || *b->p == '\n') {
            fail(b, "unterminated string literal");
            return;
        }
        if (*b->p == '"') {
            b->p++;
            return;
        }
        long cp = read_char(b);
        if (cp < 0) return;
        unsigned char bytes[4];
        int n = utf8_encode(cp, bytes);
        for (int i = 0; i < n; i++)
            list_push(b, seq, GRAMMAR_BYTES, single_byte(b, bytes[i]));
    }
}

static void parse_class(builder *b, element_list *seq) {
    b->p++; /* [ */
    int negate = 0;
    if (!at_end(b) && *b->p == '^') {
        negate = 1;
        b->p++;
    }
    cp_range *r = NULL;
    int n = 0, cap = 0;
    while (!b->failed) {
        if (at_end(b)) {
            fail(b, "unterminated character class");
            break;
        }
        if (*b->p == ']') {
            b->p++;
            break;
        }
        long lo = read_char(b), hi = lo;
        if (lo < 0) break;
        if (b->end - b->p >= 2 && b->p[0] == '-' && b->p[1] != ']') {
            b->p++;
            hi = read_char(b);
            if (hi < 0) break;
            if (hi < lo) {
                fail(b, "character range is backwards");
                break;
            }
        }
        r = grow(r, &cap, n + 1, sizeof *r);
        r[n++] = (cp_range){lo, hi};
    }
    if (!b->failed) add_class(b, seq, r, n, negate);
    free(r);
}

static long parse_count(builder *b) {
    long v = 0;
    if (at_end(b) || *b->p < '0' || *b->p > '9') return -1;
    while (!at_end(b) && *b->p >= '0' && *b->p <= '9') {
        v = v * 10 + (*b->p++ - '0');
        if (v > GRAMMAR_MAX_REPEAT) return -2;
    }
    return v;
}

/* A rule matching x zero or more times: R ::= x R | "". */
static int star_rule(builder *b, grammar_element x) {
    int r = rule_new(b, NULL, 0);
    element_list one = {0}, none = {0};
    list_push(b, &one, x.kind, x.value);
    list_push(b, &one, GRAMMAR_REF, r);
    rule_add_alt(b, r, &one);
    rule_add_alt(b, r, &none);
    return r;
}

/* Applies the repetition at b->p to the last item of seq (elements from item_start). */
static void parse_repetition(builder *b, element_list *seq, int item_start) {
    if (item_start >= seq->n) {
        fail(b, "repetition operator without anything before it");
        return;
    }
    grammar_element x = seq->v[item_start];
    if (seq->n - item_start > 1) { /* several elements (a literal, a wide class): wrap them */
        int r = rule_new(b, NULL, 0);
        element_list body = {0};
        for (int i = item_start; i < seq->n; i++)
            list_push(b, &body, seq->v[i].kind, seq->v[i].value);
        rule_add_alt(b, r, &body);
        x = (grammar_element){GRAMMAR_REF, r};
    }
    seq->n = item_start;
    char op = *b->p++;
    long min = 0, max = -1; /* -1: unbounded */
    if (op == '+')
        min = 1;
    else if (op == '?')
        max = 1;
    else if (op == '{') {
        skip_space(b, 1);
        min = parse_count(b);
        skip_space(b, 1);
        max = min;
        if (!at_end(b) && *b->p == ',') {
            b->p++;
            skip_space(b, 1);
            max = at_end(b) || *b->p == '}' ? -1 : parse_count(b);
            skip_space(b, 1);
        }
        if (min < 0 || (max < 0 && max != -1) || at_end(b) || *b->p != '}') {
            fail(b, min == -2 || max == -2 ? "repetition count over 10000"
                                           : "malformed {m,n} repetition");
            return;
        }
        b->p++;
        if (max != -1 && max < min) {
            fail(b, "repetition {m,n} with n < m");
            return;
        }
    }
    for (long i = 0; i < min && !b->failed; i++)
        list_push(b, seq, x.kind, x.value);
    if (max == -1) {
        list_push(b, seq, GRAMMAR_REF, star_rule(b, x));
        return;
    }
    /* up to max - min more: O1 ::= x | "", Ok ::= x O(k-1) | "" */
    int prev = -1;
    for (long k = 0; k < max - min && !b->failed; k++) {
        int r = rule_new(b, NULL, 0);
        element_list one = {0}, none = {0};
        list_push(b, &one, x.kind, x.value);
        if (prev >= 0) list_push(b, &one, GRAMMAR_REF, prev);
        rule_add_alt(b, r, &one);
        rule_add_alt(b, r, &none);
        prev = r;
    }
    if (prev >= 0) list_push(b, seq, GRAMMAR_REF, prev);
}

static void parse_sequence(builder *b, element_list *seq, int nested) {
    int item_start = -1;
    while (!b->failed) {
        skip_space(b, nested);
        if (at_end(b)) return;
        char c = *b->p;
        int start = seq->n;
        if (c == '"')
            parse_literal(b, seq);
        else if (c == '[')
            parse_class(b, seq);
        else if (c == '.') {
            b->p++;
            cp_range any = {0, 0x10ffff};
            add_class(b, seq, &any, 1, 0);
        } else if (c == '(') {
            if (++b->depth > MAX_NESTING) {
                fail(b, "parentheses nested too deeply");
                return;
            }
            b->p++;
            int r = rule_new(b, NULL, 0);
            parse_alternates(b, r, 1);
            b->depth--;
            if (b->failed) return;
            if (at_end(b) || *b->p != ')') {
                fail(b, "expected ')'");
                return;
            }
            b->p++;
            list_push(b, seq, GRAMMAR_REF, r);
        } else if (is_name_char(c)) {
            const char *name = b->p;
            while (!at_end(b) && is_name_char(*b->p))
                b->p++;
            const char *after = b->p;
            skip_space(b, 0);
            if (b->end - b->p >= 3 && !memcmp(b->p, "::=", 3)) { /* the next rule begins */
                b->p = name;
                return;
            }
            b->p = after;
            list_push(b, seq, GRAMMAR_REF, rule_named(b, name, (size_t)(after - name)));
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            parse_repetition(b, seq, item_start < 0 ? seq->n : item_start);
            item_start = -1; /* x** is an error, as in llama.cpp */
            continue;
        } else if (c == ')' || c == '|' || c == '\n' || c == '\r') {
            return;
        } else {
            fail(b, "unexpected character");
            return;
        }
        item_start = start;
    }
}

static void parse_alternates(builder *b, int rule, int nested) {
    for (;;) {
        element_list seq = {0};
        parse_sequence(b, &seq, nested);
        if (b->failed) {
            free(seq.v);
            return;
        }
        rule_add_alt(b, rule, &seq);
        if (at_end(b) || *b->p != '|') return;
        b->p++;
        skip_space(b, 1);
    }
}

static void parse_rules(builder *b) {
    for (;;) {
        skip_space(b, 1);
        if (at_end(b) || b->failed) return;
        const char *name = b->p;
        while (!at_end(b) && is_name_char(*b->p))
            b->p++;
        if (b->p == name) {
            fail(b, "expected a rule name");
            return;
        }
        size_t len = (size_t)(b->p - name);
        skip_space(b, 0);
        if (b->end - b->p < 3 || memcmp(b->p, "::=", 3)) {
            fail(b, "expected '::=' after the rule name");
            return;
        }
        b->p += 3;
        skip_space(b, 1);
        int r = rule_named(b, name, len);
        if (b->rules[r].defined) {
            fail(b, "rule defined twice");
            return;
        }
        b->rules[r].defined = 1;
        b->current = r;
        parse_alternates(b, r, 0);
        if (b->failed) return;
        skip_space(b, 0);
        if (!at_end(b) && *b->p != '\n' && *b->p != '\r') {
            fail(b, "expected the end of the line");
            return;
        }
    }
}

/* ------------------------------------------------------------------ checks and flattening */

static const char *rule_label(const builder *b, int r) {
    const rule_def *d = &b->rules[r];
    if (d->name) return d->name;
    return d->owner >= 0 && b->rules[d->owner].name ? b->rules[d->owner].name : "?";
}

/* Every rule defined; none reachable from itself before consuming a byte. Returns 0 or -1. */
static int check_rules(builder *b) {
    for (int r = 0; r < b->n_rules; r++)
        if (b->rules[r].name && !b->rules[r].defined) {
            error_set(b->err, b->errlen, "grammar: rule '%s' is used but not defined",
                      b->rules[r].name);
            return -1;
        }
    char *nullable = calloc((size_t)b->n_rules, 1);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < b->n_rules; r++) {
            if (nullable[r]) continue;
            for (int a = 0; a < b->rules[r].n_alts && !nullable[r]; a++) {
                element_list *l = &b->rules[r].alts[a];
                int all = 1;
                for (int i = 0; i < l->n && all; i++)
                    all = l->v[i].kind == GRAMMAR_REF && nullable[l->v[i].value];
                if (all) nullable[r] = changed = 1;
            }
        }
    }
    /* depth-first search over "can start with" edges; state 1 = on the path. A stack frame
     * is (rule, alternative, element): the next element of that rule to look at. */
    char *state = calloc((size_t)b->n_rules, 1);
    int32_t *stack = malloc(sizeof *stack * (size_t)b->n_rules * 3);
    int bad = -1;
    for (int root = 0; root < b->n_rules && bad < 0; root++) {
        if (state[root]) continue;
        int sp = 0;
        stack[sp++] = root;
        stack[sp++] = 0;
        stack[sp++] = 0;
        state[root] = 1;
        while (sp && bad < 0) {
            rule_def *d = &b->rules[stack[sp - 3]];
            int a = stack[sp - 2], i = stack[sp - 1], next = -1;
            while (a < d->n_alts && next < 0) {
                element_list *l = &d->alts[a];
                if (i < l->n && l->v[i].kind == GRAMMAR_REF) {
                    next = l->v[i].value;
                    if (nullable[next])
                        i++; /* what follows it may start the rule too */
                    else {
                        a++;
                        i = 0;
                    }
                } else {
                    a++;
                    i = 0;
                }
            }
            stack[sp - 2] = a;
            stack[sp - 1] = i;
            if (next < 0) {
                state[stack[sp - 3]] = 2;
                sp -= 3;
            } else if (state[next] == 1) {
                bad = next;
            } else if (state[next] == 0) {
                state[next] = 1;
                stack[sp++] = next;
                stack[sp++] = 0;
                stack[sp++] = 0;
            }
        }
    }
    free(nullable);
    free(state);
    free(stack);
    if (bad >= 0) {
        error_set(b->err, b->errlen,
                  b->rules[bad].name
                      ? "grammar: rule '%s' is left-recursive (it can reach itself before "
                        "matching any character)"
                      : "grammar: a repetition or group in rule '%s' can repeat without "
                        "matching any character",
                  rule_label(b, bad));
        return -1;
    }
    return 0;
}

static grammar *flatten(builder *b) {
    grammar *g = calloc(1, sizeof *g);
    g->refs = 1;
    g->n_rules = b->n_rules;
    long n_el = 0, n_alts = 0;
    for (int r = 0; r < b->n_rules; r++) {
        n_alts += b->rules[r].n_alts;
        for (int a = 0; a < b->rules[r].n_alts; a++)
            n_el += b->rules[r].alts[a].n + 1;
    }
    g->elements = malloc(sizeof *g->elements * (size_t)(n_el ? n_el : 1));
    g->alt_first = malloc(sizeof *g->alt_first * (size_t)b->n_rules);
    g->alt_count = malloc(sizeof *g->alt_count * (size_t)b->n_rules);
    g->alt_start = malloc(sizeof *g->alt_start * (size_t)(n_alts ? n_alts : 1));
    int e = 0, k = 0;
    for (int r = 0; r < b->n_rules; r++) {
        g->alt_first[r] = k;
        g->alt_count[r] = b->rules[r].n_alts;
        for (int a = 0; a < b->rules[r].n_alts; a++) {
            element_list *l = &b->rules[r].alts[a];
            g->alt_start[k++] = e;
            if (l->n) memcpy(g->elements + e, l->v, (size_t)l->n * sizeof *l->v);
            e += l->n;
            g->elements[e++] = (grammar_element){GRAMMAR_END, 0};
        }
    }
    g->n_elements = e;
    g->n_alts = k;
    g->byte_sets = b->sets;
    g->n_byte_sets = b->n_sets;
    b->sets = NULL;
    return g;
}

static void builder_free(builder *b) {
    for (int r = 0; r < b->n_rules; r++) {
        for (int a = 0; a < b->rules[r].n_alts; a++)
            free(b->rules[r].alts[a].v);
        free(b->rules[r].alts);
        free(b->rules[r].name);
    }
    free(b->rules);
    free(b->sets);
    free(b->set_index);
}

grammar *grammar_parse(const char *text, size_t len, char *err, size_t errlen) {
    builder b = {
        .p = text, .end = text + len, .line = 1, .current = -1, .err = err, .errlen = errlen};
    memset(b.single_byte_set, -1, sizeof b.single_byte_set);
    parse_rules(&b);
    grammar *g = NULL;
    int root = -1;
    for (int r = 0; r < b.n_rules && !b.failed; r++)
        if (b.rules[r].name && !strcmp(b.rules[r].name, "root")) root = r;
    if (!b.failed && (root < 0 || !b.rules[root].defined))
        error_set(err, errlen, "grammar: no 'root' rule (the output must match 'root ::= ...')");
    else if (!b.failed && check_rules(&b) == 0) {
        g = flatten(&b);
        g->root = root;
    }
    builder_free(&b);
    return g;
}

grammar *grammar_ref(grammar *g) {
    g->refs++;
    return g;
}

void grammar_unref(grammar *g) {
    if (!g || --g->refs > 0) return;
    grammar_match_free(g);
    free(g->elements);
    free(g->alt_first);
    free(g->alt_count);
    free(g->alt_start);
    free(g->byte_sets);
    free(g);
}

int grammar_n_rules(const grammar *g) {
    return g->n_rules;
}
