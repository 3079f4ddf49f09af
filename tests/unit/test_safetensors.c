/* safetensors: a written file reads back exactly; sharded directories resolve through the index;
 * every kind of corrupt header is rejected with a message naming the file and the tensor; weights
 * copied into the huge-page arena are byte-identical to the mapped ones, and the mmap fallback
 * keeps the views on the file. A pipeline stage opens only the files holding its tensors, so a
 * node that downloaded just those loads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tiny_model.h"

#include "compute/backend.h"
#include "compute/cpu/cpu.h"
#include "model/safetensors.h"
#include "model/safetensors_write.h"

#include <unistd.h>

/* A file image: 8-byte length, header text, then data_len bytes of data. */
static uint8_t *image(const char *header, size_t data_len, size_t *len) {
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    return b;
}

static void expect_reject(const char *header, size_t data_len, const char *want1,
                          const char *want2) {
    size_t len;
    uint8_t *b = image(header, data_len, &len);
    char err[512] = "";
    safetensors_file *f = safetensors_parse(b, len, "bad.safetensors", err, sizeof err);
    if (f) fprintf(stderr, "accepted: %s\n", header);
    assert_null(f);
    assert_non_null(strstr(err, "bad.safetensors"));
    if (!strstr(err, want1) || (want2 && !strstr(err, want2)))
        fprintf(stderr, "message '%s' lacks '%s'/'%s'\n", err, want1, want2 ? want2 : "");
    assert_non_null(strstr(err, want1));
    if (want2) assert_non_null(strstr(err, want2));
    free(b);
}

static void test_valid_parse(void **s) {
    (void)s;
    size_t len;
    uint8_t *b = image("{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                       "\"empty\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[32,32]}}",
                       32, &len);
    char err[256];
    safetensors_file *f = safetensors_parse(b, len, "ok", err, sizeof err);
    assert_non_null(f);
    assert_int_equal(safetensors_count(f), 3);
    const safetensors_tensor *t = safetensors_find(f, "b");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_BF16);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->shape[0], 4);
    assert_int_equal(t->nbytes, 8);
    assert_ptr_equal(t->data, b + len - 8);
    assert_null(safetensors_find(f, "c"));
    safetensors_close(f);
    free(b);
}

static void test_corrupt_headers(void **s) {
    (void)s;
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "'w'",
                  "truncated");
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 16, "'w'",
                  "want 16");
    expect_reject("{\"w\":{\"dtype\":\"Q9\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "'w'",
                  "unknown dtype");
    expect_reject("{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"y\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 8, "overlap",
                  NULL);
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "'w'",
                  "shape");
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,4]}}", 16, "'w'",
                  "data_offsets");
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
                  "\"data_offsets\":[0,4]}}", 4, "'w'", NULL);
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                  "\"data_offsets\":[0,4]}}", 4, "'w'", "dims");
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "'w'", "data_offsets");
    expect_reject("{\"w\":[1,2]}", 4, "'w'", NULL);
    expect_reject("[1,2,3]", 0, "not a JSON object", NULL);
    expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "JSON",
                  NULL);
    expect_reject("{\"w\": {", 0, "JSON", NULL);
    /* header length beyond the file */
    uint8_t b[16] = {0xff, 0xff, 0xff, 0, 0, 0, 0, 0, '{', '}'};
    char err[256];
    assert_null(safetensors_parse(b, sizeof b, "bad.safetensors", err, sizeof err));
    assert_non_null(strstr(err, "header length"));
    assert_null(safetensors_parse(b, 5, "bad.safetensors", err, sizeof err));
    assert_non_null(strstr(err, "too short"));
}

