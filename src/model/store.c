/* store — model directories on disk (see store.h). */
#include "model/store.h"
#include "model/gguf.h"
#include "model/ollama.h"

#include "base/error.h"
#include "base/paths.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int part_valid(const char *p, size_t n) {
    if (n == 0 || n > 96) return 0;
    if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
    if (p[0] == '-' || p[0] == '.') return 0; /* no option-looking or hidden names */
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok) return 0;
    }
    /* "--" is the org/name separator on disk; inside a part it would make two ids collide */
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == '-' && p[i + 1] == '-') return 0;
    if (strstr(p, "..") && (size_t)(strstr(p, "..") - p) < n) return 0;
    return 1;
}

/* A quantization tag: 1..64 of [A-Za-z0-9._-], not starting with '.' or '-'. */
static int tag_valid(const char *t) {
    size_t n = strlen(t);
    if (n == 0 || n > 64 || t[0] == '.' || t[0] == '-') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

const char *store_id_tag(const char *id) {
    const char *colon = id ? strchr(id, ':') : NULL;
    return colon ? colon + 1 : NULL;
}

int store_id_repo(const char *id, char *out, size_t n) {
    const char *tag = store_id_tag(id);
    size_t len = tag ? (size_t)(tag - 1 - id) : strlen(id);
    if (len >= n) return -1;
    memcpy(out, id, len);
    out[len] = 0;
    return 0;
}

int store_id_valid(const char *id, char *err, size_t errlen) {
    if (!id || !*id) {
        error_set(err, errlen, "model id is empty");
        return -1;
    }
    const char *tag = store_id_tag(id);
    if (tag) { /* "org/name:TAG": the repository part as any id, the tag after the only ':' */
        char repo[256];
        if (!tag_valid(tag) || (strchr(id, '/') && strchr(id, '/') > tag)) {
            error_set(err, errlen, "a model id's tag (after ':') may only use letters, digits, '.', "
                      "'_' and '-' (at most 64 characters), as in \"org/name:Q4_K_M\"");
            return -1;
        }
        if (store_id_repo(id, repo, sizeof repo) < 0) {
            error_set(err, errlen, "model id is too long");
            return -1;
        }
        return store_id_valid(repo, err, errlen);
    }
    if (id[0] == '/') {
        error_set(err, errlen, "model id must be \"org/name\", not an absolute path");
        return -1;
    }
    const char *slash = strchr(id, '/');
    if (slash && strchr(slash + 1, '/')) {
        error_set(err, errlen, "model id must be \"org/name\" (one '/')");
        return -1;
    }
    size_t n1 = slash ? (size_t)(slash - id) : strlen(id);
    if (!part_valid(id, n1) || (slash && !part_valid(slash + 1, strlen(slash + 1)))) {
        error_set(err, errlen,
                  "model id parts may only use letters, digits, '.', '_' and '-' (no '..', no "
                  "'--', at most 96 characters each)");
        return -1;
    }
    return 0;
}

int store_id_to_dirname(const char *id, char *out, size_t n) {
    if (store_id_valid(id, NULL, 0) < 0) return -1;
    const char *slash = strchr(id, '/');
    int w = slash ? snprintf(out, n, "%.*s--%s", (int)(slash - id), id, slash + 1)
                  : snprintf(out, n, "%s", id);
    return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

int store_relpath_valid(const char *rel) {
    if (!rel || !*rel || rel[0] == '/' || strlen(rel) > 512) return -1;
    const char *p = rel;
    while (*p) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0) return -1;
        if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return -1;
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)p[i];
            if (c < 0x20 || c == 0x7f || c == '\\' || c == ':') return -1;
        }
        if (n >= 8 && !strncmp(p + n - 8, ".partial", 8)) return -1; /* never our temp files */
        p += n;
        if (*p == '/') p++;
        if (e && !*p) return -1; /* trailing slash */
    }
    return 0;
}

