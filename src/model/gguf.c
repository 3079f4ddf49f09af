/* GGUF reader: mmap, full header validation, lookups by key and tensor name. See gguf.h. */
#include "model/gguf.h"

#include "base/error.h"
#include "model/name_index.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Limits that keep a hostile header from asking for absurd allocations before the bounds checks
 * catch it (each entry also needs bytes in the file, so these only bound the bookkeeping). */
#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_NAME 256

static const struct {
    const char *name;
    int64_t block_elems;
    size_t block_bytes;
} type_table[] = {
    [GGML_TYPE_F32] = {"F32", 1, 4},      [GGML_TYPE_F16] = {"F16", 1, 2},
    [GGML_TYPE_Q4_0] = {"Q4_0", 32, 18},  [GGML_TYPE_Q4_1] = {"Q4_1", 32, 20},
    [GGML_TYPE_Q5_0] = {"Q5_0", 32, 22},  [GGML_TYPE_Q5_1] = {"Q5_1", 32, 24},
    [GGML_TYPE_Q8_0] = {"Q8_0", 32, 34},  [GGML_TYPE_Q8_1] = {"Q8_1", 32, 36},
    [GGML_TYPE_Q2_K] = {"Q2_K", 256, 84}, [GGML_TYPE_Q3_K] = {"Q3_K", 256, 110},
    [GGML_TYPE_Q4_K] = {"Q4_K", 256, 144}, [GGML_TYPE_Q5_K] = {"Q5_K", 256, 176},
    [GGML_TYPE_Q6_K] = {"Q6_K", 256, 210}, [GGML_TYPE_Q8_K] = {"Q8_K", 256, 292},
    [GGML_TYPE_I8] = {"I8", 1, 1},        [GGML_TYPE_I16] = {"I16", 1, 2},
    [GGML_TYPE_I32] = {"I32", 1, 4},      [GGML_TYPE_I64] = {"I64", 1, 8},
    [GGML_TYPE_F64] = {"F64", 1, 8},      [GGML_TYPE_BF16] = {"BF16", 1, 2},
};
#define N_TYPES (sizeof type_table / sizeof type_table[0])

int64_t ggml_type_block_elems(uint32_t t) { return t < N_TYPES ? type_table[t].block_elems : 0; }
size_t ggml_type_block_bytes(uint32_t t) { return t < N_TYPES ? type_table[t].block_bytes : 0; }

const char *ggml_type_name(uint32_t t) {
    static _Thread_local char buf[24];
    if (t < N_TYPES && type_table[t].name) return type_table[t].name;
    snprintf(buf, sizeof buf, "type %u", t);
    return buf;
}

int ggml_type_from_name(const char *name) {
    for (size_t t = 0; t < N_TYPES; t++)
        if (type_table[t].name && !strcasecmp(type_table[t].name, name)) return (int)t;
    return -1;
}

/* llama.cpp's file types (general.file_type, its llama_ftype): what `llama-quantize` names a file. */
static const char *const file_type_names[] = {
    [0] = "F32",     [1] = "F16",     [2] = "Q4_0",    [3] = "Q4_1",    [7] = "Q8_0",
    [8] = "Q5_0",    [9] = "Q5_1",    [10] = "Q2_K",   [11] = "Q3_K_S", [12] = "Q3_K_M",
    [13] = "Q3_K_L", [14] = "Q4_K_S", [15] = "Q4_K_M", [16] = "Q5_K_S", [17] = "Q5_K_M",
    [18] = "Q6_K",   [19] = "IQ2_XXS", [20] = "IQ2_XS", [21] = "Q2_K_S", [22] = "IQ3_XS",
    [23] = "IQ3_XXS", [24] = "IQ1_S", [25] = "IQ4_NL", [26] = "IQ3_S",  [27] = "IQ3_M",
    [28] = "IQ2_S",  [29] = "IQ2_M",  [30] = "IQ4_XS", [31] = "IQ1_M",  [32] = "BF16",
};

const char *gguf_file_type_name(int64_t ftype) {
    ftype &= ~(int64_t)1024; /* LLAMA_FTYPE_GUESSED: the same type, guessed by llama.cpp */
    if (ftype < 0 || ftype >= (int64_t)(sizeof file_type_names / sizeof *file_type_names)) return NULL;
    return file_type_names[ftype];
}

