/* matvec_dispatch — how a SIMD matvec file turns a run-time token count into kernels compiled
 * for a constant one, written once for every level (matmul_avx2.c, matmul_avx512.c).
 *
 * A matvec kernel keeps one accumulator per token in registers and unrolls its token loops
 * (#pragma GCC unroll 8); that only works when the token count is a compile-time constant, so
 * each always-inline row kernel is instantiated for 1..8 tokens and picked by a switch. Private
 * to compute/cpu/; it holds no code of its own. */
#ifndef EXO_COMPUTE_CPU_MATVEC_DISPATCH_H
#define EXO_COMPUTE_CPU_MATVEC_DISPATCH_H

#include "compute/cpu/cpu_internal.h"

/* Calls fn(args..., nt) with nt = n_tokens as a constant 1..CPU_MATVEC_MAX_TOKENS (8; larger
 * counts never reach a matvec pass). A statement. */
#define CPU_MATVEC_CALL_WITH_NT(n_tokens, fn, ...)                                                 \
    switch (n_tokens) {                                                                            \
    case 1: fn(__VA_ARGS__, 1); break;                                                             \
    case 2: fn(__VA_ARGS__, 2); break;                                                             \
    case 3: fn(__VA_ARGS__, 3); break;                                                             \
    case 4: fn(__VA_ARGS__, 4); break;                                                             \
    case 5: fn(__VA_ARGS__, 5); break;                                                             \
    case 6: fn(__VA_ARGS__, 6); break;                                                             \
    case 7: fn(__VA_ARGS__, 7); break;                                                             \
    default: fn(__VA_ARGS__, 8); break;                                                            \
    }

/* Defines a level's matvec entry `name` (the cpu_kernels.matvec of that level) and its three
 * dense helpers: F32, F16 and BF16 rows go to dense_rows_fn(w, in, y, r0, r1, format, nt), MLX
 * matrices to mlx_fn(w, in, y, r0, r1). target is the level's function attribute (T256, T512). */
#define CPU_MATVEC_BY_FORMAT(target, name, dense_rows_fn, mlx_fn)                                  \
    target static void name##_f32(const weight_matrix *w, const matvec_input *in, float *y,       \
                                  int64_t r0, int64_t r1) {                                        \
        CPU_MATVEC_CALL_WITH_NT(in->n_tokens, dense_rows_fn, w, in, y, r0, r1, WEIGHT_F32)         \
    }                                                                                              \
    target static void name##_f16(const weight_matrix *w, const matvec_input *in, float *y,       \
                                  int64_t r0, int64_t r1) {                                        \
        CPU_MATVEC_CALL_WITH_NT(in->n_tokens, dense_rows_fn, w, in, y, r0, r1, WEIGHT_F16)         \
    }                                                                                              \
    target static void name##_bf16(const weight_matrix *w, const matvec_input *in, float *y,      \
                                   int64_t r0, int64_t r1) {                                       \
        CPU_MATVEC_CALL_WITH_NT(in->n_tokens, dense_rows_fn, w, in, y, r0, r1, WEIGHT_BF16)        \
    }                                                                                              \
    target static void name(const weight_matrix *w, const matvec_input *in, float *y, int64_t r0, \
                            int64_t r1) {                                                          \
        switch (w->format) {                                                                       \
        case WEIGHT_F32: name##_f32(w, in, y, r0, r1); return;                                     \
        case WEIGHT_F16: name##_f16(w, in, y, r0, r1); return;                                     \
        case WEIGHT_BF16: name##_bf16(w, in, y, r0, r1); return;                                   \
        case WEIGHT_MLX_AFFINE: mlx_fn(w, in, y, r0, r1); return;                                  \
        }                                                                                          \
    }

#endif
