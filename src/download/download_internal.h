/* download_internal — the private shape of one download run, shared by the files of
 * src/download/ that carry it out: download.c (sequences a run), plan.c (what to fetch),
 * transfer.c (whole files over curl multi), ranges.c (a stage's byte ranges), hashing.c (the
 * receive ring and running hashes) and engine.c (the run's shared state and helpers); hf.c
 * shares download_curl_init. Nothing outside src/download/ includes this; the door is
 * download.h.
 *
 * Calls go one way: download.c -> plan, transfer, ranges -> hashing, engine; engine and hashing
 * call no sibling. Everything runs on the downloading thread except the ring's two consumer
 * threads (hashing.c). */
#ifndef EXO_DOWNLOAD_INTERNAL_H
#define EXO_DOWNLOAD_INTERNAL_H

#include "download/download.h"
#include "download/hf.h"

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stddef.h>
#include <stdint.h>

/* libcurl's global init, once per process (hf.c). */
void download_curl_init(void);

typedef struct ring ring; /* hashing.c */

typedef struct plan_file {
    hf_file f;
    int needed;      /* part of this plan */
    int done;        /* verified and in place */
    int active;      /* a transfer is running */
    int fd;          /* .partial, -1 when closed */
    uint64_t offset; /* bytes in .partial == bytes hashed */
    EVP_MD_CTX *md;  /* hash of bytes [0, offset) (with the git prefix for SHA-1) */
    int attempts;
    double not_before; /* seconds (monotonic) before which no retry starts */
    int use_peer;      /* index+1 into peers, 0 = the Hub */
    int http_status;   /* status of the current response (0 until headers) */
    int body_ignored;  /* non-2xx body being discarded */
    int disk_full, io_error, oversize;
    int ranged;           /* shard: fetch only the byte ranges of this stage's tensors */
    uint64_t range_total; /* bytes those ranges hold (the whole size until the header is read) */
    uint64_t range_done;  /* of which on disk */
    CURL *easy;
    struct curl_slist *hdrs;
    char errbuf[CURL_ERROR_SIZE];
    struct engine *eng;
} plan_file;

typedef struct engine {
    const download_request *req;
    const hf_config *hf;
    download_result *res;
    char dir[1024];
    plan_file *files;
    size_t n;
    const char *peer_base; /* peer whose manifest we use (files come from it first) */
    double started, last_report;
    uint64_t last_report_bytes;
    double speed;
    int parallel, max_retries, backoff_ms, interval_ms;
    uint64_t fetched;
    ring *ring;
    int n_layers, tie; /* shard plans */
} engine;

/* ---------- engine.c: the run's shared state ---------- */

/* Seconds on the monotonic clock. */
double engine_now_s(void);
/* Sets the run's error and message, unless one is set already (the first failure is the one
 * to report). */
void engine_set_result(engine *e, enum download_error err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int engine_cancelled(const engine *e);
void engine_final_path(const engine *e, const plan_file *pf, char *out, size_t n);
void engine_partial_path(const engine *e, const plan_file *pf, char *out, size_t n);
/* Creates the directory that will hold path. 0 or -1 (errno set). */
int engine_mkdir_parent(const char *path);
/* The URL of a model file on a peer's API. */
void engine_peer_file_url(const char *base, const char *id, const char *path, char *out, size_t n);
/* The Authorization header for a transfer from a peer (the peer token: its API key) or from the
 * Hub (the HF token), appended to hdrs; each token goes only to its own kind of server. */
struct curl_slist *engine_auth_header(const engine *e, int from_peer, struct curl_slist *hdrs);
/* The options every file transfer (whole file or byte range) shares. */
void engine_transfer_setopts(CURL *c, char *errbuf);
/* Calls the progress callback (at most once per interval unless force). */
void engine_report(engine *e, enum download_status st, int force);
/* The STORE_RANGES record of sparse files: {path: {"layers", "ranges", "bytes"}} (a new
 * reference; empty when there is none), and setting (entry stolen) or removing one file's
 * entry. */
json_t *engine_sparse_load(const engine *e);
int engine_sparse_set(const engine *e, const char *file, json_t *entry);

/* ---------- hashing.c: the receive ring and running hashes ---------- */

/* NULL when threads or memory are short: callers then hash and write inline. */
ring *ring_start(void);
void ring_stop(ring *r);
/* Waits until every queued byte is hashed and written. */
void ring_drain(ring *r);
/* Queues n received bytes of pf (at pf->offset, in order) to be hashed and written. Returns 0,
 * or -1 when a write failed. */
int ring_push(ring *r, plan_file *pf, const void *data, size_t n);
/* After ring_drain: the errno of the first failed write on the ring's threads (0 for none)
 * and, in *pf, the file it was for. */
int ring_write_error(const ring *r, plan_file **pf);
/* Writes all n bytes at off (retrying short writes and EINTR). Returns 0 or the errno. */
int write_all_at(int fd, const char *p, size_t n, uint64_t off);
/* 256 (SHA-256), 1 (git blob SHA-1) or 0 (nothing to check). */
int hash_kind(const hf_file *f);
void hash_reset(plan_file *pf);
/* 1 = matches (or nothing to check), 0 = mismatch. Consumes the running hash. */
int hash_verify(plan_file *pf, char *got, size_t gotlen);
/* Re-hashes the bytes already in .partial (after a restart). Returns 0 or -1. */
int hash_catch_up(plan_file *pf, uint64_t upto);

/* ---------- plan.c: what to fetch ---------- */

/* Whether p is a weights file (safetensors_only: a .safetensors file). */
int plan_is_weight_file(const char *p, int safetensors_only);
/* Is the download a choice of one .gguf of a repository (llama.cpp's -hf, Ollama's hf.co/): an id
 * with a tag ("org/name:Q4_K_M"), or a repository that publishes .gguf files and no safetensors? */
int plan_is_gguf_choice(const hf_file_list *list, const char *model_id);
/* Which file of the list that choice takes: the .gguf whose name carries the id's tag as a word
 * (case-insensitive: "Q4_K_M" in "Llama-3.2-1B-Instruct-Q4_K_M.gguf", never in "..-Q4_K_M_L.."),
 * or without a tag the Q4_K_M file (llama.cpp's default), else the only .gguf; vision projectors
 * (mmproj-*.gguf) never. Returns its index, or -1 with a message listing the files on offer (no
 * match, several matches, a model split over several files). */
int plan_pick_gguf(const hf_file_list *list, const char *model_id, char *err, size_t errlen);
int plan_manifest_write(const engine *e);
int plan_read_local_manifest(const char *dir, hf_file_list *out);
/* The file list: a peer's manifest, else the Hub's (result set on failure). */
enum download_error plan_list_files(engine *e, hf_file_list *list);
/* For a shard: after the non-weight files are in place, mark the weight files it needs. */
int plan_select_shard(engine *e);
int plan_check_space(engine *e);
/* Marks files already in place. */
void plan_mark_present(engine *e);

/* ---------- transfer.c: whole files ---------- */

/* Fetches every needed, not-done, not-ranged file. 0, or -1 with the result set. */
int transfer_run(engine *e);
/* When a write failed, sets the download's error and returns 1. Call after ring_drain. */
int transfer_write_error(engine *e, const plan_file *pf);
void transfer_close_partial(plan_file *pf);

/* ---------- ranges.c: a stage's byte ranges ---------- */

/* Fetches every ranged file of the plan. 0, or -1 with the result set. */
int ranges_fetch_files(engine *e);

#endif