int gguf_file_type_from_name(const char *name) {
    for (size_t i = 0; i < sizeof file_type_names / sizeof *file_type_names; i++)
        if (file_type_names[i] && !strcasecmp(file_type_names[i], name)) return (int)i;
    return -1;
}

/* Size of one scalar of a value type; 0 for STRING/ARRAY or an unknown type. */
static size_t value_size(uint32_t t) {
    switch (t) {
    case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
    case GGUF_U16: case GGUF_I16: return 2;
    case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
    case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
    default: return 0;
    }
}

static const char *value_type_name(uint32_t t) {
    static const char *names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                  "string", "array", "u64", "i64", "f64"};
    return t < sizeof names / sizeof *names ? names[t] : "unknown";
}

struct gguf_file {
    char *path;
    const uint8_t *map;
    size_t map_len;
    int mapped;
    uint32_t version;
    gguf_kv *kv;
    int n_kv;
    gguf_tensor *tensors;
    int n_tensors;
    name_index kv_index, tensor_index;
    uint64_t **str_offsets; /* owned arrays behind gguf_kv.str_offsets */
    int n_str_offsets;
};

static const char *key_of(const void *ctx, int i, size_t *len) {
    const gguf_kv *kv = &((const gguf_file *)ctx)->kv[i];
    *len = (size_t)kv->key.len;
    return kv->key.ptr;
}

static const char *tensor_name_of(const void *ctx, int i, size_t *len) {
    const char *name = ((const gguf_file *)ctx)->tensors[i].name;
    *len = strlen(name);
    return name;
}

/* ---- the cursor over the untrusted bytes ---- */

typedef struct cursor {
    const uint8_t *p;
    size_t len, off;
    const char *file;
    char *err;
    size_t errlen;
} cursor;

static int need(cursor *c, size_t n, const char *what) {
    if (n <= c->len - c->off) return 0;
    error_set(c->err, c->errlen, "%s: truncated GGUF file (%s at byte %zu needs %zu bytes, %zu left)",
              c->file, what, c->off, n, c->len - c->off);
    return -1;
}

static int read_u32(cursor *c, uint32_t *v, const char *what) {
    if (need(c, 4, what)) return -1;
    memcpy(v, c->p + c->off, 4);
    c->off += 4;
    return 0;
}

static int read_u64(cursor *c, uint64_t *v, const char *what) {
    if (need(c, 8, what)) return -1;
    memcpy(v, c->p + c->off, 8);
    c->off += 8;
    return 0;
}

static int read_str(cursor *c, gguf_str *s, const char *what) {
    uint64_t n;
    if (read_u64(c, &n, what) || need(c, n, what)) return -1;
    s->ptr = (const char *)c->p + c->off;
    s->len = n;
    c->off += n;
    return 0;
}

