/* Weight views from safetensors by name, shape-checked against the config. See weights.h. */
#include "model/weights.h"

#include "base/array.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The float dtypes a dense weight or an MLX scale may have. -1 for any other. */
static int scale_dtype(safetensors_dtype t, dtype *d) {
    switch (t) {
    case ST_F32: *d = DTYPE_F32; return 0;
    case ST_F16: *d = DTYPE_F16; return 0;
    case ST_BF16: *d = DTYPE_BF16; return 0;
    default: return -1;
    }
}

static int dense_format(safetensors_dtype t, weight_format *f) {
    dtype d;
    if (scale_dtype(t, &d)) return -1;
    *f = d == DTYPE_F32 ? WEIGHT_F32 : d == DTYPE_F16 ? WEIGHT_F16 : WEIGHT_BF16;
    return 0;
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
    error_set(err, errlen, "%s: tensor '%s' has shape %s, expected [%s%lld, %lld]", t->file,
              t->name, got, n_stack ? "experts, " : "", (long long)(vector ? 1 : rows),
              (long long)cols);
    if (vector)
        error_set(err, errlen, "%s: tensor '%s' has shape %s, expected [%lld]", t->file, t->name,
                  got, (long long)cols);
    return -1;
}

/* The tensor `prefix`.`suffix` (its name into name[512]), or NULL with err naming it. */
static const safetensors_tensor *need_tensor(const safetensors_set *st, const char *prefix,
                                             const char *suffix, char name[512], char *err,
                                             size_t errlen) {
    snprintf(name, 512, "%.400s%s%s", prefix, *suffix ? "." : "", suffix);
    const safetensors_tensor *t = safetensors_set_find(st, name);
    if (!t) error_set(err, errlen, "model is missing tensor '%s'", name);
    return t;
}

/* `prefix`.zero_point, which only a GGUF file's symmetric types have (gguf_model.h): one F32, a
 * whole number in [1, 2^(bits-1)], the weight_matrix.zero_point of the matrix. 0 when absent. */
