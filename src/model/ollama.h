/* ollama — the models Ollama has already pulled, run where they lie.
 *
 * Ollama keeps a model as a manifest, <root>/manifests/<host>/<namespace>/<model>/<tag> (JSON,
 * the OCI image manifest), whose layer of mediaType "application/vnd.ollama.image.model" names a
 * GGUF blob, <root>/blobs/sha256-<hex>. The root is $OLLAMA_MODELS, else ~/.ollama/models.
 *
 * Names, as Ollama writes them and exo's ids (store.h) carry them:
 *   "llama3.2:1b"      registry.ollama.ai/library/llama3.2/1b ("llama3.2" alone: tag "latest")
 *   "user/model:tag"   registry.ollama.ai/user/model/tag
 *   "org/repo:Q4_K_M"  hf.co/org/repo/Q4_K_M (pulled as "hf.co/org/repo:Q4_K_M"): the same id
 *                      `exo run` would download from Hugging Face, so it is found here first
 *
 * Refuses: writing anything under the root (no copies, links or caches: the blob is opened
 * read-only in place), manifests without a model layer, blobs missing or not of the listed size,
 * names outside store_id_valid's alphabet, manifests over 1 MiB. No network I/O. */
#ifndef EXO_MODEL_OLLAMA_H
#define EXO_MODEL_OLLAMA_H

#include <stddef.h>

/* Ollama's models root: $OLLAMA_MODELS, else $HOME/.ollama/models. Returns 0 when that
 * directory exists (out filled), -1 otherwise. */
int ollama_default_root(char *out, size_t n);

/* The GGUF blob of model `id` (a name as above) under root. Returns 0 and fills blob, or -1 when
 * Ollama holds no complete copy of it. */
int ollama_locate(const char *root, const char *id, char *blob, size_t n);

/* Calls fn once per complete model under root, with its id and its blob's path. */
typedef void (*ollama_list_fn)(const char *id, const char *blob, void *ud);
void ollama_list(const char *root, ollama_list_fn fn, void *ud);

#endif
