/* GGUF: the reader accepts what llama.cpp writes and rejects every kind of corrupt header with a
 * message naming the file and the key or tensor (truncation at every byte included); every block
 * format dequantizes within its quantization error and converts to MLX groups that hold the same
 * values; a GGUF model written by mkmodel runs to the same logits as its safetensors twin (exact
 * for F32, within the type's error for the quantized types) for llama (q/k rows permuted by
 * llama.cpp), qwen2 (biases), qwen3 (q/k norms) and qwen3-moe (stacked experts); its tokenizer
 * encodes like the tokenizer.json it came from, and its chat template is the model's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tiny_model.h"

#include "compute/backend.h"
#include "compute/cpu/matmul_amx.h"
#include "compute/device.h"
#include "infer/kv_cache.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/gguf_quant.h"
#include "model/gguf_tokenizer.h"
#include "model/model_config.h"
#include "runner/model_text.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <sys/stat.h>

/* ---- an in-memory GGUF image ---- */

typedef struct img {
    uint8_t *b;
    size_t n, cap;
} img;

static void put(img *m, const void *p, size_t n) {
    while (m->n + n > m->cap) {
        m->cap = m->cap ? m->cap * 2 : 256;
        m->b = realloc(m->b, m->cap);
    }
    memcpy(m->b + m->n, p, n);
    m->n += n;
}
static void u32(img *m, uint32_t v) { put(m, &v, 4); }
static void u64(img *m, uint64_t v) { put(m, &v, 8); }
static void str(img *m, const char *s) {
    u64(m, strlen(s));
    put(m, s, strlen(s));
}

/* A valid file: 3 metadata keys, tensors "a" (F32 [4][2]) and "b" (Q8_0 [32]). */
static img valid_image(void) {
    img m = {0};
    put(&m, "GGUF", 4);
    u32(&m, 3);
    u64(&m, 2);
    u64(&m, 3);
    str(&m, "general.architecture"), u32(&m, GGUF_STRING), str(&m, "llama");
    str(&m, "llama.block_count"), u32(&m, GGUF_U32), u32(&m, 7);
    str(&m, "tokenizer.ggml.tokens"), u32(&m, GGUF_ARRAY), u32(&m, GGUF_STRING), u64(&m, 2);
    str(&m, "hi"), str(&m, "there");
    str(&m, "a"), u32(&m, 2), u64(&m, 4), u64(&m, 2), u32(&m, GGML_TYPE_F32), u64(&m, 0);
    str(&m, "b"), u32(&m, 1), u64(&m, 32), u32(&m, GGML_TYPE_Q8_0), u64(&m, 32);
    while (m.n % 32) put(&m, "", 1);
    for (int i = 0; i < 8; i++) {
        float v = (float)i;
        put(&m, &v, 4);
    }
    uint8_t q8[34] = {0x00, 0x3c}; /* d = 1.0 */
    for (int i = 0; i < 32; i++) q8[2 + i] = (uint8_t)(i - 16);
    put(&m, q8, sizeof q8);
    return m;
}

static void test_valid_parse(void **s) {
    (void)s;
    img m = valid_image();
    char err[256];
    gguf_file *f = gguf_parse(m.b, m.n, "ok.gguf", err, sizeof err);
    assert_non_null(f);
    assert_int_equal(gguf_version(f), 3);
    int64_t blocks;
    char arch[16];
    assert_int_equal(gguf_get_int(f, "llama.block_count", &blocks, err, sizeof err), 0);
    assert_int_equal(blocks, 7);
    assert_int_equal(gguf_get_string(f, "general.architecture", arch, sizeof arch, err, sizeof err), 0);
    assert_string_equal(arch, "llama");
    assert_int_equal(gguf_get_string(f, "llama.block_count", arch, sizeof arch, err, sizeof err), -1);
    assert_non_null(strstr(err, "is a u32, expected a string"));
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    gguf_str t1 = gguf_array_string(f, toks, 1);
    assert_int_equal(t1.len, 5);
    assert_memory_equal(t1.ptr, "there", 5);
    const gguf_tensor *a = gguf_find_tensor(f, "a"), *b = gguf_find_tensor(f, "b");
    assert_non_null(a);
    assert_int_equal(a->ne[0], 4);
    assert_int_equal(a->ne[1], 2);
    assert_int_equal(((const float *)a->data)[5], 5.0f);
    float row[32];
    assert_int_equal(gguf_dequantize_row(b->type, b->data, 32, row), 0);
    assert_true(row[0] == -16.0f && row[31] == 15.0f);
    assert_null(gguf_find_tensor(f, "c"));
    gguf_close(f);
    free(m.b);
}

/* Every proper prefix of a valid file is rejected (no reads past the end), with a message. */
static void test_truncation_everywhere(void **s) {
    (void)s;
    img m = valid_image();
    for (size_t n = 0; n < m.n; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, m.b, n);
        char err[256] = "";
        gguf_file *f = gguf_parse(copy, n, "cut.gguf", err, sizeof err);
        if (f) fprintf(stderr, "accepted a file cut at %zu of %zu bytes\n", n, m.n);
        assert_null(f);
        assert_non_null(strstr(err, "cut.gguf"));
        free(copy);
    }
    free(m.b);
}

/* Patches 4 or 8 bytes at `at` of a valid image and expects a rejection mentioning `want`. */
static void expect_patch_reject(size_t at, uint64_t value, int width, const char *want) {
    img m = valid_image();
    memcpy(m.b + at, &value, (size_t)width);
    char err[256] = "";
    gguf_file *f = gguf_parse(m.b, m.n, "bad.gguf", err, sizeof err);
    if (f || !strstr(err, want)) fprintf(stderr, "patch at %zu: '%s' lacks '%s'\n", at, err, want);
    assert_null(f);
    assert_non_null(strstr(err, want));
    free(m.b);
}