static int zero_point_of(const safetensors_set *st, const char *prefix, int bits, int *out, char *err,
                         size_t errlen) {
    char name[512];
    snprintf(name, sizeof name, "%.400s.zero_point", prefix);
    const safetensors_tensor *z = safetensors_set_find(st, name);
    *out = 0;
    if (!z) return 0;
    float v = 0;
    if (z->dtype == ST_F32 && z->nbytes == sizeof v) memcpy(&v, z->data, sizeof v);
    if (!(v >= 1 && v <= (float)(1 << (bits - 1)) && v == (float)(int)v)) {
        error_set(err, errlen, "%s: '%s' must be one F32 whole number in [1, %d]", z->file, name,
                  1 << (bits - 1));
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Resolves `prefix`.weight (+ .scales/.biases) into n (n_stack, or 1) matrices [rows][cols]. */
static int load_matrices(const safetensors_set *st, const char *prefix, int n_stack, int64_t rows,
                         int64_t cols, int vector, weight_matrix *out, char *err, size_t errlen) {
    char name[512];
    const safetensors_tensor *w = need_tensor(st, prefix, "weight", name, err, errlen);
    if (!w) return -1;
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
        error_set(err, errlen, "%s: tensor '%s' has dtype %s (want F32, F16, BF16 or MLX U32)",
                  w->file, name, safetensors_dtype_name(w->dtype));
        return -1;
    }
    snprintf(name, sizeof name, "%.400s.scales", prefix);
    const safetensors_tensor *s = safetensors_set_find(st, name);
    snprintf(name, sizeof name, "%.400s.biases", prefix);
    const safetensors_tensor *b = safetensors_set_find(st, name);
    if (!s || !b) {
        error_set(err, errlen, "%s: tensor '%s' is U32 but '%s.scales'/'%s.biases' are missing",
                  w->file, w->name, prefix, prefix);
        return -1;
    }
    int nd = w->n_dims;
    if (nd != (n_stack ? 3 : 2) || s->n_dims != nd || b->n_dims != nd || w->shape[nd - 1] == 0 ||
        s->shape[nd - 1] == 0) {
        error_set(err, errlen, "%s: quantized tensor '%s' has the wrong number of dims", w->file,
                  w->name);
        return -1;
    }
    int64_t wcols = w->shape[nd - 1], groups = s->shape[nd - 1];
    int64_t gs = cols / groups, bits = wcols * 32 / cols;
    if (cols % groups || (gs != 32 && gs != 64 && gs != 128) || wcols * 32 % cols ||
        bits < 2 || bits > 8 || bits == 7) {
        error_set(err, errlen,
                  "%s: quantized tensor '%s' has %lld packed words and %lld groups "
                  "per row, which is no supported bits/group size for %lld columns",
                  w->file, w->name, (long long)wcols, (long long)groups, (long long)cols);
        return -1;
    }
    dtype sd;
    if (check_shape(w, n_stack, rows, wcols, 0, err, errlen) ||
        check_shape(s, n_stack, rows, groups, 0, err, errlen) ||
        check_shape(b, n_stack, rows, groups, 0, err, errlen))
        return -1;
    if (scale_dtype(s->dtype, &sd) || s->dtype != b->dtype) {
        error_set(err, errlen, "%s: '%s.scales'/'%s.biases' must both be F32, F16 or BF16", s->file,
                  prefix, prefix);
        return -1;
    }
    size_t wstride = (size_t)rows * (size_t)wcols * 4;
    size_t sstride = (size_t)rows * (size_t)groups * dtype_size(sd);
    int zero_point = 0;
    if (zero_point_of(st, prefix, (int)bits, &zero_point, err, errlen)) return -1;
    for (int e = 0; e < count; e++)
        out[e] = (weight_matrix){.format = WEIGHT_MLX_AFFINE, .rows = vector ? 1 : rows,
                                 .cols = cols,
                                 .data = (const char *)w->data + (size_t)e * wstride,
                                 .scales = (const char *)s->data + (size_t)e * sstride,
                                 .biases = (const char *)b->data + (size_t)e * sstride,
                                 .scale_dtype = sd, .bits = (int)bits, .group_size = (int)gs,
                                 .zero_point = zero_point};
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

/* A dense 1-D tensor prefix.suffix (suffix "": the name is prefix itself) of n values. */
static int load_dense_vector(const safetensors_set *st, const char *prefix, const char *suffix,
                             int64_t n, weight_matrix *out, char *err, size_t errlen) {
    char name[512];
    const safetensors_tensor *t = need_tensor(st, prefix, suffix, name, err, errlen);
    if (!t) return -1;
    weight_format fmt;
    if (dense_format(t->dtype, &fmt)) {
        error_set(err, errlen, "%s: tensor '%s' must be F32, F16 or BF16", t->file, name);
        return -1;
    }
    if (check_shape(t, 0, 1, n, 1, err, errlen)) return -1;
    *out = (weight_matrix){.format = fmt, .rows = 1, .cols = n, .data = t->data};
    return 0;
}

static int load_bias(const safetensors_set *st, const char *prefix, int64_t n, weight_matrix *out,
                     char *err, size_t errlen) {
    return load_dense_vector(st, prefix, "bias", n, out, err, errlen);
}

/* A depthwise Conv1d weight as a [channels][taps] matrix: torch stores [channels][1][taps],
 * mlx [channels][taps][1]; both are the same bytes. */
static int load_conv(const safetensors_set *st, const char *prefix, int64_t channels, int64_t taps,
                     weight_matrix *out, char *err, size_t errlen) {
    char name[512];
    const safetensors_tensor *t = need_tensor(st, prefix, "weight", name, err, errlen);
    if (!t) return -1;
    weight_format fmt;
    int ok = t->n_dims == 3 && t->shape[0] == channels &&
             ((t->shape[1] == 1 && t->shape[2] == taps) || (t->shape[1] == taps && t->shape[2] == 1));
    if (dense_format(t->dtype, &fmt) || !ok) {
        char got[128];
        shape_str(t, got, sizeof got);
        error_set(err, errlen, "%s: tensor '%s' has shape %s (%s), expected a dense [%lld, 1, %lld]",
                  t->file, name, got, safetensors_dtype_name(t->dtype), (long long)channels,
                  (long long)taps);
        return -1;
    }
    *out = (weight_matrix){.format = fmt, .rows = channels, .cols = taps, .data = t->data};
    return 0;
}

/* The per-expert view arrays of a MoE layer (freed by model_weights_free). */
static int alloc_experts(layer_weights *l, int ne, char *err, size_t errlen) {
    l->expert_gate = calloc((size_t)ne, sizeof(weight_matrix));
    l->expert_up = calloc((size_t)ne, sizeof(weight_matrix));
    l->expert_down = calloc((size_t)ne, sizeof(weight_matrix));
    if (!l->expert_gate || !l->expert_up || !l->expert_down) {
        error_set(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

static int load_experts(const safetensors_set *st, const model_config *c, const char *p,
                        layer_weights *l, char *err, size_t errlen) {
    int ne = c->n_experts;
    int64_t dim = c->hidden_size, inter = c->moe_intermediate_size;
    if (alloc_experts(l, ne, err, errlen)) return -1;
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

static char *owned_alloc(model_weights *w, size_t bytes);

/* ---- gpt-oss experts ------------------------------------------------------------------------- */

static const float FP4_E2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* One expert matrix [rows][cols] of an MXFP4 pair as MLX 8-bit affine, group 32, bf16 scales:
 * rows are taken from source rows row_of(r) = r * row_step + row_first (gate/up interleave). */
static int mxfp4_to_mlx8(model_weights *w, const uint8_t *blocks, const uint8_t *scales, int64_t rows,
                         int64_t cols, int row_step, int row_first, const char *name, weight_matrix *out,
                         char *err, size_t errlen) {
    int64_t groups = cols / 32;
    uint8_t *q = (uint8_t *)owned_alloc(w, (size_t)(rows * cols));
    uint16_t *sc = (uint16_t *)owned_alloc(w, (size_t)(rows * groups) * 2);
    uint16_t *bi = (uint16_t *)owned_alloc(w, (size_t)(rows * groups) * 2);
    if (!q || !sc || !bi) {
        error_set(err, errlen, "out of memory converting '%s'", name);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t src = r * row_step + row_first;
        for (int64_t g = 0; g < groups; g++) {
            int e = (int)scales[src * groups + g] - 127;
            if (e > 124) { /* -6 * 2^e would not fit a bf16 bias */
                error_set(err, errlen, "'%s': MXFP4 scale exponent %d is out of range", name, e);
                return -1;
            }
            sc[r * groups + g] = f32_to_bf16(ldexpf(1.0f, e - 1));
            bi[r * groups + g] = f32_to_bf16(-6.0f * ldexpf(1.0f, e));
            for (int i = 0; i < 32; i++) {
                uint8_t byte = blocks[src * (cols / 2) + g * 16 + i / 2];
                float v = FP4_E2M1[i % 2 ? byte >> 4 : byte & 15];
                q[r * cols + g * 32 + i] = (uint8_t)(2.0f * v + 12.0f);
            }
        }
    }
    *out = (weight_matrix){.format = WEIGHT_MLX_AFFINE, .rows = rows, .cols = cols, .data = q,
                           .scales = sc, .biases = bi, .scale_dtype = DTYPE_BF16, .bits = 8,
                           .group_size = 32};
    return 0;
}

/* One expert matrix [rows][cols] from a dense [in = cols][out] tensor (transformers' layout):
 * out row r is source column r * col_step + col_first. */
static int dense_transposed(model_weights *w, const char *src, size_t esz, weight_format fmt, int64_t rows,
                            int64_t cols, int64_t src_cols, int col_step, int col_first, const char *name,
                            weight_matrix *out, char *err, size_t errlen) {
    char *dst = owned_alloc(w, (size_t)(rows * cols) * esz);
    if (!dst) {
        error_set(err, errlen, "out of memory transposing '%s'", name);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            memcpy(dst + (size_t)(r * cols + c) * esz,
                   src + (size_t)(c * src_cols + r * col_step + col_first) * esz, esz);
    *out = (weight_matrix){.format = fmt, .rows = rows, .cols = cols, .data = dst};
    return 0;
}

/* Rows row_first, row_first + row_step, ... of a dense [n][cols] stack as an owned [n/step][cols]. */
static int dense_rows(model_weights *w, const safetensors_tensor *t, int64_t n, int64_t cols, int row_step,
                      int row_first, weight_matrix *out, char *err, size_t errlen) {
    weight_format fmt;
    if (dense_format(t->dtype, &fmt)) {
        error_set(err, errlen, "%s: tensor '%s' must be F32, F16 or BF16", t->file, t->name);
        return -1;
    }
    size_t esz = safetensors_dtype_size(t->dtype);
    int64_t out_cols = cols / row_step;
    char *dst = owned_alloc(w, (size_t)(n * out_cols) * esz);
    if (!dst) {
        error_set(err, errlen, "out of memory");
        return -1;
    }
    for (int64_t e = 0; e < n; e++)
        for (int64_t j = 0; j < out_cols; j++)
            memcpy(dst + (size_t)(e * out_cols + j) * esz,
                   (const char *)t->data + (size_t)(e * cols + j * row_step + row_first) * esz, esz);
    *out = (weight_matrix){.format = fmt, .rows = n, .cols = out_cols, .data = dst};
    return 0;
}

/* The expert matrices of one fused projection (gate_up: `pairs` 2, down: 1) in either format. */
static int load_gpt_oss_projection(model_weights *w, const safetensors_set *st, const char *prefix, int ne,
                                   int64_t out_rows, int64_t in_cols, int pairs, weight_matrix *first,
                                   weight_matrix *second, char *err, size_t errlen) {
    char name[512];
    snprintf(name, sizeof name, "%.400s_blocks", prefix);
    const safetensors_tensor *b = safetensors_set_find(st, name);
    int64_t src_rows = out_rows * pairs;
    if (b) {
        snprintf(name, sizeof name, "%.400s_scales", prefix);
        const safetensors_tensor *s = safetensors_set_find(st, name);
        int64_t g = in_cols / 32;
        int64_t want_b[4] = {ne, src_rows, g, 16}, want_s[3] = {ne, src_rows, g};
        int ok = s && b->dtype == ST_U8 && s->dtype == ST_U8 && b->n_dims == 4 && s->n_dims == 3 && in_cols % 32 == 0;
        for (int i = 0; ok && i < 4; i++) ok = b->shape[i] == want_b[i] && (i == 3 || s->shape[i] == want_s[i]);
        if (!ok) {
            error_set(err, errlen, "%s: MXFP4 tensors '%s_blocks'/'_scales' must be U8 [%d, %lld, %lld, 16] and "
                      "[%d, %lld, %lld]", b->file, prefix, ne, (long long)src_rows, (long long)g, ne,
                      (long long)src_rows, (long long)g);
            return -1;
        }
        for (int e = 0; e < ne; e++) {
            const uint8_t *eb = (const uint8_t *)b->data + (size_t)(e * src_rows * g * 16);
            const uint8_t *es = (const uint8_t *)s->data + (size_t)(e * src_rows * g);
            if (mxfp4_to_mlx8(w, eb, es, out_rows, in_cols, pairs, 0, prefix, &first[e], err, errlen) ||
                (second && mxfp4_to_mlx8(w, eb, es, out_rows, in_cols, pairs, 1, prefix, &second[e], err, errlen)))
                return -1;
        }
        return 0;
    }
    const safetensors_tensor *t = safetensors_set_find(st, prefix);
    weight_format fmt;
    if (!t) {
        error_set(err, errlen, "model is missing tensor '%s' (or its MXFP4 '%s_blocks')", prefix, prefix);
        return -1;
    }
    if (dense_format(t->dtype, &fmt) || check_shape(t, ne, in_cols, src_rows, 0, err, errlen)) {
        if (dense_format(t->dtype, &fmt))
            error_set(err, errlen, "%s: tensor '%s' must be F32, F16 or BF16", t->file, prefix);
        return -1;
    }
    size_t esz = safetensors_dtype_size(t->dtype), stride = (size_t)(in_cols * src_rows) * esz;
    for (int e = 0; e < ne; e++) {
        const char *src = (const char *)t->data + (size_t)e * stride;
        if (dense_transposed(w, src, esz, fmt, out_rows, in_cols, src_rows, pairs, 0, prefix, &first[e], err, errlen) ||
            (second && dense_transposed(w, src, esz, fmt, out_rows, in_cols, src_rows, pairs, 1, prefix, &second[e],
                                        err, errlen)))
            return -1;
    }
    return 0;
}

/* gpt-oss MoE: router (+ bias), experts from the fused tensors, gate/up de-interleaved. */
static int load_gpt_oss_experts(model_weights *w, const safetensors_set *st, const model_config *c, const char *p,
                                layer_weights *l, char *err, size_t errlen) {
    int ne = c->n_experts;
    int64_t dim = c->hidden_size, inter = c->moe_intermediate_size;
    if (alloc_experts(l, ne, err, errlen)) return -1;
    char name[512];
    snprintf(name, sizeof name, "%s.mlp.router", p);
    if (load_matrix(st, name, ne, dim, &l->router, err, errlen) ||
        load_bias(st, name, ne, &l->router_bias, err, errlen))
        return -1;
    snprintf(name, sizeof name, "%s.mlp.experts.gate_up_proj", p);
    if (load_gpt_oss_projection(w, st, name, ne, inter, dim, 2, l->expert_gate, l->expert_up, err, errlen))
        return -1;
    snprintf(name, sizeof name, "%s.mlp.experts.down_proj", p);
    if (load_gpt_oss_projection(w, st, name, ne, dim, inter, 1, l->expert_down, NULL, err, errlen)) return -1;
    const safetensors_tensor *gub = need_tensor(st, p, "mlp.experts.gate_up_proj_bias", name, err, errlen);
    const safetensors_tensor *db = gub ? need_tensor(st, p, "mlp.experts.down_proj_bias", name, err, errlen) : NULL;
    if (!gub || !db || check_shape(gub, 0, ne, 2 * inter, 0, err, errlen) || check_shape(db, 0, ne, dim, 0, err, errlen))
        return -1;
    return dense_rows(w, gub, ne, 2 * inter, 2, 0, &l->expert_gate_bias, err, errlen) ||
                   dense_rows(w, gub, ne, 2 * inter, 2, 1, &l->expert_up_bias, err, errlen) ||
                   dense_rows(w, db, ne, dim, 1, 0, &l->expert_down_bias, err, errlen)
               ? -1
               : 0;
}

static void slice_rows(weight_matrix *m, int64_t r0, int64_t n);

/* Rewrites m as the rows row_of[0..n) of m, in that order, in one owned buffer (rows are
 * independent in every format: dense values, or MLX words + their group scales and biases). */
static int gather_rows_owned(model_weights *w, weight_matrix *m, const int64_t *row_of, int64_t n,
                             const char *name, char *err, size_t errlen) {
    size_t data_row, group_row = 0;
    if (m->format == WEIGHT_MLX_AFFINE) {
        data_row = (size_t)(m->cols * m->bits / 32) * 4;
        group_row = (size_t)(m->cols / m->group_size) * dtype_size(m->scale_dtype);
    } else {
        data_row = (size_t)m->cols * (m->format == WEIGHT_F32 ? 4 : 2);
    }
    size_t data_bytes = (size_t)n * data_row, group_bytes = (size_t)n * group_row;
    size_t sc_off = (data_bytes + 63) & ~(size_t)63, bi_off = sc_off + ((group_bytes + 63) & ~(size_t)63);
    char *buf = owned_alloc(w, bi_off + group_bytes);
    if (!buf) {
        error_set(err, errlen, "out of memory regrouping the rows of '%s'", name);
        return -1;
    }
    for (int64_t r = 0; r < n; r++) {
        size_t src = (size_t)row_of[r];
        memcpy(buf + (size_t)r * data_row, (const char *)m->data + src * data_row, data_row);
        if (!group_row) continue;
        memcpy(buf + sc_off + (size_t)r * group_row, (const char *)m->scales + src * group_row, group_row);
        memcpy(buf + bi_off + (size_t)r * group_row, (const char *)m->biases + src * group_row, group_row);
    }
    m->data = buf;
    if (group_row) {
        m->scales = buf + sc_off;
        m->biases = buf + bi_off;
    }
    m->rows = n;
    return 0;
}

/* The rows [r0, r0 + n) of m as a view of their own. */
static weight_matrix rows_view(const weight_matrix *m, int64_t r0, int64_t n) {
    weight_matrix v = *m;
    slice_rows(&v, r0, n);
    return v;
}

/* Hybrid attention: q_proj holds per head head_dim query rows then head_dim gate rows; regroups
 * them into all queries (wq) then all gates (wq_gate). */
static int split_query_gate(model_weights *w, const model_config *c, layer_weights *l,
                            const char *name, char *err, size_t errlen) {
    int64_t hd = c->head_dim, qd = (int64_t)c->n_heads * hd;
    int64_t *row_of = malloc((size_t)(2 * qd) * sizeof *row_of);
    if (!row_of) {
        error_set(err, errlen, "out of memory");
        return -1;
    }
    for (int64_t i = 0; i < qd; i++) {
        row_of[i] = (i / hd) * 2 * hd + i % hd;
        row_of[qd + i] = (i / hd) * 2 * hd + hd + i % hd;
    }
    int rc = gather_rows_owned(w, &l->wq, row_of, 2 * qd, name, err, errlen);
    free(row_of);
    if (rc) return -1;
    l->wq_gate = rows_view(&l->wq, qd, qd);
    l->wq = rows_view(&l->wq, 0, qd);
    return 0;
}

/* Qwen3-Next's fused projections, grouped per key head g: qkvz rows [q_g | k_g | v_g | z_g]
 * (key_dim, key_dim, r*value_dim, r*value_dim with r = value heads per key head) and ba rows
 * [b_g | a_g] (r, r). Regrouped into all q, all k, all v, all z and all b, all a. */
static int load_fused_linear(model_weights *w, const safetensors_set *st, const model_config *c,
                             const char *p, layer_weights *l, char *err, size_t errlen) {
    int64_t nk = c->linear_key_heads, dk = c->linear_key_dim, dv = c->linear_value_dim;
    int64_t r = c->linear_value_heads / nk, nv = c->linear_value_heads;
    int64_t kd = nk * dk, vd = nv * dv, group = 2 * dk + 2 * r * dv, dim = c->hidden_size;
    char n[256];
    weight_matrix qkvz, ba;
    snprintf(n, sizeof n, "%.200s.in_proj_qkvz", p);
    if (load_matrix(st, n, 2 * kd + 2 * vd, dim, &qkvz, err, errlen)) return -1;
    int64_t *row_of = malloc((size_t)(2 * kd + 2 * vd) * sizeof *row_of);
    if (!row_of) {
        error_set(err, errlen, "out of memory");
        return -1;
    }
    int64_t o = 0;
    for (int part = 0; part < 4; part++) { /* q, k, v, z */
        int64_t len = part < 2 ? dk : r * dv, start = part == 0 ? 0 : part == 1 ? dk
                                                   : part == 2 ? 2 * dk : 2 * dk + r * dv;
        for (int64_t g = 0; g < nk; g++)
            for (int64_t i = 0; i < len; i++) row_of[o++] = g * group + start + i;
    }
    int rc = gather_rows_owned(w, &qkvz, row_of, o, n, err, errlen);
    if (!rc) {
        snprintf(n, sizeof n, "%.200s.in_proj_ba", p);
        rc = load_matrix(st, n, 2 * nv, dim, &ba, err, errlen);
    }
    if (!rc) {
        o = 0;
        for (int part = 0; part < 2; part++)
            for (int64_t g = 0; g < nk; g++)
                for (int64_t i = 0; i < r; i++) row_of[o++] = g * 2 * r + part * r + i;
        rc = gather_rows_owned(w, &ba, row_of, o, n, err, errlen);
    }
    free(row_of);
    if (rc) return -1;
    l->lin_qkv = rows_view(&qkvz, 0, 2 * kd + vd);
    l->lin_z = rows_view(&qkvz, 2 * kd + vd, vd);
    l->lin_b = rows_view(&ba, 0, nv);
    l->lin_a = rows_view(&ba, nv, nv);
    return 0;
}

/* A GatedDeltaNet layer's tensors under p (".linear_attn"). */
static int load_linear_attention(model_weights *w, const safetensors_set *st, const model_config *c,
                                 const char *p, layer_weights *l, char *err, size_t errlen) {
    int64_t dim = c->hidden_size, nv = c->linear_value_heads;
    int64_t kd = (int64_t)c->linear_key_heads * c->linear_key_dim, vd = nv * c->linear_value_dim;
    char n[256];
#define LNAME(suffix) (snprintf(n, sizeof n, "%.200s.%s", p, suffix), n)
    if (c->linear_fused_projections) {
        if (load_fused_linear(w, st, c, p, l, err, errlen)) return -1;
    } else if (load_matrix(st, LNAME("in_proj_qkv"), 2 * kd + vd, dim, &l->lin_qkv, err, errlen) ||
               load_matrix(st, LNAME("in_proj_z"), vd, dim, &l->lin_z, err, errlen) ||
               load_matrix(st, LNAME("in_proj_b"), nv, dim, &l->lin_b, err, errlen) ||
               load_matrix(st, LNAME("in_proj_a"), nv, dim, &l->lin_a, err, errlen)) {
        return -1;
    }
    if (load_conv(st, LNAME("conv1d"), 2 * kd + vd, c->linear_conv_kernel, &l->lin_conv, err, errlen) ||
        load_dense_vector(st, LNAME("A_log"), "", nv, &l->lin_a_log, err, errlen) ||
        load_dense_vector(st, LNAME("dt_bias"), "", nv, &l->lin_dt_bias, err, errlen) ||
        load_vector(st, LNAME("norm"), c->linear_value_dim, &l->lin_norm, err, errlen) ||
        load_matrix(st, LNAME("out_proj"), dim, vd, &l->lin_out, err, errlen))
        return -1;
    /* q, k, v, beta and the decay reach the output through the delta rule and then a per-head
     * RMSNorm of a much smaller vector (q is scaled by 1/sqrt(key_dim)), which turns absolute
     * errors into larger relative ones; z gates that output: these projections do not run on
     * activations rounded to int16 (the 4-bit tiny fixtures on AVX-512: a greedy token flipped
     * at a top-2 gap of 0.22 with any of them rounded) */
    l->lin_qkv.exact_activations = l->lin_z.exact_activations = 1;
    l->lin_b.exact_activations = l->lin_a.exact_activations = 1;
#undef LNAME
    return 0;
}

static int load_shared_expert(const safetensors_set *st, const model_config *c, const char *p,
                              layer_weights *l, char *err, size_t errlen) {
    int64_t dim = c->hidden_size, inter = c->shared_expert_intermediate_size;
    char n[256];
#define SNAME(suffix) (snprintf(n, sizeof n, "%s.mlp.%s", p, suffix), n)
    if (load_matrix(st, SNAME("shared_expert.gate_proj"), inter, dim, &l->shared_gate, err, errlen) ||
        load_matrix(st, SNAME("shared_expert.up_proj"), inter, dim, &l->shared_up, err, errlen) ||
        load_matrix(st, SNAME("shared_expert.down_proj"), dim, inter, &l->shared_down, err, errlen) ||
        load_matrix(st, SNAME("shared_expert_gate"), 1, dim, &l->shared_expert_gate, err, errlen))
        return -1;
#undef SNAME
    return 0;
}

/* Where the language model's tensors are: model.* (text checkpoints), or model.language_model.*
 * (Qwen3.5's multimodal checkpoints, beside model.visual.* and mtp.*). */
static const char *text_prefix(const safetensors_set *st) {
    static const char *prefixes[] = {"model.language_model", "language_model.model"};
    for (int i = 0; i < 2; i++) {
        char a[96], b[96];
        snprintf(a, sizeof a, "%s.embed_tokens.weight", prefixes[i]);
        snprintf(b, sizeof b, "%s.norm.weight", prefixes[i]);
        if (safetensors_set_find(st, a) || safetensors_set_find(st, b)) return prefixes[i];
    }
    return "model";
}

/* The lm_head of a checkpoint whose text model is under `prefix` (mlx-lm's multimodal
 * conversions keep it under language_model.). */
static const char *head_name(const char *prefix) {
    return strcmp(prefix, "language_model.model") ? "lm_head" : "language_model.lm_head";
}

/* Whether a hybrid's zero-centred norms are stored as transformers has them (w, used as 1 + w)
 * rather than as mlx-lm converts them (1 + w): mlx-lm adds the 1 in the same pass that turns the
 * depthwise conv weight from torch's [C, 1, K] into its [C, K, 1], so the conv layout says which
 * (as mlx-lm itself decides). */
static int norms_stored_zero_centred(const safetensors_set *st, const model_config *c,
                                     const char *prefix) {
    if (!c->norm_zero_centred) return 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (!model_config_layer_is_linear(c, l)) continue;
        char name[160];
        snprintf(name, sizeof name, "%s.layers.%d.linear_attn.conv1d.weight", prefix, l);
        const safetensors_tensor *t = safetensors_set_find(st, name);
        return !(t && t->n_dims == 3 && t->shape[2] == 1 && t->shape[1] != 1);
    }
    return 1;
}

/* A decoder layer whose tensors are under p (model.layers.N, mtp.layers.0). */
static int load_layer_at(model_weights *w, const safetensors_set *st, const model_config *c,
                         const char *p, int is_linear, int is_moe, layer_weights *l, char *err,
                         size_t errlen) {
    char n[256];
    int64_t dim = c->hidden_size, qd = (int64_t)c->n_heads * c->head_dim,
            kvd = (int64_t)c->n_kv_heads * c->head_dim;
#define NAME(suffix) (snprintf(n, sizeof n, "%s.%s", p, suffix), n)
    if (load_vector(st, NAME("input_layernorm"), dim, &l->attn_norm, err, errlen) ||
        load_vector(st, NAME("post_attention_layernorm"), dim, &l->ffn_norm, err, errlen))
        return -1;
    l->is_linear = is_linear;
    l->is_moe = is_moe;
    if (l->is_linear) {
        if (load_linear_attention(w, st, c, NAME("linear_attn"), l, err, errlen)) return -1;
        goto mlp;
    }
    if (load_matrix(st, NAME("self_attn.q_proj"), c->attn_output_gate ? 2 * qd : qd, dim, &l->wq,
                    err, errlen) ||
        (c->attn_output_gate && split_query_gate(w, c, l, n, err, errlen)) ||
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
    if (c->family == MODEL_FAMILY_GPT_OSS &&
        (load_bias(st, NAME("self_attn.o_proj"), dim, &l->bo, err, errlen) ||
         load_dense_vector(st, NAME("self_attn"), "sinks", c->n_heads, &l->sinks, err, errlen)))
        return -1;
    if (c->family == MODEL_FAMILY_GPT_OSS) return 0; /* experts: load_gpt_oss_experts (owned copies) */
mlp:
    if (l->is_moe)
        return load_experts(st, c, p, l, err, errlen) ||
                       (c->shared_expert_intermediate_size &&
                        load_shared_expert(st, c, p, l, err, errlen))
                   ? -1
                   : 0;
    int64_t inter = c->intermediate_size;
    if (load_matrix(st, NAME("mlp.gate_proj"), inter, dim, &l->w_gate, err, errlen) ||
        load_matrix(st, NAME("mlp.up_proj"), inter, dim, &l->w_up, err, errlen) ||
        load_matrix(st, NAME("mlp.down_proj"), dim, inter, &l->w_down, err, errlen))
        return -1;
#undef NAME
    return 0;
}

static int load_layer(model_weights *w, const safetensors_set *st, const model_config *c, int i,
                      layer_weights *l, char *err, size_t errlen) {
    char p[128];
    snprintf(p, sizeof p, "%s.layers.%d", text_prefix(st), i);
    return load_layer_at(w, st, c, p, model_config_layer_is_linear(c, i),
                         model_config_layer_is_moe(c, i), l, err, errlen);
}

/* ---- tensor-parallel slices ------------------------------------------------------------------ */

/* A buffer w owns until its bytes are in the arena (or w is freed); NULL when out of memory. */
static char *owned_alloc(model_weights *w, size_t bytes) {
    if (w->n_owned == w->owned_cap) {
        int cap = w->owned_cap ? w->owned_cap * 2 : 64;
        void **n = realloc(w->owned, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        w->owned = n;
        w->owned_cap = cap;
    }
    char *p = malloc(bytes ? bytes : 1);
    if (p) w->owned[w->n_owned++] = p;
    return p;
}

static void free_owned(model_weights *w) {
    for (int i = 0; i < w->n_owned; i++) free(w->owned[i]);
    free(w->owned);
    w->owned = NULL;
    w->n_owned = w->owned_cap = 0;
}

static size_t dense_elem_size(const weight_matrix *m) { return m->format == WEIGHT_F32 ? 4 : 2; }

/* Keeps elements [i0, i0 + n) of a dense vector ([1][cols], e.g. a bias): a view. */
static void slice_vector(weight_matrix *m, int64_t i0, int64_t n) {
    if (!m->data) return;
    m->data = (const char *)m->data + (size_t)i0 * dense_elem_size(m);
    m->cols = n;
}

/* Keeps rows [r0, r0 + n) of m: a view into the same bytes (rows are contiguous in every format
 * published; the backend's interleaved layout comes later, on the slice). */
static void slice_rows(weight_matrix *m, int64_t r0, int64_t n) {
    if (m->format != WEIGHT_MLX_AFFINE) {
        m->data = (const char *)m->data + (size_t)(r0 * m->cols) * dense_elem_size(m);
    } else {
        size_t words = (size_t)(m->cols * m->bits / 32), groups = (size_t)(m->cols / m->group_size);
        size_t ss = dtype_size(m->scale_dtype);
        m->data = (const uint32_t *)m->data + (size_t)r0 * words;
        m->scales = (const char *)m->scales + (size_t)r0 * groups * ss;
        m->biases = (const char *)m->biases + (size_t)r0 * groups * ss;
    }
    m->rows = n;
}

/* Copies `rows` runs of `run` bytes, `stride` apart from src + offset, into dst. */
static void gather_runs(char *dst, const void *src, size_t offset, size_t stride, size_t run,
                        int64_t rows) {
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * run, (const char *)src + (size_t)r * stride + offset, run);
}

/* Keeps input columns [c0, c0 + n) of m, gathered into one owned buffer. MLX matrices can only be
 * cut at quantization groups (a group's scale and bias cover all of its columns). */
static int slice_cols(model_weights *w, weight_matrix *m, int64_t c0, int64_t n, const char *name,
                      char *err, size_t errlen) {
    if (m->format != WEIGHT_MLX_AFFINE) {
        size_t es = dense_elem_size(m);
        char *buf = owned_alloc(w, (size_t)(m->rows * n) * es);
        if (!buf) goto oom;
        gather_runs(buf, m->data, (size_t)c0 * es, (size_t)m->cols * es, (size_t)n * es, m->rows);
        m->data = buf;
        m->cols = n;
        return 0;
    }
    if (c0 % m->group_size || n % m->group_size) {
        error_set(err, errlen, "cannot split '%s' %d ways: each rank would take %lld of its %lld "
                "input columns, not a multiple of its quantization group of %d", name,
                w->tp_size, (long long)n, (long long)m->cols, m->group_size);
        return -1;
    }
    size_t ss = dtype_size(m->scale_dtype);
    size_t words = (size_t)(m->cols * m->bits / 32), groups = (size_t)(m->cols / m->group_size);
    size_t nw = (size_t)(n * m->bits / 32), ng = (size_t)(n / m->group_size);
    size_t data_bytes = (size_t)m->rows * nw * 4, group_bytes = (size_t)m->rows * ng * ss;
    size_t sc_off = (data_bytes + 63) & ~(size_t)63, bi_off = sc_off + ((group_bytes + 63) & ~(size_t)63);
    char *buf = owned_alloc(w, bi_off + group_bytes);
    if (!buf) goto oom;
    gather_runs(buf, m->data, (size_t)(c0 * m->bits / 32) * 4, words * 4, nw * 4, m->rows);
    gather_runs(buf + sc_off, m->scales, (size_t)(c0 / m->group_size) * ss, groups * ss, ng * ss,
                m->rows);
    gather_runs(buf + bi_off, m->biases, (size_t)(c0 / m->group_size) * ss, groups * ss, ng * ss,
                m->rows);
    m->data = buf;
    m->scales = buf + sc_off;
    m->biases = buf + bi_off;
    m->cols = n;
    return 0;
oom:
    error_set(err, errlen, "out of memory slicing '%s'", name);
    return -1;
}

/* Tensor parallel: keeps this rank's share of the lm_head's rows (the vocabulary). A tied head is
 * the embedding's bytes, which every rank still looks tokens up in: its share is copied, so the
 * backend's rewrite of the head cannot touch the embedding. */
static int slice_vocab(model_weights *w, int64_t vocab, int tied, char *err, size_t errlen) {
    int64_t v0 = vocab * w->tp_rank / w->tp_size, v1 = vocab * (w->tp_rank + 1) / w->tp_size;
    weight_matrix *m = &w->lm_head;
    slice_rows(m, v0, v1 - v0);
    w->vocab_start = v0;
    if (!tied) return 0;
    size_t bytes = weight_matrix_bytes(m), groups = 0, ss = 0;
    if (m->format == WEIGHT_MLX_AFFINE) {
        groups = (size_t)(m->rows * (m->cols / m->group_size));
        ss = dtype_size(m->scale_dtype);
        bytes = (size_t)(m->rows * m->cols * m->bits / 8);
    }
    size_t sc_off = (bytes + 63) & ~(size_t)63, bi_off = sc_off + ((groups * ss + 63) & ~(size_t)63);
    char *buf = owned_alloc(w, bi_off + groups * ss);
    if (!buf) {
        error_set(err, errlen, "out of memory copying the lm_head's share");
        return -1;
    }
    memcpy(buf, m->data, bytes);
    m->data = buf;
    if (groups) {
        memcpy(buf + sc_off, m->scales, groups * ss);
        memcpy(buf + bi_off, m->biases, groups * ss);
        m->scales = buf + sc_off;
        m->biases = buf + bi_off;
    }
    return 0;
}

/* One SwiGLU FFN's share: hidden units [i0, i0 + n) (rows of gate/up, columns of down). */
static int slice_ffn(model_weights *w, weight_matrix *gate, weight_matrix *up, weight_matrix *down,
                     int64_t i0, int64_t n, const char *name, char *err, size_t errlen) {
    slice_rows(gate, i0, n);
    slice_rows(up, i0, n);
    return slice_cols(w, down, i0, n, name, err, errlen);
}

/* Cuts layer i (already resolved whole) down to this rank's tensor-parallel slice. */
static int slice_layer(model_weights *w, const model_config *c, int i, layer_weights *l,
                       char *err, size_t errlen) {
    int n = w->tp_size, r = w->tp_rank;
    int64_t hd = c->head_dim, heads = c->n_heads / n, kv_heads = c->n_kv_heads / n;
    char name[160];
    slice_rows(&l->wq, r * heads * hd, heads * hd);
    slice_rows(&l->wk, r * kv_heads * hd, kv_heads * hd);
    slice_rows(&l->wv, r * kv_heads * hd, kv_heads * hd);
    slice_vector(&l->bq, r * heads * hd, heads * hd);
    slice_vector(&l->bk, r * kv_heads * hd, kv_heads * hd);
    slice_vector(&l->bv, r * kv_heads * hd, kv_heads * hd);
    snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj", i);
    if (slice_cols(w, &l->wo, r * heads * hd, heads * hd, name, err, errlen)) return -1;
    if (!l->is_moe) {
        int64_t inter = c->intermediate_size / n;
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj", i);
        return slice_ffn(w, &l->w_gate, &l->w_up, &l->w_down, r * inter, inter, name, err, errlen);
    }
    int64_t inter = c->moe_intermediate_size / n;
    for (int e = 0; e < c->n_experts; e++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp expert %d down_proj", i, e);
        if (slice_ffn(w, &l->expert_gate[e], &l->expert_up[e], &l->expert_down[e], r * inter,
                      inter, name, err, errlen))
            return -1;
    }
    return 0;
}

static size_t layer_bytes(const model_config *c, const layer_weights *l) {
    const weight_matrix *mixer[] = {&l->wq, &l->wq_gate, &l->wk, &l->wv, &l->wo, &l->lin_qkv,
                                    &l->lin_z, &l->lin_b, &l->lin_a, &l->lin_out, &l->shared_gate,
                                    &l->shared_up, &l->shared_down, &l->shared_expert_gate};
    size_t b = 0;
    for (size_t i = 0; i < sizeof mixer / sizeof *mixer; i++)
        if (mixer[i]->data) b += weight_matrix_bytes(mixer[i]);
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
    fn(&w->mtp_norm_embedding, ctx);
    fn(&w->mtp_norm_hidden, ctx);
    fn(&w->mtp_fc, ctx);
    for (int i = 0; w->layers && i < w->layer_end - w->layer_start; i++) {
        layer_weights *l = &w->layers[i];
        weight_matrix *m[] = {&l->attn_norm, &l->wq, &l->wk, &l->wv, &l->wo, &l->bq, &l->bk,
                              &l->bv, &l->q_norm, &l->k_norm, &l->ffn_norm, &l->w_gate, &l->w_up,
                              &l->w_down, &l->router, &l->bo, &l->sinks, &l->router_bias,
                              &l->expert_gate_bias, &l->expert_up_bias, &l->expert_down_bias,
                              &l->wq_gate, &l->lin_qkv, &l->lin_z,
                              &l->lin_b, &l->lin_a, &l->lin_conv, &l->lin_a_log,
                              &l->lin_dt_bias, &l->lin_norm, &l->lin_out, &l->shared_gate,
                              &l->shared_up, &l->shared_down, &l->shared_expert_gate};
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
    byte_range *r = array_reserve_one(l->r, l->n, &l->cap, 256, sizeof *r);
    if (!r) {
        l->oom = 1;
        return;
    }
    l->r = r;
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
    return model_weights_place_within(w, how, how == WEIGHTS_MEM_AUTO ? mem_available() : 0, 0);
}

int model_weights_place_within(model_weights *w, weights_memory how, size_t avail,
                               size_t freed_after) {
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
    size_t added = total > freed_after ? total - freed_after : 0;
    if (how == WEIGHTS_MEM_AUTO && (avail == 0 || total > avail || added > avail / 2)) {
        log_info("weights: %.0f MB stay where they were read (%.0f MB more than half of the %.0f "
                 "MB available)", (double)total / 1e6, (double)added / 1e6, (double)avail / 1e6);
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
    int tied = w->has_embed && w->has_head && w->embed.data == w->lm_head.data;
    for_each_view(w, view_rewrite, &rw);
    /* A tied lm_head is the embedding's bytes: the matmul's layout wins, and the embedding's row
     * lookups (weight_matrix_row_to_f32) read it the same way (the rewrite may have moved where
     * the data, scales and biases start). */
    if (tied) {
        w->embed.layout = w->lm_head.layout, w->embed.group_stride = w->lm_head.group_stride;
        w->embed.data = w->lm_head.data, w->embed.scales = w->lm_head.scales, w->embed.biases = w->lm_head.biases;
    }
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
    model_shard shard = {.layer_start = layer_start, .layer_end = layer_end};
    return model_weights_load_shard(st, c, &shard, out, err, errlen);
}

int model_weights_load_shard(const safetensors_set *st, const model_config *c,
                             const model_shard *shard, model_weights *out, char *err,
                             size_t errlen) {
    memset(out, 0, sizeof *out);
    int layer_start = shard->layer_start, layer_end = shard->layer_end;
    if (layer_start == 0 && layer_end == 0) layer_end = c->n_layers;
    if (layer_start < 0 || layer_end > c->n_layers || layer_start >= layer_end) {
        error_set(err, errlen, "layer range [%d, %d) is not inside the model's %d layers",
                  layer_start, layer_end, c->n_layers);
        return -1;
    }
    out->tp_size = shard->tp_size > 1 ? shard->tp_size : 1;
    out->tp_rank = out->tp_size > 1 ? shard->tp_rank : 0;
    if (out->tp_size > 1 &&
        (model_config_tensor_split_check(c, out->tp_size, err, errlen) ||
         out->tp_rank < 0 || out->tp_rank >= out->tp_size)) {
        if (out->tp_rank < 0 || out->tp_rank >= out->tp_size)
            error_set(err, errlen, "tensor-parallel rank %d is not in 0..%d", out->tp_rank,
                    out->tp_size - 1);
        return -1;
    }
    out->layer_start = layer_start;
    out->layer_end = layer_end;
    out->n_experts = c->n_experts;
    out->layers = calloc((size_t)(layer_end - layer_start), sizeof *out->layers);
    if (!out->layers) {
        error_set(err, errlen, "out of memory");
        return -1;
    }
    int64_t dim = c->hidden_size, vocab = c->vocab_size;
    /* tensor parallel: every rank embeds its own copy of the tokens and holds a vocab share */
    int first = layer_start == 0, last = layer_end == c->n_layers;
    out->has_embed = first || (last && c->tie_word_embeddings);
    out->has_head = last;
    const char *prefix = text_prefix(st);
    char name[96];
    if (strcmp(prefix, "model"))
        log_info("weights: the language model of a multimodal checkpoint (%s.*); its vision "
                 "tower is not loaded (nor mtp.*, but by --speculative mtp)", prefix);
    out->norm_plus_one = norms_stored_zero_centred(st, c, prefix);
    snprintf(name, sizeof name, "%s.embed_tokens", prefix);
    if (out->has_embed && load_matrix(st, name, vocab, dim, &out->embed, err, errlen))
        goto fail;
    for (int i = layer_start; i < layer_end; i++) {
        layer_weights *l = &out->layers[i - layer_start];
        char layer_prefix[128];
        snprintf(layer_prefix, sizeof layer_prefix, "%s.layers.%d", prefix, i);
        if (load_layer(out, st, c, i, l, err, errlen) ||
            (c->family == MODEL_FAMILY_GPT_OSS &&
             load_gpt_oss_experts(out, st, c, layer_prefix, l, err, errlen)) ||
            (out->tp_size > 1 && slice_layer(out, c, i, l, err, errlen)))
            goto fail;
    }
    if (last) {
        snprintf(name, sizeof name, "%s.norm", prefix);
        if (load_vector(st, name, dim, &out->final_norm, err, errlen)) goto fail;
        if (c->tie_word_embeddings) {
            out->lm_head = out->embed;
        } else if (load_matrix(st, head_name(prefix), vocab, dim, &out->lm_head, err, errlen)) {
            goto fail;
        }
        if (out->tp_size > 1 && slice_vocab(out, vocab, c->tie_word_embeddings, err, errlen))
            goto fail;
        out->bytes_per_token += weight_matrix_bytes(&out->lm_head);
    }
    for (int i = layer_start; i < layer_end; i++)
        out->bytes_per_token += layer_bytes(c, &out->layers[i - layer_start]);
    /* once the slices are copied into the arena, their gathered buffers are not needed; nor
     * are a GGUF file's converted tensors (the caller drops them: safetensors_set_drop_built) */
    weights_memory how = weights_memory_from_env(shard->memory);
    if (model_weights_place_within(out, how, how == WEIGHTS_MEM_AUTO ? mem_available() : 0,
                                   safetensors_set_built_bytes(st)))
        free_owned(out);
    return 0;
fail:
    model_weights_free(out);
    return -1;
}

void model_weights_free(model_weights *w) {
    if (w->arena) munmap(w->arena, w->arena_len);
    free_owned(w);
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

int model_weights_has_mtp(const safetensors_set *st) {
    return safetensors_set_find(st, "mtp.fc.weight") != NULL;
}

int model_weights_load_mtp(const safetensors_set *st, const model_config *c, model_weights *out,
                           char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int64_t dim = c->hidden_size;
    out->layer_start = c->n_layers;
    out->layer_end = c->n_layers + 1;
    out->has_head = 1;
    out->tp_size = 1;
    out->n_experts = c->n_experts;
    out->norm_plus_one = norms_stored_zero_centred(st, c, text_prefix(st));
    out->layers = calloc(1, sizeof *out->layers);
    if (!out->layers) {
        error_set(err, errlen, "out of memory");
        return -1;
    }
    int moe = model_config_layer_is_moe(c, c->n_layers - 1);
    if (load_layer_at(out, st, c, "mtp.layers.0", 0, moe, &out->layers[0], err, errlen) ||
        load_vector(st, "mtp.norm", dim, &out->final_norm, err, errlen) ||
        load_vector(st, "mtp.pre_fc_norm_embedding", dim, &out->mtp_norm_embedding, err, errlen) ||
        load_vector(st, "mtp.pre_fc_norm_hidden", dim, &out->mtp_norm_hidden, err, errlen) ||
        load_matrix(st, "mtp.fc", dim, 2 * dim, &out->mtp_fc, err, errlen)) {
        model_weights_free(out);
        return -1;
    }
    out->bytes_per_token = layer_bytes(c, &out->layers[0]) + weight_matrix_bytes(&out->mtp_fc);
    if (model_weights_place(out, weights_memory_from_env(WEIGHTS_MEM_AUTO))) free_owned(out);
    return 0;
}
