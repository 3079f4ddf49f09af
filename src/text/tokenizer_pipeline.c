/* tokenizer_pipeline — reads the pipeline components of a tokenizer.json (normalizer,
 * pre-tokenizer, decoder, post-processor, and the regex patterns they carry) into the structs of
 * tokenizer_internal.h, plus the loader's error and JSON helpers. Every byte is untrusted: a
 * malformed component yields -1 and a message naming the field. It refuses component kinds it
 * does not implement (it names them rather than silently tokenizing differently from Hugging
 * Face). tokenizer_load.c calls it; it calls only tokenizer_tables.c. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/strbuf.h"
#include "text/tokenizer_internal.h"

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                       */

void tok_load_fail(tok_load_ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset_at(c->err, c->errlen, c->file, fmt, ap);
    va_end(ap);
}

char *tok_dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* Regex: the files carry Oniguruma patterns (what HF tokenizers runs); PCRE2 with UTF+UCP
 * agrees on everything these patterns use except \s, which in Oniguruma also matches U+0085.
 * We add it so splits agree. */

static int rewrite_regex(const char *src, size_t n, strbuf *out) {
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = src[i];
        if (ch == '\\' && i + 1 < n) {
            char nx = src[i + 1];
            if (nx == 's') {
                strbuf_append_str(out, in_class ? "\\s\\x{85}" : "[\\s\\x{85}]");
            } else if (nx == 'S' && !in_class) {
                strbuf_append_str(out, "[^\\s\\x{85}]");
            } else {
                strbuf_append(out, src + i, 2);
            }
            i++;
            continue;
        }
        if (ch == '[' && !in_class) {
            in_class = 1;
            strbuf_append_char(out, ch);
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && src[i + 1] == '^') strbuf_append_char(out, src[++i]);
            if (i + 1 < n && src[i + 1] == ']') strbuf_append_char(out, src[++i]);
            continue;
        }
        if (ch == ']' && in_class) in_class = 0;
        strbuf_append_char(out, ch);
    }
    return 0;
}