static void test_write_read_and_shards(void **s) {
    (void)s;
    char dir[256], path[512], err[512];
    tiny_dir(dir, sizeof dir, "st");
    assert_int_equal(paths_mkdir_p(dir), 0);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4] = {1, 2, 3, 4};
    int64_t sa[2] = {2, 3}, sb[1] = {4};
    safetensors_writer *w1 = safetensors_writer_new(), *w2 = safetensors_writer_new();
    assert_int_equal(safetensors_writer_add(w1, "a", ST_F32, 2, sa, a, sizeof a), 0);
    assert_int_equal(safetensors_writer_add(w1, "a2", ST_F32, 2, sa, a, 5), -1); /* size lies */
    assert_int_equal(safetensors_writer_add(w2, "b", ST_BF16, 1, sb, b, sizeof b), 0);
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    assert_int_equal(safetensors_writer_save(w1, path, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(safetensors_writer_save(w2, path, err, sizeof err), 0);
    safetensors_writer_free(w1);
    safetensors_writer_free(w2);
    /* without an index: every .safetensors file */
    safetensors_set *set = safetensors_set_open(dir, err, sizeof err);
    assert_non_null(set);
    assert_int_equal(safetensors_set_count(set), 2);
    const safetensors_tensor *t = safetensors_set_find(set, "a");
    assert_non_null(t);
    assert_memory_equal(t->data, a, sizeof a);
    assert_non_null(strstr(t->file, "00001"));
    safetensors_set_close(set);
    /* with an index */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"metadata\":{},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
          "\"b\":\"model-00002-of-00002.safetensors\"}}", f);
    fclose(f);
    set = safetensors_set_open(dir, err, sizeof err);
    assert_non_null(set);
    t = safetensors_set_find(set, "b");
    assert_non_null(t);
    assert_memory_equal(t->data, b, sizeof b);
    safetensors_set_close(set);
    /* an index that lies about where a tensor is, or escapes the directory */
    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"a\":\"model-00002-of-00002.safetensors\"}}", f);
    fclose(f);
    assert_null(safetensors_set_open(dir, err, sizeof err));
    assert_non_null(strstr(err, "'a'"));
    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"a\":\"../../etc/passwd\"}}", f);
    fclose(f);
    assert_null(safetensors_set_open(dir, err, sizeof err));
    assert_non_null(strstr(err, "unsafe"));
    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"a\":\"missing.safetensors\"}}", f);
    fclose(f);
    assert_null(safetensors_set_open(dir, err, sizeof err));
    assert_non_null(strstr(err, "missing.safetensors"));
}

/* One tensor per file, written as model-<name>.safetensors and listed in the index. */
static void write_stage_model(const char *dir, const char *const *names, int n) {
    char path[512], err[256];
    float v[2] = {1, 2};
    int64_t shape[1] = {2};
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *index = fopen(path, "w");
    assert_non_null(index);
    fputs("{\"weight_map\":{", index);
    for (int i = 0; i < n; i++) {
        safetensors_writer *w = safetensors_writer_new();
        assert_int_equal(safetensors_writer_add(w, names[i], ST_F32, 1, shape, v, sizeof v), 0);
        snprintf(path, sizeof path, "%s/model-%s.safetensors", dir, names[i]);
        assert_int_equal(safetensors_writer_save(w, path, err, sizeof err), 0);
        safetensors_writer_free(w);
        fprintf(index, "%s\"%s\":\"model-%s.safetensors\"", i ? "," : "", names[i], names[i]);
    }
    fputs("}}", index);
    fclose(index);
}

static void remove_file(const char *dir, const char *tensor) {
    char path[512];
    snprintf(path, sizeof path, "%s/model-%s.safetensors", dir, tensor);
    assert_int_equal(unlink(path), 0);
}

