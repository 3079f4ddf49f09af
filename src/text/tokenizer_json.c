/* tokenizer_json — a small, strict JSON scanner for the two huge members of tokenizer.json,
 * model.vocab (object of token -> id) and model.merges (array of "a b" or ["a", "b"]), which
 * hold 99% of the file's bytes. Reading them straight into our tables instead of building a
 * jansson tree for them cuts load time several-fold; everything else in the file (a few KB)
 * still goes through jansson. Input is untrusted: every read is bounds-checked, nesting is
 * limited, strings must be valid UTF-8 without raw control characters. It does not build
 * values, it only finds spans and decodes strings and integers. */
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_internal.h"

#define MAX_DEPTH 256

typedef struct scan {
    const char *s;
    size_t n, i;
} scan;

static void ws(scan *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\n' || c->s[c->i] == '\r' || c->s[c->i] == '\t')) c->i++;
}

static int hex4(scan *c, uint32_t *v) {
    if (c->n - c->i < 4) return -1;
    uint32_t x = 0;
    for (int k = 0; k < 4; k++) {
        char ch = c->s[c->i + (size_t)k];
        int d = (ch >= '0' && ch <= '9') ? ch - '0' : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10 : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10 : -1;
        if (d < 0) return -1;
        x = x * 16 + (uint32_t)d;
    }
    c->i += 4;
    *v = x;
    return 0;
}

/* Parses a string at c->i (which must be '"'). With out, the decoded bytes are appended to it
 * (out is cleared first). When the string has no escapes, *raw and *raw_len point into the input
 * and out is left empty (saves a copy for the common case). */
static int parse_string(scan *c, strbuf *out, const char **raw, size_t *raw_len) {
    if (c->i >= c->n || c->s[c->i] != '"') return -1;
    c->i++;
    size_t start = c->i;
    int escaped = 0;
    if (out) strbuf_clear(out);
    while (c->i < c->n) {
        uint8_t ch = (uint8_t)c->s[c->i];
        if (ch == '"') {
            if (!escaped) {
                if (raw) *raw = c->s + start, *raw_len = c->i - start;
            } else if (raw) {
                *raw = out ? (out->data ? out->data : "") : NULL, *raw_len = out ? out->len : 0;
            }
            c->i++;
            return 0;
        }
        if (ch < 0x20) return -1;
        if (ch == '\\') {
            if (!escaped && out) strbuf_append(out, c->s + start, c->i - start);
            escaped = 1;
            if (++c->i >= c->n) return -1;
            char e = c->s[c->i++];
            char buf[4];
            const char *lit = NULL;
            switch (e) {
            case '"': lit = "\""; break;
            case '\\': lit = "\\"; break;
            case '/': lit = "/"; break;
            case 'b': lit = "\b"; break;
            case 'f': lit = "\f"; break;
            case 'n': lit = "\n"; break;
            case 'r': lit = "\r"; break;
            case 't': lit = "\t"; break;
            case 'u': {
                uint32_t cp;
                if (hex4(c, &cp)) return -1;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (c->n - c->i < 6 || c->s[c->i] != '\\' || c->s[c->i + 1] != 'u') return -1;
                    c->i += 2;
                    if (hex4(c, &lo) || lo < 0xDC00 || lo > 0xDFFF) return -1;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (out) strbuf_append(out, buf, (size_t)tok_utf8_encode(cp, buf));
                continue;
            }
            default: return -1;
            }
            if (out) strbuf_append(out, lit, 1);
            continue;
        }
        size_t adv = 1;
        if (ch >= 0x80 && tok_utf8_decode((const uint8_t *)c->s + c->i, c->n - c->i, &adv) < 0) return -1;
        if (escaped && out) strbuf_append(out, c->s + c->i, adv);
        c->i += adv;
    }
    return -1;
}

static int parse_number(scan *c, long long *v, int *is_int) {
    size_t start = c->i;
    int neg = 0, integral = 1;
    long long x = 0;
    if (c->i < c->n && c->s[c->i] == '-') neg = 1, c->i++;
    if (c->i >= c->n || c->s[c->i] < '0' || c->s[c->i] > '9') return -1;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') {
        if (x < (1LL << 40)) x = x * 10 + (c->s[c->i] - '0');
        c->i++;
    }
    if (c->i < c->n && c->s[c->i] == '.') {
        integral = 0;
        c->i++;
        if (c->i >= c->n || c->s[c->i] < '0' || c->s[c->i] > '9') return -1;
        while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
    }
    if (c->i < c->n && (c->s[c->i] == 'e' || c->s[c->i] == 'E')) {
        integral = 0;
        c->i++;
        if (c->i < c->n && (c->s[c->i] == '+' || c->s[c->i] == '-')) c->i++;
        if (c->i >= c->n || c->s[c->i] < '0' || c->s[c->i] > '9') return -1;
        while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
    }
    (void)start;
    if (v) *v = neg ? -x : x;
    if (is_int) *is_int = integral;
    return 0;
}

static int skip_value(scan *c, int depth) {
    if (depth > MAX_DEPTH) return -1;
    ws(c);
    if (c->i >= c->n) return -1;
    char ch = c->s[c->i];
    if (ch == '"') return parse_string(c, NULL, NULL, NULL);
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->i++;
        ws(c);
        if (c->i < c->n && c->s[c->i] == close) {
            c->i++;
            return 0;
        }
        for (;;) {
            if (ch == '{') {
                ws(c);
                if (parse_string(c, NULL, NULL, NULL)) return -1;
                ws(c);
                if (c->i >= c->n || c->s[c->i] != ':') return -1;
                c->i++;
            }
            if (skip_value(c, depth + 1)) return -1;
            ws(c);
            if (c->i >= c->n) return -1;
            if (c->s[c->i] == ',') {
                c->i++;
                continue;
            }
            if (c->s[c->i] == close) {
                c->i++;
                return 0;
            }
            return -1;
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(words[k]);
        if (c->n - c->i >= l && !memcmp(c->s + c->i, words[k], l)) {
            c->i += l;
            return 0;
        }
    }
    return parse_number(c, NULL, NULL);
}