static int pattern_parse(tok_load_ctx *c, json_t *j, tok_pattern *p, const char *where) {
    memset(p, 0, sizeof *p);
    json_t *s = json_object_get(j, "String"), *r = json_object_get(j, "Regex");
    if (json_is_string(s)) {
        p->kind = TOK_PATTERN_STRING;
        p->len = json_string_length(s);
        p->str = tok_dup_bytes(json_string_value(s), p->len);
        if (!p->str) return -1;
        if (p->len == 0) {
            tok_load_fail(c, "%s: empty String pattern", where);
            return -1;
        }
        return 0;
    }
    if (!json_is_string(r)) {
        tok_load_fail(c, "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
        return -1;
    }
    p->kind = TOK_PATTERN_REGEX;
    p->len = json_string_length(r);
    p->str = tok_dup_bytes(json_string_value(r), p->len);
    if (!p->str) return -1;
    strbuf rw = {0};
    rewrite_regex(p->str, p->len, &rw);
    int code;
    PCRE2_SIZE off;
    p->re = pcre2_compile((PCRE2_SPTR)(rw.data ? rw.data : ""), rw.len, PCRE2_UTF | PCRE2_UCP,
                          &code, &off, NULL);
    strbuf_free(&rw);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        tok_load_fail(c, "%s: regex does not compile (%s at offset %zu): %.80s", where, (char *)msg,
                      (size_t)off, p->str);
        return -1;
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* best effort: falls back to the interpreter */
    return 0;
}

void tok_pattern_free(tok_pattern *p) {
    free(p->str);
    if (p->re) pcre2_code_free(p->re);
}

int tok_pattern_find_all(const tok_pattern *p, const char *s, size_t n, pcre2_match_data *md,
                         tok_match_fn fn, void *ctx) {
    if (p->kind == TOK_PATTERN_STRING) {
        size_t i = 0;
        while (i + p->len <= n) {
            const char *hit = memmem(s + i, n - i, p->str, p->len);
            if (!hit) break;
            size_t at = (size_t)(hit - s);
            if (fn(ctx, at, at + p->len)) return -1;
            i = at + p->len;
        }
        return 0;
    }
    size_t start = 0;
    while (start <= n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return -1; /* match limit etc.: the caller reports an error */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me > ms) {
            if (fn(ctx, ms, me)) return -1;
            start = me;
        } else {
            /* empty match: step over one character */
            if (ms >= n) break;
            size_t adv;
            if (tok_utf8_decode((const uint8_t *)s + ms, n - ms, &adv) < 0) adv = 1;
            start = ms + adv;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* JSON helpers                                                                                 */

int tok_json_bool(json_t *o, const char *k, int dflt) {
    json_t *v = json_object_get(o, k);
    if (json_is_boolean(v)) return json_is_true(v);
    return dflt;
}

const char *tok_json_type(json_t *o) {
    json_t *v = json_object_get(o, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A single char given as a string (Metaspace replacement, Strip content). */
static int one_char(tok_load_ctx *c, json_t *o, const char *key, const char *dflt, char out[8],
                    uint8_t *len, const char *where) {
    json_t *v = json_object_get(o, key);
    const char *s = dflt;
    size_t n = strlen(dflt);
    if (json_is_string(v)) {
        s = json_string_value(v);
        n = json_string_length(v);
    }
    size_t adv;
    if (n == 0 || n > 4 || tok_utf8_decode((const uint8_t *)s, n, &adv) < 0 || adv != n) {
        tok_load_fail(c, "%s: \"%s\" must be a single character", where, key);
        return -1;
    }
    memcpy(out, s, n);
    out[n] = 0;
    *len = (uint8_t)n;
    return 0;
}

static enum tok_prepend_scheme prepend_scheme(json_t *o) {
    json_t *ps = json_object_get(o, "prepend_scheme");
    if (json_is_string(ps)) {
        const char *s = json_string_value(ps);
        if (!strcmp(s, "first")) return TOK_PREPEND_FIRST;
        if (!strcmp(s, "never")) return TOK_PREPEND_NEVER;
        return TOK_PREPEND_ALWAYS;
    }
    return tok_json_bool(o, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
}

/* ------------------------------------------------------------------------------------------ */
/* Components                                                                                   */

static int grow(void **arr, int *n, size_t elem) {
    void *p = realloc(*arr, (size_t)(*n + 1) * elem);
    if (!p) return -1;
    *arr = p;
    memset((char *)p + (size_t)*n * elem, 0, elem);
    (*n)++;
    return 0;
}

int tok_parse_normalizer(tokenizer *t, tok_load_ctx *c, json_t *j, int depth) {
    if (json_is_null(j) || !j) return 0;
    const char *type = tok_json_type(j);
    if (!json_is_object(j) || !type) {
        tok_load_fail(c, "normalizer: expected an object with a \"type\"");
        return -1;
    }
    if (depth > 8) {
        tok_load_fail(c, "normalizer: nested too deeply");
        return -1;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr)) {
            tok_load_fail(c, "normalizer Sequence: \"normalizers\" must be an array");
            return -1;
        }
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) if (tok_parse_normalizer(t, c, v, depth + 1)) return -1;
        return 0;
    }
    if (grow((void **)&t->norms, &t->n_norms, sizeof(tok_normalizer))) return -1;
    tok_normalizer *n = &t->norms[t->n_norms - 1];
    if (!strcmp(type, "NFC"))
        n->kind = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD"))
        n->kind = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC"))
        n->kind = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD"))
        n->kind = TOK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase"))
        n->kind = TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "StripAccents"))
        n->kind = TOK_NORM_STRIP_ACCENTS;
    else if (!strcmp(type, "Strip")) {
        n->kind = TOK_NORM_STRIP;
        n->strip_left = (uint8_t)tok_json_bool(j, "strip_left", 1);
        n->strip_right = (uint8_t)tok_json_bool(j, "strip_right", 1);
    } else if (!strcmp(type, "Prepend") || !strcmp(type, "Replace")) {
        int is_prepend = type[0] == 'P';
        n->kind = is_prepend ? TOK_NORM_PREPEND : TOK_NORM_REPLACE;
        json_t *content = json_object_get(j, is_prepend ? "prepend" : "content");
        if (!json_is_string(content)) {
            tok_load_fail(c, "normalizer %s: missing string \"%s\"", type,
                          is_prepend ? "prepend" : "content");
            return -1;
        }
        n->content_len = json_string_length(content);
        n->content = tok_dup_bytes(json_string_value(content), n->content_len);
        if (!is_prepend &&
            pattern_parse(c, json_object_get(j, "pattern"), &n->pattern, "normalizer Replace"))
            return -1;
    } else {
        tok_load_fail(c, "normalizer type \"%s\" is not supported", type);
        return -1;
    }
    return 0;
}

static int split_behavior(tok_load_ctx *c, json_t *j, enum tok_split_behavior dflt,
                          enum tok_split_behavior *out) {
    json_t *b = json_object_get(j, "behavior");
    *out = dflt;
    if (!b) return 0;
    const char *s = json_is_string(b) ? json_string_value(b) : "";
    if (!strcmp(s, "Removed"))
        *out = TOK_SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated"))
        *out = TOK_SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious"))
        *out = TOK_SPLIT_MERGED_WITH_PREVIOUS;
    else if (!strcmp(s, "MergedWithNext"))
        *out = TOK_SPLIT_MERGED_WITH_NEXT;
    else if (!strcmp(s, "Contiguous"))
        *out = TOK_SPLIT_CONTIGUOUS;
    else {
        tok_load_fail(c, "pre_tokenizer: unknown split behavior \"%s\"", s);
        return -1;
    }
    return 0;
}

int tok_parse_pretokenizer(tokenizer *t, tok_load_ctx *c, json_t *j, int depth) {
    if (json_is_null(j) || !j) return 0;
    const char *type = tok_json_type(j);
    if (!json_is_object(j) || !type) {
        tok_load_fail(c, "pre_tokenizer: expected an object with a \"type\"");
        return -1;
    }
    if (depth > 8) {
        tok_load_fail(c, "pre_tokenizer: nested too deeply");
        return -1;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr)) {
            tok_load_fail(c, "pre_tokenizer Sequence: \"pretokenizers\" must be an array");
            return -1;
        }
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) if (tok_parse_pretokenizer(t, c, v, depth + 1)) return -1;
        return 0;
    }
    if (grow((void **)&t->pres, &t->n_pres, sizeof(tok_pretokenizer))) return -1;
    tok_pretokenizer *p = &t->pres[t->n_pres - 1];
    if (!strcmp(type, "Split")) {
        p->kind = TOK_PRE_SPLIT;
        if (pattern_parse(c, json_object_get(j, "pattern"), &p->pattern, "pre_tokenizer Split"))
            return -1;
        if (split_behavior(c, j, TOK_SPLIT_ISOLATED, &p->behavior)) return -1;
        p->invert = (uint8_t)tok_json_bool(j, "invert", 0);
    } else if (!strcmp(type, "ByteLevel")) {
        p->kind = TOK_PRE_BYTE_LEVEL;
        p->add_prefix_space = (uint8_t)tok_json_bool(j, "add_prefix_space", 1);
        p->use_regex = (uint8_t)tok_json_bool(j, "use_regex", 1);
        if (p->use_regex) {
            json_t *re = json_pack("{s:s}", "Regex",
                                   "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
                                   "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
            int rc = pattern_parse(c, re, &p->pattern, "pre_tokenizer ByteLevel");
            json_decref(re);
            if (rc) return -1;
        }
    } else if (!strcmp(type, "Metaspace")) {
        p->kind = TOK_PRE_METASPACE;
        if (one_char(c, j, "replacement", "\xE2\x96\x81", p->replacement, &p->replacement_len,
                     "pre_tokenizer Metaspace"))
            return -1;
        p->prepend = prepend_scheme(j);
        p->split = (uint8_t)tok_json_bool(j, "split", 1);
    } else if (!strcmp(type, "Digits")) {
        p->kind = TOK_PRE_DIGITS;
        p->individual_digits = (uint8_t)tok_json_bool(j, "individual_digits", 0);
    } else if (!strcmp(type, "Punctuation")) {
        p->kind = TOK_PRE_PUNCTUATION;
        if (split_behavior(c, j, TOK_SPLIT_ISOLATED, &p->behavior)) return -1;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->kind = TOK_PRE_WHITESPACE_SPLIT;
    } else if (!strcmp(type, "Whitespace")) {
        p->kind = TOK_PRE_WHITESPACE;
        json_t *re = json_pack("{s:s}", "Regex", "\\w+|[^\\w\\s]+");
        int rc = pattern_parse(c, re, &p->pattern, "pre_tokenizer Whitespace");
        json_decref(re);
        if (rc) return -1;
    } else {
        tok_load_fail(c, "pre_tokenizer type \"%s\" is not supported", type);
        return -1;
    }
    return 0;
}

