/* jinja values — Python's data model as far as chat templates see it: None, bool, int, float,
 * str (UTF-8), list/tuple, dict (insertion-ordered), namespace, callables, and Jinja's Undefined.
 * str(), repr() and json.dumps() print exactly what CPython prints.
 * Refuses: big integers (int64 overflow is an error), sets, bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

jval jv_undef(const char *name) {
    jval v = {.kind = JV_UNDEF};
    v.u.undef_name = name;
    return v;
}
jval jv_none(void) {
    return (jval){.kind = JV_NONE};
}
jval jv_builtin(jctx *c, const char *name, jbuiltin_fn fn, jval self) {
    jval v = {.kind = JV_FUNC};
    v.u.fn = jalloc(c, sizeof *v.u.fn);
    v.u.fn->name = name;
    v.u.fn->builtin = fn;
    v.u.fn->self = self;
    return v;
}

jval jv_bool(bool b) {
    jval v = {.kind = JV_BOOL};
    v.u.b = b;
    return v;
}
jval jv_int(int64_t i) {
    jval v = {.kind = JV_INT};
    v.u.i = i;
    return v;
}
jval jv_float(double f) {
    jval v = {.kind = JV_FLOAT};
    v.u.f = f;
    return v;
}
jval jv_str(const char *p, size_t n) {
    jval v = {.kind = JV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
jval jv_cstr(const char *s) {
    return jv_str(s, strlen(s));
}
jval jv_str_copy(jctx *c, const char *p, size_t n) {
    return jv_str(jstrdup_n(c, p, n), n);
}

jval jv_list(jctx *c, size_t cap, bool tuple) {
    jval v = {.kind = JV_LIST};
    v.u.l = jalloc(c, sizeof *v.u.l);
    v.u.l->tuple = tuple;
    if (cap) {
        v.u.l->items = jalloc(c, cap * sizeof(jval));
        v.u.l->cap = cap;
    }
    return v;
}

jval jv_dict(jctx *c, size_t cap) {
    jval v = {.kind = JV_DICT};
    v.u.d = jalloc(c, sizeof *v.u.d);
    if (cap) {
        v.u.d->keys = jalloc(c, cap * sizeof(jval));
        v.u.d->vals = jalloc(c, cap * sizeof(jval));
        v.u.d->cap = cap;
    }
    return v;
}

void jlist_push(jctx *c, jlist *l, jval v) {
    l->items = jgrow(c, l->items, l->n, &l->cap, sizeof(jval));
    l->items[l->n++] = v;
}

static bool jv_hash_equal(jval a, jval b) {
    /* dict keys: Python treats 1, 1.0 and True as the same key */
    return jv_equal(a, b);
}

static void jdict_append(jctx *c, jdict *d, jval key, jval v);

void jdict_set(jctx *c, jdict *d, jval key, jval v) {
    /* the key scan is linear: charge it to the render's work budget so that building a huge
     * dict fails instead of running for minutes */
    c->iterations += (long long)(d->n >> 4);
    if (c->iterations > c->limits.max_iterations)
        jfail(c, 0, "template exceeded %lld loop iterations and calls", c->limits.max_iterations);
    for (size_t i = 0; i < d->n; i++)
        if (jv_hash_equal(d->keys[i], key)) {
            d->vals[i] = v;
            return;
        }
    jdict_append(c, d, key, v);
}

/* adds a key known to be new */
static void jdict_append(jctx *c, jdict *d, jval key, jval v) {
    size_t keys_cap = d->cap; /* keys and vals share one capacity */
    d->keys = jgrow(c, d->keys, d->n, &keys_cap, sizeof(jval));
    d->vals = jgrow(c, d->vals, d->n, &d->cap, sizeof(jval));
    d->keys[d->n] = key;
    d->vals[d->n] = v;
    d->n++;
}

bool jdict_get(const jdict *d, jval key, jval *out) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_hash_equal(d->keys[i], key)) {
            *out = d->vals[i];
            return true;
        }
    return false;
}

