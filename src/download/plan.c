/* download plan — what to fetch: the file list (a peer's manifest, else the Hub's tree, with
 * HEAD requests where the listing lacks hashes), the local manifest, which files and which
 * tensors a pipeline stage needs (by layer number in the tensor name), what is already in
 * place, and whether the disk has room. It fetches no file bodies. */
#include "download/download_internal.h"

#include "base/log.h"
#include "base/paths.h"
#include "base/strbuf.h"
#include "model/safetensors.h"
#include "model/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#define RANGE_MERGE_GAP (64u << 10) /* one request for ranges closer than this */

int plan_is_weight_file(const char *p, int safetensors_only) {
    static const char *exts[] = {".safetensors", ".bin",  ".pt", ".pth",  ".h5",
                                 ".msgpack",     ".onnx", ".ot", ".gguf", ".ckpt"};
    size_t n = strlen(p);
    for (size_t i = safetensors_only ? 0 : 0; i < sizeof exts / sizeof exts[0]; i++) {
        size_t m = strlen(exts[i]);
        if (n >= m && !strcmp(p + n - m, exts[i])) return safetensors_only ? i == 0 : 1;
    }
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcasecmp(s + n - m, suffix);
}

/* A .gguf that holds a model (not a vision projector, "mmproj-*.gguf"). */
static int is_model_gguf(const char *path) {
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    return ends_with(path, ".gguf") && strncasecmp(base, "mmproj", 6);
}

/* Does the file name carry `tag` as a word: preceded by the start or one of "-._/" and followed
 * by '.' or '-' ("Q4_K_M" is in "Llama-Q4_K_M.gguf" and "llama.Q4_K_M-00001-of-00002.gguf",
 * "Q4_K" is not in "Llama-Q4_K_M.gguf")? Case-insensitive, as llama.cpp's -hf. */
static int names_tag(const char *path, const char *tag) {
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t n = strlen(tag);
    for (const char *p = base; *p; p++) {
        if (strncasecmp(p, tag, n)) continue;
        int before = p == base || strchr("-._", p[-1]) != NULL;
        int after = p[n] == '.' || p[n] == '-';
        if (before && after) return 1;
    }
    return 0;
}

int plan_is_gguf_choice(const hf_file_list *list, const char *model_id) {
    if (store_id_tag(model_id)) return 1;
    int gguf = 0;
    for (size_t i = 0; i < list->n; i++) {
        if (plan_is_weight_file(list->files[i].path, 1)) return 0;
        gguf |= is_model_gguf(list->files[i].path);
    }
    return gguf;
}

/* "name-00001-of-00003.gguf": one part of a model split over several files. */
static int is_split_part(const char *p) {
    size_t n = strlen(p);
    return n > 20 && !strncmp(p + n - 14, "-of-", 4) && p[n - 20] == '-';
}

/* The model .gguf files, ", "-separated (at most 12): those carrying `tag`, or all when NULL. */
static void list_ggufs(const hf_file_list *list, const char *tag, strbuf *sb) {
    for (size_t i = 0, shown = 0; i < list->n && shown < 12; i++)
        if (is_model_gguf(list->files[i].path) && (!tag || names_tag(list->files[i].path, tag)))
            strbuf_appendf(sb, "%s%s", shown++ ? ", " : "", list->files[i].path);
}

