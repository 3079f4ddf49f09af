/* tokenizer_decode — token ids back to text through the tokenizer.json decoder chain
 * (ByteLevel, ByteFallback, Metaspace, Replace, Strip, Fuse), and the streaming detokenizer
 * built on it. The chain runs on raw bytes; invalid UTF-8 becomes U+FFFD only at the very
 * end (as Hugging Face's from_utf8_lossy does), which lets the streaming detokenizer hold an
 * incomplete character until its last byte arrives and still match the one-shot decode.
 * It does not apply transformers' clean_up_tokenization_spaces (text is returned as the
 * `tokenizers` library decodes it). */
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "text/tokenizer_internal.h"

/* A list of token strings stored back to back: token i is data[ends[i-1]..ends[i]). */
typedef struct tok_list {
    strbuf data;
    size_t *ends;
    size_t n, cap;
} tok_list;

static void list_end_token(tok_list *l) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        size_t *p = realloc(l->ends, cap * sizeof(size_t));
        if (!p) abort(); /* as strbuf: no progress is possible without memory */
        l->ends = p;
        l->cap = cap;
    }
    l->ends[l->n++] = l->data.len;
}

static void list_push(tok_list *l, const char *s, size_t n) {
    strbuf_append(&l->data, s, n);
    list_end_token(l);
}

static inline const char *list_tok(const tok_list *l, size_t i, size_t *len) {
    size_t start = i ? l->ends[i - 1] : 0;
    *len = l->ends[i] - start;
    return (l->data.data ? l->data.data : "") + start;
}

static void list_free(tok_list *l) {
    strbuf_free(&l->data);
    free(l->ends);
    memset(l, 0, sizeof *l);
}

static int hex_val(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "<0xXX>" -> byte, else -1. */
static int byte_token_value(const char *s, size_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int hi = hex_val(s[3]), lo = hex_val(s[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

static int valid_utf8(const uint8_t *s, size_t n) {
    size_t i = 0, adv;
    while (i < n) {
        if (tok_utf8_decode(s + i, n - i, &adv) < 0) return 0;
        i += adv;
    }
    return 1;
}

/* Runs one decoder over in, producing out. raw: byte-fallback bytes are passed through
 * unchecked (for tokenizer_token_bytes). */
static void run_decoder(const tok_decoder *d, const tok_list *in, tok_list *out, int at_start, int fused, int raw,
                        pcre2_match_data *md) {
    size_t len = 0;
    switch (d->kind) {
    case TOK_DEC_BYTE_LEVEL:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = list_tok(in, i, &len);
            size_t mark = out->data.len, j = 0, adv;
            int ok = 1;
            while (j < len) {
                int32_t cp = tok_utf8_decode((const uint8_t *)s + j, len - j, &adv);
                if (cp < 0 || cp >= 512 || tok_char_byte[cp] < 0) {
                    ok = 0;
                    break;
                }
                strbuf_append_char(&out->data, (char)tok_char_byte[cp]);
                j += adv;
            }
            if (!ok) { /* not in the byte alphabet (e.g. an added token): its own bytes */
                out->data.len = mark;
                strbuf_append(&out->data, s, len);
            }
        }
        list_end_token(out);
        break;
    case TOK_DEC_FUSE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = list_tok(in, i, &len);
            strbuf_append(&out->data, s, len);
        }
        list_end_token(out);
        break;
    case TOK_DEC_BYTE_FALLBACK: {
        strbuf bytes = {0};
        for (size_t i = 0; i <= in->n; i++) {
            int b = -1;
            const char *s = NULL;
            if (i < in->n) {
                s = list_tok(in, i, &len);
                b = byte_token_value(s, len);
            }
            if (b >= 0) {
                strbuf_append_char(&bytes, (char)b);
                continue;
            }
            if (bytes.len) {
                if (raw || valid_utf8((const uint8_t *)bytes.data, bytes.len)) list_push(out, bytes.data, bytes.len);
                else
                    for (size_t k = 0; k < bytes.len; k++) list_push(out, "\xEF\xBF\xBD", 3);
                strbuf_clear(&bytes);
            }
            if (i < in->n) list_push(out, s, len);
        }
        strbuf_free(&bytes);
        break;
    }
    case TOK_DEC_METASPACE:
        /* HF drops every replacement char of the text's first token (not only a leading one) */
        for (size_t i = 0; i < in->n; i++) {
            const char *s = list_tok(in, i, &len);
            int drop = i == 0 && at_start && d->prepend != TOK_PREPEND_NEVER;
            for (size_t j = 0; j < len;) {
                if (j + d->replacement_len <= len && !memcmp(s + j, d->replacement, d->replacement_len)) {
                    if (!drop) strbuf_append_char(&out->data, ' ');
                    j += d->replacement_len;
                } else {
                    strbuf_append_char(&out->data, s[j++]);
                }
            }
            list_end_token(out);
        }
        break;
    case TOK_DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = list_tok(in, i, &len);
            size_t last = 0;
            if (d->pattern.kind == TOK_PATTERN_STRING) {
                const char *hit;
                while (last + d->pattern.len <= len && (hit = memmem(s + last, len - last, d->pattern.str, d->pattern.len))) {
                    size_t at = (size_t)(hit - s);
                    strbuf_append(&out->data, s + last, at - last);
                    strbuf_append(&out->data, d->content, d->content_len);
                    last = at + d->pattern.len;
                }
            } else if (valid_utf8((const uint8_t *)s, len)) {
                size_t start = 0;
                while (start <= len) {
                    int rc = pcre2_match(d->pattern.re, (PCRE2_SPTR)s, len, start, PCRE2_NO_UTF_CHECK, md, NULL);
                    if (rc < 0) break;
                    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                    if (ov[1] == ov[0]) {
                        if (ov[0] >= len) break;
                        start = ov[0] + 1;
                        while (start < len && ((uint8_t)s[start] & 0xC0) == 0x80) start++;
                        continue;
                    }
                    strbuf_append(&out->data, s + last, ov[0] - last);
                    strbuf_append(&out->data, d->content, d->content_len);
                    last = start = ov[1];
                }
            }
            strbuf_append(&out->data, s + last, len - last);
            list_end_token(out);
        }
        break;
    case TOK_DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = list_tok(in, i, &len);
            size_t a = 0, b = len, cl = d->content_len;
            /* after a Fuse the single token is the whole text: its start is only the text's
             * start when this window begins the text */
            int strip_start = !(fused && !at_start);
            for (int k = 0; strip_start && k < d->start && a + cl <= b && !memcmp(s + a, d->content, cl); k++) a += cl;
            for (int k = 0; k < d->stop && b >= a + cl && !memcmp(s + b - cl, d->content, cl); k++) b -= cl;
            list_push(out, s + a, b - a);
        }
        break;
    }
}