bool jdict_get_str(const jdict *d, const char *key, jval *out) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].kind == JV_STR && d->keys[i].u.s.n == n &&
            memcmp(d->keys[i].u.s.p, key, n) == 0) {
            *out = d->vals[i];
            return true;
        }
    return false;
}

jval jv_from_json(jctx *c, const json_t *j) {
    if (!j) return jv_none();
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jval d = jv_dict(c, json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            jdict_append(c, d.u.d, jv_str_copy(c, k, strlen(k)), jv_from_json(c, v));
        }
        return d;
    }
    case JSON_ARRAY: {
        jval l = jv_list(c, json_array_size(j), false);
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) jlist_push(c, l.u.l, jv_from_json(c, v));
        return l;
    }
    case JSON_STRING:
        return jv_str_copy(c, json_string_value(j), json_string_length(j));
    case JSON_INTEGER:
        return jv_int(json_integer_value(j));
    case JSON_REAL:
        return jv_float(json_real_value(j));
    case JSON_TRUE:
        return jv_bool(true);
    case JSON_FALSE:
        return jv_bool(false);
    case JSON_NULL:
        return jv_none();
    }
    return jv_none();
}

bool jv_truthy(jval v) {
    switch (v.kind) {
    case JV_UNDEF:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v.u.b;
    case JV_INT:
        return v.u.i != 0;
    case JV_FLOAT:
        return v.u.f != 0.0;
    case JV_STR:
        return v.u.s.n != 0;
    case JV_LIST:
        return v.u.l->n != 0;
    case JV_DICT:
        return v.u.d->is_namespace || v.u.d->n != 0;
    default:
        return true;
    }
}

static bool jv_is_number(jval v) {
    return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
}
static double jv_num(jval v) {
    return v.kind == JV_FLOAT ? v.u.f : v.kind == JV_INT ? (double)v.u.i : (double)v.u.b;
}

static bool jv_equal_depth(jval a, jval b, int depth);
bool jv_equal(jval a, jval b) {
    return jv_equal_depth(a, b, 0);
}

/* values nested deeper than this compare unequal instead of exhausting the stack */
#define JV_MAX_NESTING 1000

static bool jv_equal_depth(jval a, jval b, int depth) {
    if (depth > JV_MAX_NESTING) return false;
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) {
            int64_t x = a.kind == JV_INT ? a.u.i : a.u.b, y = b.kind == JV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return jv_num(a) == jv_num(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case JV_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal_depth(a.u.l->items[i], b.u.l->items[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a.u.d->is_namespace || b.u.d->is_namespace) return a.u.d == b.u.d;
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jval other;
            if (!jdict_get(b.u.d, a.u.d->keys[i], &other) ||
                !jv_equal_depth(a.u.d->vals[i], other, depth + 1))
                return false;
        }
        return true;
    case JV_FUNC:
        return a.u.fn == b.u.fn;
    case JV_LOOP:
        return a.u.loop == b.u.loop;
    default:
        return false;
    }
}

const char *jv_type_name(jval v) {
    switch (v.kind) {
    case JV_UNDEF:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STR:
        return "str";
    case JV_LIST:
        return v.u.l->tuple ? "tuple" : "list";
    case JV_DICT:
        return v.u.d->is_namespace ? "Namespace" : "dict";
    case JV_FUNC:
        return v.u.fn->macro ? "Macro" : "function";
    case JV_LOOP:
        return "LoopContext";
    }
    return "object";
}

static int jv_compare_depth(jctx *c, jval a, jval b, int line, int depth);
int jv_compare(jctx *c, jval a, jval b, int line) {
    return jv_compare_depth(c, a, b, line, 0);
}

