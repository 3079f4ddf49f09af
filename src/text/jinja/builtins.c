/* jinja builtins — the filters, tests, str/dict methods and globals that chat templates use,
 * each matching Jinja2 3.1 / CPython behaviour (case-insensitive sorting by default, Undefined
 * treated as Jinja treats it, tojson as transformers overrides it).
 * Refuses: mutating methods (list.append, dict.update, ...) as Jinja's immutable sandbox does;
 * filters that return lazy generators (map, select, ...) return lists instead. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "text/jinja/internal.h"

#define NONE_ARG ((jval){.kind = JV_UNDEF})
static bool given(jval v) {
    return v.kind != JV_UNDEF || v.u.undef_name != NULL;
}

static jval need_str(jctx *c, jval v, const char *what, int line) {
    if (v.kind != JV_STR) jfail(c, line, "%s: expected a string, got %s", what, jv_type_name(v));
    return v;
}

static int64_t need_int(jctx *c, jval v, const char *what, int line) {
    if (v.kind == JV_INT) return v.u.i;
    if (v.kind == JV_BOOL) return v.u.b;
    jfail(c, line, "%s: expected an integer, got %s", what, jv_type_name(v));
}

/* ---- UTF-8 code point helpers ---- */
static int32_t cp_at(const char *s, size_t n, size_t *i) {
    int32_t cp;
    utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) {
        cp = (unsigned char)s[*i];
        k = 1;
    }
    *i += (size_t)k;
    return cp;
}

static void put_cp(strbuf *sb, int32_t cp) {
    utf8proc_uint8_t b[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, b);
    strbuf_append(sb, (const char *)b, (size_t)k);
}

static bool py_isspace(int32_t cp) {
    return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

static bool py_isalpha(int32_t cp) {
    utf8proc_category_t k = utf8proc_category(cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}
static bool py_isdigit(int32_t cp) {
    utf8proc_category_t k = utf8proc_category(cp);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
static bool py_iscased(int32_t cp) {
    utf8proc_category_t k = utf8proc_category(cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

typedef enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE } case_mode;

/* the common one-to-many mappings of Unicode SpecialCasing.txt that Python applies */
static const char *special_upper(int32_t cp, bool full_upper) {
    switch (cp) {
    case 0xDF:
        return full_upper ? "SS" : "Ss";
    case 0xFB00:
        return full_upper ? "FF" : "Ff";
    case 0xFB01:
        return full_upper ? "FI" : "Fi";
    case 0xFB02:
        return full_upper ? "FL" : "Fl";
    case 0xFB03:
        return full_upper ? "FFI" : "Ffi";
    case 0xFB04:
        return full_upper ? "FFL" : "Ffl";
    case 0xFB05:
    case 0xFB06:
        return full_upper ? "ST" : "St";
    default:
        return NULL;
    }
}

static jval change_case(jctx *c, jval s, case_mode mode, int line) {
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    size_t i = 0;
    bool prev_cased = false, first = true;
    while (i < s.u.s.n) {
        int32_t cp = cp_at(s.u.s.p, s.u.s.n, &i);
        int32_t o = cp;
        switch (mode) {
        case CASE_UPPER:
            o = utf8proc_toupper(cp);
            break;
        case CASE_LOWER:
            o = utf8proc_tolower(cp);
            break;
        case CASE_TITLE:
            o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
            break;
        case CASE_CAPITALIZE:
            o = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
            break;
        }
        bool to_upper = mode == CASE_UPPER ||
                        ((mode == CASE_TITLE && !prev_cased) || (mode == CASE_CAPITALIZE && first));
        prev_cased = py_iscased(cp);
        first = false;
        const char *special =
            to_upper ? special_upper(cp, mode == CASE_UPPER) : (cp == 0x130 ? "i\xcc\x87" : NULL);
        if (special)
            strbuf_append_str(sb, special);
        else
            put_cp(sb, o);
    }
    return jcapture_end(c, prev);
}

static bool in_chars(int32_t cp, jval chars) {
    if (chars.kind != JV_STR) return py_isspace(cp);
    size_t i = 0;
    while (i < chars.u.s.n)
        if (cp_at(chars.u.s.p, chars.u.s.n, &i) == cp) return true;
    return false;
}

static jval do_strip(jctx *c, jval s, jval chars, bool left, bool right) {
    (void)c;
    size_t a = 0, b = s.u.s.n;
    if (left)
        while (a < b) {
            size_t k = a;
            if (!in_chars(cp_at(s.u.s.p, b, &k), chars)) break;
            a = k;
        }
    if (right)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)s.u.s.p[st] & 0xC0) == 0x80)
                st--;
            size_t k = st;
            if (!in_chars(cp_at(s.u.s.p, b, &k), chars)) break;
            b = st;
        }
    return jv_str(s.u.s.p + a, b - a);
}

/* ---- sorting keys ---- */
static jval lower_if_str(jctx *c, jval v, bool case_sensitive, int line) {
    if (!case_sensitive && v.kind == JV_STR) return change_case(c, v, CASE_LOWER, line);
    return v;
}

static jval attr_path(jctx *c, jval item, jval path, int line) {
    if (path.kind == JV_INT) return jgetitem(c, item, path, line);
    if (path.kind != JV_STR) return item;
    const char *p = path.u.s.p, *end = p + path.u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        jval key = jv_str(p, (size_t)(dot - p));
        bool digits = dot > p;
        for (const char *q = p; q < dot; q++)
            if (!isdigit((unsigned char)*q)) digits = false;
        if (digits) key = jv_int(strtoll(p, NULL, 10));
        if (item.kind == JV_UNDEF) return item;
        item = jgetitem(c, item, key, line);
        p = dot + 1;
    }
    return item;
}

typedef struct sort_item {
    jval key;
    jval val;
    size_t idx;
} sort_item;

/* stable merge sort in the render arena (a comparison may fail the render with longjmp, so no
 * malloc'd scratch space may be live while it runs) */
static int sort_item_cmp(jctx *c, const sort_item *a, const sort_item *b, bool reverse, int line) {
    int r = jv_compare(c, a->key, b->key, line);
    return reverse ? -r : r;
}

static void sort_items(jctx *c, sort_item *items, size_t n, bool reverse, int line) {
    if (n < 2) return;
    sort_item *tmp = jalloc(c, n * sizeof *tmp);
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n,
                   hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = sort_item_cmp(c, &items[j], &items[i], reverse, line) < 0 ? items[j++]
                                                                                     : items[i++];
            while (i < mid)
                tmp[k++] = items[i++];
            while (j < hi)
                tmp[k++] = items[j++];
        }
        memcpy(items, tmp, n * sizeof *items);
    }
}

/* ================= filters ================= */
typedef jval (*filter_fn)(jctx *c, jval v, jargs *a, int line);

static jval f_trim(jctx *c, jval v, jargs *a, int line) {
    v = jv_stringify(c, v, line);
    return do_strip(c, v, jarg(a, 0, "chars", NONE_ARG), true, true);
}

