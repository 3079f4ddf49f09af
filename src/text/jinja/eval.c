/* jinja evaluator — walks the syntax tree with Jinja2's runtime semantics: scopes (a loop body
 * and a macro call each get their own), Undefined (prints empty, fails when used as a value),
 * Python operators and truthiness, the sandbox's attribute rules.
 * Refuses: recursion and output beyond the render limits; mutation of lists and dicts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

static void exec_node(jctx *c, jframe *f, const jnode *n);

/* ---- frames ---- */
static bool jframe_find(jframe *f, const char *name, jval *out) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->names[i], name)) {
                *out = f->vals[i];
                return true;
            }
    return false;
}

void jframe_set(jctx *c, jframe *f, const char *name, jval v) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **nn = jalloc(c, cap * sizeof *nn);
        jval *vv = jalloc(c, cap * sizeof *vv);
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(vv, f->vals, f->n * sizeof *vv);
        }
        f->names = nn;
        f->vals = vv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

static jframe *frame_new(jctx *c, jframe *parent) {
    jframe *f = jalloc(c, sizeof *f);
    f->parent = parent;
    return f;
}

/* a new scope for `owner`: its assigned-but-unread names start out missing (see jnode) */
static jframe *scope_new(jctx *c, jframe *parent, const jnode *owner) {
    jframe *f = frame_new(c, parent);
    for (size_t i = 0; i < owner->nmissing; i++) {
        char buf[160];
        snprintf(buf, sizeof buf, "'%s' is undefined", owner->missing[i]);
        jframe_set(c, f, owner->missing[i], jv_undef(jstrdup_n(c, buf, strlen(buf))));
    }
    return f;
}

static jval undef_msg(jctx *c, const char *fmt, const char *a, const char *b) {
    char buf[300];
    snprintf(buf, sizeof buf, fmt, a, b);
    return jv_undef(jstrdup_n(c, buf, strlen(buf)));
}

static _Noreturn void fail_undefined(jctx *c, jval v, int line) {
    jfail(c, line, "%s", v.u.undef_name ? v.u.undef_name : "value is undefined");
}

/* ---- output ---- */
static void emit(jctx *c, const char *s, size_t n, int line) {
    if (c->out->len + n > c->limits.max_output_bytes)
        jfail(c, line, "template output exceeds %zu bytes", c->limits.max_output_bytes);
    strbuf_append(c->out, s, n);
}