static void test_stage_opens_only_its_files(void **s) {
    (void)s;
    char dir[256], err[512];
    tiny_dir(dir, sizeof dir, "stage");
    assert_int_equal(paths_mkdir_p(dir), 0);
    static const char *const names[] = {"model.embed_tokens.weight", "model.layers.0.w.weight",
                                        "model.layers.1.w.weight", "model.norm.weight",
                                        "lm_head.weight"};
    write_stage_model(dir, names, 5);
    /* the rule: layers by number, embedding first, norm and head last (tied: embedding too) */
    assert_true(safetensors_stage_needs("model.layers.1.w.weight", 2, 0, 1, 2));
    assert_false(safetensors_stage_needs("model.layers.0.w.weight", 2, 0, 1, 2));
    assert_false(safetensors_stage_needs("model.embed_tokens.weight", 2, 0, 1, 2));
    assert_true(safetensors_stage_needs("model.embed_tokens.weight", 2, 1, 1, 2));
    assert_true(safetensors_stage_needs("lm_head.weight", 2, 0, 1, 2));
    assert_false(safetensors_stage_needs("model.norm.weight", 2, 0, 0, 1));
    /* the last stage downloaded only its files: the first stage's are not on this node */
    remove_file(dir, "model.embed_tokens.weight");
    remove_file(dir, "model.layers.0.w.weight");
    safetensors_set *set = safetensors_set_open_stage(dir, 2, 0, 1, 2, err, sizeof err);
    assert_non_null(set);
    assert_int_equal(safetensors_set_count(set), 3);
    assert_non_null(safetensors_set_find(set, "lm_head.weight"));
    assert_null(safetensors_set_find(set, "model.layers.0.w.weight"));
    safetensors_set_close(set);
    /* the first stage, the whole model (0, 0) and a tied last stage need a missing file */
    assert_null(safetensors_set_open_stage(dir, 2, 0, 0, 1, err, sizeof err));
    assert_non_null(strstr(err, "model-model.")); /* names the missing file */
    assert_null(safetensors_set_open_stage(dir, 2, 0, 0, 0, err, sizeof err));
    assert_null(safetensors_set_open_stage(dir, 2, 1, 1, 2, err, sizeof err));
    assert_non_null(strstr(err, "embed_tokens"));
    assert_null(safetensors_set_open(dir, err, sizeof err));
}

static void test_weights_shape_errors(void **s) {
    (void)s;
    char dir[256], err[512];
    tiny_dir(dir, sizeof dir, "w");
    tiny_spec spec = {.arch = "LlamaForCausalLM", .vocab = 32, .dim = 32, .layers = 1, .heads = 2,
                      .kv_heads = 1, .head_dim = 16, .inter = 64, .dtype = ST_F16, .seed = 2};
    assert_int_equal(tiny_model_write(dir, &spec), 0);
    model_config c;
    assert_int_equal(model_config_load(dir, &c, err, sizeof err), 0);
    safetensors_set *set = safetensors_set_open(dir, err, sizeof err);
    assert_non_null(set);
    model_weights w;
    assert_int_equal(model_weights_load(set, &c, 0, 0, &w, err, sizeof err), 0);
    assert_int_equal(w.layers[0].wq.format, WEIGHT_F16);
    model_weights_free(&w);
    c.intermediate_size = 48; /* config disagrees with the file */
    assert_int_equal(model_weights_load(set, &c, 0, 0, &w, err, sizeof err), -1);
    assert_non_null(strstr(err, "mlp.gate_proj.weight"));
    assert_non_null(strstr(err, "[64, 32]"));
    c.intermediate_size = 64;
    assert_int_equal(model_weights_load(set, &c, 1, 2, &w, err, sizeof err), -1);
    assert_non_null(strstr(err, "layer range"));
    c.n_layers = 2; /* a layer the file lacks */
    assert_int_equal(model_weights_load(set, &c, 0, 0, &w, err, sizeof err), -1);
    assert_non_null(strstr(err, "model.layers.1."));
    safetensors_set_close(set);
}

/* Every view of a (the mapped load) and b (the same shard, placed) as pointer/length pairs. */
typedef struct view_bytes {
    const void *p;
    size_t n;
} view_bytes;

static int views_of(const weight_matrix *m, view_bytes *out) {
    if (!m->data) return 0;
    size_t n = (size_t)m->rows * (size_t)m->cols;
    if (m->format != WEIGHT_MLX_AFFINE) {
        out[0] = (view_bytes){m->data, n * (m->format == WEIGHT_F32 ? 4 : 2)};
        return 1;
    }
    size_t sb = n / (size_t)m->group_size * dtype_size(m->scale_dtype);
    out[0] = (view_bytes){m->data, n * (size_t)m->bits / 8};
    out[1] = (view_bytes){m->scales, sb};
    out[2] = (view_bytes){m->biases, sb};
    return 3;
}