static jval f_tojson(jctx *c, jval v, jargs *a, int line) {
    /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    bool ascii = jv_truthy(jarg(a, 0, "ensure_ascii", jv_bool(false)));
    jval ind = jarg(a, 1, "indent", jv_none());
    jval seps = jarg(a, 2, "separators", jv_none());
    jval sk = jarg(a, 3, "sort_keys", jv_bool(false));
    int indent = -1;
    if (ind.kind == JV_INT || ind.kind == JV_BOOL)
        indent = (int)need_int(c, ind, "tojson indent", line);
    else if (ind.kind != JV_NONE && ind.kind != JV_UNDEF)
        jfail(c, line, "tojson: indent must be an integer");
    if (indent > 64) indent = 64;
    if (indent < -1) indent = 0;
    const char *item_sep = indent >= 0 ? "," : ", ", *key_sep = ": ";
    if (seps.kind == JV_LIST && seps.u.l->n == 2 && seps.u.l->items[0].kind == JV_STR &&
        seps.u.l->items[1].kind == JV_STR) {
        item_sep = jstrdup_n(c, seps.u.l->items[0].u.s.p, seps.u.l->items[0].u.s.n);
        key_sep = jstrdup_n(c, seps.u.l->items[1].u.s.p, seps.u.l->items[1].u.s.n);
    }
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    jv_tojson(c, v, sb, indent, item_sep, key_sep, jv_truthy(sk), 0, line);
    if (ascii) {
        strbuf *tmp = jcapture_begin(c, line);
        size_t i = 0;
        while (i < sb->len) {
            unsigned char b = (unsigned char)sb->data[i];
            if (b < 0x80) {
                strbuf_append_char(tmp, (char)b);
                i++;
                continue;
            }
            int32_t cp = cp_at(sb->data, sb->len, &i);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                strbuf_appendf(tmp, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else
                strbuf_appendf(tmp, "\\u%04x", cp);
        }
        jval r = jcapture_end(c, sb);
        jcapture_end(c, prev);
        return r;
    }
    return jcapture_end(c, prev);
}

static int64_t length_of(jctx *c, jval v, int line) {
    switch (v.kind) {
    case JV_UNDEF:
        return 0;
    case JV_STR:
        return (int64_t)utf8_count(v.u.s.p, v.u.s.n);
    case JV_LIST:
        return (int64_t)v.u.l->n;
    case JV_DICT:
        if (!v.u.d->is_namespace) return (int64_t)v.u.d->n;
        /* fallthrough */
    default:
        jfail(c, line, "object of type '%s' has no len()", jv_type_name(v));
    }
}

static jval f_length(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    return jv_int(length_of(c, v, line));
}

static jval f_join(jctx *c, jval v, jargs *a, int line) {
    jval d = jarg(a, 0, "d", jv_cstr(""));
    jval attr = jarg(a, 1, "attribute", NONE_ARG);
    jlist *items = jv_iterate(c, v, line);
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    for (size_t i = 0; i < items->n; i++) {
        if (i) jv_to_str(c, d, sb, line);
        jval it = items->items[i];
        if (given(attr)) it = attr_path(c, it, attr, line);
        jv_to_str(c, it, sb, line);
        if (sb->len > c->limits.max_output_bytes) jfail(c, line, "join: result too long");
    }
    return jcapture_end(c, prev);
}

static jval f_first(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    jlist *items = jv_iterate(c, v, line);
    return items->n ? items->items[0] : jv_undef("No first item, sequence was empty.");
}

static jval f_last(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    jlist *items = jv_iterate(c, v, line);
    return items->n ? items->items[items->n - 1] : jv_undef("No last item, sequence was empty.");
}

static jval f_list(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    jlist *items = jv_iterate(c, v, line);
    jval out = jv_list(c, items->n, false);
    for (size_t i = 0; i < items->n; i++)
        jlist_push(c, out.u.l, items->items[i]);
    return out;
}

static jval f_map(jctx *c, jval v, jargs *a, int line) {
    if (!jv_truthy(v)) return jv_list(c, 0, false); /* Jinja2: `if value:` before iterating */
    jlist *items = jv_iterate(c, v, line);
    jval out = jv_list(c, items->n, false);
    jval attr = jarg(a, 99, "attribute", NONE_ARG);
    if (given(attr)) {
        jval dflt = jarg(a, 99, "default", NONE_ARG);
        for (size_t i = 0; i < items->n; i++) {
            jval r = attr_path(c, items->items[i], attr, line);
            if (r.kind == JV_UNDEF && given(dflt)) r = dflt;
            jlist_push(c, out.u.l, r);
        }
        return out;
    }
    if (!a->npos) return out;
    jval name = need_str(c, a->pos[0], "map", line);
    jargs rest = {.pos = a->pos + 1,
                  .npos = a->npos - 1,
                  .kwnames = a->kwnames,
                  .kwvals = a->kwvals,
                  .nkw = a->nkw};
    const char *fname = jstrdup_n(c, name.u.s.p, name.u.s.n);
    for (size_t i = 0; i < items->n; i++)
        jlist_push(c, out.u.l, jfilter_apply(c, fname, items->items[i], &rest, line));
    return out;
}

static jval select_impl(jctx *c, jval v, jargs *a, int line, bool by_attr, bool want) {
    if (!jv_truthy(v)) return jv_list(c, 0, false); /* Jinja2: `if value:` before iterating */
    jlist *items = jv_iterate(c, v, line);
    jval out = jv_list(c, items->n, false);
    size_t k = 0;
    jval attr = NONE_ARG;
    if (by_attr) {
        if (!a->npos) jfail(c, line, "Missing parameter for attribute name");
        attr = a->pos[k++];
    }
    const char *test = NULL;
    if (k < a->npos) {
        jval t = need_str(c, a->pos[k++], "select", line);
        test = jstrdup_n(c, t.u.s.p, t.u.s.n);
    }
    jargs rest = {.pos = a->pos + k,
                  .npos = a->npos - k,
                  .kwnames = a->kwnames,
                  .kwvals = a->kwvals,
                  .nkw = a->nkw};
    for (size_t i = 0; i < items->n; i++) {
        jval it = items->items[i];
        jval probe = by_attr ? attr_path(c, it, attr, line) : it;
        bool r = test ? jtest_apply(c, test, probe, &rest, line) : jv_truthy(probe);
        if (r == want) jlist_push(c, out.u.l, it);
    }
    return out;
}
static jval f_select(jctx *c, jval v, jargs *a, int line) {
    return select_impl(c, v, a, line, false, true);
}
static jval f_reject(jctx *c, jval v, jargs *a, int line) {
    return select_impl(c, v, a, line, false, false);
}
static jval f_selectattr(jctx *c, jval v, jargs *a, int line) {
    return select_impl(c, v, a, line, true, true);
}
static jval f_rejectattr(jctx *c, jval v, jargs *a, int line) {
    return select_impl(c, v, a, line, true, false);
}

static jval f_items(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    if (v.kind == JV_UNDEF) return jv_list(c, 0, false);
    if (v.kind != JV_DICT || v.u.d->is_namespace)
        jfail(c, line, "Can only get item pairs from a mapping.");
    jval out = jv_list(c, v.u.d->n, false);
    for (size_t i = 0; i < v.u.d->n; i++) {
        jval t = jv_list(c, 2, true);
        jlist_push(c, t.u.l, v.u.d->keys[i]);
        jlist_push(c, t.u.l, v.u.d->vals[i]);
        jlist_push(c, out.u.l, t);
    }
    return out;
}

static jval f_default(jctx *c, jval v, jargs *a, int line) {
    (void)c;
    (void)line;
    jval dflt = jarg(a, 0, "default_value", jv_cstr(""));
    bool boolean = jv_truthy(jarg(a, 1, "boolean", jv_bool(false)));
    if (v.kind == JV_UNDEF || (boolean && !jv_truthy(v))) return dflt;
    return v;
}

static jval f_upper(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    return change_case(c, jv_stringify(c, v, line), CASE_UPPER, line);
}
static jval f_lower(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    return change_case(c, jv_stringify(c, v, line), CASE_LOWER, line);
}
static jval f_capitalize(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    return change_case(c, jv_stringify(c, v, line), CASE_CAPITALIZE, line);
}
static jval f_title(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    /* Jinja: words split at whitespace and -({[< ; each word: first char upper, rest lower */
    v = jv_stringify(c, v, line);
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    size_t i = 0;
    bool word_start = true;
    while (i < v.u.s.n) {
        int32_t cp = cp_at(v.u.s.p, v.u.s.n, &i);
        bool sep = py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
        if (sep) {
            put_cp(sb, cp);
            word_start = true;
        } else {
            put_cp(sb, word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
            word_start = false;
        }
    }
    return jcapture_end(c, prev);
}

static jval str_replace(jctx *c, jval s, jval old, jval new, int64_t count, int line) {
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    size_t i = 0;
    int64_t done = 0;
    if (old.u.s.n == 0) {
        /* Python inserts `new` between every code point (and at both ends) */
        size_t k = 0;
        while (count < 0 || done < count) {
            strbuf_append(sb, new.u.s.p, new.u.s.n);
            done++;
            if (k >= s.u.s.n) break;
            size_t st = k;
            cp_at(s.u.s.p, s.u.s.n, &k);
            strbuf_append(sb, s.u.s.p + st, k - st);
            if (sb->len > c->limits.max_output_bytes) jfail(c, line, "replace: result too long");
        }
        strbuf_append(sb, s.u.s.p + k, s.u.s.n - k);
        return jcapture_end(c, prev);
    }
    while (i < s.u.s.n) {
        const char *hit = (count < 0 || done < count)
                              ? memmem(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n)
                              : NULL;
        if (!hit) break;
        size_t at = (size_t)(hit - s.u.s.p);
        strbuf_append(sb, s.u.s.p + i, at - i);
        strbuf_append(sb, new.u.s.p, new.u.s.n);
        if (sb->len > c->limits.max_output_bytes) jfail(c, line, "replace: result too long");
        i = at + old.u.s.n;
        done++;
    }
    strbuf_append(sb, s.u.s.p + i, s.u.s.n - i);
    return jcapture_end(c, prev);
}

static jval f_replace(jctx *c, jval v, jargs *a, int line) {
    v = jv_stringify(c, v, line);
    jval old = jv_stringify(c, jarg(a, 0, "old", jv_cstr("")), line);
    jval new = jv_stringify(c, jarg(a, 1, "new", jv_cstr("")), line);
    jval cnt = jarg(a, 2, "count", jv_none());
    return str_replace(c, v, old, new,
                       cnt.kind == JV_NONE ? -1 : need_int(c, cnt, "replace count", line), line);
}

static jval f_string(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    return jv_stringify(c, v, line);
}

static bool parse_int_str(const char *s, size_t n, int base, int64_t *out) {
    char buf[80];
    size_t k = 0;
    size_t i = 0;
    while (i < n && isspace((unsigned char)s[i]))
        i++;
    while (n > i && isspace((unsigned char)s[n - 1]))
        n--;
    if (i == n || n - i >= sizeof buf) return false;
    for (; i < n; i++) {
        if (s[i] == '_') {
            if (!k || !isalnum((unsigned char)buf[k - 1]) || i + 1 >= n ||
                !isalnum((unsigned char)s[i + 1]))
                return false;
            continue;
        }
        buf[k++] = s[i];
    }
    buf[k] = 0;
    /* Python accepts the 0x/0o/0b prefix that matches the base */
    char *digits = buf;
    bool neg = false;
    if (*digits == '-' || *digits == '+') neg = *digits++ == '-';
    if (digits[0] == '0' && ((base == 8 && (digits[1] == 'o' || digits[1] == 'O')) ||
                             (base == 2 && (digits[1] == 'b' || digits[1] == 'B'))))
        digits += 2;
    if (*digits == '-' || *digits == '+' || isspace((unsigned char)*digits)) return false;
    char *end;
    errno = 0;
    long long v = strtoll(digits, &end, base);
    if (neg) v = -v;
    if (*end || errno || end == digits) return false;
    *out = v;
    return true;
}

static bool parse_float_str(const char *s, size_t n, double *out) {
    char buf[80];
    while (n && isspace((unsigned char)*s))
        s++, n--;
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    if (!n || n >= sizeof buf) return false;
    memcpy(buf, s, n);
    buf[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (buf[i] == 'x' || buf[i] == 'X' || buf[i] == 'p' || buf[i] == 'P') return false;
    char *end;
    double v = strtod(buf, &end);
    if (*end) return false;
    *out = v;
    return true;
}

static jval f_int(jctx *c, jval v, jargs *a, int line) {
    jval dflt = jarg(a, 0, "default", jv_int(0));
    int base = (int)need_int(c, jarg(a, 1, "base", jv_int(10)), "int base", line);
    if (v.kind == JV_UNDEF)
        jfail(c, line, "%s", v.u.undef_name ? v.u.undef_name : "value is undefined");
    int64_t i;
    double f;
    switch (v.kind) {
    case JV_INT:
        return v;
    case JV_BOOL:
        return jv_int(v.u.b);
    case JV_FLOAT:
        if (isnan(v.u.f) || isinf(v.u.f) || fabs(v.u.f) > 9.2e18) return dflt;
        return jv_int((int64_t)v.u.f);
    case JV_STR:
        if (base >= 2 && base <= 36 && parse_int_str(v.u.s.p, v.u.s.n, base, &i)) return jv_int(i);
        if (parse_float_str(v.u.s.p, v.u.s.n, &f) && !isnan(f) && !isinf(f) && fabs(f) < 9.2e18)
            return jv_int((int64_t)f);
        return dflt;
    default:
        return dflt;
    }
}

static jval f_float(jctx *c, jval v, jargs *a, int line) {
    (void)c;
    (void)line;
    jval dflt = jarg(a, 0, "default", jv_float(0.0));
    if (v.kind == JV_UNDEF)
        jfail(c, line, "%s", v.u.undef_name ? v.u.undef_name : "value is undefined");
    double f;
    switch (v.kind) {
    case JV_FLOAT:
        return v;
    case JV_INT:
        return jv_float((double)v.u.i);
    case JV_BOOL:
        return jv_float(v.u.b);
    case JV_STR:
        if (parse_float_str(v.u.s.p, v.u.s.n, &f)) return jv_float(f);
        return dflt;
    default:
        return dflt;
    }
}

static jval f_unique(jctx *c, jval v, jargs *a, int line) {
    bool cs = jv_truthy(jarg(a, 0, "case_sensitive", jv_bool(false)));
    jval attr = jarg(a, 1, "attribute", NONE_ARG);
    jlist *items = jv_iterate(c, v, line);
    jval out = jv_list(c, items->n, false), seen = jv_list(c, items->n, false);
    for (size_t i = 0; i < items->n; i++) {
        jval key = items->items[i];
        if (given(attr)) key = attr_path(c, key, attr, line);
        key = lower_if_str(c, key, cs, line);
        bool dup = false;
        c->iterations += (long long)(seen.u.l->n >> 4); /* quadratic: charged to the work budget */
        if (c->iterations > c->limits.max_iterations)
            jfail(c, line, "unique: too much work for one render");
        for (size_t k = 0; k < seen.u.l->n && !dup; k++)
            dup = jv_equal(seen.u.l->items[k], key);
        if (!dup) {
            jlist_push(c, seen.u.l, key);
            jlist_push(c, out.u.l, items->items[i]);
        }
    }
    return out;
}

static jval f_dictsort(jctx *c, jval v, jargs *a, int line) {
    bool cs = jv_truthy(jarg(a, 0, "case_sensitive", jv_bool(false)));
    jval by = jarg(a, 1, "by", jv_cstr("key"));
    bool reverse = jv_truthy(jarg(a, 2, "reverse", jv_bool(false)));
    if (v.kind != JV_DICT || v.u.d->is_namespace) jfail(c, line, "dictsort: expected a mapping");
    int pos = 0;
    if (by.kind == JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5))
        pos = 1;
    else if (!(by.kind == JV_STR && by.u.s.n == 3 && !memcmp(by.u.s.p, "key", 3)))
        jfail(c, line, "You can only sort by either \"key\" or \"value\"");
    size_t n = v.u.d->n;
    sort_item *items = jalloc(c, (n + 1) * sizeof *items);
    for (size_t i = 0; i < n; i++) {
        jval t = jv_list(c, 2, true);
        jlist_push(c, t.u.l, v.u.d->keys[i]);
        jlist_push(c, t.u.l, v.u.d->vals[i]);
        items[i] =
            (sort_item){lower_if_str(c, pos ? v.u.d->vals[i] : v.u.d->keys[i], cs, line), t, i};
    }
    sort_items(c, items, n, reverse, line);
    jval out = jv_list(c, n, false);
    for (size_t i = 0; i < n; i++)
        jlist_push(c, out.u.l, items[i].val);
    return out;
}

static jval f_sort(jctx *c, jval v, jargs *a, int line) {
    bool reverse = jv_truthy(jarg(a, 0, "reverse", jv_bool(false)));
    bool cs = jv_truthy(jarg(a, 1, "case_sensitive", jv_bool(false)));
    jval attr = jarg(a, 2, "attribute", NONE_ARG);
    jlist *l = jv_iterate(c, v, line);
    sort_item *items = jalloc(c, (l->n + 1) * sizeof *items);
    for (size_t i = 0; i < l->n; i++) {
        jval key = l->items[i];
        if (given(attr)) key = attr_path(c, key, attr, line);
        items[i] = (sort_item){lower_if_str(c, key, cs, line), l->items[i], i};
    }
    sort_items(c, items, l->n, reverse, line);
    jval out = jv_list(c, l->n, false);
    for (size_t i = 0; i < l->n; i++)
        jlist_push(c, out.u.l, items[i].val);
    return out;
}

static jval f_reverse(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    if (v.kind == JV_STR) {
        jlist *chars = jv_iterate(c, v, line);
        strbuf *prev = c->out;
        strbuf *sb = jcapture_begin(c, line);
        for (size_t i = chars->n; i-- > 0;)
            strbuf_append(sb, chars->items[i].u.s.p, chars->items[i].u.s.n);
        return jcapture_end(c, prev);
    }
    jlist *l = jv_iterate(c, v, line);
    jval out = jv_list(c, l->n, false);
    for (size_t i = l->n; i-- > 0;)
        jlist_push(c, out.u.l, l->items[i]);
    return out;
}

static jval f_safe(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    return jv_stringify(c, v, line);
}

static jval f_escape(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    v = jv_stringify(c, v, line);
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    for (size_t i = 0; i < v.u.s.n; i++) {
        char ch = v.u.s.p[i];
        switch (ch) {
        case '&':
            strbuf_append_str(sb, "&amp;");
            break;
        case '<':
            strbuf_append_str(sb, "&lt;");
            break;
        case '>':
            strbuf_append_str(sb, "&gt;");
            break;
        case '"':
            strbuf_append_str(sb, "&#34;");
            break;
        case '\'':
            strbuf_append_str(sb, "&#39;");
            break;
        default:
            strbuf_append_char(sb, ch);
        }
    }
    return jcapture_end(c, prev);
}

static jval f_abs(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    if (v.kind == JV_INT) {
        if (v.u.i == INT64_MIN) jfail(c, line, "integer overflow");
        return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    }
    if (v.kind == JV_BOOL) return jv_int(v.u.b);
    if (v.kind == JV_FLOAT) return jv_float(fabs(v.u.f));
    jfail(c, line, "bad operand type for abs(): '%s'", jv_type_name(v));
}

static double round_half_even(double x) {
    double r = round(x);
    if (fabs(x - trunc(x)) == 0.5) r = 2.0 * round(x / 2.0);
    return r;
}

static jval f_round(jctx *c, jval v, jargs *a, int line) {
    int64_t prec = need_int(c, jarg(a, 0, "precision", jv_int(0)), "round precision", line);
    jval method = jarg(a, 1, "method", jv_cstr("common"));
    if (method.kind != JV_STR) jfail(c, line, "method must be common, ceil or floor");
    if (v.kind != JV_INT && v.kind != JV_FLOAT && v.kind != JV_BOOL)
        jfail(c, line, "round: expected a number");
    bool common = method.u.s.n == 6 && !memcmp(method.u.s.p, "common", 6);
    bool ceil_m = method.u.s.n == 4 && !memcmp(method.u.s.p, "ceil", 4);
    bool floor_m = method.u.s.n == 5 && !memcmp(method.u.s.p, "floor", 5);
    if (!common && !ceil_m && !floor_m) jfail(c, line, "method must be common, ceil or floor");
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    double x = v.kind == JV_FLOAT ? v.u.f : v.kind == JV_INT ? (double)v.u.i : v.u.b;
    double m = pow(10.0, (double)prec);
    if (common) {
        if (v.kind != JV_FLOAT && prec >= 0) return v.kind == JV_BOOL ? jv_int(v.u.b) : v;
        double r;
        if (prec >= 0 && prec <= 30) {
            /* Python rounds the exact binary value half-to-even, as glibc's printf does */
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            r = strtod(buf, NULL);
        } else
            r = round_half_even(x * m) / m;
        if (v.kind != JV_FLOAT) return jv_int((int64_t)r);
        return jv_float(r);
    }
    return jv_float((ceil_m ? ceil(x * m) : floor(x * m)) / m);
}

static jval f_indent(jctx *c, jval v, jargs *a, int line) {
    jval width = jarg(a, 0, "width", jv_int(4));
    bool first = jv_truthy(jarg(a, 1, "first", jv_bool(false)));
    bool blank = jv_truthy(jarg(a, 2, "blank", jv_bool(false)));
    jval ind;
    if (width.kind == JV_STR)
        ind = width;
    else {
        int64_t w = need_int(c, width, "indent width", line);
        if (w < 0) w = 0;
        if (w > 1000) jfail(c, line, "indent: width too large");
        char *sp = jalloc(c, (size_t)w + 1);
        memset(sp, ' ', (size_t)w);
        ind = jv_str(sp, (size_t)w);
    }
    if (v.kind == JV_UNDEF)
        jfail(c, line, "%s", v.u.undef_name ? v.u.undef_name : "value is undefined");
    if (v.kind != JV_STR)
        jfail(c, line, "indent: unsupported operand type(s) for +=: '%s' and 'str'",
              jv_type_name(v));
    /* s + "\n", then splitlines() */
    jval lines = jv_list(c, 8, false);
    const char *s = v.u.s.p;
    size_t n = v.u.s.n, st = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || s[i] == '\n' || s[i] == '\r') {
            jlist_push(c, lines.u.l, jv_str(s + st, i - st));
            if (i < n && s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') i++;
            st = i + 1;
        }
    }
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    jlist *ls = lines.u.l;
    if (first) strbuf_append(sb, ind.u.s.p, ind.u.s.n);
    for (size_t i = 0; i < ls->n; i++) {
        jval ln = ls->items[i];
        if (i) {
            strbuf_append_char(sb, '\n');
            if (blank || ln.u.s.n) strbuf_append(sb, ind.u.s.p, ind.u.s.n);
        }
        strbuf_append(sb, ln.u.s.p, ln.u.s.n);
        if (sb->len > c->limits.max_output_bytes) jfail(c, line, "indent: result too long");
    }
    return jcapture_end(c, prev);
}

static bool is_word_cp(int32_t cp) {
    return cp == '_' || py_isalpha(cp) || py_isdigit(cp);
}

static jval f_wordcount(jctx *c, jval v, jargs *a, int line) {
    (void)a;
    v = jv_stringify(c, v, line);
    int64_t words = 0;
    bool in = false;
    size_t i = 0;
    while (i < v.u.s.n) {
        bool w = is_word_cp(cp_at(v.u.s.p, v.u.s.n, &i));
        if (w && !in) words++;
        in = w;
    }
    return jv_int(words);
}

static jval f_batch(jctx *c, jval v, jargs *a, int line) {
    int64_t size = need_int(c, jarg(a, 0, "linecount", jv_int(1)), "batch", line);
    jval fill = jarg(a, 1, "fill_with", jv_none());
    if (size <= 0) jfail(c, line, "batch: linecount must be positive");
    jlist *l = jv_iterate(c, v, line);
    jval out = jv_list(c, 0, false), cur = jv_list(c, 0, false);
    for (size_t i = 0; i < l->n; i++) {
        if ((int64_t)cur.u.l->n == size) {
            jlist_push(c, out.u.l, cur);
            cur = jv_list(c, 0, false);
        }
        jlist_push(c, cur.u.l, l->items[i]);
    }
    if (cur.u.l->n) {
        if (fill.kind != JV_NONE)
            while ((int64_t)cur.u.l->n < size)
                jlist_push(c, cur.u.l, fill);
        jlist_push(c, out.u.l, cur);
    }
    return out;
}

static jval minmax(jctx *c, jval v, jargs *a, int line, bool want_max) {
    bool cs = jv_truthy(jarg(a, 0, "case_sensitive", jv_bool(false)));
    jval attr = jarg(a, 1, "attribute", NONE_ARG);
    jlist *l = jv_iterate(c, v, line);
    if (!l->n) return jv_undef("No aggregated item, sequence was empty.");
    size_t best = 0;
    jval bk = NONE_ARG;
    for (size_t i = 0; i < l->n; i++) {
        jval k = l->items[i];
        if (given(attr)) k = attr_path(c, k, attr, line);
        k = lower_if_str(c, k, cs, line);
        if (i == 0) {
            bk = k;
            continue;
        }
        int r = jv_compare(c, k, bk, line);
        if (want_max ? r > 0 : r < 0) {
            best = i;
            bk = k;
        }
    }
    return l->items[best];
}
static jval f_min(jctx *c, jval v, jargs *a, int line) {
    return minmax(c, v, a, line, false);
}
static jval f_max(jctx *c, jval v, jargs *a, int line) {
    return minmax(c, v, a, line, true);
}

static jval f_sum(jctx *c, jval v, jargs *a, int line) {
    jval attr = jarg(a, 0, "attribute", NONE_ARG);
    jval acc = jarg(a, 1, "start", jv_int(0));
    jlist *l = jv_iterate(c, v, line);
    for (size_t i = 0; i < l->n; i++) {
        jval it = l->items[i];
        if (given(attr)) it = attr_path(c, it, attr, line);
        acc = jbinop(c, JOP_ADD, acc, it, line);
    }
    return acc;
}

static jval f_attr(jctx *c, jval v, jargs *a, int line) {
    jval name = need_str(c, jarg(a, 0, "name", NONE_ARG), "attr", line);
    if (v.kind == JV_DICT && !v.u.d->is_namespace) {
        bool found;
        jval m = jmethod_get(c, v, jstrdup_n(c, name.u.s.p, name.u.s.n), &found);
        return found ? m : jv_undef("no such attribute");
    }
    return jgetattr(c, v, jstrdup_n(c, name.u.s.p, name.u.s.n), line);
}

static jval f_format(jctx *c, jval v, jargs *a, int line) {
    v = jv_stringify(c, v, line);
    jval t = jv_list(c, a->npos, true);
    for (size_t i = 0; i < a->npos; i++)
        jlist_push(c, t.u.l, a->pos[i]);
    return jbinop(c, JOP_MOD, v, t, line);
}

static jval f_center(jctx *c, jval v, jargs *a, int line) {
    int64_t w = need_int(c, jarg(a, 0, "width", jv_int(80)), "center", line);
    v = jv_stringify(c, v, line);
    int64_t n = (int64_t)utf8_count(v.u.s.p, v.u.s.n);
    if (w > 100000) jfail(c, line, "center: width too large");
    if (w <= n) return v;
    int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    for (int64_t i = 0; i < left; i++)
        strbuf_append_char(sb, ' ');
    strbuf_append(sb, v.u.s.p, v.u.s.n);
    for (int64_t i = 0; i < pad - left; i++)
        strbuf_append_char(sb, ' ');
    return jcapture_end(c, prev);
}

static const struct {
    const char *name;
    filter_fn fn;
} FILTERS[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_escape},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

jval jfilter_apply(jctx *c, const char *name, jval input, jargs *a, int line) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (!strcmp(FILTERS[i].name, name)) return FILTERS[i].fn(c, input, a, line);
    jfail(c, line, "No filter named '%s'.", name);
}

