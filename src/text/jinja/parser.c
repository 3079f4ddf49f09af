/* jinja lexer and parser — template source to a syntax tree, following Jinja2 3.1's grammar and
 * its lexer's whitespace rules as transformers configures them (trim_blocks, lstrip_blocks, the
 * `-`/`+` markers, one trailing newline dropped, \r\n read as \n).
 * Refuses: extends/include/import/block, line statements, custom delimiters — each a syntax error
 * naming the line. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

typedef enum ttype {
    T_EOF,
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
} ttype;

typedef struct token {
    ttype type;
    int line;
    const char *s; /* names, ops, data, decoded strings (arena) */
    size_t n;
    int64_t i;
    double f;
} token;

typedef struct parser {
    jinja_template *t;
    const char *src;
    size_t len;
    token *toks;
    size_t ntoks, cap, pos;
    char *err;
    size_t errlen;
    jmp_buf fail;
    int depth;
    int loop_depth; /* for bodies we are inside (break/continue need one); a macro resets it */
} parser;

static _Noreturn void pfail(parser *p, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pfail(parser *p, int line, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->errlen) snprintf(p->err, p->errlen, "template line %d: %s", line, msg);
    longjmp(p->fail, 1);
}

static void *palloc(parser *p, size_t n) {
    void *r = jarena_alloc(&p->t->arena, n);
    if (!r) pfail(p, 0, "out of memory");
    return r;
}

/* Room for one more element in an arena array (see jarena_grow); fails the parse without. */
static void *pgrow(parser *p, void *items, size_t n, size_t *cap, size_t elem, size_t first_cap) {
    void *r = jarena_grow(&p->t->arena, items, n, cap, elem, first_cap);
    if (!r) pfail(p, 0, "out of memory");
    return r;
}

static char *pstrdup(parser *p, const char *s, size_t n) {
    char *r = palloc(p, n + 1);
    memcpy(r, s, n);
    r[n] = 0;
    return r;
}

/* ================= lexer ================= */

static void push_tok(parser *p, token t) {
    p->toks = pgrow(p, p->toks, p->ntoks, &p->cap, sizeof(token), 256);
    p->toks[p->ntoks++] = t;
}

static int line_at(const char *src, size_t pos, size_t *cache_pos, int *cache_line) {
    for (; *cache_pos < pos; (*cache_pos)++)
        if (src[*cache_pos] == '\n') (*cache_line)++;
    return *cache_line;
}

static bool is_py_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static const char *find_tag(const char *s, size_t from, size_t len, size_t *at) {
    for (size_t i = from; i + 1 < len; i++)
        if (s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) {
            *at = i;
            return s + i;
        }
    *at = len;
    return NULL;
}

