/* safetensors reader: mmap, full header validation, name lookup. See safetensors.h. */
#include "model/safetensors.h"

#include "base/error.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/name_index.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name;
    size_t size;
} dtype_table[] = {
    [ST_F64] = {"F64", 8},  [ST_F32] = {"F32", 4},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I64] = {"I64", 8},  [ST_I32] = {"I32", 4},
    [ST_I16] = {"I16", 2},  [ST_I8] = {"I8", 1},     [ST_U64] = {"U64", 8},
    [ST_U32] = {"U32", 4},  [ST_U16] = {"U16", 2},   [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};
#define N_DTYPES ((int)(sizeof dtype_table / sizeof dtype_table[0]))

const char *safetensors_dtype_name(safetensors_dtype t) {
    return (unsigned)t < (unsigned)N_DTYPES ? dtype_table[t].name : "?";
}

size_t safetensors_dtype_size(safetensors_dtype t) {
    return (unsigned)t < (unsigned)N_DTYPES ? dtype_table[t].size : 0;
}

/* ---- one file ---- */

struct safetensors_file {
    char *path;
    void *map; /* NULL for safetensors_parse */
    size_t map_len;
    safetensors_tensor *tensors;
    char **names;
    int n;
    name_index index;
};

static const char *file_tensor_name(const void *ctx, int i, size_t *len) {
    const char *name = ((const safetensors_file *)ctx)->tensors[i].name;
    *len = strlen(name);
    return name;
}

static int parse_dtype(const char *s) {
    for (int i = 0; i < N_DTYPES; i++)
        if (!strcmp(dtype_table[i].name, s)) return i;
    return -1;
}

/* JSON integer that is a non-negative exact int64. */
static int json_uint(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -1;
    *out = (uint64_t)x;
    return 0;
}

static int cmp_by_offset(const void *a, const void *b) {
    const safetensors_tensor *x = *(const safetensors_tensor *const *)a;
    const safetensors_tensor *y = *(const safetensors_tensor *const *)b;
    uintptr_t pa = (uintptr_t)x->data, pb = (uintptr_t)y->data;
    if (pa != pb) return pa < pb ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Parses one header entry into t. Returns 0 or -1 with err. */
static int parse_entry(const char *fname, const char *key, json_t *val, const uint8_t *data,
                       uint64_t data_len, safetensors_tensor *t, char *err, size_t errlen) {
    if (!json_is_object(val)) {
        error_set(err, errlen, "%s: tensor '%s': header entry is not an object", fname, key);
        return -1;
    }
    json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
           *jo = json_object_get(val, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo)) {
        error_set(err, errlen, "%s: tensor '%s': needs string dtype, array shape and data_offsets",
                  fname, key);
        return -1;
    }
    int dt = parse_dtype(json_string_value(jd));
    if (dt < 0) {
        error_set(err, errlen, "%s: tensor '%s': unknown dtype '%.20s'", fname, key,
                  json_string_value(jd));
        return -1;
    }
    t->dtype = (safetensors_dtype)dt;
    size_t nd = json_array_size(js);
    if (nd > SAFETENSORS_MAX_DIMS) {
        error_set(err, errlen, "%s: tensor '%s': %zu dims (at most %d)", fname, key, nd,
                  SAFETENSORS_MAX_DIMS);
        return -1;
    }
    t->n_dims = (int)nd;
    uint64_t count = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (json_uint(json_array_get(js, i), &d) != 0 || d > (1ull << 40)) {
            error_set(err, errlen, "%s: tensor '%s': bad shape dimension %zu", fname, key, i);
            return -1;
        }
        t->shape[i] = (int64_t)d;
        if (d && count > UINT64_MAX / 16 / d) {
            error_set(err, errlen, "%s: tensor '%s': shape overflows", fname, key);
            return -1;
        }
        count *= d;
    }
    uint64_t begin, end;
    if (json_array_size(jo) != 2 || json_uint(json_array_get(jo, 0), &begin) != 0 ||
        json_uint(json_array_get(jo, 1), &end) != 0 || begin > end) {
        error_set(err, errlen, "%s: tensor '%s': data_offsets must be [begin, end], begin <= end",
                  fname, key);
        return -1;
    }
    if (end > data_len) {
        error_set(err, errlen,
                  "%s: tensor '%s': data ends at byte %llu but the file's data region has %llu "
                  "(truncated file?)",
                  fname, key, (unsigned long long)end, (unsigned long long)data_len);
        return -1;
    }
    uint64_t want = count * dtype_table[dt].size;
    if (end - begin != want) {
        error_set(err, errlen, "%s: tensor '%s': %llu bytes for %llu %s elements (want %llu)",
                  fname, key, (unsigned long long)(end - begin), (unsigned long long)count,
                  dtype_table[dt].name, (unsigned long long)want);
        return -1;
    }
    t->data = data + begin;
    t->nbytes = (size_t)want;
    return 0;
}