static void test_corrupt_headers(void **s) {
    (void)s;
    img m = valid_image();
    /* offsets into valid_image(): the header, then key 1 at 24 */
    size_t kv1_type = 24 + 8 + strlen("general.architecture");
    size_t tensor_a = m.n - 32 - 34 - 2; /* found below by searching for the name instead */
    (void)tensor_a;
    size_t a_at = 0;
    for (size_t i = 0; i + 9 < m.n; i++)
        if (!memcmp(m.b + i, "\x01\0\0\0\0\0\0\0a", 9)) a_at = i;
    assert_true(a_at > 0);
    size_t a_dims = a_at + 9, a_type = a_dims + 4 + 16, a_off = a_type + 4;
    free(m.b);
    expect_patch_reject(0, 0x46554746, 4, "not a GGUF file");       /* magic */
    expect_patch_reject(4, 1, 4, "version 1");                        /* version */
    expect_patch_reject(8, 1u << 30, 8, "too many");                  /* tensor count */
    expect_patch_reject(kv1_type, 99, 4, "unknown value type 99");
    expect_patch_reject(a_dims, 5, 4, "has 5 dims");
    expect_patch_reject(a_type, 77, 4, "ggml type 77");
    expect_patch_reject(a_type, GGML_TYPE_Q4_0, 4, "not a multiple of its block");
    expect_patch_reject(a_off, 8, 8, "not aligned");
    expect_patch_reject(a_off, 1 << 20, 8, "past the end");
    expect_patch_reject(a_off, 32, 8, "overlap");                     /* a onto b */
    expect_patch_reject(a_dims + 4, 0, 8, "empty or too large");       /* ne[0] = 0 */
}

static void test_duplicates_rejected(void **s) {
    (void)s;
    img m = {0};
    put(&m, "GGUF", 4), u32(&m, 2), u64(&m, 0), u64(&m, 2);
    str(&m, "k"), u32(&m, GGUF_U8), put(&m, "\1", 1);
    str(&m, "k"), u32(&m, GGUF_U8), put(&m, "\2", 1);
    char err[256] = "";
    assert_null(gguf_parse(m.b, m.n, "dup.gguf", err, sizeof err));
    assert_non_null(strstr(err, "'k' appears twice"));
    free(m.b);
}

/* ---- block formats ---- */

static const uint32_t all_types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                     GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
                                     GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_F16,  GGML_TYPE_BF16,
                                     GGML_TYPE_F32};

/* The worst error of each format relative to a row's largest magnitude (steps of ~2/15, 2/31,
 * 2/255 of the range, plus the 6-bit sub-scales of the K formats). */
static double tolerance(uint32_t t) {
    switch (t) {
    case GGML_TYPE_Q2_K: return 0.45; /* 4 levels per 16 values, 4-bit sub-scales and mins */
    case GGML_TYPE_Q3_K: return 0.3;  /* 8 levels, clamped like Q4_0 opposite the largest value */
    case GGML_TYPE_Q4_0: return 0.13; /* ggml's Q4_0 clamps the side opposite the largest value */
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q4_K: return 0.12;
    case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: return 0.06;
    case GGML_TYPE_Q8_0: return 0.01;
    case GGML_TYPE_F16: return 1e-3;
    case GGML_TYPE_BF16: return 8e-3;
    default: return 0;
    }
}

static void test_blocks_round_trip(void **s) {
    (void)s;
    enum { N = 512 };
    float x[N], y[N], z[N];
    tiny_rng_state = 11;
    for (int i = 0; i < N; i++) x[i] = tiny_uniform() * (i < 256 ? 1.0f : 0.01f); /* two scales */
    uint8_t block_buf[N * 4];
    for (size_t k = 0; k < sizeof all_types / sizeof *all_types; k++) {
        uint32_t t = all_types[k];
        assert_int_equal(gguf_quantize_row(t, x, N, block_buf), 0);
        assert_int_equal(gguf_dequantize_row(t, block_buf, N, y), 0);
        for (int half = 0; half < 2; half++) { /* each half against its own magnitude */
            double amax = half ? 0.01 : 1.0, worst = 0;
            for (int i = half * 256; i < half * 256 + 256; i++)
                worst = fmax(worst, fabs(x[i] - y[i]) / amax);
            if (worst > tolerance(t)) fprintf(stderr, "%s: error %.4f of the range\n", ggml_type_name(t), worst);
            assert_true(worst <= tolerance(t));
        }
        int bits = gguf_mlx_bits(t);
        if (bits <= 0) continue;
        /* the MLX view of the row holds the block's values (Q6_K, Q2_K: requantized at 8 bits;
         * Q3_K exactly, at 8 bits with the zero point) */
        uint32_t words[N];
        float sb[2 * N / 32];
        uint16_t sc16[N / 32], bi16[N / 32];
        assert_int_equal(gguf_row_to_mlx(t, block_buf, N, words, sb, sb + N / 32), 0);
        for (int g = 0; g < N / 32; g++) sc16[g] = f32_to_f16(sb[g]), bi16[g] = f32_to_f16(sb[N / 32 + g]);
        weight_matrix w = {.format = WEIGHT_MLX_AFFINE, .rows = 1, .cols = N, .data = words,
                           .scales = sc16, .biases = bi16, .scale_dtype = DTYPE_F16, .bits = bits,
                           .group_size = 32};
        weight_matrix_row_to_f32(&w, 0, z);
        for (int i = 0; i < N; i++) {
            double amax = i < 256 ? 1.0 : 0.01;
            double tol = t == GGML_TYPE_Q6_K || t == GGML_TYPE_Q2_K ? 0.01 : 2e-3;
            if (fabs(z[i] - y[i]) > tol * amax)
                fprintf(stderr, "%s value %d: mlx %g, gguf %g\n", ggml_type_name(t), i, z[i], y[i]);
            assert_true(fabs(z[i] - y[i]) <= tol * amax);
        }
    }
    /* a NaN super-scale (a corrupt file): the requantized types convert without undefined
     * behaviour (casting a NaN to uint8_t was one: clang's -fsanitize=undefined, as in make
     * fuzz, reports it; gcc's does not check float casts) */
    static const struct { uint32_t type; size_t d_at; } nan_d[] = {{GGML_TYPE_Q2_K, 80}, {GGML_TYPE_Q6_K, 208}};
    for (size_t k = 0; k < sizeof nan_d / sizeof *nan_d; k++) {
        uint32_t words[64];
        float sb[16];
        assert_int_equal(gguf_quantize_row(nan_d[k].type, x, 256, block_buf), 0);
        block_buf[nan_d[k].d_at] = 0x00, block_buf[nan_d[k].d_at + 1] = 0x7e; /* F16 NaN */
        assert_int_equal(gguf_row_to_mlx(nan_d[k].type, block_buf, 256, words, sb, sb + 8), 0);
    }
    assert_int_equal(gguf_mlx_bits(GGML_TYPE_Q8_K), -1);
    assert_int_equal(gguf_dequantize_row(GGML_TYPE_Q8_K, block_buf, 256, y), -1);
}

/* ---- whole models: GGUF vs its safetensors twin ---- */

static char tmp_root[64];

static int mkmodel(const char *name, const char *args) {
    const char *build = getenv("EXO_BUILD");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/tools/mkmodel --out %s/%s %s >%s/%s.log 2>&1", build ? build : "build",
             tmp_root, name, args, tmp_root, name);
    return system(cmd) == 0 ? 0 : -1;
}