/* decodes a string literal body like Python's unicode-escape (as Jinja does) */
static char *decode_string(parser *p, const char *s, size_t n, size_t *outlen, int line) {
    char *o = palloc(p, n * 1 + 8);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            o[k++] = s[i];
            continue;
        }
        char e = s[++i];
        switch (e) {
        case 'n':
            o[k++] = '\n';
            break;
        case 't':
            o[k++] = '\t';
            break;
        case 'r':
            o[k++] = '\r';
            break;
        case '\\':
            o[k++] = '\\';
            break;
        case '\'':
            o[k++] = '\'';
            break;
        case '"':
            o[k++] = '"';
            break;
        case 'a':
            o[k++] = '\a';
            break;
        case 'b':
            o[k++] = '\b';
            break;
        case 'f':
            o[k++] = '\f';
            break;
        case 'v':
            o[k++] = '\v';
            break;
        case '\n':
            break;
        case '0':
        case '1':
        case '2':
        case '3':
        case '4':
        case '5':
        case '6':
        case '7': {
            unsigned v = 0;
            int d = 0;
            while (d < 3 && i < n && s[i] >= '0' && s[i] <= '7')
                v = v * 8 + (unsigned)(s[i++] - '0'), d++;
            i--;
            if (v < 0x80)
                o[k++] = (char)v;
            else {
                o[k++] = (char)(0xC0 | (v >> 6));
                o[k++] = (char)(0x80 | (v & 0x3F));
            }
            break;
        }
        case 'x':
        case 'u':
        case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            if (i + (size_t)digits >= n) pfail(p, line, "truncated \\%c escape in string", e);
            for (int d = 0; d < digits; d++) {
                char h = s[i + 1 + (size_t)d];
                if (!isxdigit((unsigned char)h))
                    pfail(p, line, "truncated \\%c escape in string", e);
                v = v * 16 + (uint32_t)(isdigit((unsigned char)h)
                                            ? h - '0'
                                            : (tolower((unsigned char)h) - 'a' + 10));
            }
            i += (size_t)digits;
            if (v > 0x10FFFF) pfail(p, line, "illegal Unicode character in string escape");
            if (v < 0x80)
                o[k++] = (char)v;
            else if (v < 0x800) {
                o[k++] = (char)(0xC0 | (v >> 6));
                o[k++] = (char)(0x80 | (v & 0x3F));
            } else if (v < 0x10000) {
                o[k++] = (char)(0xE0 | (v >> 12));
                o[k++] = (char)(0x80 | ((v >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (v & 0x3F));
            } else {
                o[k++] = (char)(0xF0 | (v >> 18));
                o[k++] = (char)(0x80 | ((v >> 12) & 0x3F));
                o[k++] = (char)(0x80 | ((v >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (v & 0x3F));
            }
            break;
        }
        default:
            o[k++] = '\\';
            o[k++] = e;
        }
    }
    o[k] = 0;
    *outlen = k;
    return o;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char OPS1[] = "+-*/%~()[]{},.:|=<>;";

/* lexes one {{ }} or {% %} interior starting at *pos; returns after the closing delimiter */
static void lex_expr(parser *p, const char *s, size_t len, size_t *pos, bool block, size_t *lc_pos,
                     int *lc_line) {
    size_t i = *pos;
    int braces = 0;
    for (;;) {
        while (i < len && is_py_space(s[i]))
            i++;
        int line = line_at(s, i, lc_pos, lc_line);
        if (i >= len)
            pfail(p, line, "unexpected end of template, expected '%s'", block ? "%}" : "}}");
        char end = block ? '%' : '}';
        /* closing delimiter, possibly with a - or + marker */
        if (braces == 0) {
            size_t j = i;
            char mark = 0;
            if ((s[j] == '-' || (block && s[j] == '+')) && j + 2 < len + 1 && j + 1 < len &&
                s[j + 1] == end && j + 2 < len && s[j + 2] == '}') {
                mark = s[j];
                j++;
            }
            if (j + 1 < len && s[j] == end && s[j + 1] == '}') {
                j += 2;
                push_tok(p, (token){.type = block ? T_BLOCK_END : T_VAR_END, .line = line});
                if (mark == '-') {
                    while (j < len && is_py_space(s[j]))
                        j++;
                } else if (block && mark != '+' && j < len && s[j] == '\n') {
                    j++; /* trim_blocks */
                }
                *pos = j;
                return;
            }
        }
        char ch = s[i];
        if (isalpha((unsigned char)ch) || ch == '_') {
            size_t st = i;
            while (i < len && (isalnum((unsigned char)s[i]) || s[i] == '_'))
                i++;
            push_tok(
                p, (token){
                       .type = T_NAME, .line = line, .s = pstrdup(p, s + st, i - st), .n = i - st});
            continue;
        }
        if (isdigit((unsigned char)ch)) {
            size_t st = i;
            while (i < len && (isdigit((unsigned char)s[i]) || s[i] == '_'))
                i++;
            bool is_float = false;
            if (i + 1 < len && s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
                is_float = true;
                i++;
                while (i < len && (isdigit((unsigned char)s[i]) || s[i] == '_'))
                    i++;
            }
            if (i < len && (s[i] == 'e' || s[i] == 'E')) {
                size_t k = i + 1;
                if (k < len && (s[k] == '+' || s[k] == '-')) k++;
                if (k < len && isdigit((unsigned char)s[k])) {
                    is_float = true;
                    i = k;
                    while (i < len && isdigit((unsigned char)s[i]))
                        i++;
                }
            }
            char buf[64];
            size_t bn = 0;
            for (size_t k = st; k < i && bn < sizeof buf - 1; k++)
                if (s[k] != '_') buf[bn++] = s[k];
            buf[bn] = 0;
            token t = {.type = is_float ? T_FLOAT : T_INT, .line = line};
            if (is_float)
                t.f = strtod(buf, NULL);
            else {
                char *e;
                errno = 0;
                unsigned long long v = strtoull(buf, &e, 10);
                if (v > INT64_MAX || bn > 19) pfail(p, line, "integer literal too large");
                t.i = (int64_t)v;
            }
            push_tok(p, t);
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t st = ++i;
            while (i < len && s[i] != ch) {
                if (s[i] == '\\' && i + 1 < len) i++;
                i++;
            }
            if (i >= len) pfail(p, line, "unterminated string");
            size_t n;
            char *v = decode_string(p, s + st, i - st, &n, line);
            i++;
            push_tok(p, (token){.type = T_STRING, .line = line, .s = v, .n = n});
            continue;
        }
        size_t oplen = 0;
        for (int k = 0; OPS2[k]; k++)
            if (i + 1 < len && s[i] == OPS2[k][0] && s[i + 1] == OPS2[k][1]) oplen = 2;
        if (!oplen && strchr(OPS1, ch) && ch) oplen = 1;
        if (!oplen) pfail(p, line, "unexpected char '%c'", ch);
        if (ch == '{' || ch == '(' || ch == '[') braces++;
        if ((ch == '}' || ch == ')' || ch == ']') && oplen == 1) {
            if (braces == 0) pfail(p, line, "unexpected '%c'", ch);
            braces--;
        }
        push_tok(p, (token){.type = T_OP, .line = line, .s = pstrdup(p, s + i, oplen), .n = oplen});
        i += oplen;
    }
}

/* matches {%[-+]? raw [-+]?%} at s[i]; returns end index or 0 */
static size_t match_keyword_tag(const char *s, size_t len, size_t i, const char *kw, char *lead,
                                char *trail) {
    if (i + 1 >= len || s[i] != '{' || s[i + 1] != '%') return 0;
    size_t j = i + 2;
    *lead = 0;
    if (j < len && (s[j] == '-' || s[j] == '+')) *lead = s[j++];
    while (j < len && is_py_space(s[j]))
        j++;
    size_t kl = strlen(kw);
    if (j + kl > len || memcmp(s + j, kw, kl) != 0) return 0;
    j += kl;
    if (j < len && (isalnum((unsigned char)s[j]) || s[j] == '_')) return 0;
    while (j < len && is_py_space(s[j]))
        j++;
    *trail = 0;
    if (j < len && (s[j] == '-' || s[j] == '+')) *trail = s[j++];
    if (j + 1 < len && s[j] == '%' && s[j + 1] == '}') return j + 2;
    return 0;
}

static size_t after_block_end(const char *s, size_t len, size_t j, char trail) {
    if (trail == '-')
        while (j < len && is_py_space(s[j]))
            j++;
    else if (trail != '+' && j < len && s[j] == '\n')
        j++;
    return j;
}

static void emit_data(parser *p, const char *s, size_t n, int line) {
    if (n) push_tok(p, (token){.type = T_DATA, .line = line, .s = pstrdup(p, s, n), .n = n});
}

/* lstrip_blocks / '-' handling of the text in front of a tag */
static size_t strip_before_tag(const char *s, size_t data_start, size_t data_end, char mark,
                               bool is_var) {
    if (mark == '-') {
        while (data_end > data_start && is_py_space(s[data_end - 1]))
            data_end--;
        return data_end;
    }
    if (mark == '+' || is_var) return data_end;
    size_t lpos = data_end;
    while (lpos > data_start && s[lpos - 1] != '\n')
        lpos--;
    bool line_starting = data_start == 0 || s[data_start - 1] == '\n';
    if (lpos > data_start || line_starting) {
        if (lpos == data_end) return data_end;
        for (size_t k = lpos; k < data_end; k++)
            if (!is_py_space(s[k])) return data_end;
        return lpos;
    }
    return data_end;
}

static void lex(parser *p, const char *s, size_t len) {
    size_t pos = 0, lc_pos = 0;
    int lc_line = 1;
    while (pos < len) {
        size_t at;
        find_tag(s, pos, len, &at);
        int line = line_at(s, pos, &lc_pos, &lc_line);
        if (at >= len) {
            emit_data(p, s + pos, len - pos, line);
            break;
        }
        char kind = s[at + 1];
        char mark = at + 2 < len && (s[at + 2] == '-' || s[at + 2] == '+') ? s[at + 2] : 0;
        size_t dend = strip_before_tag(s, pos, at, mark, kind == '{');
        emit_data(p, s + pos, dend - pos, line);
        int tline = line_at(s, at, &lc_pos, &lc_line);
        if (kind == '#') {
            size_t j = at + 2;
            while (j + 1 < len && !(s[j] == '#' && s[j + 1] == '}'))
                j++;
            if (j + 1 >= len) pfail(p, tline, "missing end of comment tag");
            char trail = j > at + 2 && (s[j - 1] == '-' || s[j - 1] == '+') ? s[j - 1] : 0;
            pos = after_block_end(s, len, j + 2, trail);
            continue;
        }
        char lead, trail;
        size_t rend = kind == '%' ? match_keyword_tag(s, len, at, "raw", &lead, &trail) : 0;
        if (rend && trail != '+') { /* Jinja2's raw opener takes '-%}' or '%}' and no trim_blocks */
            size_t j = rend, k, end_end = 0;
            if (trail == '-')
                while (j < len && is_py_space(s[j]))
                    j++;
            k = j;
            char elead = 0, etrail = 0;
            for (; k < len; k++)
                if ((end_end = match_keyword_tag(s, len, k, "endraw", &elead, &etrail))) break;
            if (!end_end) pfail(p, tline, "missing end of raw directive");
            size_t body_end = strip_before_tag(s, j, k, elead, false);
            emit_data(p, s + j, body_end - j, line_at(s, j, &lc_pos, &lc_line));
            pos = after_block_end(s, len, end_end, etrail);
            continue;
        }
        push_tok(p, (token){.type = kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, .line = tline});
        pos = at + 2 + (mark ? 1 : 0);
        lex_expr(p, s, len, &pos, kind == '%', &lc_pos, &lc_line);
    }
    push_tok(p, (token){.type = T_EOF, .line = line_at(s, len, &lc_pos, &lc_line)});
}

/* ================= parser ================= */

static token *cur(parser *p) {
    return &p->toks[p->pos];
}
static token *peek(parser *p, size_t k) {
    size_t i = p->pos + k;
    return &p->toks[i < p->ntoks ? i : p->ntoks - 1];
}
static bool is_op(token *t, const char *op) {
    return t->type == T_OP && strcmp(t->s, op) == 0;
}
static bool is_name(token *t, const char *nm) {
    return t->type == T_NAME && strcmp(t->s, nm) == 0;
}
static token *advance(parser *p) {
    token *t = cur(p);
    if (t->type != T_EOF) p->pos++;
    return t;
}

static const char *tok_desc(token *t) {
    switch (t->type) {
    case T_EOF:
        return "end of template";
    case T_DATA:
        return "template data";
    case T_VAR_BEGIN:
        return "'{{'";
    case T_VAR_END:
        return "'}}'";
    case T_BLOCK_BEGIN:
        return "'{%'";
    case T_BLOCK_END:
        return "'%}'";
    case T_STRING:
        return "string";
    case T_INT:
        return "integer";
    case T_FLOAT:
        return "float";
    default:
        return t->s;
    }
}

static void expect_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) pfail(p, cur(p)->line, "expected '%s', got %s", op, tok_desc(cur(p)));
    advance(p);
}
static const char *expect_name(parser *p) {
    if (cur(p)->type != T_NAME) pfail(p, cur(p)->line, "expected a name, got %s", tok_desc(cur(p)));
    return advance(p)->s;
}
static void expect_type(parser *p, ttype t, const char *what) {
    if (cur(p)->type != t) pfail(p, cur(p)->line, "expected %s, got %s", what, tok_desc(cur(p)));
    advance(p);
}

