/* tools/mkmodel: the checkpoints it writes are valid safetensors with the tensor names, shapes
 * and dtypes of each architecture, the same bytes for the same seed, MLX quantization that
 * dequantizes (through compute's reference path) to the dense values within the format's error,
 * identical experts in the HF and MLX MoE layouts, consistent shards, and exit code 2 for bad
 * options. Runs $EXO_BUILD/tools/mkmodel (built by `make`). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/paths.h"
#include "model/weight_types.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmp_root[256];
static char tok_dir[300];

static int mkmodel(const char *out, const char *args) {
    const char *build = getenv("EXO_BUILD");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/tools/mkmodel --out %s/%s --tokenizer %s %s >%s/%s.log 2>&1",
             build && *build ? build : "build", tmp_root, out, tok_dir, args, tmp_root, out);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct st_file {
    unsigned char *bytes;
    size_t len;
    size_t data_start;
    json_t *header;
} st_file;

static void st_load(st_file *f, const char *model, const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s", tmp_root, model, file);
    f->bytes = (unsigned char *)paths_read_file(path, (size_t)1 << 30, &f->len);
    assert_non_null(f->bytes);
    assert_true(f->len >= 8);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)f->bytes[i] << (8 * i);
    assert_true(hl % 8 == 0 && 8 + hl <= f->len);
    json_error_t je;
    f->header = json_loadb((const char *)f->bytes + 8, hl, 0, &je);
    assert_non_null(f->header);
    f->data_start = 8 + hl;
    /* Offsets tile the data section exactly: no holes, no overlap. */
    size_t total = 0, n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(f->header, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        json_t *o = json_object_get(v, "data_offsets");
        total += (size_t)(json_integer_value(json_array_get(o, 1)) - json_integer_value(json_array_get(o, 0)));
        n++;
    }
    assert_true(n > 0);
    assert_int_equal(total, f->len - f->data_start);
}

static void st_free(st_file *f) {
    json_decref(f->header);
    free(f->bytes);
}

/* Returns the tensor's data; checks dtype and shape (ndim values, then -1 terminated). */
static const void *st_tensor(const st_file *f, const char *name, const char *dtype, ...) {
    json_t *t = json_object_get(f->header, name);
    if (!t) fail_msg("tensor %s missing", name);
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), dtype);
    json_t *shape = json_object_get(t, "shape");
    va_list ap;
    va_start(ap, dtype);
    size_t d = 0, elems = 1;
    for (int64_t dim; (dim = va_arg(ap, int64_t)) >= 0; d++) {
        if (json_integer_value(json_array_get(shape, d)) != dim)
            fail_msg("%s dim %zu: %lld, want %lld", name, d, (long long)json_integer_value(json_array_get(shape, d)),
                     (long long)dim);
        elems *= (size_t)dim;
    }
    va_end(ap);
    assert_int_equal(json_array_size(shape), d);
    json_t *o = json_object_get(t, "data_offsets");
    size_t b = (size_t)json_integer_value(json_array_get(o, 0)), e = (size_t)json_integer_value(json_array_get(o, 1));
    size_t esize = strcmp(dtype, "F32") == 0 || strcmp(dtype, "U32") == 0 ? 4 : 2;
    assert_int_equal(e - b, elems * esize);
    return f->bytes + f->data_start + b;
}

static json_t *load_json(const char *model, const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s", tmp_root, model, file);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("%s: %s", path, je.text);
    return j;
}

#define I(x) ((int64_t)(x))
#define END I(-1)

