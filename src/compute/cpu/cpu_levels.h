/* cpu_levels — the CPU backend one SIMD level at a time, for tests and benchmarks that compare
 * the levels and gemm engines against each other and against the reference: the levels, each
 * level's kernel table (cpu.c dispatches through these), matmul with an explicit level and
 * engine, and the A/B switches of the matvec. Callers that only want fast results use cpu.h.
 *
 * Matmul has two regimes:
 *   - matvec (decode; up to CPU_MATVEC_PASSES_* tokens, in passes of CPU_MATVEC_MAX_TOKENS):
 *     one pass over the weights per 8 tokens, every token
 *     dotted with each row while it is in registers; memory-bound, so kernels read each weight
 *     byte once and do as little arithmetic per byte as possible.
 *   - gemm (prefill): weights dequantized tile by tile to f32 and multiplied with a register-
 *     blocked kernel (or OpenBLAS sgemm); compute-bound. */
#ifndef EXO_COMPUTE_CPU_LEVELS_H
#define EXO_COMPUTE_CPU_LEVELS_H

#include "compute/cpu/cpu.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CPU_MATVEC_MAX_TOKENS 8

typedef enum cpu_level {
    CPU_LEVEL_GENERIC = 0,
    CPU_LEVEL_AVX2,   /* AVX2 + FMA + F16C */
    CPU_LEVEL_AVX512, /* AVX-512 F/BW/VL/VBMI/VNNI + GFNI (Ice Lake, Sapphire Rapids, Zen 4 and later) */
    CPU_LEVEL_NEON,   /* aarch64 Advanced SIMD (every aarch64 CPU: Cortex-A53/A72, Pi 3/4) */
    CPU_LEVEL_NEON_DOTPROD, /* + SDOT/UDOT (ARMv8.2 dotprod: Cortex-A76/Pi 5, Graviton 2+, Ampere) */
    CPU_LEVEL_COUNT
} cpu_level;

/* Whether this CPU has the aarch64 i8mm extension (USDOT/SMMLA: Graviton 3+, Cortex-A710+, read
 * from HWCAP2); the dotprod level's 8-bit kernel then uses USDOT. 0 elsewhere. */
int cpu_neon_i8mm(void);

/* 4-bit kernel choice for A/B runs and tests: 1 = byte planes (the default; cpu_mlx_x_to_planes),
 * 0 = int16 activations permuted within each 32-byte chunk. Default from EXO_MATVEC_Q4 (planes|int16), read once. */
int cpu_matvec_q4_planes(void);
void cpu_matvec_set_q4_planes(int on);

/* Whether the AVX2 level's interleaved 4-bit kernel uses AVX-VNNI (vpdpbusd on 256 bits) rather
 * than vpmaddubsw + vpmaddwd: 1 when the CPU has it and EXO_AVX2_VNNI is not 0. The setter (tests)
 * cannot turn it on where the CPU lacks it. 0 on other architectures. */
int cpu_avx2_vnni(void);
void cpu_avx2_set_vnni(int on);

/* Whether the AVX-512 interleaved kernels (mlx_rows16) prefetch weight lines, scales and biases
 * into L2 only (prefetcht1, cpu_rows16_block.to_l2) instead of L1 (prefetcht0). Default from
 * EXO_MATVEC_PREFETCH_L2=0|1, read once, else 1 on Intel CPUs (CPUID vendor GenuineIntel) and 0
 * elsewhere. On Emerald Rapids (the dev VM, the 1B shape streamed from DRAM in a huge-page arena)
 * prefetcht1 read 2.4-3.4% more per core than prefetcht0 and 2.9% more with both cores at its
 * quiet moments (8-bit 32.8 against 31.8 GB/s); the AVX2 kernels, slower consumers of the same
 * lines, lost 1-5% with it and keep prefetcht0; AMD Zen 4/5 put prefetcht1 into L2 too but were
 * not measured, so they keep prefetcht0 (bench/RESULTS.md, issue 25, cpu26). The setter is for
 * tests and benchmarks. */
int cpu_matvec_prefetch_l2(void);
void cpu_matvec_set_prefetch_l2(int on);
/* Sets the matvec kernels' software prefetch distance (EXO_MATVEC_PREFETCH's bytes, rounded down
 * to 64; 0 = none; above 1 MiB: the default), for benchmarks that compare distances in one process. */
