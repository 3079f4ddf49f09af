/* libFuzzer target for the checks that stand between network input and the disk: model ids,
 * relative file paths, Range headers, and peer routes. Accepted inputs must satisfy the
 * invariants the rest of download/ relies on. */
#include "download/serve.h"
#include "model/store.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    if (store_id_valid(s, NULL, 0) == 0) {
        /* an accepted id never climbs out of the models dir */
        if (strstr(s, "..") || s[0] == '/' || strchr(s, '\\')) abort();
        char dir[300];
        if (store_id_to_dirname(s, dir, sizeof dir) == 0 && strchr(dir, '/')) abort();
    }
    if (store_relpath_valid(s) == 0) {
        if (s[0] == '/' || strstr(s, "/../") || !strncmp(s, "../", 3) || !strcmp(s, "..")) abort();
    }
    uint64_t start = 0, len = 0, filesize = size * 7 + 3;
    int st = serve_parse_range(s, filesize, &start, &len);
    if (st == 206 && (len == 0 || start + len > filesize)) abort();
    setenv("EXO_BUILTIN_MODELS_DIR", "/nonexistent-exo-fuzz", 1); /* no shipped models here */
    model_store store;
    if (store_init(&store, "/nonexistent-exo-fuzz", NULL, NULL, 0) == 0) {
        serve_target t;
        serve_resolve(&store, s, &t);
        if (t.status == 200) abort(); /* nothing exists there */
    }
    free(s);
    return 0;
}