static int setup(void **s) {
    (void)s;
    snprintf(tmp_root, sizeof tmp_root, "/tmp/exo-test-gguf-XXXXXX");
    return mkdtemp(tmp_root) ? 0 : -1;
}

static int teardown(void **s) {
    (void)s;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    return system(cmd);
}

/* Whether forward_logits lets the backend rewrite the weights as the engine does
 * (prepare_weight: the CPU's 16-row interleaved layout, which the AMX tiles read). */
static int prepare_like_engine;

static int prepare_weight(weight_matrix *m, void *backend) {
    compute_backend *b = backend;
    return b->prepare_weight(b, m);
}

/* Teacher-forced logits of every position of ids through the model at dir (malloc'd). */
static float *forward_logits(const char *dir, const int32_t *ids, int n, int *vocab) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s", tmp_root, dir);
    model_config c;
    int rc = model_config_load(path, &c, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    safetensors_set *set = safetensors_set_open(path, err, sizeof err);
    if (!set) fprintf(stderr, "%s\n", err);
    assert_non_null(set);
    model_weights w;
    rc = model_weights_load(set, &c, 0, 0, &w, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    compute_backend *be = compute_backend_open(COMPUTE_DEVICE_CPU, 1, err, sizeof err);
    assert_non_null(be);
    if (prepare_like_engine && be->prepare_weight) model_weights_rewrite(&w, prepare_weight, be);
    transformer *t = transformer_create(&c, &w, be, 64, 64, err, sizeof err);
    assert_non_null(t);
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)c.vocab_size);
    int32_t tok[64], pos[64], seq[64], slots[64], rows[64], table[4], start = 0;
    for (int i = 0; i < n; i++) tok[i] = ids[i], pos[i] = slots[i] = rows[i] = i, seq[i] = 0;
    for (int i = 0; i < 4; i++) table[i] = i;
    kv_cache *kv = kv_cache_create(be, c.n_layers, (int64_t)c.n_kv_heads * c.head_dim, 16, 4, DTYPE_F32,
                                   err, sizeof err);
    transformer_batch b = {.n_tokens = n, .tokens = tok, .positions = pos, .seq_of_token = seq,
                           .slots = slots, .n_seqs = 1, .block_table_start = &start,
                           .block_tables = table, .n_block_entries = 4, .n_logits = n,
                           .logit_rows = rows};
    assert_int_equal(transformer_forward(t, kv->layers, 16, &b, logits, err, sizeof err), 0);
    kv_cache_destroy(kv);
    transformer_destroy(t);
    be->destroy(be);
    model_weights_free(&w);
    safetensors_set_close(set);
    *vocab = c.vocab_size;
    return logits;
}

/* Max |logit difference| between two models over a fixed prompt, relative to the logits' spread.
 * 16 tokens: a prompt of 16 or more runs the prefill matmuls on the AMX tiles where the CPU has
 * them (compute/cpu/matmul_amx.h), fewer on the VNNI passes. */
static double logit_gap(const char *a, const char *b) {
    static const int32_t ids[] = {1, 17, 300, 4000, 55, 901, 12, 7, 2048, 3,
                                  4999, 256, 88, 1024, 9, 777};
    int n = (int)(sizeof ids / sizeof *ids), va, vb;
    float *la = forward_logits(a, ids, n, &va), *lb = forward_logits(b, ids, n, &vb);
    assert_int_equal(va, vb);
    double worst = 0, spread = 0;
    for (size_t i = 0; i < (size_t)n * (size_t)va; i++) {
        worst = fmax(worst, fabs(la[i] - lb[i]));
        spread = fmax(spread, fabs(la[i]));
    }
    free(la);
    free(lb);
    return worst / spread;
}

/* Writes a copy of the GGUF at src with every tensor dequantized to F32 (gguf_dequantize_row:
 * the plain reference decoder, not the MLX conversion the engine runs), metadata verbatim. */
static void write_dequantized(const char *src, const char *dst) {
    char err[256];
    gguf_file *f = gguf_open(src, err, sizeof err);
    assert_non_null(f);
    img m = {0};
    put(&m, "GGUF", 4), u32(&m, 3), u64(&m, (uint64_t)gguf_tensor_count(f)), u64(&m, (uint64_t)gguf_kv_count(f));
    static const size_t scalar_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    for (int i = 0; i < gguf_kv_count(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        u64(&m, kv->key.len), put(&m, kv->key.ptr, kv->key.len), u32(&m, kv->type);
        if (kv->type == GGUF_STRING) u64(&m, kv->str.len), put(&m, kv->str.ptr, kv->str.len);
        else if (kv->type != GGUF_ARRAY) {
            uint64_t raw = kv->num.u;
            if (kv->type == GGUF_F32) {
                float x = (float)kv->num.f;
                memcpy(&raw, &x, 4);
            } else if (kv->type == GGUF_F64) memcpy(&raw, &kv->num.f, 8);
            put(&m, &raw, scalar_size[kv->type]);
        } else {
            u32(&m, kv->elem_type), u64(&m, kv->n_elems);
            if (kv->elem_type != GGUF_STRING) put(&m, kv->elems, kv->n_elems * scalar_size[kv->elem_type]);
            else
                for (uint64_t j = 0; j < kv->n_elems; j++) {
                    gguf_str e = gguf_array_string(f, kv, j);
                    u64(&m, e.len), put(&m, e.ptr, e.len);
                }
        }
    }
    uint64_t off = 0;
    for (int i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        str(&m, t->name), u32(&m, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) u64(&m, (uint64_t)t->ne[d]);
        u32(&m, GGML_TYPE_F32), u64(&m, off);
        off += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]) * 4; /* multiples of 32 bytes */
    }
    while (m.n % 32) put(&m, "", 1);
    for (int i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        size_t row_bytes = t->nbytes / (size_t)rows;
        float *row = malloc((size_t)t->ne[0] * 4);
        for (int64_t r = 0; r < rows; r++) {
            assert_int_equal(gguf_dequantize_row(t->type, (const char *)t->data + (size_t)r * row_bytes, t->ne[0], row), 0);
            put(&m, row, (size_t)t->ne[0] * 4);
        }
        free(row);
    }
    FILE *fp = fopen(dst, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(m.b, 1, m.n, fp), m.n);
    fclose(fp);
    free(m.b);
    gguf_close(f);
}

/* K-quants need rows of 256: every model here is 256 wide. */
#define SHAPE "--hidden 256 --intermediate 512 --heads 4 --kv-heads 2 --head-dim 64 --layers 2 --vocab 5000 --seed 3"

