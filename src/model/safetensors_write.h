/* safetensors_write — builds a safetensors file in memory and writes it out. Used by tests and
 * tools that generate small models. Refuses: files over what fits in memory (it buffers all). */
#ifndef EXO_MODEL_SAFETENSORS_WRITE_H
#define EXO_MODEL_SAFETENSORS_WRITE_H

#include "model/safetensors.h"

typedef struct safetensors_writer safetensors_writer;

safetensors_writer *safetensors_writer_new(void);
/* Copies `data` (nbytes must equal the element count times the dtype size). Returns 0 or -1. */
int safetensors_writer_add(safetensors_writer *w, const char *name, safetensors_dtype dtype,
                           int n_dims, const int64_t *shape, const void *data, size_t nbytes);
/* Writes the file (tensors in insertion order). Returns 0, or -1 with err. */
int safetensors_writer_save(const safetensors_writer *w, const char *path, char *err,
                            size_t errlen);
void safetensors_writer_free(safetensors_writer *w);

#endif
