/* weight_types — the leaf vocabulary shared by model/ (which makes weight views from files) and
 * compute/ (whose backends read them): element dtypes, the weight formats and layouts, the
 * read-only weight_matrix view, and the scalar conversions between float widths. It includes
 * nothing of exo's, so model/ never needs compute/ (the backend interface is compute/backend.h).
 *
 * Layout convention: a weight matrix is [rows = out_features][cols = in_features], as Hugging
 * Face stores nn.Linear weights; matmul computes y[t][r] = sum_c x[t][c] * W[r][c].
 *
 * It refuses: anything a backend owns (memory, ops), and activation dtypes beyond what a
 * weight view or KV cache needs. */
#ifndef EXO_MODEL_WEIGHT_TYPES_H
#define EXO_MODEL_WEIGHT_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA backend (.cu) includes these */
extern "C" {
#endif

typedef enum dtype {
    DTYPE_F32 = 0,
    DTYPE_F16,
    DTYPE_BF16,
    DTYPE_U32,
    DTYPE_I32,
    DTYPE_U8,
    DTYPE_I8,
    DTYPE_I64,
} dtype;

size_t dtype_size(dtype t);
const char *dtype_name(dtype t);

typedef enum weight_format {
    WEIGHT_F32 = 0,
    WEIGHT_F16,
    WEIGHT_BF16,
    /* MLX affine quantization (mlx-community): each group of `group_size` consecutive values in a
     * row is w = scale * q + bias, q an unsigned `bits`-bit integer packed little-endian into
     * uint32 words (value i of a row at bit offset i*bits, crossing words for 3/5/6 bits). */
    WEIGHT_MLX_AFFINE,
} weight_format;

/* How an MLX matrix's packed words, scales and biases are ordered in memory.
 *   MLX: as mlx-community stores them, row after row ([rows][words], [rows][groups]).
 *   MLX_ROWS16: rows interleaved in blocks of 16: within block b (rows 16b..16b+15), word d of
 *     row 16b+l is word 16*d + l of the block, and scale/bias g of that row is element 16*g + l of
 *     the block's [groups][16]; a block is exactly as many bytes as 16 MLX rows. Rows past the last
 *     whole block (rows % 16 of them) stay in MLX order where MLX has them. Set only by
 *     cpu_weight_repack_rows16 (4- and 8-bit MLX; compute/cpu/layout.c); every reader of
 *     w->data, scales and biases goes through weight_mlx_word / weight_mlx_group below or knows
 *     the layout.
 *     With group_stride set, each group's 16 scales and 16 biases follow its lines instead (one
 *     stream per block): group g of block b is 2*group_size*bits bytes of lines, then its 16
 *     scales, then its 16 biases, at data + (b*groups + g) * group_stride; scales = data +
 *     2*group_size*bits and biases = scales + 16 scales, so all three index with one stride. */
typedef enum weight_layout { WEIGHT_LAYOUT_MLX = 0, WEIGHT_LAYOUT_MLX_ROWS16 } weight_layout;

/* A read-only weight matrix view [rows][cols]. Does not own its memory. */
typedef struct weight_matrix {
    weight_format format;
    int64_t rows;       /* out features */
    int64_t cols;       /* in features */
    const void *data;   /* dense: rows*cols elements; MLX: uint32 [rows][cols*bits/32] */
    const void *scales; /* MLX: [rows][cols/group_size] of scale_dtype */
    const void *biases; /* MLX: [rows][cols/group_size] of scale_dtype */
    dtype scale_dtype;  /* MLX: DTYPE_BF16, DTYPE_F16 or DTYPE_F32 */
    int bits;           /* MLX: 2, 3, 4, 5, 6 or 8 */
    int group_size;     /* MLX: 32, 64 or 128 */
    weight_layout layout; /* MLX: order of data/scales/biases (0 = MLX order) */
    int exact_activations; /* multiply with float activations, never a backend's rounded ones
                              (int16 per group): set where the model amplifies this matmul's
                              errors (the hybrids' q/k/v projection, see weights.c) */
    int zero_point;     /* MLX: 0, or every bias is exactly -zero_point * its scale (GGUF's
                           symmetric Q4_0/Q5_0/Q8_0: 8/16/128), so a kernel may derive the biases
                           instead of reading them: the bytes a matvec streams drop to the GGUF
                           block's (4.5 bits per weight for Q4_0, not 5). biases stay valid for
                           every reader that does not (see weight_matrix_bytes) */
    size_t group_stride; /* MLX_ROWS16 only: 0 when data, scales and biases are three arrays;
                            else the bytes from one 16-row group to the next, the same for data,
                            scales and biases because each group's scales and biases follow its
                            lines (layout.c says which matrices and why) */
} weight_matrix;

/* Index of 32-bit word d of row r in an MLX matrix's data, in either layout. */
static inline int64_t weight_mlx_word(const weight_matrix *w, int64_t r, int64_t d) {
    int64_t words = w->cols * w->bits / 32;
    if (w->layout != WEIGHT_LAYOUT_MLX_ROWS16 || r >= (w->rows & ~(int64_t)15)) return r * words + d;
    if (!w->group_stride) return (r & ~(int64_t)15) * words + d * 16 + (r & 15);
    int64_t per_group = w->group_size * w->bits / 32, g = d / per_group; /* words per row and group */
    return ((r >> 4) * (w->cols / w->group_size) + g) * (int64_t)(w->group_stride / 4) + (d - g * per_group) * 16 +
           (r & 15);
}

/* Index of group g of row r in an MLX matrix's scales and biases, in either layout. */
static inline int64_t weight_mlx_group(const weight_matrix *w, int64_t r, int64_t g) {
    int64_t groups = w->cols / w->group_size;
    if (w->layout != WEIGHT_LAYOUT_MLX_ROWS16 || r >= (w->rows & ~(int64_t)15)) return r * groups + g;
    if (!w->group_stride) return (r & ~(int64_t)15) * groups + g * 16 + (r & 15);
    return ((r >> 4) * groups + g) * (int64_t)(w->group_stride / dtype_size(w->scale_dtype)) + (r & 15);
}

/* Bytes of weight data a matvec reads (for rooflines): without the biases of a zero_point matrix,
 * which the CPU's AVX-512 matvec derives from the scales (other kernels read them: on those the
 * figure is short by one scale per group). */
size_t weight_matrix_bytes(const weight_matrix *w);
/* Dequantizes row r into out[cols] (float32). Reference path, any format. */
void weight_matrix_row_to_f32(const weight_matrix *w, int64_t r, float *out);

/* Scalar conversions used everywhere (exact, round-to-nearest-even for the narrowing ones). */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

#ifdef __cplusplus
}
#endif

#endif
