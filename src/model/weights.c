/* Weight views from safetensors by name, shape-checked against the config. See weights.h. */
#include "model/weights.h"

#include "base/clock.h"
#include "base/log.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int dense_format(safetensors_dtype t, weight_format *f) {
    switch (t) {
    case ST_F32: *f = WEIGHT_F32; return 0;
    case ST_F16: *f = WEIGHT_F16; return 0;
    case ST_BF16: *f = WEIGHT_BF16; return 0;
    default: return -1;
    }
}

static int scale_dtype(safetensors_dtype t, dtype *d) {
    switch (t) {
    case ST_F32: *d = DTYPE_F32; return 0;
    case ST_F16: *d = DTYPE_F16; return 0;
    case ST_BF16: *d = DTYPE_BF16; return 0;
    default: return -1;
    }
}

static void shape_str(const safetensors_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < t->n_dims && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Checks t has n_stack (0 = none) leading dim then [rows][cols_stored]. vector: 1-D [cols]. */
static int check_shape(const safetensors_tensor *t, int n_stack, int64_t rows, int64_t cols,
                       int vector, char *err, size_t errlen) {
    int64_t want[3];
    int nd = 0;
    if (n_stack) want[nd++] = n_stack;
    if (!vector) want[nd++] = rows;
    want[nd++] = cols;
    int ok = t->n_dims == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == want[i];
    if (ok) return 0;
    char got[128];
    shape_str(t, got, sizeof got);
    set_err(err, errlen, "%s: tensor '%s' has shape %s, expected [%s%lld, %lld]", t->file, t->name,
            got, n_stack ? "experts, " : "", (long long)(vector ? 1 : rows), (long long)cols);
    if (vector)
        set_err(err, errlen, "%s: tensor '%s' has shape %s, expected [%lld]", t->file, t->name, got,
                (long long)cols);
    return -1;
}

/* Resolves `prefix`.weight (+ .scales/.biases) into n (n_stack, or 1) matrices [rows][cols]. */
static int load_matrices(const safetensors_set *st, const char *prefix, int n_stack, int64_t rows,
                         int64_t cols, int vector, weight_matrix *out, char *err, size_t errlen) {
    char name[512];
    snprintf(name, sizeof name, "%.400s.weight", prefix);
    const safetensors_tensor *w = safetensors_set_find(st, name);
    if (!w) {
        set_err(err, errlen, "model is missing tensor '%s'", name);
        return -1;
    }
    int count = n_stack ? n_stack : 1;
    weight_format fmt;
    if (dense_format(w->dtype, &fmt) == 0) {
        if (check_shape(w, n_stack, rows, cols, vector, err, errlen)) return -1;
        size_t stride = (size_t)rows * (size_t)cols * safetensors_dtype_size(w->dtype);
        for (int e = 0; e < count; e++)
            out[e] = (weight_matrix){.format = fmt, .rows = vector ? 1 : rows, .cols = cols,
                                     .data = (const char *)w->data + (size_t)e * stride};
        return 0;
    }
    if (w->dtype != ST_U32) {
        set_err(err, errlen, "%s: tensor '%s' has dtype %s (want F32, F16, BF16 or MLX U32)",
                w->file, name, safetensors_dtype_name(w->dtype));
        return -1;
    }
    snprintf(name, sizeof name, "%.400s.scales", prefix);
    const safetensors_tensor *s = safetensors_set_find(st, name);
    snprintf(name, sizeof name, "%.400s.biases", prefix);
    const safetensors_tensor *b = safetensors_set_find(st, name);
    if (!s || !b) {
        set_err(err, errlen, "%s: tensor '%s' is U32 but '%s.scales'/'%s.biases' are missing",
                w->file, w->name, prefix, prefix);
        return -1;
    }
    int nd = w->n_dims;
    if (nd != (n_stack ? 3 : 2) || s->n_dims != nd || b->n_dims != nd || w->shape[nd - 1] == 0 ||
        s->shape[nd - 1] == 0) {
        set_err(err, errlen, "%s: quantized tensor '%s' has the wrong number of dims", w->file,
                w->name);
        return -1;
    }
    int64_t wcols = w->shape[nd - 1], groups = s->shape[nd - 1];
    int64_t gs = cols / groups, bits = wcols * 32 / cols;
    if (cols % groups || (gs != 32 && gs != 64 && gs != 128) || wcols * 32 % cols ||
        bits < 2 || bits > 8 || bits == 7) {
        set_err(err, errlen, "%s: quantized tensor '%s' has %lld packed words and %lld groups "
                "per row, which is no supported bits/group size for %lld columns", w->file,
                w->name, (long long)wcols, (long long)groups, (long long)cols);
        return -1;
    }
    dtype sd;
    if (check_shape(w, n_stack, rows, wcols, 0, err, errlen) ||
        check_shape(s, n_stack, rows, groups, 0, err, errlen) ||
        check_shape(b, n_stack, rows, groups, 0, err, errlen))
        return -1;
    if (scale_dtype(s->dtype, &sd) || s->dtype != b->dtype) {
        set_err(err, errlen, "%s: '%s.scales'/'%s.biases' must both be F32, F16 or BF16", s->file,
                prefix, prefix);
        return -1;
    }
    size_t wstride = (size_t)rows * (size_t)wcols * 4;
    size_t sstride = (size_t)rows * (size_t)groups * dtype_size(sd);
    for (int e = 0; e < count; e++)
        out[e] = (weight_matrix){.format = WEIGHT_MLX_AFFINE, .rows = vector ? 1 : rows,
                                 .cols = cols,
                                 .data = (const char *)w->data + (size_t)e * wstride,
                                 .scales = (const char *)s->data + (size_t)e * sstride,
                                 .biases = (const char *)b->data + (size_t)e * sstride,
                                 .scale_dtype = sd, .bits = (int)bits, .group_size = (int)gs};
    return 0;
}

static int load_matrix(const safetensors_set *st, const char *prefix, int64_t rows, int64_t cols,
                       weight_matrix *out, char *err, size_t errlen) {
    return load_matrices(st, prefix, 0, rows, cols, 0, out, err, errlen);
}

static int load_vector(const safetensors_set *st, const char *prefix, int64_t n,
                       weight_matrix *out, char *err, size_t errlen) {
    return load_matrices(st, prefix, 0, 1, n, 1, out, err, errlen);
}

static int load_bias(const safetensors_set *st, const char *prefix, int64_t n, weight_matrix *out,
                     char *err, size_t errlen) {
    char name[512];
    snprintf(name, sizeof name, "%.400s.bias", prefix);
    const safetensors_tensor *t = safetensors_set_find(st, name);
    if (!t) {
        set_err(err, errlen, "model is missing tensor '%s'", name);
        return -1;
    }
    weight_format fmt;
    if (dense_format(t->dtype, &fmt)) {
        set_err(err, errlen, "%s: tensor '%s' must be F32, F16 or BF16", t->file, name);
        return -1;
    }
    if (check_shape(t, 0, 1, n, 1, err, errlen)) return -1;
    *out = (weight_matrix){.format = fmt, .rows = 1, .cols = n, .data = t->data};
    return 0;
}

static int load_experts(const safetensors_set *st, const model_config *c, const char *p,
                        layer_weights *l, char *err, size_t errlen) {
    int ne = c->n_experts;
    int64_t dim = c->hidden_size, inter = c->moe_intermediate_size;
    l->expert_gate = calloc((size_t)ne, sizeof(weight_matrix));
    l->expert_up = calloc((size_t)ne, sizeof(weight_matrix));
    l->expert_down = calloc((size_t)ne, sizeof(weight_matrix));
    if (!l->expert_gate || !l->expert_up || !l->expert_down) {
        set_err(err, errlen, "out of memory");
        return -1;
    }
    char name[512];
    if (load_matrix(st, (snprintf(name, sizeof name, "%s.mlp.gate", p), name), ne, dim,
                    &l->router, err, errlen))
        return -1;
    snprintf(name, sizeof name, "%s.mlp.switch_mlp.gate_proj.weight", p);
    if (safetensors_set_find(st, name)) { /* mlx stacked layout */
        const struct {
            const char *n;
            weight_matrix *m;
            int64_t r, c;
        } parts[] = {{"gate_proj", l->expert_gate, inter, dim},
                     {"up_proj", l->expert_up, inter, dim},
                     {"down_proj", l->expert_down, dim, inter}};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "%s.mlp.switch_mlp.%s", p, parts[i].n);
            if (load_matrices(st, name, ne, parts[i].r, parts[i].c, 0, parts[i].m, err, errlen))
                return -1;
        }
        return 0;
    }
    for (int e = 0; e < ne; e++) {
        snprintf(name, sizeof name, "%s.mlp.experts.%d.gate_proj", p, e);
        if (load_matrix(st, name, inter, dim, &l->expert_gate[e], err, errlen)) return -1;
        snprintf(name, sizeof name, "%s.mlp.experts.%d.up_proj", p, e);
        if (load_matrix(st, name, inter, dim, &l->expert_up[e], err, errlen)) return -1;
        snprintf(name, sizeof name, "%s.mlp.experts.%d.down_proj", p, e);
        if (load_matrix(st, name, dim, inter, &l->expert_down[e], err, errlen)) return -1;
    }
    return 0;
}