static void decode_chain(const tokenizer *t, tok_list *l, int at_start, int raw) {
    pcre2_match_data *md = NULL;
    int fused = 0;
    for (int k = 0; k < t->n_decs; k++) {
        const tok_decoder *d = &t->decs[k];
        if (d->kind == TOK_DEC_REPLACE && d->pattern.kind == TOK_PATTERN_REGEX && !md)
            md = pcre2_match_data_create(4, NULL);
        if (d->kind == TOK_DEC_REPLACE && d->pattern.kind == TOK_PATTERN_REGEX && !md) continue;
        tok_list out = {0};
        run_decoder(d, l, &out, at_start, fused, raw, md);
        list_free(l);
        *l = out;
        if (d->kind == TOK_DEC_FUSE || d->kind == TOK_DEC_BYTE_LEVEL) fused = 1;
    }
    if (md) pcre2_match_data_free(md);
}

static void decode_ids_raw(const tokenizer *t, const int32_t *ids, size_t n, int skip_special, int at_start,
                           int raw, strbuf *out) {
    tok_list l = {0};
    for (size_t i = 0; i < n; i++) {
        uint32_t len;
        const char *s = tok_id_to_string(t, ids[i], &len);
        if (!s) continue;
        if (skip_special && tokenizer_is_special(t, ids[i])) continue;
        if (!t->has_decoder && l.n > 0) strbuf_append_char(&l.data, ' '); /* HF joins with spaces */
        list_push(&l, s, len);
    }
    if (t->has_decoder) decode_chain(t, &l, at_start, raw);
    strbuf_append(out, l.data.data ? l.data.data : "", l.data.len);
    list_free(&l);
}

void tok_decode_raw(const tokenizer *t, const int32_t *ids, size_t n, int skip_special, int at_start, strbuf *out) {
    decode_ids_raw(t, ids, n, skip_special, at_start, 0, out);
}

char *tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, int skip_special_tokens, size_t *len_out) {
    strbuf raw = {0}, text = {0};
    tok_decode_raw(t, ids, n, skip_special_tokens, 1, &raw);
    tok_utf8_lossy_append(&text, (const uint8_t *)(raw.data ? raw.data : ""), raw.len);
    strbuf_free(&raw);
    if (len_out) *len_out = text.len;
    return strbuf_detach(&text);
}

size_t tokenizer_token_bytes(const tokenizer *t, int32_t id, uint8_t *buf, size_t cap) {
    strbuf raw = {0};
    decode_ids_raw(t, &id, 1, 0, 0, 1, &raw);
    size_t n = raw.len;
    if (buf && cap) memcpy(buf, raw.data ? raw.data : "", n < cap ? n : cap);
    strbuf_free(&raw);
    return n;
}

char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len_out) {
    strbuf raw = {0}, text = {0};
    decode_ids_raw(t, &id, 1, 0, 0, 1, &raw);
    tok_utf8_lossy_append(&text, (const uint8_t *)(raw.data ? raw.data : ""), raw.len);
    strbuf_free(&raw);
    if (len_out) *len_out = text.len;
    return text.data ? text.data : strdup("");
}

/* ------------------------------------------------------------------------------------------ */
/* Streaming detokenizer.
 *
 * It keeps a window of ids that starts at a point where everything before has been emitted
 * exactly (no held bytes). Each push decodes the window (raw bytes), emits the bytes past what
 * was already emitted up to the last safe point, and restarts the window when nothing is held.
 * Held back: a trailing incomplete UTF-8 sequence (byte-level tokens), and a run of byte-fallback
 * tokens still open (HF decodes an invalid run as one U+FFFD per byte, so the run must end
 * before its text is known). */

