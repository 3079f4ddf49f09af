/* mkmodel — writes a Hugging Face model directory with deterministic random weights, for tests
 * and benchmarks: config.json, model.safetensors (or shards + index), generation_config.json and
 * a real tokenizer (tokenizer.json + tokenizer_config.json) copied from .cache/tokenizers/<name>
 * (filled by scripts/tokenizers.sh). Dense (bf16/f16/f32) or MLX affine-quantized as
 * mlx-community publishes it. See tools/mkmodel/README.md and `mkmodel --help`.
 *
 * Refuses: anything but the listed architectures; shapes that the format cannot hold (it says
 * why and exits 2). */
#include "mkmodel.h"

#include "base/paths.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *usage_text =
    "usage: mkmodel --out DIR [options]\n"
    "\n"
    "Writes a Hugging Face model directory with deterministic random weights (same --seed, same\n"
    "bytes on every machine): config.json, model.safetensors, generation_config.json,\n"
    "tokenizer.json, tokenizer_config.json.\n"
    "\n"
    "  --out DIR               output directory (created; existing files are replaced)\n"
    "  --preset NAME           starting shape: tiny (default), qwen3-0.6b, qwen3-8b, qwen3-30b-a3b,\n"
    "                          qwen2.5-0.5b, llama-3.2-1b, llama-3.1-8b, qwen3.5-9b; other options\n"
    "                          override it\n"
    "  --arch A                llama | qwen2 | qwen3 | qwen3_moe | gpt_oss | qwen3_next | qwen3_5 |\n"
    "                          qwen3_5_moe (default qwen3, or the preset's)\n"
    "  --tokenizer NAME|DIR    tokenizer from .cache/tokenizers/NAME (scripts/tokenizers.sh), or a\n"
    "                          directory holding tokenizer.json; 'none' writes no tokenizer (needs\n"
    "                          --vocab). Default: llama3_1 for llama, gptoss for gpt_oss, qwen3\n"
    "                          otherwise. A chat_template.jinja next to tokenizer.json is copied.\n"
    "  --seed N                random seed (default 0)\n"
    "  --hidden N --layers N --heads N --kv-heads N --head-dim N --intermediate N\n"
    "                          shape (tiny: 64, 2, 4, 2, 16, 128)\n"
    "  --experts N --experts-per-tok N --moe-intermediate N --decoder-sparse-step N\n"
    "                          qwen3_moe, hybrid MoE and gpt_oss routing (tiny: 8, 2, 64, 1)\n"
    "  --sliding-window N      gpt_oss: window of the sliding_attention (even) layers (default 4)\n"
    "  --swiglu-limit X        gpt_oss: clamp of the expert gate/up values (default 7)\n"
    "  --mxfp4                 gpt_oss: experts as MXFP4 _blocks/_scales, as OpenAI publishes them\n"
    "  --shared-intermediate N qwen3_next / qwen3_5_moe shared expert hidden size (tiny: 64)\n"
    "  --linear-key-heads N --linear-value-heads N --linear-key-dim N --linear-value-dim N\n"
    "  --conv-kernel N --full-attention-interval N\n"
    "                          hybrid GatedDeltaNet layers (tiny: 2, 4, 16, 16, 4, 4)\n"
    "  --partial-rotary X      partial_rotary_factor of the hybrids (default 0.25)\n"
    "  --hybrid-layout L       hf: conv1d [C, 1, K], zero-centred norms stored as w (default);\n"
    "                          mlx: conv1d [C, K, 1], norms stored as 1 + w (mlx-lm's conversion)\n"
    "  --vocab N               vocab_size (default: the tokenizer's, added tokens included)\n"
    "  --max-pos N             max_position_embeddings (default 4096)\n"
    "  --rope-theta X          (default 10000 llama, 1000000 qwen)\n"
    "  --rope-scaling S        none | llama3 | linear | yarn (default none)\n"
    "  --rope-factor X         scaling factor (default 8 for llama3, 2 for linear, 4 for yarn)\n"
    "  --rope-original-max N   original_max_position_embeddings for llama3/yarn (default 8192)\n"
    "  --rms-norm-eps X        (default 1e-5 llama, 1e-6 qwen)\n"
    "  --tie-embeddings        lm_head shares model.embed_tokens (no lm_head tensor)\n"
    "  --dtype D               bf16 | f16 | f32 (default bf16): weights, or MLX scales/biases\n"
    "  --quant-bits B          MLX affine quantization: 2 | 3 | 4 | 5 | 6 | 8 (default: none)\n"
    "  --group-size G          32 | 64 | 128 (default 64)\n"
    "  --router-bits B         qwen3_moe mlp.gate when quantized: 8 (default, as mlx-lm does:\n"
    "                          group 64, listed per layer in \"quantization\"), 'same', or 'none'\n"
    "  --mtp none|random|agree hybrids: an MTP head (mtp.*: norms, fc, one attention layer, norm);\n"
    "                          agree: one that predicts exactly what the model will (the model's\n"
    "                          layers then add nothing: it predicts from the last token alone)\n"
    "  --moe-layout L          hf: mlp.experts.<e>.{gate,up,down}_proj (default);\n"
    "                          mlx: stacked mlp.switch_mlp.{gate,up,down}_proj [E, out, in]\n"
    "  --gguf TYPE             write DIR/model.gguf only (llama.cpp's names and metadata, the\n"
    "                          tokenizer as tokenizer.ggml.*), matrices in TYPE: F32 F16 BF16 Q4_0\n"
    "                          Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K, or Q4_K_M\n"
    "                          (llama.cpp's mix);\n"
    "                          same values as the safetensors model of the same options\n"
    "  --shard-mb N            split into model-0000i-of-0000n.safetensors of at most N MB each,\n"
    "                          plus model.safetensors.index.json\n"
    "  -h, --help              this text\n"
    "\n"
    "Bad options print a message and exit 2; I/O failures exit 1.\n";

