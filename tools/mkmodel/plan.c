/* mkmodel plan — the tensor list of a checkpoint: names, shapes, how values are drawn, which
 * matrices are quantized. Names follow Hugging Face transformers for each architecture, and
 * mlx-community's conventions for quantized and stacked-expert (switch_mlp) checkpoints.
 *
 * Refuses: shapes whose quantized dimensions are not a multiple of the group size. */
#include "mkmodel.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mk_arch_is_hybrid(mk_arch a) {
    return a == MK_QWEN3_NEXT || a == MK_QWEN3_5 || a == MK_QWEN3_5_MOE;
}

int mk_layer_is_linear(const mk_config *c, int64_t layer) {
    return mk_arch_is_hybrid(c->arch) && (layer + 1) % c->full_attention_interval != 0;
}

int mk_layer_is_moe(const mk_config *c, int64_t layer) {
    if (c->arch == MK_GPT_OSS) return 1;
    if (c->experts <= 0) return 0;
    if (c->arch == MK_QWEN3_5_MOE) return 1; /* every layer (no decoder_sparse_step) */
    if (c->arch != MK_QWEN3_MOE && c->arch != MK_QWEN3_NEXT) return 0;
    int64_t step = c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1;
    return (layer + 1) % step == 0;
}

static mk_matrix *plan_add(mk_plan *p) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        mk_matrix *items = realloc(p->items, cap * sizeof *items);
        if (!items) return NULL;
        p->items = items;
        p->cap = cap;
    }
    mk_matrix *m = &p->items[p->n++];
    memset(m, 0, sizeof *m);
    m->suffix = "weight";
    return m;
}