bool jinja_filter_exists(const char *name) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (!strcmp(FILTERS[i].name, name)) return true;
    return false;
}

/* ================= tests ================= */
static const char *const TESTS[] = {
    "defined",     "undefined", "none",        "string", "number",  "integer",  "float", "mapping",
    "iterable",    "sequence",  "boolean",     "true",   "false",   "callable", "odd",   "even",
    "divisibleby", "eq",        "equalto",     "==",     "ne",      "!=",       "lt",    "lessthan",
    "<",           "gt",        "greaterthan", ">",      "ge",      ">=",       "le",    "<=",
    "in",          "lower",     "upper",       "sameas", "escaped", "filter",   "test",  NULL};

bool jinja_test_exists(const char *name) {
    for (int i = 0; TESTS[i]; i++)
        if (!strcmp(TESTS[i], name)) return true;
    return false;
}

static int cmp_op_of(const char *n) {
    if (!strcmp(n, "eq") || !strcmp(n, "equalto") || !strcmp(n, "==")) return JOP_EQ;
    if (!strcmp(n, "ne") || !strcmp(n, "!=")) return JOP_NE;
    if (!strcmp(n, "lt") || !strcmp(n, "lessthan") || !strcmp(n, "<")) return JOP_LT;
    if (!strcmp(n, "gt") || !strcmp(n, "greaterthan") || !strcmp(n, ">")) return JOP_GT;
    if (!strcmp(n, "ge") || !strcmp(n, ">=")) return JOP_GE;
    if (!strcmp(n, "le") || !strcmp(n, "<=")) return JOP_LE;
    return 0;
}

