/* cpu_internal — private to compute/cpu/: what the kernels and cpu.c share beyond the levels
 * and kernel tables of cpu_levels.h (tuning constants, activation layouts, the MLX int16 gemm,
 * scratch memory). Nothing outside compute/cpu/ includes it (scripts/check-layout.sh checks).
 */
#ifndef EXO_COMPUTE_CPU_INTERNAL_H
#define EXO_COMPUTE_CPU_INTERNAL_H

#include "compute/cpu/cpu_levels.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Up to this many tokens, cpu_matmul runs matvec passes of <= 8 tokens instead of the gemm: at
 * these sizes dequantizing and packing the weights for the gemm costs more than reading them
 * again (measured per core: MLX 4-bit 1024x2048 at 9/16/32 tokens: 0.43/0.76/1.58 ms as
 * matvecs vs 1.03/1.37/1.71 ms as gemm; bf16 at 16: 0.54 vs 0.68 ms, at 24: 0.81 vs 0.70). */
#define CPU_MATVEC_PASSES_MLX 32
#define CPU_MATVEC_PASSES_DENSE 16
/* 4-bit matrices in the 16-row interleaved layout: passes of 8 tokens up to 256 tokens, instead
 * of the MLX int16 gemm at 9-256. Per core (exo bench --section batch --threads 1 --cpu-time,
 * 1B MLP shapes, shared machine) the passes ran 108-145 GFLOP/s at every size from 8 to 256
 * tokens, the int16 gemm on MLX order 78-117 (bench/RESULTS.md, fourth session).
 * On AVX-512 they also beat the f32 gemm above 256 tokens, so there the passes serve every
 * prompt size (cpu.c max_matvec_default): prefill of 512 tokens, 1B shape, 4- and 8-bit,
 * 1.3-1.7x (dev VM, 2 threads); on the GPU host's Xeon the passes at 128 tokens ran 153-159% of
 * the f32 gemm peak and the f32 gemm at 512 tokens 96-123% (bench/RESULTS.md, GGUF, session 7). */
#define CPU_MATVEC_PASSES_Q4_ROWS16 256
/* Software prefetch 2 KiB ahead in the matvec kernels: on this 2-core VM (quiet, 2026-11-30) b1 decode
 * went 15.6 -> 21-24 tok/s on the 4-bit 1B model and 6.7 -> 8.0 tok/s on bf16; 1-8 KiB all helped
 * about as much (bench/RESULTS.md). The L2 streamer alone leaves the core stalled at each page. */
#define CPU_MATVEC_PREFETCH_DEFAULT 2048

/* An A/B switch read once from the environment: 1 unless variable `name` equals off_word.
 * *cache starts at -1 (not read yet). For the EXO_* knobs that keep an older path in the same
 * binary (docs/kernels.md lists them). */
int cpu_env_switch(_Atomic int *cache, const char *name, const char *off_word);

/* For 4-bit MLX weights whose columns are a multiple of 128, the AVX-512 kernel dots the packed
 * nibbles (u8) directly with the int16 activations split into bytes, x = 256*hi + lo (hi signed,
 * lo unsigned: exactly the int16 value), through VNNI vpdpbusd (u8 x s8). Within each chunk of 128
 * values the xq row is then 256 bytes: hi bytes of the 64 even values (s8), hi bytes of the odd
 * values, lo bytes (u8) of the even values, lo bytes of the odd values; byte j of each plane
 * meets weight byte j of the chunk (its low nibble is the even value 2j, its high nibble 2j+1).
 * Returns 1 when this layout applies (only to kernels with needs_int16_x), else 0: always for
 * 16-row interleaved matrices (their kernel reads only the planes), else unless EXO_MATVEC_Q4=int16. */
static inline int cpu_mlx_x_planes(const weight_matrix *w) {
    return w->format == WEIGHT_MLX_AFFINE && w->bits == 4 && w->cols % 128 == 0 &&
           (w->layout == WEIGHT_LAYOUT_MLX_ROWS16 || cpu_matvec_q4_planes());
}

/* 8-bit MLX matrices in the 16-row interleaved layout: the AVX-512 kernel multiplies the weight
 * bytes (u8, 0..255) with the activations split into two *signed* bytes, x = 256*hi + lo with
 * lo in [-128, 127], through vpdpbusd (u8 x s8) twice; hi then fits s8 only for |x| <= 32639, so
 * these activations are quantized to that range instead of 32767 (a step of max|x|/32639: the
 * error bound grows by 0.4%). Per chunk of 128 values the xq row holds 256 bytes: the 128 hi
 * bytes in natural order, then the 128 lo bytes (cpu_mlx_x_to_planes8). */
