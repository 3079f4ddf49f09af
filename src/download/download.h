/* download — gets a model (or the part of it one pipeline stage needs) into the models dir,
 * resumably and verified.
 *
 * Plan: list files (a peer's manifest, else the Hub's tree), choose what to fetch (the whole
 * repo, or for a layer range: every non-weight file plus the safetensors files holding those
 * layers, chosen via model.safetensors.index.json), check free space (statvfs), then fetch up
 * to `parallel` files at once with curl multi. Each file streams into "<file>.partial" (resumed
 * with Range after a drop or a restart), is verified (SHA-256 for LFS files, git blob SHA-1
 * for small files; hashed and written by two threads while it arrives) and only then renamed into
 * place; a mismatch deletes the partial and retries. 429 waits for Retry-After; other
 * transient failures back off exponentially. ".exo-manifest.json" records every repo file with
 * its size and hash (store.h reads it).
 *
 * Byte ranges: a stage that needs only some tensors of a safetensors file fetches its header
 * and the byte ranges of those tensors into a sparse file at their offsets, listed in
 * STORE_RANGES (the model then stays incomplete for the store). Such bytes are checked by
 * Content-Range and the header's bounds only: a whole-file hash cannot check part of a file; a
 * whole-model download refetches those files whole and verifies them.
 *
 * It refuses to write outside <models_dir>/<org--name>/, to trust sizes/paths from servers
 * unchecked, and to leave an unverified file under its final name. It never deletes files
 * it did not create, except a corrupt .partial. Blocking: call it from a thread you own. */
#ifndef EXO_DOWNLOAD_DOWNLOAD_H
#define EXO_DOWNLOAD_DOWNLOAD_H

#include "download/hf.h"

#include <stddef.h>
#include <stdint.h>

enum download_status { DOWNLOAD_PENDING, DOWNLOAD_ONGOING, DOWNLOAD_COMPLETED, DOWNLOAD_FAILED };

typedef struct download_progress {
    const char *model_id;
    enum download_status status;
    uint64_t downloaded_bytes; /* on disk and verified-or-in-flight, this plan's files */
    uint64_t total_bytes;      /* all files of this plan */
    uint64_t fetched_bytes;    /* bytes received over the network in this run */
    double speed;              /* bytes/s, smoothed */
    double eta_seconds;        /* -1 when unknown */
    int files_done, files_total;
    const char *current_file;  /* one file in flight, or NULL */
    enum download_error error; /* when FAILED */
    const char *message;       /* when FAILED: what went wrong and what to do */
    int layer_start, layer_end; /* a pipeline stage's download: its layers (layer_end 0: all) */
} download_progress;

/* Called from the downloading thread at most once per progress_interval_ms, plus once at the
 * end (COMPLETED or FAILED). The pointers are valid only during the call. */
typedef void (*download_progress_fn)(const download_progress *p, void *ud);

typedef struct download_request {
    const char *model_id;     /* "org/name" */
    const char *models_dir;   /* writable destination root */
    const hf_config *hf;      /* NULL = hf_config_from_env() */
    int parallel;             /* files at once; 0 = 8 */
    int offline;              /* use local files only */
    int max_retries;          /* per file; 0 = 5 */
    int backoff_ms;           /* first retry delay, doubled each time; 0 = 1000 */
    int progress_interval_ms; /* 0 = 1000 */
    /* Pipeline shard: fetch only what layers [layer_start, layer_end) need. layer_end = 0 means
     * the whole model. */
    int layer_start, layer_end;
    /* Peers that may already hold the model: base URLs "http://host:port" of their API. Tried
     * first (manifest + files); any failure falls back to the Hub. */
    const char *const *peers;
    int n_peers;
    /* Sent to peers as "Authorization: Bearer" (their API key, when the nodes run with
     * --api-key); NULL or "" = none. Never sent to the Hub, as the HF token is never sent to
     * peers. */
    const char *peer_token;
    uint64_t min_free_bytes;  /* keep this much free after the download (default 0) */
    download_progress_fn progress;
    void *progress_ud;
    volatile int *cancel;     /* set nonzero from any thread to stop; partials are kept */
} download_request;

typedef struct download_result {
    enum download_error error;
    char message[512];
    char model_dir[1024];
    uint64_t bytes_fetched;      /* over the network, all sources */
    uint64_t bytes_from_peers;
    int files_fetched;           /* files transferred in this run (not already present) */
    int files_planned;
} download_result;

/* Runs the download to completion, failure or cancellation. Returns result->error. */
enum download_error download_model(const download_request *req, download_result *result);

/* For `exo run`: the whole model into models_dir with defaults from the environment (HF_*,
 * EXO_MODELS_DIR or the default models dir, EXO_OFFLINE). Returns 0 on success and fills
 * model_dir; -1 with a message. progress may be NULL. */
int download_model_blocking(const char *model_id, download_progress_fn progress, void *ud,
                            char *model_dir, size_t model_dir_len, char *err, size_t errlen);

/* A terminal progress bar suitable as a download_progress_fn (ud = FILE*, NULL = stderr). */
void download_progress_bar(const download_progress *p, void *ud);

/* Which files a pipeline stage needs: given model.safetensors.index.json text and the model's
 * layer count, appends to `out` (a JSON array of strings) the weight files holding tensors of
 * layers [start, end), plus embeddings for the first stage and final norm / lm_head for the
 * last. Returns 0, or -1 with a message if the index is malformed. */
int download_shard_files(const char *index_json, int n_layers, int tie_embeddings, int start,
                         int end, json_t *out, char *err, size_t errlen);

/* A byte range [start, end) of a file. */
typedef struct download_range {
    uint64_t start, end;
} download_range;

/* Which bytes of one safetensors file a pipeline stage needs: `head` holds the file's first
 * head_len bytes (at least the 8-byte length and the JSON header), file_size is the file's
 * listed size. Writes to out (up to max entries, sorted, merged where they touch or lie closer
 * than 64 KiB) the header [0, 8+N) plus the data of every tensor of layers [start, end)
 * (embeddings for the first stage, final norm / lm_head for the last, with tie_embeddings the
 * last stage also gets the embeddings; other non-layer tensors go with both ends, as
 * download_shard_files). Returns the number of ranges, or -1 with a message if the header is
 * malformed or names bytes outside the file. If head_len is too short for the header, returns
 * -2 and sets *need to the bytes required. */
int download_shard_ranges(const void *head, size_t head_len, uint64_t file_size, int n_layers,
                          int tie_embeddings, int start, int end, download_range *out, int max,
                          uint64_t *need, char *err, size_t errlen);

#endif
