/* mkmodel writer — deterministic random values, MLX affine quantization, and a streaming
 * safetensors writer (one file, or shards plus model.safetensors.index.json).
 *
 * Every tensor (and every expert of a stacked tensor) draws from its own generator, seeded from
 * --seed and the Hugging Face name of that weight, so the bytes do not depend on layout, on
 * sharding or on the order tensors are written in, and a quantized model is the quantization of
 * exactly the values its dense twin holds.
 *
 * Refuses: holding a model in memory (values are generated in chunks of rows and written with
 * pwrite), and libm functions whose last bit may differ between machines. */
#include "mkmodel.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* No fused multiply-add contraction: the Makefile builds with -std=c17, which implies
 * -ffp-contract=off under gcc; clang honours this pragma. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

uint64_t mk_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double mk_normal(uint64_t *state) {
    uint64_t r = mk_splitmix64(state);
    int64_t s = (int64_t)(r & 0xFFFF) + (int64_t)((r >> 16) & 0xFFFF) + (int64_t)((r >> 32) & 0xFFFF) +
                (int64_t)(r >> 48);
    /* Sum of four uniforms on 0..65535: mean 131070, variance (65536^2-1)/3. sqrt is correctly
     * rounded (IEEE 754), so this constant is the same everywhere. */
    double inv_std = 1.0 / sqrt((65536.0 * 65536.0 - 1.0) / 3.0);
    return (double)(s - 131070) * inv_std;
}

uint64_t mk_hash_name(uint64_t seed, const char *name) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001B3ull;
    uint64_t st = h ^ (seed * 0x9E3779B97F4A7C15ull);
    return mk_splitmix64(&st);
}

uint64_t mk_matrix_seed(const mk_config *cfg, const mk_matrix *m, int64_t expert) {
    char seed_name[256];
    if (m->stack) snprintf(seed_name, sizeof seed_name, m->seed_fmt, (long long)expert);
    else if (m->seed_fmt[0]) snprintf(seed_name, sizeof seed_name, "%s", m->seed_fmt);
    else snprintf(seed_name, sizeof seed_name, "%s%s%s", m->name, m->suffix[0] ? "." : "", m->suffix);
    return mk_hash_name(cfg->seed, seed_name);
}

void mk_matrix_values(const mk_matrix *m, uint64_t *state, float *vals, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double g = mk_normal(state);
        vals[i] = (float)((m->init == MK_INIT_AROUND_ONE ? 1.0 + m->std * g : m->std * g) + m->mean);
    }
}

/* MK_INIT_IDENTITY: rows [first_row, first_row + n_rows) of the identity replace vals. */
static void identity_rows(const mk_matrix *m, int64_t first_row, float *vals, int64_t n_rows) {
    for (int64_t i = 0; i < n_rows * m->in; i++) vals[i] = first_row + i / m->in == i % m->in;
}

static void store_scalar(void *base, int64_t i, dtype dt, float v) {
    if (dt == DTYPE_F32) ((float *)base)[i] = v;
    else if (dt == DTYPE_F16) ((uint16_t *)base)[i] = f32_to_f16(v);
    else ((uint16_t *)base)[i] = f32_to_bf16(v);
}

static float load_scalar(const void *base, int64_t i, dtype dt) {
    if (dt == DTYPE_F32) return ((const float *)base)[i];
    if (dt == DTYPE_F16) return f16_to_f32(((const uint16_t *)base)[i]);
    return bf16_to_f32(((const uint16_t *)base)[i]);
}