bool jtest_apply(jctx *c, const char *name, jval v, jargs *a, int line) {
    int op = cmp_op_of(name);
    if (op) {
        if (!a->npos) jfail(c, line, "test '%s' needs an argument", name);
        return jv_truthy(jbinop(c, op, v, a->pos[0], line));
    }
    if (!strcmp(name, "defined")) return v.kind != JV_UNDEF;
    if (!strcmp(name, "undefined")) return v.kind == JV_UNDEF;
    if (!strcmp(name, "none")) return v.kind == JV_NONE;
    if (!strcmp(name, "string")) return v.kind == JV_STR;
    if (!strcmp(name, "number")) return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
    if (!strcmp(name, "integer")) return v.kind == JV_INT;
    if (!strcmp(name, "float")) return v.kind == JV_FLOAT;
    if (!strcmp(name, "mapping")) return v.kind == JV_DICT && !v.u.d->is_namespace;
    if (!strcmp(name, "iterable"))
        return v.kind == JV_STR || v.kind == JV_LIST ||
               (v.kind == JV_DICT && !v.u.d->is_namespace) || v.kind == JV_UNDEF;
    if (!strcmp(name, "sequence"))
        return v.kind == JV_STR || v.kind == JV_LIST ||
               (v.kind == JV_DICT && !v.u.d->is_namespace) || v.kind == JV_UNDEF;
    if (!strcmp(name, "boolean")) return v.kind == JV_BOOL;
    if (!strcmp(name, "true")) return v.kind == JV_BOOL && v.u.b;
    if (!strcmp(name, "false")) return v.kind == JV_BOOL && !v.u.b;
    if (!strcmp(name, "callable")) return v.kind == JV_FUNC;
    if (!strcmp(name, "escaped")) return false;
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (v.kind == JV_UNDEF)
            jfail(c, line, "%s", v.u.undef_name ? v.u.undef_name : "value is undefined");
        if (v.kind == JV_FLOAT) {
            double m = fmod(v.u.f, 2.0);
            if (m < 0) m += 2.0;
            return name[0] == 'o' ? m == 1.0 : m == 0.0;
        }
        int64_t i = need_int(c, v, name, line);
        return name[0] == 'o' ? (i % 2 != 0) : (i % 2 == 0);
    }
    if (!strcmp(name, "divisibleby")) {
        if (!a->npos) jfail(c, line, "divisibleby needs an argument");
        return jv_truthy(
            jbinop(c, JOP_EQ, jbinop(c, JOP_MOD, v, a->pos[0], line), jv_int(0), line));
    }
    if (!strcmp(name, "in")) {
        if (!a->npos) jfail(c, line, "test 'in' needs an argument");
        return jv_truthy(jbinop(c, JOP_IN, v, a->pos[0], line));
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        /* str(v).islower() / isupper(): some cased character, and none of the other case */
        jval s = jv_stringify(c, v, line);
        bool any_cased = false, want_lower = name[0] == 'l';
        size_t i = 0;
        while (i < s.u.s.n) {
            int32_t cp = cp_at(s.u.s.p, s.u.s.n, &i);
            utf8proc_category_t k = utf8proc_category(cp);
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) {
                if (want_lower) return false;
                any_cased = true;
            } else if (k == UTF8PROC_CATEGORY_LL) {
                if (!want_lower) return false;
                any_cased = true;
            }
        }
        return any_cased;
    }
    if (!strcmp(name, "sameas")) {
        if (!a->npos) jfail(c, line, "sameas needs an argument");
        jval o = a->pos[0];
        if (v.kind != o.kind) return false;
        if (v.kind == JV_NONE || v.kind == JV_UNDEF) return true;
        if (v.kind == JV_BOOL) return v.u.b == o.u.b;
        if (v.kind == JV_INT) return v.u.i == o.u.i && v.u.i >= -5 && v.u.i <= 256;
        if (v.kind == JV_LIST) return v.u.l == o.u.l;
        if (v.kind == JV_DICT) return v.u.d == o.u.d;
        if (v.kind == JV_FUNC) return v.u.fn == o.u.fn;
        return false;
    }
    if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        if (v.kind != JV_STR) return false;
        char *nm = jstrdup_n(c, v.u.s.p, v.u.s.n);
        return name[0] == 'f' ? jinja_filter_exists(nm) : jinja_test_exists(nm);
    }
    jfail(c, line, "No test named '%s'.", name);
}