int plan_pick_gguf(const hf_file_list *list, const char *model_id, char *err, size_t errlen) {
    const char *tag = store_id_tag(model_id), *want = tag ? tag : "Q4_K_M";
    char repo[256];
    if (store_id_repo(model_id, repo, sizeof repo) < 0) snprintf(repo, sizeof repo, "the repository");
    int pick = -1, only = -1, matches = 0, n_gguf = 0, split = 0;
    for (size_t i = 0; i < list->n; i++) {
        const char *p = list->files[i].path;
        if (!is_model_gguf(p)) continue;
        if (!n_gguf++) only = (int)i;
        if (!names_tag(p, want)) continue;
        split |= is_split_part(p);
        if (!matches++) pick = (int)i;
    }
    if (!tag && !matches && n_gguf == 1) pick = only, matches = 1; /* the only model file */
    if (matches == 1 && !split) return pick;
    strbuf sb = {0};
    list_ggufs(list, matches ? want : NULL, &sb);
    if (split)
        snprintf(err, errlen, "%s's %s is split into several .gguf files (%s); exo runs single-file "
                 "GGUF models: pick a quantization published as one file", repo, want, sb.data);
    else if (matches > 1)
        snprintf(err, errlen, "%d .gguf files of %s match the tag '%s' (%s); name one quantization "
                 "that only one file carries", matches, repo, want, sb.data);
    else if (n_gguf == 0)
        snprintf(err, errlen, "%s has no .gguf model file, so the tag '%s' names nothing", repo, want);
    else if (tag)
        snprintf(err, errlen, "no .gguf file of %s carries the tag '%s'; it has: %s", repo, tag,
                 sb.data);
    else
        snprintf(err, errlen, "%s holds %d .gguf files and none is Q4_K_M; choose one with "
                 "\"%s:TAG\" (e.g. the Q8_0 of name-Q8_0.gguf); it has: %s", repo, n_gguf,
                 repo, sb.data);
    strbuf_free(&sb);
    return -1;
}

int plan_manifest_write(const engine *e) {
    json_t *files = json_array();
    for (size_t i = 0; i < e->n; i++) {
        const hf_file *f = &e->files[i].f;
        json_t *o = json_pack("{s:s, s:I}", "path", f->path, "size", (json_int_t)f->size);
        if (f->sha256[0]) json_object_set_new(o, "sha256", json_string(f->sha256));
        if (f->git_sha1[0]) json_object_set_new(o, "git_sha1", json_string(f->git_sha1));
        json_array_append_new(files, o);
    }
    json_t *m = json_pack("{s:s, s:s, s:o}", "model_id", e->req->model_id, "revision",
                          e->hf->revision, "files", files);
    char path[2048], tmp[2100];
    snprintf(path, sizeof path, "%s/%s", e->dir, STORE_MANIFEST);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(m, tmp, JSON_INDENT(1)) == 0 && rename(tmp, path) == 0 ? 0 : -1;
    json_decref(m);
    return rc;
}

/* Reads a manifest ({files:[{path,size,sha256?,git_sha1?}]}) into a file list. */
static int manifest_parse(const char *text, size_t len, hf_file_list *out) {
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *m = json_loadb(text, len, 0, &je);
    json_t *files = json_object_get(m, "files");
    if (!json_is_array(files) || json_array_size(files) == 0) {
        json_decref(m);
        return -1;
    }
    out->files = calloc(json_array_size(files), sizeof(hf_file));
    if (!out->files) abort();
    size_t i;
    json_t *it;
    json_array_foreach(files, i, it) {
        const char *p = json_string_value(json_object_get(it, "path"));
        json_t *size = json_object_get(it, "size");
        const char *sha = json_string_value(json_object_get(it, "sha256"));
        const char *sha1 = json_string_value(json_object_get(it, "git_sha1"));
        if (!p || store_relpath_valid(p) < 0 || strlen(p) >= sizeof out->files[0].path ||
            !json_is_integer(size) || json_integer_value(size) < 0) {
            hf_file_list_free(out);
            json_decref(m);
            return -1;
        }
        hf_file *f = &out->files[out->n++];
        snprintf(f->path, sizeof f->path, "%s", p);
        f->size = (uint64_t)json_integer_value(size);
        if (sha && strlen(sha) == 64) memcpy(f->sha256, sha, 65);
        if (sha1 && strlen(sha1) == 40) memcpy(f->git_sha1, sha1, 41);
        f->is_lfs = f->sha256[0] != 0;
    }
    json_decref(m);
    return 0;
}

