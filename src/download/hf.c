/* hf — Hugging Face Hub metadata calls over libcurl (see hf.h). */
#include "download/hf.h"

#include "base/strbuf.h"
#include "download/download_internal.h"
#include "model/store.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }
void download_curl_init(void) { pthread_once(&curl_once, curl_init_once); }

const char *download_error_name(enum download_error e) {
    switch (e) {
    case DOWNLOAD_OK: return "ok";
    case DOWNLOAD_ERR_NOT_FOUND: return "not_found";
    case DOWNLOAD_ERR_AUTH: return "auth";
    case DOWNLOAD_ERR_NETWORK: return "network";
    case DOWNLOAD_ERR_VERIFY: return "verify";
    case DOWNLOAD_ERR_DISK_FULL: return "disk_full";
    case DOWNLOAD_ERR_CANCELLED: return "cancelled";
    case DOWNLOAD_ERR_OFFLINE: return "offline";
    case DOWNLOAD_ERR_IO: return "io";
    case DOWNLOAD_ERR_BAD_INPUT: return "bad_input";
    case DOWNLOAD_ERR_RATE_LIMIT: return "rate_limited";
    }
    return "unknown";
}

void hf_config_from_env(hf_config *c) {
    memset(c, 0, sizeof *c);
    const char *ep = getenv("HF_ENDPOINT");
    snprintf(c->endpoint, sizeof c->endpoint, "%s", ep && *ep ? ep : "https://huggingface.co");
    size_t n = strlen(c->endpoint);
    while (n > 0 && c->endpoint[n - 1] == '/') c->endpoint[--n] = 0;
    const char *tok = getenv("HF_TOKEN");
    if (!tok || !*tok) tok = getenv("HUGGING_FACE_HUB_TOKEN");
    if (tok) snprintf(c->token, sizeof c->token, "%s", tok);
    snprintf(c->revision, sizeof c->revision, "main");
}

void hf_file_list_free(hf_file_list *l) {
    free(l->files);
    l->files = NULL;
    l->n = 0;
}

enum download_error hf_status_error(long status) {
    if (status >= 200 && status < 300) return DOWNLOAD_OK;
    if (status == 401 || status == 403) return DOWNLOAD_ERR_AUTH;
    if (status == 404 || status == 410) return DOWNLOAD_ERR_NOT_FOUND;
    if (status == 429) return DOWNLOAD_ERR_RATE_LIMIT;
    if (status >= 400 && status < 500) return DOWNLOAD_ERR_BAD_INPUT;
    return DOWNLOAD_ERR_NETWORK;
}

static void escape_path(strbuf *sb, const char *path) {
    /* keep '/', escape everything outside the unreserved set */
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
            *p == '-' || *p == '_' || *p == '.' || *p == '~' || *p == '/')
            strbuf_append_char(sb, (char)*p);
        else
            strbuf_appendf(sb, "%%%02X", *p);
    }
}

int hf_file_url(const hf_config *c, const char *model_id, const char *path, char *out, size_t n) {
    char repo[256]; /* a tagged id ("org/name:Q4_K_M") is a choice of files in the repo org/name */
    if (store_id_repo(model_id, repo, sizeof repo) < 0) return -1;
    strbuf sb = {0};
    strbuf_appendf(&sb, "%s/%s/resolve/", c->endpoint, repo);
    escape_path(&sb, c->revision);
    strbuf_append_char(&sb, '/');
    escape_path(&sb, path);
    int ok = sb.len < n;
    if (ok) memcpy(out, sb.data, sb.len + 1);
    strbuf_free(&sb);
    return ok ? 0 : -1;
}

struct body {
    strbuf sb;
    size_t max;
    int overflow;
};

static size_t body_write(char *ptr, size_t size, size_t nmemb, void *ud) {
    struct body *b = ud;
    size_t n = size * nmemb;
    if (b->sb.len + n > b->max) {
        b->overflow = 1;
        return 0;
    }
    strbuf_append(&b->sb, ptr, n);
    return n;
}

struct headers {
    hf_file_meta *meta;
    int have_linked_size, have_linked_etag;
};

static void trim_copy(char *dst, size_t n, const char *src, size_t len) {
    while (len && (src[0] == ' ' || src[0] == '"')) src++, len--;
    while (len && (src[len - 1] == '\r' || src[len - 1] == '\n' || src[len - 1] == ' ' ||
                   src[len - 1] == '"'))
        len--;
    if (len >= 2 && !strncmp(src, "W/", 2)) src += 2, len -= 2;
    while (len && src[0] == '"') src++, len--;
    if (len >= n) len = n - 1;
    memcpy(dst, src, len);
    dst[len] = 0;
}