/* ---- iteration ---- */
jlist *jv_iterate(jctx *c, jval v, int line) {
    switch (v.kind) {
    case JV_UNDEF:
        return jv_list(c, 0, false).u.l;
    case JV_LIST:
        return v.u.l;
    case JV_DICT: {
        if (v.u.d->is_namespace) jfail(c, line, "'Namespace' object is not iterable");
        jval l = jv_list(c, v.u.d->n, false);
        for (size_t i = 0; i < v.u.d->n; i++)
            jlist_push(c, l.u.l, v.u.d->keys[i]);
        return l.u.l;
    }
    case JV_STR: {
        jval l = jv_list(c, v.u.s.n, false);
        const char *s = v.u.s.p;
        size_t n = v.u.s.n, i = 0;
        while (i < n) {
            size_t st = i++;
            while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
                i++;
            jlist_push(c, l.u.l, jv_str(s + st, i - st));
        }
        return l.u.l;
    }
    default:
        jfail(c, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- attribute and item access ---- */
static jval loop_attr(jctx *c, jloop *lp, const char *name, int line);

jval jgetattr(jctx *c, jval obj, const char *name, int line) {
    jval out;
    switch (obj.kind) {
    case JV_UNDEF:
        fail_undefined(c, obj, line);
    case JV_DICT:
        if (obj.u.d->is_namespace) {
            if (jdict_get_str(obj.u.d, name, &out)) return out;
            return undef_msg(c, "'%s' has no attribute '%s'", "Namespace", name);
        }
        {
            bool found;
            jval m = jmethod_get(c, obj, name, &found);
            if (found) return m;
        }
        if (jdict_get_str(obj.u.d, name, &out)) return out;
        return undef_msg(c, "'dict object' has no attribute '%s'%s", name, "");
    case JV_LOOP:
        return loop_attr(c, obj.u.loop, name, line);
    default: {
        bool found;
        jval m = jmethod_get(c, obj, name, &found);
        if (found) return m;
        char what[64];
        snprintf(what, sizeof what, "%s object", jv_type_name(obj));
        return undef_msg(c, "'%s' has no attribute '%s'", what, name);
    }
    }
}

static bool index_of(jctx *c, jval key, size_t n, size_t *out) {
    (void)c;
    int64_t i;
    if (key.kind == JV_INT)
        i = key.u.i;
    else if (key.kind == JV_BOOL)
        i = key.u.b;
    else
        return false;
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

jval jgetitem(jctx *c, jval obj, jval key, int line) {
    jval out;
    size_t idx;
    switch (obj.kind) {
    case JV_UNDEF:
        fail_undefined(c, obj, line);
    case JV_DICT:
        if (!obj.u.d->is_namespace && jdict_get(obj.u.d, key, &out)) return out;
        if (key.kind == JV_STR) return jgetattr(c, obj, jstrdup_n(c, key.u.s.p, key.u.s.n), line);
        return undef_msg(c, "'dict object' has no attribute %s%s", "(non-string key)", "");
    case JV_LIST:
        if (index_of(c, key, obj.u.l->n, &idx)) return obj.u.l->items[idx];
        if (key.kind == JV_STR) return jgetattr(c, obj, jstrdup_n(c, key.u.s.p, key.u.s.n), line);
        return undef_msg(c, "'%s object' has no element %s", jv_type_name(obj),
                         "(index out of range)");
    case JV_STR: {
        size_t cps = utf8_count(obj.u.s.p, obj.u.s.n);
        if (index_of(c, key, cps, &idx)) {
            size_t a = utf8_offset(obj.u.s.p, obj.u.s.n, idx),
                   b = utf8_offset(obj.u.s.p, obj.u.s.n, idx + 1);
            return jv_str(obj.u.s.p + a, b - a);
        }
        if (key.kind == JV_STR) return jgetattr(c, obj, jstrdup_n(c, key.u.s.p, key.u.s.n), line);
        return undef_msg(c, "'str object' has no element %s%s", "(index out of range)", "");
    }
    case JV_LOOP:
        if (key.kind == JV_STR)
            return loop_attr(c, obj.u.loop, jstrdup_n(c, key.u.s.p, key.u.s.n), line);
        return jv_undef("loop has no such item");
    default:
        return undef_msg(c, "'%s object' has no item %s", jv_type_name(obj), "");
    }
}

static int64_t slice_index(jctx *c, jval v, int64_t n, int64_t dflt, int line) {
    if (v.kind == JV_NONE || v.kind == JV_UNDEF) return dflt;
    if (v.kind == JV_BOOL) return v.u.b;
    if (v.kind != JV_INT) jfail(c, line, "slice indices must be integers or None");
    (void)n;
    return v.u.i;
}

static jval do_slice(jctx *c, jval obj, jval start, jval stop, jval step, int line) {
    if (obj.kind == JV_UNDEF) fail_undefined(c, obj, line);
    bool is_str = obj.kind == JV_STR;
    /* a slice compiles to a plain Python subscript in Jinja2: a TypeError, not Undefined */
    if (!is_str && obj.kind != JV_LIST)
        jfail(c, line, "'%s' object is not subscriptable", jv_type_name(obj));
    jlist *items = is_str ? jv_iterate(c, obj, line) : obj.u.l;
    int64_t n = (int64_t)items->n;
    int64_t st = slice_index(c, step, n, 1, line);
    if (st == 0) jfail(c, line, "slice step cannot be zero");
    int64_t lo, hi;
    if (st > 0) {
        lo = slice_index(c, start, n, 0, line);
        hi = slice_index(c, stop, n, n, line);
        if (lo < 0) lo += n;
        if (hi < 0) hi += n;
        if (lo < 0) lo = 0;
        if (hi > n) hi = n;
        if (lo > n) lo = n;
        if (hi < 0) hi = 0;
    } else {
        lo = slice_index(c, start, n, n - 1, line);
        hi = slice_index(c, stop, n, -1 - n, line);
        if (start.kind == JV_INT && lo < 0) lo += n;
        if (stop.kind == JV_INT && hi < 0) hi += n;
        if (lo >= n) lo = n - 1;
        if (lo < -1) lo = -1;
        if (hi < -1) hi = -1;
    }
    jval out = jv_list(c, 0, obj.kind == JV_LIST && obj.u.l->tuple);
    strbuf *prev = c->out;
    strbuf *sb = is_str ? jcapture_begin(c, line) : NULL;
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
        jval it = items->items[i];
        if (is_str)
            strbuf_append(sb, it.u.s.p, it.u.s.n);
        else
            jlist_push(c, out.u.l, it);
    }
    if (is_str) return jcapture_end(c, prev);
    return out;
}

/* ---- arithmetic ---- */
static bool num(jval v) {
    return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
}
static double fval(jval v) {
    return v.kind == JV_FLOAT ? v.u.f : v.kind == JV_INT ? (double)v.u.i : v.u.b;
}
static int64_t ival(jval v) {
    return v.kind == JV_INT ? v.u.i : v.u.b;
}

static const char *op_symbol(int op) {
    static const char *const s[] = {"",   "+",  "-", "*",  "/", "//", "%",  "**",    "~",
                                    "==", "!=", "<", "<=", ">", ">=", "in", "not in"};
    return op > 0 && op <= JOP_NOTIN ? s[op] : "?";
}

static jval repeat(jctx *c, jval seq, int64_t k, int line) {
    if (k < 0) k = 0;
    if (seq.kind == JV_STR) {
        if (seq.u.s.n && (uint64_t)k > c->limits.max_output_bytes / seq.u.s.n)
            jfail(c, line, "string repetition too large");
        size_t total = seq.u.s.n * (size_t)k;
        char *p = jalloc(c, total + 1);
        for (int64_t i = 0; i < k; i++)
            memcpy(p + (size_t)i * seq.u.s.n, seq.u.s.p, seq.u.s.n);
        return jv_str(p, total);
    }
    if (seq.u.l->n && (uint64_t)k > 10000000 / seq.u.l->n)
        jfail(c, line, "list repetition too large");
    jval out = jv_list(c, seq.u.l->n * (size_t)k, seq.u.l->tuple);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.u.l->n; j++)
            jlist_push(c, out.u.l, seq.u.l->items[j]);
    return out;
}

static jval format_percent(jctx *c, jval fmt, jval args, int line) {
    jlist *al = args.kind == JV_LIST && args.u.l->tuple ? args.u.l : NULL;
    size_t ai = 0;
    strbuf *prev = c->out;
    strbuf *sb = jcapture_begin(c, line);
    for (size_t i = 0; i < fmt.u.s.n; i++) {
        char ch = fmt.u.s.p[i];
        if (ch != '%') {
            strbuf_append_char(sb, ch);
            continue;
        }
        if (++i >= fmt.u.s.n) jfail(c, line, "incomplete format");
        char f = fmt.u.s.p[i];
        if (f == '%') {
            strbuf_append_char(sb, '%');
            continue;
        }
        jval a;
        if (al) {
            if (ai >= al->n) jfail(c, line, "not enough arguments for format string");
            a = al->items[ai++];
        } else {
            if (ai++) jfail(c, line, "not enough arguments for format string");
            a = args;
        }
        if (f == 's')
            jv_to_str(c, a, sb, line);
        else if (f == 'r')
            jv_repr(c, a, sb, line);
        else if (f == 'd' || f == 'i') {
            if (!num(a))
                jfail(c, line, "%%d format: a number is required, not %s", jv_type_name(a));
            strbuf_appendf(sb, "%lld", (long long)(a.kind == JV_FLOAT ? (int64_t)a.u.f : ival(a)));
        } else
            jfail(c, line, "unsupported format character '%c'", f);
    }
    /* Python: an unused argument is an error, unless it is a mapping-like object (list, dict) */
    bool mapping_like = args.kind == JV_DICT || (args.kind == JV_LIST && !args.u.l->tuple);
    if (al ? ai != al->n : (ai != 1 && !(ai == 0 && mapping_like)))
        jfail(c, line, "not all arguments converted during string formatting");
    return jcapture_end(c, prev);
}

static bool contains(jctx *c, jval container, jval item, int line) {
    switch (container.kind) {
    case JV_STR:
        if (item.kind != JV_STR)
            jfail(c, line, "'in <string>' requires string as left operand, not %s",
                  jv_type_name(item));
        if (!item.u.s.n) return true;
        return memmem(container.u.s.p, container.u.s.n, item.u.s.p, item.u.s.n) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < container.u.l->n; i++)
            if (jv_equal(container.u.l->items[i], item)) return true;
        return false;
    case JV_DICT: {
        jval out;
        if (container.u.d->is_namespace)
            jfail(c, line, "argument of type 'Namespace' is not iterable");
        if (item.kind == JV_DICT || (item.kind == JV_LIST && !item.u.l->tuple))
            jfail(c, line, "unhashable type: '%s'", jv_type_name(item));
        return jdict_get(container.u.d, item, &out);
    }
    case JV_UNDEF:
        return false;
    default:
        jfail(c, line, "argument of type '%s' is not iterable", jv_type_name(container));
    }
}

jval jbinop(jctx *c, int op, jval a, jval b, int line) {
    switch (op) {
    case JOP_CONCAT: {
        strbuf *prev = c->out;
        strbuf *sb = jcapture_begin(c, line);
        jv_to_str(c, a, sb, line);
        jv_to_str(c, b, sb, line);
        return jcapture_end(c, prev);
    }
    case JOP_EQ:
        return jv_bool(jv_equal(a, b));
    case JOP_NE:
        return jv_bool(!jv_equal(a, b));
    case JOP_IN:
        return jv_bool(contains(c, b, a, line));
    case JOP_NOTIN:
        return jv_bool(!contains(c, b, a, line));
    default:
        break;
    }
    if (a.kind == JV_UNDEF) fail_undefined(c, a, line);
    if (b.kind == JV_UNDEF) fail_undefined(c, b, line);
    if (op >= JOP_LT && op <= JOP_GE) {
        int r = jv_compare(c, a, b, line);
        return jv_bool(op == JOP_LT   ? r < 0
                       : op == JOP_LE ? r <= 0
                       : op == JOP_GT ? r > 0
                                      : r >= 0);
    }
    if (num(a) && num(b)) {
        bool ints = a.kind != JV_FLOAT && b.kind != JV_FLOAT;
        int64_t x = ints ? ival(a) : 0, y = ints ? ival(b) : 0, r;
        double fx = fval(a), fy = fval(b);
        switch (op) {
        case JOP_ADD:
            if (!ints) return jv_float(fx + fy);
            if (__builtin_add_overflow(x, y, &r)) jfail(c, line, "integer overflow");
            return jv_int(r);
        case JOP_SUB:
            if (!ints) return jv_float(fx - fy);
            if (__builtin_sub_overflow(x, y, &r)) jfail(c, line, "integer overflow");
            return jv_int(r);
        case JOP_MUL:
            if (!ints) return jv_float(fx * fy);
            if (__builtin_mul_overflow(x, y, &r)) jfail(c, line, "integer overflow");
            return jv_int(r);
        case JOP_DIV:
            if (fy == 0) jfail(c, line, "division by zero");
            return jv_float(fx / fy);
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (ints) {
                if (y == 0) jfail(c, line, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) jfail(c, line, "integer overflow");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                return jv_int(op == JOP_FLOORDIV ? q : m);
            } else {
                if (fy == 0) jfail(c, line, "float division by zero");
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                if (op == JOP_MOD) return jv_float(m);
                return jv_float(floor(fx / fy));
            }
        case JOP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1;
                for (int64_t i = 0; i < y; i++) {
                    if (__builtin_mul_overflow(acc, x, &acc)) jfail(c, line, "integer overflow");
                    if (acc == 0 || acc == 1) break;
                }
                if (acc == 1 && x == -1 && (y & 1)) acc = -1;
                return jv_int(acc);
            }
            if (fx == 0 && fy < 0) jfail(c, line, "0.0 cannot be raised to a negative power");
            return jv_float(pow(fx, fy));
        }
    }
    if (op == JOP_ADD && a.kind == JV_STR && b.kind == JV_STR) {
        char *p = jalloc(c, a.u.s.n + b.u.s.n + 1);
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        if (a.u.s.n + b.u.s.n > c->limits.max_output_bytes) jfail(c, line, "string too long");
        return jv_str(p, a.u.s.n + b.u.s.n);
    }
    if (op == JOP_ADD && a.kind == JV_LIST && b.kind == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        jval out = jv_list(c, a.u.l->n + b.u.l->n, a.u.l->tuple);
        for (size_t i = 0; i < a.u.l->n; i++)
            jlist_push(c, out.u.l, a.u.l->items[i]);
        for (size_t i = 0; i < b.u.l->n; i++)
            jlist_push(c, out.u.l, b.u.l->items[i]);
        return out;
    }
    if (op == JOP_MUL && (a.kind == JV_STR || a.kind == JV_LIST) &&
        (b.kind == JV_INT || b.kind == JV_BOOL))
        return repeat(c, a, ival(b), line);
    if (op == JOP_MUL && (b.kind == JV_STR || b.kind == JV_LIST) &&
        (a.kind == JV_INT || a.kind == JV_BOOL))
        return repeat(c, b, ival(a), line);
    if (op == JOP_MOD && a.kind == JV_STR) return format_percent(c, a, b, line);
    jfail(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", op_symbol(op),
          jv_type_name(a), jv_type_name(b));
}