/* only: the GGUF types to try, space-separated with spaces around (NULL: all). The conversions do not depend on the family, the
 * names, biases, norms and experts do: llama runs every type, the others a few. */
static void check_family(const char *arch, const char *extra, const char *only) {
    char args[512], st[64], g[64];
    int moe = strstr(arch, "moe") != NULL;
    snprintf(st, sizeof st, "%s-st", arch);
    snprintf(args, sizeof args, "--arch %s %s --dtype f32 --tokenizer none " SHAPE, arch, extra);
    assert_int_equal(mkmodel(st, args), 0);
    static const struct {
        const char *type;
        double tol; /* of the logits' largest magnitude: ~0.02 at 8 bits, x2 per bit less */
    } types[] = {{"F32", 1e-5}, {"F16", 5e-3}, {"BF16", 5e-2}, {"Q8_0", 4e-2}, {"Q6_K", 0.15},
                 {"Q5_K", 0.3}, {"Q5_0", 0.3}, {"Q4_K", 0.6}, {"Q4_0", 0.6}, {"Q4_1", 0.6},
                 {"Q4_K_M", 0.6}, {"Q3_K", 1.2}, {"Q2_K", 2.4}};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        char padded[16];
        snprintf(padded, sizeof padded, " %s ", types[i].type);
        if (only && !strstr(only, padded)) continue;
        snprintf(g, sizeof g, "%s-%s", arch, types[i].type);
        snprintf(args, sizeof args, "--arch %s %s --gguf %s --tokenizer none " SHAPE, arch, extra,
                 types[i].type);
        assert_int_equal(mkmodel(g, args), 0);
        /* the engine's conversion + kernels against the reference decoder: tight, whatever the type */
        char src[256], dq[80], dst[256];
        snprintf(dq, sizeof dq, "%s-dq", g);
        snprintf(src, sizeof src, "%s/%s/model.gguf", tmp_root, g);
        snprintf(dst, sizeof dst, "%s/%s", tmp_root, dq);
        assert_int_equal(mkdir(dst, 0755), 0);
        strcat(dst, "/model.gguf");
        write_dequantized(src, dst);
        double exact = logit_gap(dq, g);
        /* against the f32 twin: the type's own quantization error (dense families only: a MoE
         * router's top-k flips with it, which no tolerance describes) */
        double gap = moe ? 0 : logit_gap(st, g);
        printf("%-10s %-7s logits within %.1e of its dequantized copy", arch, types[i].type, exact);
        if (!moe) printf(", %.1e of the f32 twin (tolerance %.0e)", gap, types[i].tol);
        printf("\n");
        /* F16 scales of the MLX groups (2^-11); Q6_K's 8-bit requantization (up to 1/8 of a Q6_K
         * step per value: enough to flip a random MoE router's top-k, so not held to it there) */
        int requantized = !strcmp(types[i].type, "Q6_K") || !strcmp(types[i].type, "Q4_K_M") ||
                          !strcmp(types[i].type, "Q2_K");
        if (requantized) assert_true(moe || exact <= 0.03);
        else assert_true(exact <= 5e-3);
        assert_true(gap <= types[i].tol);
    }
}

/* A prompt of 48 tokens through weights laid out as the engine lays them out (the prefill then runs
 * on the AMX tiles, CPU_AMX_MIN_TOKENS, where the CPU has them): the logits of every position
 * within the bounds the 10-token test holds of the copy dequantized to F32. With 3 products
 * (activations split hi + lo, EXO_AMX_PRODUCTS=3) within 1e-3 of the logits' spread of the
 * AVX-512 passes (whose int16 activations put them ~2e-4 from that copy; the tiles ~5e-5); with
 * the default 2 (activations one bf16) within 1.5e-2. Skipped without AMX (the passes run). */
static void test_amx_prefill_matches_passes(void **s) {
    (void)s;
    cpu_amx_set_enabled(1);
    int amx = cpu_amx_available();
    cpu_amx_set_enabled(-1);
    if (!amx) {
        printf("no AMX on this CPU: nothing to compare\n");
        skip();
    }
    int32_t ids[48];
    for (int i = 0; i < 48; i++) ids[i] = (int32_t)((i * 7919 + 13) % 5000);
    const char *types[] = {"Q4_0", "Q8_0", "Q4_K_M"};
    for (size_t i = 0; i < 3; i++) {
        char g[64], args[512], dq[80], src[256], dst[256];
        snprintf(g, sizeof g, "amx-%s", types[i]);
        snprintf(args, sizeof args, "--arch llama --gguf %s --tokenizer none " SHAPE, types[i]);
        assert_int_equal(mkmodel(g, args), 0);
        snprintf(dq, sizeof dq, "%s-dq", g);
        snprintf(src, sizeof src, "%s/%s/model.gguf", tmp_root, g);
        snprintf(dst, sizeof dst, "%s/%s", tmp_root, dq);
        assert_int_equal(mkdir(dst, 0755), 0);
        strcat(dst, "/model.gguf");
        write_dequantized(src, dst);
        int v[4];
        prepare_like_engine = 1;
        cpu_amx_set_enabled(1);
        cpu_amx_set_products(3);
        float *on = forward_logits(g, ids, 48, &v[0]);
        cpu_amx_set_products(2);
        float *on2 = forward_logits(g, ids, 48, &v[3]);
        cpu_amx_set_products(-1);
        cpu_amx_set_enabled(0);
        float *off = forward_logits(g, ids, 48, &v[1]);
        cpu_amx_set_enabled(-1);
        prepare_like_engine = 0;
        float *ref = forward_logits(dq, ids, 48, &v[2]);
        assert_int_equal(v[0], v[1]);
        assert_int_equal(v[0], v[2]);
        assert_int_equal(v[0], v[3]);
        double spread = 0, d_off = 0, d_ref = 0, d_off_ref = 0, d2_off = 0, d2_ref = 0;
        for (size_t k = 0; k < (size_t)48 * (size_t)v[0]; k++) {
            spread = fmax(spread, fabs(off[k]));
            d_off = fmax(d_off, fabs(on[k] - off[k]));
            d_ref = fmax(d_ref, fabs(on[k] - ref[k]));
            d_off_ref = fmax(d_off_ref, fabs(off[k] - ref[k]));
            d2_off = fmax(d2_off, fabs(on2[k] - off[k]));
            d2_ref = fmax(d2_ref, fabs(on2[k] - ref[k]));
        }
        printf("%-7s 48-token prefill: AMX tiles, 3 products, within %.1e of the dequantized copy (AVX-512 passes: "
               "%.1e), %.1e of the passes; 2 products (bf16 activations) %.1e and %.1e\n", types[i], d_ref / spread,
               d_off_ref / spread, d_off / spread, d2_ref / spread, d2_off / spread);
        assert_true(d_off > 0 && d2_off > 0); /* the tiles did run */
        assert_true(d_off <= 1e-3 * spread);
        assert_true(d_ref <= (strcmp(types[i], "Q4_K_M") ? 5e-3 : 0.03) * spread);
        /* bf16 activations (8 significant bits, per value): ~6e-3 of the spread measured, under the
         * 1.6-2.9e-2 that llama.cpp's 8-bit activations stand from exo (test_llamacpp_logits) */
        assert_true(d2_off <= 1.5e-2 * spread);
        assert_true(d2_ref <= (strcmp(types[i], "Q4_K_M") ? 1.5e-2 : 0.03) * spread);
        free(on), free(on2), free(off), free(ref);
    }
}

