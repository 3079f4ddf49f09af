/* The CPU compute_backend: backend memory is host memory (64-byte aligned), matmuls go to
 * cpu_matmul (kernels chosen by CPUID), every other op to the reference ops in ops_*.c.
 * Refuses: nothing beyond backend.h; it is glue. */
#include "compute/backend.h"
#include "compute/cpu/cpu.h"
#include "compute/cpu/cpu_internal.h"
#include "compute/cpu/ops.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct cpu_ctx {
    float *scratch; /* MoE gather/scatter buffers, grown on demand, reused every step */
    size_t scratch_floats;
    int32_t *rows;  /* token lists per expert */
    size_t rows_cap;
} cpu_ctx;

/* Every block starts with a 64-byte header holding its size; big blocks come from mmap, so
 * their zero pages are only touched when used (a large KV cache costs nothing until filled). */
#define CPU_BIG_ALLOC (1u << 20)

static void *cpu_alloc(compute_backend *b, size_t bytes) {
    (void)b;
    size_t n = ((bytes + 63) & ~(size_t)63) + 64;
    char *p;
    if (n >= CPU_BIG_ALLOC) {
        p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
    } else {
        void *q = NULL;
        if (posix_memalign(&q, 64, n) != 0) return NULL;
        p = q;
        memset(p, 0, n);
    }
    memcpy(p, &n, sizeof n);
    return p + 64;
}

static void cpu_free(compute_backend *b, void *ptr) {
    (void)b;
    if (!ptr) return;
    char *p = (char *)ptr - 64;
    size_t n;
    memcpy(&n, p, sizeof n);
    if (n >= CPU_BIG_ALLOC)
        munmap(p, n);
    else
        free(p);
}

static void cpu_copy(compute_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_matmul_multi_op(compute_backend *b, int n, const weight_matrix *const *w,
                                const float *x, float *const *ys, int64_t n_tokens) {
    (void)b;
    cpu_matmul_multi(n, w, x, ys, n_tokens);
}

static void cpu_matmul_op(compute_backend *b, const weight_matrix *w, const float *x, float *y,
                          int64_t n) {
    (void)b;
    cpu_matmul(w, x, y, n);
}

static void cpu_embed(compute_backend *b, const weight_matrix *t, const int32_t *ids, int64_t n,
                      float *out) {
    (void)b;
    cpu_op_embed(t, ids, n, out);
}

/* Small ops run inline: waking the pool costs more than a few thousand flops. */
#define CPU_PARALLEL_MIN 16384

typedef struct rows_job {
    const float *x, *w, *inv_freq, *z; /* z: the gate of a gated RMSNorm, else NULL */
    float *y;
    const int32_t *pos;
    int64_t dim;
    float eps, attn_factor;
    int n_heads, head_dim, rot;
    const kv_layer *kv;
    const attention_batch *ab;
} rows_job;

static void rmsnorm_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const rows_job *j = ctx;
    if (j->z) cpu_op_rmsnorm_gated(j->x, j->w, j->z, j->y, begin, end, j->dim, j->eps);
    else cpu_op_rmsnorm(j->x, j->w, j->y, begin, end, j->dim, j->eps);
}

static void rmsnorm_rows(const rows_job *j, int64_t rows) {
    if (rows * j->dim < CPU_PARALLEL_MIN || rows < 2)
        rmsnorm_range((void *)j, 0, rows, 0);
    else
        threadpool_parallel_for(cpu_thread_pool(), rows, rmsnorm_range, (void *)j);
}

static void cpu_rmsnorm(compute_backend *b, const float *x, const float *w, float *y, int64_t rows,
                        int64_t dim, float eps) {
    (void)b;
    rows_job j = {.x = x, .w = w, .y = y, .dim = dim, .eps = eps};
    rmsnorm_rows(&j, rows);
}

static void cpu_rmsnorm_gated(compute_backend *b, const float *x, const float *w, const float *z,
                              float *y, int64_t rows, int64_t dim, float eps) {
    (void)b;
    rows_job j = {.x = x, .w = w, .z = z, .y = y, .dim = dim, .eps = eps};
    rmsnorm_rows(&j, rows);
}