static int repacked_views; /* views compare_matrix found in the 16-row interleaved layout */

/* Compares the bytes of matching views (the values of every row where b was repacked into the
 * 16-row interleaved layout); counts views whose pointers differ (copied). */
static int compare_matrix(const weight_matrix *a, const weight_matrix *b, int *moved) {
    view_bytes va[3], vb[3];
    int n = views_of(a, va);
    assert_int_equal(views_of(b, vb), n);
    assert_int_equal(a->layout, WEIGHT_LAYOUT_MLX);
    for (int i = 0; i < n; i++) {
        assert_int_equal(va[i].n, vb[i].n);
        if (b->layout == WEIGHT_LAYOUT_MLX) assert_memory_equal(va[i].p, vb[i].p, va[i].n);
        *moved += va[i].p != vb[i].p;
    }
    if (b->layout != WEIGHT_LAYOUT_MLX) {
        repacked_views++;
        float *x = malloc((size_t)a->cols * sizeof *x), *y = malloc((size_t)a->cols * sizeof *y);
        for (int64_t r = 0; r < a->rows; r++) {
            weight_matrix_row_to_f32(a, r, x);
            weight_matrix_row_to_f32(b, r, y);
            assert_memory_equal(x, y, (size_t)a->cols * sizeof *x);
        }
        free(x), free(y);
    }
    return n;
}

static int compare_weights(const model_weights *a, const model_weights *b, int n_experts, int *moved) {
    int views = 0;
    views += compare_matrix(&a->embed, &b->embed, moved);
    views += compare_matrix(&a->lm_head, &b->lm_head, moved);
    views += compare_matrix(&a->final_norm, &b->final_norm, moved);
    for (int i = 0; i < a->layer_end - a->layer_start; i++) {
        const layer_weights *x = &a->layers[i], *y = &b->layers[i];
        const weight_matrix *mx[] = {&x->attn_norm, &x->wq, &x->wk, &x->wv, &x->wo, &x->q_norm,
                                     &x->k_norm, &x->ffn_norm, &x->w_gate, &x->w_up, &x->w_down,
                                     &x->router};
        const weight_matrix *my[] = {&y->attn_norm, &y->wq, &y->wk, &y->wv, &y->wo, &y->q_norm,
                                     &y->k_norm, &y->ffn_norm, &y->w_gate, &y->w_up, &y->w_down,
                                     &y->router};
        for (size_t j = 0; j < sizeof mx / sizeof *mx; j++) views += compare_matrix(mx[j], my[j], moved);
        for (int e = 0; x->is_moe && e < n_experts; e++) {
            views += compare_matrix(&x->expert_gate[e], &y->expert_gate[e], moved);
            views += compare_matrix(&x->expert_up[e], &y->expert_up[e], moved);
            views += compare_matrix(&x->expert_down[e], &y->expert_down[e], moved);
        }
    }
    return views;
}

/* What engine_open does after loading: offers the matrices to the backend's prepare_weight. */
static int backend_prepare(weight_matrix *m, void *backend) {
    compute_backend *b = backend;
    return b->prepare_weight(b, m);
}