static jnode *mk(parser *p, jnode_type type, int line) {
    jnode *n = palloc(p, sizeof *n);
    n->type = type;
    n->line = line;
    return n;
}

/* expression trees are evaluated recursively: their height is bounded like block nesting */
#define MAX_EXPR_HEIGHT 400
static int height_of(const jnode *n) {
    return n ? n->height : 0;
}
static jnode *grown(parser *p, jnode *n) {
    int h = height_of(n->a);
    if (height_of(n->b) > h) h = height_of(n->b);
    if (height_of(n->c) > h) h = height_of(n->c);
    if (height_of(n->d) > h) h = height_of(n->d);
    for (size_t i = 0; i < n->nitems; i++)
        if (height_of(n->items[i]) > h) h = height_of(n->items[i]);
    for (size_t i = 0; i < n->nitems2; i++)
        if (height_of(n->items2[i]) > h) h = height_of(n->items2[i]);
    n->height = h + 1;
    if (n->height > MAX_EXPR_HEIGHT) pfail(p, n->line, "expression nests too deeply");
    return n;
}

typedef struct nodevec {
    jnode **v;
    size_t n, cap;
} nodevec;
static void nv_push(parser *p, nodevec *nv, jnode *x) {
    nv->v = pgrow(p, nv->v, nv->n, &nv->cap, sizeof *nv->v, 8);
    nv->v[nv->n++] = x;
}
typedef struct namevec {
    const char **v;
    size_t n, cap;
} namevec;
static void sv_push(parser *p, namevec *sv, const char *x) {
    sv->v = pgrow(p, sv->v, sv->n, &sv->cap, sizeof *sv->v, 8);
    sv->v[sv->n++] = x;
}

static jnode *parse_expression(parser *p, bool with_condexpr);
static jnode *parse_unary(parser *p, bool with_filter);
static jnode *parse_primary(parser *p);
static jnode *parse_postfix(parser *p, jnode *node);
static jnode *parse_tuple(parser *p, bool with_condexpr, bool explicit_parens,
                          const char *extra_end);

static void enter(parser *p) {
    if (++p->depth > 200) pfail(p, cur(p)->line, "template nests too deeply");
}

/* (args, kw=args) after '(' has been seen */
static void parse_call_args(parser *p, jnode *n) {
    expect_op(p, "(");
    nodevec args = {0}, kwv = {0};
    namevec kwn = {0};
    while (!is_op(cur(p), ")")) {
        if (args.n + kwv.n) expect_op(p, ",");
        if (is_op(cur(p), ")")) break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            pfail(p, cur(p)->line, "*args and **kwargs in calls are not supported");
        if (cur(p)->type == T_NAME && is_op(peek(p, 1), "=")) {
            const char *k = advance(p)->s;
            advance(p);
            sv_push(p, &kwn, k);
            nv_push(p, &kwv, parse_expression(p, true));
        } else {
            if (kwv.n) pfail(p, cur(p)->line, "positional argument follows keyword argument");
            nv_push(p, &args, parse_expression(p, true));
        }
    }
    expect_op(p, ")");
    n->items = args.v;
    n->nitems = args.n;
    n->items2 = kwv.v;
    n->nitems2 = kwv.n;
    n->names = kwn.v;
    n->nnames = kwn.n;
}

