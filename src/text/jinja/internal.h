/* jinja internals: the value type, the syntax tree, the render context. Private to text/jinja/.
 *
 * Memory: every value and node lives in an arena (the template's for the tree, the render's for
 * values) and is freed all at once, so values are plain structs passed by copy with no reference
 * counts. Errors unwind with longjmp to the compile or render entry point, which frees the arena.
 */
#ifndef EXO_TEXT_JINJA_INTERNAL_H
#define EXO_TEXT_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/strbuf.h"
#include "text/jinja/jinja.h"

/* ---- arena ---- */
typedef struct jarena_chunk jarena_chunk;
typedef struct jarena {
    jarena_chunk *head;
    size_t used_total; /* bytes handed out */
    size_t limit;      /* 0 = none */
} jarena;

/* ---- values ---- */
typedef enum jkind {
    JV_UNDEF = 0,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* list or tuple (flag) */
    JV_DICT, /* dict or namespace (flag) */
    JV_FUNC,
    JV_LOOP,
} jkind;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct jval {
    jkind kind;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        jlist *l;
        jdict *d;
        jfunc *fn;
        jloop *loop;
        const char *undef_name; /* JV_UNDEF: what was missing (for the error), may be NULL */
    } u;
} jval;

struct jlist {
    jval *items;
    size_t n, cap;
    bool tuple;
};

struct jdict {
    jval *keys;
    jval *vals;
    size_t n, cap;
    bool is_namespace;
};

struct jloop {
    jlist *items;
    size_t index0;
    int depth0;
    jval last_changed;
    bool has_changed;
};

typedef struct jnode jnode;
typedef struct jframe jframe;
typedef struct jctx jctx;

typedef struct jargs {
    jval *pos;
    size_t npos;
    const char **kwnames;
    jval *kwvals;
    size_t nkw;
} jargs;

typedef jval (*jbuiltin_fn)(jctx *c, jval self, jargs *a, int line);

struct jfunc {
    const char *name;
    jbuiltin_fn builtin; /* NULL for a macro */
    jval self;           /* bound receiver for methods */
    const jnode *macro;  /* macro definition */
    jframe *closure;
    jval caller; /* `caller` for call blocks (JV_UNDEF if none) */
};

/* ---- syntax tree ---- */
typedef enum jnode_type {
    /* expressions */
    N_LIT,
    N_NAME,
    N_LIST,
    N_TUPLE,
    N_DICT,
    N_NEG,
    N_POS,
    N_NOT,
    N_BINOP, /* op: one of the JOP_* below */
    N_AND,
    N_OR,
    N_COMPARE, /* a, then items[i] with ops[i] */
    N_COND,    /* b if a else c */
    N_GETATTR,
    N_GETITEM,
    N_SLICE, /* a[b:c:d] */
    N_CALL,
    N_FILTER, /* a | str(items, kw) ; a NULL inside filter blocks */
    N_TEST,   /* a is [not] str(items) */
    /* statements */
    S_TEXT,
    S_OUTPUT,
    S_IF,
    S_FOR,
    S_SET,
    S_SET_ATTR,
    S_SET_BLOCK,
    S_MACRO,
    S_CALL_BLOCK,
    S_FILTER_BLOCK,
    S_BREAK,
    S_CONTINUE,
    S_BODY, /* a plain list of statements (generation blocks) */
} jnode_type;

enum {
    JOP_ADD = 1,
    JOP_SUB,
    JOP_MUL,
    JOP_DIV,
    JOP_FLOORDIV,
    JOP_MOD,
    JOP_POW,
    JOP_CONCAT,
    JOP_EQ,
    JOP_NE,
    JOP_LT,
    JOP_LE,
    JOP_GT,
    JOP_GE,
    JOP_IN,
    JOP_NOTIN,
};

struct jnode {
    jnode_type type;
    int line;
    int op;
    int flag;             /* tests: negated; for: recursive; tuple targets */
    int height;           /* expression nesting below this node (bounds evaluation recursion) */
    jnode *a, *b, *c, *d; /* operands; for: a=iter b=filter; set: a=value */
    jnode **items;        /* args, list items, statement bodies, compare operands */
    size_t nitems;
    jnode **items2; /* kwarg values, dict values, else bodies, macro defaults */
    size_t nitems2;
    const char **names; /* kwarg names, targets, macro params */
    size_t nnames;
    int *ops;        /* compare operators */
    const char *str; /* names, text */
    size_t len;
    jval lit;
    /* scope-owning nodes (the template body, for, macro, call, set and filter blocks): names this
     * scope assigns but never reads itself. Jinja2 binds them to "missing" when the scope starts,
     * so a nested scope reading one sees Undefined until the assignment, not an outer value. */
    const char **missing;
    size_t nmissing;
};