static void cpu_add(compute_backend *b, float *x, const float *y, int64_t n) {
    (void)b;
    cpu_op_add(x, y, n);
}

static void cpu_add_row(compute_backend *b, float *x, const float *row, int64_t rows,
                        int64_t dim) {
    (void)b;
    cpu_op_add_row(x, row, rows, dim);
}

static void silu_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const rows_job *j = ctx;
    cpu_op_silu_mul(j->y, j->x, begin, end);
}

static void cpu_silu_mul(compute_backend *b, float *g, const float *u, int64_t n) {
    (void)b;
    rows_job j = {.y = g, .x = u};
    if (n < CPU_PARALLEL_MIN)
        silu_range(&j, 0, n, 0);
    else
        threadpool_parallel_for(cpu_thread_pool(), n, silu_range, &j);
}

static void rope_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const rows_job *j = ctx;
    cpu_op_rope(j->y, j->pos, begin, end, j->n_heads, j->head_dim, j->rot, j->inv_freq,
                j->attn_factor);
}

static void cpu_rope(compute_backend *b, float *x, const int32_t *pos, int64_t n, int nh, int hd,
                     int rot, const float *inv_freq, float attn_factor) {
    (void)b;
    rows_job j = {.y = x, .pos = pos, .n_heads = nh, .head_dim = hd, .rot = rot,
                  .inv_freq = inv_freq, .attn_factor = attn_factor};
    if (n * nh * hd < CPU_PARALLEL_MIN || n < 2)
        rope_range(&j, 0, n, 0);
    else
        threadpool_parallel_for(cpu_thread_pool(), n, rope_range, &j);
}

static void cpu_kv_write(compute_backend *b, const kv_layer *kv, const float *k, const float *v,
                         const int32_t *slots, int64_t n, int64_t kv_dim) {
    (void)b;
    cpu_op_kv_write(kv, k, v, slots, n, kv_dim);
}

static void attention_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const rows_job *j = ctx;
    cpu_op_attention(j->x, j->kv, j->ab, j->y, begin, end);
}

static void attention_fast_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const rows_job *j = ctx;
    cpu_op_attention_grouped(j->x, j->kv, j->ab, j->y, begin, end);
}

typedef struct att512_job {
    const float *q;
    const kv_layer *kv;
    const attention_batch *ab;
    const int32_t *tile_start;
    float *out;
    _Atomic int failed;
} att512_job;

static void attention_avx512_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    att512_job *j = ctx;
    float *scratch = cpu_scratch(1, cpu_op_attention_avx512_scratch(j->ab));
    if (!scratch) {
        atomic_store(&j->failed, 1);
        return;
    }
    cpu_op_attention_avx512(j->q, j->kv, j->ab, j->tile_start, j->out, begin, end, scratch);
}

/* EXO_ATTENTION=avx2 keeps the per-position AVX2 path on AVX-512 machines (A/B runs only). */
static int attention_avx512_enabled(const attention_batch *ab) {
    static _Atomic int on = -1;
    return cpu_env_switch(&on, "EXO_ATTENTION", "avx2") && cpu_op_attention_avx512_ok(ab);
}

/* Returns 0, or -1 (out of memory: nothing reliable written, the caller recomputes). */
static int attention_avx512(const float *q, const kv_layer *kv, const attention_batch *ab,
                            float *out) {
    int32_t *tiles = malloc(sizeof(int32_t) * (size_t)(ab->n_tokens + 1));
    if (!tiles) return -1;
    att512_job j = {.q = q, .kv = kv, .ab = ab, .tile_start = tiles, .out = out};
    int64_t items = cpu_op_attention_tiles(ab, tiles) * ab->n_kv_heads;
    if (items < 2)
        attention_avx512_range(&j, 0, items, 0);
    else
        threadpool_parallel_for_dynamic(cpu_thread_pool(), items, 1, attention_avx512_range, &j);
    free(tiles);
    return atomic_load(&j.failed) ? -1 : 0;
}

