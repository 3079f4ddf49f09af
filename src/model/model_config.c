/* config.json -> model_config, every field validated. See model_config.h. */
#include "model/model_config.h"

#include "base/error.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "base/paths.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value of key, an integer (integer) or any number. NULL when it is missing or null (then
 * *rc is -1 with err set when the field is required, else 0) or of another type (*rc -1). */
static json_t *field_value(json_t *o, const char *key, int required, int integer, int *rc,
                           char *err, size_t errlen) {
    json_t *v = json_object_get(o, key);
    *rc = 0;
    if (!v || json_is_null(v)) {
        if (required) {
            error_set(err, errlen, "config.json: missing required field '%s'", key);
            *rc = -1;
        }
        return NULL;
    }
    if (integer ? json_is_integer(v) : json_is_number(v)) return v;
    error_set(err, errlen, "config.json: '%s' must be %s", key,
              integer ? "an integer" : "a number");
    *rc = -1;
    return NULL;
}

/* A number field in [lo, hi] (integer: it must be a JSON integer, and the message shows it as
 * one). Missing: *out = def, or an error when required. */
static int get_number(json_t *o, const char *key, int required, int integer, double def,
                      double lo, double hi, double *out, char *err, size_t errlen) {
    int rc;
    json_t *v = field_value(o, key, required, integer, &rc, err, errlen);
    if (!v) {
        if (!rc) *out = def;
        return rc;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        if (integer)
            error_set(err, errlen, "config.json: '%s' = %lld is out of range [%lld, %lld]", key,
                      (long long)json_integer_value(v), (long long)lo, (long long)hi);
        else
            error_set(err, errlen, "config.json: '%s' = %g is out of range [%g, %g]", key, x, lo,
                      hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* get_number for an int field; lo and hi are small enough to be exact as doubles. */
static int get_int(json_t *o, const char *key, int required, int def, long long lo, long long hi,
                   int *out, char *err, size_t errlen) {
    double x;
    int rc = get_number(o, key, required, 1, def, (double)lo, (double)hi, &x, err, errlen);
    if (!rc) *out = (int)x;
    return rc;
}

static int get_num(json_t *o, const char *key, int required, double def, double lo, double hi,
                   double *out, char *err, size_t errlen) {
    return get_number(o, key, required, 0, def, lo, hi, out, err, errlen);
}

static int get_bool(json_t *o, const char *key, int def, int *out, char *err, size_t errlen) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) {
        error_set(err, errlen, "config.json: '%s' must be true or false", key);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

static int parse_family(const char *arch, model_family *f) {
    static const struct {
        const char *name;
        model_family family;
    } known[] = {
        {"LlamaForCausalLM", MODEL_FAMILY_LLAMA},     {"MistralForCausalLM", MODEL_FAMILY_LLAMA},
        {"Qwen2ForCausalLM", MODEL_FAMILY_QWEN2},     {"Qwen3ForCausalLM", MODEL_FAMILY_QWEN3},
        {"Qwen3MoeForCausalLM", MODEL_FAMILY_QWEN3_MOE}, {"GptOssForCausalLM", MODEL_FAMILY_GPT_OSS},
        {"Qwen3NextForCausalLM", MODEL_FAMILY_QWEN3_NEXT},
        {"Qwen3_5ForCausalLM", MODEL_FAMILY_QWEN3_NEXT},
        {"Qwen3_5MoeForCausalLM", MODEL_FAMILY_QWEN3_NEXT},
        {"Qwen3_5ForConditionalGeneration", MODEL_FAMILY_QWEN3_NEXT},
        {"Qwen3_5MoeForConditionalGeneration", MODEL_FAMILY_QWEN3_NEXT},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(known[i].name, arch)) {
            *f = known[i].family;
            return 0;
        }
    return -1;
}

static int check_supported_string(json_t *o, const char *key, const char *supported,
                                  const char *what, const char *supported_hint, char *err,
                                  size_t errlen);

/* partial_rotary_factor (top level, or in rope_parameters): the rotary dims of each head. */
static int parse_partial_rotary(json_t *o, model_config *c, char *err, size_t errlen) {
    double f;
    if (get_num(o, "partial_rotary_factor", 0, 1.0, 1e-3, 1.0, &f, err, errlen)) return -1;
    if (!json_object_get(o, "partial_rotary_factor")) return 0;
    int dims = (int)(c->head_dim * f);
    if (dims < 2 || dims % 2) {
        error_set(err, errlen, "config.json: partial_rotary_factor %g of head_dim %d is not an even "
                  "number of rotary dims", f, c->head_dim);
        return -1;
    }
    c->rope.partial_dims = dims;
    return 0;
}

/* transformers 5's rope_parameters: theta and partial rotary; only the default type (the
 * multimodal mrope sections of Qwen3.5 rotate text positions exactly as plain RoPE does). */
static int parse_rope_parameters(json_t *p, model_config *c, char *err, size_t errlen) {
    if (!json_is_object(p)) {
        error_set(err, errlen, "config.json: 'rope_parameters' must be an object");
        return -1;
    }
    if (check_supported_string(p, "rope_type", "default", "rope_parameters rope_type", "default",
                               err, errlen) ||
        get_num(p, "rope_theta", 0, c->rope.theta, 1.0, 1e12, &c->rope.theta, err, errlen))
        return -1;
    return parse_partial_rotary(p, c, err, errlen);
}

static int parse_rope(json_t *root, model_config *c, char *err, size_t errlen) {
    rope_config *r = &c->rope;
    if (get_num(root, "rope_theta", 0, 10000.0, 1.0, 1e12, &r->theta, err, errlen)) return -1;
    r->partial_dims = c->head_dim;
    r->type = ROPE_DEFAULT;
    r->factor = 1.0;
    r->truncate = 1;
    if (parse_partial_rotary(root, c, err, errlen)) return -1;
    json_t *p = json_object_get(root, "rope_parameters");
    if (p && !json_is_null(p) && parse_rope_parameters(p, c, err, errlen)) return -1;
    json_t *s = json_object_get(root, "rope_scaling");
    if (!s || json_is_null(s)) return 0;
    if (!json_is_object(s)) {
        error_set(err, errlen, "config.json: 'rope_scaling' must be an object or null");
        return -1;
    }
    json_t *t = json_object_get(s, "rope_type");
    if (!t) t = json_object_get(s, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : NULL;
    if (!type) {
        error_set(err, errlen, "config.json: rope_scaling needs a 'rope_type'");
        return -1;
    }
    if (!strcmp(type, "default")) return 0;
    if (get_num(s, "factor", 1, 1.0, 1.0, 1e4, &r->factor, err, errlen)) return -1;
    if (!strcmp(type, "linear")) {
        r->type = ROPE_LINEAR;
        return 0;
    }
    if (!strcmp(type, "llama3")) {
        r->type = ROPE_LLAMA3;
        if (get_num(s, "low_freq_factor", 1, 0, 1e-6, 1e6, &r->low_freq_factor, err, errlen) ||
            get_num(s, "high_freq_factor", 1, 0, 1e-6, 1e6, &r->high_freq_factor, err, errlen) ||
            get_int(s, "original_max_position_embeddings", 1, 0, 1, 1 << 24,
                    &r->original_max_position, err, errlen))
            return -1;
        if (r->high_freq_factor <= r->low_freq_factor) {
            error_set(err, errlen,
                      "config.json: rope_scaling high_freq_factor must exceed low_freq_factor");
            return -1;
        }
        return 0;
    }
    if (!strcmp(type, "yarn")) {
        r->type = ROPE_YARN;
        if (get_int(s, "original_max_position_embeddings", 0, c->max_position_embeddings, 1,
                    1 << 24, &r->original_max_position, err, errlen) ||
            get_num(s, "beta_fast", 0, 32.0, 1e-6, 1e6, &r->beta_fast, err, errlen) ||
            get_num(s, "beta_slow", 0, 1.0, 1e-6, 1e6, &r->beta_slow, err, errlen) ||
            get_num(s, "attention_factor", 0, 0.0, 0.0, 100.0, &r->attention_factor, err, errlen) ||
            get_bool(s, "truncate", 1, &r->truncate, err, errlen))
            return -1;
        if (json_object_get(s, "mscale") || json_object_get(s, "mscale_all_dim")) {
            error_set(err, errlen, "config.json: yarn with mscale/mscale_all_dim is not supported");
            return -1;
        }
        return 0;
    }
    error_set(err, errlen,
              "config.json: rope_scaling type '%.32s' is not supported "
              "(default, linear, llama3, yarn)",
              type);
    return -1;
}

static int parse_token_ids(json_t *root, model_config *c, char *err, size_t errlen) {
    c->bos_id = -1;
    json_t *b = json_object_get(root, "bos_token_id");
    if (json_is_integer(b) && json_integer_value(b) >= 0 && json_integer_value(b) < c->vocab_size)
        c->bos_id = (int32_t)json_integer_value(b);
    json_t *e = json_object_get(root, "eos_token_id");
    c->n_eos = 0;
    if (json_is_integer(e)) {
        json_t *one = e;
        e = json_array();
        json_array_append(e, one);
    } else if (json_is_array(e)) {
        json_incref(e);
    } else {
        if (e && !json_is_null(e)) {
            error_set(err, errlen, "config.json: 'eos_token_id' must be an integer or a list");
            return -1;
        }
        return 0;
    }
    size_t i;
    json_t *v;
    int rc = 0;
    json_array_foreach(e, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= c->vocab_size) {
            error_set(err, errlen, "config.json: eos_token_id entry %zu is not a token id", i);
            rc = -1;
            break;
        }
        if (c->n_eos < MODEL_CONFIG_MAX_EOS) c->eos_ids[c->n_eos++] = (int32_t)json_integer_value(v);
    }
    json_decref(e);
    return rc;
}

static int parse_moe(json_t *root, model_config *c, char *err, size_t errlen) {
    if (get_int(root, "num_experts", 1, 0, 1, 4096, &c->n_experts, err, errlen) ||
        get_int(root, "num_experts_per_tok", 1, 0, 1, c->n_experts, &c->n_experts_per_tok, err,
                errlen) ||
        get_int(root, "moe_intermediate_size", 1, 0, 1, 1 << 20, &c->moe_intermediate_size, err,
                errlen) ||
        get_bool(root, "norm_topk_prob", 0, &c->norm_topk_prob, err, errlen) ||
        get_int(root, "decoder_sparse_step", 0, 1, 1, 1 << 16, &c->decoder_sparse_step, err,
                errlen))
        return -1;
    if (get_int(root, "intermediate_size", 0, c->moe_intermediate_size, 1, 1 << 20,
                &c->intermediate_size, err, errlen))
        return -1;
    json_t *m = json_object_get(root, "mlp_only_layers");
    if (m && !json_is_null(m)) {
        if (!json_is_array(m)) {
            error_set(err, errlen, "config.json: 'mlp_only_layers' must be a list");
            return -1;
        }
        size_t i;
        json_t *v;
        json_array_foreach(m, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= c->n_layers || json_integer_value(v) >= 256) {
                error_set(err, errlen, "config.json: mlp_only_layers entry %zu is not a layer", i);
                return -1;
            }
            int l = (int)json_integer_value(v);
            c->mlp_only_layers[l / 64] |= 1ull << (l % 64);
        }
    }
    return 0;
}

/* gpt-oss: every layer is MoE (num_local_experts, experts_per_token; intermediate_size is each
 * expert's hidden dim; softmax over the top-k router logits, which is softmax-then-renormalise),
 * layer_types alternate sliding_attention / full_attention, swiglu_limit clamps the experts. */
static int parse_gpt_oss(json_t *root, model_config *c, char *err, size_t errlen) {
    int per_tok_default = 0;
    if (get_int(root, "num_local_experts", 1, 0, 1, 4096, &c->n_experts, err, errlen) ||
        get_int(root, "experts_per_token", 0, 0, 1, c->n_experts, &per_tok_default, err, errlen) ||
        get_int(root, "num_experts_per_tok", per_tok_default == 0, per_tok_default, 1, c->n_experts,
                &c->n_experts_per_tok, err, errlen) ||
        get_int(root, "intermediate_size", 1, 0, 1, 1 << 20, &c->moe_intermediate_size, err, errlen) ||
        get_int(root, "sliding_window", 0, 0, 1, 1 << 24, &c->sliding_window, err, errlen))
        return -1;
    double limit;
    if (get_num(root, "swiglu_limit", 0, 7.0, 1e-6, 1e9, &limit, err, errlen)) return -1;
    c->swiglu_limit = (float)limit;
    c->swiglu_alpha = 1.702f; /* GptOssExperts.alpha: not in config.json */
    c->intermediate_size = c->moe_intermediate_size;
    c->decoder_sparse_step = 1;
    c->norm_topk_prob = 1;
    c->attention_sinks = 1;
    c->moe_bias = 1;
    json_t *types = json_object_get(root, "layer_types");
    if (!types || json_is_null(types)) { /* transformers' default: even layers slide */
        for (int i = 0; i < c->n_layers && i < 256; i++)
            if (i % 2 == 0) c->sliding_layers[i / 64] |= 1ull << (i % 64);
    } else if (!json_is_array(types) || (int)json_array_size(types) != c->n_layers) {
        error_set(err, errlen, "config.json: 'layer_types' must list one type per layer (%d)", c->n_layers);
        return -1;
    } else {
        size_t i;
        json_t *v;
        json_array_foreach(types, i, v) {
            const char *t = json_string_value(v);
            int sliding = t && !strcmp(t, "sliding_attention");
            if (!t || (!sliding && strcmp(t, "full_attention"))) {
                error_set(err, errlen, "config.json: layer_types entry %zu must be 'sliding_attention' or "
                          "'full_attention'", i);
                return -1;
            }
            if (sliding) c->sliding_layers[i / 64] |= 1ull << (i % 64);
        }
    }
    if (c->n_layers > 256) {
        error_set(err, errlen, "config.json: gpt-oss with more than 256 layers is not supported");
        return -1;
    }
    if (!c->sliding_window) memset(c->sliding_layers, 0, sizeof c->sliding_layers);
    return 0;
}

/* Fails when o[key] is a string other than the one value exo supports; absent is fine.
 * what names the field in the message, supported_hint says what is supported. */
static int check_supported_string(json_t *o, const char *key, const char *supported,
                                  const char *what, const char *supported_hint, char *err,
                                  size_t errlen) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v) || !strcmp(json_string_value(v), supported)) return 0;
    error_set(err, errlen, "config.json: %s '%.32s' is not supported (%s only)", what,
              json_string_value(v), supported_hint);
    return -1;
}

