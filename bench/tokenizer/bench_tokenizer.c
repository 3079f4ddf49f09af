/* bench_tokenizer — how long loading a tokenizer.json and encoding a ~100 KB text take.
 * Usage: bench_tokenizer TEXT_FILE MODEL_DIR... ; prints one line per tokenizer:
 *   name load_ms encode_ms(median of 15) tokens MB/s decode_ms stream_ms   (thread CPU time)
 * Built and run by bench/tokenizer/run.sh, which also times @lenml/tokenizers (JS) on the same
 * text as the baseline. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/tokenizer.h"

/* CPU time of this thread: on a shared, busy machine wall-clock times mostly measure the
 * neighbours; CPU time is what the tokenizer costs. */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TEXT_FILE MODEL_DIR...\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    if (fread(text, 1, (size_t)len, f) != (size_t)len) return 1;
    fclose(f);
    printf("%-16s %9s %10s %8s %8s %10s %10s\n", "tokenizer", "load_ms", "encode_ms", "tokens", "MB/s", "decode_ms", "stream_ms");
    for (int a = 2; a < argc; a++) {
        char err[512];
        double t0 = now_ms();
        tokenizer *t = tokenizer_load(argv[a], err, sizeof err);
        double load = now_ms() - t0;
        if (!t) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        enum { RUNS = 15 };
        double times[RUNS];
        int n = 0;
        int32_t *ids = NULL;
        for (int r = 0; r < RUNS; r++) {
            free(ids);
            t0 = now_ms();
            n = tokenizer_encode(t, text, (size_t)len, 0, &ids, err, sizeof err);
            times[r] = now_ms() - t0;
            if (n < 0) {
                fprintf(stderr, "encode: %s\n", err);
                return 1;
            }
        }
        qsort(times, RUNS, sizeof(double), cmp_double);
        t0 = now_ms();
        char *dec = tokenizer_decode(t, ids, (size_t)n, 0, NULL);
        double dec_ms = now_ms() - t0;
        t0 = now_ms();
        detokenizer *d = detokenizer_new(t, 0);
        char buf[512];
        size_t total = 0;
        for (int i = 0; i < n; i++) total += detokenizer_push(d, ids[i], buf, sizeof buf);
        total += detokenizer_flush(d, buf, sizeof buf);
        detokenizer_free(d);
        double stream_ms = now_ms() - t0;
        if (total != strlen(dec)) fprintf(stderr, "warning: stream length %zu != decode length %zu\n", total, strlen(dec));
        const char *name = argv[a];
        const char *slash = strstr(name, "tokenizer-");
        if (slash) name = slash + 10;
        printf("%-16s %9.1f %10.2f %8d %8.1f %10.2f %10.2f\n", name, load, times[RUNS / 2], n,
               len / 1e6 / (times[RUNS / 2] / 1e3), dec_ms, stream_ms);
        free(dec);
        free(ids);
        tokenizer_free(t);
    }
    free(text);
    return 0;
}