static int load_layer(const safetensors_set *st, const model_config *c, int i, layer_weights *l,
                      char *err, size_t errlen) {
    char p[128], n[256];
    snprintf(p, sizeof p, "model.layers.%d", i);
    int64_t dim = c->hidden_size, qd = (int64_t)c->n_heads * c->head_dim,
            kvd = (int64_t)c->n_kv_heads * c->head_dim;
#define NAME(suffix) (snprintf(n, sizeof n, "%s.%s", p, suffix), n)
    if (load_vector(st, NAME("input_layernorm"), dim, &l->attn_norm, err, errlen) ||
        load_vector(st, NAME("post_attention_layernorm"), dim, &l->ffn_norm, err, errlen) ||
        load_matrix(st, NAME("self_attn.q_proj"), qd, dim, &l->wq, err, errlen) ||
        load_matrix(st, NAME("self_attn.k_proj"), kvd, dim, &l->wk, err, errlen) ||
        load_matrix(st, NAME("self_attn.v_proj"), kvd, dim, &l->wv, err, errlen) ||
        load_matrix(st, NAME("self_attn.o_proj"), dim, qd, &l->wo, err, errlen))
        return -1;
    if (c->attention_bias &&
        (load_bias(st, NAME("self_attn.q_proj"), qd, &l->bq, err, errlen) ||
         load_bias(st, NAME("self_attn.k_proj"), kvd, &l->bk, err, errlen) ||
         load_bias(st, NAME("self_attn.v_proj"), kvd, &l->bv, err, errlen)))
        return -1;
    if (c->qk_norm &&
        (load_vector(st, NAME("self_attn.q_norm"), c->head_dim, &l->q_norm, err, errlen) ||
         load_vector(st, NAME("self_attn.k_norm"), c->head_dim, &l->k_norm, err, errlen)))
        return -1;
    l->is_moe = model_config_layer_is_moe(c, i);
    if (l->is_moe) return load_experts(st, c, p, l, err, errlen);
    int64_t inter = c->intermediate_size;
    if (load_matrix(st, NAME("mlp.gate_proj"), inter, dim, &l->w_gate, err, errlen) ||
        load_matrix(st, NAME("mlp.up_proj"), inter, dim, &l->w_up, err, errlen) ||
        load_matrix(st, NAME("mlp.down_proj"), dim, inter, &l->w_down, err, errlen))
        return -1;
#undef NAME
    return 0;
}

