/* store — which directories hold which models, and whether a model on disk is complete.
 *
 * A Hugging Face id "org/name" lives in "<dir>/org--name/". One directory is writable (the
 * models dir: --models-dir / EXO_MODELS_DIR); others are searched read-only (--models-path /
 * EXO_MODELS_PATH, colon-separated), the models that ship with exo last.
 *
 * One model, one identity: an absolute path names a model only when it is a model directory
 * directly inside one of those directories, and then it stands for that model's id (every alias
 * of the path, "//", "/./", a trailing "/" or "/.", gives the same id). Any other path names
 * nothing: the node's API is open to the network, and a path must not reach files elsewhere or
 * tell whether they exist. (`exo run DIR` opens a directory directly; it is no node.)
 *
 * A directory without a manifest, config.json or exactly one .gguf file is not a model; one
 * holding a single .gguf (and no config.json) is a complete GGUF model (see gguf.h). A model is
 * complete when its manifest (".exo-manifest.json", written by download/ after
 * every file was verified) lists files that are all present with their recorded sizes, or —
 * for a directory exo did not download — when config.json is there and every file named by
 * model.safetensors.index.json (or a single model.safetensors) is present.
 *
 * It refuses ids with "..", absolute parts, empty parts, or characters outside
 * [A-Za-z0-9._-] (one '/' between org and name, one ':' before a tag): an id never escapes the
 * models dir.
 * It does no network I/O and never hashes whole files (download/ verifies). */
#ifndef EXO_MODEL_STORE_H
#define EXO_MODEL_STORE_H

#include <stddef.h>
#include <stdint.h>

#define STORE_MAX_PATHS 16
#define STORE_PATH_MAX 1024
#define STORE_MANIFEST ".exo-manifest.json"
/* Files present at full size but holding only a pipeline stage's byte ranges (sparse); while it
 * lists any, the model is not complete. Written by download/. */
#define STORE_RANGES ".exo-ranges.json"

typedef struct model_store {
    char models_dir[STORE_PATH_MAX];                   /* writable */
    char search[STORE_MAX_PATHS][STORE_PATH_MAX];      /* read-only, in search order */
    int n_search;
    char ollama_root[STORE_PATH_MAX]; /* Ollama's pulled models (ollama.h), searched last; "" none */
} model_store;

/* models_path may be NULL or "" (no read-only dirs). Ollama's models are searched too (its root
 * from OLLAMA_MODELS or ~/.ollama/models) unless EXO_OLLAMA_MODELS is "0". Returns 0, or -1 with
 * a message. */
int store_init(model_store *s, const char *models_dir, const char *models_path, char *err,
               size_t errlen);

/* The one id of the model `requested` names: an id as is (when valid), or the id of a path that
 * is a model directory directly inside a store directory (see the top comment). Returns 0, or -1
 * with a message (the same message for every path that names no model). */
int store_canonical_id(const model_store *s, const char *requested, char *id, size_t n,
                       char *err, size_t errlen);

/* 0 if `id` is a safe "org/name" (or a bare "name"), either optionally followed by ":TAG" (a
 * quantization of a GGUF repository, "org/name:Q4_K_M", or an Ollama tag, "llama3.2:1b"), else -1
 * with a message saying why. The tag is part of the identity: "org/name:Q4_K_M" lives in
 * "<dir>/org--name:Q4_K_M/", beside "org--name:Q8_0/". */
int store_id_valid(const char *id, char *err, size_t errlen);
/* The tag of an id (after its ':'), or NULL when it has none. Points into id. */
const char *store_id_tag(const char *id);
/* The id without its tag ("org/name:Q4_K_M" -> "org/name"): the Hugging Face repository. Returns
 * 0, or -1 when it does not fit. */
int store_id_repo(const char *id, char *out, size_t n);
/* "org/name" -> "org--name". Returns 0, or -1 if invalid or it does not fit. */
int store_id_to_dirname(const char *id, char *out, size_t n);
/* 0 if `rel` is a safe relative file path inside a model dir ("a/b.json"): no "..", no leading
 * '/', no empty parts, no control characters or backslashes. */
int store_relpath_valid(const char *rel);

/* Where a download of `id` goes: <models_dir>/org--name. */
int store_write_dir(const model_store *s, const char *id, char *out, size_t n);

enum store_state { STORE_ABSENT = 0, STORE_PARTIAL = 1, STORE_COMPLETE = 2 };

/* Resolves `id_or_path` to the directory holding it: an id is looked up in the models dir, then
 * the read-only dirs (the first complete copy wins, else the first partial), then Ollama's models
 * (out is then the GGUF blob itself, a file: model_config and the weights read it in place); a
 * path stands for its id (store_canonical_id), and one outside the store dirs is ABSENT. Returns
 * the state and fills out (when not ABSENT). */
enum store_state store_locate(const model_store *s, const char *id_or_path, char *out, size_t n);

/* Why `id` has no complete model in the store, for a message: "it is not on disk", or what is
 * wrong with the first directory named for it (no config.json, incomplete files). */
void store_missing_reason(const model_store *s, const char *id, char *out, size_t n);

/* State of one directory (see the top comment). */
enum store_state store_dir_state(const char *dir);

/* Total bytes of regular files under dir, or of the file dir is (for storage_size). */
uint64_t store_dir_bytes(const char *dir);

/* Deletes the writable copy of `id` (never a read-only dir). 0 on success or if absent;
 * -1 with a message. */
int store_delete(const model_store *s, const char *id, char *err, size_t errlen);

/* Lists ids ("org/name") of models present (partial or complete) in all store dirs, then Ollama's;
 * calls fn once per id (duplicates across dirs are reported once, from the first dir). */
typedef void (*store_list_fn)(const char *id, const char *dir, enum store_state st, void *ud);
void store_list(const model_store *s, store_list_fn fn, void *ud);

#endif