int store_init(model_store *s, const char *models_dir, const char *models_path, char *err,
               size_t errlen) {
    memset(s, 0, sizeof *s);
    if (!models_dir || !*models_dir) {
        error_set(err, errlen, "no models dir given");
        return -1;
    }
    if (snprintf(s->models_dir, sizeof s->models_dir, "%s", models_dir) >= (int)sizeof s->models_dir) {
        error_set(err, errlen, "models dir path is too long");
        return -1;
    }
    const char *p = models_path ? models_path : "";
    while (*p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0) {
            if (s->n_search == STORE_MAX_PATHS || n >= STORE_PATH_MAX) {
                error_set(err, errlen, "too many or too long entries in the models path");
                return -1;
            }
            memcpy(s->search[s->n_search], p, n);
            s->search[s->n_search][n] = 0;
            s->n_search++;
        }
        p += n;
        if (*p == ':') p++;
    }
    const char *ollama = getenv("EXO_OLLAMA_MODELS");
    if (!(ollama && !strcmp(ollama, "0")) && ollama_default_root(s->ollama_root, sizeof s->ollama_root))
        s->ollama_root[0] = 0;
    /* Models that ship with exo (the demo model) are found last, read-only. */
    if (s->n_search < STORE_MAX_PATHS &&
        paths_shipped_dir("EXO_BUILTIN_MODELS_DIR", "resources/models", s->search[s->n_search],
                          STORE_PATH_MAX) == 0)
        s->n_search++;
    return 0;
}

int store_write_dir(const model_store *s, const char *id, char *out, size_t n) {
    char name[256];
    if (store_id_to_dirname(id, name, sizeof name) < 0) return -1;
    int w = snprintf(out, n, "%s/%s", s->models_dir, name);
    return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

static int file_size_is(const char *dir, const char *rel, int64_t want) {
    char path[STORE_PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISREG(st.st_mode)) return 0;
    return want < 0 || st.st_size == want;
}

/* Manifest: {"files":[{"path","size",...}]}: complete when every file is there at its size. */
static enum store_state manifest_state(const char *dir, json_t *m) {
    json_t *files = json_object_get(m, "files");
    if (!json_is_array(files) || json_array_size(files) == 0) return STORE_PARTIAL;
    if (file_size_is(dir, STORE_RANGES, -1)) return STORE_PARTIAL; /* a stage's sparse files */
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        const char *rel = json_string_value(json_object_get(f, "path"));
        json_t *size = json_object_get(f, "size");
        if (!rel || store_relpath_valid(rel) < 0 || !json_is_integer(size)) return STORE_PARTIAL;
        if (!file_size_is(dir, rel, json_integer_value(size))) return STORE_PARTIAL;
    }
    return STORE_COMPLETE;
}

