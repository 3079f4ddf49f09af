/* name_index — a name -> index hash for readers that keep their entries in an array (open
 * addressing, power-of-two capacity, FNV-1a): the safetensors and GGUF readers' lookups by tensor
 * or key name. It stores only indices; the owner says what entry i is called (name_of), so names
 * are never copied. Names are byte strings of a given length (GGUF's are not NUL-terminated).
 * Refuses: removal, growth past the size given to init (the readers know their count up front). */
#ifndef EXO_MODEL_NAME_INDEX_H
#define EXO_MODEL_NAME_INDEX_H

#include <stddef.h>

typedef struct name_index {
    int *slots; /* -1 empty, else an index into the owner's array */
    size_t cap;
} name_index;

/* The name of entry i of the owner ctx, its length in *len. */
typedef const char *(*name_index_name_fn)(const void *ctx, int i, size_t *len);

/* Room for n entries. Returns 0, or -1 when out of memory. */
int name_index_init(name_index *ix, size_t n);
void name_index_free(name_index *ix);
/* Inserts entry v named name[0..len). Returns -1 after inserting it, or the index of the entry
 * that already has that name (then v is not inserted). */
int name_index_put(name_index *ix, const char *name, size_t len, int v, name_index_name_fn name_of,
                   const void *ctx);
/* The index of the entry named name[0..len), or -1 (also for an index never initialised). */
int name_index_get(const name_index *ix, const char *name, size_t len, name_index_name_fn name_of,
                   const void *ctx);

#endif