struct jinja_template {
    jarena arena;
    jnode *body; /* S_BODY */
};

/* ---- render context ---- */
struct jframe {
    jframe *parent;
    const char **names;
    jval *vals;
    size_t n, cap;
};

struct jctx {
    jarena arena;
    jmp_buf fail;
    char *err;
    size_t errlen;
    jinja_limits limits;
    strbuf *out;          /* where output goes now */
    strbuf captures[256]; /* capture buffers in use (a stack; freed on error) */
    int ncaptures;
    long long iterations;
    int depth;
    int loop_control; /* 0, 1 = break, 2 = continue */
    jframe *root;
};

/* arena.c */
void *jarena_alloc(jarena *a, size_t n);
void jarena_free(jarena *a);
/* Makes room for one more element in an arena array of n used and *cap allocated elements of
 * elem bytes: when full, copies it into a block twice the size (first_cap when empty) and updates
 * *cap. Returns the array to use, or NULL when the arena is over its limit. */
void *jarena_grow(jarena *a, void *items, size_t n, size_t *cap, size_t elem, size_t first_cap);
/* Allocation in the render arena; fails the render when over the memory limit. */
void *jalloc(jctx *c, size_t n);
/* jarena_grow in the render arena (first capacity 8); fails the render like jalloc. */
void *jgrow(jctx *c, void *items, size_t n, size_t *cap, size_t elem);
char *jstrdup_n(jctx *c, const char *s, size_t n);
_Noreturn void jfail(jctx *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Starts capturing output into a fresh buffer (c->out points to it); end returns the text. */
strbuf *jcapture_begin(jctx *c, int line);
jval jcapture_end(jctx *c, strbuf *previous_out);

/* value.c */
jval jv_undef(const char *name);
jval jv_none(void);
jval jv_bool(bool b);
/* A callable builtin fn named name, bound to self (a method's object; undefined for none). */
jval jv_builtin(jctx *c, const char *name, jbuiltin_fn fn, jval self);
jval jv_int(int64_t i);
jval jv_float(double f);
jval jv_str(const char *p, size_t n); /* does not copy */
jval jv_cstr(const char *s);
jval jv_str_copy(jctx *c, const char *p, size_t n);
jval jv_list(jctx *c, size_t cap, bool tuple);
jval jv_dict(jctx *c, size_t cap);
void jlist_push(jctx *c, jlist *l, jval v);
void jdict_set(jctx *c, jdict *d, jval key, jval v);
bool jdict_get(const jdict *d, jval key, jval *out);
bool jdict_get_str(const jdict *d, const char *key, jval *out);
jval jv_from_json(jctx *c, const json_t *j);
bool jv_truthy(jval v);
bool jv_equal(jval a, jval b);
/* <0, 0, >0; fails the render for types Python cannot order. */
int jv_compare(jctx *c, jval a, jval b, int line);
const char *jv_type_name(jval v);
/* str(v) as Python prints it, appended to sb. */
void jv_to_str(jctx *c, jval v, strbuf *sb, int line);
jval jv_stringify(jctx *c, jval v, int line);
void jv_repr(jctx *c, jval v, strbuf *sb, int line);
void jv_format_float(double f, strbuf *sb);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys). indent<0: none. */
void jv_tojson(jctx *c, jval v, strbuf *sb, int indent, const char *item_sep, const char *key_sep,
               bool sort_keys, int level, int line);
size_t utf8_count(const char *s, size_t n);
/* byte offset of code point index i (clamped to n). */
size_t utf8_offset(const char *s, size_t n, size_t i);

/* lexer.c / parser.c */
jnode *jparse(jinja_template *t, const char *src, size_t len, char *err, size_t errlen);

/* eval.c */
jval jeval(jctx *c, jframe *f, const jnode *n);
jval jcall(jctx *c, jval fn, jargs *a, int line);
jval jgetattr(jctx *c, jval obj, const char *name, int line);
jval jgetitem(jctx *c, jval obj, jval key, int line);
void jframe_set(jctx *c, jframe *f, const char *name, jval v);
jlist *jv_iterate(jctx *c, jval v, int line); /* list of items, as Python's iter() gives */
jval jbinop(jctx *c, int op, jval a, jval b, int line);

/* builtins.c */
jval jfilter_apply(jctx *c, const char *name, jval input, jargs *a, int line);
bool jtest_apply(jctx *c, const char *name, jval v, jargs *a, int line);
jval jmethod_get(jctx *c, jval obj, const char *name, bool *found);
void jglobals_install(jctx *c, jframe *root);
bool jinja_filter_exists(const char *name);
bool jinja_test_exists(const char *name);
/* argument helper: positional i or keyword name, else default */
jval jarg(jargs *a, size_t i, const char *name, jval dflt);

#endif