static size_t header_cb(char *buf, size_t size, size_t nitems, void *ud) {
    struct headers *h = ud;
    size_t n = size * nitems;
    const char *colon = memchr(buf, ':', n);
    if (!colon) return n;
    size_t klen = (size_t)(colon - buf);
    const char *v = colon + 1;
    size_t vlen = n - klen - 1;
    char tmp[160];
    if (klen == 13 && !strncasecmp(buf, "x-linked-size", 13)) {
        trim_copy(tmp, sizeof tmp, v, vlen);
        h->meta->size = strtoull(tmp, NULL, 10);
        h->have_linked_size = 1;
    } else if (klen == 14 && !strncasecmp(buf, "content-length", 14) && !h->have_linked_size) {
        trim_copy(tmp, sizeof tmp, v, vlen);
        h->meta->size = strtoull(tmp, NULL, 10);
    } else if (klen == 13 && !strncasecmp(buf, "x-linked-etag", 13)) {
        trim_copy(h->meta->etag, sizeof h->meta->etag, v, vlen);
        h->have_linked_etag = 1;
    } else if (klen == 4 && !strncasecmp(buf, "etag", 4) && !h->have_linked_etag) {
        trim_copy(h->meta->etag, sizeof h->meta->etag, v, vlen);
    }
    return n;
}

static CURL *easy_new(const char *url, const char *token, struct curl_slist **hdrs) {
    download_curl_init();
    CURL *e = curl_easy_init();
    if (!e) return NULL;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "exo/0.1 (+libcurl)");
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 15L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    *hdrs = NULL;
    if (token && *token) {
        char auth[600];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        *hdrs = curl_slist_append(*hdrs, auth);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, *hdrs);
    }
    return e;
}

static enum download_error perform(CURL *e, const char *what, char *err, size_t errlen,
                                   long *status_out) {
    CURLcode rc = curl_easy_perform(e);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    if (status_out) *status_out = status;
    if (rc != CURLE_OK && rc != CURLE_WRITE_ERROR) {
        snprintf(err, errlen, "%s: %s", what, curl_easy_strerror(rc));
        return DOWNLOAD_ERR_NETWORK;
    }
    enum download_error de = hf_status_error(status);
    if (de == DOWNLOAD_ERR_AUTH)
        snprintf(err, errlen, "%s: HTTP %ld — the model is gated or private; set HF_TOKEN to a token "
                 "that has access", what, status);
    else if (de == DOWNLOAD_ERR_NOT_FOUND)
        snprintf(err, errlen, "%s: HTTP %ld — not found (check the model id and file name)", what, status);
    else if (de != DOWNLOAD_OK)
        snprintf(err, errlen, "%s: HTTP %ld", what, status);
    return de;
}

enum download_error http_get_small(const char *url, const char *token, size_t max_bytes,
                                   char **out, size_t *len, char *err, size_t errlen) {
    struct curl_slist *hdrs;
    CURL *e = easy_new(url, token, &hdrs);
    if (!e) {
        snprintf(err, errlen, "cannot create an HTTP handle");
        return DOWNLOAD_ERR_IO;
    }
    struct body b = {.max = max_bytes};
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, body_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    enum download_error de = perform(e, url, err, errlen, NULL);
    if (de == DOWNLOAD_OK && b.overflow) {
        snprintf(err, errlen, "%s: answer larger than %zu bytes", url, max_bytes);
        de = DOWNLOAD_ERR_BAD_INPUT;
    }
    curl_easy_cleanup(e);
    curl_slist_free_all(hdrs);
    if (de != DOWNLOAD_OK) {
        strbuf_free(&b.sb);
        return de;
    }
    if (len) *len = b.sb.len;
    *out = strbuf_detach(&b.sb);
    return DOWNLOAD_OK;
}

enum download_error hf_get_small(const hf_config *c, const char *model_id, const char *path,
                                 size_t max_bytes, char **out, size_t *len, char *err,
                                 size_t errlen) {
    char url[2048];
    if (hf_file_url(c, model_id, path, url, sizeof url) < 0) {
        snprintf(err, errlen, "URL too long");
        return DOWNLOAD_ERR_BAD_INPUT;
    }
    return http_get_small(url, c->token, max_bytes, out, len, err, errlen);
}

static int is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

