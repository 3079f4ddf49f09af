/* paths — where exo keeps things on disk (XDG base directories) and small file helpers. */
#ifndef EXO_BASE_PATHS_H
#define EXO_BASE_PATHS_H

#include <stddef.h>

/* $XDG_DATA_HOME/exo, or ~/.local/share/exo. Returns 0, or -1 if it does not fit in n. */
int paths_default_data_dir(char *out, size_t n);
/* mkdir -p; returns 0 or -1 with errno set. */
int paths_mkdir_p(const char *path);
/* Reads a whole file into a NUL-terminated malloc'd buffer; *len_out gets its size.
 * Returns NULL (errno set) on failure or if the file is larger than max_bytes. */
char *paths_read_file(const char *path, size_t max_bytes, size_t *len_out);
int paths_is_dir(const char *path);
int paths_is_file(const char *path);

/* Finds a folder that ships with exo (dashboard, built-in model cards and models): $env_name if
 * set, else <dir of the running binary>/../<rel>, /../../<rel> (build/ and build/release/ in a
 * checkout), /../share/exo/<last part of rel> (an installed layout). Returns 0 or -1. */
int paths_shipped_dir(const char *env_name, const char *rel, char *out, size_t n);

#endif