void cpu_matvec_set_prefetch(size_t bytes);
/* Sets the interleaved kernels' blocks in flight per thread at 1-2 tokens (EXO_MATVEC_STREAMS:
 * 1, 2 or 4; anything else: the default 2), for tests and benchmarks. */
void cpu_matvec_set_streams(int streams);

/* Rewrites a row of int16 activations (natural order, cols a multiple of 128) into the byte-plane
 * layout the AVX-512 4-bit kernel reads, in place: per chunk of 128 values x = 256*hi + lo, the hi
 * bytes (s8) of the 64 even values, of the odd values, then the lo bytes (u8) of the even values,
 * of the odd values (cpu_internal.h, cpu_mlx_x_planes, says when it applies and why). */
static inline void cpu_mlx_x_to_planes(int16_t *q, int64_t cols) {
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
        uint8_t tmp[256];
        for (int j = 0; j < 64; j++)
            for (int k = 0; k < 2; k++) {
                int v = q[c0 + 2 * j + k];
                int lo = v & 0xff, hi = (v - lo) / 256; /* v = 256*hi + lo, hi in [-128, 127] */
                tmp[64 * k + j] = (uint8_t)(hi & 0xff);
                tmp[128 + 64 * k + j] = (uint8_t)lo;
            }
        memcpy(q + c0, tmp, sizeof tmp);
    }
}

/* Rewrites a row of int16 activations (natural order, cols a multiple of 128, |q| <= 32639) into
 * the layout of the 8-bit interleaved kernel, in place: per chunk of 128 values x = 256*hi + lo
 * with both bytes signed, the 128 hi bytes then the 128 lo bytes (cpu_internal.h,
 * cpu_mlx_x_planes8). */
static inline void cpu_mlx_x_to_planes8(int16_t *q, int64_t cols) {
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
        int8_t tmp[256];
        for (int j = 0; j < 128; j++) {
            int v = q[c0 + j], lo = (int8_t)(uint8_t)(v & 0xff); /* v = 256*hi + lo exactly */
            tmp[j] = (int8_t)((v - lo) / 256);
            tmp[128 + j] = (int8_t)lo;
        }
        memcpy(q + c0, tmp, sizeof tmp);
    }
}

/* Activations prepared once per matmul call, shared read-only by all threads.
 * For MLX-affine weights the AVX-512 kernels dot integer weights with int16 activations:
 * x[t][c] ~= xq[t][c] * xscale[t][g] with xscale = max|x in group| / 32767, so the quantization
 * error of an activation is at most 1/65534 of its group's largest magnitude — far below the bf16
 * rounding of the weights themselves. The bias term uses the exact float group sums. */
typedef struct matvec_input {
    const float *x;       /* [n_tokens][cols] */
    int64_t n_tokens;     /* 1..CPU_MATVEC_MAX_TOKENS */
    const int16_t *xq;    /* [n_tokens][cols] (MLX, levels that use it) */
    const float *xscale;  /* [n_tokens][groups] */
    const float *xsum;    /* [n_tokens][groups]: sum of x over each group (MLX) */
} matvec_input;

/* Computes y[t][r] for rows [r0, r1); y is [n_tokens][w->rows]. */
typedef void (*cpu_matvec_fn)(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0,
                              int64_t r1);
/* Dequantizes W[r][c0 .. c0+len) into out (f32). For MLX, c0 and len are multiples of the group
 * size (or len reaches the end of the row). */
typedef void (*cpu_dequant_fn)(const weight_matrix *w, int64_t r, int64_t c0, int64_t len,
                               float *out);
/* Register-blocked f32 micro-kernel of the gemm regime, or NULL (the level uses OpenBLAS sgemm).
 * wpanel: [k_len][CPU_GEMM_MR] (MR consecutive weight rows, transposed); xpanel: [k_len][CPU_GEMM_NR]
 * (NR consecutive tokens, transposed); y points at y[t0][r0] with row stride ldy (= w->rows);
 * writes (accumulate = 0) or adds (1) the tile's n_valid_tokens x m_valid_rows results. */
typedef void (*cpu_gemm_tile_fn)(const float *wpanel, const float *xpanel, int64_t k_len, float *y,
                                 int64_t ldy, int m_valid_rows, int n_valid_tokens, int accumulate);