typedef struct mk_options {
    mk_config cfg;
    const char *out;
    const char *tokenizer;
    const char *gguf; /* ggml type name: write DIR/model.gguf instead of the HF files */
    int64_t vocab_override;
    uint64_t shard_mb;
    int rope_theta_set, eps_set, factor_set, vocab_set, limit_set, original_max_set, max_pos_set;
} mk_options;

static int bad(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "mkmodel: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(see mkmodel --help)\n");
    return 2;
}

static void tiny_shape(mk_config *c) {
    c->hidden = 64, c->layers = 2, c->heads = 4, c->kv_heads = 2, c->head_dim = 16, c->intermediate = 128;
    c->experts = 8, c->experts_per_tok = 2, c->moe_intermediate = 64, c->decoder_sparse_step = 1;
    c->max_pos = 4096;
    c->shared_intermediate = 64;
    c->linear_key_heads = 2, c->linear_value_heads = 4, c->linear_key_dim = 16, c->linear_value_dim = 16;
    c->conv_kernel = 4, c->full_attention_interval = 4, c->partial_rotary = 0.25;
}

static void set_shape(mk_config *c, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t hd,
                      int64_t inter, int64_t vocab, int64_t max_pos) {
    c->hidden = hidden, c->layers = layers, c->heads = heads, c->kv_heads = kv, c->head_dim = hd;
    c->intermediate = inter, c->vocab = vocab, c->max_pos = max_pos;
}

/* Returns 0, or 2 for an unknown preset. Sets what the real model's config.json says. */
static int apply_preset(mk_options *o, const char *name) {
    mk_config *c = &o->cfg;
    if (strcmp(name, "tiny") == 0) return 0;
    o->vocab_set = 1, o->rope_theta_set = 1, o->eps_set = 1;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 1000000.0;
    if (strcmp(name, "qwen3-0.6b") == 0) {
        c->arch = MK_QWEN3, o->tokenizer = "qwen3", c->tie_embeddings = 1;
        set_shape(c, 1024, 28, 16, 8, 128, 3072, 151936, 40960);
    } else if (strcmp(name, "qwen3-8b") == 0) {
        c->arch = MK_QWEN3, o->tokenizer = "qwen3", c->tie_embeddings = 0;
        set_shape(c, 4096, 36, 32, 8, 128, 12288, 151936, 40960);
    } else if (strcmp(name, "qwen3-30b-a3b") == 0) {
        c->arch = MK_QWEN3_MOE, o->tokenizer = "qwen3", c->tie_embeddings = 0;
        set_shape(c, 2048, 48, 32, 4, 128, 6144, 151936, 40960);
        c->experts = 128, c->experts_per_tok = 8, c->moe_intermediate = 768, c->decoder_sparse_step = 1;
    } else if (strcmp(name, "qwen3.5-9b") == 0) { /* the text model of Qwen/Qwen3.5-9B */
        c->arch = MK_QWEN3_5, o->tokenizer = "qwen3", c->tie_embeddings = 0;
        set_shape(c, 4096, 32, 16, 4, 256, 12288, 248320, 262144);
        c->linear_key_heads = 16, c->linear_value_heads = 32, c->linear_key_dim = 128, c->linear_value_dim = 128;
        c->rope_theta = 10000000.0;
    } else if (strcmp(name, "qwen2.5-0.5b") == 0) {
        c->arch = MK_QWEN2, o->tokenizer = "qwen3", c->tie_embeddings = 1;
        set_shape(c, 896, 24, 14, 2, 64, 4864, 151936, 32768);
    } else if (strcmp(name, "llama-3.2-1b") == 0 || strcmp(name, "llama-3.1-8b") == 0) {
        int small = strcmp(name, "llama-3.2-1b") == 0;
        c->arch = MK_LLAMA, o->tokenizer = "llama3_1", c->tie_embeddings = small;
        if (small) set_shape(c, 2048, 16, 32, 8, 64, 8192, 128256, 131072);
        else set_shape(c, 4096, 32, 32, 8, 128, 14336, 128256, 131072);
        c->rms_norm_eps = 1e-5, c->rope_theta = 500000.0;
        c->rope_scaling = MK_ROPE_LLAMA3, c->rope_factor = small ? 32.0 : 8.0, c->rope_original_max = 8192;
        o->factor_set = 1;
    } else {
        return 2;
    }
    return 0;
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0)) return -1;
    *out = v;
    return 0;
}