void mk_quantize_row(const float *w, int64_t n, int bits, int group_size, dtype dt, uint32_t *packed, void *scales,
                     void *biases) {
    const uint32_t qmax = (1u << bits) - 1;
    memset(packed, 0, (size_t)(n * bits / 32) * sizeof(uint32_t));
    for (int64_t g = 0; g < n / group_size; g++) {
        const float *x = w + g * group_size;
        float mn = x[0], mx = x[0];
        for (int i = 1; i < group_size; i++) {
            if (x[i] < mn) mn = x[i];
            if (x[i] > mx) mx = x[i];
        }
        /* As MLX: scale = (max - min) / (2^bits - 1), bias = min; values are rounded against the
         * stored (narrowed) scale and bias, so dequantization is as close as it can be. */
        store_scalar(scales, g, dt, (mx - mn) / (float)qmax);
        store_scalar(biases, g, dt, mn);
        float s = load_scalar(scales, g, dt), b = load_scalar(biases, g, dt);
        for (int i = 0; i < group_size; i++) {
            float qf = s > 0 ? floorf((x[i] - b) / s + 0.5f) : 0.0f;
            uint32_t q = qf <= 0 ? 0 : qf >= (float)qmax ? qmax : (uint32_t)qf;
            uint64_t bit = (uint64_t)(g * group_size + i) * (uint64_t)bits;
            uint64_t word = bit / 32, shift = bit % 32;
            packed[word] |= q << shift;
            if (shift + (uint64_t)bits > 32) packed[word + 1] |= q >> (32 - shift);
        }
    }
}