static jnode *parse_filter(parser *p, jnode *input, bool start_inline) {
    while (is_op(cur(p), "|") || start_inline) {
        if (!start_inline) advance(p);
        start_inline = false;
        int line = cur(p)->line;
        const char *name = expect_name(p);
        while (is_op(cur(p), ".")) {
            advance(p);
            const char *more = expect_name(p);
            size_t a = strlen(name), b = strlen(more);
            char *j = palloc(p, a + b + 2);
            memcpy(j, name, a);
            j[a] = '.';
            memcpy(j + a + 1, more, b + 1);
            name = j;
        }
        jnode *f = mk(p, N_FILTER, line);
        f->a = input;
        f->str = name;
        if (is_op(cur(p), "(")) parse_call_args(p, f);
        input = grown(p, f);
    }
    return input;
}

static jnode *parse_test(parser *p, jnode *node) {
    int line = advance(p)->line; /* 'is' */
    jnode *t = mk(p, N_TEST, line);
    t->a = node;
    if (is_name(cur(p), "not")) {
        advance(p);
        t->flag = 1;
    }
    t->str = expect_name(p);
    while (is_op(cur(p), ".")) {
        advance(p);
        expect_name(p);
        pfail(p, line, "dotted test names are not supported");
    }
    token *c = cur(p);
    if (is_op(c, "(")) {
        parse_call_args(p, t);
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT ||
                c->type == T_FLOAT || is_op(c, "(") || is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) pfail(p, c->line, "You cannot chain multiple tests with is");
        jnode *arg = parse_postfix(p, parse_primary(p));
        t->items = palloc(p, sizeof(jnode *));
        t->items[0] = arg;
        t->nitems = 1;
    }
    return grown(p, t);
}

static jnode *parse_filter_expr(parser *p, jnode *node) {
    for (;;) {
        if (is_op(cur(p), "|"))
            node = parse_filter(p, node, false);
        else if (is_name(cur(p), "is"))
            node = parse_test(p, node);
        else if (is_op(cur(p), "(")) {
            jnode *call = mk(p, N_CALL, cur(p)->line);
            call->a = node;
            parse_call_args(p, call);
            node = grown(p, call);
        } else
            return node;
    }
}

static jnode *parse_subscribed(parser *p) {
    int line = cur(p)->line;
    jnode *args[3] = {0};
    if (is_op(cur(p), ":")) {
        advance(p);
    } else {
        jnode *e = parse_expression(p, true);
        if (!is_op(cur(p), ":")) return e;
        advance(p);
        args[0] = e;
    }
    if (!is_op(cur(p), "]") && !is_op(cur(p), ",") && !is_op(cur(p), ":"))
        args[1] = parse_expression(p, true);
    if (is_op(cur(p), ":")) {
        advance(p);
        if (!is_op(cur(p), "]") && !is_op(cur(p), ",")) args[2] = parse_expression(p, true);
    }
    jnode *s = mk(p, N_SLICE, line);
    s->b = args[0];
    s->c = args[1];
    s->d = args[2];
    return s;
}

static jnode *parse_postfix(parser *p, jnode *node) {
    for (;;) {
        token *t = cur(p);
        if (is_op(t, ".")) {
            advance(p);
            token *a = advance(p);
            if (a->type == T_NAME) {
                jnode *g = mk(p, N_GETATTR, t->line);
                g->a = node;
                g->str = a->s;
                node = grown(p, g);
            } else if (a->type == T_INT) {
                jnode *g = mk(p, N_GETITEM, t->line);
                g->a = node;
                g->b = mk(p, N_LIT, t->line);
                g->b->lit = jv_int(a->i);
                node = grown(p, g);
            } else
                pfail(p, a->line, "expected name or number after '.'");
        } else if (is_op(t, "[")) {
            advance(p);
            nodevec idx = {0};
            while (!is_op(cur(p), "]")) {
                if (idx.n) {
                    expect_op(p, ",");
                    if (is_op(cur(p), "]")) break;
                }
                nv_push(p, &idx, parse_subscribed(p));
            }
            expect_op(p, "]");
            if (idx.n == 0) pfail(p, t->line, "expected a subscript");
            jnode *key = idx.v[0];
            if (idx.n > 1)
                for (size_t k = 0; k < idx.n; k++)
                    if (idx.v[k]->type == N_SLICE)
                        pfail(p, t->line, "slices inside a tuple subscript are not supported");
            if (idx.n > 1) {
                key = mk(p, N_TUPLE, t->line);
                key->items = idx.v;
                key->nitems = idx.n;
            }
            if (key->type == N_SLICE) {
                key->a = node;
                node = grown(p, key);
            } else {
                jnode *g = mk(p, N_GETITEM, t->line);
                g->a = node;
                g->b = key;
                node = grown(p, g);
            }
        } else if (is_op(t, "(")) {
            jnode *call = mk(p, N_CALL, t->line);
            call->a = node;
            parse_call_args(p, call);
            node = grown(p, call);
        } else
            return node;
    }
}

static jnode *parse_primary(parser *p) {
    enter(p);
    token *t = cur(p);
    jnode *n;
    switch (t->type) {
    case T_NAME:
        advance(p);
        n = mk(p, N_LIT, t->line);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True"))
            n->lit = jv_bool(true);
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False"))
            n->lit = jv_bool(false);
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None"))
            n->lit = jv_none();
        else {
            n->type = N_NAME;
            n->str = t->s;
        }
        break;
    case T_STRING: {
        advance(p);
        size_t total = t->n;
        size_t k = 0;
        while (peek(p, k)->type == T_STRING)
            total += peek(p, k++)->n;
        char *buf = palloc(p, total + 1);
        memcpy(buf, t->s, t->n);
        size_t off = t->n;
        while (cur(p)->type == T_STRING) {
            token *s2 = advance(p);
            memcpy(buf + off, s2->s, s2->n);
            off += s2->n;
        }
        n = mk(p, N_LIT, t->line);
        n->lit = jv_str(buf, total);
        break;
    }
    case T_INT:
        advance(p);
        n = mk(p, N_LIT, t->line);
        n->lit = jv_int(t->i);
        break;
    case T_FLOAT:
        advance(p);
        n = mk(p, N_LIT, t->line);
        n->lit = jv_float(t->f);
        break;
    case T_OP:
        if (is_op(t, "(")) {
            advance(p);
            n = parse_tuple(p, true, true, NULL);
            expect_op(p, ")");
            break;
        }
        if (is_op(t, "[")) {
            advance(p);
            nodevec items = {0};
            while (!is_op(cur(p), "]")) {
                if (items.n) expect_op(p, ",");
                if (is_op(cur(p), "]")) break;
                nv_push(p, &items, parse_expression(p, true));
            }
            expect_op(p, "]");
            n = mk(p, N_LIST, t->line);
            n->items = items.v;
            n->nitems = items.n;
            grown(p, n);
            break;
        }
        if (is_op(t, "{")) {
            advance(p);
            nodevec keys = {0}, vals = {0};
            while (!is_op(cur(p), "}")) {
                if (keys.n) expect_op(p, ",");
                if (is_op(cur(p), "}")) break;
                nv_push(p, &keys, parse_expression(p, true));
                expect_op(p, ":");
                nv_push(p, &vals, parse_expression(p, true));
            }
            expect_op(p, "}");
            n = mk(p, N_DICT, t->line);
            n->items = keys.v;
            n->nitems = keys.n;
            n->items2 = vals.v;
            n->nitems2 = vals.n;
            grown(p, n);
            break;
        }
        /* fallthrough */
    default:
        pfail(p, t->line, "unexpected %s", tok_desc(t));
    }
    p->depth--;
    return n;
}

