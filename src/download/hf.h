/* hf — the Hugging Face Hub's HTTP API as exo uses it (libcurl, blocking calls):
 *   file tree   GET  {endpoint}/api/models/{id}/tree/{revision}?recursive=true
 *   metadata    HEAD {endpoint}/{id}/resolve/{revision}/{path}  (x-linked-size, x-linked-etag, etag)
 *   search      GET  {endpoint}/api/models?search=Q&limit=N
 * The endpoint is HF_ENDPOINT (default https://huggingface.co); HF_TOKEN, when set, is sent as a
 * bearer token (never to another host after a redirect). Every answer is untrusted: paths are
 * checked with store_relpath_valid, sizes and hashes with their formats.
 * It does not download file bodies (the transfers in download.h do) and keeps no state between
 * calls. */
#ifndef EXO_DOWNLOAD_HF_H
#define EXO_DOWNLOAD_HF_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Error kinds shared by download/: what the user should do differs for each. */
enum download_error {
    DOWNLOAD_OK = 0,
    DOWNLOAD_ERR_NOT_FOUND = 1,  /* 404: no such model or file */
    DOWNLOAD_ERR_AUTH = 2,       /* 401/403: gated or private; set HF_TOKEN */
    DOWNLOAD_ERR_NETWORK = 3,    /* connection failures, 5xx, timeouts (after retries) */
    DOWNLOAD_ERR_VERIFY = 4,     /* checksum mismatch (after retries) */
    DOWNLOAD_ERR_DISK_FULL = 5,  /* not enough space, before or during */
    DOWNLOAD_ERR_CANCELLED = 6,
    DOWNLOAD_ERR_OFFLINE = 7,    /* offline mode and the files are not on disk */
    DOWNLOAD_ERR_IO = 8,         /* local file errors other than ENOSPC */
    DOWNLOAD_ERR_BAD_INPUT = 9,  /* invalid model id / malformed server answer */
    DOWNLOAD_ERR_RATE_LIMIT = 10,/* 429 that did not clear within the retries */
};
const char *download_error_name(enum download_error e);

typedef struct hf_config {
    char endpoint[512]; /* no trailing slash */
    char token[512];    /* "" = anonymous */
    char revision[128]; /* "main" */
} hf_config;

/* Fills from HF_ENDPOINT / HF_TOKEN (and HUGGING_FACE_HUB_TOKEN) or defaults. */
void hf_config_from_env(hf_config *c);

typedef struct hf_file {
    char path[512];     /* relative, validated */
    uint64_t size;
    char sha256[65];    /* LFS files: lowercase hex; "" otherwise */
    char git_sha1[41];  /* git blob id of the file as stored in git (LFS: of the pointer) */
    int is_lfs;
} hf_file;

typedef struct hf_file_list {
    hf_file *files;
    size_t n;
} hf_file_list;
void hf_file_list_free(hf_file_list *l);

/* Maps an HTTP status to an error kind (0 for 2xx). */
enum download_error hf_status_error(long status);

/* Lists the repository's files. Returns DOWNLOAD_OK or an error with a message. */
enum download_error hf_list_files(const hf_config *c, const char *model_id, hf_file_list *out,
                                  char *err, size_t errlen);

typedef struct hf_file_meta {
    uint64_t size;
    char etag[129]; /* x-linked-etag (LFS sha256) or etag (git sha1), unquoted */
} hf_file_meta;
enum download_error hf_head(const hf_config *c, const char *model_id, const char *path,
                            hf_file_meta *out, char *err, size_t errlen);

/* Fetches a small file (config.json, index) into memory (max_bytes cap). Caller frees. */
enum download_error hf_get_small(const hf_config *c, const char *model_id, const char *path,
                                 size_t max_bytes, char **out, size_t *len, char *err,
                                 size_t errlen);
/* Any URL, same error mapping (used for peers). token may be NULL. */
enum download_error http_get_small(const char *url, const char *token, size_t max_bytes,
                                   char **out, size_t *len, char *err, size_t errlen);

/* Searches models; returns a JSON array of {id, downloads, likes, ...} as the Hub returns them,
 * with mlx-community results first. New reference, or NULL with a message. */
json_t *hf_search(const hf_config *c, const char *query, int limit, char *err, size_t errlen);

/* URL of a file: {endpoint}/{id}/resolve/{revision}/{path} (path segments escaped). */
int hf_file_url(const hf_config *c, const char *model_id, const char *path, char *out, size_t n);

#endif