static int parse_quantization(json_t *root, model_config *c, char *err, size_t errlen) {
    json_t *q = json_object_get(root, "quantization");
    if (!q) q = json_object_get(root, "quantization_config");
    if (!q || json_is_null(q)) return 0;
    if (!json_is_object(q)) {
        error_set(err, errlen, "config.json: 'quantization' must be an object");
        return -1;
    }
    /* gpt-oss as OpenAI publishes it: MXFP4 experts (the loader finds their _blocks/_scales),
     * everything else dense */
    json_t *method = json_object_get(q, "quant_method");
    if (c->family == MODEL_FAMILY_GPT_OSS && json_is_string(method) && !strcmp(json_string_value(method), "mxfp4"))
        return 0;
    if (check_supported_string(q, "quant_method", "mlx", "quantization method", "mlx affine", err,
                               errlen) ||
        check_supported_string(q, "mode", "affine", "quantization mode", "affine", err, errlen))
        return -1;
    if (get_int(q, "bits", 1, 0, 2, 8, &c->quant_bits, err, errlen) ||
        get_int(q, "group_size", 1, 0, 32, 128, &c->quant_group_size, err, errlen))
        return -1;
    int b = c->quant_bits, g = c->quant_group_size;
    if (b == 7 || (g != 32 && g != 64 && g != 128)) {
        error_set(err, errlen,
                  "config.json: quantization bits %d / group_size %d not supported "
                  "(bits 2,3,4,5,6,8; group 32,64,128)",
                  b, g);
        return -1;
    }
    return 0;
}