static int setup(void **state) {
    (void)state;
    snprintf(tmp_root, sizeof tmp_root, "/tmp/exo-test-mkmodel-XXXXXX");
    if (!mkdtemp(tmp_root)) return -1;
    /* A small real-format tokenizer: 26 vocab entries and two added tokens with a gap. */
    snprintf(tok_dir, sizeof tok_dir, "%s/tok", tmp_root);
    paths_mkdir_p(tok_dir);
    char path[400];
    snprintf(path, sizeof path, "%s/tokenizer.json", tok_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"added_tokens\":[{\"id\":300,\"content\":\"<|im_end|>\"},{\"id\":301,\"content\":\"<s>\"}],"
               "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int i = 0; i < 26; i++) fprintf(f, "%s\"%c\":%d", i ? "," : "", 'a' + i, i);
    fprintf(f, "}}}");
    fclose(f);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tok_dir);
    f = fopen(path, "w");
    fprintf(f, "{\"bos_token\":\"<s>\",\"eos_token\":{\"content\":\"<|im_end|>\"},"
               "\"model_max_length\":1000000000000000019884624838656}"); /* as Llama 3's says */
    fclose(f);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_qwen3_dense_layout(void **state) {
    (void)state;
    assert_int_equal(mkmodel("q3", "--arch qwen3 --seed 7"), 0);
    json_t *cfg = load_json("q3", "config.json");
    assert_string_equal(json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0)),
                        "Qwen3ForCausalLM");
    assert_int_equal(json_integer_value(json_object_get(cfg, "vocab_size")), 302); /* added tokens counted */
    assert_int_equal(json_integer_value(json_object_get(cfg, "bos_token_id")), 301);
    assert_int_equal(json_integer_value(json_object_get(cfg, "eos_token_id")), 300);
    assert_int_equal(json_integer_value(json_object_get(cfg, "head_dim")), 16);
    assert_null(json_object_get(cfg, "quantization"));
    json_decref(cfg);
    st_file f;
    st_load(&f, "q3", "model.safetensors");
    assert_int_equal(json_object_size(f.header), 1 + 3 + 2 * 11);
    st_tensor(&f, "model.embed_tokens.weight", "BF16", I(302), I(64), END);
    st_tensor(&f, "lm_head.weight", "BF16", I(302), I(64), END);
    st_tensor(&f, "model.layers.1.self_attn.q_proj.weight", "BF16", I(64), I(64), END);
    st_tensor(&f, "model.layers.1.self_attn.k_proj.weight", "BF16", I(32), I(64), END);
    st_tensor(&f, "model.layers.1.self_attn.o_proj.weight", "BF16", I(64), I(64), END);
    st_tensor(&f, "model.layers.0.self_attn.k_norm.weight", "BF16", I(16), END);
    st_tensor(&f, "model.layers.0.mlp.down_proj.weight", "BF16", I(64), I(128), END);
    /* Norms: near 1 but not 1, so a forward pass that ignores them is caught. */
    const uint16_t *norm = st_tensor(&f, "model.layers.0.input_layernorm.weight", "BF16", I(64), END);
    double sum = 0;
    int not_one = 0;
    for (int i = 0; i < 64; i++) {
        float v = bf16_to_f32(norm[i]);
        sum += v;
        not_one += v != 1.0f;
        assert_true(v > 0.5f && v < 1.5f);
    }
    assert_true(fabs(sum / 64 - 1.0) < 0.05);
    assert_true(not_one > 48);
    /* Projections: mean ~0, std 1/sqrt(in) capped at 0.1. */
    const uint16_t *q = st_tensor(&f, "model.layers.0.self_attn.q_proj.weight", "BF16", I(64), I(64), END);
    double s1 = 0, s2 = 0;
    for (int i = 0; i < 64 * 64; i++) {
        double v = bf16_to_f32(q[i]);
        s1 += v, s2 += v * v;
    }
    double mean = s1 / 4096, sd = sqrt(s2 / 4096 - mean * mean);
    assert_true(fabs(mean) < 0.01);
    assert_true(sd > 0.09 && sd < 0.11);
    st_free(&f);
}

static void test_same_seed_same_bytes(void **state) {
    (void)state;
    assert_int_equal(mkmodel("s1a", "--seed 1"), 0);
    assert_int_equal(mkmodel("s1b", "--seed 1"), 0);
    assert_int_equal(mkmodel("s2", "--seed 2"), 0);
    st_file a, b, c;
    st_load(&a, "s1a", "model.safetensors");
    st_load(&b, "s1b", "model.safetensors");
    st_load(&c, "s2", "model.safetensors");
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.bytes, b.bytes, a.len);
    assert_int_equal(a.len, c.len);
    assert_memory_not_equal(a.bytes + a.data_start, c.bytes + c.data_start, a.len - a.data_start);
    st_free(&a), st_free(&b), st_free(&c);
}

/* Every quantized matrix dequantizes to the dense f32 twin (same seed) within half a step plus
 * the bf16 rounding of scale and bias. */
