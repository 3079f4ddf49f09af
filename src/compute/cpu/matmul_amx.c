/* matmul_amx — MLX affine 4- and 8-bit matrices in the 16-row interleaved layout times 16 or more
 * tokens on Intel AMX (AMX-BF16 tiles: Sapphire Rapids and later Xeons): prefill and large
 * batches. What GGUF Q4_0/Q4_K/Q6_K/Q8_0 files and MLX 4/8-bit checkpoints become on the CPU
 * (model/gguf_quant.h, layout.c).
 *
 * Why: the VNNI matvec passes (matmul_avx512.c) run every prompt on AVX-512 at ~32 multiply-adds
 * per instruction; one tile product is 16x16x32. On the GPU host's Xeon the tiles prefill the 1B
 * shape (512 tokens, 8 threads) ~1.4x faster than the passes (bench/RESULTS.md, gguf3).
 *
 * Why bf16 and not int8: an int8 tile product per 32-value group needs its int32 tile stored and
 * scaled by that group's weight scales before the next group (4.3 ns per tile store, plus the
 * vector epilogue: 46 ns per group and 16x16 tile measured, against 4.4 ns per product). With
 * the weights dequantized to bf16 (scale and bias applied), the f32 tile accumulates across every
 * group and is stored once per K chunk.
 * Precision, a choice (EXO_AMX_PRODUCTS): each weight is split into two bf16 numbers, w = hi + lo
 * (16 significant bits: exact for a GGUF Q4_0 weight, an f16 scale times a 4-bit value;
 * amx_b_split). By default each activation is rounded to one bf16 (8 significant bits, an error
 * of at most 2^-8 of |x|) and two products run, hi(w)*x + lo(w)*x: the weights as the file has
 * them, the activations rounded per value -- finer than llama.cpp's, which quantizes each block
 * of 32 (Q8_0) or 256 (Q8_K) activations to int8 against the block's largest. EXO_AMX_PRODUCTS=3
 * also splits the activations (x = hi + lo) and adds lo(x)*hi(w): ~2^-16 of |w||x| per term, as
 * small as the AVX-512 kernels' int16 activations, 1.27-1.44x slower per core (bench/RESULTS.md,
 * gguf5). What the 2-product default changes is measured by test_cpu_amx (exact against the
 * reference on bf16-rounded activations; against f32 ones ~2e-5 of max|x| * sum|w|) and
 * tests/e2e/gguf_llamacpp.test.mjs (against llama.cpp itself).
 *
 * How, per pair of 16-row blocks (one C tile each, 16 tokens x 16 rows, f32) and token tile:
 *   A tiles: 16 tokens x 32 values (bf16 hi, and lo with 3 products), 1 KiB each, prepared once per call, tile by
 *     tile (contiguous: tiles of rows `cols` apart would share L1 sets).
 *   B tiles: 16 rows of 64 bytes, row k holding values 2k, 2k+1 of each of the 16 weight rows
 *     (the pair order TDPBF16PS reads), hi and lo: dequantized from the interleaved layout once
 *     per K chunk into thread scratch (4-bit: nibbles j of each row's word, 8-bit: bytes).
 *   Per 32 values: 1 (2) A loads, 4 B loads, 4 (6) products. The K dimension is cut in chunks whose
 *   activations (all tokens) stay in L2 while a thread walks its blocks; the C tiles are loaded
 *   from and stored to y between chunks.
 * Linux gives a process the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM), asked
 * once; each job loads its tile configuration and releases the tiles at its end. */
#include "compute/cpu/matmul_amx.h"

#include "compute/cpu/cpu_internal.h"

#include <stdatomic.h>

static _Atomic int amx_forced = -1; /* cpu_amx_set_enabled: -1 = EXO_AMX decides */

void cpu_amx_set_enabled(int on) {
    atomic_store(&amx_forced, on < 0 ? -1 : on ? 1 : 0);
}

static _Atomic int amx_products_forced = -1; /* cpu_amx_set_products: -1 = EXO_AMX_PRODUCTS decides */