/* The layer types of a hybrid: "layer_types" (linear_attention / full_attention), else every
 * full_attention_interval-th layer is full attention. */
static int parse_layer_types(json_t *o, model_config *c, char *err, size_t errlen) {
    json_t *types = json_object_get(o, "layer_types");
    if (!types || json_is_null(types)) {
        int interval;
        if (get_int(o, "full_attention_interval", 0, 4, 1, 1 << 16, &interval, err, errlen))
            return -1;
        for (int l = 0; l < c->n_layers; l++)
            if ((l + 1) % interval) c->linear_layers[l / 64] |= 1ull << (l % 64);
        return 0;
    }
    if (!json_is_array(types) || json_array_size(types) != (size_t)c->n_layers) {
        error_set(err, errlen, "config.json: 'layer_types' must list num_hidden_layers (%d) types",
                  c->n_layers);
        return -1;
    }
    size_t i;
    json_t *v;
    json_array_foreach(types, i, v) {
        const char *t = json_string_value(v);
        if (t && !strcmp(t, "linear_attention")) {
            c->linear_layers[i / 64] |= 1ull << (i % 64);
        } else if (!t || strcmp(t, "full_attention")) {
            error_set(err, errlen, "config.json: layer_types entry %zu is not linear_attention or "
                      "full_attention", i);
            return -1;
        }
    }
    return 0;
}