static int set_int_option(mk_options *o, const char *name, const char *val) {
    struct {
        const char *name;
        int64_t *dst;
        int64_t lo, hi;
    } table[] = {
        {"--hidden", &o->cfg.hidden, 1, 1 << 20},        {"--layers", &o->cfg.layers, 1, 4096},
        {"--heads", &o->cfg.heads, 1, 4096},             {"--kv-heads", &o->cfg.kv_heads, 1, 4096},
        {"--head-dim", &o->cfg.head_dim, 2, 4096},       {"--intermediate", &o->cfg.intermediate, 1, 1 << 22},
        {"--experts", &o->cfg.experts, 1, 4096},         {"--experts-per-tok", &o->cfg.experts_per_tok, 1, 4096},
        {"--moe-intermediate", &o->cfg.moe_intermediate, 1, 1 << 22},
        {"--decoder-sparse-step", &o->cfg.decoder_sparse_step, 1, 4096},
        {"--vocab", &o->vocab_override, 1, 1 << 24},     {"--max-pos", &o->cfg.max_pos, 1, INT32_MAX},
        {"--rope-original-max", &o->cfg.rope_original_max, 1, INT32_MAX},
        {"--sliding-window", &o->cfg.sliding_window, 1, INT32_MAX},
        {"--shared-intermediate", &o->cfg.shared_intermediate, 1, 1 << 22},
        {"--linear-key-heads", &o->cfg.linear_key_heads, 1, 4096},
        {"--linear-value-heads", &o->cfg.linear_value_heads, 1, 4096},
        {"--linear-key-dim", &o->cfg.linear_key_dim, 1, 4096},
        {"--linear-value-dim", &o->cfg.linear_value_dim, 1, 4096},
        {"--conv-kernel", &o->cfg.conv_kernel, 2, 64},
        {"--full-attention-interval", &o->cfg.full_attention_interval, 1, 4096},
        {"--gguf-row-pool", &o->cfg.gguf_row_pool, 1, 1 << 20},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(name, table[i].name) != 0) continue;
        if (parse_i64(val, table[i].lo, table[i].hi, table[i].dst) != 0)
            return bad("%s wants an integer in range, got '%s'", name, val);
        if (table[i].dst == &o->vocab_override) o->vocab_set = 2;
        if (table[i].dst == &o->cfg.rope_original_max) o->original_max_set = 1;
        if (table[i].dst == &o->cfg.max_pos) o->max_pos_set = 1;
        return 0;
    }
    return -1;
}

static int set_enum_option(mk_options *o, const char *name, const char *val) {
    mk_config *c = &o->cfg;
    int64_t v;
    if (strcmp(name, "--arch") == 0) {
        static const char *archs[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_next", "qwen3_5",
                                      "qwen3_5_moe"};
        for (int i = 0; i < 8; i++)
            if (strcmp(val, archs[i]) == 0) return c->arch = (mk_arch)i, 0;
        return bad("--arch must be llama, qwen2, qwen3, qwen3_moe, gpt_oss, qwen3_next, qwen3_5 or "
                   "qwen3_5_moe, got '%s'%s", val, "");
    }
    if (strcmp(name, "--rope-scaling") == 0) {
        static const char *kinds[] = {"none", "llama3", "linear", "yarn"};
        for (int i = 0; i < 4; i++)
            if (strcmp(val, kinds[i]) == 0) return c->rope_scaling = (mk_rope)i, 0;
        return bad("--rope-scaling must be none, llama3, linear or yarn, got '%s'%s", val, "");
    }
    if (strcmp(name, "--dtype") == 0) {
        if (strcmp(val, "bf16") == 0) c->dt = DTYPE_BF16;
        else if (strcmp(val, "f16") == 0) c->dt = DTYPE_F16;
        else if (strcmp(val, "f32") == 0) c->dt = DTYPE_F32;
        else return bad("--dtype must be bf16, f16 or f32, got '%s'%s", val, "");
        return 0;
    }
    if (strcmp(name, "--quant-bits") == 0) {
        if (parse_i64(val, 2, 8, &v) != 0 || v == 7) return bad("--quant-bits must be 2, 3, 4, 5, 6 or 8, got '%s'%s", val, "");
        return c->quant_bits = (int)v, 0;
    }
    if (strcmp(name, "--group-size") == 0) {
        if (parse_i64(val, 32, 128, &v) != 0 || (v != 32 && v != 64 && v != 128))
            return bad("--group-size must be 32, 64 or 128, got '%s'%s", val, "");
        return c->group_size = (int)v, 0;
    }
    if (strcmp(name, "--router-bits") == 0) {
        if (strcmp(val, "same") == 0) return c->router_bits = 0, 0;
        if (strcmp(val, "none") == 0) return c->router_bits = -1, 0;
        if (parse_i64(val, 2, 8, &v) != 0 || v == 7) return bad("--router-bits must be 2..8 (not 7), same or none, got '%s'%s", val, "");
        return c->router_bits = (int)v, 0;
    }
    if (strcmp(name, "--hybrid-layout") == 0) {
        if (strcmp(val, "hf") == 0) c->hybrid_mlx = 0;
        else if (strcmp(val, "mlx") == 0) c->hybrid_mlx = 1;
        else return bad("--hybrid-layout must be hf or mlx, got '%s'%s", val, "");
        return 0;
    }
    if (strcmp(name, "--mtp") == 0) {
        if (strcmp(val, "none") == 0) c->mtp = MK_MTP_NONE;
        else if (strcmp(val, "random") == 0) c->mtp = MK_MTP_RANDOM;
        else if (strcmp(val, "agree") == 0) c->mtp = MK_MTP_AGREE;
        else return bad("--mtp must be none, random or agree, got '%s'%s", val, "");
        return 0;
    }
    if (strcmp(name, "--moe-layout") == 0) {
        if (strcmp(val, "hf") == 0) c->moe_layout_mlx = 0;
        else if (strcmp(val, "mlx") == 0) c->moe_layout_mlx = 1;
        else return bad("--moe-layout must be hf or mlx, got '%s'%s", val, "");
        return 0;
    }
    return -1;
}