static void check_quantized(int bits, int group) {
    char args[200], name[32];
    snprintf(name, sizeof name, "qb%dg%d", bits, group);
    snprintf(args, sizeof args, "--arch llama --seed 3 --quant-bits %d --group-size %d", bits, group);
    assert_int_equal(mkmodel(name, args), 0);
    st_file d, qf;
    st_load(&d, "dense32", "model.safetensors");
    st_load(&qf, name, "model.safetensors");
    json_t *cfg = load_json(name, "config.json");
    json_t *quant = json_object_get(cfg, "quantization");
    assert_int_equal(json_integer_value(json_object_get(quant, "bits")), bits);
    assert_int_equal(json_integer_value(json_object_get(quant, "group_size")), group);
    assert_true(json_equal(quant, json_object_get(cfg, "quantization_config")));
    json_decref(cfg);
    const char *mats[] = {"model.embed_tokens", "lm_head", "model.layers.0.self_attn.q_proj",
                          "model.layers.1.self_attn.v_proj", "model.layers.1.mlp.down_proj"};
    int64_t shapes[][2] = {{302, 64}, {302, 64}, {64, 64}, {32, 64}, {64, 128}};
    for (int m = 0; m < 5; m++) {
        char wn[128], sn[128], bn[128];
        snprintf(wn, sizeof wn, "%s.weight", mats[m]);
        snprintf(sn, sizeof sn, "%s.scales", mats[m]);
        snprintf(bn, sizeof bn, "%s.biases", mats[m]);
        int64_t rows = shapes[m][0], cols = shapes[m][1];
        weight_matrix w = {.format = WEIGHT_MLX_AFFINE, .rows = rows, .cols = cols, .scale_dtype = DTYPE_BF16,
                           .bits = bits, .group_size = group};
        w.data = st_tensor(&qf, wn, "U32", rows, cols * bits / 32, END);
        w.scales = st_tensor(&qf, sn, "BF16", rows, cols / group, END);
        w.biases = st_tensor(&qf, bn, "BF16", rows, cols / group, END);
        const float *ref = st_tensor(&d, wn, "F32", rows, cols, END);
        float out[128];
        double worst = 0;
        for (int64_t r = 0; r < rows; r++) {
            weight_matrix_row_to_f32(&w, r, out);
            for (int64_t g = 0; g < cols / group; g++) {
                float mn = ref[r * cols + g * group], mx = mn;
                for (int i = 0; i < group; i++) {
                    float v = ref[r * cols + g * group + i];
                    mn = v < mn ? v : mn, mx = v > mx ? v : mx;
                }
                double step = (mx - mn) / ((1 << bits) - 1);
                double bound = step / 2 + (fabs(mn) + (mx - mn)) / 128.0;
                for (int i = 0; i < group; i++) {
                    double err = fabs(out[g * group + i] - ref[r * cols + g * group + i]);
                    if (err > bound) fail_msg("%s[%lld][%lld]: error %g > %g", wn, (long long)r,
                                              (long long)(g * group + i), err, bound);
                    if (err / step > worst) worst = err / step;
                }
            }
        }
        assert_true(worst > 0.2); /* the check is not vacuous: values are really quantized */
    }
    /* Norms stay dense, in the model dtype. */
    st_tensor(&qf, "model.norm.weight", "BF16", I(64), END);
    assert_null(json_object_get(qf.header, "model.norm.scales"));
    st_free(&d), st_free(&qf);
}

static void test_mlx_quantization_round_trip(void **state) {
    (void)state;
    assert_int_equal(mkmodel("dense32", "--arch llama --seed 3 --dtype f32"), 0);
    check_quantized(4, 64);
    check_quantized(8, 64);
    check_quantized(3, 32); /* values cross uint32 words */
    check_quantized(5, 32);
    check_quantized(6, 64);
    check_quantized(2, 64);
}