static int parse_header(safetensors_file *f, const uint8_t *buf, size_t len, char *err,
                        size_t errlen) {
    const char *fname = f->path;
    if (len < 8) {
        error_set(err, errlen, "%s: too short for a safetensors file (%zu bytes)", fname, len);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > SAFETENSORS_MAX_HEADER || hlen > len - 8) {
        error_set(err, errlen, "%s: header length %llu does not fit the file (%zu bytes)", fname,
                  (unsigned long long)hlen, len);
        return -1;
    }
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen,
                              JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        error_set(err, errlen, "%s: header is not valid JSON: %s (byte %d)", fname, jerr.text,
                  jerr.position);
        return -1;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        error_set(err, errlen, "%s: header is not a JSON object", fname);
        return -1;
    }
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->names = calloc(n ? n : 1, sizeof *f->names);
    if (!f->tensors || !f->names || name_index_init(&f->index, n) != 0) {
        json_decref(root);
        error_set(err, errlen, "%s: out of memory", fname);
        return -1;
    }
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(val)) {
                error_set(err, errlen, "%s: __metadata__ is not an object", fname);
                rc = -1;
                break;
            }
            continue;
        }
        safetensors_tensor *t = &f->tensors[f->n];
        if (parse_entry(fname, key, val, data, data_len, t, err, errlen) != 0) {
            rc = -1;
            break;
        }
        f->names[f->n] = strdup(key);
        if (!f->names[f->n]) {
            error_set(err, errlen, "%s: out of memory", fname);
            rc = -1;
            break;
        }
        t->name = f->names[f->n];
        t->file = f->path;
        name_index_put(&f->index, t->name, strlen(t->name), f->n, file_tensor_name, f); /* keys are unique */
        f->n++;
    }
    json_decref(root);
    if (rc != 0) return -1;
    /* No two tensors may share bytes. Empty tensors take no space and never overlap. */
    const safetensors_tensor **order = malloc((size_t)(f->n ? f->n : 1) * sizeof *order);
    if (!order) {
        error_set(err, errlen, "%s: out of memory", fname);
        return -1;
    }
    for (int i = 0; i < f->n; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n, sizeof *order, cmp_by_offset);
    const safetensors_tensor *prev = NULL;
    for (int i = 0; i < f->n; i++) {
        const safetensors_tensor *t = order[i];
        if (!t->nbytes) continue;
        if (prev && (const uint8_t *)prev->data + prev->nbytes > (const uint8_t *)t->data) {
            error_set(err, errlen, "%s: tensors '%s' and '%s' overlap", fname, prev->name, t->name);
            rc = -1;
            break;
        }
        prev = t;
    }
    free(order);
    return rc;
}

safetensors_file *safetensors_parse(const void *buf, size_t len, const char *name, char *err,
                                    size_t errlen) {
    safetensors_file *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->path = strdup(name ? name : "(memory)");
    if (!f->path || parse_header(f, buf, len, err, errlen) != 0) {
        safetensors_close(f);
        return NULL;
    }
    return f;
}