static int known_option(const char *name) {
    static const char *names[] = {"--out", "--preset", "--arch", "--tokenizer", "--seed", "--hidden", "--layers",
                                  "--heads", "--kv-heads", "--head-dim", "--intermediate", "--experts",
                                  "--experts-per-tok", "--moe-intermediate", "--decoder-sparse-step", "--vocab",
                                  "--max-pos", "--rope-theta", "--rope-scaling", "--rope-factor",
                                  "--rope-original-max", "--rms-norm-eps", "--dtype", "--quant-bits",
                                  "--group-size", "--router-bits", "--moe-layout", "--shard-mb",
                                  "--sliding-window", "--swiglu-limit",
                                  "--shared-intermediate", "--linear-key-heads", "--linear-value-heads",
                                  "--linear-key-dim", "--linear-value-dim", "--conv-kernel",
                                  "--full-attention-interval", "--partial-rotary", "--hybrid-layout", "--gguf",
                                  "--gguf-row-pool", "--mtp"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0) return 1;
    return 0;
}

static int set_option(mk_options *o, const char *name, const char *val) {
    int rc = set_int_option(o, name, val);
    if (rc >= 0) return rc;
    rc = set_enum_option(o, name, val);
    if (rc >= 0) return rc;
    int64_t v;
    if (strcmp(name, "--out") == 0) return o->out = val, 0;
    if (strcmp(name, "--tokenizer") == 0) return o->tokenizer = val, 0;
    if (strcmp(name, "--gguf") == 0) return o->gguf = val, 0;
    if (strcmp(name, "--preset") == 0) return 0; /* applied first */
    if (strcmp(name, "--seed") == 0) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(val, &end, 10);
        if (errno || end == val || *end || val[0] == '-') return bad("--seed wants a non-negative integer, got '%s'%s", val, "");
        return o->cfg.seed = s, 0;
    }
    if (strcmp(name, "--shard-mb") == 0) {
        if (parse_i64(val, 1, 1 << 20, &v) != 0) return bad("--shard-mb wants a positive integer, got '%s'%s", val, "");
        return o->shard_mb = (uint64_t)v, 0;
    }
    if (strcmp(name, "--rope-theta") == 0) {
        if (parse_double(val, &o->cfg.rope_theta) != 0) return bad("--rope-theta wants a positive number, got '%s'%s", val, "");
        return o->rope_theta_set = 1, 0;
    }
    if (strcmp(name, "--rope-factor") == 0) {
        if (parse_double(val, &o->cfg.rope_factor) != 0) return bad("--rope-factor wants a positive number, got '%s'%s", val, "");
        return o->factor_set = 1, 0;
    }
    if (strcmp(name, "--swiglu-limit") == 0) {
        if (parse_double(val, &o->cfg.swiglu_limit) != 0) return bad("--swiglu-limit wants a positive number, got '%s'%s", val, "");
        return o->limit_set = 1, 0;
    }
    if (strcmp(name, "--partial-rotary") == 0) {
        if (parse_double(val, &o->cfg.partial_rotary) != 0 || o->cfg.partial_rotary > 1)
            return bad("--partial-rotary wants a number in (0, 1], got '%s'%s", val, "");
        return 0;
    }
    if (strcmp(name, "--rms-norm-eps") == 0) {
        if (parse_double(val, &o->cfg.rms_norm_eps) != 0) return bad("--rms-norm-eps wants a positive number, got '%s'%s", val, "");
        return o->eps_set = 1, 0;
    }
    return bad("unknown option %s%s", name, "");
}

/* What gpt-oss-20b's config.json says, where the command line left it open: YaRN (factor 32 over
 * an original 4096 positions, theta 150000, max_position_embeddings 131072 = 32 * 4096: some
 * transformers versions take the factor from that ratio), eps 1e-5, the SwiGLU clamp 7 (transformers 5.17
 * hardcodes 7 whatever config.json says, so the reference fixtures need this value; random tiny
 * weights never reach it: the clamp is tested by hand in test_ops), a small sliding window so that
 * short prompts cross it. */
static void gpt_oss_defaults(mk_options *o) {
    mk_config *c = &o->cfg;
    if (!o->rope_theta_set) c->rope_theta = 150000.0, o->rope_theta_set = 1;
    if (!o->eps_set) c->rms_norm_eps = 1e-5, o->eps_set = 1;
    if (c->rope_scaling == MK_ROPE_NONE) c->rope_scaling = MK_ROPE_YARN;
    if (!o->factor_set) c->rope_factor = 32.0, o->factor_set = 1;
    if (!o->original_max_set) c->rope_original_max = 4096;
    if (!o->max_pos_set) c->max_pos = 131072;
    if (!o->limit_set) c->swiglu_limit = 7.0;
    if (c->sliding_window <= 0) c->sliding_window = 4;
}