/* ---- loop object ---- */
static jval loop_cycle(jctx *c, jval self, jargs *a, int line) {
    if (!a->npos) jfail(c, line, "no items for cycling given");
    return a->pos[self.u.loop->index0 % a->npos];
}

static jval loop_changed(jctx *c, jval self, jargs *a, int line) {
    (void)c;
    (void)line;
    jloop *lp = self.u.loop;
    jval cur = jv_list(c, a->npos, true);
    for (size_t i = 0; i < a->npos; i++)
        jlist_push(c, cur.u.l, a->pos[i]);
    if (lp->has_changed && jv_equal(lp->last_changed, cur)) return jv_bool(false);
    lp->has_changed = true;
    lp->last_changed = cur;
    return jv_bool(true);
}

static jval loop_attr(jctx *c, jloop *lp, const char *name, int line) {
    (void)line;
    size_t n = lp->items->n, i = lp->index0;
    jval self = {.kind = JV_LOOP};
    self.u.loop = lp;
    if (!strcmp(name, "index")) return jv_int((int64_t)i + 1);
    if (!strcmp(name, "index0")) return jv_int((int64_t)i);
    if (!strcmp(name, "first")) return jv_bool(i == 0);
    if (!strcmp(name, "last")) return jv_bool(i + 1 == n);
    if (!strcmp(name, "length")) return jv_int((int64_t)n);
    if (!strcmp(name, "revindex")) return jv_int((int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return jv_int((int64_t)(n - i - 1));
    if (!strcmp(name, "depth")) return jv_int(lp->depth0 + 1);
    if (!strcmp(name, "depth0")) return jv_int(lp->depth0);
    if (!strcmp(name, "previtem"))
        return i > 0 ? lp->items->items[i - 1] : jv_undef("there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? lp->items->items[i + 1] : jv_undef("there is no next item");
    if (!strcmp(name, "cycle")) return jv_builtin(c, "cycle", loop_cycle, self);
    if (!strcmp(name, "changed")) return jv_builtin(c, "changed", loop_changed, self);
    return undef_msg(c, "'LoopContext object' has no attribute '%s'%s", name, "");
}

/* ---- calls ---- */
jval jarg(jargs *a, size_t i, const char *name, jval dflt) {
    if (name)
        for (size_t k = 0; k < a->nkw; k++)
            if (!strcmp(a->kwnames[k], name)) return a->kwvals[k];
    if (i < a->npos) return a->pos[i];
    return dflt;
}

static void exec_body_captured(jctx *c, jframe *f, const jnode *body, jval *out, int line) {
    strbuf *prev = c->out;
    jcapture_begin(c, line);
    int saved = c->loop_control;
    exec_node(c, f, body);
    c->loop_control = saved;
    *out = jcapture_end(c, prev);
}

static jval call_macro(jctx *c, jfunc *fn, jargs *a, int line) {
    const jnode *m = fn->macro;
    if (++c->depth > c->limits.max_depth)
        jfail(c, line, "maximum recursion depth exceeded calling '%s'", fn->name);
    if (++c->iterations > c->limits.max_iterations)
        jfail(c, line, "template exceeded %lld loop iterations and calls",
              c->limits.max_iterations);
    jframe *f = scope_new(c, fn->closure, m);
    size_t np = m->nnames;
    for (size_t i = 0; i < np; i++) {
        jval v;
        bool have = false;
        for (size_t k = 0; k < a->nkw; k++)
            if (!strcmp(a->kwnames[k], m->names[i])) {
                v = a->kwvals[k];
                have = true;
            }
        if (!have && i < a->npos) {
            v = a->pos[i];
            have = true;
        }
        if (!have)
            v = m->items2 && m->items2[i]
                    ? jeval(c, f, m->items2[i])
                    : undef_msg(c, "parameter '%s' was not provided%s", m->names[i], "");
        jframe_set(c, f, m->names[i], v);
    }
    jval varargs = jv_list(c, 0, true), kwargs = jv_dict(c, 0);
    for (size_t i = np; i < a->npos; i++)
        jlist_push(c, varargs.u.l, a->pos[i]);
    for (size_t k = 0; k < a->nkw; k++) {
        bool is_param = false;
        for (size_t i = 0; i < np; i++)
            if (!strcmp(a->kwnames[k], m->names[i])) is_param = true;
        if (!is_param && strcmp(a->kwnames[k], "caller") != 0)
            jdict_set(c, kwargs.u.d, jv_cstr(a->kwnames[k]), a->kwvals[k]);
    }
    jframe_set(c, f, "varargs", varargs);
    jframe_set(c, f, "kwargs", kwargs);
    if (fn->caller.kind != JV_UNDEF) jframe_set(c, f, "caller", fn->caller);
    for (size_t k = 0; k < a->nkw; k++)
        if (!strcmp(a->kwnames[k], "caller")) jframe_set(c, f, "caller", a->kwvals[k]);
    jval out;
    exec_body_captured(c, f, m->type == S_MACRO || m->type == S_CALL_BLOCK ? m->a : m, &out, line);
    c->depth--;
    return out;
}

jval jcall(jctx *c, jval fn, jargs *a, int line) {
    if (fn.kind == JV_UNDEF) fail_undefined(c, fn, line);
    if (fn.kind != JV_FUNC) jfail(c, line, "'%s' object is not callable", jv_type_name(fn));
    if (fn.u.fn->builtin) return fn.u.fn->builtin(c, fn.u.fn->self, a, line);
    return call_macro(c, fn.u.fn, a, line);
}

static void eval_args(jctx *c, jframe *f, const jnode *n, jargs *a, size_t extra_kw) {
    a->npos = n->nitems;
    a->pos = jalloc(c, (n->nitems + 1) * sizeof(jval));
    for (size_t i = 0; i < n->nitems; i++)
        a->pos[i] = jeval(c, f, n->items[i]);
    a->nkw = n->nitems2;
    a->kwnames = jalloc(c, (n->nitems2 + extra_kw + 1) * sizeof(char *));
    a->kwvals = jalloc(c, (n->nitems2 + extra_kw + 1) * sizeof(jval));
    for (size_t i = 0; i < n->nitems2; i++) {
        a->kwnames[i] = n->names[i];
        a->kwvals[i] = jeval(c, f, n->items2[i]);
    }
}

static jval eval_call(jctx *c, jframe *f, const jnode *n, jval caller) {
    jval fn = jeval(c, f, n->a);
    jargs a;
    eval_args(c, f, n, &a, 1);
    if (caller.kind != JV_UNDEF) {
        a.kwnames[a.nkw] = "caller";
        a.kwvals[a.nkw++] = caller;
    }
    return jcall(c, fn, &a, n->line);
}

static jval eval_filter(jctx *c, jframe *f, const jnode *n, jval block_input) {
    jval input =
        n->a ? (n->a->type == N_FILTER ? eval_filter(c, f, n->a, block_input) : jeval(c, f, n->a))
             : block_input;
    jargs a;
    eval_args(c, f, n, &a, 0);
    return jfilter_apply(c, n->str, input, &a, n->line);
}

jval jeval(jctx *c, jframe *f, const jnode *n) {
    switch (n->type) {
    case N_LIT:
        return n->lit;
    case N_NAME: {
        jval v;
        if (jframe_find(f, n->str, &v)) return v;
        return undef_msg(c, "'%s' is undefined%s", n->str, "");
    }
    case N_LIST:
    case N_TUPLE: {
        jval l = jv_list(c, n->nitems, n->type == N_TUPLE);
        for (size_t i = 0; i < n->nitems; i++)
            jlist_push(c, l.u.l, jeval(c, f, n->items[i]));
        return l;
    }
    case N_DICT: {
        jval d = jv_dict(c, n->nitems);
        for (size_t i = 0; i < n->nitems; i++) {
            jval k = jeval(c, f, n->items[i]);
            if (k.kind == JV_LIST && !k.u.l->tuple) jfail(c, n->line, "unhashable type: 'list'");
            if (k.kind == JV_DICT) jfail(c, n->line, "unhashable type: 'dict'");
            jdict_set(c, d.u.d, k, jeval(c, f, n->items2[i]));
        }
        return d;
    }
    case N_NEG:
    case N_POS: {
        jval v = jeval(c, f, n->a);
        if (v.kind == JV_UNDEF) fail_undefined(c, v, n->line);
        if (!num(v))
            jfail(c, n->line, "bad operand type for unary %c: '%s'", n->type == N_NEG ? '-' : '+',
                  jv_type_name(v));
        if (n->type == N_POS) return v.kind == JV_BOOL ? jv_int(v.u.b) : v;
        if (v.kind == JV_FLOAT) return jv_float(-v.u.f);
        if (ival(v) == INT64_MIN) jfail(c, n->line, "integer overflow");
        return jv_int(-ival(v));
    }
    case N_NOT:
        return jv_bool(!jv_truthy(jeval(c, f, n->a)));
    case N_BINOP: {
        jval a = jeval(c, f, n->a);
        jval b = jeval(c, f, n->b);
        return jbinop(c, n->op, a, b, n->line);
    }
    case N_AND: {
        jval a = jeval(c, f, n->a);
        return jv_truthy(a) ? jeval(c, f, n->b) : a;
    }
    case N_OR: {
        jval a = jeval(c, f, n->a);
        return jv_truthy(a) ? a : jeval(c, f, n->b);
    }
    case N_COMPARE: {
        jval left = jeval(c, f, n->a);
        for (size_t i = 0; i < n->nitems; i++) {
            jval right = jeval(c, f, n->items[i]);
            if (!jv_truthy(jbinop(c, n->ops[i], left, right, n->line))) return jv_bool(false);
            left = right;
        }
        return jv_bool(true);
    }
    case N_COND:
        if (jv_truthy(jeval(c, f, n->a))) return jeval(c, f, n->b);
        return n->c ? jeval(c, f, n->c)
                    : jv_undef("the inline if-expression evaluated to false and no else section "
                               "was defined");
    case N_GETATTR:
        return jgetattr(c, jeval(c, f, n->a), n->str, n->line);
    case N_GETITEM: {
        jval obj = jeval(c, f, n->a);
        return jgetitem(c, obj, jeval(c, f, n->b), n->line);
    }
    case N_SLICE: {
        jval obj = jeval(c, f, n->a);
        jval st = n->b ? jeval(c, f, n->b) : jv_none();
        jval sp = n->c ? jeval(c, f, n->c) : jv_none();
        jval step = n->d ? jeval(c, f, n->d) : jv_none();
        return do_slice(c, obj, st, sp, step, n->line);
    }
    case N_CALL:
        return eval_call(c, f, n, jv_undef(NULL));
    case N_FILTER:
        return eval_filter(c, f, n, jv_undef(NULL));
    case N_TEST: {
        jval v = jeval(c, f, n->a);
        jargs a;
        eval_args(c, f, n, &a, 0);
        bool r = jtest_apply(c, n->str, v, &a, n->line);
        return jv_bool(n->flag ? !r : r);
    }
    default:
        jfail(c, n->line, "internal error: statement used as expression");
    }
}

/* ---- statements ---- */
static void assign(jctx *c, jframe *f, const jnode *n, jval v) {
    if (!(n->flag & 2)) {
        jframe_set(c, f, n->names[0], v);
        return;
    }
    jlist *items = jv_iterate(c, v, n->line);
    if (items->n != n->nnames)
        jfail(c, n->line, "cannot unpack %zu values into %zu names", items->n, n->nnames);
    for (size_t i = 0; i < n->nnames; i++)
        jframe_set(c, f, n->names[i], items->items[i]);
}

static void exec_for(jctx *c, jframe *f, const jnode *n) {
    jlist *items = jv_iterate(c, jeval(c, f, n->a), n->line);
    if (n->b) {
        jlist *kept = jv_list(c, items->n, false).u.l;
        for (size_t i = 0; i < items->n; i++) {
            jframe *tf = frame_new(c, f);
            assign(c, tf, n, items->items[i]);
            if (jv_truthy(jeval(c, tf, n->b))) jlist_push(c, kept, items->items[i]);
        }
        items = kept;
    }
    jloop *lp = jalloc(c, sizeof *lp);
    lp->items = items;
    jval lv = {.kind = JV_LOOP};
    lv.u.loop = lp;
    /* Jinja2 clears its "no iteration" flag at the end of the body, so an iteration cut short by
     * break/continue does not count: the else block runs unless one body ran to its end */
    bool completed = false;
    for (size_t i = 0; i < items->n; i++) {
        if (++c->iterations > c->limits.max_iterations)
            jfail(c, n->line, "template exceeded %lld loop iterations and calls",
                  c->limits.max_iterations);
        lp->index0 = i;
        jframe *bf = scope_new(c, f, n);
        assign(c, bf, n, items->items[i]);
        jframe_set(c, bf, "loop", lv);
        exec_node(c, bf, n->c);
        if (c->loop_control == 1) {
            c->loop_control = 0;
            break;
        }
        if (!c->loop_control) completed = true;
        c->loop_control = 0;
    }
    if (!completed && n->d) exec_node(c, f, n->d);
}

static jval make_macro(jctx *c, jframe *f, const jnode *n, const char *name) {
    jval v = {.kind = JV_FUNC};
    v.u.fn = jalloc(c, sizeof *v.u.fn);
    v.u.fn->name = name;
    v.u.fn->macro = n;
    v.u.fn->closure = f;
    v.u.fn->caller = jv_undef(NULL);
    return v;
}

static void exec_node(jctx *c, jframe *f, const jnode *n) {
    switch (n->type) {
    case S_BODY:
        for (size_t i = 0; i < n->nitems && !c->loop_control; i++)
            exec_node(c, f, n->items[i]);
        return;
    case S_TEXT:
        emit(c, n->str, n->len, n->line);
        return;
    case S_OUTPUT: {
        jval v = jeval(c, f, n->a);
        if (v.kind == JV_STR)
            emit(c, v.u.s.p, v.u.s.n, n->line);
        else {
            size_t before = c->out->len;
            jv_to_str(c, v, c->out, n->line);
            if (c->out->len > c->limits.max_output_bytes) {
                c->out->len = before;
                jfail(c, n->line, "template output exceeds %zu bytes", c->limits.max_output_bytes);
            }
        }
        return;
    }
    case S_IF:
        if (jv_truthy(jeval(c, f, n->a)))
            exec_node(c, f, n->b);
        else if (n->c)
            exec_node(c, f, n->c);
        return;
    case S_FOR:
        exec_for(c, f, n);
        return;
    case S_SET:
        assign(c, f, n, jeval(c, f, n->a));
        return;
    case S_SET_ATTR: {
        jval ns;
        if (!jframe_find(f, n->str, &ns)) jfail(c, n->line, "'%s' is undefined", n->str);
        if (ns.kind != JV_DICT || !ns.u.d->is_namespace)
            jfail(c, n->line, "cannot assign attribute on non-namespace object");
        jdict_set(c, ns.u.d, jv_cstr(n->names[0]), jeval(c, f, n->a));
        return;
    }
    case S_SET_BLOCK: {
        jval v;
        exec_body_captured(c, scope_new(c, f, n), n->c, &v, n->line);
        if (n->b) v = eval_filter(c, f, n->b, v);
        jframe_set(c, f, n->names[0], v);
        return;
    }
    case S_MACRO:
        jframe_set(c, f, n->str, make_macro(c, f, n, n->str));
        return;
    case S_CALL_BLOCK: {
        jval caller = make_macro(c, f, n, "caller");
        jval r = eval_call(c, f, n->b, caller);
        if (r.kind == JV_STR)
            emit(c, r.u.s.p, r.u.s.n, n->line);
        else
            jv_to_str(c, r, c->out, n->line);
        return;
    }
    case S_FILTER_BLOCK: {
        jval v;
        exec_body_captured(c, scope_new(c, f, n), n->a, &v, n->line);
        v = eval_filter(c, f, n->b, v);
        v = jv_stringify(c, v, n->line);
        emit(c, v.u.s.p, v.u.s.n, n->line);
        return;
    }
    case S_BREAK:
        c->loop_control = 1;
        return;
    case S_CONTINUE:
        c->loop_control = 2;
        return;
    default:
        jfail(c, n->line, "internal error: expression used as statement");
    }
}

/* ---- entry points ---- */
jinja_template *jinja_compile(const char *source, size_t len, char *err, size_t errlen) {
    if (errlen) err[0] = 0;
    jinja_template *t = calloc(1, sizeof *t);
    if (!t) {
        if (errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    t->arena.limit = 256u << 20;
    t->body = jparse(t, source ? source : "", source ? len : 0, err, errlen);
    if (!t->body) {
        if (errlen && !err[0]) snprintf(err, errlen, "template: out of memory");
        jinja_free(t);
        return NULL;
    }
    return t;
}

void jinja_free(jinja_template *t) {
    if (!t) return;
    jarena_free(&t->arena);
    free(t);
}

char *jinja_render(const jinja_template *t, const json_t *context, const jinja_limits *limits,
                   char *err, size_t errlen) {
    jctx *c = calloc(1, sizeof *c);
    if (!c) {
        if (errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->err = err;
    c->errlen = errlen;
    c->limits = (jinja_limits){.max_output_bytes = 64u << 20,
                               .max_memory_bytes = 512u << 20,
                               .max_iterations = 10000000,
                               .max_depth = 200};
    if (limits) {
        if (limits->max_output_bytes) c->limits.max_output_bytes = limits->max_output_bytes;
        if (limits->max_memory_bytes) c->limits.max_memory_bytes = limits->max_memory_bytes;
        if (limits->max_iterations) c->limits.max_iterations = limits->max_iterations;
        if (limits->max_depth) c->limits.max_depth = limits->max_depth;
    }
    if (c->limits.max_depth > 240) c->limits.max_depth = 240;
    c->arena.limit = c->limits.max_memory_bytes;
    strbuf out = {0};
    char *result = NULL;
    if (setjmp(c->fail) == 0) {
        c->out = &out;
        c->root = frame_new(c, NULL);
        jglobals_install(c, c->root);
        jframe *vars = frame_new(c, c->root);
        if (context && json_is_object(context)) {
            const char *k;
            json_t *v;
            json_object_foreach((json_t *)context, k, v) {
                jframe_set(c, vars, jstrdup_n(c, k, strlen(k)), jv_from_json(c, v));
            }
        }
        exec_node(c, scope_new(c, vars, t->body), t->body); /* template locals over the context */
        result = strbuf_detach(&out);
    } else {
        for (int i = 0; i < c->ncaptures; i++)
            strbuf_free(&c->captures[i]);
        strbuf_free(&out);
    }
    jarena_free(&c->arena);
    free(c);
    return result;
}
