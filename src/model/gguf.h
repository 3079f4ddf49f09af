/* gguf — GGUF files (the format of llama.cpp, Ollama and LM Studio), memory-mapped and validated.
 *
 * A file is: magic "GGUF", version (2 or 3), tensor count, metadata count (u64 each), the
 * metadata key/value pairs (typed: integers, floats, bool, strings, arrays of those), the tensor
 * infos (name, dims, ggml type, offset), padding to `general.alignment` (default 32), then the
 * tensor data. Every byte is untrusted: the whole header is checked before anything is handed
 * out (lengths inside the file, known value and tensor types, dims whose element count is a
 * whole number of the type's blocks, offsets aligned and inside the data region, no two tensors
 * overlapping, no duplicate keys or tensor names). Errors name the file and the key or tensor.
 *
 * Dims are kept as GGUF writes them: ne[0] is the fastest-moving (a row's length), so a
 * [rows][cols] matrix has ne = {cols, rows}. Little-endian files only.
 *
 * This module refuses: version 1 files (32-bit counts), big-endian files, more than
 * GGUF_MAX_DIMS dims, and tensor types whose block layout it does not know (named in the
 * error). Interpreting the metadata (architectures, tokenizers) and the quantized blocks is for
 * gguf_model.c, gguf_quant.c and gguf_tokenizer.c. */
#ifndef EXO_MODEL_GGUF_H
#define EXO_MODEL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef enum gguf_value_type {
    GGUF_U8 = 0,
    GGUF_I8 = 1,
    GGUF_U16 = 2,
    GGUF_I16 = 3,
    GGUF_U32 = 4,
    GGUF_I32 = 5,
    GGUF_F32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_U64 = 10,
    GGUF_I64 = 11,
    GGUF_F64 = 12,
} gguf_value_type;

/* ggml tensor types (the numbers are the file format's). */
typedef enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_BF16 = 30,
} ggml_type;

/* Elements per block and bytes per block of a ggml type; 0 for a type this module does not know. */
int64_t ggml_type_block_elems(uint32_t type);
size_t ggml_type_block_bytes(uint32_t type);
/* "Q4_K", "F16", ... or "type N" (static storage for known types, a shared buffer otherwise). */
const char *ggml_type_name(uint32_t type);
/* A type by its name ("q4_k", "Q8_0", "f16", case-insensitive); -1 if unknown. */
int ggml_type_from_name(const char *name);
/* llama.cpp's name of a file type (general.file_type: 15 -> "Q4_K_M", 32 -> "BF16"); NULL if
 * unknown. And the number of a name (case-insensitive), -1 if unknown. */
const char *gguf_file_type_name(int64_t ftype);
int gguf_file_type_from_name(const char *name);

/* A string inside the mapping (not NUL-terminated). */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    gguf_value_type type;
    /* scalars (type != STRING/ARRAY) */
    union {
        uint64_t u;
        int64_t i;
        double f;
    } num;
    gguf_str str;               /* STRING */
    gguf_value_type elem_type;  /* ARRAY: type of the elements (never ARRAY: nesting refused) */
    uint64_t n_elems;           /* ARRAY */
    const uint8_t *elems;       /* ARRAY of numbers: the packed little-endian values */
    const uint64_t *str_offsets; /* ARRAY of strings: offset of element i's length field */
} gguf_kv;

typedef struct gguf_tensor {
    char *name;                 /* owned, NUL-terminated */
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];  /* ne[0] fastest; dims past n_dims are 1 */
    uint32_t type;              /* ggml_type */
    const void *data;           /* into the mapping */
    size_t nbytes;
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Maps and validates one file. NULL with err on any problem. */
gguf_file *gguf_open(const char *path, char *err, size_t errlen);
/* Validates an in-memory image (not copied: buf must outlive the result). For tests and fuzzing. */
gguf_file *gguf_parse(const void *buf, size_t len, const char *name, char *err, size_t errlen);
void gguf_close(gguf_file *f);

const char *gguf_path(const gguf_file *f);
uint32_t gguf_version(const gguf_file *f);

int gguf_kv_count(const gguf_file *f);
const gguf_kv *gguf_kv_at(const gguf_file *f, int i);
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);

/* Typed getters: 0 on success; -1 when the key is absent or of an incompatible type (err then
 * names the key and what it holds; err may be NULL). Any integer type reads as int64 if it fits;
 * any number reads as double. */
int gguf_get_int(const gguf_file *f, const char *key, int64_t *out, char *err, size_t errlen);
int gguf_get_float(const gguf_file *f, const char *key, double *out, char *err, size_t errlen);
int gguf_get_bool(const gguf_file *f, const char *key, int *out, char *err, size_t errlen);
/* A string value copied into out (NUL-terminated); -1 also when it does not fit. */
int gguf_get_string(const gguf_file *f, const char *key, char *out, size_t n, char *err,
                    size_t errlen);
/* Element i of a string array (pointer into the mapping). */
gguf_str gguf_array_string(const gguf_file *f, const gguf_kv *kv, uint64_t i);
/* Element i of a number array as double / int64 (0 for a wrong index or type). */
double gguf_array_float(const gguf_kv *kv, uint64_t i);
int64_t gguf_array_int(const gguf_kv *kv, uint64_t i);

int gguf_tensor_count(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Is `path` a model given as GGUF: a regular file whose name ends in ".gguf" or that begins with
 * the GGUF magic (Ollama's blobs are named by their hash), or a directory
 * without config.json that holds exactly one "*.gguf" file? Writes the file's path into out and
 * returns 1; 0 otherwise (no error: the caller goes on to its other formats). */
int gguf_model_file(const char *path, char *out, size_t n);

#endif