/* The symmetric types reach the kernels with their zero point (weight_matrix.zero_point: the
 * matvec then derives the biases instead of streaming them), and every stored bias is exactly
 * -zero_point * scale, the promise that lets it; types with real offsets carry none. */
static void test_zero_point_of_symmetric_types(void **s) {
    (void)s;
    static const struct {
        const char *type;
        int zero_point;
    } cases[] = {{"Q4_0", 8}, {"Q5_0", 16}, {"Q8_0", 128}, {"Q4_1", 0}, {"Q4_K", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[64], args[512], path[512], err[512];
        snprintf(name, sizeof name, "zp-%s", cases[i].type);
        snprintf(args, sizeof args, "--arch llama --gguf %s --tokenizer none " SHAPE, cases[i].type);
        assert_int_equal(mkmodel(name, args), 0);
        snprintf(path, sizeof path, "%s/%s", tmp_root, name);
        model_config c;
        assert_int_equal(model_config_load(path, &c, err, sizeof err), 0);
        safetensors_set *set = safetensors_set_open(path, err, sizeof err);
        assert_non_null(set);
        model_weights w;
        assert_int_equal(model_weights_load(set, &c, 0, 0, &w, err, sizeof err), 0);
        const weight_matrix *ms[] = {&w.layers[0].wq, &w.layers[1].w_down, &w.lm_head};
        for (int k = 0; k < 3; k++) {
            const weight_matrix *m = ms[k];
            assert_int_equal(m->format, WEIGHT_MLX_AFFINE);
            assert_int_equal(m->zero_point, cases[i].zero_point);
            if (!m->zero_point) continue;
            for (int64_t r = 0; r < m->rows; r++)
                for (int64_t g = 0; g < m->cols / m->group_size; g++) {
                    int64_t at = weight_mlx_group(m, r, g);
                    float sc = f16_to_f32(((const uint16_t *)m->scales)[at]);
                    float bi = f16_to_f32(((const uint16_t *)m->biases)[at]);
                    assert_true(bi == -(float)m->zero_point * sc);
                }
        }
        model_weights_free(&w);
        safetensors_set_close(set);
    }
}

/* A GGUF file's quantized tensors are converted in memory; once the weights are copied into
 * their arena (as the engine does) those conversions are freed (safetensors_set_drop_built), the
 * views keep reading the same bytes from the arena, and a tensor asked for again is rebuilt. */
static void test_converted_tensors_dropped_after_copy(void **s) {
    (void)s;
    char path[512], err[512];
    assert_int_equal(mkmodel("drop-Q4_0", "--arch llama --gguf Q4_0 --tokenizer none " SHAPE), 0);
    snprintf(path, sizeof path, "%s/drop-Q4_0", tmp_root);
    model_config c;
    assert_int_equal(model_config_load(path, &c, err, sizeof err), 0);
    safetensors_set *set = safetensors_set_open(path, err, sizeof err);
    assert_non_null(set);
    assert_int_equal(safetensors_set_built_bytes(set), 0);
    const char *name = "model.layers.0.self_attn.q_proj.weight";
    const safetensors_tensor *t = safetensors_set_find(set, name);
    assert_non_null(t);
    size_t n = t->nbytes;
    unsigned char *before = malloc(n);
    assert_non_null(before);
    memcpy(before, t->data, n);
    setenv("EXO_WEIGHTS_MEM", "copy", 1);
    model_weights w;
    assert_int_equal(model_weights_load(set, &c, 0, 0, &w, err, sizeof err), 0);
    unsetenv("EXO_WEIGHTS_MEM");
    assert_non_null(w.arena);
    size_t built = safetensors_set_built_bytes(set);
    assert_true(built >= n);
    safetensors_set_drop_built(set);
    assert_int_equal(safetensors_set_built_bytes(set), 0);
    const unsigned char *in_arena = w.layers[0].wq.data;
    assert_true(in_arena >= (const unsigned char *)w.arena &&
                in_arena + n <= (const unsigned char *)w.arena + w.arena_len);
    assert_memory_equal(in_arena, before, n);
    t = safetensors_set_find(set, name);
    assert_non_null(t);
    assert_int_equal(t->nbytes, n);
    assert_memory_equal(t->data, before, n);
    assert_true(safetensors_set_built_bytes(set) > 0);
    free(before);
    model_weights_free(&w);
    safetensors_set_close(set);
}

static void test_llama_matches_safetensors(void **s) { (void)s, check_family("llama", "", NULL); }
static void test_qwen2_matches_safetensors(void **s) {
    (void)s, check_family("qwen2", "", " F32 Q8_0 Q4_K_M ");
}
static void test_qwen3_matches_safetensors(void **s) {
    (void)s, check_family("qwen3", "", " F32 BF16 Q8_0 Q4_K_M ");
}
static void test_qwen3_moe_matches_safetensors(void **s) {
    (void)s, check_family("qwen3_moe", "--experts 4 --experts-per-tok 2 --moe-intermediate 256",
                          " F32 Q8_0 Q4_0 Q4_K Q4_K_M ");
}
static void test_llama3_rope_table(void **s) {
    (void)s;
    char args[512];
    snprintf(args, sizeof args, "--arch llama --rope-scaling llama3 --rope-factor 8 --rope-original-max 256 "
             "--dtype f32 --tokenizer none " SHAPE);
    assert_int_equal(mkmodel("rope-st", args), 0);
    snprintf(args, sizeof args, "--arch llama --rope-scaling llama3 --rope-factor 8 --rope-original-max 256 "
             "--gguf F32 --tokenizer none " SHAPE);
    assert_int_equal(mkmodel("rope-g", args), 0);
    double gap = logit_gap("rope-st", "rope-g");
    printf("llama3 rope table: logits within %.2e\n", gap);
    assert_true(gap <= 1e-5);
}

/* ---- tokenizer and chat template from metadata ---- */

static void check_tokenizer(const char *name, const char *arch) {
    char dir[128], args[256], path[512], err[512];
    snprintf(dir, sizeof dir, "tok-%s", name);
    snprintf(args, sizeof args, "--arch %s --gguf Q8_0 --tokenizer %s", arch, name);
    if (mkmodel(dir, args)) {
        printf("tokenizer %s not in .cache/tokenizers (scripts/tokenizers.sh): skipped\n", name);
        return;
    }
    snprintf(path, sizeof path, "%s/%s/model.gguf", tmp_root, dir);
    gguf_file *f = gguf_open(path, err, sizeof err);
    assert_non_null(f);
    char *tj, *tc;
    assert_int_equal(gguf_tokenizer_json(f, &tj, &tc, err, sizeof err), 0);
    tokenizer *from_gguf = tokenizer_load_from_json(tj, strlen(tj), tc, strlen(tc), err, sizeof err);
    assert_non_null(from_gguf);
    snprintf(path, sizeof path, ".cache/tokenizers/%s", name);
    tokenizer *hf = tokenizer_load(path, err, sizeof err);
    assert_non_null(hf);
    static const char *texts[] = {
        "Hello world! How are you doing today?", "  leading spaces and\ttabs\n\nnewlines",
        "numbers 1234567 and 3.14159, emoji 🙂🚀 and accents: café naïve", "<|im_start|>user\nhi<|im_end|>",
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>", "don't I'll we've THEY'RE",
        "中文字符和日本語のテキスト", "def f(x):\n    return x ** 2  # comment",
        " lead and trail  ", "ǅ ᛯ 𝔘 unseen characters \x7f", "aaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int32_t *a, *b;
        int na = tokenizer_encode(hf, texts[i], strlen(texts[i]), 1, &a, err, sizeof err);
        int nb = tokenizer_encode(from_gguf, texts[i], strlen(texts[i]), 1, &b, err, sizeof err);
        if (na != nb || memcmp(a, b, (size_t)na * 4)) fprintf(stderr, "%s: '%s' encodes differently\n", name, texts[i]);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, (size_t)na * 4);
        char *da = tokenizer_decode(hf, a, (size_t)na, 0, NULL), *db = tokenizer_decode(from_gguf, b, (size_t)nb, 0, NULL);
        assert_string_equal(da, db);
        free(a), free(b), free(da), free(db);
    }
    const char *t1 = tokenizer_chat_template(hf), *t2 = tokenizer_chat_template(from_gguf);
    assert_true((t1 == NULL) == (t2 == NULL));
    if (t1) assert_string_equal(t1, t2);
    if (tokenizer_eos_token(hf)) assert_string_equal(tokenizer_eos_token(hf), tokenizer_eos_token(from_gguf));
    tokenizer_free(hf);
    tokenizer_free(from_gguf);
    free(tj), free(tc);
    gguf_close(f);
}