void cpu_amx_set_products(int n) {
    atomic_store(&amx_products_forced, n == 2 || n == 3 ? n : -1);
}

#if defined(__x86_64__) && defined(__linux__)

#include "base/threadpool.h"
#include "compute/cpu/mlx_avx512.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TAMX                                                                                       \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vnni,gfni,avx512bf16,"   \
                          "avx2,fma,f16c,amx-tile,amx-bf16")))

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Steps of 32 values per K chunk: a unit's B tiles for one chunk (2 blocks x 2 KiB per step,
 * 24 KiB) stay in L1 (48 KiB on Sapphire Rapids) beside the activation and sum tiles passing
 * through, while its token tiles pass; the chunk's activations (512 tokens: 384 KiB) stay in L2
 * while the thread walks its units. Per core, 4-bit 2048x2048 x 512 tokens: 4 steps 533-560
 * GFLOP/s, 6: 574-594, 8: 549-562, 12: 514-516. */
#define CPU_AMX_CHUNK_STEPS 6

/* EXO_AMX_PREFETCH=0: no prefetch of the next unit's weights (A/B runs; amx_pf_unit). */
static _Atomic int amx_pf_env = -1;
static int amx_prefetch_on(void) {
    return cpu_env_switch(&amx_pf_env, "EXO_AMX_PREFETCH", "0");
}

/* Tile products per 32 values and block: 2 (activations one bf16) unless EXO_AMX_PRODUCTS=3. */
static _Atomic int amx_products_env = -1;
static int amx_products(void) {
    int forced = atomic_load_explicit(&amx_products_forced, memory_order_relaxed);
    if (forced > 0) return forced;
    return cpu_env_switch(&amx_products_env, "EXO_AMX_PRODUCTS", "3") ? 2 : 3;
}

int cpu_amx_products(void) {
    return amx_products();
}

static _Atomic int amx_hw = -1;  /* CPUID + OS + permission, asked once */
static _Atomic int amx_env = -1; /* EXO_AMX */

static const char *amx_why = "not asked yet"; /* cpu_amx_status */

static int amx_detect(void) {
    unsigned a, b, c, d;
    amx_why = "no AMX-TILE/AMX-BF16 in CPUID";
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0; /* OSXSAVE */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 22) & 1) || !((d >> 24) & 1)) return 0; /* AMX-BF16, AMX-TILE */
    __cpuid_count(7, 1, a, b, c, d);
    amx_why = "no AVX512-BF16 in CPUID";
    if (!((a >> 5) & 1)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    amx_why = "the OS did not enable the tile state (XCR0)";
    if ((lo & (3u << 17)) != (3u << 17)) return 0; /* XTILECFG and XTILEDATA */
    amx_why = "Linux refused the tile state (arch_prctl ARCH_REQ_XCOMP_PERM)";
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    amx_why = "on";
    return 1;
}

const char *cpu_amx_status(void) {
    int forced = atomic_load(&amx_forced);
    cpu_amx_set_enabled(1);
    int hw = cpu_amx_available();
    cpu_amx_set_enabled(forced);
    if (!hw) return amx_why;
    return cpu_amx_available() ? "on" : "off (EXO_AMX=0)";
}

int cpu_amx_available(void) {
    int forced = atomic_load_explicit(&amx_forced, memory_order_relaxed);
    if (forced == 0) return 0;
    int v = atomic_load_explicit(&amx_hw, memory_order_relaxed);
    if (v < 0) {
        v = amx_detect();
        atomic_store(&amx_hw, v);
    }
    if (!v) return 0;
    return forced == 1 || cpu_env_switch(&amx_env, "EXO_AMX", "0");
}

int cpu_amx_ok(const weight_matrix *w, int64_t n_tokens) {
    return n_tokens >= CPU_AMX_MIN_TOKENS && w->format == WEIGHT_MLX_AFFINE &&
           w->layout == WEIGHT_LAYOUT_MLX_ROWS16 && (w->bits == 4 || w->bits == 8) &&
           w->rows % 16 == 0 && w->cols % 128 == 0 &&
           (w->group_size == 32 || w->group_size == 64 || w->group_size == 128) && cpu_amx_available();
}

