/* The GatedDeltaNet ops of the CPU backend (Qwen3-Next, Qwen3.5): the causal depthwise
 * convolution with its rolling state, the gated delta rule recurrence, the gated RMSNorm and the
 * sigmoid gates. Plain C in float32, as transformers computes them (its torch fallback), so they
 * are also the reference a faster path is tested against.
 *
 * The recurrence runs token by token within a sequence: prefill and decode are the same loop
 * (the chunked form transformers uses for prefill is the same sum reordered). Work items are
 * independent (a conv channel; a sequence's value head), so the ranged entry points split them
 * over threads. */
#include "compute/cpu/ops.h"

#include <math.h>
#include <string.h>

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* torch.nn.functional.softplus (beta 1, threshold 20) */
static float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* The end of the run of tokens of the sequence token `begin` belongs to. */
static int64_t sequence_end(const linear_attention_batch *lb, int64_t begin) {
    int64_t end = begin + 1;
    while (end < lb->n_tokens && lb->seq_of_token[end] == lb->seq_of_token[begin]) end++;
    return end;
}

void cpu_op_conv1d_causal(const linear_attention_layer *l, const linear_attention_batch *lb,
                          float *qkv, int64_t channel_begin, int64_t channel_end) {
    int taps = l->conv_kernel, kept = taps - 1;
    int64_t C = l->conv_dim;
    for (int64_t t0 = 0; t0 < lb->n_tokens;) {
        int64_t t1 = sequence_end(lb, t0);
        int32_t slot = lb->state_slots[lb->seq_of_token[t0]];
        float *state = l->conv_state + (size_t)slot * (size_t)kept * (size_t)C;
        int fresh = lb->positions[t0] == 0;
        for (int64_t c = channel_begin; c < channel_end; c++) {
            const float *w = l->conv_weight + c * taps;
            float past[64]; /* conv_kernel <= 64 (model_config checks) */
            for (int j = 0; j < kept; j++) past[j] = fresh ? 0.0f : state[(size_t)j * C + c];
            for (int64_t t = t0; t < t1; t++) {
                float x = qkv[t * C + c], y = w[kept] * x;
                for (int j = 0; j < kept; j++) y += w[j] * past[j];
                for (int j = 0; j + 1 < kept; j++) past[j] = past[j + 1];
                if (kept) past[kept - 1] = x;
                qkv[t * C + c] = y * sigmoidf(y);
            }
            for (int j = 0; j < kept; j++) state[(size_t)j * C + c] = past[j];
        }
        t0 = t1;
    }
}

/* x[0..n) * 1/sqrt(sum x^2 + 1e-6) * scale into out (the FLA l2norm transformers mirrors) */
static void l2_normalize(const float *x, int n, float scale, float *out) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss + 1e-6f) * scale;
    for (int i = 0; i < n; i++) out[i] = x[i] * inv;
}

/* One token of one value head: S (key_dim x value_dim) advances, out gets q^T S. With S' =
 * decay * S the update is S' + k delta^T, so q^T S_new = q^T S' + (q . k) delta: two passes over
 * S, the first decaying it while it gathers k^T S' and q^T S'. */
static void delta_rule_step(float *S, int dk, int dv, const float *q, const float *k,
                            const float *v, float beta, float decay, float *kv_mem, float *out) {
    memset(kv_mem, 0, (size_t)dv * sizeof *kv_mem);
    memset(out, 0, (size_t)dv * sizeof *out);
    float qk = 0;
    for (int i = 0; i < dk; i++) {
        float *row = S + (size_t)i * dv, ki = k[i], qi = q[i];
        qk += qi * ki;
        for (int j = 0; j < dv; j++) {
            float s = row[j] * decay;
            row[j] = s;
            kv_mem[j] += s * ki;
            out[j] += s * qi;
        }
    }
    for (int j = 0; j < dv; j++) {
        float delta = (v[j] - kv_mem[j]) * beta;
        kv_mem[j] = delta;
        out[j] += qk * delta;
    }
    for (int i = 0; i < dk; i++) {
        float *row = S + (size_t)i * dv, ki = k[i];
        for (int j = 0; j < dv; j++) row[j] += ki * kv_mem[j];
    }
}

int64_t cpu_op_gated_delta_items(const linear_attention_batch *lb, int n_v_heads) {
    int64_t n_seqs = 0;
    for (int64_t t = 0; t < lb->n_tokens; t = sequence_end(lb, t)) n_seqs++;
    return n_seqs * n_v_heads;
}

void cpu_op_gated_delta_rule(const linear_attention_layer *l, const linear_attention_batch *lb,
                             const float *qkv, const float *beta_logits, const float *a,
                             float *out, int64_t item_begin, int64_t item_end, float *scratch) {
    int dk = l->key_dim, dv = l->value_dim, nv = l->n_v_heads, group = nv / l->n_k_heads;
    int64_t C = l->conv_dim, key_total = (int64_t)l->n_k_heads * dk;
    float *q = scratch, *k = q + dk, *kv_mem = k + dk;
    float scale = 1.0f / sqrtf((float)dk);
    int64_t item = 0;
    for (int64_t t0 = 0; t0 < lb->n_tokens && item < item_end;) {
        int64_t t1 = sequence_end(lb, t0);
        int32_t slot = lb->state_slots[lb->seq_of_token[t0]];
        for (int h = 0; h < nv; h++, item++) {
            if (item < item_begin || item >= item_end) continue;
            float *S = l->recurrent_state + ((size_t)slot * nv + (size_t)h) * (size_t)dk * dv;
            if (lb->positions[t0] == 0) memset(S, 0, (size_t)dk * dv * sizeof *S);
            int kh = h / group;
            float A = expf(l->a_log[h]);
            for (int64_t t = t0; t < t1; t++) {
                const float *row = qkv + t * C;
                l2_normalize(row + (int64_t)kh * dk, dk, scale, q);
                l2_normalize(row + key_total + (int64_t)kh * dk, dk, 1.0f, k);
                const float *v = row + 2 * key_total + (int64_t)h * dv;
                float beta = sigmoidf(beta_logits[t * nv + h]);
                float decay = expf(-A * softplusf(a[t * nv + h] + l->dt_bias[h]));
                delta_rule_step(S, dk, dv, q, k, v, beta, decay, kv_mem,
                                out + t * (int64_t)nv * dv + (int64_t)h * dv);
            }
        }
        t0 = t1;
    }
}

void cpu_op_rmsnorm_gated(const float *x, const float *weight, const float *z, float *y,
                          int64_t begin, int64_t end, int64_t dim, float eps) {
    for (int64_t r = begin; r < end; r++) {
        const float *xr = x + r * dim, *zr = z + r * dim;
        float *yr = y + r * dim;
        float ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) yr[i] = weight[i] * (xr[i] * inv) * (zr[i] * sigmoidf(zr[i]));
    }
}

void cpu_op_mul_sigmoid(float *x, const float *gate, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= sigmoidf(gate[i]);
}

void cpu_op_mul_sigmoid_rows(float *x, const float *gate, int64_t rows, int64_t dim) {
    for (int64_t r = 0; r < rows; r++) {
        float g = sigmoidf(gate[r]);
        for (int64_t i = 0; i < dim; i++) x[r * dim + i] *= g;
    }
}