int plan_read_local_manifest(const char *dir, hf_file_list *out) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, STORE_MANIFEST);
    size_t len;
    char *text = paths_read_file(path, 64 << 20, &len);
    if (!text) return -1;
    int rc = manifest_parse(text, len, out);
    free(text);
    return rc;
}

static int range_cmp(const void *a, const void *b) {
    const download_range *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

int download_shard_ranges(const void *head, size_t head_len, uint64_t file_size, int n_layers,
                          int tie, int start, int end, download_range *out, int max, uint64_t *need,
                          char *err, size_t errlen) {
    const unsigned char *h = head;
    if (max < 1) {
        snprintf(err, errlen, "no room for ranges");
        return -1;
    }
    if (head_len < 8) {
        if (file_size < 8) {
            snprintf(err, errlen, "a safetensors file of %llu bytes is too short",
                     (unsigned long long)file_size);
            return -1;
        }
        *need = 8;
        return -2;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | h[i];
    if (n < 2 || n > SAFETENSORS_MAX_HEADER || n > file_size - 8) {
        snprintf(err, errlen, "safetensors header length %llu does not fit the %llu-byte file",
                 (unsigned long long)n, (unsigned long long)file_size);
        return -1;
    }
    uint64_t data0 = 8 + n;
    if (head_len < data0) {
        *need = data0;
        return -2;
    }
    json_error_t je;
    json_t *hdr = json_loadb((const char *)h + 8, (size_t)n, 0, &je);
    if (!json_is_object(hdr)) {
        snprintf(err, errlen, "safetensors header is not a JSON object (%s)", je.text);
        json_decref(hdr);
        return -1;
    }
    int count = 0;
    out[count++] = (download_range){0, data0};
    const char *name;
    json_t *t;
    json_object_foreach(hdr, name, t) {
        if (!strcmp(name, "__metadata__")) continue;
        json_t *offs = json_object_get(t, "data_offsets");
        json_t *a = json_array_get(offs, 0), *b = json_array_get(offs, 1);
        if (json_array_size(offs) != 2 || !json_is_integer(a) || !json_is_integer(b) ||
            json_integer_value(a) < 0 || json_integer_value(b) < json_integer_value(a) ||
            (uint64_t)json_integer_value(b) > file_size - data0) {
            snprintf(err, errlen, "tensor %.200s has data_offsets outside the file", name);
            json_decref(hdr);
            return -1;
        }
        if (!safetensors_stage_needs(name, n_layers, tie, start, end)) continue;
        download_range r = {data0 + (uint64_t)json_integer_value(a),
                            data0 + (uint64_t)json_integer_value(b)};
        if (r.start == r.end) continue;
        if (count < max)
            out[count++] = r;
        else { /* out of slots: widen the last one (fetches more, never less) */
            if (r.start < out[count - 1].start) out[count - 1].start = r.start;
            if (r.end > out[count - 1].end) out[count - 1].end = r.end;
        }
    }
    json_decref(hdr);
    qsort(out, (size_t)count, sizeof *out, range_cmp);
    int m = 0;
    for (int i = 0; i < count; i++) {
        if (m && out[i].start <= out[m - 1].end + RANGE_MERGE_GAP) {
            if (out[i].end > out[m - 1].end) out[m - 1].end = out[i].end;
        } else
            out[m++] = out[i];
    }
    return m;
}

int download_shard_files(const char *index_json, int n_layers, int tie_embeddings, int start,
                         int end, json_t *out, char *err, size_t errlen) {
    json_error_t je;
    json_t *idx = json_loads(index_json, 0, &je);
    json_t *map = json_object_get(idx, "weight_map");
    if (!json_is_object(map)) {
        snprintf(err, errlen, "model.safetensors.index.json has no weight_map object");
        json_decref(idx);
        return -1;
    }
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        const char *file = json_string_value(v);
        if (!file || store_relpath_valid(file) < 0) {
            snprintf(err, errlen, "weight_map names an unsafe file for %s", name);
            json_decref(idx);
            return -1;
        }
        int need = safetensors_stage_needs(name, n_layers, tie_embeddings, start, end);
        if (!need) continue;
        int dup = 0;
        size_t i;
        json_t *x;
        json_array_foreach(out, i, x) if (!strcmp(json_string_value(x), file)) dup = 1;
        if (!dup) json_array_append_new(out, json_string(file));
    }
    json_decref(idx);
    return 0;
}

static int file_in(json_t *arr, const char *path) {
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) if (!strcmp(json_string_value(x), path)) return 1;
    return 0;
}

