/* gguf_quant — the ggml block formats: dequantizing rows to float, quantizing rows (for the GGUF
 * writer and tests), and rewriting a row as MLX affine groups of 32 (w = scale * q + bias), the
 * layout exo's matmul kernels run at the memory roofline.
 *
 * Which GGUF types become what (gguf_mlx_bits):
 *   Q4_0, Q4_1, Q4_K -> 4-bit, Q5_0, Q5_1, Q5_K -> 5-bit, Q8_0 -> 8-bit: exact (each 32-value
 *     group of these formats is one scale and one offset; a K-quant's 6-bit sub-scales times
 *     its super-scale are rounded once to the F16 the MLX scales are kept in: relative error
 *     below 2^-11 of a step, far under the quantization's own).
 *   Q3_K -> 8-bit, exact: its values are d times integers in [-124, 128] (a signed 6-bit scale
 *     per 16 times a 3-bit value), so one F16 scale (-d) per group and the zero point 128 hold
 *     them as 128 - v, whatever the sub-scales.
 *   Q6_K, Q2_K -> 8-bit, requantized: their 16-value sub-blocks have their own scales (Q2_K also
 *     its own offsets), which one MLX group of 32 cannot hold; the 8-bit grid adds at most
 *     1/510 of the group's range per value (Q6_K: 1/8 of a step). Q2_K and Q3_K thus take 8.5 bits per
 *     weight in memory where their files take 2.6 and 3.4: they run, but not at their size.
 * Refuses (returns -1): every other type (Q8_1, Q8_K, the IQ types, integer types).
 *
 * Rows are n values, n a multiple of the type's block (32 or 256). */
#ifndef EXO_MODEL_GGUF_QUANT_H
#define EXO_MODEL_GGUF_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* Bits of the MLX layout a quantized GGUF type becomes; 0 for a dense type (F32/F16/BF16) that is
 * used as it is; -1 for a type exo does not run. */
int gguf_mlx_bits(uint32_t type);

/* The zero point of a symmetric type's MLX groups (Q4_0: 8, Q5_0: 16, Q8_0 and Q3_K: 128): every bias
 * gguf_row_to_mlx writes is exactly -zero_point * its scale (weight_matrix.zero_point); 0 for
 * the types with a real offset per group. */
int gguf_mlx_zero_point(uint32_t type);

/* Dequantizes one row of n values. Returns 0, or -1 for a type it does not know. */
int gguf_dequantize_row(uint32_t type, const void *src, int64_t n, float *out);

/* Quantizes one row (writer side: plain min/max or absmax scales, not llama.cpp's searched ones;
 * any valid block is a fine test input). Types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Returns 0, or -1. */
int gguf_quantize_row(uint32_t type, const float *x, int64_t n, void *dst);

/* One row as MLX groups of 32 at gguf_mlx_bits(type) bits: packed words (n*bits/32), scales and
 * biases (n/32 floats). Returns 0, or -1. */
int gguf_row_to_mlx(uint32_t type, const void *src, int64_t n, uint32_t *packed, float *scales,
                    float *biases);

#endif
