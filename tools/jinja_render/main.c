/* jinja_render — developer tool: renders a Jinja template file with a JSON context file, the way
 * exo renders chat templates, and prints the result (or the error naming the line).
 *
 *   build/tools/jinja_render TEMPLATE [CONTEXT.json] [--bench N]
 *
 * TEMPLATE may also be a tokenizer_config.json (its chat_template is used). With --bench N it
 * renders N times and prints the mean time per render instead of the text. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja/jinja.h"

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

int main(int argc, char **argv) {
    const char *tpl_path = NULL, *ctx_path = NULL;
    long bench = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench") && i + 1 < argc)
            bench = strtol(argv[++i], NULL, 10);
        else if (!tpl_path)
            tpl_path = argv[i];
        else
            ctx_path = argv[i];
    }
    if (!tpl_path) {
        fprintf(stderr, "usage: jinja_render TEMPLATE [CONTEXT.json] [--bench N]\n");
        return 2;
    }
    size_t len;
    char *src = read_file(tpl_path, &len);
    if (!src) {
        fprintf(stderr, "jinja_render: cannot read %s\n", tpl_path);
        return 1;
    }
    json_t *cfg = json_loadb(src, len, 0, NULL);
    if (cfg && json_is_string(json_object_get(cfg, "chat_template"))) {
        char *t = strdup(json_string_value(json_object_get(cfg, "chat_template")));
        free(src);
        src = t;
        len = strlen(t);
    }
    json_decref(cfg);
    json_t *ctx = NULL;
    if (ctx_path) {
        json_error_t je;
        ctx = json_load_file(ctx_path, 0, &je);
        if (!ctx) {
            fprintf(stderr, "jinja_render: %s: %s (line %d)\n", ctx_path, je.text, je.line);
            free(src);
            return 1;
        }
    }
    char err[512];
    jinja_template *t = jinja_compile(src, len, err, sizeof err);
    free(src);
    if (!t) {
        fprintf(stderr, "jinja_render: %s\n", err);
        json_decref(ctx);
        return 1;
    }
    int rc = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    long runs = bench > 0 ? bench : 1;
    size_t out_len = 0;
    for (long i = 0; i < runs; i++) {
        char *out = jinja_render(t, ctx, NULL, err, sizeof err);
        if (!out) {
            fprintf(stderr, "jinja_render: %s\n", err);
            rc = 1;
            break;
        }
        out_len = strlen(out);
        if (!bench) fputs(out, stdout);
        free(out);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (bench && !rc) {
        double us = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 1e3 /
                    (double)runs;
        printf("%ld renders, %.1f us per render, %zu bytes of output\n", runs, us, out_len);
    }
    jinja_free(t);
    json_decref(ctx);
    return rc;
}