/* The E2M1 magnitudes an FP4 nibble's low three bits select (bit 3 is the sign). */
static const float FP4_MAGNITUDES[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

void mk_quantize_row_mxfp4(const float *w, int64_t n, uint8_t *blocks, uint8_t *scales) {
    memset(blocks, 0, (size_t)(n / 2));
    for (int64_t g = 0; g < n / 32; g++) {
        const float *x = w + g * 32;
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        /* the smallest power of two that brings the group inside [-6, 6]: frexp is exact, so the
         * exponent is the same on every machine */
        int e = -127;
        if (amax > 0) {
            int k;
            double m = frexp((double)amax / 6.0, &k);
            e = m == 0.5 ? k - 1 : k;
            if (e < -127) e = -127;
            if (e > 127) e = 127;
        }
        scales[g] = (uint8_t)(e + 127);
        for (int i = 0; i < 32; i++) {
            float v = (float)ldexp((double)x[i], -e), a = fabsf(v);
            int best = 0;
            for (int q = 1; q < 8; q++) /* nearest magnitude; ties go to the smaller one */
                if (fabsf(a - FP4_MAGNITUDES[q]) < fabsf(a - FP4_MAGNITUDES[best])) best = q;
            uint8_t nib = (uint8_t)(best | (v < 0 && best ? 8 : 0));
            int64_t idx = g * 32 + i;
            blocks[idx / 2] |= (uint8_t)(idx % 2 ? nib << 4 : nib);
        }
    }
}

/* A tensor as stored: name, dtype, shape, which file and where. */
typedef struct phys_tensor {
    char name[200];
    const char *dtype_name; /* "BF16", "F16", "F32", "U32", "U8" */
    int ndim;
    int64_t shape[4];
    uint64_t nbytes;
    int shard;
    uint64_t offset; /* within the shard's data section */
    const mk_matrix *m;
    int part; /* 0 weight (dense or packed; MXFP4 blocks), 1 scales, 2 biases */
} phys_tensor;

static const char *st_dtype(dtype dt) {
    return dt == DTYPE_F32 ? "F32" : dt == DTYPE_F16 ? "F16" : "BF16";
}

static int stored_parts(const mk_matrix *m) { return m->bits ? 3 : m->mxfp4 ? 2 : 1; }

static void phys_name(phys_tensor *t, const mk_matrix *m, int part) {
    static const char *mlx_parts[3] = {NULL, "scales", "biases"};
    static const char *mxfp4_parts[2] = {"blocks", "scales"};
    if (m->mxfp4) snprintf(t->name, sizeof t->name, "%s_%s", m->name, mxfp4_parts[part]);
    else if (part == 0 && !m->suffix[0]) snprintf(t->name, sizeof t->name, "%s", m->name);
    else snprintf(t->name, sizeof t->name, "%s.%s", m->name, part == 0 ? m->suffix : mlx_parts[part]);
}

/* MXFP4: blocks U8 [stack, out, in/32, 16], scales U8 [stack, out, in/32]. */
static void mxfp4_shape(phys_tensor *t, const mk_matrix *m) {
    t->dtype_name = "U8";
    t->ndim = t->part == 0 ? 4 : 3;
    t->shape[0] = m->stack, t->shape[1] = m->out, t->shape[2] = m->in / 32, t->shape[3] = 16;
    t->nbytes = (uint64_t)m->stack * (uint64_t)m->out * (uint64_t)(m->in / 32) * (t->part == 0 ? 16u : 1u);
}

static size_t build_phys(const mk_config *cfg, const mk_plan *plan, phys_tensor *out) {
    size_t n = 0;
    for (size_t i = 0; i < plan->n; i++) {
        const mk_matrix *m = &plan->items[i];
        int parts = stored_parts(m);
        for (int p = 0; p < parts; p++) {
            phys_tensor *t = &out[n++];
            memset(t, 0, sizeof *t);
            phys_name(t, m, p);
            t->m = m;
            t->part = p;
            if (m->mxfp4) {
                mxfp4_shape(t, m);
                continue;
            }
            int64_t cols = m->in;
            uint64_t esize = dtype_size(cfg->dt);
            t->dtype_name = st_dtype(cfg->dt);
            if (p == 0 && m->bits) {
                cols = m->in * m->bits / 32;
                esize = 4;
                t->dtype_name = "U32";
            } else if (p > 0) {
                cols = m->in / m->group_size;
            }
            if (m->vector) {
                t->ndim = 1;
                t->shape[0] = cols;
            } else if (m->stack) {
                t->ndim = 3;
                t->shape[0] = m->stack, t->shape[1] = m->transposed ? cols : m->out;
                t->shape[2] = m->transposed ? m->out : cols;
            } else {
                t->ndim = 2;
                t->shape[0] = m->out, t->shape[1] = cols;
            }
            t->nbytes = esize * (uint64_t)cols * (uint64_t)m->out * (uint64_t)(m->stack ? m->stack : 1);
        }
    }
    return n;
}

static int cmp_phys_name(const void *a, const void *b) {
    const phys_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return 0;
}

typedef struct shard_file {
    int fd;
    uint64_t data_start; /* 8 + header length */
    uint64_t size;       /* data bytes */
    char name[64];
} shard_file;

/* Writes the header of one shard (tensors sorted by name get consecutive offsets). */
static int write_header(shard_file *sf, phys_tensor **ts, size_t n, int quantized) {
    json_t *root = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string(quantized ? "mlx" : "pt"));
    json_object_set_new(root, "__metadata__", meta);
    for (size_t i = 0; i < n; i++) {
        phys_tensor *t = ts[i];
        json_t *o = json_object(), *shape = json_array(), *offs = json_array();
        json_object_set_new(o, "dtype", json_string(t->dtype_name));
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(o, "shape", shape);
        json_array_append_new(offs, json_integer((json_int_t)t->offset));
        json_array_append_new(offs, json_integer((json_int_t)(t->offset + t->nbytes)));
        json_object_set_new(o, "data_offsets", offs);
        json_object_set_new(root, t->name, o);
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return -1;
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    char *buf = malloc(8 + padded);
    if (!buf) {
        free(text);
        return -1;
    }
    uint64_t hl = padded;
    for (int i = 0; i < 8; i++) buf[i] = (char)((hl >> (8 * i)) & 0xFF);
    memcpy(buf + 8, text, len);
    memset(buf + 8 + len, ' ', padded - len);
    free(text);
    int rc = pwrite_all(sf->fd, buf, 8 + padded, 0);
    free(buf);
    sf->data_start = 8 + padded;
    return rc;
}

static int write_mxfp4_rows(const mk_matrix *m, const float *vals, int64_t nr, int64_t row0, phys_tensor *parts[3],
                            shard_file *shards, uint8_t *blocks, uint8_t *scales) {
    int64_t bcols = m->in / 2, scols = m->in / 32;
    for (int64_t r = 0; r < nr; r++) mk_quantize_row_mxfp4(vals + r * m->in, m->in, blocks + r * bcols, scales + r * scols);
    uint64_t rb[2] = {(uint64_t)bcols, (uint64_t)scols};
    uint8_t *bufs[2] = {blocks, scales};
    for (int p = 0; p < 2; p++) {
        phys_tensor *t = parts[p];
        if (pwrite_all(shards[t->shard].fd, bufs[p], (size_t)((uint64_t)nr * rb[p]),
                       shards[t->shard].data_start + t->offset + (uint64_t)row0 * rb[p]) != 0)
            return -1;
    }
    return 0;
}

/* Generates one logical matrix chunk by chunk and writes its one or three stored tensors. */
static int write_matrix(const mk_config *cfg, const mk_matrix *m, phys_tensor *parts[3], shard_file *shards) {
    int64_t stack = m->stack ? m->stack : 1;
    int64_t rows_per_chunk = (int64_t)((4u << 20) / ((uint64_t)m->in * 4));
    if (rows_per_chunk < 1) rows_per_chunk = 1;
    /* a transposed matrix is written whole (one expert at a time) */
    if (rows_per_chunk > m->out || m->transposed) rows_per_chunk = m->out;
    size_t esize = dtype_size(cfg->dt);
    float *vals = malloc((size_t)(rows_per_chunk * m->in) * sizeof(float));
    size_t out_bytes = (size_t)(rows_per_chunk * m->in) * 4;
    char *b0 = malloc(out_bytes), *b1 = malloc(out_bytes), *b2 = malloc(out_bytes);
    int rc = (vals && b0 && b1 && b2) ? 0 : -1;
    for (int64_t e = 0; e < stack && rc == 0; e++) {
        uint64_t st = mk_matrix_seed(cfg, m, e);
        for (int64_t r0 = 0; r0 < m->out && rc == 0; r0 += rows_per_chunk) {
            int64_t nr = m->out - r0 < rows_per_chunk ? m->out - r0 : rows_per_chunk;
            mk_matrix_values(m, &st, vals, nr * m->in);
            if (m->init == MK_INIT_IDENTITY) identity_rows(m, r0, vals, nr);
            int64_t row0 = e * m->out + r0; /* row index within the (stacked) tensor */
            if (m->mxfp4) {
                rc = write_mxfp4_rows(m, vals, nr, row0, parts, shards, (uint8_t *)b0, (uint8_t *)b1);
                continue;
            }
            if (m->transposed) {
                for (int64_t r = 0; r < nr; r++)
                    for (int64_t i = 0; i < m->in; i++) store_scalar(b0, i * m->out + r, cfg->dt, vals[r * m->in + i]);
            } else if (!m->bits) {
                for (int64_t i = 0; i < nr * m->in; i++) store_scalar(b0, i, cfg->dt, vals[i]);
            }
            if (m->transposed || !m->bits) {
                phys_tensor *t = parts[0];
                rc = pwrite_all(shards[t->shard].fd, b0, (size_t)(nr * m->in) * esize,
                                shards[t->shard].data_start + t->offset + (uint64_t)row0 * (uint64_t)m->in * esize);
                continue;
            }
            int64_t wcols = m->in * m->bits / 32, gcols = m->in / m->group_size;
            for (int64_t r = 0; r < nr; r++)
                mk_quantize_row(vals + r * m->in, m->in, m->bits, m->group_size, cfg->dt,
                                (uint32_t *)b0 + r * wcols, b1 + (size_t)(r * gcols) * esize,
                                b2 + (size_t)(r * gcols) * esize);
            uint64_t rb[3] = {(uint64_t)wcols * 4, (uint64_t)gcols * esize, (uint64_t)gcols * esize};
            char *bufs[3] = {b0, b1, b2};
            for (int p = 0; p < 3 && rc == 0; p++) {
                phys_tensor *t = parts[p];
                rc = pwrite_all(shards[t->shard].fd, bufs[p], (size_t)((uint64_t)nr * rb[p]),
                                shards[t->shard].data_start + t->offset + (uint64_t)row0 * rb[p]);
            }
        }
    }
    free(vals), free(b0), free(b1), free(b2);
    return rc;
}

static int write_index(const char *dir, phys_tensor *phys, size_t n, shard_file *shards, uint64_t total) {
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    json_object_set_new(root, "metadata", meta);
    phys_tensor **sorted = malloc(n * sizeof *sorted);
    if (!sorted) return -1;
    for (size_t i = 0; i < n; i++) sorted[i] = &phys[i];
    qsort(sorted, n, sizeof *sorted, cmp_phys_name);
    for (size_t i = 0; i < n; i++) json_object_set_new(map, sorted[i]->name, json_string(shards[sorted[i]->shard].name));
    free(sorted);
    json_object_set_new(root, "weight_map", map);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return rc;
}

int mk_write_safetensors(const mk_config *cfg, const mk_plan *plan, const char *dir, uint64_t shard_bytes,
                         char *err, size_t errlen) {
    phys_tensor *phys = calloc(plan->n * 3 + 1, sizeof *phys);
    phys_tensor **order = calloc(plan->n * 3 + 1, sizeof *order);
    if (!phys || !order) {
        free(phys), free(order);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t n = build_phys(cfg, plan, phys);
    /* Assign shards in plan order, then offsets in name order within each shard. */
    int nshards = 1;
    uint64_t cur = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        if (shard_bytes && cur > 0 && cur + phys[i].nbytes > shard_bytes) nshards++, cur = 0;
        phys[i].shard = nshards - 1;
        cur += phys[i].nbytes;
        total += phys[i].nbytes;
    }
    shard_file *shards = calloc((size_t)nshards, sizeof *shards);
    int rc = shards ? 0 : -1;
    for (int s = 0; s < nshards && rc == 0; s++) {
        if (shard_bytes) snprintf(shards[s].name, sizeof shards[s].name, "model-%05d-of-%05d.safetensors", s + 1, nshards);
        else snprintf(shards[s].name, sizeof shards[s].name, "model.safetensors");
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, shards[s].name);
        shards[s].fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (shards[s].fd < 0) {
            snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
            rc = -1;
            nshards = s;
            break;
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (phys[i].shard == s) order[k++] = &phys[i];
        qsort(order, k, sizeof *order, cmp_phys_name);
        uint64_t off = 0;
        for (size_t i = 0; i < k; i++) order[i]->offset = off, off += order[i]->nbytes;
        shards[s].size = off;
        if (write_header(&shards[s], order, k, cfg->quant_bits != 0) != 0) {
            snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
            rc = -1;
        }
    }
    for (size_t i = 0; i < n && rc == 0;) {
        const mk_matrix *m = phys[i].m;
        phys_tensor *parts[3] = {&phys[i], NULL, NULL};
        int nparts = stored_parts(m);
        for (int p = 1; p < nparts; p++) parts[p] = &phys[i + (size_t)p];
        if (write_matrix(cfg, m, parts, shards) != 0) {
            snprintf(err, errlen, "cannot write %s in %s: %s", phys[i].name, dir, strerror(errno));
            rc = -1;
        }
        i += (size_t)nparts;
    }
    for (int s = 0; s < nshards; s++) {
        if (rc == 0 && ftruncate(shards[s].fd, (off_t)(shards[s].data_start + shards[s].size)) != 0) {
            snprintf(err, errlen, "cannot write %s: %s", shards[s].name, strerror(errno));
            rc = -1;
        }
        if (close(shards[s].fd) != 0 && rc == 0) {
            snprintf(err, errlen, "cannot write %s: %s", shards[s].name, strerror(errno));
            rc = -1;
        }
    }
    if (rc == 0 && shard_bytes && write_index(dir, phys, n, shards, total) != 0) {
        snprintf(err, errlen, "cannot write %s/model.safetensors.index.json", dir);
        rc = -1;
    }
    free(shards), free(phys), free(order);
    return rc;
}