static jnode *parse_unary(parser *p, bool with_filter) {
    enter(p);
    token *t = cur(p);
    jnode *node;
    if (is_op(t, "-") || is_op(t, "+")) {
        advance(p);
        node = mk(p, is_op(t, "-") ? N_NEG : N_POS, t->line);
        node->a = parse_unary(p, false);
        grown(p, node);
    } else {
        node = parse_primary(p);
    }
    node = parse_postfix(p, node);
    if (with_filter) node = parse_filter_expr(p, node);
    p->depth--;
    return node;
}

static jnode *binop(parser *p, int op, jnode *a, jnode *b, int line) {
    jnode *n = mk(p, N_BINOP, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return grown(p, n);
}

static jnode *parse_pow(parser *p) {
    jnode *l = parse_unary(p, true);
    while (is_op(cur(p), "**")) {
        int line = advance(p)->line;
        l = binop(p, JOP_POW, l, parse_unary(p, true), line);
    }
    return l;
}

static jnode *parse_math2(parser *p) {
    jnode *l = parse_pow(p);
    for (;;) {
        token *t = cur(p);
        int op = is_op(t, "*")    ? JOP_MUL
                 : is_op(t, "/")  ? JOP_DIV
                 : is_op(t, "//") ? JOP_FLOORDIV
                 : is_op(t, "%")  ? JOP_MOD
                                  : 0;
        if (!op) return l;
        advance(p);
        l = binop(p, op, l, parse_pow(p), t->line);
    }
}

static jnode *parse_concat(parser *p) {
    jnode *l = parse_math2(p);
    while (is_op(cur(p), "~")) {
        int line = advance(p)->line;
        l = binop(p, JOP_CONCAT, l, parse_math2(p), line);
    }
    return l;
}

static jnode *parse_math1(parser *p) {
    jnode *l = parse_concat(p);
    for (;;) {
        token *t = cur(p);
        int op = is_op(t, "+") ? JOP_ADD : is_op(t, "-") ? JOP_SUB : 0;
        if (!op) return l;
        advance(p);
        l = binop(p, op, l, parse_concat(p), t->line);
    }
}

static jnode *parse_compare(parser *p) {
    int line = cur(p)->line;
    jnode *first = parse_math1(p);
    nodevec operands = {0};
    int ops[64];
    size_t nops = 0;
    for (;;) {
        token *t = cur(p);
        int op = is_op(t, "==")   ? JOP_EQ
                 : is_op(t, "!=") ? JOP_NE
                 : is_op(t, "<")  ? JOP_LT
                 : is_op(t, "<=") ? JOP_LE
                 : is_op(t, ">")  ? JOP_GT
                 : is_op(t, ">=") ? JOP_GE
                                  : 0;
        if (op)
            advance(p);
        else if (is_name(t, "in")) {
            advance(p);
            op = JOP_IN;
        } else if (is_name(t, "not") && is_name(peek(p, 1), "in")) {
            advance(p);
            advance(p);
            op = JOP_NOTIN;
        } else
            break;
        if (nops == 64) pfail(p, t->line, "too many chained comparisons");
        ops[nops++] = op;
        nv_push(p, &operands, parse_math1(p));
    }
    if (!nops) return first;
    jnode *n = mk(p, N_COMPARE, line);
    n->a = first;
    n->items = operands.v;
    n->nitems = operands.n;
    n->ops = palloc(p, nops * sizeof(int));
    memcpy(n->ops, ops, nops * sizeof(int));
    return grown(p, n);
}

static jnode *parse_not(parser *p) {
    if (is_name(cur(p), "not")) {
        enter(p);
        jnode *n = mk(p, N_NOT, advance(p)->line);
        n->a = parse_not(p);
        p->depth--;
        return grown(p, n);
    }
    return parse_compare(p);
}

static jnode *parse_and(parser *p) {
    jnode *l = parse_not(p);
    while (is_name(cur(p), "and")) {
        jnode *n = mk(p, N_AND, advance(p)->line);
        n->a = l;
        n->b = parse_not(p);
        l = grown(p, n);
    }
    return l;
}

static jnode *parse_or(parser *p) {
    jnode *l = parse_and(p);
    while (is_name(cur(p), "or")) {
        jnode *n = mk(p, N_OR, advance(p)->line);
        n->a = l;
        n->b = parse_and(p);
        l = grown(p, n);
    }
    return l;
}

static jnode *parse_condexpr(parser *p) {
    enter(p);
    jnode *e1 = parse_or(p);
    while (is_name(cur(p), "if")) {
        jnode *n = mk(p, N_COND, advance(p)->line);
        n->b = e1;
        n->a = parse_or(p);
        if (is_name(cur(p), "else")) {
            advance(p);
            n->c = parse_condexpr(p);
        }
        e1 = grown(p, n);
    }
    p->depth--;
    return e1;
}

static jnode *parse_expression(parser *p, bool with_condexpr) {
    return with_condexpr ? parse_condexpr(p) : parse_or(p);
}

static bool tuple_end(parser *p, const char *extra_end) {
    token *t = cur(p);
    if (t->type == T_VAR_END || t->type == T_BLOCK_END || t->type == T_EOF) return true;
    if (is_op(t, ")") || is_op(t, "]") || is_op(t, "}") || is_op(t, "=")) return true;
    if (extra_end && is_name(t, extra_end)) return true;
    return false;
}

static jnode *parse_tuple(parser *p, bool with_condexpr, bool explicit_parens,
                          const char *extra_end) {
    int line = cur(p)->line;
    nodevec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n) expect_op(p, ",");
        if (tuple_end(p, extra_end)) break;
        nv_push(p, &items, parse_expression(p, with_condexpr));
        if (is_op(cur(p), ","))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) pfail(p, line, "expected an expression, got %s", tok_desc(cur(p)));
    }
    jnode *n = mk(p, N_TUPLE, line);
    n->items = items.v;
    n->nitems = items.n;
    return grown(p, n);
}