static void test_tokenizer_llama3(void **s) { (void)s, check_tokenizer("llama3_1", "llama"); }
static void test_tokenizer_qwen3(void **s) { (void)s, check_tokenizer("qwen3", "qwen3"); }
/* A SentencePiece vocabulary (tokenizer.ggml.model "llama": scores, byte tokens, the U+2581 space):
 * the GGUF's BPE-by-score encodes like Hugging Face's tokenizer.json of Llama 2 (merges). */
static void test_tokenizer_llama2(void **s) { (void)s, check_tokenizer("llama2", "llama"); }

/* ---- llama.cpp itself (scripts/llamacpp.sh builds it from source) ---- */

/* The llama.cpp reference binary: $EXO_LLAMACPP_REF or build/llamacpp/llamacpp-ref; NULL if absent. */
static const char *llamacpp_ref(void) {
    const char *p = getenv("EXO_LLAMACPP_REF");
    if (!p || !p[0]) p = "build/llamacpp/llamacpp-ref";
    return access(p, X_OK) == 0 ? p : NULL;
}

/* The reference for a differential test, or the test skips: a developer's `make unit` without
 * llama.cpp built. `make test` builds it first and sets EXO_LLAMACPP_REQUIRED, so there a missing
 * binary is a failed build and fails the test. */
static const char *llamacpp_ref_or_skip(void) {
    const char *ref = llamacpp_ref(), *required = getenv("EXO_LLAMACPP_REQUIRED");
    int must = required && required[0] == '1';
    if (ref) return ref;
    printf("llama.cpp reference not built (bash scripts/llamacpp.sh): differential test %s\n",
           must ? "FAILED" : "skipped");
    assert_false(must);
    skip();
    return NULL;
}

static json_t *run_json(const char *cmd) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    strbuf out = {0};
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) strbuf_append(&out, buf, n);
    int st = pclose(p);
    if (st) fprintf(stderr, "%s: exit %d\n", cmd, st);
    assert_int_equal(st, 0);
    json_error_t je;
    json_t *j = json_loadb(out.data, out.len, 0, &je);
    if (!j) fprintf(stderr, "%s: not JSON (%s)\n", cmd, je.text);
    assert_non_null(j);
    strbuf_free(&out);
    return j;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
    return best;
}

/* Teacher-forced logits of the prompt and greedy tokens, exo vs llama.cpp, on one GGUF. Returns
 * the largest logit difference relative to the logits' spread; greedy tokens must agree until
 * the first step whose top-2 gap (exo's) is within twice the measured logit difference. The
 * prompt is 48 tokens and the weights are laid out as the engine lays them out, so where the CPU
 * has AMX the prompt runs on the tiles (CPU_AMX_MIN_TOKENS) with their default precision. */