/* The activations: tokens padded to tpad (a multiple of 16; the padding zero), for token tile tt
 * and step s (values 32s..32s+31) the hi tile then the lo tile, 16 tokens x 32 bf16 each,
 * chunk by chunk of chunk_steps steps, within a chunk token tile by token tile (amx_a_at): what
 * a thread reads for one chunk is contiguous (tiles of one token tile a power of two apart would
 * share L2 sets and evict each other). */
typedef struct amx_x {
    int64_t n_tokens, tpad, cols, steps, chunk_steps;
    int64_t tile_elems; /* per (token tile, step): 512 (hi only: amx_products 2) or 1024 (hi, lo) */
    const float *x;
    uint16_t *planes;
} amx_x;

static inline uint16_t *amx_a_at(const amx_x *px, int64_t tt, int64_t s) {
    int64_t s0 = s - s % px->chunk_steps, ns = px->steps - s0 < px->chunk_steps ? px->steps - s0 : px->chunk_steps;
    return px->planes + (s0 * (px->tpad / 16) + tt * ns + (s - s0)) * px->tile_elems;
}

/* Tokens [t0, t1) of px. */
TAMX static void amx_x_prepare(void *p, int64_t t0, int64_t t1, int thread_index) {
    (void)thread_index;
    amx_x *px = p;
    for (int64_t t = t0; t < t1; t++) {
        for (int64_t s = 0; s < px->steps; s++) {
            uint16_t *row = amx_a_at(px, t >> 4, s) + (t & 15) * 32;
            int lo = px->tile_elems == 1024;
            if (t >= px->n_tokens) {
                memset(row, 0, 64);
                if (lo) memset(row + 512, 0, 64);
                continue;
            }
            const float *xs = px->x + t * px->cols + 32 * s;
            __m512 a = _mm512_loadu_ps(xs), b = _mm512_loadu_ps(xs + 16);
            __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* values 0..15, then 16..31 */
            _mm512_storeu_si512(row, h);
            if (!lo) continue;
            __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
            __m512 hb = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
            __m512i l = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
            _mm512_storeu_si512(row + 512, l);
        }
    }
}

/* All eight tiles 16 rows x 64 bytes (palette 1): tmm0/1 activations hi/lo, tmm2/3 block 0's
 * weights hi/lo, tmm4/5 block 1's, tmm6/7 the two blocks' f32 sums. */
typedef struct __attribute__((aligned(64))) amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