static int jv_compare_depth(jctx *c, jval a, jval b, int line, int depth) {
    if (depth > JV_MAX_NESTING) jfail(c, line, "values nested too deeply to compare");
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) {
            int64_t x = a.kind == JV_INT ? a.u.i : a.u.b, y = b.kind == JV_INT ? b.u.i : b.u.b;
            return (x > y) - (x < y);
        }
        double x = jv_num(a), y = jv_num(b);
        return (x > y) - (x < y);
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = memcmp(a.u.s.p, b.u.s.p, n);
        if (r) return r < 0 ? -1 : 1;
        return (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a.u.l->items[i], b.u.l->items[i])) continue;
            return jv_compare_depth(c, a.u.l->items[i], b.u.l->items[i], line, depth + 1);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    jfail(c, line, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
          jv_type_name(b));
}

/* ---- UTF-8 ---- */
size_t utf8_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

size_t utf8_offset(const char *s, size_t n, size_t idx) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (k == idx) return i;
            k++;
        }
    }
    return n;
}

/* decodes one code point at s[*i] (advances *i); invalid bytes come back as themselves */
static uint32_t utf8_next(const char *s, size_t n, size_t *i) {
    unsigned char b = (unsigned char)s[*i];
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
    if (*i + (size_t)len > n) len = 1;
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < len; k++)
        cp = (cp << 6) | ((unsigned char)s[*i + (size_t)k] & 0x3F);
    *i += (size_t)len;
    return cp;
}