static double vs_llamacpp(const char *ref, const char *model_dir, int *agreed) {
    enum { NP = 48, NG = 8 };
    int32_t prompt[NP] = {1, 17, 300, 4000, 55, 901, 12, 7, 2048, 3, 4999, 256, 88, 1024, 9, 777};
    for (int i = 16; i < NP; i++) prompt[i] = (int32_t)((i * 7919 + 13) % 5000);
    char cmd[2048], ids[512] = "";
    for (int i = 0; i < NP; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), i ? ",%d" : "%d", prompt[i]);
    snprintf(cmd, sizeof cmd, "%s logits %s/%s/model.gguf %s %d 2>/dev/null", ref, tmp_root, model_dir, ids, NG);
    json_t *j = run_json(cmd);
    int vocab;
    prepare_like_engine = 1;
    float *ours = forward_logits(model_dir, prompt, NP, &vocab);
    json_t *theirs = json_object_get(j, "logits");
    assert_int_equal(json_array_size(theirs), NP);
    double worst = 0, spread = 0;
    for (int i = 0; i < NP; i++) {
        json_t *row = json_array_get(theirs, (size_t)i);
        assert_int_equal(json_array_size(row), vocab);
        for (int v = 0; v < vocab; v++) {
            double t = json_number_value(json_array_get(row, (size_t)v)), o = ours[(size_t)i * vocab + v];
            worst = fmax(worst, fabs(t - o));
            spread = fmax(spread, fabs(t));
        }
    }
    /* greedy: exo's own continuation, one forward per step over the whole sequence */
    int32_t seq[NP + NG];
    memcpy(seq, prompt, sizeof prompt);
    json_t *greedy = json_object_get(j, "greedy");
    *agreed = 0;
    for (int g = 0; g < NG; g++) {
        int n = NP + g, v2;
        float *l = g ? forward_logits(model_dir, seq, n, &v2) : ours;
        const float *last = l + (size_t)(n - 1) * vocab;
        int best = argmax(last, vocab);
        float second = -INFINITY;
        for (int v = 0; v < vocab; v++) second = v != best && last[v] > second ? last[v] : second;
        int want = (int)json_integer_value(json_array_get(greedy, (size_t)g));
        double top2_gap = last[best] - second;
        if (g) free(l);
        if (best != want) {
            if (top2_gap > 2 * worst)
                fprintf(stderr, "greedy step %d: exo %d, llama.cpp %d, gap %.3f\n", g, best, want, top2_gap);
            assert_true(top2_gap <= 2 * worst); /* only a near-tie may part them */
            break;
        }
        seq[n] = best;
        (*agreed)++;
    }
    prepare_like_engine = 0;
    free(ours);
    json_decref(j);
    return worst / spread;
}

static void test_llamacpp_logits(void **s) {
    (void)s;
    const char *ref = llamacpp_ref_or_skip();
    static const struct {
        const char *arch, *type;
        double tol; /* of the logits' spread: llama.cpp runs F16 and quantized weights against
                       F16 / 8-bit quantized activations, exo against F32 ones (measured
                       2026-12-02 on 16 tokens: F32 4e-6, F16 6e-4, BF16 5e-3, quantized
                       1.5-2.6e-2; on 48, gguf5: F32 4e-6, F16 9e-4, BF16 6e-3, quantized
                       1.8-3.4e-2, the same with or without the AMX tiles; Q2_K 3.9e-2: exo
                       requantizes its 16-value sub-blocks at 8 bits, 1.4e-2 apart from its own
                       dequantized copy in check_family, so its tolerance adds that) */
    } cases[] = {{"llama", "F32", 1e-4},  {"llama", "F16", 1e-2},  {"llama", "BF16", 1e-2},
                 {"llama", "Q8_0", 4e-2}, {"llama", "Q4_0", 4e-2}, {"llama", "Q4_1", 4e-2},
                 {"llama", "Q5_0", 4e-2}, {"llama", "Q5_1", 4e-2}, {"llama", "Q4_K", 4e-2},
                 {"llama", "Q5_K", 4e-2}, {"llama", "Q6_K", 4e-2}, {"llama", "Q4_K_M", 4e-2},
                 {"llama", "Q2_K", 6e-2}, {"llama", "Q3_K", 4e-2},
                 {"qwen2", "Q8_0", 4e-2}, {"qwen3", "F32", 1e-4},  {"qwen3", "Q4_K_M", 4e-2},
                 {"qwen3_moe", "F32", 1e-4}, {"qwen3_moe", "Q8_0", 4e-2}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[64], args[512];
        snprintf(name, sizeof name, "lc-%s-%s", cases[i].arch, cases[i].type);
        snprintf(args, sizeof args, "--arch %s --gguf %s --tokenizer none %s " SHAPE, cases[i].arch, cases[i].type,
                 strstr(cases[i].arch, "moe") ? "--experts 4 --experts-per-tok 2 --moe-intermediate 256" : "");
        assert_int_equal(mkmodel(name, args), 0);
        /* The MoE cases with the tiles' 3 products: their random router has top-k near-ties that
         * the default's bf16 activations flip for some of the 48 tokens (qwen3_moe Q8_0: 1.6e-1
         * of the spread against 2.9e-2 with 3 products; a flipped expert is a different sum, not
         * a larger rounding error). The dense cases hold the default to the same tolerances. */
        int moe = strstr(cases[i].arch, "moe") != NULL, agreed;
        if (moe) cpu_amx_set_products(3);
        double gap = vs_llamacpp(ref, name, &agreed);
        cpu_amx_set_products(-1);
        printf("llama.cpp %-9s %-7s logits within %.1e of its spread (tolerance %.0e), greedy %d/8 equal%s\n",
               cases[i].arch, cases[i].type, gap, cases[i].tol, agreed, moe ? " (AMX: 3 products)" : "");
        assert_true(gap <= cases[i].tol);
    }
}

static void test_llamacpp_tokenization(void **s) {
    (void)s;
    const char *ref = llamacpp_ref_or_skip();
    static const char *texts[] = {"Hello world! How are you doing today?",
                                  "  leading spaces and\ttabs\n\nnewlines",
                                  "numbers 1234567 and 3.14159, emoji 🙂🚀 and accents: café naïve",
                                  "<|im_start|>user\nhi<|im_end|>", "don't I'll we've THEY'RE",
                                  "中文字符和日本語のテキスト", "def f(x):\n    return x ** 2  # comment",
                                  " lead and trail  ", "<s>[INST] hi [/INST]</s> ok",
                                  "ǅ ᛯ 𝔘 unseen characters \x7f", "aaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    static const struct {
        const char *tok, *arch;
    } toks[] = {{"llama3_1", "llama"}, {"qwen3", "qwen3"}, {"llama2", "llama"}};
    for (size_t k = 0; k < sizeof toks / sizeof *toks; k++) {
        char name[64], args[256], path[512], err[512];
        snprintf(name, sizeof name, "lct-%s", toks[k].tok);
        snprintf(args, sizeof args, "--arch %s --gguf Q4_0 --tokenizer %s --hidden 256 --intermediate 256 --layers 1",
                 toks[k].arch, toks[k].tok);
        if (mkmodel(name, args)) continue; /* tokenizer not in .cache (check_tokenizer says so) */
        snprintf(path, sizeof path, "%s/%s", tmp_root, name);
        tokenizer *t = model_text_tokenizer_load(path, err, sizeof err);
        assert_non_null(t);
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
            char cmd[2048], quoted[1024] = "'";
            for (const char *c = texts[i]; *c; c++) /* shell single quotes */
                strcat(quoted, *c == '\'' ? "'\\''" : (char[]){*c, 0});
            strcat(quoted, "'");
            snprintf(cmd, sizeof cmd, "%s tokenize %s/model.gguf %s 2>/dev/null", ref, path, quoted);
            json_t *j = run_json(cmd), *want = json_object_get(j, "ids");
            int32_t *ids;
            int n = tokenizer_encode(t, texts[i], strlen(texts[i]), 1, &ids, err, sizeof err);
            int same = n == (int)json_array_size(want);
            for (int x = 0; same && x < n; x++) same = ids[x] == json_integer_value(json_array_get(want, (size_t)x));
            if (!same) fprintf(stderr, "%s: '%s' tokenizes differently from llama.cpp\n", toks[k].tok, texts[i]);
            assert_true(same);
            free(ids);
            json_decref(j);
        }
        printf("llama.cpp tokenization (%s): %zu texts identical\n", toks[k].tok, sizeof texts / sizeof *texts);
        tokenizer_free(t);
    }
}