safetensors_file *safetensors_open(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        error_set(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        error_set(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    void *map = len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : NULL;
    close(fd);
    if (len && map == MAP_FAILED) {
        error_set(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        return NULL;
    }
    safetensors_file *f = calloc(1, sizeof *f);
    if (!f) {
        if (map) munmap(map, len);
        return NULL;
    }
    f->path = strdup(path);
    f->map = map;
    f->map_len = len;
    if (!f->path || parse_header(f, map, len, err, errlen) != 0) {
        safetensors_close(f);
        return NULL;
    }
    return f;
}

void safetensors_close(safetensors_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    for (int i = 0; i < f->n; i++) free(f->names[i]);
    free(f->names);
    free(f->tensors);
    free(f->index.slots);
    free(f->path);
    free(f);
}

int safetensors_count(const safetensors_file *f) {
    return f->n;
}

const safetensors_tensor *safetensors_at(const safetensors_file *f, int i) {
    return i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name) {
    int i = name_index_get(&f->index, name, strlen(name), file_tensor_name, f);
    return i < 0 ? NULL : &f->tensors[i];
}

/* ---- a model directory ---- */

struct safetensors_set {
    safetensors_file **files;
    int n_files;
    const safetensors_tensor **all;
    int n_all;
    name_index index;
    safetensors_provider provider; /* find != NULL: tensors come from it (GGUF) */
};

static const char *set_tensor_name(const void *ctx, int i, size_t *len) {
    const char *name = ((const safetensors_set *)ctx)->all[i]->name;
    *len = strlen(name);
    return name;
}

static int add_file(safetensors_set *s, const char *dir, const char *name, char *err,
                    size_t errlen) {
    if (!name[0] || strchr(name, '/') || !strcmp(name, "..") || !strcmp(name, ".")) {
        error_set(err, errlen, "%s: index names an unsafe file '%.100s'", dir, name);
        return -1;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
        error_set(err, errlen, "%s: path too long", dir);
        return -1;
    }
    for (int i = 0; i < s->n_files; i++)
        if (!strcmp(s->files[i]->path, path)) return 0;
    safetensors_file *f = safetensors_open(path, err, errlen);
    if (!f) return -1;
    safetensors_file **nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *nf);
    if (!nf) {
        safetensors_close(f);
        error_set(err, errlen, "out of memory");
        return -1;
    }
    s->files = nf;
    s->files[s->n_files++] = f;
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Every *.safetensors file of dir, in name order. */
static int add_all_files(safetensors_set *s, const char *dir, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) {
        error_set(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    int n = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors")) {
            char **nn = realloc(names, (size_t)(n + 1) * sizeof *nn);
            if (!nn) break;
            names = nn;
            names[n++] = strdup(e->d_name);
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n && rc == 0; i++) rc = names[i] ? add_file(s, dir, names[i], err, errlen) : -1;
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc == 0 && s->n_files == 0) {
        error_set(err, errlen, "%s: no .safetensors files", dir);
        rc = -1;
    }
    return rc;
}

/* Which tensors a stage needs (safetensors_set_open_stage); whole = every tensor. */
typedef struct stage_filter {
    int whole;
    int n_layers, tie, start, end;
} stage_filter;

static int stage_wants(const stage_filter *f, const char *name) {
    return f->whole || safetensors_stage_needs(name, f->n_layers, f->tie, f->start, f->end);
}

/* The layer number follows "layers." / ".h." / "blocks." in a tensor name; -1 for none. */
static long tensor_layer(const char *name) {
    static const char *keys[] = {"layers.", ".h.", "blocks."};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *p = strstr(name, keys[k]);
        if (p && (p == name || p[-1] == '.' || keys[k][0] == '.')) {
            p += strlen(keys[k]);
            char *endp;
            long l = strtol(p, &endp, 10);
            if (endp != p && *endp == '.') return l;
        }
    }
    return -1;
}

int safetensors_stage_needs(const char *name, int n_layers, int tie, int start, int end) {
    int first = start == 0, last = end >= n_layers;
    long layer = tensor_layer(name);
    if (layer >= 0) return layer >= start && layer < end;
    if (strstr(name, "embed")) return first || (last && tie);
    if (strstr(name, "lm_head") || strstr(name, "norm")) return last;
    return first || last; /* unknown extras: keep them with the ends */
}

/* The files of the index holding a tensor the stage wants (every listed file for the whole
 * model). The index must name a file for every tensor, but the check that each tensor really is
 * in its file covers the opened files only: the others may not be on this node. */
static int add_indexed_files(safetensors_set *s, const char *dir, const char *index_path,
                             const stage_filter *filter, json_t **map_out, char *err,
                             size_t errlen) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        error_set(err, errlen, "%s: not valid JSON: %s (line %d)", index_path, jerr.text,
                  jerr.line);
        return -1;
    }
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        json_decref(root);
        error_set(err, errlen, "%s: no weight_map object", index_path);
        return -1;
    }
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        if (!json_is_string(val)) {
            error_set(err, errlen, "%s: weight_map['%s'] is not a file name", index_path, key);
            json_decref(root);
            return -1;
        }
        if (stage_wants(filter, key) && add_file(s, dir, json_string_value(val), err, errlen)) {
            json_decref(root);
            return -1;
        }
    }
    *map_out = root;
    return 0;
}