static void test_moe_layouts_hold_the_same_experts(void **state) {
    (void)state;
    assert_int_equal(mkmodel("moe_hf", "--arch qwen3_moe --seed 5 --moe-layout hf"), 0);
    assert_int_equal(mkmodel("moe_mlx", "--arch qwen3_moe --seed 5 --moe-layout mlx"), 0);
    json_t *cfg = load_json("moe_hf", "config.json");
    assert_string_equal(json_string_value(json_object_get(cfg, "model_type")), "qwen3_moe");
    assert_int_equal(json_integer_value(json_object_get(cfg, "num_experts")), 8);
    assert_int_equal(json_integer_value(json_object_get(cfg, "num_experts_per_tok")), 2);
    assert_int_equal(json_integer_value(json_object_get(cfg, "moe_intermediate_size")), 64);
    assert_true(json_is_true(json_object_get(cfg, "norm_topk_prob")));
    assert_int_equal(json_array_size(json_object_get(cfg, "mlp_only_layers")), 0);
    json_decref(cfg);
    st_file h, m;
    st_load(&h, "moe_hf", "model.safetensors");
    st_load(&m, "moe_mlx", "model.safetensors");
    st_tensor(&h, "model.layers.1.mlp.gate.weight", "BF16", I(8), I(64), END);
    const uint16_t *stack = st_tensor(&m, "model.layers.1.mlp.switch_mlp.down_proj.weight", "BF16", I(8), I(64), I(64), END);
    for (int e = 0; e < 8; e++) {
        char n[128];
        snprintf(n, sizeof n, "model.layers.1.mlp.experts.%d.down_proj.weight", e);
        const uint16_t *one = st_tensor(&h, n, "BF16", I(64), I(64), END);
        assert_memory_equal(one, stack + e * 64 * 64, 64 * 64 * 2);
    }
    assert_null(json_object_get(h.header, "model.layers.0.mlp.gate_proj.weight"));
    st_free(&h), st_free(&m);
    /* Quantized, mlx-community style: stacked experts quantized, the router at 8 bits. */
    assert_int_equal(mkmodel("moe_q", "--arch qwen3_moe --seed 5 --moe-layout mlx --quant-bits 4"), 0);
    st_file q;
    st_load(&q, "moe_q", "model.safetensors");
    st_tensor(&q, "model.layers.0.mlp.switch_mlp.gate_proj.weight", "U32", I(8), I(64), I(8), END);
    st_tensor(&q, "model.layers.0.mlp.switch_mlp.gate_proj.scales", "BF16", I(8), I(64), I(1), END);
    st_tensor(&q, "model.layers.0.mlp.gate.weight", "U32", I(8), I(16), END);
    st_free(&q);
    cfg = load_json("moe_q", "config.json");
    json_t *router = json_object_get(json_object_get(cfg, "quantization"), "model.layers.0.mlp.gate");
    assert_int_equal(json_integer_value(json_object_get(router, "bits")), 8);
    assert_int_equal(json_integer_value(json_object_get(router, "group_size")), 64);
    json_decref(cfg);
}

static void test_llama3_rope_and_tied_embeddings(void **state) {
    (void)state;
    assert_int_equal(mkmodel("llama", "--arch llama --rope-scaling llama3 --rope-factor 8 --rope-original-max 256 "
                                      "--rope-theta 500000 --tie-embeddings"),
                     0);
    json_t *cfg = load_json("llama", "config.json");
    assert_string_equal(json_string_value(json_object_get(cfg, "model_type")), "llama");
    json_t *rs = json_object_get(cfg, "rope_scaling");
    assert_string_equal(json_string_value(json_object_get(rs, "rope_type")), "llama3");
    assert_true(json_real_value(json_object_get(rs, "factor")) == 8.0);
    assert_true(json_real_value(json_object_get(rs, "low_freq_factor")) == 1.0);
    assert_true(json_real_value(json_object_get(rs, "high_freq_factor")) == 4.0);
    assert_int_equal(json_integer_value(json_object_get(rs, "original_max_position_embeddings")), 256);
    assert_true(json_real_value(json_object_get(cfg, "rope_theta")) == 500000.0);
    assert_true(json_is_true(json_object_get(cfg, "tie_word_embeddings")));
    json_decref(cfg);
    st_file f;
    st_load(&f, "llama", "model.safetensors");
    assert_null(json_object_get(f.header, "lm_head.weight"));
    assert_null(json_object_get(f.header, "model.layers.0.self_attn.q_norm.weight"));
    st_free(&f);
}

static void test_qwen2_has_attention_biases(void **state) {
    (void)state;
    assert_int_equal(mkmodel("qwen2", "--arch qwen2 --dtype f16"), 0);
    st_file f;
    st_load(&f, "qwen2", "model.safetensors");
    st_tensor(&f, "model.layers.0.self_attn.q_proj.bias", "F16", I(64), END);
    st_tensor(&f, "model.layers.0.self_attn.k_proj.bias", "F16", I(32), END);
    assert_null(json_object_get(f.header, "model.layers.0.self_attn.o_proj.bias"));
    st_free(&f);
}

static void test_shards_and_index(void **state) {
    (void)state;
    assert_int_equal(mkmodel("sharded", "--seed 9 --vocab 6000 --shard-mb 1"), 0);
    assert_int_equal(mkmodel("single", "--seed 9 --vocab 6000"), 0);
    json_t *index = load_json("sharded", "model.safetensors.index.json");
    json_t *map = json_object_get(index, "weight_map");
    st_file one;
    st_load(&one, "single", "model.safetensors");
    assert_int_equal(json_object_size(map), json_object_size(one.header) - 1);
    const char *name;
    json_t *file;
    size_t total = 0;
    int shards_seen = 0;
    char last[128] = "";
    json_object_foreach(map, name, file) {
        st_file s;
        st_load(&s, "sharded", json_string_value(file));
        if (strcmp(last, json_string_value(file)) != 0) shards_seen++;
        snprintf(last, sizeof last, "%s", json_string_value(file));
        json_t *a = json_object_get(s.header, name), *b = json_object_get(one.header, name);
        assert_non_null(a);
        assert_true(json_equal(json_object_get(a, "shape"), json_object_get(b, "shape")));
        json_t *oa = json_object_get(a, "data_offsets"), *ob = json_object_get(b, "data_offsets");
        size_t n = (size_t)(json_integer_value(json_array_get(oa, 1)) - json_integer_value(json_array_get(oa, 0)));
        assert_memory_equal(s.bytes + s.data_start + json_integer_value(json_array_get(oa, 0)),
                            one.bytes + one.data_start + json_integer_value(json_array_get(ob, 0)), n);
        total += n;
        st_free(&s);
    }
    assert_true(shards_seen >= 2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(index, "metadata"), "total_size")), total);
    st_free(&one);
    json_decref(index);
}