/* A directory exo did not download: config.json plus the weights the index names. */
static enum store_state foreign_state(const char *dir) {
    char gguf[STORE_PATH_MAX * 2];
    if (gguf_model_file(dir, gguf, sizeof gguf)) return STORE_COMPLETE; /* one .gguf, no config.json */
    if (!file_size_is(dir, "config.json", -1)) return STORE_ABSENT; /* not a model dir */
    char path[STORE_PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_error_t je;
    json_t *idx = json_load_file(path, 0, &je);
    if (!idx) return file_size_is(dir, "model.safetensors", -1) ? STORE_COMPLETE : STORE_PARTIAL;
    enum store_state st = STORE_COMPLETE;
    json_t *map = json_object_get(idx, "weight_map");
    const char *k;
    json_t *v;
    if (!json_is_object(map)) st = STORE_PARTIAL;
    else
        json_object_foreach(map, k, v) {
            const char *rel = json_string_value(v);
            if (!rel || store_relpath_valid(rel) < 0 || !file_size_is(dir, rel, -1)) {
                st = STORE_PARTIAL;
                break;
            }
        }
    json_decref(idx);
    return st;
}

enum store_state store_dir_state(const char *dir) {
    if (!paths_is_dir(dir)) return STORE_ABSENT;
    char path[STORE_PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/%s", dir, STORE_MANIFEST);
    json_error_t je;
    json_t *m = json_load_file(path, 0, &je);
    if (m) {
        enum store_state st = manifest_state(dir, m);
        json_decref(m);
        return st;
    }
    return foreign_state(dir);
}

/* Whether dir (a path as given) is the same directory as one of the store's. */
static int is_store_dir(const model_store *s, const char *real_dir) {
    for (int i = -1; i < s->n_search; i++) {
        char real[PATH_MAX];
        if (realpath(i < 0 ? s->models_dir : s->search[i], real) && !strcmp(real, real_dir))
            return 1;
    }
    return 0;
}

/* An absolute path -> the id of the model directory it names, when that directory sits directly
 * in one of the store's directories. The last component is kept as written (a model dir may be a
 * symlink placed there); everything above it is resolved, so aliases ("//a", "a/./b", "b/",
 * "b/.") all reach the same id. */
static int path_to_id(const model_store *s, const char *path, char *id, size_t n) {
    char buf[STORE_PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof buf) return -1;
    memcpy(buf, path, len + 1);
    for (;;) { /* drop trailing "/" and "/." */
        if (len > 1 && buf[len - 1] == '/') buf[--len] = 0;
        else if (len > 2 && buf[len - 1] == '.' && buf[len - 2] == '/') buf[len -= 2] = 0;
        else break;
    }
    char *slash = strrchr(buf, '/');
    const char *base = slash + 1;
    if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) return -1;
    *slash = 0;
    char parent[PATH_MAX];
    if (!realpath(buf[0] ? buf : "/", parent) || !is_store_dir(s, parent)) return -1;
    /* "org--name" on disk is "org/name"; a bare "name" is itself. The id must map back to the
     * same directory name, so no two names share an id. */
    const char *sep = strstr(base, "--");
    int w = sep ? snprintf(id, n, "%.*s/%s", (int)(sep - base), base, sep + 2)
                : snprintf(id, n, "%s", base);
    char back[256];
    if (w < 0 || (size_t)w >= n || store_id_to_dirname(id, back, sizeof back) < 0 ||
        strcmp(back, base))
        return -1;
    return 0;
}

int store_canonical_id(const model_store *s, const char *requested, char *id, size_t n,
                       char *err, size_t errlen) {
    if (requested && requested[0] == '/') {
        if (path_to_id(s, requested, id, n) == 0) return 0;
        /* One message whatever the path is, so an answer never tells whether it exists. */
        if (err)
            snprintf(err, errlen,
                     "model '%.200s' not found: a path names a model only when it is a model "
                     "directory directly inside this node's model directories (--models-dir, "
                     "--models-path, the built-in models); name models by id (\"org/name\")",
                     requested);
        return -1;
    }
    if (store_id_valid(requested, err, errlen) < 0) return -1;
    if (strlen(requested) >= n) {
        error_set(err, errlen, "model id is too long");
        return -1;
    }
    snprintf(id, n, "%s", requested);
    return 0;
}

enum store_state store_locate(const model_store *s, const char *id_or_path, char *out, size_t n) {
    if (!id_or_path || !*id_or_path) return STORE_ABSENT;
    char id[256];
    if (id_or_path[0] == '/') {
        if (path_to_id(s, id_or_path, id, sizeof id) < 0) return STORE_ABSENT;
        id_or_path = id;
    }
    char name[256];
    if (store_id_to_dirname(id_or_path, name, sizeof name) < 0) return STORE_ABSENT;
    enum store_state best = STORE_ABSENT;
    for (int i = -1; i < s->n_search; i++) {
        char dir[STORE_PATH_MAX * 2];
        snprintf(dir, sizeof dir, "%s/%s", i < 0 ? s->models_dir : s->search[i], name);
        enum store_state st = store_dir_state(dir);
        if (st > best) {
            best = st;
            snprintf(out, n, "%s", dir);
        }
        if (best == STORE_COMPLETE) break;
    }
    char blob[STORE_PATH_MAX * 2];
    if (best != STORE_COMPLETE && ollama_locate(s->ollama_root, id_or_path, blob, sizeof blob) == 0 &&
        strlen(blob) < n) {
        snprintf(out, n, "%s", blob);
        best = STORE_COMPLETE;
    }
    return best;
}

void store_missing_reason(const model_store *s, const char *id, char *out, size_t n) {
    char name[256];
    snprintf(out, n, "it is not on disk");
    if (store_id_to_dirname(id, name, sizeof name) < 0) return;
    for (int i = -1; i < s->n_search; i++) {
        char dir[STORE_PATH_MAX * 2];
        snprintf(dir, sizeof dir, "%s/%s", i < 0 ? s->models_dir : s->search[i], name);
        if (!paths_is_dir(dir)) continue;
        enum store_state st = store_dir_state(dir);
        if (st == STORE_ABSENT)
            snprintf(out, n, "%.900s has no config.json (nor a single .gguf file), so it is not a model directory", dir);
        else if (st == STORE_PARTIAL)
            snprintf(out, n, "its files in %.900s are incomplete (a download not finished, or a "
                             "weight file missing)", dir);
        return;
    }
}

static uint64_t dir_bytes(const char *dir, int depth) {
    if (depth > 8) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[STORE_PATH_MAX * 2];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) < 0) continue;
        if (S_ISREG(st.st_mode)) total += (uint64_t)st.st_size;
        else if (S_ISDIR(st.st_mode)) total += dir_bytes(path, depth + 1);
    }
    closedir(d);
    return total;
}

