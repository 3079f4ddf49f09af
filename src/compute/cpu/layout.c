/* layout — the 16-row interleaved order of 4- and 8-bit MLX matrices (WEIGHT_LAYOUT_MLX_ROWS16,
 * see model/weight_types.h) and the one function that rewrites a matrix into it.
 *
 * Why: the matvec then holds 16 rows in the 16 dword lanes of a vector (4 packed bytes of each
 * row's group per lane: 8 values at 4 bits, 4 at 8 bits), so the int32 dot products of a group
 * are converted and scaled once per 16 rows and no horizontal sums are needed (matmul_avx512.c,
 * matmul_avx2.c, docs/kernels.md).
 * 8-bit matrices (MLX's, with streamed biases) then take each group's 16 scales and 16 biases
 * right after its lines (weight_matrix.group_stride), when the matrix's data, scales and biases
 * lie side by side (as a checkpoint's tensors do once placed): a block is then one stream of
 * memory instead of three. Measured on the 1B shape at 2 threads (bench/RESULTS.md, cpu29 and
 * issue 25's last section): 8-bit decode from 85.8% to 91.8% of the memory roofline; 4-bit
 * (lines of half the size, the same scales) gained nothing, and zero-point matrices (GGUF Q4_0,
 * Q8_0: scales only, 32 bytes) would put every other group off the 64-byte grid, so both keep
 * three arrays (and need no second layout in the 4-bit exact kernel).
 * Refuses: other bit widths, columns not a multiple of 128, fewer than 16 rows (8-bit: a row
 * count that is not a multiple of 16, so its kernel needs no MLX-order tail), matrices already
 * repacked, and a level whose kernels do not read the layout at that width (cpu_kernels.rows16_bits). */
#include "compute/cpu/cpu_internal.h"

#include "base/threadpool.h"

#include <stdlib.h>
#include <string.h>

static _Atomic int q4_layout_rows16 = -1, q8_layout_rows16 = -1, q8_side_inline = -1;

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

/* Moves each group's scales and biases (16 + 16 of them) behind its lines, in place over the span
 * that data, scales and biases fill together (-1, nothing changed, when they do not fill one span
 * exactly: stacked experts' slices, say, whose scales lie with the other experts'). The span is
 * N units of gb line bytes at offset o from its start and 2 * sb side bytes around them; unit i
 * goes to i * stride (stride = gb + e, e the unit's side bytes). With the side bytes copied aside,
 * a unit whose target starts at or above where its source starts (i * e >= o) moves last to first,
 * and the others first to last: no move then overwrites a source not yet moved. */
static int side_inline(weight_matrix *w) {
    int64_t n = (w->rows / 16) * (w->cols / w->group_size);
    size_t esize = dtype_size(w->scale_dtype), gb = 2 * (size_t)w->group_size * (size_t)w->bits;
    size_t side = 16 * esize, e = 2 * side, db = (size_t)n * gb, sb = (size_t)n * side;
    uint8_t *d = (uint8_t *)w->data, *sc = (uint8_t *)w->scales, *bi = (uint8_t *)w->biases;
    struct span { uint8_t *p; size_t n; } part[3] = {{d, db}, {sc, sb}, {bi, sb}}, t;
    for (int i = 0; i < 2; i++) /* by address */
        for (int j = 0; j < 2 - i; j++)
            if (part[j].p > part[j + 1].p) t = part[j], part[j] = part[j + 1], part[j + 1] = t;
    int fills = part[0].p + part[0].n == part[1].p && part[1].p + part[1].n == part[2].p;
    uint8_t *lo = part[0].p;
    size_t o = (size_t)(d - lo);
    if (!fills) return -1;
    uint8_t *sides = malloc(2 * sb);
    if (!sides) return -1;
    memcpy(sides, sc, sb);
    memcpy(sides + sb, bi, sb);
    size_t stride = gb + e, k = (o + e - 1) / e; /* units [k, n) move last to first */
    for (size_t i = (size_t)n; i-- > k;) memmove(lo + i * stride, lo + o + i * gb, gb);
    for (size_t i = 0; i < k && i < (size_t)n; i++) memmove(lo + i * stride, lo + o + i * gb, gb);
    for (size_t i = 0; i < (size_t)n; i++) {
        memcpy(lo + i * stride + gb, sides + i * side, side);
        memcpy(lo + i * stride + gb + side, sides + sb + i * side, side);
    }
    free(sides);
    w->data = lo, w->scales = lo + gb, w->biases = lo + gb + side;
    w->group_stride = stride;
    return 0;
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
    if (w->bits == 8 && !w->zero_point && cpu_env_switch(&q8_side_inline, "EXO_Q8_LAYOUT", "rows16"))
        side_inline(w); /* else (or when it cannot) three arrays, which every reader reads too */
    return 0;
}
