/* stop_strings — see stop_strings.h. Quadratic in the stop length per push, which is tiny. */
#include "runner/stop_strings.h"

#include <stdlib.h>
#include <string.h>

void stop_strings_init(stop_strings *s, char *const *stops, int n) {
    memset(s, 0, sizeof *s);
    s->matched = -1;
    s->stops = calloc((size_t)(n > 0 ? n : 1), sizeof *s->stops);
    for (int i = 0; i < n; i++)
        if (stops[i] && stops[i][0]) s->stops[s->n++] = strdup(stops[i]);
}

void stop_strings_free(stop_strings *s) {
    for (int i = 0; i < s->n; i++) free(s->stops[i]);
    free(s->stops);
    strbuf_free(&s->held);
    memset(s, 0, sizeof *s);
    s->matched = -1;
}

/* Length of the longest suffix of text that is a proper prefix of some stop string. */
static size_t held_suffix(const stop_strings *s, const char *text, size_t len) {
    size_t best = 0;
    for (int i = 0; i < s->n; i++) {
        size_t sl = strlen(s->stops[i]);
        size_t maxk = sl - 1 < len ? sl - 1 : len;
        for (size_t k = maxk; k > best; k--)
            if (!memcmp(text + len - k, s->stops[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

int stop_strings_push(stop_strings *s, const char *text, size_t len, strbuf *out) {
    if (s->matched >= 0) return 1;
    if (s->n == 0) {
        strbuf_append(out, text, len);
        return 0;
    }
    strbuf_append(&s->held, text, len);
    const char *h = s->held.data;
    size_t hl = s->held.len;
    /* earliest match of any stop string */
    size_t first = hl + 1;
    int which = -1;
    for (int i = 0; i < s->n; i++) {
        const char *p = memmem(h, hl, s->stops[i], strlen(s->stops[i]));
        if (p && (size_t)(p - h) < first) {
            first = (size_t)(p - h);
            which = i;
        }
    }
    if (which >= 0) {
        strbuf_append(out, h, first);
        strbuf_clear(&s->held);
        s->matched = which;
        return 1;
    }
    size_t keep = held_suffix(s, h, hl);
    strbuf_append(out, h, hl - keep);
    memmove(s->held.data, h + hl - keep, keep);
    s->held.len = keep;
    s->held.data[keep] = 0;
    return 0;
}

void stop_strings_flush(stop_strings *s, strbuf *out) {
    if (s->matched < 0 && s->held.len) strbuf_append(out, s->held.data, s->held.len);
    strbuf_clear(&s->held);
}