static size_t layer_bytes(const model_config *c, const layer_weights *l) {
    size_t b = weight_matrix_bytes(&l->wq) + weight_matrix_bytes(&l->wk) +
               weight_matrix_bytes(&l->wv) + weight_matrix_bytes(&l->wo);
    if (!l->is_moe)
        return b + weight_matrix_bytes(&l->w_gate) + weight_matrix_bytes(&l->w_up) +
               weight_matrix_bytes(&l->w_down);
    size_t expert = weight_matrix_bytes(&l->expert_gate[0]) +
                    weight_matrix_bytes(&l->expert_up[0]) + weight_matrix_bytes(&l->expert_down[0]);
    return b + weight_matrix_bytes(&l->router) + (size_t)c->n_experts_per_tok * expert;
}

/* ---- placement: copy the viewed bytes into a huge-page arena ---------------------------------- */

typedef void (*view_fn)(weight_matrix *m, void *ctx);

/* Calls fn on every view that holds data (the tied lm_head too: its ranges merge with the
 * embedding's). */
static void for_each_view(model_weights *w, view_fn fn, void *ctx) {
    if (w->has_embed) fn(&w->embed, ctx);
    if (w->has_head) {
        fn(&w->final_norm, ctx);
        fn(&w->lm_head, ctx);
    }
    for (int i = 0; w->layers && i < w->layer_end - w->layer_start; i++) {
        layer_weights *l = &w->layers[i];
        weight_matrix *m[] = {&l->attn_norm, &l->wq, &l->wk, &l->wv, &l->wo, &l->bq, &l->bk,
                              &l->bv, &l->q_norm, &l->k_norm, &l->ffn_norm, &l->w_gate, &l->w_up,
                              &l->w_down, &l->router};
        for (size_t j = 0; j < sizeof m / sizeof *m; j++) fn(m[j], ctx);
        for (int e = 0; l->is_moe && e < w->n_experts; e++) {
            if (l->expert_gate) fn(&l->expert_gate[e], ctx);
            if (l->expert_up) fn(&l->expert_up[e], ctx);
            if (l->expert_down) fn(&l->expert_down[e], ctx);
        }
    }
}