/* ---- refusals ---- */

static void test_unsupported_refused(void **s) {
    (void)s;
    img m = {0};
    put(&m, "GGUF", 4), u32(&m, 3), u64(&m, 1), u64(&m, 1);
    str(&m, "general.architecture"), u32(&m, GGUF_STRING), str(&m, "mamba");
    str(&m, "token_embd.weight"), u32(&m, 2), u64(&m, 256), u64(&m, 2), u32(&m, GGML_TYPE_Q8_K), u64(&m, 0);
    while (m.n % 32) put(&m, "", 1);
    uint8_t zero[2 * 292] = {0};
    put(&m, zero, sizeof zero);
    char err[256] = "", path[256];
    gguf_file *f = gguf_parse(m.b, m.n, "m.gguf", err, sizeof err);
    assert_non_null(f);
    assert_null(gguf_config_json(f, err, sizeof err));
    assert_non_null(strstr(err, "architecture 'mamba' is not supported"));
    char *tj, *tc;
    assert_int_equal(gguf_tokenizer_json(f, &tj, &tc, err, sizeof err), -1);
    assert_non_null(strstr(err, "tokenizer.ggml.model"));
    gguf_close(f);
    /* the same bytes as a file: the tensor set names the type it cannot run */
    memcpy(m.b + 24 + 8 + 20 + 4 + 8, "llama", 5);
    snprintf(path, sizeof path, "%s/q8k.gguf", tmp_root);
    FILE *fp = fopen(path, "wb");
    fwrite(m.b, 1, m.n, fp);
    fclose(fp);
    assert_null(gguf_tensor_set_open(path, err, sizeof err));
    assert_non_null(strstr(err, "type Q8_K, which exo does not run"));
    free(m.b);
}

/* What Ollama's /api/tags and /api/show report of a model (model_details_read): a GGUF's file
 * type under llama.cpp's name, its family, parameter count and file size; an MLX checkpoint's
 * bits; nothing for a directory that is no model. */
static void test_model_details(void **s) {
    (void)s;
    assert_string_equal(gguf_file_type_name(15), "Q4_K_M");
    assert_string_equal(gguf_file_type_name(32), "BF16");
    assert_string_equal(gguf_file_type_name(7 | 1024), "Q8_0"); /* LLAMA_FTYPE_GUESSED */
    assert_null(gguf_file_type_name(4));                          /* removed from llama.cpp */
    assert_null(gguf_file_type_name(-1));
    assert_int_equal(gguf_file_type_from_name("q3_k_m"), 12);
    static const struct { const char *type, *level; } cases[] = {
        {"Q4_K_M", "Q4_K_M"}, {"Q3_K", "Q3_K_S"}, {"Q8_0", "Q8_0"}, {"BF16", "BF16"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[64], args[256], dir[256], file[300];
        snprintf(name, sizeof name, "details-%s", cases[i].type);
        snprintf(args, sizeof args, "--arch llama --gguf %s --tokenizer none " SHAPE, cases[i].type);
        assert_int_equal(mkmodel(name, args), 0);
        snprintf(dir, sizeof dir, "%s/%s", tmp_root, name);
        snprintf(file, sizeof file, "%s/model.gguf", dir);
        struct stat st;
        assert_int_equal(stat(file, &st), 0);
        model_details d;
        assert_int_equal(model_details_read(dir, &d), 0);
        assert_string_equal(d.format, "gguf");
        assert_string_equal(d.family, "llama");
        assert_string_equal(d.quantization, cases[i].level);
        assert_string_equal(d.parameter_size, "4M"); /* 2 layers of 256 wide, a 5000-token vocabulary */
        assert_int_equal(d.size, (int64_t)st.st_size);
        assert_int_equal(model_details_read(file, &d), 0); /* the file itself is the model too */
        assert_string_equal(d.quantization, cases[i].level);
    }
    assert_int_equal(mkmodel("details-mlx8", "--arch qwen3 --quant-bits 8 --tokenizer none " SHAPE), 0);
    char dir[256], file[300];
    snprintf(dir, sizeof dir, "%s/details-mlx8", tmp_root);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    model_details d;
    assert_int_equal(model_details_read(dir, &d), 0);
    assert_string_equal(d.format, "safetensors");
    assert_string_equal(d.family, "qwen3");
    assert_string_equal(d.quantization, "Q8");
    assert_int_equal(d.size, (int64_t)st.st_size);
    assert_int_equal(model_details_read(tmp_root, &d), -1); /* no config.json, no .gguf */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_details),
        cmocka_unit_test(test_valid_parse),
        cmocka_unit_test(test_truncation_everywhere),
        cmocka_unit_test(test_corrupt_headers),
        cmocka_unit_test(test_duplicates_rejected),
        cmocka_unit_test(test_blocks_round_trip),
        cmocka_unit_test(test_unsupported_refused),
        cmocka_unit_test(test_zero_point_of_symmetric_types),
        cmocka_unit_test(test_converted_tensors_dropped_after_copy),
        cmocka_unit_test(test_llama_matches_safetensors),
        cmocka_unit_test(test_qwen2_matches_safetensors),
        cmocka_unit_test(test_qwen3_matches_safetensors),
        cmocka_unit_test(test_qwen3_moe_matches_safetensors),
        cmocka_unit_test(test_llama3_rope_table),
        cmocka_unit_test(test_amx_prefill_matches_passes),
        cmocka_unit_test(test_tokenizer_llama3),
        cmocka_unit_test(test_tokenizer_qwen3),
        cmocka_unit_test(test_tokenizer_llama2),
        cmocka_unit_test(test_llamacpp_logits),
        cmocka_unit_test(test_llamacpp_tokenization),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