static int read_value(gguf_file *f, cursor *c, gguf_kv *kv) {
    int klen = kv->key.len > 200 ? 200 : (int)kv->key.len;
    size_t vs = value_size(kv->type);
    if (vs) {
        if (need(c, vs, "a metadata value")) return -1;
        uint64_t u = 0;
        memcpy(&u, c->p + c->off, vs); /* little-endian: the low bytes */
        c->off += vs;
        switch (kv->type) {
        case GGUF_I8: kv->num.i = (int8_t)u; break;
        case GGUF_I16: kv->num.i = (int16_t)u; break;
        case GGUF_I32: kv->num.i = (int32_t)u; break;
        case GGUF_I64: kv->num.i = (int64_t)u; break;
        case GGUF_F32: { float x; memcpy(&x, &u, 4); kv->num.f = x; break; }
        case GGUF_F64: { double x; memcpy(&x, &u, 8); kv->num.f = x; break; }
        case GGUF_BOOL:
            if (u > 1) {
                error_set(c->err, c->errlen, "%s: metadata '%.*s' is a bool holding %llu", c->file,
                          klen, kv->key.ptr, (unsigned long long)u);
                return -1;
            }
            kv->num.u = u;
            break;
        default: kv->num.u = u; break;
        }
        return 0;
    }
    if (kv->type == GGUF_STRING) return read_str(c, &kv->str, "a metadata string");
    if (kv->type != GGUF_ARRAY) {
        error_set(c->err, c->errlen, "%s: metadata '%.*s' has unknown value type %u", c->file, klen,
                  kv->key.ptr, (unsigned)kv->type);
        return -1;
    }
    uint32_t et;
    if (read_u32(c, &et, "an array type") || read_u64(c, &kv->n_elems, "an array length")) return -1;
    kv->elem_type = (gguf_value_type)et;
    if (et == GGUF_ARRAY || (et != GGUF_STRING && !value_size(et))) {
        error_set(c->err, c->errlen, "%s: metadata '%.*s' is an array of %s, which GGUF does not allow",
                  c->file, klen, kv->key.ptr, et == GGUF_ARRAY ? "arrays" : "an unknown type");
        return -1;
    }
    if (et != GGUF_STRING) {
        if (kv->n_elems > (c->len - c->off) / value_size(et)) return need(c, SIZE_MAX, "an array");
        kv->elems = c->p + c->off;
        c->off += kv->n_elems * value_size(et);
        return 0;
    }
    /* each string needs at least its 8-byte length: bounds the offsets array by the file size */
    if (kv->n_elems > (c->len - c->off) / 8) return need(c, SIZE_MAX, "a string array");
    uint64_t *offs = malloc((kv->n_elems ? kv->n_elems : 1) * sizeof *offs);
    if (!offs) {
        error_set(c->err, c->errlen, "%s: out of memory", c->file);
        return -1;
    }
    f->str_offsets[f->n_str_offsets++] = offs;
    kv->str_offsets = offs;
    for (uint64_t i = 0; i < kv->n_elems; i++) {
        gguf_str s;
        offs[i] = c->off;
        if (read_str(c, &s, "an array string")) return -1;
    }
    return 0;
}

static int parse_kvs(gguf_file *f, cursor *c, uint64_t n_kv) {
    f->kv = calloc(n_kv ? n_kv : 1, sizeof *f->kv);
    f->str_offsets = calloc(n_kv ? n_kv : 1, sizeof *f->str_offsets);
    if (!f->kv || !f->str_offsets || name_index_init(&f->kv_index, n_kv)) {
        error_set(c->err, c->errlen, "%s: out of memory", c->file);
        return -1;
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        uint32_t t;
        if (read_str(c, &kv->key, "a metadata key") || read_u32(c, &t, "a metadata type")) return -1;
        kv->type = (gguf_value_type)t;
        if (read_value(f, c, kv)) return -1;
        f->n_kv = (int)i + 1;
        if (name_index_put(&f->kv_index, kv->key.ptr, (size_t)kv->key.len, (int)i, key_of, f) >= 0) {
            error_set(c->err, c->errlen, "%s: metadata key '%.*s' appears twice", c->file,
                      kv->key.len > 200 ? 200 : (int)kv->key.len, kv->key.ptr);
            return -1;
        }
    }
    return 0;
}

static int parse_tensor_info(gguf_file *f, cursor *c, gguf_tensor *t, uint64_t *offset) {
    gguf_str name;
    uint32_t nd, type;
    if (read_str(c, &name, "a tensor name")) return -1;
    if (name.len == 0 || name.len > GGUF_MAX_NAME || memchr(name.ptr, 0, name.len)) {
        error_set(c->err, c->errlen, "%s: a tensor name is empty, longer than %d bytes or holds NUL",
                  c->file, GGUF_MAX_NAME);
        return -1;
    }
    t->name = strndup(name.ptr, name.len);
    if (!t->name) {
        error_set(c->err, c->errlen, "%s: out of memory", c->file);
        return -1;
    }
    f->n_tensors++;
    if (read_u32(c, &nd, "tensor dims")) return -1;
    if (nd < 1 || nd > GGUF_MAX_DIMS) {
        error_set(c->err, c->errlen, "%s: tensor '%s' has %u dims (1 to %d allowed)", c->file,
                  t->name, nd, GGUF_MAX_DIMS);
        return -1;
    }
    t->n_dims = (int)nd;
    uint64_t elems = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t ne;
        if (read_u64(c, &ne, "a tensor dim")) return -1;
        if (ne == 0 || ne > ((uint64_t)1 << 40) || elems > (((uint64_t)1 << 48) / ne)) {
            error_set(c->err, c->errlen, "%s: tensor '%s' dim %u is %llu: empty or too large", c->file,
                      t->name, d, (unsigned long long)ne);
            return -1;
        }
        t->ne[d] = (int64_t)ne;
        elems *= ne;
    }
    if (read_u32(c, &type, "a tensor type") || read_u64(c, offset, "a tensor offset")) return -1;
    t->type = type;
    int64_t be = ggml_type_block_elems(type);
    if (be == 0) {
        error_set(c->err, c->errlen, "%s: tensor '%s' has ggml type %u, which exo does not know",
                  c->file, t->name, type);
        return -1;
    }
    if (t->ne[0] % be) {
        error_set(c->err, c->errlen, "%s: tensor '%s' (%s) has rows of %lld values, not a multiple "
                  "of its block of %lld", c->file, t->name, ggml_type_name(type),
                  (long long)t->ne[0], (long long)be);
        return -1;
    }
    t->nbytes = (size_t)(elems / (uint64_t)be) * ggml_type_block_bytes(type);
    return 0;
}