/* ---- printing ---- */
void jv_format_float(double f, strbuf *sb) {
    if (isnan(f)) {
        strbuf_append_str(sb, "nan");
        return;
    }
    if (isinf(f)) {
        strbuf_append_str(sb, f < 0 ? "-inf" : "inf");
        return;
    }
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf = [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = buf;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    if (neg) strbuf_append_char(sb, '-');
    if (exp >= -5 + 1 && exp < 16) {
        if (exp < 0) {
            strbuf_append_str(sb, "0.");
            for (int i = 0; i < -exp - 1; i++)
                strbuf_append_char(sb, '0');
            strbuf_append(sb, digits, (size_t)nd);
        } else {
            for (int i = 0; i <= exp; i++)
                strbuf_append_char(sb, i < nd ? digits[i] : '0');
            strbuf_append_char(sb, '.');
            if (nd > exp + 1)
                strbuf_append(sb, digits + exp + 1, (size_t)(nd - exp - 1));
            else
                strbuf_append_char(sb, '0');
        }
    } else {
        strbuf_append_char(sb, digits[0]);
        if (nd > 1) {
            strbuf_append_char(sb, '.');
            strbuf_append(sb, digits + 1, (size_t)(nd - 1));
        }
        strbuf_appendf(sb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static void repr_str(const char *s, size_t n, strbuf *sb) {
    bool has_single = memchr(s, '\'', n) != NULL, has_double = memchr(s, '"', n) != NULL;
    char q = has_single && !has_double ? '"' : '\'';
    strbuf_append_char(sb, q);
    size_t i = 0;
    while (i < n) {
        size_t start = i;
        uint32_t cp = utf8_next(s, n, &i);
        if (cp == (uint32_t)q || cp == '\\') {
            strbuf_append_char(sb, '\\');
            strbuf_append_char(sb, (char)cp);
        } else if (cp == '\n')
            strbuf_append_str(sb, "\\n");
        else if (cp == '\r')
            strbuf_append_str(sb, "\\r");
        else if (cp == '\t')
            strbuf_append_str(sb, "\\t");
        else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad)
            strbuf_appendf(sb, "\\x%02x", cp);
        else if (cp == 0x2028 || cp == 0x2029 || (cp >= 0x200b && cp <= 0x200f) || cp == 0xfeff)
            strbuf_appendf(sb, "\\u%04x", cp);
        else
            strbuf_append(sb, s + start, i - start);
    }
    strbuf_append_char(sb, q);
}

static void jv_repr_depth(jctx *c, jval v, strbuf *sb, int line, int depth);
void jv_repr(jctx *c, jval v, strbuf *sb, int line) {
    jv_repr_depth(c, v, sb, line, 0);
}

static void jv_repr_depth(jctx *c, jval v, strbuf *sb, int line, int depth) {
    if (depth > JV_MAX_NESTING) jfail(c, line, "value nested too deeply to print");
    if (sb->len > c->limits.max_output_bytes)
        jfail(c, line, "printed value exceeds %zu bytes", c->limits.max_output_bytes);
    switch (v.kind) {
    case JV_STR:
        repr_str(v.u.s.p, v.u.s.n, sb);
        return;
    case JV_UNDEF:
        strbuf_append_str(sb, "Undefined");
        return;
    case JV_LIST: {
        jlist *l = v.u.l;
        strbuf_append_char(sb, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) strbuf_append_str(sb, ", ");
            jv_repr_depth(c, l->items[i], sb, line, depth + 1);
        }
        if (l->tuple && l->n == 1) strbuf_append_char(sb, ',');
        strbuf_append_char(sb, l->tuple ? ')' : ']');
        return;
    }
    case JV_DICT: {
        jdict *d = v.u.d;
        if (d->is_namespace) strbuf_append_str(sb, "<Namespace ");
        strbuf_append_char(sb, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) strbuf_append_str(sb, ", ");
            jv_repr_depth(c, d->keys[i], sb, line, depth + 1);
            strbuf_append_str(sb, ": ");
            jv_repr_depth(c, d->vals[i], sb, line, depth + 1);
        }
        strbuf_append_char(sb, '}');
        if (d->is_namespace) strbuf_append_char(sb, '>');
        return;
    }
    default:
        jv_to_str(c, v, sb, line);
    }
}

void jv_to_str(jctx *c, jval v, strbuf *sb, int line) {
    switch (v.kind) {
    case JV_UNDEF:
        return;
    case JV_NONE:
        strbuf_append_str(sb, "None");
        return;
    case JV_BOOL:
        strbuf_append_str(sb, v.u.b ? "True" : "False");
        return;
    case JV_INT:
        strbuf_appendf(sb, "%lld", (long long)v.u.i);
        return;
    case JV_FLOAT:
        jv_format_float(v.u.f, sb);
        return;
    case JV_STR:
        strbuf_append(sb, v.u.s.p, v.u.s.n);
        return;
    case JV_LIST:
    case JV_DICT:
        jv_repr(c, v, sb, line);
        return;
    case JV_FUNC:
        if (v.u.fn->macro)
            strbuf_appendf(sb, "<Macro '%s'>", v.u.fn->name);
        else
            strbuf_appendf(sb, "<built-in function %s>", v.u.fn->name);
        return;
    case JV_LOOP:
        strbuf_append_str(sb, "<LoopContext>");
        return;
    }
}

jval jv_stringify(jctx *c, jval v, int line) {
    if (v.kind == JV_STR) return v;
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    jv_to_str(c, v, sb, line);
    return jcapture_end(c, prev);
}

static void json_str(const char *s, size_t n, strbuf *sb) {
    strbuf_append_char(sb, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        switch (ch) {
        case '"':
            strbuf_append_str(sb, "\\\"");
            break;
        case '\\':
            strbuf_append_str(sb, "\\\\");
            break;
        case '\n':
            strbuf_append_str(sb, "\\n");
            break;
        case '\r':
            strbuf_append_str(sb, "\\r");
            break;
        case '\t':
            strbuf_append_str(sb, "\\t");
            break;
        case '\b':
            strbuf_append_str(sb, "\\b");
            break;
        case '\f':
            strbuf_append_str(sb, "\\f");
            break;
        default:
            if (ch < 0x20)
                strbuf_appendf(sb, "\\u%04x", ch);
            else
                strbuf_append_char(sb, (char)ch);
        }
    }
    strbuf_append_char(sb, '"');
}

static void json_newline(strbuf *sb, int indent, int level) {
    strbuf_append_char(sb, '\n');
    for (int i = 0; i < indent * level; i++)
        strbuf_append_char(sb, ' ');
}

static void json_key(jctx *c, jval k, strbuf *sb, int line) {
    switch (k.kind) {
    case JV_STR:
        json_str(k.u.s.p, k.u.s.n, sb);
        return;
    case JV_INT:
        strbuf_appendf(sb, "\"%lld\"", (long long)k.u.i);
        return;
    case JV_BOOL:
        strbuf_append_str(sb, k.u.b ? "\"true\"" : "\"false\"");
        return;
    case JV_NONE:
        strbuf_append_str(sb, "\"null\"");
        return;
    case JV_FLOAT:
        strbuf_append_char(sb, '"');
        jv_format_float(k.u.f, sb);
        strbuf_append_char(sb, '"');
        return;
    default:
        jfail(c, line, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

static int key_cmp(const void *x, const void *y) {
    const jval *a = *(jval *const *)x, *b = *(jval *const *)y;
    size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int r = memcmp(a->u.s.p, b->u.s.p, n);
    if (r) return r;
    return (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
}

void jv_tojson(jctx *c, jval v, strbuf *sb, int indent, const char *item_sep, const char *key_sep,
               bool sort_keys, int level, int line) {
    if (level > JV_MAX_NESTING) jfail(c, line, "tojson: value nested too deeply");
    if (sb->len > c->limits.max_output_bytes)
        jfail(c, line, "tojson output exceeds %zu bytes", c->limits.max_output_bytes);
    switch (v.kind) {
    case JV_NONE:
        strbuf_append_str(sb, "null");
        return;
    case JV_BOOL:
        strbuf_append_str(sb, v.u.b ? "true" : "false");
        return;
    case JV_INT:
        strbuf_appendf(sb, "%lld", (long long)v.u.i);
        return;
    case JV_FLOAT:
        if (isnan(v.u.f))
            strbuf_append_str(sb, "NaN");
        else if (isinf(v.u.f))
            strbuf_append_str(sb, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            jv_format_float(v.u.f, sb);
        return;
    case JV_STR:
        json_str(v.u.s.p, v.u.s.n, sb);
        return;
    case JV_LIST: {
        jlist *l = v.u.l;
        if (!l->n) {
            strbuf_append_str(sb, "[]");
            return;
        }
        strbuf_append_char(sb, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) strbuf_append_str(sb, item_sep);
            if (indent >= 0) json_newline(sb, indent, level + 1);
            jv_tojson(c, l->items[i], sb, indent, item_sep, key_sep, sort_keys, level + 1, line);
        }
        if (indent >= 0) json_newline(sb, indent, level);
        strbuf_append_char(sb, ']');
        return;
    }
    case JV_DICT: {
        jdict *d = v.u.d;
        if (d->is_namespace) jfail(c, line, "Object of type Namespace is not JSON serializable");
        if (!d->n) {
            strbuf_append_str(sb, "{}");
            return;
        }
        size_t *order = jalloc(c, d->n * sizeof(size_t));
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (sort_keys) {
            const jval **ks = jalloc(c, d->n * sizeof(jval *));
            for (size_t i = 0; i < d->n; i++) {
                if (d->keys[i].kind != JV_STR)
                    jfail(c, line, "tojson: sort_keys needs string keys");
                ks[i] = &d->keys[i];
            }
            qsort(ks, d->n, sizeof *ks, key_cmp);
            for (size_t i = 0; i < d->n; i++)
                order[i] = (size_t)(ks[i] - d->keys);
        }
        strbuf_append_char(sb, '{');
        for (size_t k = 0; k < d->n; k++) {
            size_t i = order[k];
            if (k) strbuf_append_str(sb, item_sep);
            if (indent >= 0) json_newline(sb, indent, level + 1);
            json_key(c, d->keys[i], sb, line);
            strbuf_append_str(sb, key_sep);
            jv_tojson(c, d->vals[i], sb, indent, item_sep, key_sep, sort_keys, level + 1, line);
        }
        if (indent >= 0) json_newline(sb, indent, level);
        strbuf_append_char(sb, '}');
        return;
    }
    default:
        jfail(c, line, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}