static void check_placement(const tiny_spec *spec, const char *name, int ls, int le) {
    char dir[256], err[512];
    tiny_dir(dir, sizeof dir, name);
    assert_int_equal(tiny_model_write(dir, spec), 0);
    model_config c;
    assert_int_equal(model_config_load(dir, &c, err, sizeof err), 0);
    safetensors_set *set = safetensors_set_open(dir, err, sizeof err);
    assert_non_null(set);
    setenv("EXO_WEIGHTS_MEM", "mmap", 1);
    model_weights mapped, placed;
    assert_int_equal(model_weights_load(set, &c, ls, le, &mapped, err, sizeof err), 0);
    assert_null(mapped.arena);
    assert_int_equal(mapped.copied_bytes, 0);
    assert_int_equal(model_weights_load(set, &c, ls, le, &placed, err, sizeof err), 0);
    /* AUTO with too little memory available: the views stay on the mmap. */
    assert_int_equal(model_weights_place_within(&placed, WEIGHTS_MEM_AUTO, 1000, 0), 0);
    assert_null(placed.arena);
    int moved = 0;
    int views = compare_weights(&mapped, &placed, c.n_experts, &moved);
    assert_true(views > 0);
    assert_int_equal(moved, 0);
    /* AUTO with room: copied, every view moved, bytes identical. */
    assert_int_equal(model_weights_place_within(&placed, WEIGHTS_MEM_AUTO, (size_t)1 << 34, 0), 1);
    assert_non_null(placed.arena);
    assert_true(placed.copied_bytes > 0);
    /* Sources freed after the copy (a GGUF file's converted tensors): a copy that needs more than
     * half of MemAvailable but replaces as many bytes the caller then frees is made, as long as
     * it fits at all. */
    size_t t = placed.copied_bytes, room = t + t / 4 + 4096; /* more than the copy, under 2x */
    model_weights again;
    assert_int_equal(model_weights_load(set, &c, ls, le, &again, err, sizeof err), 0);
    assert_int_equal(model_weights_place_within(&again, WEIGHTS_MEM_AUTO, room, 0), 0);
    assert_int_equal(model_weights_place_within(&again, WEIGHTS_MEM_AUTO, t / 2, t), 0); /* no fit */
    assert_int_equal(model_weights_place_within(&again, WEIGHTS_MEM_AUTO, room, t), 1);
    assert_int_equal(again.copied_bytes, t);
    model_weights_free(&again);
    assert_int_equal(model_weights_place(&placed, WEIGHTS_MEM_COPY), 1); /* idempotent */
    compute_backend *be = compute_backend_cpu(0);
    assert_non_null(be);
    assert_int_equal(model_weights_rewrite(&mapped, backend_prepare, be), 0); /* mmap: as published */
    size_t rewritten = model_weights_rewrite(&placed, backend_prepare, be);
    be->destroy(be);
    moved = 0;
    repacked_views = 0;
    assert_int_equal(compare_weights(&mapped, &placed, c.n_experts, &moved), views);
    assert_int_equal(moved, views);
    for (int i = 0; i < placed.layer_end - placed.layer_start; i++) {
        const char *p = placed.layers[i].wq.data;
        assert_true(p >= (const char *)placed.arena && p < (const char *)placed.arena + placed.arena_len);
    }
    if (spec->tie && placed.has_head) {
        assert_ptr_equal(placed.lm_head.data, placed.embed.data);
        assert_int_equal(placed.lm_head.layout, placed.embed.layout); /* one matrix, one layout */
        assert_ptr_equal(placed.lm_head.scales, placed.embed.scales);
        assert_ptr_equal(placed.lm_head.biases, placed.embed.biases);
        assert_int_equal(placed.lm_head.group_stride, placed.embed.group_stride);
    }
    /* Which 4-bit matrices were interleaved: those the AVX-512 kernels prefer (128-multiple
     * columns, >= 16 rows), the untied embedding (row lookups only) never. */
    for (int i = 0; i < placed.layer_end - placed.layer_start; i++) {
        const layer_weights *l = &placed.layers[i], *m = &mapped.layers[i];
        if (!l->is_moe)
            assert_int_equal(l->w_down.layout == WEIGHT_LAYOUT_MLX_ROWS16, cpu_weight_prefers_rows16(&m->w_down));
        /* 8-bit: scales and biases inline where a checkpoint's three tensors lay side by side (a
         * dense matrix), apart in a slice of stacked experts (layout.c) */
        if (!l->is_moe && l->w_down.layout == WEIGHT_LAYOUT_MLX_ROWS16)
            assert_int_equal(l->w_down.group_stride != 0, l->w_down.bits == 8);
        for (int e = 0; l->is_moe && e < c.n_experts; e++) {
            assert_int_equal(l->expert_down[e].layout == WEIGHT_LAYOUT_MLX_ROWS16,
                             cpu_weight_prefers_rows16(&m->expert_down[e]));
            assert_int_equal(l->expert_down[e].group_stride, 0);
        }
    }
    if (!spec->tie && placed.has_embed) assert_int_equal(placed.embed.layout, WEIGHT_LAYOUT_MLX);
    if (placed.has_head)
        assert_int_equal(placed.lm_head.layout == WEIGHT_LAYOUT_MLX_ROWS16, cpu_weight_prefers_rows16(&mapped.lm_head));
    assert_int_equal(rewritten > 0, repacked_views > 0);
    assert_int_equal(placed.rewritten_bytes, rewritten);
    /* The copy holds only this shard's bytes: a later stage copies less than the whole model. */
    if (ls > 0) {
        model_weights all;
        unsetenv("EXO_WEIGHTS_MEM");
        assert_int_equal(model_weights_load(set, &c, 0, 0, &all, err, sizeof err), 0);
        assert_int_equal(model_weights_place(&all, WEIGHTS_MEM_COPY), 1);
        assert_true(placed.copied_bytes < all.copied_bytes);
        model_weights_free(&all);
    }
    unsetenv("EXO_WEIGHTS_MEM");
    model_weights_free(&mapped);
    model_weights_free(&placed);
    assert_null(placed.arena);
    safetensors_set_close(set);
}