/* ================= methods ================= */
static jval s_self(jval self) {
    return self;
}

static jval m_strip(jctx *c, jval self, jargs *a, int line) {
    (void)line;
    jval ch = jarg(a, 0, NULL, NONE_ARG);
    if (ch.kind == JV_NONE) ch = NONE_ARG;
    return do_strip(c, s_self(self), ch, true, true);
}
static jval m_lstrip(jctx *c, jval self, jargs *a, int line) {
    (void)line;
    jval ch = jarg(a, 0, NULL, NONE_ARG);
    if (ch.kind == JV_NONE) ch = NONE_ARG;
    return do_strip(c, self, ch, true, false);
}
static jval m_rstrip(jctx *c, jval self, jargs *a, int line) {
    (void)line;
    jval ch = jarg(a, 0, NULL, NONE_ARG);
    if (ch.kind == JV_NONE) ch = NONE_ARG;
    return do_strip(c, self, ch, false, true);
}

static jval m_split(jctx *c, jval self, jargs *a, int line) {
    jval sep = jarg(a, 0, "sep", jv_none());
    int64_t maxsplit = need_int(c, jarg(a, 1, "maxsplit", jv_int(-1)), "split maxsplit", line);
    jval out = jv_list(c, 4, false);
    const char *s = self.u.s.p;
    size_t n = self.u.s.n;
    if (sep.kind == JV_NONE || sep.kind == JV_UNDEF) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            while (i < n) {
                size_t k = i;
                if (!py_isspace(cp_at(s, n, &k))) break;
                i = k;
            }
            if (i >= n) break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                size_t e = n;
                while (e > i) {
                    size_t st = e - 1;
                    while (st > i && ((unsigned char)s[st] & 0xC0) == 0x80)
                        st--;
                    size_t k = st;
                    if (!py_isspace(cp_at(s, n, &k))) break;
                    e = st;
                }
                jlist_push(c, out.u.l, jv_str(s + i, e - i));
                break;
            }
            size_t st = i;
            while (i < n) {
                size_t k = i;
                if (py_isspace(cp_at(s, n, &k))) break;
                i = k;
            }
            jlist_push(c, out.u.l, jv_str(s + st, i - st));
            splits++;
        }
        return out;
    }
    need_str(c, sep, "split", line);
    if (!sep.u.s.n) jfail(c, line, "empty separator");
    size_t i = 0;
    int64_t splits = 0;
    for (;;) {
        const char *hit =
            (maxsplit < 0 || splits < maxsplit) ? memmem(s + i, n - i, sep.u.s.p, sep.u.s.n) : NULL;
        if (!hit) {
            jlist_push(c, out.u.l, jv_str(s + i, n - i));
            break;
        }
        jlist_push(c, out.u.l, jv_str(s + i, (size_t)(hit - (s + i))));
        i = (size_t)(hit - s) + sep.u.s.n;
        splits++;
    }
    return out;
}