typedef struct byte_range {
    uintptr_t src;
    size_t len;
    size_t dst; /* offset in the arena */
} byte_range;

typedef struct range_list {
    byte_range *r;
    size_t n, cap;
    int oom;
} range_list;

static void range_add(range_list *l, const void *p, size_t len) {
    if (!p || !len || l->oom) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        byte_range *r = realloc(l->r, cap * sizeof *r);
        if (!r) {
            l->oom = 1;
            return;
        }
        l->r = r;
        l->cap = cap;
    }
    l->r[l->n++] = (byte_range){(uintptr_t)p, len, 0};
}

/* The byte ranges a view reads: data, and scales + biases for MLX. */
static void view_ranges(weight_matrix *m, void *ctx) {
    if (!m->data) return;
    size_t n = (size_t)m->rows * (size_t)m->cols;
    if (m->format != WEIGHT_MLX_AFFINE) {
        range_add(ctx, m->data, n * (m->format == WEIGHT_F32 ? 4 : 2));
        return;
    }
    size_t sb = n / (size_t)m->group_size * dtype_size(m->scale_dtype);
    range_add(ctx, m->data, n * (size_t)m->bits / 8);
    range_add(ctx, m->scales, sb);
    range_add(ctx, m->biases, sb);
}

static int range_cmp(const void *a, const void *b) {
    uintptr_t x = ((const byte_range *)a)->src, y = ((const byte_range *)b)->src;
    return x < y ? -1 : x > y;
}

typedef struct relocation {
    const range_list *l;
    char *arena;
} relocation;

static const void *relocate(const relocation *rl, const void *p) {
    if (!p) return p;
    uintptr_t a = (uintptr_t)p;
    size_t lo = 0, hi = rl->l->n; /* the last range whose src <= a */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (rl->l->r[mid].src <= a) lo = mid;
        else hi = mid;
    }
    const byte_range *r = &rl->l->r[lo];
    if (a < r->src || a >= r->src + r->len) return p; /* cannot happen: every view was added */
    return rl->arena + r->dst + (a - r->src);
}