static void test_weights_placement(void **s) {
    (void)s;
    tiny_spec dense = {.arch = "LlamaForCausalLM", .vocab = 40, .dim = 32, .layers = 2, .heads = 2,
                       .kv_heads = 1, .head_dim = 16, .inter = 64, .dtype = ST_BF16, .tie = 1,
                       .seed = 5};
    check_placement(&dense, "place_dense", 0, 0);
    tiny_spec moe = {.arch = "Qwen3MoeForCausalLM", .vocab = 48, .dim = 64, .layers = 2, .heads = 2,
                     .kv_heads = 1, .head_dim = 32, .inter = 64, .experts = 4, .topk = 2,
                     .moe_inter = 32, .norm_topk = 1, .stacked_experts = 1, .quant_bits = 4,
                     .group_size = 32, .dtype = ST_BF16, .seed = 6};
    check_placement(&moe, "place_moe", 0, 0);
    check_placement(&moe, "place_moe_stage", 1, 2);
    /* 4-bit with 128-multiple columns: interleaved where AVX-512 is in use; tied (the embedding
     * is the lm_head, 40 rows: two blocks and 8 rows in MLX order) and untied, stacked experts
     * (one expert's rows are its own blocks), and a last stage alone. */
    tiny_spec q4 = {.arch = "Qwen3ForCausalLM", .vocab = 40, .dim = 128, .layers = 2, .heads = 2,
                    .kv_heads = 1, .head_dim = 64, .inter = 256, .quant_bits = 4, .group_size = 64,
                    .dtype = ST_BF16, .tie = 1, .seed = 7};
    check_placement(&q4, "place_q4_tied", 0, 0);
    check_placement(&q4, "place_q4_tied_stage", 1, 2);
    q4.tie = 0;
    check_placement(&q4, "place_q4", 0, 0);
    tiny_spec q4moe = moe;
    q4moe.dim = 128, q4moe.moe_inter = 128, q4moe.inter = 128, q4moe.experts = 3;
    check_placement(&q4moe, "place_q4_moe", 0, 0);
    /* 8-bit (48 rows of vocab: whole blocks): scales inline, the tied embedding looking its rows
     * up in the moved bytes; stacked experts keep them apart. */
    tiny_spec q8 = q4;
    q8.quant_bits = 8, q8.vocab = 48, q8.tie = 1;
    check_placement(&q8, "place_q8_tied", 0, 0);
    check_placement(&q8, "place_q8_tied_stage", 1, 2);
    tiny_spec q8moe = q4moe;
    q8moe.quant_bits = 8;
    check_placement(&q8moe, "place_q8_moe", 0, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_parse),
        cmocka_unit_test(test_corrupt_headers),
        cmocka_unit_test(test_write_read_and_shards),
        cmocka_unit_test(test_stage_opens_only_its_files),
        cmocka_unit_test(test_weights_shape_errors),
        cmocka_unit_test(test_weights_placement),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tiny_cleanup();
    return rc;
}