/* The GatedDeltaNet shape, gated attention, (1 + w) norms and the MoE with a shared expert of
 * Qwen3-Next / Qwen3.5. */
static int parse_hybrid(json_t *o, model_config *c, char *err, size_t errlen) {
    if (c->n_layers > MODEL_CONFIG_MAX_LAYERS_BITSET) {
        error_set(err, errlen, "config.json: hybrid models of more than %d layers are not supported",
                  MODEL_CONFIG_MAX_LAYERS_BITSET);
        return -1;
    }
    if (parse_layer_types(o, c, err, errlen) ||
        get_int(o, "linear_conv_kernel_dim", 0, 4, 1, 64, &c->linear_conv_kernel, err, errlen) ||
        get_int(o, "linear_key_head_dim", 0, 128, 1, 1024, &c->linear_key_dim, err, errlen) ||
        get_int(o, "linear_value_head_dim", 0, 128, 1, 1024, &c->linear_value_dim, err, errlen) ||
        get_int(o, "linear_num_key_heads", 0, 16, 1, 1024, &c->linear_key_heads, err, errlen) ||
        get_int(o, "linear_num_value_heads", 0, 32, 1, 1024, &c->linear_value_heads, err, errlen))
        return -1;
    if (c->linear_value_heads % c->linear_key_heads) {
        error_set(err, errlen, "config.json: linear_num_value_heads %d is not a multiple of "
                  "linear_num_key_heads %d", c->linear_value_heads, c->linear_key_heads);
        return -1;
    }
    c->linear_fused_projections = !strcmp(c->architecture, "Qwen3NextForCausalLM");
    c->attn_output_gate = 1;
    c->norm_zero_centred = 1;
    c->qk_norm = 1;
    json_t *experts = json_object_get(o, "num_experts");
    if (!experts || json_is_null(experts) || (json_is_integer(experts) && !json_integer_value(experts)))
        return get_int(o, "intermediate_size", 1, 0, 1, 1 << 20, &c->intermediate_size, err, errlen);
    if (parse_moe(o, c, err, errlen) ||
        get_int(o, "shared_expert_intermediate_size", 0, 0, 0, 1 << 20,
                &c->shared_expert_intermediate_size, err, errlen))
        return -1;
    /* Qwen3.5-MoE's router always renormalises its top k (it has no norm_topk_prob) */
    if (strstr(c->architecture, "Qwen3_5Moe")) c->norm_topk_prob = 1;
    return 0;
}