/* Work items (token, head) cost what their context length costs: handed out dynamically. */
static void cpu_attention(compute_backend *b, const float *q, const kv_layer *kv,
                          const attention_batch *ab, float *out) {
    (void)b;
    if (attention_avx512_enabled(ab) && attention_avx512(q, kv, ab, out) == 0) return;
    rows_job j = {.x = q, .kv = kv, .ab = ab, .y = out};
    int fast = cpu_op_attention_fast_ok(ab);
    int64_t items = ab->n_tokens * (fast ? ab->n_kv_heads : ab->n_heads);
    threadpool_range_fn fn = fast ? attention_fast_range : attention_range;
    if (items < 2)
        fn(&j, 0, items, 0);
    else
        threadpool_parallel_for_dynamic(cpu_thread_pool(), items, 1, fn, &j);
}

static void cpu_gather_rows(compute_backend *b, const float *x, const int32_t *rows, int64_t n,
                            int64_t dim, float *out) {
    (void)b;
    cpu_op_gather_rows(x, rows, n, dim, out);
}

static void cpu_moe_route(compute_backend *b, const float *logits, int64_t n, int ne, int k,
                          int norm, int32_t *ids, float *w) {
    (void)b;
    cpu_op_moe_route(logits, n, ne, k, norm, ids, w);
}

typedef struct linear_job {
    const linear_attention_layer *l;
    const linear_attention_batch *lb;
    float *qkv, *out;
    const float *x, *beta, *a;
} linear_job;

static void conv1d_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const linear_job *j = ctx;
    cpu_op_conv1d_causal(j->l, j->lb, j->qkv, begin, end);
}

static void cpu_conv1d_causal(compute_backend *b, const linear_attention_layer *l,
                              const linear_attention_batch *lb, float *qkv) {
    (void)b;
    linear_job j = {.l = l, .lb = lb, .qkv = qkv};
    if (lb->n_tokens * l->conv_dim < CPU_PARALLEL_MIN)
        conv1d_range(&j, 0, l->conv_dim, 0);
    else
        threadpool_parallel_for(cpu_thread_pool(), l->conv_dim, conv1d_range, &j);
}

#define CPU_LINEAR_HEAD_DIM_MAX 1024 /* model_config refuses larger linear-attention heads */

static void delta_range(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const linear_job *j = ctx;
    float scratch[3 * CPU_LINEAR_HEAD_DIM_MAX];
    cpu_op_gated_delta_rule(j->l, j->lb, j->x, j->beta, j->a, j->out, begin, end, scratch);
}

static void cpu_gated_delta_rule(compute_backend *b, const linear_attention_layer *l,
                                 const linear_attention_batch *lb, const float *qkv,
                                 const float *beta, const float *a, float *out) {
    (void)b;
    linear_job j = {.l = l, .lb = lb, .x = qkv, .beta = beta, .a = a, .out = out};
    int64_t items = cpu_op_gated_delta_items(lb, l->n_v_heads);
    if (items < 2)
        delta_range(&j, 0, items, 0);
    else
        threadpool_parallel_for_dynamic(cpu_thread_pool(), items, 1, delta_range, &j);
}

static void cpu_mul_sigmoid(compute_backend *b, float *x, const float *gate, int64_t n) {
    (void)b;
    cpu_op_mul_sigmoid(x, gate, n);
}

static void cpu_mul_sigmoid_rows(compute_backend *b, float *x, const float *gate, int64_t rows,
                                 int64_t dim) {
    (void)b;
    cpu_op_mul_sigmoid_rows(x, gate, rows, dim);
}

static int ensure_scratch(cpu_ctx *c, size_t floats, size_t rows) {
    if (floats > c->scratch_floats) {
        free(c->scratch);
        c->scratch = malloc(floats * sizeof(float));
        c->scratch_floats = c->scratch ? floats : 0;
    }
    if (rows > c->rows_cap) {
        free(c->rows);
        c->rows = malloc(rows * sizeof(int32_t));
        c->rows_cap = c->rows ? rows : 0;
    }
    return c->scratch && c->rows ? 0 : -1;
}