struct detokenizer {
    const tokenizer *t;
    int skip_special;
    int32_t *ids;
    size_t n, cap;
    int at_start;     /* the window begins the text */
    size_t emitted;   /* raw bytes of the window's decode already turned into output */
    strbuf ready;     /* final text not yet handed to the caller (output buffer was full) */
    size_t ready_off; /* how much of ready has been handed out */
};

detokenizer *detokenizer_new(const tokenizer *t, int skip_special_tokens) {
    detokenizer *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->t = t;
    d->skip_special = skip_special_tokens;
    d->at_start = 1;
    return d;
}

void detokenizer_free(detokenizer *d) {
    if (!d) return;
    free(d->ids);
    strbuf_free(&d->ready);
    free(d);
}

/* Start of a trailing incomplete (but so far valid) UTF-8 sequence in s[from..n), or n. */
static size_t incomplete_tail(const uint8_t *s, size_t from, size_t n) {
    size_t i = from;
    while (i < n) {
        size_t adv;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        if (tok_utf8_decode(s + i, n - i, &adv) >= 0) {
            i += adv;
            continue;
        }
        size_t bad = tok_utf8_invalid_len(s + i, n - i);
        if (i + bad == n) return i; /* ran out of bytes: might still complete */
        i += bad;
    }
    return n;
}

/* Moves up to cap-1 bytes of ready text (whole characters) into out. */
static size_t deliver(detokenizer *d, char *out, size_t out_cap) {
    if (!out || out_cap == 0) return 0;
    size_t avail = d->ready.len - d->ready_off, n = avail < out_cap - 1 ? avail : out_cap - 1;
    const char *s = d->ready.data ? d->ready.data + d->ready_off : "";
    if (n < avail)
        while (n > 0 && ((uint8_t)s[n] & 0xC0) == 0x80) n--; /* never split a character */
    memcpy(out, s, n);
    out[n] = 0;
    d->ready_off += n;
    if (d->ready_off == d->ready.len) {
        strbuf_clear(&d->ready);
        d->ready_off = 0;
    }
    return n;
}

/* A "<0xXX>" vocabulary token, when the decoder has ByteFallback. */
static int is_fallback_byte(const tokenizer *t, int32_t id) {
    uint32_t len;
    const char *str = id >= 0 ? tok_id_to_string(t, id, &len) : NULL;
    if (!str || byte_token_value(str, len) < 0 || t->added_by_id[id] >= 0) return 0;
    for (int k = 0; k < t->n_decs; k++)
        if (t->decs[k].kind == TOK_DEC_BYTE_FALLBACK) return 1;
    return 0;
}

static void advance(detokenizer *d, int final) {
    strbuf raw = {0};
    tok_decode_raw(d->t, d->ids, d->n, d->skip_special, d->at_start, &raw);
    const uint8_t *s = (const uint8_t *)(raw.data ? raw.data : "");
    size_t safe = raw.len;
    int held_group = 0;
    if (!final) {
        held_group = d->n && is_fallback_byte(d->t, d->ids[d->n - 1]);
        if (held_group) goto hold;
        safe = incomplete_tail(s, d->emitted < raw.len ? d->emitted : raw.len, raw.len);
    }
    if (safe > d->emitted) {
        tok_utf8_lossy_append(&d->ready, s + d->emitted, safe - d->emitted);
        d->emitted = safe;
    }
    if (!held_group && safe == raw.len && raw.len > 0) { /* nothing held: restart the window */
        d->n = 0;
        d->emitted = 0;
        d->at_start = 0;
    }
hold:
    strbuf_free(&raw);
}

size_t detokenizer_push(detokenizer *d, int32_t id, char *out, size_t out_cap) {
    if (!d) return 0;
    if (tok_id_to_string(d->t, id, NULL) && !(d->skip_special && tokenizer_is_special(d->t, id))) {
        if (d->n == d->cap) {
            size_t cap = d->cap ? d->cap * 2 : 16;
            int32_t *p = realloc(d->ids, cap * sizeof(int32_t));
            if (!p) return deliver(d, out, out_cap);
            d->ids = p;
            d->cap = cap;
        }
        d->ids[d->n++] = id;
        /* inside a run of byte-fallback tokens nothing can be emitted until the run ends, and
         * re-decoding the growing window each time would make a long run quadratic */
        if (!(d->n >= 2 && is_fallback_byte(d->t, id) && is_fallback_byte(d->t, d->ids[d->n - 2]))) advance(d, 0);
    }
    return deliver(d, out, out_cap);
}

size_t detokenizer_flush(detokenizer *d, char *out, size_t out_cap) {
    if (!d) return 0;
    if (d->n) {
        advance(d, 1);
        d->n = 0;
        d->emitted = 0;
        d->at_start = 0;
    }
    return deliver(d, out, out_cap);
}

size_t detokenizer_pending(const detokenizer *d) { return d ? d->ready.len - d->ready_off : 0; }