#define CPU_MLX_Q8_XMAX 32639
static inline int cpu_mlx_x_planes8(const cpu_kernels *k, const weight_matrix *w) {
    return k->rows16_x8_planes && w->format == WEIGHT_MLX_AFFINE && w->bits == 8 &&
           w->layout == WEIGHT_LAYOUT_MLX_ROWS16;
}

/* Where block b (rows 16b..16b+15) of a 16-row interleaved matrix (WEIGHT_LAYOUT_MLX_ROWS16,
 * layout.c) keeps its weight lines, scales and biases, for the kernels of every level that reads
 * the layout (they walk blocks and groups the same way and differ only in the dot products).
 * Read them through cpu_rows16_lines / _scales / _biases: with the matrix's group_stride the
 * scales and biases of each group follow its lines, and the three walk with one stride. */
typedef struct cpu_rows16_block {
    const uint8_t *lines;           /* group g's 64-byte lines at g * stride */
    const uint8_t *scales, *biases; /* group g's 16 (one per row of the block) at g * sstride */
    size_t stride, sstride;         /* bytes from group g to g + 1 in the lines and in the scales:
                                       2 * group_size * bits and 16 * esize, or both group_stride */
    size_t esize;                   /* bytes per scale */
    size_t ahead, sahead;           /* software prefetch distance in the lines and in the scales */
    int biases_streamed;            /* 0: a zero_point matrix, whose biases come from its scales */
    int side_inline;                /* the scales and biases lie inside the lines' stream */
    int to_l2;                      /* prefetch into L2 only (prefetcht1); 0 from cpu_rows16_block_at:
                                       the kernel sets it from cpu_matvec_prefetch_l2() */
} cpu_rows16_block;

static inline cpu_rows16_block cpu_rows16_block_at(const weight_matrix *w, int64_t b, size_t ahead) {
    int64_t groups = w->cols / w->group_size;
    size_t esize = dtype_size(w->scale_dtype), group_bytes = 2 * (size_t)w->group_size * (size_t)w->bits;
    size_t stride = w->group_stride ? w->group_stride : group_bytes;
    size_t sstride = w->group_stride ? w->group_stride : 16 * esize;
    cpu_rows16_block k = {
        .lines = (const uint8_t *)w->data + (size_t)(b * groups) * stride,
        .scales = (const uint8_t *)w->scales + (size_t)(b * groups) * sstride,
        .biases = (const uint8_t *)w->biases + (size_t)(b * groups) * sstride,
        .stride = stride,
        .sstride = sstride,
        .esize = esize,
        .ahead = ahead,
        /* separate scales and biases stream at 16 * esize bytes per group_bytes of lines */
        .sahead = ahead && !w->group_stride ? ((ahead * 16 * esize / group_bytes + 63) & ~(size_t)63) : 0,
        .biases_streamed = !w->zero_point,
        .side_inline = w->group_stride != 0,
    };
    return k;
}

static inline const uint8_t *cpu_rows16_lines(const cpu_rows16_block *k, int64_t g) {
    return k->lines + (size_t)g * k->stride;
}
static inline const uint8_t *cpu_rows16_scales(const cpu_rows16_block *k, int64_t g) {
    return k->scales + (size_t)g * k->sstride;
}
static inline const uint8_t *cpu_rows16_biases(const cpu_rows16_block *k, int64_t g) {
    return k->biases + (size_t)g * k->sstride;
}

/* Software prefetch of the 64-byte line holding p into L1 (prefetcht0) or into L2 only
 * (prefetcht1). Inline asm on x86-64 because GCC 12 deletes loops of __builtin_prefetch (and
 * _mm_prefetch, the same builtin) as code without effect: the AVX-512 interleaved kernels carried
 * no prefetch at all until issue 25's cpu26 session (their objdump had none; the AVX2 ones kept
 * theirs by chance of the surrounding code; scripts/check-prefetch.sh). A prefetch never faults,
 * so p may lie past the end of the data. */
static inline void cpu_prefetch_l1(const void *p) {
#if defined(__x86_64__)
    __asm__ volatile("prefetcht0 (%0)" : : "r"(p));
#else
    __builtin_prefetch(p, 0, 3);
#endif
}