static bool affix_match(jctx *c, jval self, jval arg, bool prefix, int line) {
    if (arg.kind == JV_LIST && arg.u.l->tuple) {
        for (size_t i = 0; i < arg.u.l->n; i++)
            if (affix_match(c, self, arg.u.l->items[i], prefix, line)) return true;
        return false;
    }
    if (arg.kind != JV_STR)
        jfail(c, line, "%s first arg must be str or a tuple of str, not %s",
              prefix ? "startswith" : "endswith", jv_type_name(arg));
    if (arg.u.s.n > self.u.s.n) return false;
    return memcmp(prefix ? self.u.s.p : self.u.s.p + self.u.s.n - arg.u.s.n, arg.u.s.p,
                  arg.u.s.n) == 0;
}

static jval m_startswith(jctx *c, jval self, jargs *a, int line) {
    return jv_bool(affix_match(c, self, jarg(a, 0, NULL, jv_none()), true, line));
}
static jval m_endswith(jctx *c, jval self, jargs *a, int line) {
    return jv_bool(affix_match(c, self, jarg(a, 0, NULL, jv_none()), false, line));
}
static jval m_replace(jctx *c, jval self, jargs *a, int line) {
    jval old = need_str(c, jarg(a, 0, NULL, jv_none()), "replace", line);
    jval new = need_str(c, jarg(a, 1, NULL, jv_none()), "replace", line);
    return str_replace(c, self, old, new,
                       need_int(c, jarg(a, 2, "count", jv_int(-1)), "replace count", line), line);
}
static jval m_upper(jctx *c, jval self, jargs *a, int line) {
    (void)a;
    return change_case(c, self, CASE_UPPER, line);
}
static jval m_lower(jctx *c, jval self, jargs *a, int line) {
    (void)a;
    return change_case(c, self, CASE_LOWER, line);
}
static jval m_title(jctx *c, jval self, jargs *a, int line) {
    (void)a;
    return change_case(c, self, CASE_TITLE, line);
}
static jval m_capitalize(jctx *c, jval self, jargs *a, int line) {
    (void)a;
    return change_case(c, self, CASE_CAPITALIZE, line);
}