static int parse_root(json_t *root, model_config *c, char *err, size_t errlen) {
    if (!json_is_object(root)) {
        error_set(err, errlen, "config.json: not a JSON object");
        return -1;
    }
    json_t *archs = json_object_get(root, "architectures");
    json_t *a0 = json_is_array(archs) ? json_array_get(archs, 0) : NULL;
    if (!json_is_string(a0)) {
        error_set(err, errlen, "config.json: missing 'architectures' list");
        return -1;
    }
    snprintf(c->architecture, sizeof c->architecture, "%s", json_string_value(a0));
    if (parse_family(json_string_value(a0), &c->family) != 0) {
        error_set(err, errlen,
                  "config.json: architecture '%s' is not supported (Llama, Mistral, "
                  "Qwen2, Qwen3, Qwen3-MoE, gpt-oss, Qwen3-Next, Qwen3.5)",
                  c->architecture);
        return -1;
    }
    /* a multimodal checkpoint keeps the language model's fields under text_config */
    json_t *top = root, *text = json_object_get(root, "text_config");
    if (json_is_object(text)) root = text;
    if (get_int(root, "vocab_size", 1, 0, 1, 1 << 22, &c->vocab_size, err, errlen) ||
        get_int(root, "hidden_size", 1, 0, 1, 1 << 16, &c->hidden_size, err, errlen) ||
        get_int(root, "num_hidden_layers", 1, 0, 1, 1024, &c->n_layers, err, errlen) ||
        get_int(root, "num_attention_heads", 1, 0, 1, 1024, &c->n_heads, err, errlen) ||
        get_int(root, "num_key_value_heads", 0, c->n_heads, 1, c->n_heads, &c->n_kv_heads, err,
                errlen) ||
        get_int(root, "max_position_embeddings", 0, 4096, 1, 1 << 24,
                &c->max_position_embeddings, err, errlen))
        return -1;
    if (c->n_heads % c->n_kv_heads) {
        error_set(err, errlen,
                  "config.json: num_attention_heads %d is not a multiple of "
                  "num_key_value_heads %d",
                  c->n_heads, c->n_kv_heads);
        return -1;
    }
    int hd_default = c->hidden_size % c->n_heads ? 0 : c->hidden_size / c->n_heads;
    if (get_int(root, "head_dim", hd_default == 0, hd_default, 2, 1024, &c->head_dim, err, errlen))
        return -1;
    if (c->head_dim < 2 || c->head_dim % 2 || c->head_dim > 1024) {
        error_set(err, errlen,
                  "config.json: head_dim %d must be even and in [2, 1024] "
                  "(hidden_size / num_attention_heads when absent)",
                  c->head_dim);
        return -1;
    }
    double eps;
    if (get_num(root, "rms_norm_eps", 0, 1e-6, 0.0, 1.0, &eps, err, errlen)) return -1;
    c->rms_norm_eps = (float)eps;
    int top_tied = 0;
    if (get_bool(top, "tie_word_embeddings", 0, &top_tied, err, errlen) ||
        get_bool(root, "tie_word_embeddings", top_tied, &c->tie_word_embeddings, err, errlen) ||
        get_bool(root, "attention_bias", c->family == MODEL_FAMILY_QWEN2 || c->family == MODEL_FAMILY_GPT_OSS,
                 &c->attention_bias, err, errlen))
        return -1;
    int mlp_bias = 0;
    if (get_bool(root, "mlp_bias", 0, &mlp_bias, err, errlen)) return -1;
    if (mlp_bias) {
        error_set(err, errlen, "config.json: mlp_bias is not supported");
        return -1;
    }
    int sliding = 0;
    if (get_bool(root, "use_sliding_window", 0, &sliding, err, errlen)) return -1;
    if (sliding) {
        error_set(err, errlen, "config.json: use_sliding_window is not supported");
        return -1;
    }
    if (c->family == MODEL_FAMILY_LLAMA) { /* Mistral v0.1: full attention is exact up to it */
        int window = 0;
        if (get_int(root, "sliding_window", 0, 0, 1, 1 << 24, &window, err, errlen)) return -1;
        if (window && window < c->max_position_embeddings) c->max_position_embeddings = window;
    }
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
        error_set(err, errlen, "config.json: hidden_act must be 'silu'");
        return -1;
    }
    c->qk_norm = c->family == MODEL_FAMILY_QWEN3 || c->family == MODEL_FAMILY_QWEN3_MOE;
    if (c->family == MODEL_FAMILY_QWEN3_NEXT) {
        if (parse_hybrid(root, c, err, errlen)) return -1;
    } else if (c->family == MODEL_FAMILY_QWEN3_MOE) {
        if (parse_moe(root, c, err, errlen)) return -1;
    } else if (c->family == MODEL_FAMILY_GPT_OSS) {
        if (parse_gpt_oss(root, c, err, errlen)) return -1;
    } else if (get_int(root, "intermediate_size", 1, 0, 1, 1 << 20, &c->intermediate_size, err,
                       errlen)) {
        return -1;
    }
    if (parse_rope(root, c, err, errlen) || parse_token_ids(root, c, err, errlen) ||
        (c->n_eos == 0 && top != root && parse_token_ids(top, c, err, errlen)) ||
        parse_quantization(top, c, err, errlen))
        return -1;
    return 0;
}