/* Parses argv into o. Returns 0, 1 for --help, or 2 for bad options (message printed). */
static int parse_args(mk_options *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    mk_config *c = &o->cfg;
    c->arch = MK_QWEN3, c->dt = DTYPE_BF16, c->group_size = 64, c->router_bits = 8, c->rope_original_max = 8192;
    tiny_shape(c);
    for (int i = 1; i < argc; i++) { /* the preset first, whatever its position */
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 1;
        const char *p = NULL;
        if (strncmp(a, "--preset=", 9) == 0) p = a + 9;
        else if (strcmp(a, "--preset") == 0 && i + 1 < argc) p = argv[i + 1];
        if (p && apply_preset(o, p) != 0) return bad("unknown preset '%s'%s", p, "");
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) return bad("unexpected argument '%s'%s", a, "");
        if (strcmp(a, "--tie-embeddings") == 0) {
            c->tie_embeddings = 1;
            continue;
        }
        if (strcmp(a, "--mxfp4") == 0) {
            c->mxfp4 = 1;
            continue;
        }
        char name[64];
        const char *eq = strchr(a, '='), *val;
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
            if (!known_option(name)) return bad("unknown option %s%s", a, "");
            if (i + 1 >= argc) return bad("%s needs a value%s", a, "");
            val = argv[++i];
        }
        int rc = set_option(o, name, val);
        if (rc) return rc;
    }
    int qwen = c->arch != MK_LLAMA && c->arch != MK_GPT_OSS;
    if (c->arch == MK_GPT_OSS) gpt_oss_defaults(o);
    if (!o->rope_theta_set) c->rope_theta = qwen ? 1000000.0 : 10000.0;
    if (!o->eps_set) c->rms_norm_eps = qwen ? 1e-6 : 1e-5;
    if (!o->factor_set) c->rope_factor = c->rope_scaling == MK_ROPE_LLAMA3 ? 8.0 : c->rope_scaling == MK_ROPE_YARN ? 4.0 : 2.0;
    if (!o->tokenizer) o->tokenizer = c->arch == MK_GPT_OSS ? "gptoss" : qwen ? "qwen3" : "llama3_1";
    if (c->mxfp4 && c->arch != MK_GPT_OSS) return bad("--mxfp4 is for --arch gpt_oss (its experts)%s%s", "", "");
    if (c->mxfp4 && c->quant_bits) return bad("--mxfp4 and --quant-bits do not combine%s%s", "", "");
    if (c->mtp && (!mk_arch_is_hybrid(c->arch) || c->hybrid_mlx || o->gguf))
        return bad("--mtp is for the hybrids (qwen3_next, qwen3_5, qwen3_5_moe) in the Hugging Face "
                   "layout, as safetensors%s%s", "", "");
    if (!o->out) return bad("--out DIR is required%s%s", "", "");
    if (c->heads % c->kv_heads != 0) return bad("--heads must be a multiple of --kv-heads%s%s", "", "");
    int moe = c->arch == MK_QWEN3_MOE || c->arch == MK_QWEN3_NEXT || c->arch == MK_QWEN3_5_MOE;
    if (moe && c->experts_per_tok > c->experts)
        return bad("--experts-per-tok must not exceed --experts%s%s", "", "");
    if (mk_arch_is_hybrid(c->arch) && c->linear_value_heads % c->linear_key_heads != 0)
        return bad("--linear-value-heads must be a multiple of --linear-key-heads%s%s", "", "");
    int64_t rot = (int64_t)(c->head_dim * c->partial_rotary);
    if (mk_arch_is_hybrid(c->arch) && (rot < 2 || rot % 2 != 0))
        return bad("--head-dim times --partial-rotary must be an even number of rotary dims%s%s", "", "");
    return 0;
}

/* ---- tokenizer ---- */