safetensors_set *safetensors_set_from_provider(const safetensors_provider *p, char *err,
                                               size_t errlen) {
    safetensors_set *s = calloc(1, sizeof *s);
    if (!s) {
        if (p->close) p->close(p->ctx);
        error_set(err, errlen, "out of memory");
        return NULL;
    }
    s->provider = *p;
    return s;
}

static int set_holds_file(const safetensors_set *s, const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (int i = 0; i < s->n_files; i++)
        if (!strcmp(s->files[i]->path, path)) return 1;
    return 0;
}

static safetensors_set *set_open(const char *dir, const stage_filter *filter, char *err,
                                 size_t errlen) {
    char gguf_path[4096];
    /* a GGUF model converts only the tensors a stage looks up: no filter needed */
    if (gguf_model_file(dir, gguf_path, sizeof gguf_path))
        return gguf_tensor_set_open(gguf_path, err, errlen);
    safetensors_set *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    char index_path[4096];
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    json_t *index_root = NULL;
    int rc;
    if (access(index_path, F_OK) == 0)
        rc = add_indexed_files(s, dir, index_path, filter, &index_root, err, errlen);
    else
        rc = add_all_files(s, dir, err, errlen);
    if (rc != 0) goto fail;
    for (int i = 0; i < s->n_files; i++) s->n_all += s->files[i]->n;
    s->all = malloc((size_t)(s->n_all ? s->n_all : 1) * sizeof *s->all);
    if (!s->all || name_index_init(&s->index, (size_t)s->n_all) != 0) {
        error_set(err, errlen, "out of memory");
        goto fail;
    }
    int k = 0;
    for (int i = 0; i < s->n_files; i++) {
        for (int j = 0; j < s->files[i]->n; j++) {
            s->all[k] = &s->files[i]->tensors[j];
            if (name_index_put(&s->index, s->all[k]->name, strlen(s->all[k]->name), k, set_tensor_name,
                               s) >= 0) {
                error_set(err, errlen, "%s: tensor '%s' appears in two files", dir,
                          s->all[k]->name);
                goto fail;
            }
            k++;
        }
    }
    if (index_root) { /* every indexed tensor of an opened file must be where the index says */
        const char *key;
        json_t *val;
        json_object_foreach(json_object_get(index_root, "weight_map"), key, val) {
            if (!set_holds_file(s, dir, json_string_value(val))) continue;
            const safetensors_tensor *t = safetensors_set_find(s, key);
            const char *fname = strrchr(t ? t->file : "", '/');
            if (!t || strcmp(fname ? fname + 1 : "", json_string_value(val))) {
                error_set(err, errlen, "%s: index lists tensor '%s' in %s but it is not there", dir,
                          key, json_string_value(val));
                goto fail;
            }
        }
        json_decref(index_root);
    }
    return s;
fail:
    json_decref(index_root);
    safetensors_set_close(s);
    return NULL;
}

safetensors_set *safetensors_set_open(const char *dir, char *err, size_t errlen) {
    static const stage_filter whole = {.whole = 1};
    return set_open(dir, &whole, err, errlen);
}

safetensors_set *safetensors_set_open_stage(const char *dir, int n_layers, int tie, int start,
                                            int end, char *err, size_t errlen) {
    stage_filter f = {.whole = (start == 0 && end == 0) || (start <= 0 && end >= n_layers),
                      .n_layers = n_layers,
                      .tie = tie,
                      .start = start,
                      .end = end};
    return set_open(dir, &f, err, errlen);
}

void safetensors_set_close(safetensors_set *s) {
    if (!s) return;
    if (s->provider.close) s->provider.close(s->provider.ctx);
    for (int i = 0; i < s->n_files; i++) safetensors_close(s->files[i]);
    free(s->files);
    free(s->all);
    free(s->index.slots);
    free(s);
}

size_t safetensors_set_built_bytes(const safetensors_set *s) {
    return s->provider.built_bytes ? s->provider.built_bytes(s->provider.ctx) : 0;
}

void safetensors_set_drop_built(safetensors_set *s) {
    if (s->provider.drop_built) s->provider.drop_built(s->provider.ctx);
}

const safetensors_tensor *safetensors_set_find(const safetensors_set *s, const char *name) {
    if (s->provider.find) return s->provider.find(s->provider.ctx, name);
    int i = name_index_get(&s->index, name, strlen(name), set_tensor_name, s);
    return i < 0 ? NULL : s->all[i];
}

int safetensors_set_count(const safetensors_set *s) {
    if (s->provider.count) return s->provider.count(s->provider.ctx);
    return s->n_all;
}