int model_config_parse(const char *json, size_t len, model_config *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        error_set(err, errlen, "config.json: not valid JSON: %s (line %d)", jerr.text, jerr.line);
        return -1;
    }
    int rc = parse_root(root, out, err, errlen);
    json_decref(root);
    return rc;
}

char *model_config_read_json(const char *dir, size_t *len, char *err, size_t errlen) {
    char path[4096];
    if (gguf_model_file(dir, path, sizeof path)) {
        char *text = gguf_config_json_path(path, err, errlen);
        if (text) *len = strlen(text);
        return text;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = paths_read_file(path, 16u << 20, len);
    if (!text) error_set(err, errlen, "%s: %s", path, strerror(errno));
    return text;
}

static void details_gguf(const char *path, model_details *d) {
    snprintf(d->format, sizeof d->format, "gguf");
    struct stat st;
    if (stat(path, &st) == 0) d->size = (int64_t)st.st_size;
    char err[256];
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) return;
    if (gguf_get_string(f, "general.architecture", d->family, sizeof d->family, err, sizeof err)) d->family[0] = 0;
    double params = 0, elems_of[64] = {0};
    for (int i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        double n = (double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
        params += n;
        if (t->n_dims >= 2 && t->type < 64) elems_of[t->type] += n;
    }
    int64_t ftype;
    const char *q = gguf_get_int(f, "general.file_type", &ftype, err, sizeof err) ? NULL : gguf_file_type_name(ftype);
    if (!q) { /* no (known) file type: the type most matrix elements have */
        int best = -1;
        for (int t = 0; t < 64; t++) best = elems_of[t] > 0 && (best < 0 || elems_of[t] > elems_of[best]) ? t : best;
        if (best >= 0) q = ggml_type_name((uint32_t)best);
    }
    if (q) snprintf(d->quantization, sizeof d->quantization, "%s", q);
    if (params >= 1e9) snprintf(d->parameter_size, sizeof d->parameter_size, "%.1fB", params / 1e9);
    else if (params >= 1e6) snprintf(d->parameter_size, sizeof d->parameter_size, "%.0fM", params / 1e6);
    else if (params > 0) snprintf(d->parameter_size, sizeof d->parameter_size, "%.0fK", params / 1e3);
    gguf_close(f);
}

int model_details_read(const char *dir, model_details *d) {
    memset(d, 0, sizeof *d);
    char path[4096];
    if (gguf_model_file(dir, path, sizeof path)) {
        details_gguf(path, d);
        return 0;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *text = paths_read_file(path, 16u << 20, &len);
    json_t *cfg = text ? json_loadb(text, len, 0, NULL) : NULL;
    free(text);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return -1;
    }
    snprintf(d->format, sizeof d->format, "safetensors");
    const char *family = json_string_value(json_object_get(cfg, "model_type"));
    snprintf(d->family, sizeof d->family, "%s", family ? family : "");
    json_t *quant = json_object_get(cfg, "quantization");
    if (!quant) quant = json_object_get(cfg, "quantization_config");
    json_int_t bits = json_integer_value(json_object_get(quant, "bits"));
    const char *dtype = json_string_value(json_object_get(cfg, "torch_dtype"));
    if (!dtype) dtype = json_string_value(json_object_get(cfg, "dtype"));
    if (bits > 0) snprintf(d->quantization, sizeof d->quantization, "Q%d", (int)bits);
    else if (dtype)
        snprintf(d->quantization, sizeof d->quantization, "%s",
                 !strcmp(dtype, "bfloat16") ? "BF16" : !strcmp(dtype, "float16") ? "F16"
                 : !strcmp(dtype, "float32") ? "F32" : "");
    json_decref(cfg);
    DIR *dh = opendir(dir);
    struct dirent *e;
    while (dh && (e = readdir(dh))) {
        size_t n = strlen(e->d_name);
        struct stat st;
        if (n <= 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) d->size += (int64_t)st.st_size;
    }
    if (dh) closedir(dh);
    return 0;
}

int model_config_load(const char *dir, model_config *out, char *err, size_t errlen) {
    size_t len;
    char *text = model_config_read_json(dir, &len, err, errlen);
    if (!text) return -1;
    int rc = model_config_parse(text, len, out, err, errlen);
    free(text);
    return rc;
}

int model_config_layer_window(const model_config *c, int layer) {
    if (!c->sliding_window || layer < 0 || layer >= MODEL_CONFIG_MAX_LAYERS_BITSET) return 0;
    return (c->sliding_layers[layer / 64] >> (layer % 64) & 1) ? c->sliding_window : 0;
}

int model_config_is_hybrid(const model_config *c) { return c->family == MODEL_FAMILY_QWEN3_NEXT; }

int model_config_layer_is_linear(const model_config *c, int layer) {
    return model_config_is_hybrid(c) && layer >= 0 && layer < MODEL_CONFIG_MAX_LAYERS_BITSET &&
           (c->linear_layers[layer / 64] >> (layer % 64) & 1);
}

int model_config_layer_is_moe(const model_config *c, int layer) {
    if (c->n_experts == 0) return 0;
    if (layer >= 0 && layer < 256 && (c->mlp_only_layers[layer / 64] >> (layer % 64) & 1)) return 0;
    return (layer + 1) % c->decoder_sparse_step == 0;
}

/* One dimension of a tensor-parallel split: `size` must divide by n, and when it is a quantized
 * matrix's input dim, each share must be whole groups. */
static int split_dim_check(const char *what, int size, int n, int group, char *err, size_t errlen) {
    if (size % n) {
        error_set(err, errlen, "cannot split the model %d ways: %s (%d) does not divide by %d", n,
                what, size, n);
        return -1;
    }
    if (group && (size / n) % group) {
        error_set(err, errlen, "cannot split the model %d ways: each rank's share of %s (%d) is not "
                "a multiple of the quantization group size %d", n, what, size / n, group);
        return -1;
    }
    return 0;
}

int model_config_tensor_split_check(const model_config *c, int n, char *err, size_t errlen) {
    if (n < 1) {
        error_set(err, errlen, "a tensor-parallel split needs at least 1 rank (got %d)", n);
        return -1;
    }
    if (n == 1) return 0;
    if (c->family == MODEL_FAMILY_GPT_OSS || model_config_is_hybrid(c)) {
        error_set(err, errlen, "cannot split %s %d ways: tensor parallel is not implemented for %s "
                  "yet (a pipeline split works)", c->architecture, n,
                  model_config_is_hybrid(c) ? "hybrid linear-attention models" : "gpt-oss");
        return -1;
    }
    int any_dense = 0, group = c->quant_bits ? c->quant_group_size : 0;
    for (int i = 0; i < c->n_layers; i++) any_dense |= !model_config_layer_is_moe(c, i);
    if (split_dim_check("the attention heads", c->n_heads, n, 0, err, errlen) ||
        split_dim_check("the KV heads", c->n_kv_heads, n, 0, err, errlen) ||
        split_dim_check("o_proj's input (heads x head_dim)", c->n_heads * c->head_dim, n, group,
                        err, errlen) ||
        (any_dense && split_dim_check("intermediate_size", c->intermediate_size, n, group, err,
                                      errlen)) ||
        (c->n_experts && split_dim_check("moe_intermediate_size", c->moe_intermediate_size, n,
                                         group, err, errlen)))
        return -1;
    return 0;
}