/* Fills wpanel [k_len][CPU_GEMM_MR] with W[r0 + i][c0 + k] (rows i >= m_valid are zero); tmp has
 * room for CPU_GEMM_MR * CPU_GEMM_KC floats. */
typedef void (*cpu_gemm_pack_fn)(const weight_matrix *w, int64_t r0, int m_valid, int64_t c0,
                                 int64_t k_len, float *wpanel, float *tmp);

/* Fills xsum/xscale/xq ([n][groups], [n][groups], [n][cols]) for MLX weights as matvec_input
 * describes, xq in the cpu_mlx_x_permuted layout where it applies. */
typedef void (*cpu_prepare_mlx_fn)(const weight_matrix *w, const float *x, int64_t n, float *xsum,
                                   float *xscale, int16_t *xq);

typedef struct cpu_kernels {
    const char *name;
    int needs_int16_x; /* MLX matvec wants xq/xscale */
    /* Bit widths (bit b set: b-bit) of MLX matrices this level reads in the 16-row interleaved
     * layout (WEIGHT_LAYOUT_MLX_ROWS16, layout.c); the driver refuses the others. */
    unsigned rows16_bits;
    /* 8-bit interleaved matrices: the kernel reads the signed byte planes of cpu_mlx_x_planes8
     * (1: AVX-512) or int16 activations in natural order (0: AVX2, whose vpmaddubsw would
     * saturate on full-range weight and activation bytes). */
    int rows16_x8_planes;
    cpu_prepare_mlx_fn prepare_mlx; /* NULL: the portable loop in cpu.c */
    cpu_matvec_fn matvec;
    cpu_dequant_fn dequant;
    cpu_gemm_tile_fn gemm_tile; /* NULL: sgemm */
    cpu_gemm_pack_fn gemm_pack; /* with gemm_tile */
} cpu_kernels;

/* Kernel table for a level, or NULL when this build or this CPU lacks it, or EXO_CPU_SIMD caps
 * the levels below it (EXO_CPU_SIMD=avx2 on an AVX-512 machine behaves as an AVX2-only CPU
 * everywhere: kernels, attention, the weight layout chosen at load). */
const cpu_kernels *cpu_kernels_for(cpu_level level);
int cpu_level_supported(cpu_level level);

/* cpu_matmul with an explicit level and gemm engine (tests and benchmarks compare them). */
/* AUTO: the MLX int16 gemm for MLX weights at 9..CPU_MLX_GEMM_MAX_TOKENS tokens on AVX-512,
 * else OWN where the level has a micro-kernel, else OPENBLAS. MLX_INT forces the MLX int16 gemm
 * whenever the level is AVX-512 and the weights are MLX (any token count above the matvec
 * threshold); OWN and OPENBLAS never use it. */
typedef enum cpu_gemm_engine { CPU_GEMM_AUTO = 0, CPU_GEMM_OWN, CPU_GEMM_OPENBLAS, CPU_GEMM_MLX_INT } cpu_gemm_engine;
/* Returns 0; -1 if the level is not supported here (y untouched) or the view is unsupported
 * (y zeroed). max_matvec_tokens < 0 uses the default threshold. */
int cpu_matmul_with(const weight_matrix *w, const float *x, float *y, int64_t n_tokens,
                    cpu_level level, cpu_gemm_engine gemm, int max_matvec_tokens);
/* cpu_matmul_multi with an explicit level (1 <= n <= CPU_MATMUL_MULTI_MAX; the matrices must
 * have the same number of columns, else their outputs are zeroed and -1 returned). */
int cpu_matmul_multi_with(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                          int64_t n_tokens, cpu_level level, cpu_gemm_engine gemm,
                          int max_matvec_tokens);

/* How matvec jobs split rows over threads (see cpu.c): STATIC = one contiguous, equal run of
 * bytes per thread; DYNAMIC = chunks first come first served; STEAL = STATIC's runs in chunks,
 * finished threads take chunks from the back of the others' runs. Default: EXO_MATVEC_SPLIT
 * (static|dynamic|steal), else STEAL. For tests and benchmarks. */
enum { CPU_SPLIT_STATIC = 0, CPU_SPLIT_DYNAMIC = 1, CPU_SPLIT_STEAL = 2 };
void cpu_matvec_set_split(int split);

/* Checks a view's fields so kernels can trust them (bits, group size, divisibility, pointers). */
int cpu_weight_supported(const weight_matrix *w);

#endif