static inline void cpu_prefetch_l2(const void *p) {
#if defined(__x86_64__)
    __asm__ volatile("prefetcht1 (%0)" : : "r"(p));
#else
    __builtin_prefetch(p, 0, 2);
#endif
}

/* Prefetches group g's lines and its scales and biases k->ahead / k->sahead bytes on, into L1
 * (prefetcht0) or, with k->to_l2, into L2 (prefetcht1): the hardware prefetchers alone leave the
 * core stalled at page boundaries (cpu_matvec_prefetch). Inline scales and biases come with the
 * group's whole stride. */
static inline void cpu_rows16_prefetch(const cpu_rows16_block *k, int64_t g) {
    if (!k->ahead) return;
    const uint8_t *p = cpu_rows16_lines(k, g) + k->ahead;
    if (k->to_l2) {
        for (size_t o = 0; o < k->stride; o += 64) cpu_prefetch_l2(p + o);
        if (k->side_inline) return;
        cpu_prefetch_l2(cpu_rows16_scales(k, g) + k->sahead);
        if (k->biases_streamed) cpu_prefetch_l2(cpu_rows16_biases(k, g) + k->sahead);
        return;
    }
    for (size_t o = 0; o < k->stride; o += 64) cpu_prefetch_l1(p + o);
    if (k->side_inline) return;
    cpu_prefetch_l1(cpu_rows16_scales(k, g) + k->sahead);
    if (k->biases_streamed) cpu_prefetch_l1(cpu_rows16_biases(k, g) + k->sahead);
}

/* The largest |xq| of the int16 activations of w for level k's kernels (see matvec_input). */
static inline int cpu_mlx_x_max(const cpu_kernels *k, const weight_matrix *w) {
    return cpu_mlx_x_planes8(k, w) ? CPU_MLX_Q8_XMAX : 32767;
}

/* Element i of an MLX scale or bias array (bf16, f16 or f32), and of a dense weight row, as f32:
 * the scalar tails and per-group lookups of the kernels. */
