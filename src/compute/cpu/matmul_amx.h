/* matmul_amx — 4- and 8-bit MLX matrices in the 16-row interleaved layout times many tokens
 * (prefill, large batches) on Intel AMX (AMX-BF16 tiles: Sapphire Rapids and later Xeons), the
 * weights split into two bf16 numbers and the activations rounded to one bf16 (or, with
 * EXO_AMX_PRODUCTS=3, split too: the precision of the AVX-512 kernels' int16 activations).
 * Private to compute/cpu/ (cpu.c calls it; see matmul_amx.c for how it works).
 * Refuses (cpu_amx_ok answers 0): no AMX or the kernel did not grant the tile state, a level other
 * than AVX-512, other layouts and widths, row counts that are not whole 16-row blocks, fewer than
 * CPU_AMX_MIN_TOKENS tokens, and EXO_AMX=0 (A/B runs). */
#ifndef EXO_COMPUTE_CPU_MATMUL_AMX_H
#define EXO_COMPUTE_CPU_MATMUL_AMX_H

#include "model/weight_types.h"

#include <stdint.h>

/* From this many tokens on the tiles beat the 8-token VNNI matvec passes: the weights are
 * dequantized to bf16 once per call, which fewer tokens do not repay (one core, 2048x8192 g32:
 * at 16 tokens 143-153 GFLOP/s against 232-253, at 32 even, at 40 1.03-1.16x, at 64 1.5-1.6x;
 * bench/RESULTS.md, gguf3). */
#define CPU_AMX_MIN_TOKENS 40

/* Whether this process may run tiles: the CPU has AMX-TILE and AMX-INT8, AVX-512 is the level in
 * use, EXO_AMX is not 0, and Linux granted the tile data state (asked once per process). */
int cpu_amx_available(void);
/* Whether cpu_amx_matmul_multi takes w at n_tokens. */
int cpu_amx_ok(const weight_matrix *w, int64_t n_tokens);
/* ys[i] [n_tokens][rows] = x [n_tokens][cols] times ws[i]^T for n matrices of one column count
 * that cpu_amx_ok accepts, on the CPU thread pool. Returns 0, or -1 when out of memory (nothing
 * trustworthy written: the caller computes them another way). */
int cpu_amx_matmul_multi(int n, const weight_matrix *const *ws, const float *x, float *const *ys,
                         int64_t n_tokens);

/* "on", "off (EXO_AMX=0)", or why the tiles cannot run here (for exo bench's header). */
const char *cpu_amx_status(void);
/* For tests and benches: 1 runs the tiles wherever the hardware allows, 0 never, -1 as EXO_AMX says. */
void cpu_amx_set_enabled(int on);
/* For tests and benches: tile products per block and 32 values, 2 (the activations rounded to one
 * bf16, the weights exact) or 3 (both exact to 16 bits); -1 as EXO_AMX_PRODUCTS says (default 2). */
void cpu_amx_set_products(int n);
/* The tile products the next call runs: 2 or 3 (cpu_amx_set_products, EXO_AMX_PRODUCTS). */
int cpu_amx_products(void);

#endif