enum download_error hf_list_files(const hf_config *c, const char *model_id, hf_file_list *out,
                                  char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    char repo[256];
    if (store_id_valid(model_id, err, errlen) < 0 || store_id_repo(model_id, repo, sizeof repo) < 0)
        return DOWNLOAD_ERR_BAD_INPUT;
    char url[2048];
    strbuf sb = {0};
    strbuf_appendf(&sb, "%s/api/models/%s/tree/", c->endpoint, repo);
    escape_path(&sb, c->revision);
    strbuf_append_str(&sb, "?recursive=true");
    snprintf(url, sizeof url, "%s", sb.data);
    strbuf_free(&sb);
    char *body;
    size_t len;
    enum download_error de = http_get_small(url, c->token, 64 << 20, &body, &len, err, errlen);
    if (de != DOWNLOAD_OK) return de;
    json_error_t je;
    json_t *arr = json_loadb(body, len, 0, &je);
    free(body);
    if (!json_is_array(arr)) {
        snprintf(err, errlen, "file list of %s is not a JSON array", model_id);
        json_decref(arr);
        return DOWNLOAD_ERR_BAD_INPUT;
    }
    out->files = calloc(json_array_size(arr) + 1, sizeof(hf_file));
    if (!out->files) abort();
    size_t i;
    json_t *it;
    json_array_foreach(arr, i, it) {
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!type || strcmp(type, "file")) continue;
        const char *path = json_string_value(json_object_get(it, "path"));
        json_t *size = json_object_get(it, "size");
        if (!path || store_relpath_valid(path) < 0 || !json_is_integer(size) ||
            json_integer_value(size) < 0 || strlen(path) >= sizeof out->files[0].path) {
            snprintf(err, errlen, "file list of %s has an unsafe or malformed entry (%s)", model_id,
                     path ? path : "no path");
            json_decref(arr);
            hf_file_list_free(out);
            return DOWNLOAD_ERR_BAD_INPUT;
        }
        hf_file *f = &out->files[out->n++];
        snprintf(f->path, sizeof f->path, "%s", path);
        f->size = (uint64_t)json_integer_value(size);
        const char *oid = json_string_value(json_object_get(it, "oid"));
        if (oid && is_hex(oid, 40)) memcpy(f->git_sha1, oid, 41);
        json_t *lfs = json_object_get(it, "lfs");
        if (json_is_object(lfs)) {
            const char *sha = json_string_value(json_object_get(lfs, "oid"));
            json_t *lsize = json_object_get(lfs, "size");
            if (sha && is_hex(sha, 64)) memcpy(f->sha256, sha, 65);
            if (json_is_integer(lsize) && json_integer_value(lsize) >= 0)
                f->size = (uint64_t)json_integer_value(lsize);
            f->is_lfs = 1;
        }
    }
    json_decref(arr);
    return DOWNLOAD_OK;
}

enum download_error hf_head(const hf_config *c, const char *model_id, const char *path,
                            hf_file_meta *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    char url[2048];
    if (hf_file_url(c, model_id, path, url, sizeof url) < 0) {
        snprintf(err, errlen, "URL too long");
        return DOWNLOAD_ERR_BAD_INPUT;
    }
    struct curl_slist *hdrs;
    CURL *e = easy_new(url, c->token, &hdrs);
    if (!e) return DOWNLOAD_ERR_IO;
    struct headers h = {.meta = out};
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    /* the Hub answers LFS files with a redirect carrying x-linked-*: read them, do not follow */
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &h);
    long status = 0;
    enum download_error de = perform(e, path, err, errlen, &status);
    if (status >= 300 && status < 400) de = DOWNLOAD_OK;
    curl_easy_cleanup(e);
    curl_slist_free_all(hdrs);
    return de;
}

json_t *hf_search(const hf_config *c, const char *query, int limit, char *err, size_t errlen) {
    if (limit <= 0 || limit > 100) limit = 20;
    download_curl_init();
    CURL *tmp = curl_easy_init();
    char *q = tmp ? curl_easy_escape(tmp, query ? query : "", 0) : NULL;
    char url[2048];
    snprintf(url, sizeof url, "%s/api/models?search=%s&limit=%d&sort=downloads", c->endpoint,
             q ? q : "", limit * 2);
    curl_free(q);
    if (tmp) curl_easy_cleanup(tmp);
    char *body;
    size_t len;
    if (http_get_small(url, c->token, 16 << 20, &body, &len, err, errlen) != DOWNLOAD_OK) return NULL;
    json_error_t je;
    json_t *arr = json_loadb(body, len, 0, &je);
    free(body);
    if (!json_is_array(arr)) {
        snprintf(err, errlen, "search answer is not a JSON array");
        json_decref(arr);
        return NULL;
    }
    /* mlx-community first, then the rest, each in the Hub's order; at most `limit` */
    json_t *outa = json_array();
    for (int pass = 0; pass < 2; pass++) {
        size_t i;
        json_t *it;
        json_array_foreach(arr, i, it) {
            if ((int)json_array_size(outa) >= limit) break;
            const char *id = json_string_value(json_object_get(it, "id"));
            if (!id) id = json_string_value(json_object_get(it, "modelId"));
            if (!id || store_id_valid(id, NULL, 0) < 0) continue;
            int mlx = !strncmp(id, "mlx-community/", 14);
            if ((pass == 0) != mlx) continue;
            json_t *o = json_object();
            json_object_set_new(o, "id", json_string(id));
            json_t *v;
            if ((v = json_object_get(it, "downloads"))) json_object_set(o, "downloads", v);
            if ((v = json_object_get(it, "likes"))) json_object_set(o, "likes", v);
            if ((v = json_object_get(it, "tags"))) json_object_set(o, "tags", v);
            if ((v = json_object_get(it, "pipeline_tag"))) json_object_set(o, "pipeline_tag", v);
            json_array_append_new(outa, o);
        }
    }
    json_decref(arr);
    return outa;
}