/* ---- statements ---- */

static jnode *parse_body(parser *p, const char *const *ends, const char **ended_by);

static void expect_block_end(parser *p) {
    expect_type(p, T_BLOCK_END, "'%}'");
}

static void parse_targets(parser *p, jnode *n, const char *extra_end) {
    namevec names = {0};
    bool paren = is_op(cur(p), "(");
    if (paren) advance(p);
    for (;;) {
        sv_push(p, &names, expect_name(p));
        if (!is_op(cur(p), ",")) break;
        advance(p);
        n->flag |= 2;
        if (paren && is_op(cur(p), ")")) break;
        if (extra_end && is_name(cur(p), extra_end)) break;
    }
    if (paren) {
        expect_op(p, ")");
        n->flag |= 2;
    }
    n->names = names.v;
    n->nnames = names.n;
}

static jnode *parse_for(parser *p, int line) {
    jnode *n = mk(p, S_FOR, line);
    parse_targets(p, n, "in");
    if (!is_name(cur(p), "in")) pfail(p, cur(p)->line, "expected 'in' in for loop");
    advance(p);
    n->a = parse_tuple(p, false, false, "recursive");
    if (is_name(cur(p), "if")) {
        advance(p);
        n->b = parse_expression(p, true);
    }
    if (is_name(cur(p), "recursive"))
        pfail(p, cur(p)->line, "recursive for loops are not supported");
    expect_block_end(p);
    static const char *const ends[] = {"endfor", "else", NULL};
    const char *by;
    p->loop_depth++;
    n->c = parse_body(p, ends, &by);
    p->loop_depth--;
    if (!strcmp(by, "else")) {
        static const char *const ends2[] = {"endfor", NULL};
        n->d = parse_body(p, ends2, &by);
    }
    return n;
}

static jnode *parse_if(parser *p, int line) {
    jnode *n = mk(p, S_IF, line);
    n->a = parse_tuple(p, false, false, NULL);
    expect_block_end(p);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *by;
    n->b = parse_body(p, ends, &by);
    if (!strcmp(by, "elif")) {
        if (++p->depth > 200) pfail(p, cur(p)->line, "too many elif branches");
        n->c = mk(p, S_BODY, cur(p)->line);
        n->c->flag = 1; /* an elif: kept apart from a plain else for scope analysis */
        n->c->items = palloc(p, sizeof(jnode *));
        n->c->nitems = 1;
        n->c->items[0] = parse_if(p, cur(p)->line);
        p->depth--;
    } else if (!strcmp(by, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        n->c = parse_body(p, ends2, &by);
    }
    return n;
}

static jnode *parse_set(parser *p, int line) {
    jnode *n = mk(p, S_SET, line);
    if (cur(p)->type == T_NAME && is_op(peek(p, 1), ".") && peek(p, 2)->type == T_NAME) {
        n->type = S_SET_ATTR;
        n->str = advance(p)->s;
        advance(p);
        n->names = palloc(p, sizeof(char *));
        n->names[0] = advance(p)->s;
        n->nnames = 1;
        expect_op(p, "=");
        n->a = parse_tuple(p, true, false, NULL);
        expect_block_end(p);
        return n;
    }
    parse_targets(p, n, NULL);
    if (is_op(cur(p), "=")) {
        advance(p);
        n->a = parse_tuple(p, true, false, NULL);
        expect_block_end(p);
        return n;
    }
    if (n->nnames != 1 || n->flag) pfail(p, line, "block set takes one name");
    n->type = S_SET_BLOCK;
    if (is_op(cur(p), "|")) n->b = parse_filter(p, NULL, false);
    expect_block_end(p);
    static const char *const ends[] = {"endset", NULL};
    const char *by;
    n->c = parse_body(p, ends, &by);
    return n;
}

static void parse_signature(parser *p, jnode *n) {
    namevec names = {0};
    nodevec defaults = {0};
    bool any_default = false;
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (names.n) expect_op(p, ",");
        if (is_op(cur(p), ")")) break;
        sv_push(p, &names, expect_name(p));
        if (is_op(cur(p), "=")) {
            advance(p);
            nv_push(p, &defaults, parse_expression(p, true));
            any_default = true;
        } else {
            if (any_default)
                pfail(p, cur(p)->line, "non-default argument follows default argument");
            nv_push(p, &defaults, NULL);
        }
    }
    expect_op(p, ")");
    n->names = names.v;
    n->nnames = names.n;
    n->items2 = defaults.v;
    n->nitems2 = defaults.n;
}

static jnode *parse_macro(parser *p, int line) {
    jnode *n = mk(p, S_MACRO, line);
    n->str = expect_name(p);
    parse_signature(p, n);
    expect_block_end(p);
    static const char *const ends[] = {"endmacro", NULL};
    const char *by;
    int saved = p->loop_depth;
    p->loop_depth = 0;
    n->a = parse_body(p, ends, &by);
    p->loop_depth = saved;
    return n;
}

static jnode *parse_call_block(parser *p, int line) {
    jnode *n = mk(p, S_CALL_BLOCK, line);
    if (is_op(cur(p), "(")) parse_signature(p, n);
    n->b = parse_expression(p, true);
    if (n->b->type != N_CALL) pfail(p, line, "expected a call after 'call'");
    expect_block_end(p);
    static const char *const ends[] = {"endcall", NULL};
    const char *by;
    int saved = p->loop_depth;
    p->loop_depth = 0;
    n->a = parse_body(p, ends, &by);
    p->loop_depth = saved;
    n->str = "caller";
    return n;
}

static jnode *parse_filter_block(parser *p, int line) {
    jnode *n = mk(p, S_FILTER_BLOCK, line);
    n->b = parse_filter(p, NULL, true);
    expect_block_end(p);
    static const char *const ends[] = {"endfilter", NULL};
    const char *by;
    n->a = parse_body(p, ends, &by);
    return n;
}