static void set_name(char *dst, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_name(char *dst, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
}

/* Projection std: 1/sqrt(in) keeps activations O(1) through a layer (so attention is not flat and
 * each layer matters), capped at 0.1. */
static double linear_std(int64_t in) {
    double s = 1.0 / sqrt((double)in);
    return s < 0.1 ? s : 0.1;
}

typedef struct plan_ctx {
    const mk_config *cfg;
    mk_plan *plan;
    char *err;
    size_t errlen;
    int failed;
} plan_ctx;

/* The std of a projection back into the residual stream (o_proj, out_proj, down_proj): 0 for
 * --mtp agree, whose layers then add nothing, so the model predicts from the last token alone and
 * its MTP head can predict exactly what it will (see add_mtp). */
static double output_std(const plan_ctx *x, int64_t in) {
    return x->cfg->mtp == MK_MTP_AGREE ? 0.0 : linear_std(in);
}

static mk_matrix *add_linear(plan_ctx *x, const char *name, int64_t out, int64_t in, double std, int bits,
                             int group) {
    mk_matrix *m = plan_add(x->plan);
    if (!m) {
        snprintf(x->err, x->errlen, "out of memory");
        x->failed = 1;
        return NULL;
    }
    snprintf(m->name, sizeof m->name, "%s", name);
    m->out = out;
    m->in = in;
    m->std = std;
    m->init = MK_INIT_NORMAL;
    m->bits = bits;
    m->group_size = group;
    if (bits && in % group != 0 && !x->failed) {
        snprintf(x->err, x->errlen,
                 "cannot quantize %s: its input dimension %lld is not a multiple of the group size %d",
                 name, (long long)in, group);
        x->failed = 1;
    }
    return m;
}

static void add_vector(plan_ctx *x, const char *name, const char *suffix, int64_t n, mk_init init, double std) {
    mk_matrix *m = add_linear(x, name, 1, n, std, 0, 0);
    if (!m) return;
    m->suffix = suffix;
    m->vector = 1;
    m->init = init;
}

/* An RMSNorm weight: near 1 as used. The hybrids scale by (1 + w), so theirs are drawn near 0. */
static void add_norm(plan_ctx *x, const char *name, int64_t n) {
    int centred = mk_arch_is_hybrid(x->cfg->arch) && !x->cfg->hybrid_mlx;
    add_vector(x, name, "weight", n, centred ? MK_INIT_NORMAL : MK_INIT_AROUND_ONE, 0.1);
}

static void add_attention(plan_ctx *x, const char *lp) {
    const mk_config *c = x->cfg;
    char n[160];
    int64_t q = c->heads * c->head_dim, kv = c->kv_heads * c->head_dim;
    /* the hybrids' q_proj also yields the output gate: per head, head_dim query then head_dim gate */
    int64_t q_rows = mk_arch_is_hybrid(c->arch) ? 2 * q : q;
    static const char *proj[3] = {"q_proj", "k_proj", "v_proj"};
    for (int i = 0; i < 3; i++) {
        set_name(n, sizeof n, "%s.self_attn.%s", lp, proj[i]);
        add_linear(x, n, i == 0 ? q_rows : kv, c->hidden, linear_std(c->hidden), c->quant_bits, c->group_size);
        if (c->arch == MK_QWEN2 || c->arch == MK_GPT_OSS) add_vector(x, n, "bias", i == 0 ? q : kv, MK_INIT_NORMAL, 0.1);
    }
    set_name(n, sizeof n, "%s.self_attn.o_proj", lp);
    add_linear(x, n, c->hidden, q, output_std(x, q), c->quant_bits, c->group_size);
    if (c->arch == MK_GPT_OSS) {
        add_vector(x, n, "bias", c->hidden, MK_INIT_NORMAL, 0.1);
        /* one learned logit per head that competes in the softmax with zero value (std 1: a sink
         * takes a visible share of the attention, so an engine that ignores it fails) */
        set_name(n, sizeof n, "%s.self_attn", lp);
        add_vector(x, n, "sinks", c->heads, MK_INIT_NORMAL, 1.0);
    }
    if (c->arch != MK_LLAMA && c->arch != MK_QWEN2 && c->arch != MK_GPT_OSS) { /* q/k norms */
        set_name(n, sizeof n, "%s.self_attn.q_norm", lp);
        add_norm(x, n, c->head_dim);
        set_name(n, sizeof n, "%s.self_attn.k_norm", lp);
        add_norm(x, n, c->head_dim);
    }
}

/* A_log and dt_bias (no suffix) were first drawn seeded with "<name>." (the recorded hybrid
 * reference fixtures hold those values); other suffix-less tensors are seeded with the name. */
static void keep_hybrid_seed(plan_ctx *x, const char *name) {
    if (x->failed) return;
    mk_matrix *m = &x->plan->items[x->plan->n - 1];
    set_name(m->seed_fmt, sizeof m->seed_fmt, "%s.", name);
}

/* A GatedDeltaNet layer: Qwen3-Next fuses its input projections per key head (in_proj_qkvz,
 * in_proj_ba); Qwen3.5 keeps them apart (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a). */
static void add_linear_attention(plan_ctx *x, int64_t l) {
    const mk_config *c = x->cfg;
    char n[160], p[128];
    int64_t kd = c->linear_key_heads * c->linear_key_dim, vd = c->linear_value_heads * c->linear_value_dim;
    int64_t nv = c->linear_value_heads, conv_dim = 2 * kd + vd;
    int bits = c->quant_bits, g = c->group_size;
    double std = linear_std(c->hidden);
    set_name(p, sizeof p, "model.layers.%lld.linear_attn", (long long)l);
    if (c->arch == MK_QWEN3_NEXT) {
        set_name(n, sizeof n, "%s.in_proj_qkvz", p);
        add_linear(x, n, 2 * kd + 2 * vd, c->hidden, std, bits, g);
        set_name(n, sizeof n, "%s.in_proj_ba", p);
        add_linear(x, n, 2 * nv, c->hidden, std, bits, g);
    } else {
        static const char *proj[4] = {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"};
        int64_t rows[4] = {conv_dim, vd, nv, nv};
        for (int i = 0; i < 4; i++) {
            set_name(n, sizeof n, "%s.%s", p, proj[i]);
            add_linear(x, n, rows[i], c->hidden, std, bits, g);
        }
    }
    /* depthwise conv weight [conv_dim][1][kernel] as torch's Conv1d stores it, or [conv_dim][kernel][1]
     * as mlx-lm does (the same values in the same order); never quantized */
    set_name(n, sizeof n, "%s.conv1d", p);
    mk_matrix *conv = c->hybrid_mlx ? add_linear(x, n, c->conv_kernel, 1, 0.5, 0, 0)
                                    : add_linear(x, n, 1, c->conv_kernel, 0.5, 0, 0);
    if (conv) {
        conv->stack = conv_dim;
        set_name(conv->seed_fmt, sizeof conv->seed_fmt, "%s.conv1d.weight.%%lld", p);
    }
    /* A = exp(A_log) near 0.2 and dt_bias near 1: a per-token decay of about 0.75, so the state
     * carries several tokens back */
    set_name(n, sizeof n, "%s.A_log", p);
    add_vector(x, n, "", nv, MK_INIT_NORMAL, 0.5);
    if (!x->failed) x->plan->items[x->plan->n - 1].mean = -1.5;
    keep_hybrid_seed(x, n);
    set_name(n, sizeof n, "%s.dt_bias", p);
    add_vector(x, n, "", nv, MK_INIT_AROUND_ONE, 0.1);
    keep_hybrid_seed(x, n);
    set_name(n, sizeof n, "%s.norm", p);
    add_vector(x, n, "weight", c->linear_value_dim, MK_INIT_AROUND_ONE, 0.1);
    set_name(n, sizeof n, "%s.out_proj", p);
    add_linear(x, n, c->hidden, vd, output_std(x, vd), bits, g);
}

static void add_mlp(plan_ctx *x, const char *prefix, int64_t inter) {
    const mk_config *c = x->cfg;
    char n[160];
    set_name(n, sizeof n, "%s.gate_proj", prefix);
    add_linear(x, n, inter, c->hidden, linear_std(c->hidden), c->quant_bits, c->group_size);
    set_name(n, sizeof n, "%s.up_proj", prefix);
    add_linear(x, n, inter, c->hidden, linear_std(c->hidden), c->quant_bits, c->group_size);
    set_name(n, sizeof n, "%s.down_proj", prefix);
    add_linear(x, n, c->hidden, inter, output_std(x, inter), c->quant_bits, c->group_size);
}

static void add_moe(plan_ctx *x, const char *lp) {
    const mk_config *c = x->cfg;
    char n[160];
    int rbits = c->quant_bits, rgroup = c->group_size;
    if (c->quant_bits && c->router_bits > 0) rbits = c->router_bits, rgroup = 64;
    if (c->router_bits < 0) rbits = 0, rgroup = 0;
    set_name(n, sizeof n, "%s.mlp.gate", lp);
    add_linear(x, n, c->experts, c->hidden, 2.0 / sqrt((double)c->hidden), rbits, rgroup);
    if (mk_arch_is_hybrid(c->arch)) { /* a shared expert beside the routed ones, sigmoid-gated */
        char prefix[128];
        set_name(prefix, sizeof prefix, "%s.mlp.shared_expert", lp);
        add_mlp(x, prefix, c->shared_intermediate);
        set_name(n, sizeof n, "%s.mlp.shared_expert_gate", lp);
        add_linear(x, n, 1, c->hidden, linear_std(c->hidden), rbits, rgroup);
    }
    static const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
    if (!c->moe_layout_mlx) {
        for (int64_t e = 0; e < c->experts; e++) {
            char prefix[128];
            set_name(prefix, sizeof prefix, "%s.mlp.experts.%lld", lp, (long long)e);
            add_mlp(x, prefix, c->moe_intermediate);
        }
        return;
    }
    for (int i = 0; i < 3; i++) {
        int down = i == 2;
        int64_t out = down ? c->hidden : c->moe_intermediate, in = down ? c->moe_intermediate : c->hidden;
        set_name(n, sizeof n, "%s.mlp.switch_mlp.%s", lp, proj[i]);
        mk_matrix *m = add_linear(x, n, out, in, down ? output_std(x, in) : linear_std(in),
                                  c->quant_bits, c->group_size);
        if (!m) return;
        m->stack = c->experts;
        set_name(m->seed_fmt, sizeof m->seed_fmt, "%s.mlp.experts.%%lld.%s.weight", lp, proj[i]);
    }
}

/* gpt-oss experts as transformers' GptOssExperts holds them: fused gate_up (gate and up
 * interleaved: row 2j is gate j, row 2j+1 up j) and down, with biases; per expert values are drawn
 * as [out, in] so that the MXFP4 model is the quantization of exactly the values of its bf16 twin. */
static void add_gpt_oss_moe(plan_ctx *x, int64_t l) {
    const mk_config *c = x->cfg;
    char n[160];
    set_name(n, sizeof n, "model.layers.%lld.mlp.router", (long long)l);
    add_linear(x, n, c->experts, c->hidden, 2.0 / sqrt((double)c->hidden), 0, 0);
    add_vector(x, n, "bias", c->experts, MK_INIT_NORMAL, 0.1);
    static const char *proj[2] = {"gate_up_proj", "down_proj"};
    for (int i = 0; i < 2; i++) {
        int down = i == 1;
        int64_t out = down ? c->hidden : 2 * c->moe_intermediate, in = down ? c->moe_intermediate : c->hidden;
        set_name(n, sizeof n, "model.layers.%lld.mlp.experts.%s", (long long)l, proj[i]);
        mk_matrix *m = add_linear(x, n, out, in, linear_std(in), 0, 0);
        if (!m) return;
        m->suffix = "";
        m->stack = c->experts;
        m->mxfp4 = c->mxfp4;
        m->transposed = !c->mxfp4;
        set_name(m->seed_fmt, sizeof m->seed_fmt, "model.layers.%lld.mlp.experts.%%lld.%s", (long long)l, proj[i]);
        if (c->mxfp4 && in % 32 != 0 && !x->failed) {
            snprintf(x->err, x->errlen, "cannot write %s as MXFP4: its input dimension %lld is not a multiple of 32",
                     n, (long long)in);
            x->failed = 1;
        }
        char bias[160];
        set_name(bias, sizeof bias, "%s_bias", n);
        mk_matrix *b = add_linear(x, bias, c->experts, out, 0.1, 0, 0);
        if (b) b->suffix = "";
    }
}

/* Decoder layer `layer` under the name prefix lp (model.layers.N, or the MTP head's layer, which
 * is a full-attention layer with the MLP kind of the model's last layer: layer -1). */
static void add_layer(plan_ctx *x, const char *lp, int64_t layer) {
    const mk_config *c = x->cfg;
    char n[160], prefix[128];
    set_name(n, sizeof n, "%s.input_layernorm", lp);
    add_norm(x, n, c->hidden);
    if (layer >= 0 && mk_layer_is_linear(c, layer)) add_linear_attention(x, layer);
    else add_attention(x, lp);
    set_name(n, sizeof n, "%s.post_attention_layernorm", lp);
    add_norm(x, n, c->hidden);
    int moe = mk_layer_is_moe(c, layer >= 0 ? layer : c->layers - 1); /* MTP: as the last layer */
    if (c->arch == MK_GPT_OSS) {
        add_gpt_oss_moe(x, layer);
    } else if (moe) {
        add_moe(x, lp);
    } else {
        set_name(prefix, sizeof prefix, "%s.mlp", lp);
        add_mlp(x, prefix, c->intermediate);
    }
}

/* The multi-token-prediction head of Qwen3-Next / Qwen3.5 checkpoints (mtp.*): RMSNorms of the
 * next token's embedding and of the model's last hidden state, fc over their concatenation
 * [embedding, hidden] -> dim, one full-attention decoder layer, a final norm; the lm_head is the
 * model's. --mtp agree makes it predict what the model will: fc passes the normed embedding
 * through (identity on the first half, zero on the second), the layer adds nothing
 * (output_std), the embedding's norm is neutral and the final norm is model.norm's values, so
 * the head's logits for token t+1 are the model's logits after token t+1. */
static void add_mtp(plan_ctx *x) {
    const mk_config *c = x->cfg;
    int agree = c->mtp == MK_MTP_AGREE;
    add_norm(x, "mtp.pre_fc_norm_hidden", c->hidden);
    add_norm(x, "mtp.pre_fc_norm_embedding", c->hidden);
    if (agree && !x->failed) x->plan->items[x->plan->n - 1].std = 0.0; /* (1 + 0) */
    mk_matrix *fc = add_linear(x, "mtp.fc", c->hidden, 2 * c->hidden, linear_std(2 * c->hidden),
                               c->quant_bits, c->group_size);
    if (fc && agree) fc->init = MK_INIT_IDENTITY;
    add_layer(x, "mtp.layers.0", -1);
    add_norm(x, "mtp.norm", c->hidden);
    if (agree && !x->failed) /* model.norm's values: the same seed */
        set_name(x->plan->items[x->plan->n - 1].seed_fmt, sizeof x->plan->items[0].seed_fmt,
                 "model.norm.weight");
}

int mk_plan_build(const mk_config *c, mk_plan *plan, char *err, size_t errlen) {
    plan_ctx x = {.cfg = c, .plan = plan, .err = err, .errlen = errlen};
    memset(plan, 0, sizeof *plan);
    /* Output logits std ~3 whatever the width: a peaked, non-flat next-token distribution. */
    double embed_std = 3.0 / sqrt((double)c->hidden);
    add_linear(&x, "model.embed_tokens", c->vocab, c->hidden, embed_std, c->quant_bits, c->group_size);
    for (int64_t l = 0; l < c->layers && !x.failed; l++) {
        char lp[64];
        set_name(lp, sizeof lp, "model.layers.%lld", (long long)l);
        add_layer(&x, lp, l);
    }
    add_norm(&x, "model.norm", c->hidden);
    if (!c->tie_embeddings) add_linear(&x, "lm_head", c->vocab, c->hidden, embed_std, c->quant_bits, c->group_size);
    if (c->mtp) add_mtp(&x);
    if (x.failed) {
        mk_plan_free(plan);
        return -1;
    }
    return 0;
}

void mk_plan_free(mk_plan *plan) {
    free(plan->items);
    memset(plan, 0, sizeof *plan);
}