static jval find_impl(jctx *c, jval self, jargs *a, int line, bool reverse) {
    jval sub = need_str(c, jarg(a, 0, NULL, jv_none()), "find", line);
    const char *s = self.u.s.p;
    size_t n = self.u.s.n;
    const char *hit = NULL;
    if (!reverse)
        hit = sub.u.s.n ? memmem(s, n, sub.u.s.p, sub.u.s.n) : s;
    else if (sub.u.s.n <= n)
        for (size_t i = n - sub.u.s.n + 1; i-- > 0;)
            if (!memcmp(s + i, sub.u.s.p, sub.u.s.n)) {
                hit = s + i;
                break;
            }
    if (!hit) return jv_int(-1);
    return jv_int((int64_t)utf8_count(s, (size_t)(hit - s)));
}
static jval m_find(jctx *c, jval self, jargs *a, int line) {
    return find_impl(c, self, a, line, false);
}
static jval m_rfind(jctx *c, jval self, jargs *a, int line) {
    return find_impl(c, self, a, line, true);
}

static jval m_count(jctx *c, jval self, jargs *a, int line) {
    jval sub = jarg(a, 0, NULL, jv_none());
    if (self.kind == JV_LIST) {
        int64_t k = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            k += jv_equal(self.u.l->items[i], sub);
        return jv_int(k);
    }
    need_str(c, sub, "count", line);
    if (!sub.u.s.n) return jv_int((int64_t)utf8_count(self.u.s.p, self.u.s.n) + 1);
    int64_t k = 0;
    size_t i = 0;
    const char *hit;
    while ((hit = memmem(self.u.s.p + i, self.u.s.n - i, sub.u.s.p, sub.u.s.n))) {
        k++;
        i = (size_t)(hit - self.u.s.p) + sub.u.s.n;
    }
    return jv_int(k);
}

static jval m_join(jctx *c, jval self, jargs *a, int line) {
    jlist *items = jv_iterate(c, jarg(a, 0, NULL, jv_none()), line);
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    for (size_t i = 0; i < items->n; i++) {
        if (items->items[i].kind != JV_STR)
            jfail(c, line, "sequence item %zu: expected str instance, %s found", i,
                  jv_type_name(items->items[i]));
        if (i) strbuf_append(sb, self.u.s.p, self.u.s.n);
        strbuf_append(sb, items->items[i].u.s.p, items->items[i].u.s.n);
        if (sb->len > c->limits.max_output_bytes) jfail(c, line, "join: result too long");
    }
    return jcapture_end(c, prev);
}

static jval m_format(jctx *c, jval self, jargs *a, int line) {
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    size_t auto_idx = 0;
    const char *s = self.u.s.p;
    size_t n = self.u.s.n;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '{' && i + 1 < n && s[i + 1] == '{') {
            strbuf_append_char(sb, '{');
            i++;
        } else if (s[i] == '}' && i + 1 < n && s[i + 1] == '}') {
            strbuf_append_char(sb, '}');
            i++;
        } else if (s[i] == '{') {
            size_t e = i + 1;
            while (e < n && s[e] != '}')
                e++;
            if (e >= n) jfail(c, line, "Single '{' encountered in format string");
            const char *f = s + i + 1;
            size_t fl = e - i - 1;
            if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) ||
                memchr(f, '[', fl))
                jfail(c, line, "format: conversions and format specs are not supported");
            jval v;
            if (fl == 0) {
                if (auto_idx >= a->npos)
                    jfail(c, line, "Replacement index %zu out of range", auto_idx);
                v = a->pos[auto_idx++];
            } else if (isdigit((unsigned char)f[0])) {
                size_t idx = (size_t)strtoul(f, NULL, 10);
                if (idx >= a->npos) jfail(c, line, "Replacement index %zu out of range", idx);
                v = a->pos[idx];
            } else {
                char *nm = jstrdup_n(c, f, fl);
                v = jarg(a, (size_t)-1, nm, NONE_ARG);
                if (!given(v)) jfail(c, line, "format: missing argument '%s'", nm);
            }
            jv_to_str(c, v, sb, line);
            i = e;
        } else if (s[i] == '}') {
            jfail(c, line, "Single '}' encountered in format string");
        } else
            strbuf_append_char(sb, s[i]);
    }
    return jcapture_end(c, prev);
}

/* Python's str.isdigit / isspace / isalpha: true when the string is non-empty and every code
 * point passes the class test. */
static jval all_code_points(jval self, bool (*is_class)(int32_t)) {
    if (!self.u.s.n) return jv_bool(false);
    size_t i = 0;
    while (i < self.u.s.n)
        if (!is_class(cp_at(self.u.s.p, self.u.s.n, &i))) return jv_bool(false);
    return jv_bool(true);
}
static jval m_isdigit(jctx *c, jval self, jargs *a, int line) {
    (void)c, (void)a, (void)line;
    return all_code_points(self, py_isdigit);
}
static jval m_isspace(jctx *c, jval self, jargs *a, int line) {
    (void)c, (void)a, (void)line;
    return all_code_points(self, py_isspace);
}
static jval m_isalpha(jctx *c, jval self, jargs *a, int line) {
    (void)c, (void)a, (void)line;
    return all_code_points(self, py_isalpha);
}

static jval m_splitlines(jctx *c, jval self, jargs *a, int line) {
    (void)a;
    (void)line;
    jval out = jv_list(c, 4, false);
    const char *s = self.u.s.p;
    size_t n = self.u.s.n, st = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\n' || s[i] == '\r') {
            jlist_push(c, out.u.l, jv_str(s + st, i - st));
            if (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') i++;
            st = i + 1;
        }
    if (st < n) jlist_push(c, out.u.l, jv_str(s + st, n - st));
    return out;
}

static jval m_items(jctx *c, jval self, jargs *a, int line) {
    return f_items(c, self, a, line);
}
static jval m_keys(jctx *c, jval self, jargs *a, int line) {
    (void)a;
    (void)line;
    jval out = jv_list(c, self.u.d->n, false);
    for (size_t i = 0; i < self.u.d->n; i++)
        jlist_push(c, out.u.l, self.u.d->keys[i]);
    return out;
}
static jval m_values(jctx *c, jval self, jargs *a, int line) {
    (void)a;
    (void)line;
    jval out = jv_list(c, self.u.d->n, false);
    for (size_t i = 0; i < self.u.d->n; i++)
        jlist_push(c, out.u.l, self.u.d->vals[i]);
    return out;
}
static jval m_get(jctx *c, jval self, jargs *a, int line) {
    (void)c;
    (void)line;
    jval key = jarg(a, 0, NULL, jv_none());
    jval out;
    if (jdict_get(self.u.d, key, &out)) return out;
    return jarg(a, 1, NULL, jv_none());
}
static jval m_copy(jctx *c, jval self, jargs *a, int line) {
    (void)a;
    if (self.kind == JV_LIST) return f_list(c, self, a, line);
    jval d = jv_dict(c, self.u.d->n);
    for (size_t i = 0; i < self.u.d->n; i++)
        jdict_set(c, d.u.d, self.u.d->keys[i], self.u.d->vals[i]);
    return d;
}
static jval m_index(jctx *c, jval self, jargs *a, int line) {
    jval x = jarg(a, 0, NULL, jv_none());
    for (size_t i = 0; i < self.u.l->n; i++)
        if (jv_equal(self.u.l->items[i], x)) return jv_int((int64_t)i);
    jfail(c, line, "value is not in list");
}