int tok_parse_decoder(tokenizer *t, tok_load_ctx *c, json_t *j, int depth) {
    if (json_is_null(j) || !j) return 0;
    const char *type = tok_json_type(j);
    if (!json_is_object(j) || !type) {
        tok_load_fail(c, "decoder: expected an object with a \"type\"");
        return -1;
    }
    if (depth > 8) {
        tok_load_fail(c, "decoder: nested too deeply");
        return -1;
    }
    t->has_decoder = 1;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr)) {
            tok_load_fail(c, "decoder Sequence: \"decoders\" must be an array");
            return -1;
        }
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) if (tok_parse_decoder(t, c, v, depth + 1)) return -1;
        return 0;
    }
    if (grow((void **)&t->decs, &t->n_decs, sizeof(tok_decoder))) return -1;
    tok_decoder *d = &t->decs[t->n_decs - 1];
    if (!strcmp(type, "ByteLevel"))
        d->kind = TOK_DEC_BYTE_LEVEL;
    else if (!strcmp(type, "ByteFallback"))
        d->kind = TOK_DEC_BYTE_FALLBACK;
    else if (!strcmp(type, "Fuse"))
        d->kind = TOK_DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->kind = TOK_DEC_METASPACE;
        if (one_char(c, j, "replacement", "\xE2\x96\x81", d->replacement, &d->replacement_len,
                     "decoder Metaspace"))
            return -1;
        d->prepend = prepend_scheme(j);
    } else if (!strcmp(type, "Replace")) {
        d->kind = TOK_DEC_REPLACE;
        json_t *content = json_object_get(j, "content");
        if (!json_is_string(content)) {
            tok_load_fail(c, "decoder Replace: missing string \"content\"");
            return -1;
        }
        d->content_len = json_string_length(content);
        d->content = tok_dup_bytes(json_string_value(content), d->content_len);
        if (pattern_parse(c, json_object_get(j, "pattern"), &d->pattern, "decoder Replace"))
            return -1;
    } else if (!strcmp(type, "Strip")) {
        d->kind = TOK_DEC_STRIP;
        char ch[8];
        uint8_t n;
        if (one_char(c, j, "content", " ", ch, &n, "decoder Strip")) return -1;
        d->content = tok_dup_bytes(ch, n);
        d->content_len = n;
        json_t *st = json_object_get(j, "start"), *sp = json_object_get(j, "stop");
        d->start = json_is_integer(st)
                       ? (int)(json_integer_value(st) < 0      ? 0
                               : json_integer_value(st) > 1000 ? 1000
                                                               : json_integer_value(st))
                       : 0;
        d->stop = json_is_integer(sp)
                      ? (int)(json_integer_value(sp) < 0      ? 0
                              : json_integer_value(sp) > 1000 ? 1000
                                                              : json_integer_value(sp))
                      : 0;
    } else {
        tok_load_fail(c, "decoder type \"%s\" is not supported", type);
        return -1;
    }
    return 0;
}