/* For a shard: after the non-weight files are in place, mark the weight files it needs. */
int plan_select_shard(engine *e) {
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", e->dir);
    size_t len;
    char *cfg_text = paths_read_file(path, 16 << 20, &len);
    json_error_t je;
    json_t *cfg = cfg_text ? json_loads(cfg_text, 0, &je) : NULL;
    free(cfg_text);
    json_t *nl = json_object_get(cfg, "num_hidden_layers");
    if (!nl) nl = json_object_get(json_object_get(cfg, "text_config"), "num_hidden_layers");
    int n_layers = json_is_integer(nl) ? (int)json_integer_value(nl) : 0;
    int tie = json_is_true(json_object_get(cfg, "tie_word_embeddings"));
    json_decref(cfg);
    if (n_layers <= 0) {
        engine_set_result(e, DOWNLOAD_ERR_BAD_INPUT,
                          "config.json of %s has no num_hidden_layers; cannot pick a shard",
                          e->req->model_id);
        return -1;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", e->dir);
    char *index = paths_read_file(path, 64 << 20, &len);
    int has_index = index != NULL;
    json_t *want = json_array();
    char err[256];
    if (index) {
        if (download_shard_files(index, n_layers, tie, e->req->layer_start, e->req->layer_end, want,
                                 err, sizeof err) < 0) {
            free(index);
            json_decref(want);
            engine_set_result(e, DOWNLOAD_ERR_BAD_INPUT, "%s", err);
            return -1;
        }
    }
    /* files that also hold tensors this stage does not need: only their ranges are fetched */
    json_t *mixed = json_array();
    const char *ranges_env = getenv("EXO_SHARD_RANGES");
    int use_ranges = !(ranges_env && !strcmp(ranges_env, "0"));
    json_t *idx = index ? json_loads(index, 0, &je) : NULL;
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(idx, "weight_map"), name, v) {
        const char *file = json_string_value(v);
        if (file && file_in(want, file) && !file_in(mixed, file) &&
            !safetensors_stage_needs(name, n_layers, tie, e->req->layer_start, e->req->layer_end))
            json_array_append_new(mixed, json_string(file));
    }
    json_decref(idx);
    free(index);
    int whole_model = e->req->layer_start == 0 && e->req->layer_end >= n_layers;
    for (size_t i = 0; i < e->n; i++) {
        plan_file *pf = &e->files[i];
        if (!plan_is_weight_file(pf->f.path, 1)) continue;
        pf->needed = has_index ? file_in(want, pf->f.path) : 1; /* no index: one file holds all */
        pf->ranged =
            use_ranges && pf->needed && (has_index ? file_in(mixed, pf->f.path) : !whole_model);
        pf->range_total = pf->f.size; /* until its header says how much */
        pf->range_done = 0;
    }
    e->n_layers = n_layers;
    e->tie = tie;
    json_decref(mixed);
    json_decref(want);
    return 0;
}