/* out = a + "/" + b; -1 when it does not fit. */
static int path_join(char *out, size_t n, const char *a, const char *b) {
    int k = snprintf(out, n, "%s/%s", a, b);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

/* Is dir/tokenizer.json a file? Then out = dir. */
static int try_tokenizer_dir(const char *dir, char *out, size_t n) {
    char f[PATH_MAX];
    if (path_join(f, sizeof f, dir, "tokenizer.json") != 0 || !paths_is_file(f)) return -1;
    int k = snprintf(out, n, "%s", dir);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

static int find_tokenizer_dir(const char *name, char *out, size_t n) {
    if (strchr(name, '/')) {
        int k = snprintf(out, n, "%s", name);
        return k < 0 || (size_t)k >= n ? -1 : 0;
    }
    char p[PATH_MAX], base[PATH_MAX];
    const char *env = getenv("EXO_TOKENIZERS_DIR");
    if (env && *env && path_join(p, sizeof p, env, name) == 0 && try_tokenizer_dir(p, out, n) == 0) return 0;
    if (path_join(p, sizeof p, ".cache/tokenizers", name) == 0 && try_tokenizer_dir(p, out, n) == 0) return 0;
    /* Next to the binary: build/tools/mkmodel or build/<variant>/tools/mkmodel -> the checkout. */
    ssize_t len = readlink("/proc/self/exe", base, sizeof base - 1);
    if (len <= 0) return -1;
    base[len] = 0;
    char *slash;
    for (int up = 0; up < 4 && (slash = strrchr(base, '/')); up++) {
        *slash = 0;
        char t[PATH_MAX];
        if (path_join(t, sizeof t, base, ".cache/tokenizers") == 0 && path_join(p, sizeof p, t, name) == 0 &&
            try_tokenizer_dir(p, out, n) == 0)
            return 0;
    }
    return -1;
}

static const char *token_text(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static int64_t token_id(json_t *tok, const char *text) {
    if (!text) return -1;
    json_t *added = json_object_get(tok, "added_tokens"), *t;
    size_t i;
    json_array_foreach(added, i, t) {
        const char *c = json_string_value(json_object_get(t, "content"));
        if (c && strcmp(c, text) == 0) return json_integer_value(json_object_get(t, "id"));
    }
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    json_t *id = json_is_object(vocab) ? json_object_get(vocab, text) : NULL;
    return json_is_integer(id) ? json_integer_value(id) : -1;
}

/* Reads vocab size (max id + 1, added tokens included) and bos/eos ids. */
static int read_tokenizer(const char *dir, mk_config *c, int64_t *vocab, char *err, size_t errlen) {
    char path[PATH_MAX + 32];
    json_error_t je;
    if (path_join(path, sizeof path, dir, "tokenizer.json") != 0) return snprintf(err, errlen, "path too long"), -1;
    json_t *tok = json_load_file(path, 0, &je);
    if (!tok) {
        snprintf(err, errlen, "cannot read %.300s: %.150s (line %d)", path, je.text, je.line);
        return -1;
    }
    int64_t max_id = -1;
    json_t *vocab_j = json_object_get(json_object_get(tok, "model"), "vocab"), *v;
    const char *key;
    size_t i;
    if (json_is_object(vocab_j)) {
        json_object_foreach(vocab_j, key, v) if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    } else if (json_is_array(vocab_j)) {
        max_id = (int64_t)json_array_size(vocab_j) - 1;
    }
    json_array_foreach(json_object_get(tok, "added_tokens"), i, v) {
        int64_t id = json_integer_value(json_object_get(v, "id"));
        if (id > max_id) max_id = id;
    }
    *vocab = max_id + 1;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    /* Real configs hold integers beyond 64 bits (model_max_length 1e30): read numbers as reals. */
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    c->bos_id = c->eos_id = -1;
    if (cfg) {
        c->bos_id = token_id(tok, token_text(json_object_get(cfg, "bos_token")));
        c->eos_id = token_id(tok, token_text(json_object_get(cfg, "eos_token")));
        json_decref(cfg);
    }
    json_decref(tok);
    if (*vocab <= 0) {
        snprintf(err, errlen, "%.400s/tokenizer.json has no vocabulary", dir);
        return -1;
    }
    return 0;
}

static int copy_file(const char *from, const char *to) {
    size_t len;
    char *data = paths_read_file(from, (size_t)1 << 30, &len);
    if (!data) return -1;
    FILE *f = fopen(to, "wb");
    int rc = f && fwrite(data, 1, len, f) == len ? 0 : -1;
    if (f && fclose(f) != 0) rc = -1;
    free(data);
    return rc;
}

/* ---- JSON files ---- */

static json_t *rope_scaling_json(const mk_config *c) {
    if (c->rope_scaling == MK_ROPE_NONE) return json_null();
    json_t *r = json_object();
    json_object_set_new(r, "factor", json_real(c->rope_factor));
    if (c->rope_scaling == MK_ROPE_LLAMA3) {
        json_object_set_new(r, "high_freq_factor", json_real(4.0));
        json_object_set_new(r, "low_freq_factor", json_real(1.0));
        json_object_set_new(r, "original_max_position_embeddings", json_integer(c->rope_original_max));
        json_object_set_new(r, "rope_type", json_string("llama3"));
    } else if (c->rope_scaling == MK_ROPE_YARN) {
        json_object_set_new(r, "original_max_position_embeddings", json_integer(c->rope_original_max));
        json_object_set_new(r, "rope_type", json_string("yarn"));
        if (c->arch == MK_GPT_OSS) { /* as gpt-oss publishes it: the ramp's ends are not rounded */
            json_object_set_new(r, "beta_fast", json_real(32.0));
            json_object_set_new(r, "beta_slow", json_real(1.0));
            json_object_set_new(r, "truncate", json_false());
        }
    } else {
        json_object_set_new(r, "rope_type", json_string("linear"));
    }
    return r;
}

static json_t *quantization_json(const mk_config *c) {
    json_t *q = json_object();
    json_object_set_new(q, "group_size", json_integer(c->group_size));
    json_object_set_new(q, "bits", json_integer(c->quant_bits));
    static const char *gates[2] = {"mlp.gate", "mlp.shared_expert_gate"};
    int n_gates = mk_arch_is_hybrid(c->arch) ? 2 : 1; /* mlx-lm quantizes both gates at 8 bits */
    for (int64_t l = 0; c->router_bits != 0 && l < c->layers; l++) {
        if (!mk_layer_is_moe(c, l)) continue;
        for (int i = 0; i < n_gates; i++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, gates[i]);
            if (c->router_bits < 0) {
                json_object_set_new(q, name, json_false());
            } else {
                json_t *o = json_object();
                json_object_set_new(o, "group_size", json_integer(64));
                json_object_set_new(o, "bits", json_integer(c->router_bits));
                json_object_set_new(q, name, o);
            }
        }
    }
    return q;
}

static void gpt_oss_config_json(const mk_config *c, json_t *j) {
    json_t *types = json_array();
    for (int64_t l = 0; l < c->layers; l++)
        json_array_append_new(types, json_string(l % 2 == 0 ? "sliding_attention" : "full_attention"));
    json_object_set_new(j, "layer_types", types);
    json_object_set_new(j, "sliding_window", json_integer(c->sliding_window));
    json_object_set_new(j, "num_local_experts", json_integer(c->experts));
    json_object_set_new(j, "num_experts_per_tok", json_integer(c->experts_per_tok));
    json_object_set_new(j, "experts_per_token", json_integer(c->experts_per_tok));
    json_object_set_new(j, "swiglu_limit", json_real(c->swiglu_limit));
    json_object_set_new(j, "initial_context_length", json_integer(c->rope_original_max));
    json_object_set_new(j, "output_router_logits", json_false());
    json_object_set_new(j, "router_aux_loss_coef", json_real(0.9));
    if (c->mxfp4) { /* as in openai/gpt-oss-20b: everything but the experts stays bf16 */
        json_t *q = json_object(), *keep = json_array();
        const char *names[] = {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"};
        for (int i = 0; i < 4; i++) json_array_append_new(keep, json_string(names[i]));
        json_object_set_new(q, "modules_to_not_convert", keep);
        json_object_set_new(q, "quant_method", json_string("mxfp4"));
        json_object_set_new(j, "quantization_config", q);
    }
}

static json_t *id_or_null(int64_t id) { return id >= 0 ? json_integer(id) : json_null(); }

/* The hybrids' fields: layer types, GatedDeltaNet shape, partial rotary (Qwen3-Next: top-level
 * fields as its checkpoints have them; Qwen3.5: rope_parameters as transformers 5 writes them). */
static void hybrid_json(json_t *j, const mk_config *c) {
    json_t *types = json_array();
    for (int64_t l = 0; l < c->layers; l++)
        json_array_append_new(types, json_string(mk_layer_is_linear(c, l) ? "linear_attention" : "full_attention"));
    json_object_set_new(j, "layer_types", types);
    json_object_set_new(j, "full_attention_interval", json_integer(c->full_attention_interval));
    json_object_set_new(j, "linear_conv_kernel_dim", json_integer(c->conv_kernel));
    if (c->mtp) json_object_set_new(j, "mtp_num_hidden_layers", json_integer(1));
    json_object_set_new(j, "linear_key_head_dim", json_integer(c->linear_key_dim));
    json_object_set_new(j, "linear_value_head_dim", json_integer(c->linear_value_dim));
    json_object_set_new(j, "linear_num_key_heads", json_integer(c->linear_key_heads));
    json_object_set_new(j, "linear_num_value_heads", json_integer(c->linear_value_heads));
    if (c->arch == MK_QWEN3_NEXT) {
        json_object_set_new(j, "partial_rotary_factor", json_real(c->partial_rotary));
    } else {
        json_t *r = json_object(), *sec = json_array();
        int64_t half = (int64_t)(c->head_dim * c->partial_rotary) / 2, hw = half / 4;
        json_array_append_new(sec, json_integer(half - 2 * hw));
        json_array_append_new(sec, json_integer(hw));
        json_array_append_new(sec, json_integer(hw));
        json_object_set_new(r, "rope_type", json_string("default"));
        json_object_set_new(r, "rope_theta", json_real(c->rope_theta));
        json_object_set_new(r, "partial_rotary_factor", json_real(c->partial_rotary));
        json_object_set_new(r, "mrope_section", sec);
        json_object_set_new(r, "mrope_interleaved", json_true());
        json_object_set_new(j, "rope_parameters", r);
        json_object_del(j, "rope_theta");
        json_object_del(j, "rope_scaling");
    }
    if (c->arch != MK_QWEN3_5) {
        json_object_set_new(j, "num_experts", json_integer(c->experts));
        json_object_set_new(j, "num_experts_per_tok", json_integer(c->experts_per_tok));
        json_object_set_new(j, "moe_intermediate_size", json_integer(c->moe_intermediate));
        json_object_set_new(j, "shared_expert_intermediate_size", json_integer(c->shared_intermediate));
    }
    if (c->arch == MK_QWEN3_NEXT) {
        json_object_set_new(j, "norm_topk_prob", json_true());
        json_object_set_new(j, "decoder_sparse_step", json_integer(c->decoder_sparse_step));
        json_object_set_new(j, "mlp_only_layers", json_array());
    }
    if (c->arch == MK_QWEN3_5_MOE) json_object_del(j, "intermediate_size");
}

static json_t *config_json(const mk_config *c) {
    static const char *arch_names[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                       "Qwen3MoeForCausalLM", "GptOssForCausalLM", "Qwen3NextForCausalLM",
                                       "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"};
    static const char *types[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_next",
                                  "qwen3_5_text", "qwen3_5_moe_text"};
    json_t *j = json_object(), *archs = json_array();
    json_array_append_new(archs, json_string(arch_names[c->arch]));
    json_object_set_new(j, "architectures", archs);
    json_object_set_new(j, "model_type", json_string(types[c->arch]));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab));
    json_object_set_new(j, "hidden_size", json_integer(c->hidden));
    json_object_set_new(j, "intermediate_size", json_integer(c->arch == MK_GPT_OSS ? c->moe_intermediate : c->intermediate));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->layers));
    json_object_set_new(j, "num_attention_heads", json_integer(c->heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->kv_heads));
    json_object_set_new(j, "head_dim", json_integer(c->head_dim));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "max_position_embeddings", json_integer(c->max_pos));
    json_object_set_new(j, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(j, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(j, "rope_scaling", rope_scaling_json(c));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_embeddings));
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    if (c->arch != MK_QWEN2) json_object_set_new(j, "attention_bias", json_boolean(c->arch == MK_GPT_OSS));
    if (c->arch == MK_GPT_OSS) {
        gpt_oss_config_json(c, j);
    } else if (c->arch == MK_LLAMA) {
        json_object_set_new(j, "mlp_bias", json_false());
        json_object_set_new(j, "pretraining_tp", json_integer(1));
    } else if (!mk_arch_is_hybrid(c->arch)) {
        json_object_set_new(j, "use_sliding_window", json_false());
        json_object_set_new(j, "sliding_window", json_null());
        json_object_set_new(j, "max_window_layers", json_integer(c->layers));
    }
    if (c->arch == MK_QWEN3_MOE) {
        json_object_set_new(j, "num_experts", json_integer(c->experts));
        json_object_set_new(j, "num_experts_per_tok", json_integer(c->experts_per_tok));
        json_object_set_new(j, "moe_intermediate_size", json_integer(c->moe_intermediate));
        json_object_set_new(j, "norm_topk_prob", json_true());
        json_object_set_new(j, "decoder_sparse_step", json_integer(c->decoder_sparse_step));
        json_object_set_new(j, "mlp_only_layers", json_array());
        json_object_set_new(j, "output_router_logits", json_false());
        json_object_set_new(j, "router_aux_loss_coef", json_real(0.001));
    }
    if (mk_arch_is_hybrid(c->arch)) hybrid_json(j, c);
    json_object_set_new(j, "bos_token_id", id_or_null(c->bos_id));
    json_object_set_new(j, "eos_token_id", id_or_null(c->eos_id));
    json_object_set_new(j, "initializer_range", json_real(0.02));
    json_object_set_new(j, "use_cache", json_true());
    json_object_set_new(j, "torch_dtype",
                        json_string(c->dt == DTYPE_F32 ? "float32" : c->dt == DTYPE_F16 ? "float16" : "bfloat16"));
    if (c->quant_bits) {
        json_object_set_new(j, "quantization", quantization_json(c));
        json_object_set_new(j, "quantization_config", quantization_json(c));
    }
    return j;
}