static inline float cpu_scale_at(dtype t, const void *p, int64_t i) {
    if (t == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    if (t == DTYPE_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static inline float cpu_dense_at(weight_format f, const void *row, int64_t i) {
    if (f == WEIGHT_F32) return ((const float *)row)[i];
    if (f == WEIGHT_F16) return f16_to_f32(((const uint16_t *)row)[i]);
    return bf16_to_f32(((const uint16_t *)row)[i]);
}

/* Matrices flagged exact_activations (matmul_exact_avx512.c): at the AVX-512 level, 4-bit MLX
 * ones (up to CPU_EXACT_MAX_TOKENS tokens per call: memory for the split activations) run a
 * kernel whose error is float rounding, not int16 rounding (ok says whether this matrix can, the caller checks the level; the matmuls
 * return -1 when out of memory or refused). multi: up to CPU_MATMUL_MULTI_MAX matrices of the
 * same column count that read the same x, as one job. layout.c puts 4-bit exact matrices in the
 * 16-row interleaved layout at this level only (its int16 kernels at other levels would round).
 * Other exact matrices run at a level whose kernels keep activations float (cpu.c). */
#define CPU_EXACT_MAX_TOKENS 8192
int cpu_mlx4_exact_ok(const weight_matrix *w, int64_t n_tokens);
int cpu_mlx4_exact_matmul(const weight_matrix *w, const float *x, float *y, int64_t n_tokens);
int cpu_mlx4_exact_matmul_multi(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                                int64_t n_tokens);

/* The kernel table of the level cpu_matmul uses (the best one EXO_CPU_SIMD allows). */
const cpu_kernels *cpu_kernels_best(void);

/* For 2- and 4-bit MLX weights whose columns are a multiple of the 32-byte chunk (128 or 64
 * values), the int16 activations are stored permuted within each chunk so that the kernel can
 * unpack 32 bytes with one zero-extension plus a shift/AND per value slot: with P = 8/bits values
 * per byte and V = 32*P values per chunk, xq[c*V + k*32 + j] holds activation c*V + j*P + k.
 * Returns P when this layout applies (only to kernels with needs_int16_x), else 0. */
static inline int cpu_mlx_x_permuted(const weight_matrix *w) {
    if (w->format != WEIGHT_MLX_AFFINE || (w->bits != 2 && w->bits != 4)) return 0;
    if (cpu_mlx_x_planes(w)) return 0;
    int per_byte = 8 / w->bits;
    return w->cols % (32 * per_byte) == 0 ? per_byte : 0;
}

/* Tile shape of gemm_tile: CPU_GEMM_MR weight rows (two 16-float vectors) x CPU_GEMM_NR tokens
 * (broadcast), and the K block the weight panel is dequantized in (fits L1: 256*32*4 = 32 KiB). */
#define CPU_GEMM_MR 32
#define CPU_GEMM_NR 12
#define CPU_GEMM_KC 256

/* MLX affine weights times 9..CPU_MLX_GEMM_MAX_TOKENS tokens on AVX-512 VNNI (gemm_mlx_avx512.c):
 * weights unpacked to int16 pairs once per call, vpdpwssd against 16 tokens per vector. Beyond
 * 8 tokens it beats both the matvec passes (which unpack every weight again per 8 tokens) and
 * the f32 gemm (which dequantizes and transposes every weight per call); measured per N in
 * bench/RESULTS.md ("Batched decode"). Above the limit the f32 gemm wins back. */
#define CPU_MLX_GEMM_MIN_TOKENS 9
#define CPU_MLX_GEMM_MAX_TOKENS 256

/* Activations of the MLX gemm: tokens padded to tpad (a multiple of 16); xp[kp][tpad] holds
 * (xq[t][2kp], xq[t][2kp+1]) as one 32-bit word, xscale/xsum are [groups][tpad] (padding 0);
 * the same int16 quantization as matvec_input. Memory: cpu_mlx_gemm_x_bytes, 64-byte aligned. */
typedef struct mlx_gemm_x {
    int pairs4; /* 4-bit weights: the pair order of the 4-bit unpack (gemm_mlx_avx512.c) */
    int64_t n_tokens, tpad, cols, group_size;
    uint32_t *xp;
    float *xscale, *xsum;
} mlx_gemm_x;
size_t cpu_mlx_gemm_x_bytes(int64_t n_tokens, int64_t cols, int64_t group_size);
void cpu_mlx_gemm_x_init(mlx_gemm_x *px, void *mem, int64_t n_tokens, int64_t cols,
                         int64_t group_size, int bits);
/* Whether weights of `bits` at n_tokens use the 4-bit pair order (then px must be prepared so). */
int cpu_mlx_gemm_pairs4(int bits, int64_t n_tokens);
/* Fills groups [g0, g1) of px from x [n_tokens][cols] (threads may fill disjoint ranges). */
void cpu_mlx_gemm_prepare(const float *x, mlx_gemm_x *px, int64_t g0, int64_t g1);
/* y[t][r] for rows [r0, r1) and every token of px; y is [n_tokens][w->rows]. Returns 0, or -1
 * when the MLX-order copy of an interleaved matrix's rows finds no memory (y partly written). */
int cpu_mlx_gemm_rows(const weight_matrix *w, const mlx_gemm_x *px, float *y, int64_t r0,
                      int64_t r1);

extern const cpu_kernels cpu_kernels_generic;
extern const cpu_kernels cpu_kernels_avx2;
extern const cpu_kernels cpu_kernels_avx512;
extern const cpu_kernels cpu_kernels_neon;
extern const cpu_kernels cpu_kernels_neon_dotprod;

/* Bytes ahead of the current row that matvec kernels prefetch (0 = none): EXO_MATVEC_PREFETCH,
 * read once, else CPU_MATVEC_PREFETCH_DEFAULT (the setter: cpu_levels.h). */
size_t cpu_matvec_prefetch(void);

/* 16-row blocks in flight per thread in the interleaved kernels at 1-2 tokens (mlx_rows16 of the
 * AVX-512 and AVX2 levels): EXO_MATVEC_STREAMS=1|2|4, read once, default 2, and 1 on AMD. An
 * Intel core follows two streams of lines further ahead than one; on AMD Zen 4 one stream per
 * thread read more (docs/kernels.md, bench/RESULTS.md issue 25). */
int cpu_matvec_streams(void);

/* Thread-local scratch memory, 64-byte aligned, grown on demand and kept for the thread's life
 * (slot 0..3; a slot's previous contents are lost when it grows). NULL when out of memory. */
void *cpu_scratch(int slot, size_t bytes);

#endif