/* --mtp writes Qwen3-Next/3.5's mtp.* head; agree: fc passes the embedding half through, the
 * final norm is model.norm's, and every projection into the residual stream is zero. */
static void test_mtp_head(void **state) {
    (void)state;
    const char *shape = "--arch qwen3_5 --hidden 64 --head-dim 32 --layers 4 --dtype f32";
    char args[256];
    snprintf(args, sizeof args, "%s --mtp random", shape);
    assert_int_equal(mkmodel("mtp-random", args), 0);
    snprintf(args, sizeof args, "%s --mtp agree", shape);
    assert_int_equal(mkmodel("mtp-agree", args), 0);
    st_file r, a;
    st_load(&r, "mtp-random", "model.safetensors");
    st_load(&a, "mtp-agree", "model.safetensors");
    st_tensor(&r, "mtp.pre_fc_norm_hidden.weight", "F32", I(64), END);
    st_tensor(&r, "mtp.layers.0.self_attn.q_proj.weight", "F32", I(256), I(64), END);
    st_tensor(&r, "mtp.layers.0.mlp.down_proj.weight", "F32", I(64), I(128), END);
    const float *fc = st_tensor(&a, "mtp.fc.weight", "F32", I(64), I(128), END);
    for (int row = 0; row < 64; row++)
        for (int col = 0; col < 128; col++) assert_true(fc[row * 128 + col] == (row == col ? 1.0f : 0.0f));
    assert_memory_equal(st_tensor(&a, "mtp.norm.weight", "F32", I(64), END),
                        st_tensor(&a, "model.norm.weight", "F32", I(64), END), 64 * 4);
    const float *o = st_tensor(&a, "model.layers.3.self_attn.o_proj.weight", "F32", I(64), I(128), END);
    const float *out = st_tensor(&a, "model.layers.0.linear_attn.out_proj.weight", "F32", I(64), I(64), END);
    for (int i = 0; i < 64 * 128; i++) assert_true(o[i] == 0.0f && (i >= 64 * 64 || out[i] == 0.0f));
    json_t *cfg = load_json("mtp-agree", "config.json");
    assert_int_equal(json_integer_value(json_object_get(cfg, "mtp_num_hidden_layers")), 1);
    json_decref(cfg);
    st_free(&r);
    st_free(&a);
    assert_int_equal(mkmodel("bad", "--arch qwen3 --mtp random"), 2); /* hybrids only */
    assert_int_equal(mkmodel("bad", "--arch qwen3_5 --mtp sometimes"), 2);
}

static void test_bad_options_exit_2(void **state) {
    (void)state;
    assert_int_equal(mkmodel("bad", "--arch gpt2"), 2);
    assert_int_equal(mkmodel("bad", "--quant-bits 7"), 2);
    assert_int_equal(mkmodel("bad", "--group-size 48"), 2);
    assert_int_equal(mkmodel("bad", "--hidden 48 --quant-bits 4"), 2); /* not a multiple of the group */
    assert_int_equal(mkmodel("bad", "--heads 4 --kv-heads 3"), 2);
    assert_int_equal(mkmodel("bad", "--no-such-flag 1"), 2);
    assert_int_equal(mkmodel("bad", "--layers"), 2);
    assert_int_equal(mkmodel("bad", "--preset nonsense"), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_dense_layout), cmocka_unit_test(test_mtp_head),
        cmocka_unit_test(test_same_seed_same_bytes),
        cmocka_unit_test(test_mlx_quantization_round_trip),
        cmocka_unit_test(test_moe_layouts_hold_the_same_experts),
        cmocka_unit_test(test_llama3_rope_and_tied_embeddings),
        cmocka_unit_test(test_qwen2_has_attention_biases),
        cmocka_unit_test(test_shards_and_index),
        cmocka_unit_test(test_bad_options_exit_2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