static void view_relocate(weight_matrix *m, void *ctx) {
    m->data = relocate(ctx, m->data);
    m->scales = relocate(ctx, m->scales);
    m->biases = relocate(ctx, m->biases);
}

typedef struct rewrite_walk {
    const weight_matrix *embed; /* looked up by row, not multiplied: never offered */
    int (*rewrite)(weight_matrix *m, void *ctx);
    void *ctx;
    size_t bytes;
} rewrite_walk;

static void view_rewrite(weight_matrix *m, void *ctx) {
    rewrite_walk *rw = ctx;
    if (m != rw->embed && rw->rewrite(m, rw->ctx)) rw->bytes += weight_matrix_bytes(m);
}

/* MemAvailable from /proc/meminfo in bytes, or 0 when unknown. */
static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

static weights_memory weights_memory_from_env(weights_memory unset_default) {
    const char *v = getenv("EXO_WEIGHTS_MEM");
    if (!v || !*v) return unset_default;
    if (!strcmp(v, "auto")) return WEIGHTS_MEM_AUTO;
    if (!strcmp(v, "copy")) return WEIGHTS_MEM_COPY;
    if (!strcmp(v, "mmap")) return WEIGHTS_MEM_MMAP;
    log_warn("EXO_WEIGHTS_MEM=%s is not auto, copy or mmap; using auto", v);
    return WEIGHTS_MEM_AUTO;
}

#define HUGE_PAGE ((size_t)2 << 20)

int model_weights_place(model_weights *w, weights_memory how) {
    return model_weights_place_within(w, how, how == WEIGHTS_MEM_AUTO ? mem_available() : 0);
}

