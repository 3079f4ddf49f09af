/* layout — the 16-row interleaved order of 4- and 8-bit MLX matrices (WEIGHT_LAYOUT_MLX_ROWS16,
 * see model/weight_types.h) and the one function that rewrites a matrix into it.
 *
 * Why: the matvec then holds 16 rows in the 16 dword lanes of a vector (4 packed bytes of each
 * row's group per lane: 8 values at 4 bits, 4 at 8 bits), so the int32 dot products of a group
 * are converted and scaled once per 16 rows and no horizontal sums are needed (matmul_avx512.c,
 * matmul_avx2.c, docs/kernels.md).
 * Refuses: other bit widths, columns not a multiple of 128, fewer than 16 rows (8-bit: a row
 * count that is not a multiple of 16, so its kernel needs no MLX-order tail), matrices already
 * repacked, and a level whose kernels do not read the layout at that width (cpu_kernels.rows16_bits). */
#include "compute/cpu/cpu_internal.h"

#include "base/threadpool.h"

#include <stdlib.h>
#include <string.h>

static _Atomic int q4_layout_rows16 = -1, q8_layout_rows16 = -1;

/* The matrices the layout exists for, whatever the level. */
static int rows16_shape(const weight_matrix *w) {
    if (!w || w->format != WEIGHT_MLX_AFFINE || w->cols % 128 || w->rows < 16 ||
        w->layout != WEIGHT_LAYOUT_MLX || !cpu_weight_supported(w))
        return 0;
    return w->bits == 4 || (w->bits == 8 && w->rows % 16 == 0);
}

int cpu_weight_prefers_rows16(const weight_matrix *w) {
    /* The interleaved kernels round activations to int16, except AVX-512's residual-plane kernel
     * for 4-bit matrices flagged exact (matmul_exact_avx512.c). */
    if (w->exact_activations && (w->bits != 4 || cpu_kernels_best() != cpu_kernels_for(CPU_LEVEL_AVX512)))
        return 0;
    if (!rows16_shape(w) || !(cpu_kernels_best()->rows16_bits & (1u << w->bits))) return 0;
    return w->bits == 4 ? cpu_env_switch(&q4_layout_rows16, "EXO_Q4_LAYOUT", "mlx")
                        : cpu_env_switch(&q8_layout_rows16, "EXO_Q8_LAYOUT", "mlx");
}

typedef struct repack_job {
    uint32_t *data;
    uint8_t *scales, *biases;
    int64_t words, groups; /* per row */
    size_t esize;          /* bytes per scale */
    uint8_t *tmp;          /* one block buffer of tmp_bytes per thread */
    size_t tmp_bytes;
} repack_job;

/* dst[j*16 + l] = src[l*n + j] for 16 rows of n elements of esize bytes (esize 2 or 4). */
static void transpose16(void *dst, const void *src, int64_t n, size_t esize) {
    if (esize == 4) {
        uint32_t *d = dst;
        const uint32_t *s = src;
        for (int64_t j = 0; j < n; j++)
            for (int l = 0; l < 16; l++) d[j * 16 + l] = s[l * n + j];
    } else {
        uint16_t *d = dst;
        const uint16_t *s = src;
        for (int64_t j = 0; j < n; j++)
            for (int l = 0; l < 16; l++) d[j * 16 + l] = s[l * n + j];
    }
}

static void repack_blocks(void *p, int64_t b0, int64_t b1, int thread_index) {
    repack_job *job = p;
    size_t wbytes = (size_t)job->words * 64, sbytes = (size_t)job->groups * 16 * job->esize;
    void *tmp = job->tmp + (size_t)thread_index * job->tmp_bytes;
    for (int64_t b = b0; b < b1; b++) {
        uint32_t *d = job->data + b * 16 * job->words;
        memcpy(tmp, d, wbytes);
        transpose16(d, tmp, job->words, 4);
        uint8_t *parts[2] = {job->scales + (size_t)b * sbytes, job->biases + (size_t)b * sbytes};
        for (int i = 0; i < 2; i++) {
            memcpy(tmp, parts[i], sbytes);
            transpose16(parts[i], tmp, job->groups, job->esize);
        }
    }
}

int cpu_weight_repack_rows16(weight_matrix *w) {
    if (!rows16_shape(w)) return -1;
    repack_job job = {.data = (uint32_t *)w->data, .scales = (uint8_t *)w->scales,
                      .biases = (uint8_t *)w->biases, .words = w->cols * w->bits / 32,
                      .groups = w->cols / w->group_size, .esize = dtype_size(w->scale_dtype)};
    threadpool *pool = cpu_thread_pool();
    size_t sbytes = (size_t)job.groups * 16 * job.esize;
    job.tmp_bytes = ((size_t)job.words * 64 > sbytes ? (size_t)job.words * 64 : sbytes);
    job.tmp = malloc(job.tmp_bytes * (size_t)(pool ? threadpool_size(pool) : 1));
    if (!job.tmp) return -1; /* left in MLX order, which every kernel reads */
    if (pool) threadpool_parallel_for(pool, w->rows / 16, repack_blocks, &job);
    else repack_blocks(&job, 0, w->rows / 16, 0);
    free(job.tmp);
    w->layout = WEIGHT_LAYOUT_MLX_ROWS16;
    return 0;
}