typedef struct span {
    uint64_t off, end;
    int i;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int parse_tensors(gguf_file *f, cursor *c, uint64_t n) {
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    uint64_t *offsets = calloc(n ? n : 1, sizeof *offsets);
    span *spans = calloc(n ? n : 1, sizeof *spans);
    int rc = -1;
    if (!f->tensors || !offsets || !spans || name_index_init(&f->tensor_index, n)) {
        error_set(c->err, c->errlen, "%s: out of memory", c->file);
        goto done;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (parse_tensor_info(f, c, &f->tensors[i], &offsets[i])) goto done;
        const char *nm = f->tensors[i].name;
        if (name_index_put(&f->tensor_index, nm, strlen(nm), (int)i, tensor_name_of, f) >= 0) {
            error_set(c->err, c->errlen, "%s: tensor '%s' appears twice", c->file, nm);
            goto done;
        }
    }
    uint64_t align = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *a = gguf_find_kv(f, "general.alignment");
    if (a) {
        /* at least 8: F32/F16 tensors are read in place, so their data must be aligned for it */
        if (a->type != GGUF_U32 || a->num.u < 8 || (a->num.u & (a->num.u - 1)) || a->num.u > 65536) {
            error_set(c->err, c->errlen, "%s: general.alignment must be a u32 power of two from 8 "
                      "to 65536", c->file);
            goto done;
        }
        align = a->num.u;
    }
    uint64_t data_start = (c->off + align - 1) / align * align;
    if (data_start > c->len) {
        if (n == 0) { rc = 0; goto done; } /* metadata-only file: no data region needed */
        error_set(c->err, c->errlen, "%s: truncated GGUF file (no data region)", c->file);
        goto done;
    }
    uint64_t data_len = c->len - data_start;
    for (uint64_t i = 0; i < n; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (offsets[i] % align || offsets[i] > data_len || t->nbytes > data_len - offsets[i]) {
            error_set(c->err, c->errlen, "%s: tensor '%s' at offset %llu (%zu bytes) is %s", c->file,
                      t->name, (unsigned long long)offsets[i], t->nbytes,
                      offsets[i] % align ? "not aligned" : "past the end of the file");
            goto done;
        }
        t->data = c->p + data_start + offsets[i];
        spans[i] = (span){offsets[i], offsets[i] + t->nbytes, (int)i};
    }
    qsort(spans, n, sizeof *spans, cmp_span);
    for (uint64_t i = 1; i < n; i++)
        if (spans[i].off < spans[i - 1].end) {
            error_set(c->err, c->errlen, "%s: tensors '%s' and '%s' overlap", c->file,
                      f->tensors[spans[i - 1].i].name, f->tensors[spans[i].i].name);
            goto done;
        }
    rc = 0;
done:
    free(offsets);
    free(spans);
    return rc;
}

static int parse_all(gguf_file *f, char *err, size_t errlen) {
    cursor c = {.p = f->map, .len = f->map_len, .file = f->path, .err = err, .errlen = errlen};
    uint32_t magic;
    uint64_t n_tensors, n_kv;
    if (read_u32(&c, &magic, "the magic")) return -1;
    if (memcmp(&magic, "GGUF", 4)) {
        if (!memcmp(&magic, "FUGG", 4))
            error_set(err, errlen, "%s: a big-endian GGUF file; exo reads little-endian ones", f->path);
        else
            error_set(err, errlen, "%s: not a GGUF file (no 'GGUF' magic)", f->path);
        return -1;
    }
    if (read_u32(&c, &f->version, "the version")) return -1;
    if (f->version != 2 && f->version != 3) {
        error_set(err, errlen, "%s: GGUF version %u; exo reads versions 2 and 3", f->path, f->version);
        return -1;
    }
    if (read_u64(&c, &n_tensors, "the tensor count") || read_u64(&c, &n_kv, "the metadata count"))
        return -1;
    if (n_tensors > GGUF_MAX_TENSORS || n_kv > GGUF_MAX_KV) {
        error_set(err, errlen, "%s: %llu tensors and %llu metadata keys: too many", f->path,
                  (unsigned long long)n_tensors, (unsigned long long)n_kv);
        return -1;
    }
    if (parse_kvs(f, &c, n_kv)) return -1;
    return parse_tensors(f, &c, n_tensors);
}

static gguf_file *finish(gguf_file *f, char *err, size_t errlen) {
    if (parse_all(f, err, errlen) == 0) return f;
    gguf_close(f);
    return NULL;
}

gguf_file *gguf_parse(const void *buf, size_t len, const char *name, char *err, size_t errlen) {
    gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name ? name : "<memory>"))) {
        free(f);
        error_set(err, errlen, "out of memory");
        return NULL;
    }
    f->map = buf;
    f->map_len = len;
    return finish(f, err, errlen);
}

