#include "base/paths.h"

#include <errno.h>
#include <libgen.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int paths_default_data_dir(char *out, size_t n) {
    const char *xdg = getenv("XDG_DATA_HOME");
    int w;
    if (xdg && xdg[0] == '/') {
        w = snprintf(out, n, "%s/exo", xdg);
    } else {
        const char *home = getenv("HOME");
        w = snprintf(out, n, "%s/.local/share/exo", home && home[0] ? home : "/tmp");
    }
    return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

int paths_mkdir_p(const char *path) {
    char buf[4096];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, len + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

char *paths_read_file(const char *path, size_t max_bytes, size_t *len_out) {
    FILE *f = fopen(path, "rbe"); /* e: close-on-exec, runners are forked from threads */
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || (size_t)st.st_size > max_bytes) {
        fclose(f);
        errno = EFBIG;
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    char *data = malloc(size + 1);
    if (!data) {
        fclose(f);
        return NULL;
    }
    size_t got = fread(data, 1, size, f);
    fclose(f);
    if (got != size) {
        free(data);
        errno = EIO;
        return NULL;
    }
    data[size] = 0;
    if (len_out) *len_out = size;
    return data;
}

int paths_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int paths_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int paths_shipped_dir(const char *env_name, const char *rel, char *out, size_t n) {
    const char *env = env_name ? getenv(env_name) : NULL;
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return paths_is_dir(out) ? 0 : -1;
    }
    char exe[2048];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return -1;
    exe[len] = 0;
    const char *dir = dirname(exe);
    const char *base = strrchr(rel, '/') ? strrchr(rel, '/') + 1 : rel;
    char candidates[3][2300];
    snprintf(candidates[0], sizeof candidates[0], "%s/../%s", dir, rel);
    snprintf(candidates[1], sizeof candidates[1], "%s/../../%s", dir, rel);
    snprintf(candidates[2], sizeof candidates[2], "%s/../share/exo/%s", dir, base);
    for (int i = 0; i < 3; i++) {
        if (!paths_is_dir(candidates[i])) continue;
        char *real = realpath(candidates[i], NULL);
        snprintf(out, n, "%s", real ? real : candidates[i]);
        free(real);
        return 0;
    }
    return -1;
}
