/* safetensors — Hugging Face safetensors files, memory-mapped and validated.
 *
 * A file is: u64 little-endian header length N, N bytes of JSON header, then the data region.
 * The header maps tensor names to {dtype, shape, data_offsets}. Every byte is untrusted: the
 * header is checked completely before any tensor is handed out (JSON shape, known dtypes, shapes
 * whose element count times dtype size equals the byte range, ranges inside the data region, no
 * two tensors overlapping). Errors name the file and the tensor.
 *
 * A model directory holds one model.safetensors or several shards listed in
 * model.safetensors.index.json; safetensors_set opens either and finds tensors by name.
 * Pages are only touched when a tensor's data is read, so a pipeline shard that reads only its
 * layers never faults in the others.
 *
 * This module refuses: writing in place, tensors of more than SAFETENSORS_MAX_DIMS dims, and
 * headers over 100 MB. */
#ifndef EXO_MODEL_SAFETENSORS_H
#define EXO_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_MAX_DIMS 8
#define SAFETENSORS_MAX_HEADER (100u << 20)

typedef enum safetensors_dtype {
    ST_F64 = 0,
    ST_F32,
    ST_F16,
    ST_BF16,
    ST_I64,
    ST_I32,
    ST_I16,
    ST_I8,
    ST_U64,
    ST_U32,
    ST_U16,
    ST_U8,
    ST_BOOL,
    ST_F8_E4M3,
    ST_F8_E5M2,
} safetensors_dtype;

const char *safetensors_dtype_name(safetensors_dtype t);
size_t safetensors_dtype_size(safetensors_dtype t);

typedef struct safetensors_tensor {
    const char *name;  /* owned by the file */
    safetensors_dtype dtype;
    int n_dims;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const void *data;  /* into the mapping (or the caller's buffer for safetensors_parse) */
    size_t nbytes;
    const char *file;  /* path of the file that holds it */
} safetensors_tensor;

typedef struct safetensors_file safetensors_file;

/* Maps and validates one file. NULL with err on any problem. */
safetensors_file *safetensors_open(const char *path, char *err, size_t errlen);
/* Validates an in-memory file image (not copied: buf must outlive the result). `name` is used
 * in messages. For tests and fuzzing. */
safetensors_file *safetensors_parse(const void *buf, size_t len, const char *name, char *err,
                                    size_t errlen);
void safetensors_close(safetensors_file *f);
int safetensors_count(const safetensors_file *f);
const safetensors_tensor *safetensors_at(const safetensors_file *f, int i);
const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name);

/* All tensors of a model directory (single file, index + shards, or every *.safetensors). */
typedef struct safetensors_set safetensors_set;
safetensors_set *safetensors_set_open(const char *dir, char *err, size_t errlen);

/* Whether a pipeline stage holding layers [start, end) of n_layers needs the tensor `name`: a
 * layer's tensors ("layers.N.", ".h.N.", "blocks.N."), the embedding for the first stage (and
 * for the last with tied embeddings), the final norm and lm_head for the last; a tensor of no
 * layer and no known role goes with both ends. One rule for the downloader (which files and
 * bytes a stage fetches) and the loader (which files it opens), so what a stage downloaded is
 * always what it opens. */
int safetensors_stage_needs(const char *name, int n_layers, int tie_embeddings, int start, int end);
/* The set a stage needs: with model.safetensors.index.json, only the files holding at least one
 * tensor of layers [start, end) are opened (a node that downloaded only its stage's files lacks
 * the others); without an index, every file. start = end = 0: the whole model. */
safetensors_set *safetensors_set_open_stage(const char *dir, int n_layers, int tie_embeddings,
                                            int start, int end, char *err, size_t errlen);
void safetensors_set_close(safetensors_set *s);
const safetensors_tensor *safetensors_set_find(const safetensors_set *s, const char *name);
/* Total tensor count over all files. */
int safetensors_set_count(const safetensors_set *s);

/* A set whose tensors another reader provides under Hugging Face names (a GGUF file: see
 * gguf_model.h). safetensors_set_open(path) returns one when path is a GGUF model
 * (gguf_model_file); find may build a tensor on first use, so its pointers stay valid until
 * close, which the set calls on safetensors_set_close. */
typedef struct safetensors_provider {
    const safetensors_tensor *(*find)(void *ctx, const char *name);
    int (*count)(void *ctx);
    void (*close)(void *ctx);
    size_t (*built_bytes)(void *ctx); /* may be NULL: see safetensors_set_built_bytes */
    void (*drop_built)(void *ctx);
    void *ctx;
} safetensors_provider;
safetensors_set *safetensors_set_from_provider(const safetensors_provider *p, char *err,
                                               size_t errlen);
/* Bytes the set built in memory for the tensors found so far (a GGUF file's quantized tensors
 * converted to MLX form): 0 for safetensors files, whose tensors are views of the mapping. */
size_t safetensors_set_built_bytes(const safetensors_set *s);
/* Frees those bytes once their copies live elsewhere (model_weights_place's arena): every
 * tensor found before is then invalid; finding it again builds it again. */
void safetensors_set_drop_built(safetensors_set *s);

#endif