typedef struct method_entry {
    jkind kind;
    const char *name;
    jbuiltin_fn fn;
} method_entry;

static const method_entry METHODS[] = {
    {JV_STR, "strip", m_strip},
    {JV_STR, "lstrip", m_lstrip},
    {JV_STR, "rstrip", m_rstrip},
    {JV_STR, "split", m_split},
    {JV_STR, "startswith", m_startswith},
    {JV_STR, "endswith", m_endswith},
    {JV_STR, "replace", m_replace},
    {JV_STR, "upper", m_upper},
    {JV_STR, "lower", m_lower},
    {JV_STR, "title", m_title},
    {JV_STR, "capitalize", m_capitalize},
    {JV_STR, "find", m_find},
    {JV_STR, "rfind", m_rfind},
    {JV_STR, "count", m_count},
    {JV_STR, "join", m_join},
    {JV_STR, "format", m_format},
    {JV_STR, "isdigit", m_isdigit},
    {JV_STR, "isspace", m_isspace},
    {JV_STR, "isalpha", m_isalpha},
    {JV_STR, "splitlines", m_splitlines},
    {JV_DICT, "items", m_items},
    {JV_DICT, "keys", m_keys},
    {JV_DICT, "values", m_values},
    {JV_DICT, "get", m_get},
    {JV_DICT, "copy", m_copy},
    {JV_LIST, "count", m_count},
    {JV_LIST, "index", m_index},
    {JV_LIST, "copy", m_copy},
};

static const char *const UNSAFE[] = {"append",  "extend", "insert",  "pop",    "remove",
                                     "reverse", "sort",   "clear",   "update", "setdefault",
                                     "popitem", "add",    "discard", NULL};

jval jmethod_get(jctx *c, jval obj, const char *name, bool *found) {
    *found = false;
    if (obj.kind == JV_DICT && obj.u.d->is_namespace) return NONE_ARG;
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (METHODS[i].kind == obj.kind && !strcmp(METHODS[i].name, name)) {
            *found = true;
            return jv_builtin(c, METHODS[i].name, METHODS[i].fn, obj);
        }
    if (obj.kind == JV_LIST || obj.kind == JV_DICT)
        for (int i = 0; UNSAFE[i]; i++)
            if (!strcmp(UNSAFE[i], name)) {
                *found = true;
                char buf[160];
                snprintf(buf, sizeof buf, "access to attribute '%s' of '%s' object is unsafe.",
                         name, jv_type_name(obj));
                return jv_undef(jstrdup_n(c, buf, strlen(buf)));
            }
    return NONE_ARG;
}

/* ================= globals ================= */
static jval g_range(jctx *c, jval self, jargs *a, int line) {
    (void)self;
    int64_t start = 0, stop, step = 1;
    if (a->nkw) jfail(c, line, "range() takes no keyword arguments");
    if (a->npos == 1)
        stop = need_int(c, a->pos[0], "range", line);
    else if (a->npos == 2 || a->npos == 3) {
        start = need_int(c, a->pos[0], "range", line);
        stop = need_int(c, a->pos[1], "range", line);
        if (a->npos == 3) step = need_int(c, a->pos[2], "range", line);
    } else
        jfail(c, line, "range expected 1 to 3 arguments, got %zu", a->npos);
    if (step == 0) jfail(c, line, "range() arg 3 must not be zero");
    double count = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                            : ceil(((double)start - (double)stop) / (double)-step);
    if (count > 100000)
        jfail(c, line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    jval out = jv_list(c, count > 0 ? (size_t)count : 0, false);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        jlist_push(c, out.u.l, jv_int(i));
    return out;
}

static jval g_dict(jctx *c, jval self, jargs *a, int line) {
    (void)self;
    jval d = jv_dict(c, a->nkw);
    if (a->npos > 1) jfail(c, line, "dict expected at most 1 argument");
    if (a->npos == 1) {
        jval src = a->pos[0];
        if (src.kind == JV_DICT && !src.u.d->is_namespace)
            for (size_t i = 0; i < src.u.d->n; i++)
                jdict_set(c, d.u.d, src.u.d->keys[i], src.u.d->vals[i]);
        else {
            jlist *items = jv_iterate(c, src, line);
            for (size_t i = 0; i < items->n; i++) {
                jlist *pair = jv_iterate(c, items->items[i], line);
                if (pair->n != 2)
                    jfail(c, line, "dictionary update sequence element has wrong length");
                jdict_set(c, d.u.d, pair->items[0], pair->items[1]);
            }
        }
    }
    for (size_t i = 0; i < a->nkw; i++)
        jdict_set(c, d.u.d, jv_cstr(a->kwnames[i]), a->kwvals[i]);
    return d;
}

static jval g_namespace(jctx *c, jval self, jargs *a, int line) {
    jval d = g_dict(c, self, a, line);
    d.u.d->is_namespace = true;
    return d;
}

static jval g_raise_exception(jctx *c, jval self, jargs *a, int line) {
    (void)self;
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    jv_to_str(c, jarg(a, 0, "message", jv_cstr("")), sb, line);
    jval msg = jcapture_end(c, prev);
    jfail(c, line, "%.*s", (int)(msg.u.s.n > 400 ? 400 : msg.u.s.n), msg.u.s.p);
}

/* The current local time, or the UTC time of SOURCE_DATE_EPOCH when that is set (the
 * reproducible-builds convention): templates that print today's date (gpt-oss) then render the
 * same prompt on every day, which is what reference fixtures and prompt caches need. */
static void template_now(struct tm *tm) {
    const char *epoch = getenv("SOURCE_DATE_EPOCH");
    char *end;
    long long v = epoch && *epoch ? strtoll(epoch, &end, 10) : -1;
    if (v >= 0 && *end == 0) {
        time_t t = (time_t)v;
        gmtime_r(&t, tm);
        return;
    }
    time_t now = time(NULL);
    localtime_r(&now, tm);
}

static jval g_strftime_now(jctx *c, jval self, jargs *a, int line) {
    (void)self;
    jval fmt = need_str(c, jarg(a, 0, "format", jv_none()), "strftime_now", line);
    struct tm tm;
    template_now(&tm);
    char buf[512];
    char *f = jstrdup_n(c, fmt.u.s.p, fmt.u.s.n);
    size_t n = strftime(buf, sizeof buf, f, &tm);
    return jv_str_copy(c, buf, n);
}

void jglobals_install(jctx *c, jframe *root) {
    jframe_set(c, root, "range", jv_builtin(c, "range", g_range, NONE_ARG));
    jframe_set(c, root, "dict", jv_builtin(c, "dict", g_dict, NONE_ARG));
    jframe_set(c, root, "namespace", jv_builtin(c, "namespace", g_namespace, NONE_ARG));
    jframe_set(c, root, "raise_exception",
               jv_builtin(c, "raise_exception", g_raise_exception, NONE_ARG));
    jframe_set(c, root, "strftime_now", jv_builtin(c, "strftime_now", g_strftime_now, NONE_ARG));
}