/* Iterates the members of the object at c->i, calling fn with each key and leaving c->i at the
 * value; fn must consume the value. */
typedef int (*member_fn)(void *ctx, scan *c, const char *key, size_t klen);

static int each_member(scan *c, strbuf *kbuf, member_fn fn, void *ctx) {
    ws(c);
    if (c->i >= c->n || c->s[c->i] != '{') return -1;
    c->i++;
    ws(c);
    if (c->i < c->n && c->s[c->i] == '}') {
        c->i++;
        return 0;
    }
    for (;;) {
        ws(c);
        const char *k;
        size_t kl;
        if (parse_string(c, kbuf, &k, &kl)) return -1;
        ws(c);
        if (c->i >= c->n || c->s[c->i] != ':') return -1;
        c->i++;
        ws(c);
        if (fn(ctx, c, k, kl)) return -1;
        ws(c);
        if (c->i >= c->n) return -1;
        if (c->s[c->i] == ',') {
            c->i++;
            continue;
        }
        if (c->s[c->i] == '}') {
            c->i++;
            return 0;
        }
        return -1;
    }
}

typedef struct find_ctx {
    tok_json_spans *sp;
    strbuf kbuf;
} find_ctx;

static int model_member(void *ctx, scan *c, const char *key, size_t klen) {
    find_ctx *f = ctx;
    size_t start = c->i;
    if (skip_value(c, 2)) return -1;
    if (klen == 5 && !memcmp(key, "vocab", 5) && c->s[start] == '{') f->sp->vocab = start, f->sp->vocab_len = c->i - start;
    if (klen == 6 && !memcmp(key, "merges", 6) && c->s[start] == '[') f->sp->merges = start, f->sp->merges_len = c->i - start;
    return 0;
}

static int top_member(void *ctx, scan *c, const char *key, size_t klen) {
    find_ctx *f = ctx;
    if (klen == 5 && !memcmp(key, "model", 5) && c->i < c->n && c->s[c->i] == '{') {
        strbuf kb = {0};
        int rc = each_member(c, &kb, model_member, f);
        strbuf_free(&kb);
        return rc;
    }
    return skip_value(c, 1);
}

int tok_json_find_spans(const char *s, size_t n, tok_json_spans *sp, size_t *err_at) {
    memset(sp, 0, sizeof *sp);
    scan c = {s, n, 0};
    find_ctx f = {sp, {0}};
    int rc = each_member(&c, &f.kbuf, top_member, &f);
    strbuf_free(&f.kbuf);
    if (!rc) {
        ws(&c);
        if (c.i != n) rc = -1;
    }
    if (rc && err_at) *err_at = c.i;
    return rc;
}

typedef struct vocab_ctx {
    tok_json_entry_fn fn;
    void *user;
} vocab_ctx;

static int vocab_member(void *ctx, scan *c, const char *key, size_t klen) {
    vocab_ctx *v = ctx;
    long long id;
    int is_int;
    if (c->i >= c->n || parse_number(c, &id, &is_int) || !is_int) return -2;
    return v->fn(v->user, key, klen, id);
}

int tok_json_vocab(const char *s, size_t n, tok_json_entry_fn fn, void *user) {
    scan c = {s, n, 0};
    strbuf kb = {0};
    vocab_ctx v = {fn, user};
    int rc = each_member(&c, &kb, vocab_member, &v);
    strbuf_free(&kb);
    return rc;
}

int tok_json_merges(const char *s, size_t n, tok_json_merge_fn fn, void *user) {
    scan c = {s, n, 0};
    strbuf a = {0}, b = {0};
    int rc = -1;
    ws(&c);
    if (c.i >= c.n || c.s[c.i] != '[') goto done;
    c.i++;
    ws(&c);
    size_t idx = 0;
    if (c.i < c.n && c.s[c.i] == ']') {
        rc = 0;
        goto done;
    }
    for (;; idx++) {
        ws(&c);
        if (c.i >= c.n) goto done;
        const char *pa, *pb = NULL;
        size_t la, lb = 0;
        if (c.s[c.i] == '"') {
            if (parse_string(&c, &a, &pa, &la)) goto done;
            const char *sp = memchr(pa, ' ', la);
            if (sp) pb = sp + 1, lb = la - (size_t)(sp - pa) - 1, la = (size_t)(sp - pa);
        } else if (c.s[c.i] == '[') {
            c.i++;
            ws(&c);
            if (parse_string(&c, &a, &pa, &la)) goto done;
            ws(&c);
            if (c.i >= c.n || c.s[c.i] != ',') goto done;
            c.i++;
            ws(&c);
            if (parse_string(&c, &b, &pb, &lb)) goto done;
            ws(&c);
            if (c.i >= c.n || c.s[c.i] != ']') goto done;
            c.i++;
        } else {
            if (fn(user, idx, NULL, 0, NULL, 0)) goto done; /* reports the bad element */
            goto done;
        }
        if (fn(user, idx, pa, la, pb, lb)) goto done;
        ws(&c);
        if (c.i >= c.n) goto done;
        if (c.s[c.i] == ',') {
            c.i++;
            continue;
        }
        if (c.s[c.i] == ']') break;
        goto done;
    }
    rc = 0;
done:
    strbuf_free(&a);
    strbuf_free(&b);
    return rc;
}
