/* tokenizer_tables — the data structures every tokenizer file uses: UTF-8 decoding and
 * encoding (with the Unicode maximal-subpart rule for invalid bytes), the byte-level alphabet
 * (GPT-2's bytes_to_unicode) and the open-addressing hash maps (string -> id, added tokens,
 * BPE merges). It knows nothing of tokenizer.json. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "text/tokenizer_internal.h"

/* ------------------------------------------------------------------------------------------ */
/* UTF-8                                                                                       */

int32_t tok_utf8_decode(const uint8_t *s, size_t n, size_t *adv) {
    *adv = 1;
    if (n == 0) return -1;
    uint8_t c = s[0];
    if (c < 0x80) return c;
    int len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return -1;
    if ((size_t)len > n) return -1;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *adv = (size_t)len;
    return (int32_t)cp;
}

int tok_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The Unicode "maximal subpart of an ill-formed subsequence": the bytes a decoder consumes
 * before it knows the sequence is invalid (what Rust's from_utf8_lossy and WHATWG use). */
size_t tok_utf8_invalid_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    int len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 1;
    size_t i = 1;
    if (i < n && s[i] >= lo && s[i] <= hi) {
        i++;
        while ((int)i < len && i < n && (s[i] & 0xC0) == 0x80)
            i++;
    }
    return i;
}

void tok_utf8_lossy_append(strbuf *out, const uint8_t *s, size_t n) {
    size_t i = 0, run = 0;
    while (i < n) {
        size_t adv;
        if (s[i] < 0x80 || tok_utf8_decode(s + i, n - i, &adv) >= 0) {
            i += (s[i] < 0x80) ? 1 : adv;
            continue;
        }
        strbuf_append(out, (const char *)s + run, i - run);
        strbuf_append(out, "\xEF\xBF\xBD", 3);
        i += tok_utf8_invalid_len(s + i, n - i);
        run = i;
    }
    strbuf_append(out, (const char *)s + run, n - run);
}

/* Rust's char::is_whitespace (the Unicode White_Space property). */
int tok_is_whitespace(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* ------------------------------------------------------------------------------------------ */
/* Byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes are
 * shifted to U+0100.. in byte order (GPT-2's bytes_to_unicode). */

char tok_byte_char[256][3];
uint8_t tok_byte_char_len[256];
int16_t tok_char_byte[512];
static pthread_once_t byte_level_once = PTHREAD_ONCE_INIT;

static void byte_level_build(void) {
    for (int i = 0; i < 512; i++)
        tok_char_byte[i] = -1;
    int shifted = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + shifted++);
        tok_byte_char_len[b] = (uint8_t)tok_utf8_encode(cp, tok_byte_char[b]);
        tok_char_byte[cp] = (int16_t)b;
    }
}

void tok_byte_level_init(void) {
    pthread_once(&byte_level_once, byte_level_build);
}

/* ------------------------------------------------------------------------------------------ */
/* Hash maps                                                                                    */

uint64_t tok_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

int tok_strmap_init(tok_strmap *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2 + 2)
        cap <<= 1;
    m->slots = malloc(cap * sizeof(tok_strmap_slot));
    if (!m->slots) return -1;
    for (size_t i = 0; i < cap; i++)
        m->slots[i] = (tok_strmap_slot){-1, 0};
    m->mask = (uint32_t)(cap - 1);
    m->count = 0;
    return 0;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

/* Finds the slot of key s (or the empty slot where it would go). eq(i) compares entry i. */
#define STRMAP_FIND(m, s, n, KEY_LEN, KEY_STR)                                                     \
    uint64_t h_ = tok_hash(s, n);                                                                  \
    uint32_t tag_ = (uint32_t)(h_ >> 32), i_ = (uint32_t)h_ & (m)->mask;                           \
    for (;; i_ = (i_ + 1) & (m)->mask) {                                                           \
        int32_t v_ = (m)->slots[i_].id;                                                            \
        if (v_ < 0) break;                                                                         \
        if ((m)->slots[i_].hash == tag_ && KEY_LEN(v_) == (n) && memcmp(KEY_STR(v_), s, n) == 0)   \
            break;                                                                                 \
    }

int32_t tok_strmap_get(const tok_strmap *m, const tok_strtab *tab, const char *s, size_t n) {
    if (!m->slots) return -1;
#define TAB_LEN(v) tab->len[v]
#define TAB_STR(v) tab->str[v]
    STRMAP_FIND(m, s, n, TAB_LEN, TAB_STR)
    return m->slots[i_].id;
}

/* Inserts id (whose string is tab->str[id]); a second id with the same string replaces the
 * first, as a JSON object with duplicate keys keeps the last. */
void tok_strmap_put(tok_strmap *m, const tok_strtab *tab, int32_t id) {
    const char *s = tab->str[id];
    size_t n = tab->len[id];
    STRMAP_FIND(m, s, n, TAB_LEN, TAB_STR)
    if (m->slots[i_].id < 0) m->count++;
    m->slots[i_] = (tok_strmap_slot){id, tag_};
#undef TAB_LEN
#undef TAB_STR
}

int32_t tok_addedmap_get(const tokenizer *t, const char *s, size_t n) {
    const tok_strmap *m = &t->added_map;
    if (!m->slots) return -1;
#define ADDED_LEN(v) t->added[v].len
#define ADDED_STR(v) t->added[v].content
    STRMAP_FIND(m, s, n, ADDED_LEN, ADDED_STR)
    return m->slots[i_].id;
}

void tok_addedmap_put(tokenizer *t, int32_t idx) {
    tok_strmap *m = &t->added_map;
    const char *s = t->added[idx].content;
    size_t n = t->added[idx].len;
    STRMAP_FIND(m, s, n, ADDED_LEN, ADDED_STR)
    m->slots[i_] = (tok_strmap_slot){idx, tag_};
#undef ADDED_LEN
#undef ADDED_STR
}

static inline uint64_t merge_key(int32_t l, int32_t r) {
    return ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
}
static inline uint64_t merge_slot(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return key;
}

const tok_merge_entry *tok_merges_get(const tok_mergemap *m, int32_t left, int32_t right) {
    if (!m->slots) return NULL;
    uint64_t key = merge_key(left, right);
    uint64_t i = merge_slot(key) & m->mask;
    for (;;) {
        const tok_merge_entry *e = &m->slots[i];
        if (e->key == UINT64_MAX) return NULL;
        if (e->key == key) return e;
        i = (i + 1) & m->mask;
    }
}

void tok_merges_put(tok_mergemap *m, int32_t l, int32_t r, int32_t rank, int32_t result) {
    uint64_t key = merge_key(l, r);
    uint64_t i = merge_slot(key) & m->mask;
    for (;;) {
        tok_merge_entry *e = &m->slots[i];
        if (e->key == UINT64_MAX || e->key == key) {
            if (e->key == UINT64_MAX) m->count++;
            e->key = key; /* a repeated pair keeps the later rank, as HF's HashMap collect does */
            e->rank = rank;
            e->result = result;
            return;
        }
        i = (i + 1) & m->mask;
    }
}