TAMX static void amx_configure(void) {
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
    /* Not _tile_loadconfig: GCC's intrinsic tells the compiler it reads 8 bytes of the config
     * (an "m" operand of pointer type), so the stores of rows and colsb may be dropped as dead
     * stores. They were, once amx_units grew (a trial of gguf4): ldtilecfg read palette 1 with
     * zero rows and the first tile instruction raised SIGILL. The asm reads the whole struct. */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

/* One B row pair from the values v (f0) and v' (f1) of 16 weight rows: dword n = hi(v[n]) |
 * hi(v'[n]) << 16 at bh, the residuals' at bl. hi is f truncated to its upper 16 bits (a bf16: no
 * conversion, and the pair order is one shift and one bit select); lo = f - hi exactly, rounded
 * to bf16. Precision: |lo| < 2^-7 |f|, rounded to within 2^-8 of itself: hi + lo is within 2^-15
 * of f, and exact for 4-bit GGUF weights (an f16 scale times q - 8: 15 significant bits). */
TAMX INLINE void amx_b_split(__m512 f0, __m512 f1, __m512i pair, uint16_t *bh, uint16_t *bl) {
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    __m512i i0 = _mm512_castps_si512(f0), i1 = _mm512_castps_si512(f1);
    /* 0xE4 = (a & c) | (b & ~c) with a = i1, b = i0 >> 16, c = top */
    _mm512_store_si512(bh, _mm512_ternarylogic_epi32(i1, _mm512_srli_epi32(i0, 16), top, 0xE4));
    __m512 l0 = _mm512_sub_ps(f0, _mm512_castsi512_ps(_mm512_and_si512(i0, top)));
    __m512 l1 = _mm512_sub_ps(f1, _mm512_castsi512_ps(_mm512_and_si512(i1, top)));
    _mm512_store_si512(bl, _mm512_permutexvar_epi16(pair, (__m512i)_mm512_cvtne2ps_pbh(l1, l0)));
}

/* Step s (values 32s..32s+31) of 16-row block b as the B tiles: hi at bh, lo at bh + 512. A
 * step is `bits` vectors of the block's lines; vector i holds, in each row's 32-bit lane, the
 * values of 16 / bits byte pairs (4-bit: values 8i..8i+7, byte j = values 2j, 2j + 1; 8-bit:
 * values 4i..4i+3, pair j = values 2j, 2j + 1). Value p of a lane (bits p*bits..) is taken by a
 * mask alone and converted as an unsigned number q * 2^(p*bits) (exact: at most 8 significant
 * bits), its scale multiplied by 2^-(p*bits) beforehand (exact: a power of two), so q * scale +
 * bias costs an and, a conversion and an fma. bits is a constant at each call (unrolled). */
TAMX INLINE void amx_b_step_bits(const weight_matrix *w, const cpu_rows16_block *blk, int64_t s,
                                 uint16_t *bh, __m512i pair, const int bits) {
    int64_t g = 32 * s / w->group_size, sg = s - g * (w->group_size / 32); /* step sg of group g */
    __m512 sc = scales_load16(w->scale_dtype, cpu_rows16_scales(blk, g), 0, 0xffff);
    __m512 bi = w->zero_point ? _mm512_mul_ps(sc, _mm512_set1_ps(-(float)w->zero_point))
                              : scales_load16(w->scale_dtype, cpu_rows16_biases(blk, g), 0, 0xffff);
    const uint8_t *lines = cpu_rows16_lines(blk, g) + 64 * (size_t)(bits * sg);
    uint16_t *bl = bh + 512;
    const int per = 32 / bits, pairs = 16 / bits;
    __m512 scp[8];
#pragma GCC unroll 8
    for (int p = 0; p < per; p++) scp[p] = _mm512_mul_ps(sc, _mm512_set1_ps(1.0f / (float)(1u << (p * bits))));
#pragma GCC unroll 8
    for (int i = 0; i < bits; i++) {
        __m512i v = _mm512_loadu_si512(lines + 64 * i);
#pragma GCC unroll 4
        for (int j = 0; j < pairs; j++) {
            const __m512i m0 = _mm512_set1_epi32((int)(((1u << bits) - 1) << (2 * bits * j)));
            const __m512i m1 = _mm512_set1_epi32((int)(((1u << bits) - 1) << (2 * bits * j + bits)));
            __m512 f0 = _mm512_fmadd_ps(_mm512_cvtepu32_ps(_mm512_and_si512(v, m0)), scp[2 * j], bi);
            __m512 f1 = _mm512_fmadd_ps(_mm512_cvtepu32_ps(_mm512_and_si512(v, m1)), scp[2 * j + 1], bi);
            amx_b_split(f0, f1, pair, bh + 32 * (pairs * i + j), bl + 32 * (pairs * i + j));
        }
    }
}

TAMX static void amx_b_step(const weight_matrix *w, const cpu_rows16_block *blk, int64_t s, uint16_t *bh,
                            __m512i pair) {
    if (w->bits == 4) amx_b_step_bits(w, blk, s, bh, pair, 4);
    else amx_b_step_bits(w, blk, s, bh, pair, 8);
}

/* Blocks b0 (and b0 + 1 when two) of a matrix, steps [s0, s0 + ns) with their B tiles at bb
 * (step i, block k: hi at bb + (2 * i + k) * 1024, lo 512 further), every token tile: the sums
 * of token tile tt live at cb + 512 * tt (block 0's 16 x 16, then block 1's), from zero in the
 * first chunk (contiguous, not in y: 16 rows of y are 16 pages apart, and storing a tile there
 * cost more than its products). */
/* Lines to prefetch into L2 while a unit's products run: the next unit's weights, scales and
 * biases for this chunk, a few per (token tile, step). Why: per chunk a unit reads only
 * ns * 64 * bits bytes of each block, and the blocks are 16 * cols * bits / 8 bytes apart: pieces
 * of 1.5-3 KiB at strides of 32-114 KiB on the 8B shapes, which the hardware prefetchers do not
 * follow, so every piece began with misses the tiles waited for. One core of the dev VM, 128
 * tokens: 4-bit 14336x4096 336-367 -> 435-447 GFLOP/s, 4096x14336 365 -> 454, 8-bit 279-310 ->
 * 435-446; the 1B shapes at 512 tokens 523-556 -> 546-583 (bench/RESULTS.md, gguf4). */
typedef struct amx_pf {
    const uint8_t *p[6];
    size_t len[6];
    int n, i;   /* ranges, current range */
    size_t off; /* within it */
    int per;    /* lines per (token tile, step) */
} amx_pf;

static inline void amx_pf_some(amx_pf *pf) {
    for (int k = 0; k < pf->per && pf->i < pf->n; k++) {
        cpu_prefetch_l2(pf->p[pf->i] + pf->off);
        pf->off += 64;
        if (pf->off >= pf->len[pf->i]) pf->i++, pf->off = 0;
    }
}

/* a_lo (a constant at each call): the activations' lo tiles are there and multiplied (3 products
 * per block and step: hi*hi + lo*hi + hi*lo), or not (2: hi*hi + hi*lo; amx_products). */
TAMX INLINE void amx_pair_with(const amx_x *px, float *cb, int two, const uint16_t *bb, int64_t s0, int64_t ns,
                               int first, amx_pf *pf, const int a_lo) {
    for (int64_t tt = 0; tt < px->tpad / 16; tt++) {
        float *c = cb + 512 * tt;
        if (first) {
            _tile_zero(6);
            _tile_zero(7);
        } else {
            _tile_loadd(6, c, 64);
            _tile_loadd(7, c + 256, 64);
        }
        const uint16_t *a = px->planes + (s0 * (px->tpad / 16) + tt * ns) * px->tile_elems; /* amx_a_at(px, tt, s0) */
        const char *cn = (const char *)(c + 512); /* the next token tile's sums, 2 KiB: into L1 meanwhile */
        for (int64_t i = 0; i < ns; i++, a += px->tile_elems) {
            const uint16_t *b = bb + 2 * i * 1024;
            amx_pf_some(pf);
            if (!first && tt + 1 < px->tpad / 16)
                for (int64_t o = 64 * (i * 32 / ns); o < 64 * ((i + 1) * 32 / ns); o += 64) _mm_prefetch(cn + o, _MM_HINT_T0);
            _tile_loadd(0, a, 64);
            if (a_lo) _tile_loadd(1, a + 512, 64);
            _tile_loadd(2, b, 64);
            _tile_loadd(3, b + 512, 64);
            _tile_dpbf16ps(6, 0, 2);
            _tile_dpbf16ps(6, 0, 3);
            if (a_lo) _tile_dpbf16ps(6, 1, 2);
            if (two) {
                _tile_loadd(4, b + 1024, 64);
                _tile_loadd(5, b + 1536, 64);
                _tile_dpbf16ps(7, 0, 4);
                _tile_dpbf16ps(7, 0, 5);
                if (a_lo) _tile_dpbf16ps(7, 1, 4);
            }
        }
        _tile_stored(6, c, 64);
        _tile_stored(7, c + 256, 64);
    }
}

/* Why not more sum tiles: a trial of gguf5 walked one block and two token tiles at a time with 4
 * sums (token tile x hi/lo weights, one product each per step), against the latency of the
 * products into one sum: 1.3-1.5x slower (4096x4096 4-bit, 128 tokens: 361-367 against 513 GFLOP/s)
 * as each block read the activations again. */
TAMX static void amx_pair(const amx_x *px, float *cb, int two, const uint16_t *bb, int64_t s0, int64_t ns,
                          int first, amx_pf *pf) {
    if (px->tile_elems == 1024) amx_pair_with(px, cb, two, bb, s0, ns, first, pf, 1);
    else amx_pair_with(px, cb, two, bb, s0, ns, first, pf, 0);
}

typedef struct amx_job {
    int n;
    const weight_matrix *ws[CPU_MATMUL_MULTI_MAX];
    float *ys[CPU_MATMUL_MULTI_MAX];
    int64_t first_unit[CPU_MATMUL_MULTI_MAX + 1]; /* units: pairs of 16-row blocks */
    const amx_x *px;
    _Atomic int failed;
} amx_job;

/* The ranges of unit u's weights, scales and biases that chunk [s0, s0 + ns) reads, into pf
 * (nothing when u is past u1), spread over the ntt * ns (token tile, step) iterations of a unit. */
static void amx_pf_unit(const amx_job *job, int64_t u, int64_t u1, int64_t s0, int64_t ns, int64_t ntt,
                        amx_pf *pf) {
    pf->n = pf->i = 0, pf->off = 0, pf->per = 0;
    if (u >= u1 || !amx_prefetch_on()) return;
    int i = 0;
    while (u >= job->first_unit[i + 1]) i++;
    const weight_matrix *w = job->ws[i];
    int64_t b0 = 2 * (u - job->first_unit[i]);
    int two = 16 * (b0 + 1) < w->rows;
    size_t lines = 0;
    for (int k = 0; k < 1 + two; k++) {
        cpu_rows16_block blk = cpu_rows16_block_at(w, b0 + k, 0);
        size_t step_bytes = 64 * (size_t)w->bits;
        int64_t g0 = 32 * s0 / w->group_size, g1 = (32 * (s0 + ns) + w->group_size - 1) / w->group_size;
        if (blk.side_inline) { /* whole groups: their lines, scales and biases are one range */
            pf->p[pf->n] = cpu_rows16_lines(&blk, g0), pf->len[pf->n++] = (size_t)(g1 - g0) * blk.stride;
            lines += (size_t)(g1 - g0) * blk.stride / 64;
            continue;
        }
        pf->p[pf->n] = blk.lines + (size_t)s0 * step_bytes, pf->len[pf->n++] = (size_t)ns * step_bytes;
        pf->p[pf->n] = cpu_rows16_scales(&blk, g0), pf->len[pf->n++] = (size_t)(g1 - g0) * blk.sstride;
        if (blk.biases_streamed)
            pf->p[pf->n] = cpu_rows16_biases(&blk, g0), pf->len[pf->n++] = (size_t)(g1 - g0) * blk.sstride;
        lines += (size_t)ns * step_bytes / 64 + 2 * ((size_t)(g1 - g0) * blk.sstride / 64 + 1);
    }
    pf->per = (int)((lines + (size_t)(ntt * ns) - 1) / (size_t)(ntt * ns));
}

/* Units [u0, u1) of the job's matrices (pairs of blocks; a matrix's last unit may be one block),
 * K chunk by K chunk (the chunk's activations, all tokens, stay in L2 while the thread walks its
 * units; a unit's B tiles for the chunk, in L1 while it walks the token tiles), the sums in
 * thread scratch until the last chunk, then into y. */
TAMX static void amx_units(void *p, int64_t u0, int64_t u1, int thread_index) {
    (void)thread_index;
    amx_job *job = p;
    const amx_x *px = job->px;
    int64_t cs = px->chunk_steps, ntt = px->tpad / 16;
    uint16_t *bb = cpu_scratch(2, (size_t)cs * 2 * 2048);
    float *cbuf = cpu_scratch(1, (size_t)(u1 - u0) * (size_t)ntt * 512 * sizeof(float));
    if (!bb || !cbuf) {
        atomic_store(&job->failed, 1);
        return;
    }
    int16_t pidx[32];
    for (int n = 0; n < 16; n++) pidx[2 * n] = (int16_t)n, pidx[2 * n + 1] = (int16_t)(16 + n);
    const __m512i pair = _mm512_loadu_si512(pidx);
    amx_configure();
    for (int64_t s0 = 0; s0 < px->steps; s0 += cs) {
        int64_t ns = px->steps - s0 < cs ? px->steps - s0 : cs;
        for (int i = 0; i < job->n; i++) {
            int64_t lo = job->first_unit[i] > u0 ? job->first_unit[i] : u0;
            int64_t hi = job->first_unit[i + 1] < u1 ? job->first_unit[i + 1] : u1;
            const weight_matrix *w = job->ws[i];
            for (int64_t u = lo; u < hi; u++) {
                int64_t b0 = 2 * (u - job->first_unit[i]);
                int two = 16 * (b0 + 1) < w->rows;
                for (int k = 0; k < 1 + two; k++) {
                    cpu_rows16_block blk = cpu_rows16_block_at(w, b0 + k, 0);
                    for (int64_t st = 0; st < ns; st++) amx_b_step(w, &blk, s0 + st, bb + (2 * st + k) * 1024, pair);
                }
                amx_pf pf;
                amx_pf_unit(job, u + 1, u1, s0, ns, ntt, &pf);
                amx_pair(px, cbuf + (u - u0) * ntt * 512, two, bb, s0, ns, s0 == 0, &pf);
            }
        }
    }
    _tile_release();
    for (int i = 0; i < job->n; i++) { /* the sums into y, token by token */
        int64_t lo = job->first_unit[i] > u0 ? job->first_unit[i] : u0;
        int64_t hi = job->first_unit[i + 1] < u1 ? job->first_unit[i + 1] : u1;
        const weight_matrix *w = job->ws[i];
        for (int64_t u = lo; u < hi; u++) {
            int64_t b0 = 2 * (u - job->first_unit[i]);
            int two = 16 * (b0 + 1) < w->rows;
            const float *c = cbuf + (u - u0) * ntt * 512;
            for (int64_t t = 0; t < px->n_tokens; t++) {
                float *yt = job->ys[i] + t * w->rows + 16 * b0;
                const float *ct = c + 512 * (t >> 4) + 16 * (t & 15);
                _mm512_storeu_ps(yt, _mm512_load_ps(ct));
                if (two) _mm512_storeu_ps(yt + 16, _mm512_load_ps(ct + 256));
            }
        }
    }
}

int cpu_amx_matmul_multi(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                         int64_t n_tokens) {
    if (n < 1 || n > CPU_MATMUL_MULTI_MAX) return -1;
    int64_t cols = ws[0]->cols;
    amx_job job = {.n = n};
    for (int i = 0; i < n; i++) {
        if (!cpu_amx_ok(ws[i], n_tokens) || ws[i]->cols != cols) return -1;
        job.ws[i] = ws[i];
        job.ys[i] = ys[i];
        job.first_unit[i + 1] = job.first_unit[i] + (ws[i]->rows / 16 + 1) / 2;
    }
    int64_t tpad = (n_tokens + 15) & ~(int64_t)15;
    amx_x px = {.n_tokens = n_tokens, .tpad = tpad, .cols = cols, .steps = cols / 32, .x = x};
    px.chunk_steps = CPU_AMX_CHUNK_STEPS;
    px.tile_elems = amx_products() == 3 ? 1024 : 512;
    px.planes = cpu_scratch(0, (size_t)(tpad * cols) * (size_t)px.tile_elems / 256);
    if (!px.planes) return -1;
    threadpool *pool = cpu_thread_pool();
    threadpool_parallel_for(pool, tpad, amx_x_prepare, &px);
    job.px = &px;
    atomic_init(&job.failed, 0);
    threadpool_parallel_for(pool, job.first_unit[n], amx_units, &job);
    return atomic_load(&job.failed) ? -1 : 0;
}

#else /* no AMX outside x86-64 Linux */

int cpu_amx_products(void) {
    return 3;
}

const char *cpu_amx_status(void) {
    return "not on this platform";
}

int cpu_amx_available(void) {
    return 0;
}

int cpu_amx_ok(const weight_matrix *w, int64_t n_tokens) {
    (void)w, (void)n_tokens;
    return 0;
}

int cpu_amx_matmul_multi(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                         int64_t n_tokens) {
    (void)n, (void)ws, (void)x, (void)ys, (void)n_tokens;
    return -1;
}

#endif