static int32_t special_token_id(tokenizer *t, json_t *specials, const char *name, tok_load_ctx *c,
                                int32_t **ids, int *n) {
    json_t *st = json_object_get(specials, name);
    json_t *arr = json_object_get(st, "ids");
    if (!json_is_array(arr)) {
        tok_load_fail(c, "post_processor: special token \"%.60s\" has no \"ids\"", name);
        return -1;
    }
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= TOK_MAX_ID) {
            tok_load_fail(c, "post_processor: bad id for \"%.60s\"", name);
            return -1;
        }
        if (grow((void **)ids, n, sizeof(int32_t))) return -1;
        (*ids)[*n - 1] = (int32_t)json_integer_value(v);
    }
    (void)t;
    return 0;
}

/* Reads a post-processor; wraps the current prefix/suffix (Sequence applies in order). */
int tok_parse_post(tokenizer *t, tok_load_ctx *c, json_t *j, int depth) {
    if (json_is_null(j) || !j) return 0;
    const char *type = tok_json_type(j);
    if (!json_is_object(j) || !type || depth > 8) {
        tok_load_fail(c, "post_processor: expected an object with a \"type\"");
        return -1;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "processors");
        if (!json_is_array(arr)) {
            tok_load_fail(c, "post_processor Sequence: \"processors\" must be an array");
            return -1;
        }
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) if (tok_parse_post(t, c, v, depth + 1)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    int32_t *pre = NULL, *suf = NULL;
    int npre = 0, nsuf = 0;
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(j, "single"),
               *specials = json_object_get(j, "special_tokens");
        if (!json_is_array(single)) {
            tok_load_fail(c, "post_processor TemplateProcessing: \"single\" must be an array");
            return -1;
        }
        int seen_seq = 0;
        size_t i;
        json_t *v;
        json_array_foreach(single, i, v) {
            json_t *sp = json_object_get(v, "SpecialToken"), *sq = json_object_get(v, "Sequence");
            if (json_is_object(sq)) {
                seen_seq = 1;
                continue;
            }
            json_t *id = json_object_get(sp, "id");
            if (!json_is_string(id)) {
                tok_load_fail(c,
                              "post_processor TemplateProcessing: piece %zu is neither "
                              "SpecialToken nor Sequence",
                              i);
                free(pre), free(suf);
                return -1;
            }
            if (special_token_id(t, specials, json_string_value(id), c, seen_seq ? &suf : &pre,
                                 seen_seq ? &nsuf : &npre)) {
                free(pre), free(suf);
                return -1;
            }
        }
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_array_get(json_object_get(j, "cls"), 1),
               *sep = json_array_get(json_object_get(j, "sep"), 1);
        if (!json_is_integer(cls) || !json_is_integer(sep) || json_integer_value(cls) < 0 ||
            json_integer_value(sep) < 0 || json_integer_value(cls) >= TOK_MAX_ID ||
            json_integer_value(sep) >= TOK_MAX_ID) {
            tok_load_fail(c, "post_processor %s: \"cls\" and \"sep\" must be [token, id]", type);
            return -1;
        }
        pre = malloc(sizeof(int32_t));
        suf = malloc(sizeof(int32_t));
        pre[0] = (int32_t)json_integer_value(cls);
        suf[0] = (int32_t)json_integer_value(sep);
        npre = nsuf = 1;
    } else {
        tok_load_fail(c, "post_processor type \"%s\" is not supported", type);
        return -1;
    }
    /* new prefix = pre + old prefix; new suffix = old suffix + suf */
    int32_t *np = malloc(sizeof(int32_t) * (size_t)(npre + t->n_post_prefix + 1));
    int32_t *ns = malloc(sizeof(int32_t) * (size_t)(nsuf + t->n_post_suffix + 1));
    if (npre) memcpy(np, pre, sizeof(int32_t) * (size_t)npre);
    if (t->n_post_prefix)
        memcpy(np + npre, t->post_prefix, sizeof(int32_t) * (size_t)t->n_post_prefix);
    if (t->n_post_suffix) memcpy(ns, t->post_suffix, sizeof(int32_t) * (size_t)t->n_post_suffix);
    if (nsuf) memcpy(ns + t->n_post_suffix, suf, sizeof(int32_t) * (size_t)nsuf);
    free(t->post_prefix), free(t->post_suffix), free(pre), free(suf);
    t->post_prefix = np;
    t->post_suffix = ns;
    t->n_post_prefix += npre;
    t->n_post_suffix += nsuf;
    return 0;
}