static jnode *parse_statement(parser *p) {
    token *t = advance(p); /* block begin */
    token *kw = cur(p);
    if (kw->type != T_NAME) pfail(p, kw->line, "tag name expected");
    advance(p);
    const char *k = kw->s;
    int line = kw->line;
    if (!strcmp(k, "if")) return parse_if(p, line);
    if (!strcmp(k, "for")) return parse_for(p, line);
    if (!strcmp(k, "set")) return parse_set(p, line);
    if (!strcmp(k, "macro")) return parse_macro(p, line);
    if (!strcmp(k, "call")) return parse_call_block(p, line);
    if (!strcmp(k, "filter")) return parse_filter_block(p, line);
    if (!strcmp(k, "break") || !strcmp(k, "continue")) {
        if (!p->loop_depth) pfail(p, line, "'%s' outside loop", k);
        jnode *n = mk(p, k[0] == 'b' ? S_BREAK : S_CONTINUE, line);
        expect_block_end(p);
        return n;
    }
    if (!strcmp(k, "generation")) {
        expect_block_end(p);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *by;
        return parse_body(p, ends, &by);
    }
    (void)t;
    if (!strcmp(k, "extends") || !strcmp(k, "include") || !strcmp(k, "import") ||
        !strcmp(k, "from") || !strcmp(k, "block") || !strcmp(k, "do") || !strcmp(k, "with") ||
        !strcmp(k, "autoescape"))
        pfail(p, line, "the '%s' tag is not supported", k);
    pfail(p, line, "Encountered unknown tag '%s'.", k);
}