gguf_file *gguf_open(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        error_set(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode) || sb.st_size < 24) {
        error_set(err, errlen, "%s: not a GGUF file (too small or not a regular file)", path);
        close(fd);
        return NULL;
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        error_set(err, errlen, "%s: mmap: %s", path, strerror(errno));
        return NULL;
    }
    gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        munmap(m, (size_t)sb.st_size);
        error_set(err, errlen, "out of memory");
        return NULL;
    }
    f->map = m;
    f->map_len = (size_t)sb.st_size;
    f->mapped = 1;
    return finish(f, err, errlen);
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->n_str_offsets; i++) free(f->str_offsets[i]);
    free(f->str_offsets);
    free(f->tensors);
    free(f->kv);
    name_index_free(&f->kv_index);
    name_index_free(&f->tensor_index);
    if (f->mapped) munmap((void *)f->map, f->map_len);
    free(f->path);
    free(f);
}

const char *gguf_path(const gguf_file *f) { return f->path; }
uint32_t gguf_version(const gguf_file *f) { return f->version; }
int gguf_kv_count(const gguf_file *f) { return f->n_kv; }
const gguf_kv *gguf_kv_at(const gguf_file *f, int i) { return i >= 0 && i < f->n_kv ? &f->kv[i] : NULL; }
int gguf_tensor_count(const gguf_file *f) { return f->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    int i = name_index_get(&f->kv_index, key, strlen(key), key_of, f);
    return i < 0 ? NULL : &f->kv[i];
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    int i = name_index_get(&f->tensor_index, name, strlen(name), tensor_name_of, f);
    return i < 0 ? NULL : &f->tensors[i];
}

/* ---- typed getters ---- */

static const gguf_kv *want(const gguf_file *f, const char *key, char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) error_set(err, errlen, "%s: metadata '%s' is missing", f->path, key);
    return kv;
}

static int wrong_type(const gguf_file *f, const gguf_kv *kv, const char *key, const char *wanted,
                      char *err, size_t errlen) {
    error_set(err, errlen, "%s: metadata '%s' is a %s, expected %s", f->path, key,
              value_type_name(kv->type), wanted);
    return -1;
}

int gguf_get_int(const gguf_file *f, const char *key, int64_t *out, char *err, size_t errlen) {
    const gguf_kv *kv = want(f, key, err, errlen);
    if (!kv) return -1;
    switch (kv->type) {
    case GGUF_U8: case GGUF_U16: case GGUF_U32: *out = (int64_t)kv->num.u; return 0;
    case GGUF_U64:
        if (kv->num.u > INT64_MAX) break;
        *out = (int64_t)kv->num.u;
        return 0;
    case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64: *out = kv->num.i; return 0;
    default: break;
    }
    return wrong_type(f, kv, key, "an integer", err, errlen);
}