uint64_t store_dir_bytes(const char *dir) {
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISREG(st.st_mode)) return (uint64_t)st.st_size;
    return dir_bytes(dir, 0);
}

static int remove_tree(const char *path, int depth) {
    struct stat st;
    if (lstat(path, &st) < 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    if (depth > 16) return -1;
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char child[STORE_PATH_MAX * 2];
        int w = snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        if (w < 0 || (size_t)w >= sizeof child || remove_tree(child, depth + 1) < 0) rc = -1;
    }
    closedir(d);
    if (rmdir(path) < 0) rc = -1;
    return rc;
}

int store_delete(const model_store *s, const char *id, char *err, size_t errlen) {
    char dir[STORE_PATH_MAX * 2];
    if (store_id_valid(id, err, errlen) < 0) return -1;
    if (store_write_dir(s, id, dir, sizeof dir) < 0) {
        error_set(err, errlen, "model path is too long");
        return -1;
    }
    if (remove_tree(dir, 0) < 0) {
        if (err) snprintf(err, errlen, "could not delete %s: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

typedef struct ollama_seen {
    char (*seen)[200];
    int *n_seen;
    store_list_fn fn;
    void *ud;
} ollama_seen;

static void list_ollama(const char *id, const char *blob, void *ud) {
    ollama_seen *o = ud;
    for (int k = 0; k < *o->n_seen; k++)
        if (!strcmp(o->seen[k], id)) return;
    if (*o->n_seen < 512) snprintf(o->seen[(*o->n_seen)++], sizeof o->seen[0], "%s", id);
    o->fn(id, blob, STORE_COMPLETE, o->ud);
}

void store_list(const model_store *s, store_list_fn fn, void *ud) {
    char seen[512][200];
    int n_seen = 0;
    for (int i = -1; i < s->n_search; i++) {
        const char *root = i < 0 ? s->models_dir : s->search[i];
        DIR *d = opendir(root);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            const char *sep = strstr(e->d_name, "--");
            if (e->d_name[0] == '.') continue;
            char id[200];
            int w = sep ? snprintf(id, sizeof id, "%.*s/%s", (int)(sep - e->d_name), e->d_name, sep + 2)
                        : snprintf(id, sizeof id, "%s", e->d_name); /* a bare local name */
            if (w < 0 || (size_t)w >= sizeof id || store_id_valid(id, NULL, 0) < 0) continue;
            int dup = 0;
            for (int k = 0; k < n_seen && !dup; k++) dup = !strcmp(seen[k], id);
            if (dup) continue;
            char dir[STORE_PATH_MAX * 2];
            snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
            enum store_state st = store_dir_state(dir);
            if (st == STORE_ABSENT) continue;
            if (n_seen < 512) snprintf(seen[n_seen++], sizeof seen[0], "%s", id);
            fn(id, dir, st, ud);
        }
        closedir(d);
    }
    ollama_seen seen_ollama = {.seen = seen, .n_seen = &n_seen, .fn = fn, .ud = ud};
    ollama_list(s->ollama_root, list_ollama, &seen_ollama);
}