static int dump_json(json_t *j, const char *dir, const char *name) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(j);
    if (rc != 0) fprintf(stderr, "mkmodel: cannot write %s: %s\n", path, strerror(errno));
    return rc;
}

static int write_tokenizer(const char *tokdir, const char *out) {
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"};
    for (int i = 0; i < 3; i++) {
        char from[PATH_MAX + 32], to[PATH_MAX + 32];
        snprintf(from, sizeof from, "%s/%s", tokdir, files[i]);
        snprintf(to, sizeof to, "%s/%s", out, files[i]);
        if (!paths_is_file(from) && i > 0) continue;
        if (copy_file(from, to) != 0) {
            fprintf(stderr, "mkmodel: cannot copy %s to %s: %s\n", from, to, strerror(errno));
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    mk_options o;
    int rc = parse_args(&o, argc, argv);
    if (rc == 1) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (rc) return rc;
    mk_config *c = &o.cfg;
    char err[512] = {0}, tokdir[PATH_MAX] = {0};
    int64_t tok_vocab = 0;
    int with_tokenizer = strcmp(o.tokenizer, "none") != 0;
    c->bos_id = c->eos_id = -1;
    if (with_tokenizer) {
        if (find_tokenizer_dir(o.tokenizer, tokdir, sizeof tokdir) != 0) {
            fprintf(stderr,
                    "mkmodel: tokenizer '%s' not found: run scripts/tokenizers.sh (it fills .cache/tokenizers/), "
                    "set EXO_TOKENIZERS_DIR, or pass a directory holding tokenizer.json\n",
                    o.tokenizer);
            return 2;
        }
        if (read_tokenizer(tokdir, c, &tok_vocab, err, sizeof err) != 0) {
            fprintf(stderr, "mkmodel: %s\n", err);
            return 1;
        }
    }
    if (o.vocab_set == 2) c->vocab = o.vocab_override;
    else if (!o.vocab_set || c->vocab < tok_vocab) c->vocab = tok_vocab;
    if (c->vocab <= 0) return bad("--tokenizer none needs --vocab N%s%s", "", "");
    if (o.gguf) c->moe_layout_mlx = 1; /* GGUF stacks experts */
    if (c->gguf_row_pool && !o.gguf) return bad("--gguf-row-pool needs --gguf TYPE%s%s", "", "");
    mk_plan plan;
    if (mk_plan_build(c, &plan, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        return 2;
    }
    if (paths_mkdir_p(o.out) != 0) {
        fprintf(stderr, "mkmodel: cannot create %s: %s\n", o.out, strerror(errno));
        mk_plan_free(&plan);
        return 1;
    }
    if (o.gguf) {
        char path[PATH_MAX];
        path_join(path, sizeof path, o.out, "model.gguf");
        rc = mk_write_gguf(c, &plan, with_tokenizer ? tokdir : NULL, o.gguf, path, err, sizeof err);
        mk_plan_free(&plan);
        if (rc) fprintf(stderr, "mkmodel: %s\n", err);
        return rc ? 1 : 0;
    }
    rc = mk_write_safetensors(c, &plan, o.out, o.shard_mb << 20, err, sizeof err);
    mk_plan_free(&plan);
    if (rc != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        return 1;
    }
    json_t *gen = json_object();
    json_object_set_new(gen, "bos_token_id", id_or_null(c->bos_id));
    json_object_set_new(gen, "eos_token_id", id_or_null(c->eos_id));
    json_object_set_new(gen, "do_sample", json_false());
    if (dump_json(config_json(c), o.out, "config.json") != 0 || dump_json(gen, o.out, "generation_config.json") != 0)
        return 1;
    if (with_tokenizer && write_tokenizer(tokdir, o.out) != 0) return 1;
    return 0;
}
