/* ollama — Ollama's pulled models (see ollama.h). */
#include "model/ollama.h"

#include "base/paths.h"
#include "model/store.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MANIFEST_MAX (1u << 20)
#define MODEL_LAYER "application/vnd.ollama.image.model"
#define OLLAMA_REGISTRY "registry.ollama.ai"

int ollama_default_root(char *out, size_t n) {
    const char *env = getenv("OLLAMA_MODELS"), *home = getenv("HOME");
    int w;
    if (env && env[0])
        w = snprintf(out, n, "%s", env);
    else if (home && home[0])
        w = snprintf(out, n, "%s/.ollama/models", home);
    else
        return -1;
    return w > 0 && (size_t)w < n && paths_is_dir(out) ? 0 : -1;
}

/* The blob a manifest file names for its model layer, when it is there at the listed size. */
static int manifest_blob(const char *root, const char *manifest, char *blob, size_t n) {
    struct stat st;
    if (stat(manifest, &st) || !S_ISREG(st.st_mode) || st.st_size > MANIFEST_MAX) return -1;
    json_error_t je;
    json_t *m = json_load_file(manifest, 0, &je);
    json_t *layer;
    size_t i;
    int rc = -1;
    json_array_foreach(json_object_get(m, "layers"), i, layer) {
        const char *type = json_string_value(json_object_get(layer, "mediaType"));
        const char *digest = json_string_value(json_object_get(layer, "digest"));
        json_t *size = json_object_get(layer, "size");
        if (!type || strcmp(type, MODEL_LAYER) || !digest || strncmp(digest, "sha256:", 7) ||
            strlen(digest) != 7 + 64 || strspn(digest + 7, "0123456789abcdef") != 64)
            continue;
        int w = snprintf(blob, n, "%s/blobs/sha256-%s", root, digest + 7);
        if (w > 0 && (size_t)w < n && stat(blob, &st) == 0 && S_ISREG(st.st_mode) &&
            (!json_is_integer(size) || json_integer_value(size) == (json_int_t)st.st_size))
            rc = 0;
        break;
    }
    json_decref(m);
    return rc;
}

int ollama_locate(const char *root, const char *id, char *blob, size_t n) {
    if (!root || !root[0] || store_id_valid(id, NULL, 0) < 0) return -1;
    char repo[256], manifest[4096];
    const char *tag = store_id_tag(id);
    if (store_id_repo(id, repo, sizeof repo) < 0) return -1;
    const char *slash = strchr(repo, '/');
    /* a bare name is Ollama's own library; org/name its user namespaces, then Hugging Face's */
    const char *places[3][2] = {
        {OLLAMA_REGISTRY, slash ? "" : "library/"}, {"hf.co", ""}, {"huggingface.co", ""}};
    for (int i = 0; i < (slash ? 3 : 1); i++) {
        int w = snprintf(manifest, sizeof manifest, "%s/manifests/%s/%s%s/%s", root, places[i][0],
                         places[i][1], repo, tag ? tag : "latest");
        if (w > 0 && (size_t)w < sizeof manifest && manifest_blob(root, manifest, blob, n) == 0)
            return 0;
    }
    return -1;
}

typedef void (*entry_fn)(const char *dir, const char *name, void *ud);

/* Calls fn for each entry of dir that is not hidden. */
static void each_entry(const char *dir, entry_fn fn, void *ud) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') fn(dir, e->d_name, ud);
    closedir(d);
}

typedef struct walk {
    const char *root;
    ollama_list_fn fn;
    void *ud;
    const char *host, *ns, *model; /* the path so far */
    int depth;                     /* 0: in a host (namespaces), 1: in a namespace, 2: in a model */
} walk;

static void on_tag(const char *dir, const char *tag, walk *w) {
    char id[512], manifest[4096], blob[4096];
    int ollama_library = !strcmp(w->host, OLLAMA_REGISTRY) && !strcmp(w->ns, "library");
    int wi = ollama_library ? snprintf(id, sizeof id, "%s:%s", w->model, tag)
                            : snprintf(id, sizeof id, "%s/%s:%s", w->ns, w->model, tag);
    int wm = snprintf(manifest, sizeof manifest, "%s/%s", dir, tag);
    if (wi > 0 && (size_t)wi < sizeof id && wm > 0 && (size_t)wm < sizeof manifest &&
        store_id_valid(id, NULL, 0) == 0 &&
        manifest_blob(w->root, manifest, blob, sizeof blob) == 0)
        w->fn(id, blob, w->ud);
}

/* manifests/<host>/<namespace>/<model>/<tag>: descends one level per call. */
static void on_entry(const char *dir, const char *name, void *ud) {
    walk *w = ud;
    if (w->depth == 2) {
        on_tag(dir, name, w);
        return;
    }
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n <= 0 || (size_t)n >= sizeof path) return;
    if (w->depth == 0)
        w->ns = name;
    else
        w->model = name;
    w->depth++;
    each_entry(path, on_entry, w);
    w->depth--;
}

void ollama_list(const char *root, ollama_list_fn fn, void *ud) {
    static const char *hosts[] = {OLLAMA_REGISTRY, "hf.co", "huggingface.co"};
    if (!root || !root[0]) return;
    for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/manifests/%s", root, hosts[i]);
        walk w = {.root = root, .fn = fn, .ud = ud, .host = hosts[i]};
        each_entry(path, on_entry, &w);
    }
}