int gguf_get_float(const gguf_file *f, const char *key, double *out, char *err, size_t errlen) {
    const gguf_kv *kv = want(f, key, err, errlen);
    if (!kv) return -1;
    if (kv->type == GGUF_F32 || kv->type == GGUF_F64) {
        *out = kv->num.f;
        return 0;
    }
    int64_t i;
    if (gguf_get_int(f, key, &i, NULL, 0) == 0) {
        *out = (double)i;
        return 0;
    }
    return wrong_type(f, kv, key, "a number", err, errlen);
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out, char *err, size_t errlen) {
    const gguf_kv *kv = want(f, key, err, errlen);
    if (!kv) return -1;
    if (kv->type != GGUF_BOOL) return wrong_type(f, kv, key, "a bool", err, errlen);
    *out = (int)kv->num.u;
    return 0;
}

int gguf_get_string(const gguf_file *f, const char *key, char *out, size_t n, char *err,
                    size_t errlen) {
    const gguf_kv *kv = want(f, key, err, errlen);
    if (!kv) return -1;
    if (kv->type != GGUF_STRING) return wrong_type(f, kv, key, "a string", err, errlen);
    if (kv->str.len >= n) {
        error_set(err, errlen, "%s: metadata '%s' is longer than %zu bytes", f->path, key, n - 1);
        return -1;
    }
    memcpy(out, kv->str.ptr, kv->str.len);
    out[kv->str.len] = 0;
    return 0;
}

gguf_str gguf_array_string(const gguf_file *f, const gguf_kv *kv, uint64_t i) {
    gguf_str s = {"", 0};
    if (kv->type != GGUF_ARRAY || kv->elem_type != GGUF_STRING || i >= kv->n_elems) return s;
    uint64_t off = kv->str_offsets[i], len; /* validated at parse time */
    memcpy(&len, f->map + off, 8);
    s.ptr = (const char *)f->map + off + 8;
    s.len = len;
    return s;
}

static int array_elem(const gguf_kv *kv, uint64_t i, uint64_t *raw) {
    size_t vs = value_size(kv->elem_type);
    if (kv->type != GGUF_ARRAY || !vs || i >= kv->n_elems) return -1;
    *raw = 0;
    memcpy(raw, kv->elems + i * vs, vs);
    return 0;
}

int64_t gguf_array_int(const gguf_kv *kv, uint64_t i) {
    uint64_t u;
    if (array_elem(kv, i, &u)) return 0;
    switch (kv->elem_type) {
    case GGUF_I8: return (int8_t)u;
    case GGUF_I16: return (int16_t)u;
    case GGUF_I32: return (int32_t)u;
    case GGUF_F32: return (int64_t)gguf_array_float(kv, i);
    case GGUF_F64: return (int64_t)gguf_array_float(kv, i);
    default: return (int64_t)u;
    }
}

double gguf_array_float(const gguf_kv *kv, uint64_t i) {
    uint64_t u;
    if (array_elem(kv, i, &u)) return 0;
    if (kv->elem_type == GGUF_F32) {
        float x;
        memcpy(&x, &u, 4);
        return x;
    }
    if (kv->elem_type == GGUF_F64) {
        double x;
        memcpy(&x, &u, 8);
        return x;
    }
    return (double)gguf_array_int(kv, i);
}

/* ---- is this path a GGUF model? ---- */

static int ends_with_gguf(const char *name) {
    size_t l = strlen(name);
    return l > 5 && !strcasecmp(name + l - 5, ".gguf");
}

/* Does the file begin with the GGUF magic (a blob named by its hash, as Ollama stores them)? */
static int starts_with_magic(const char *path) {
    char magic[4];
    FILE *f = fopen(path, "rb");
    int yes = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f) fclose(f);
    return yes;
}

int gguf_model_file(const char *path, char *out, size_t n) {
    struct stat sb;
    if (!path || stat(path, &sb)) return 0;
    if (S_ISREG(sb.st_mode)) {
        if (!ends_with_gguf(path) && !starts_with_magic(path)) return 0;
        return (size_t)snprintf(out, n, "%s", path) < n;
    }
    if (!S_ISDIR(sb.st_mode)) return 0;
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/config.json", path);
    if (access(probe, F_OK) == 0) return 0; /* a Hugging Face directory (its GGUF is a side file) */
    DIR *d = opendir(path);
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !ends_with_gguf(e->d_name)) continue;
        if (++found == 1 && (size_t)snprintf(out, n, "%s/%s", path, e->d_name) >= n) found = 2;
    }
    closedir(d);
    return found == 1;
}