int plan_check_space(engine *e) {
    uint64_t need = 0;
    char path[2048];
    for (size_t i = 0; i < e->n; i++) {
        plan_file *pf = &e->files[i];
        if (!pf->needed || pf->done || pf->ranged) continue; /* ranged files check their own */
        struct stat st;
        engine_partial_path(e, pf, path, sizeof path);
        uint64_t have = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
        need += pf->f.size > have ? pf->f.size - have : 0;
    }
    struct statvfs vfs;
    if (statvfs(e->dir, &vfs) < 0) return 0; /* cannot tell: let ENOSPC catch it */
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    if (avail < need + e->req->min_free_bytes) {
        engine_set_result(
            e, DOWNLOAD_ERR_DISK_FULL,
            "not enough disk space for %s: need %llu bytes, %llu free in %s; free space or "
            "use --models-dir on a larger disk",
            e->req->model_id, (unsigned long long)(need + e->req->min_free_bytes),
            (unsigned long long)avail, e->dir);
        return -1;
    }
    return 0;
}

/* Marks files already in place. With a trusted local manifest a matching size is enough; a
 * sparse file (STORE_RANGES) counts only for a ranged fetch of the same layers. */
void plan_mark_present(engine *e) {
    char path[2048];
    json_t *sparse = engine_sparse_load(e);
    for (size_t i = 0; i < e->n; i++) {
        plan_file *pf = &e->files[i];
        engine_final_path(e, pf, path, sizeof path);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != pf->f.size)
            continue;
        json_t *r = json_object_get(sparse, pf->f.path);
        if (!r) {
            pf->done = 1;
            continue;
        }
        json_t *layers = json_object_get(r, "layers");
        pf->done = pf->ranged &&
                   json_integer_value(json_array_get(layers, 0)) == e->req->layer_start &&
                   json_integer_value(json_array_get(layers, 1)) == e->req->layer_end;
        if (pf->done)
            pf->range_total = pf->range_done =
                (uint64_t)json_integer_value(json_object_get(r, "bytes"));
    }
    json_decref(sparse);
}

enum download_error plan_list_files(engine *e, hf_file_list *list) {
    char err[512] = "";
    for (int i = 0; i < e->req->n_peers; i++) {
        char url[2048];
        snprintf(url, sizeof url, "%s/models/%s/manifest", e->req->peers[i], e->req->model_id);
        char *body;
        size_t len;
        if (http_get_small(url, e->req->peer_token, 64 << 20, &body, &len, err, sizeof err) ==
            DOWNLOAD_OK) {
            int ok = manifest_parse(body, len, list) == 0;
            free(body);
            if (ok) {
                e->peer_base = e->req->peers[i];
                log_info("download %s: using peer %s", e->req->model_id, e->peer_base);
                return DOWNLOAD_OK;
            }
        }
        log_info("download %s: peer %s cannot serve it (%s)", e->req->model_id, e->req->peers[i],
                 err);
    }
    enum download_error de = hf_list_files(e->hf, e->req->model_id, list, err, sizeof err);
    if (de != DOWNLOAD_OK) {
        engine_set_result(e, de, "cannot list the files of %s: %s", e->req->model_id, err);
        return de;
    }
    /* A listing without hashes (some mirrors): ask each file's HEAD for x-linked-etag / etag
     * (and x-linked-size), so every file can still be verified. */
    for (size_t i = 0; i < list->n; i++) {
        hf_file *f = &list->files[i];
        if (f->sha256[0] || f->git_sha1[0] || !strcmp(f->path, ".gitattributes")) continue;
        hf_file_meta meta;
        de = hf_head(e->hf, e->req->model_id, f->path, &meta, err, sizeof err);
        if (de != DOWNLOAD_OK) {
            engine_set_result(e, de, "cannot read the metadata of %s: %s", f->path, err);
            return de;
        }
        size_t n = strlen(meta.etag);
        int hex = n == 64 || n == 40;
        for (size_t k = 0; k < n && hex; k++)
            hex = (meta.etag[k] >= '0' && meta.etag[k] <= '9') ||
                  (meta.etag[k] >= 'a' && meta.etag[k] <= 'f');
        if (hex && n == 64)
            memcpy(f->sha256, meta.etag, 65);
        else if (hex && n == 40)
            memcpy(f->git_sha1, meta.etag, 41);
        if (meta.size) f->size = meta.size;
    }
    return DOWNLOAD_OK;
}