/* Groups the tokens routed to each expert and runs that expert once over all of them, so a
 * prefill chunk reads each expert's weights once, not once per token. */
static void cpu_moe_ffn(compute_backend *b, const moe_experts *ex, const float *x, int64_t n,
                        const int32_t *ids, const float *weights, int k, float *out) {
    cpu_ctx *c = b->ctx;
    int64_t dim = ex->dim, inter = ex->inter;
    size_t need = (size_t)n * (size_t)(dim * 2 + inter * 2);
    memset(out, 0, (size_t)(n * dim) * sizeof *out);
    if (ensure_scratch(c, need, (size_t)n * 2) != 0) return; /* out stays 0: caller sees NaN-free garbage */
    float *xs = c->scratch, *g = xs + n * dim, *u = g + n * inter, *y = u + n * inter;
    int32_t *tok = c->rows, *slot = c->rows + n;
    for (int e = 0; e < ex->n_experts; e++) {
        int64_t m = 0;
        for (int64_t t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                if (ids[t * k + j] == e) {
                    tok[m] = (int32_t)t;
                    slot[m] = j;
                    memcpy(xs + m * dim, x + t * dim, (size_t)dim * sizeof *xs);
                    m++;
                }
        if (!m) continue;
        cpu_matmul(&ex->gate[e], xs, g, m);
        cpu_matmul(&ex->up[e], xs, u, m);
        if (ex->swiglu_limit > 0) {
            cpu_op_clamped_swiglu(g, u, ex->gate_bias ? ex->gate_bias + e * inter : NULL,
                                  ex->up_bias ? ex->up_bias + e * inter : NULL, m, inter, ex->swiglu_limit,
                                  ex->swiglu_alpha);
        } else {
            cpu_op_silu_mul(g, u, 0, m * inter);
        }
        cpu_matmul(&ex->down[e], g, y, m);
        if (ex->down_bias) cpu_op_add_row(y, ex->down_bias + e * dim, m, dim);
        for (int64_t i = 0; i < m; i++) {
            float w = weights[tok[i] * k + slot[i]];
            float *o = out + tok[i] * dim;
            for (int64_t d = 0; d < dim; d++) o[d] += w * y[i * dim + d];
        }
    }
}

static int cpu_prepare_weight(compute_backend *b, weight_matrix *w) {
    (void)b;
    return cpu_weight_prefers_rows16(w) && cpu_weight_repack_rows16(w) == 0;
}

static void cpu_destroy(compute_backend *b) {
    cpu_ctx *c = b->ctx;
    free(c->scratch);
    free(c->rows);
    free(c);
    free(b);
}

compute_backend *compute_backend_cpu(int n_threads) {
    compute_backend *b = calloc(1, sizeof *b);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return NULL;
    }
    if (n_threads > 0) cpu_set_threads(n_threads);
    *b = (compute_backend){
        .name = "cpu", .ctx = c,
        .features = BACKEND_FEATURE_ATTENTION_SINKS_WINDOW | BACKEND_FEATURE_MOE_BIAS_CLAMP, .alloc = cpu_alloc, .free = cpu_free, .upload = cpu_copy,
        .download = cpu_copy, .prepare_weight = cpu_prepare_weight, .matmul = cpu_matmul_op, .matmul_multi = cpu_matmul_multi_op, .embed = cpu_embed,
        .rmsnorm = cpu_rmsnorm, .add = cpu_add, .add_row = cpu_add_row, .silu_mul = cpu_silu_mul,
        .rope = cpu_rope, .kv_write = cpu_kv_write, .attention = cpu_attention,
        .gather_rows = cpu_gather_rows, .moe_route = cpu_moe_route, .moe_ffn = cpu_moe_ffn,
        .conv1d_causal = cpu_conv1d_causal, .gated_delta_rule = cpu_gated_delta_rule,
        .rmsnorm_gated = cpu_rmsnorm_gated, .mul_sigmoid = cpu_mul_sigmoid,
        .mul_sigmoid_rows = cpu_mul_sigmoid_rows, .copy = cpu_copy, .destroy = cpu_destroy,
    };
    return b;
}