int model_weights_place_within(model_weights *w, weights_memory how, size_t avail) {
    if (w->arena || how == WEIGHTS_MEM_MMAP) return w->arena != NULL;
    range_list l = {0};
    for_each_view(w, view_ranges, &l);
    if (l.oom || l.n == 0) {
        free(l.r);
        return 0;
    }
    qsort(l.r, l.n, sizeof *l.r, range_cmp);
    size_t m = 0; /* merge overlapping and touching ranges (tied embeddings, stacked experts) */
    for (size_t i = 1; i < l.n; i++) {
        byte_range *last = &l.r[m];
        if (l.r[i].src <= last->src + last->len) {
            uintptr_t end = l.r[i].src + l.r[i].len;
            if (end > last->src + last->len) last->len = end - last->src;
        } else {
            l.r[++m] = l.r[i];
        }
    }
    l.n = m + 1;
    size_t total = 0, copied = 0; /* each range keeps its offset mod 64 (cache-line alignment) */
    for (size_t i = 0; i < l.n; i++) {
        total = (total + 63) & ~(size_t)63;
        l.r[i].dst = total + (l.r[i].src & 63);
        total = l.r[i].dst + l.r[i].len;
        copied += l.r[i].len;
    }
    if (how == WEIGHTS_MEM_AUTO && (avail == 0 || total > avail / 2)) {
        log_info("weights: %.0f MB stay on the file mapping (more than half of the %.0f MB "
                 "available)", (double)total / 1e6, (double)avail / 1e6);
        free(l.r);
        return 0;
    }
    size_t len = (total + 2 * HUGE_PAGE - 1) & ~(HUGE_PAGE - 1); /* room to align to 2 MiB */
    char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        log_warn("weights: cannot allocate %.0f MB to copy the weights into; reading them from "
                 "the file mapping", (double)total / 1e6);
        free(l.r);
        return 0;
    }
    char *arena = (char *)(((uintptr_t)base + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
    madvise(arena, (total + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    for (size_t i = 0; i < l.n; i++) memcpy(arena + l.r[i].dst, (const void *)l.r[i].src, l.r[i].len);
    relocation rl = {&l, arena};
    for_each_view(w, view_relocate, &rl);
    free(l.r);
    w->arena = base;
    w->arena_len = len;
    w->copied_bytes = copied;
    return 1;
}

size_t model_weights_rewrite(model_weights *w, int (*rewrite)(weight_matrix *m, void *ctx), void *ctx) {
    if (!w->arena || !rewrite) return 0; /* views on the read-only mmap: used as published */
    uint64_t t0 = clock_now_ns();
    rewrite_walk rw = {.embed = &w->embed, .rewrite = rewrite, .ctx = ctx};
    for_each_view(w, view_rewrite, &rw);
    /* A tied lm_head is the embedding's bytes: the matmul's layout wins, and the embedding's row
     * lookups (weight_matrix_row_to_f32) read it the same way. */
    if (w->has_embed && w->has_head && w->embed.data == w->lm_head.data) w->embed.layout = w->lm_head.layout;
    w->rewritten_bytes += rw.bytes;
    if (rw.bytes)
        log_info("weights: %.0f MB rewritten into the backend's layout in %.2f s", (double)rw.bytes / 1e6,
                 (double)(clock_now_ns() - t0) * 1e-9);
    return rw.bytes;
}

void model_weights_for_each(model_weights *w, void (*fn)(weight_matrix *m, void *ctx), void *ctx) {
    for_each_view(w, fn, ctx);
}

int model_weights_load(const safetensors_set *st, const model_config *c, int layer_start,
                       int layer_end, model_weights *out, char *err, size_t errlen) {
    return model_weights_load_placed(st, c, layer_start, layer_end, WEIGHTS_MEM_AUTO, out, err,
                                     errlen);
}

int model_weights_load_placed(const safetensors_set *st, const model_config *c, int layer_start,
                              int layer_end, weights_memory unset_default, model_weights *out,
                              char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (layer_start == 0 && layer_end == 0) layer_end = c->n_layers;
    if (layer_start < 0 || layer_end > c->n_layers || layer_start >= layer_end) {
        set_err(err, errlen, "layer range [%d, %d) is not inside the model's %d layers",
                layer_start, layer_end, c->n_layers);
        return -1;
    }
    out->layer_start = layer_start;
    out->layer_end = layer_end;
    out->n_experts = c->n_experts;
    out->layers = calloc((size_t)(layer_end - layer_start), sizeof *out->layers);
    if (!out->layers) {
        set_err(err, errlen, "out of memory");
        return -1;
    }
    int64_t dim = c->hidden_size, vocab = c->vocab_size;
    int first = layer_start == 0, last = layer_end == c->n_layers;
    out->has_embed = first || (last && c->tie_word_embeddings);
    out->has_head = last;
    if (out->has_embed &&
        load_matrix(st, "model.embed_tokens", vocab, dim, &out->embed, err, errlen))
        goto fail;
    for (int i = layer_start; i < layer_end; i++)
        if (load_layer(st, c, i, &out->layers[i - layer_start], err, errlen)) goto fail;
    if (last) {
        if (load_vector(st, "model.norm", dim, &out->final_norm, err, errlen)) goto fail;
        if (c->tie_word_embeddings) {
            out->lm_head = out->embed;
        } else if (load_matrix(st, "lm_head", vocab, dim, &out->lm_head, err, errlen)) {
            goto fail;
        }
        out->bytes_per_token += weight_matrix_bytes(&out->lm_head);
    }
    for (int i = layer_start; i < layer_end; i++)
        out->bytes_per_token += layer_bytes(c, &out->layers[i - layer_start]);
    model_weights_place(out, weights_memory_from_env(unset_default));
    return 0;
fail:
    model_weights_free(out);
    return -1;
}

void model_weights_free(model_weights *w) {
    if (w->arena) munmap(w->arena, w->arena_len);
    w->arena = NULL;
    w->arena_len = w->copied_bytes = w->rewritten_bytes = 0;
    if (!w->layers) return;
    for (int i = 0; i < w->layer_end - w->layer_start; i++) {
        free(w->layers[i].expert_gate);
        free(w->layers[i].expert_up);
        free(w->layers[i].expert_down);
    }
    free(w->layers);
    w->layers = NULL;
}