static jnode *parse_body(parser *p, const char *const *ends, const char **ended_by) {
    int line = cur(p)->line;
    nodevec body = {0};
    if (++p->depth > 200) pfail(p, line, "blocks nest too deeply");
    for (;;) {
        token *t = cur(p);
        if (t->type == T_EOF) {
            if (ends) pfail(p, t->line, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        if (t->type == T_DATA) {
            advance(p);
            jnode *n = mk(p, S_TEXT, t->line);
            n->str = t->s;
            n->len = t->n;
            nv_push(p, &body, n);
        } else if (t->type == T_VAR_BEGIN) {
            advance(p);
            jnode *n = mk(p, S_OUTPUT, t->line);
            n->a = parse_tuple(p, true, false, NULL);
            expect_type(p, T_VAR_END, "'}}'");
            nv_push(p, &body, n);
        } else if (t->type == T_BLOCK_BEGIN) {
            token *kw = peek(p, 1);
            bool is_end = false;
            if (kw->type == T_NAME && ends)
                for (int i = 0; ends[i]; i++)
                    if (!strcmp(kw->s, ends[i])) {
                        is_end = true;
                        *ended_by = ends[i];
                    }
            if (is_end) {
                advance(p);
                advance(p);
                if (strcmp(*ended_by, "elif") != 0) expect_block_end(p);
                break;
            }
            if (kw->type == T_NAME &&
                (!strncmp(kw->s, "end", 3) || !strcmp(kw->s, "else") || !strcmp(kw->s, "elif")))
                pfail(p, kw->line, "Encountered unknown tag '%s'.%s", kw->s,
                      ends ? "" : " There is no block open to close here.");
            nv_push(p, &body, parse_statement(p));
        } else {
            pfail(p, t->line, "unexpected %s", tok_desc(t));
        }
    }
    p->depth--;
    jnode *n = mk(p, S_BODY, line);
    n->items = body.v;
    n->nitems = body.n;
    return n;
}

/* Jinja2 resolves filter and test names when it compiles, so an unknown one fails even where it
 * never runs -- except under an if (or inline if) of the same scope, where 3.x defers the check
 * to run time. A for body or a macro starts a new scope. */
static void check_names(parser *p, const jnode *n, int depth, bool deferred) {
    if (!n || depth > 10000) return;
    if (!deferred && n->type == N_FILTER && !jinja_filter_exists(n->str))
        pfail(p, n->line, "No filter named '%s'.", n->str);
    if (!deferred && n->type == N_TEST && !jinja_test_exists(n->str))
        pfail(p, n->line, "No test named '%s'.", n->str);
    if (n->type == S_IF || n->type == N_COND) deferred = true;
    if (n->type == S_FOR || n->type == S_MACRO || n->type == S_CALL_BLOCK) deferred = false;
    check_names(p, n->a, depth + 1, deferred);
    check_names(p, n->b, depth + 1, deferred);
    check_names(p, n->c, depth + 1, deferred);
    check_names(p, n->d, depth + 1, deferred);
    for (size_t i = 0; i < n->nitems; i++)
        check_names(p, n->items[i], depth + 1, deferred);
    for (size_t i = 0; i < n->nitems2; i++)
        check_names(p, n->items2[i], depth + 1, deferred);
}

/* ---- scope analysis: Jinja2's idtracking, as far as it shows in output ----
 * Each scope (the template, a for body, a macro, a call/set/filter block body) gets a symbol
 * table filled in source order. A name whose first occurrence in a scope is an assignment, and
 * that no enclosing scope knows, starts out "missing" there: nested scopes reading it see
 * Undefined until it is assigned -- not a context variable of the same name. */
typedef struct scope_tab {
    struct scope_tab *parent;
    namevec names;   /* declared here */
    namevec missing; /* declared here by an assignment first */
    namevec stores;  /* assigned here */
} scope_tab;

static bool nv_has(const namevec *v, const char *s) {
    for (size_t i = 0; i < v->n; i++)
        if (!strcmp(v->v[i], s)) return true;
    return false;
}

static bool scope_find(const scope_tab *t, const char *name) {
    for (; t; t = t->parent)
        if (nv_has(&t->names, name)) return true;
    return false;
}

static void declare_load(parser *p, scope_tab *t, const char *name) {
    if (!nv_has(&t->names, name) && !scope_find(t->parent, name)) sv_push(p, &t->names, name);
}

static void declare_store(parser *p, scope_tab *t, const char *name) {
    if (!nv_has(&t->stores, name)) sv_push(p, &t->stores, name);
    if (nv_has(&t->names, name)) return;
    sv_push(p, &t->names, name);
    if (!scope_find(t->parent, name)) sv_push(p, &t->missing, name);
}

static void walk_scope(parser *p, const jnode *n, scope_tab *t, nodevec *children, int depth);

typedef struct branch_result {
    namevec names, missing, stores;
} branch_result;

static void take_new(parser *p, namevec *from, size_t old_n, namevec *to) {
    for (size_t i = old_n; i < from->n; i++)
        sv_push(p, to, from->v[i]);
    from->n = old_n;
}

/* Jinja2 analyses if/elifs/else as three branches on copies of the table, then merges them: a
 * name assigned in only some of the three reads through to the outer value until assigned. */
static void walk_if(parser *p, scope_tab *t, nodevec *children, const jnode *test,
                    const jnode *body, const jnode *const *elifs, size_t nelifs,
                    const jnode *else_body, int depth) {
    walk_scope(p, test, t, children, depth + 1);
    size_t n0 = t->names.n, m0 = t->missing.n, s0 = t->stores.n;
    branch_result br[3];
    memset(br, 0, sizeof br);
    for (int g = 0; g < 3; g++) {
        if (g == 0) walk_scope(p, body, t, children, depth + 1);
        if (g == 1)
            for (size_t i = 0; i < nelifs; i++)
                walk_if(p, t, children, elifs[i]->a, elifs[i]->b, NULL, 0, NULL, depth + 1);
        if (g == 2) walk_scope(p, else_body, t, children, depth + 1);
        take_new(p, &t->names, n0, &br[g].names);
        take_new(p, &t->missing, m0, &br[g].missing);
        take_new(p, &t->stores, s0, &br[g].stores);
    }
    for (int g = 0; g < 3; g++) {
        for (size_t i = 0; i < br[g].names.n; i++)
            if (!nv_has(&t->names, br[g].names.v[i])) sv_push(p, &t->names, br[g].names.v[i]);
        for (size_t i = 0; i < br[g].stores.n; i++)
            if (!nv_has(&t->stores, br[g].stores.v[i])) sv_push(p, &t->stores, br[g].stores.v[i]);
    }
    /* still missing only if every branch assigned it, as the else branch left it */
    for (size_t i = 0; i < br[2].missing.n; i++) {
        const char *name = br[2].missing.v[i];
        if (nv_has(&br[0].stores, name) && nv_has(&br[1].stores, name) &&
            !nv_has(&t->missing, name))
            sv_push(p, &t->missing, name);
    }
}

/* records this scope's own loads and stores in order; nested scopes are queued in `children` */
static void walk_scope(parser *p, const jnode *n, scope_tab *t, nodevec *children, int depth) {
    if (!n || depth > 10000) return;
    switch (n->type) {
    case S_IF: {
        nodevec elifs = {0};
        const jnode *cur = n;
        while (cur->c && cur->c->type == S_BODY && cur->c->flag == 1 && cur->c->nitems == 1) {
            nv_push(p, &elifs, cur->c->items[0]);
            cur = cur->c->items[0];
        }
        walk_if(p, t, children, n->a, n->b, (const jnode *const *)elifs.v, elifs.n, cur->c, depth);
        return;
    }
    case N_NAME:
        declare_load(p, t, n->str);
        return;
    case S_SET:
        walk_scope(p, n->a, t, children, depth + 1);
        for (size_t i = 0; i < n->nnames; i++)
            declare_store(p, t, n->names[i]);
        return;
    case S_SET_ATTR:
        declare_load(p, t, n->str);
        walk_scope(p, n->a, t, children, depth + 1);
        return;
    case S_FOR:
        walk_scope(p, n->a, t, children, depth + 1); /* the iterable is read out here */
        nv_push(p, children, (jnode *)n);
        walk_scope(p, n->d, t, children, depth + 1); /* and so is the else block */
        return;
    case S_MACRO:
        declare_store(p, t, n->str);
        nv_push(p, children, (jnode *)n);
        return;
    case S_CALL_BLOCK:
        walk_scope(p, n->b, t, children, depth + 1);
        nv_push(p, children, (jnode *)n);
        return;
    case S_SET_BLOCK:
        declare_store(p, t, n->names[0]);
        walk_scope(p, n->b, t, children, depth + 1);
        nv_push(p, children, (jnode *)n);
        return;
    case S_FILTER_BLOCK:
        walk_scope(p, n->b, t, children, depth + 1);
        nv_push(p, children, (jnode *)n);
        return;
    default:
        walk_scope(p, n->a, t, children, depth + 1);
        walk_scope(p, n->b, t, children, depth + 1);
        walk_scope(p, n->c, t, children, depth + 1);
        walk_scope(p, n->d, t, children, depth + 1);
        for (size_t i = 0; i < n->nitems; i++)
            walk_scope(p, n->items[i], t, children, depth + 1);
        for (size_t i = 0; i < n->nitems2; i++)
            walk_scope(p, n->items2[i], t, children, depth + 1);
    }
}

static void analyze_scope(parser *p, jnode *owner, scope_tab *parent, int depth) {
    if (depth > 400) pfail(p, owner->line, "blocks nest too deeply");
    scope_tab t = {.parent = parent};
    nodevec children = {0};
    const jnode *body = owner;
    switch (owner->type) {
    case S_FOR:
        for (size_t i = 0; i < owner->nnames; i++)
            declare_store(p, &t, owner->names[i]);
        walk_scope(p, owner->b, &t, &children, depth + 1); /* loop filter */
        body = owner->c;
        break;
    case S_MACRO:
    case S_CALL_BLOCK:
        for (size_t i = 0; i < owner->nnames; i++)
            sv_push(p, &t.names, owner->names[i]);
        sv_push(p, &t.names, "varargs");
        sv_push(p, &t.names, "kwargs");
        sv_push(p, &t.names, "caller");
        for (size_t i = 0; i < owner->nitems2; i++)
            walk_scope(p, owner->items2[i], &t, &children, depth + 1);
        body = owner->a;
        break;
    case S_SET_BLOCK:
        body = owner->c;
        break;
    case S_FILTER_BLOCK:
        body = owner->a;
        break;
    default:
        break;
    }
    walk_scope(p, body, &t, &children, depth + 1);
    owner->missing = t.missing.v;
    owner->nmissing = t.missing.n;
    for (size_t i = 0; i < children.n; i++)
        analyze_scope(p, children.v[i], &t, depth + 1);
}

jnode *jparse(jinja_template *t, const char *src, size_t len, char *err, size_t errlen) {
    parser p = {.t = t, .err = err, .errlen = errlen};
    /* newlines normalised to \n; one trailing newline dropped (keep_trailing_newline=False) */
    char *s = jarena_alloc(&t->arena, len + 1);
    if (!s) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else
            s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    if (setjmp(p.fail)) return NULL;
    lex(&p, s, n);
    jnode *body = parse_body(&p, NULL, NULL);
    check_names(&p, body, 0, false);
    analyze_scope(&p, body, NULL, 0);
    return body;
}
