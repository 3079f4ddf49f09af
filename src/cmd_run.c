/* exo run MODEL [PROMPT] — one model in this terminal: load it (a directory, or an id org/name
 * found as <models-dir>/org--name), run one generation, stream tokens as they come, and print
 * prefill and decode speed at the end. Refuses: serving (that is the node's job). */
#include "base/clock.h"
#include "base/paths.h"
#include "cmd.h"
#include "infer/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_flags {
    const char *model;
    const char *prompt;
    const char *tokens; /* comma-separated ids instead of a text prompt */
    int max_tokens;
    float temperature;
    uint64_t seed;
    int raw;
    int threads;
    int context;
    const char *models_dir;
} run_flags;

static void usage(void) {
    fprintf(stderr,
            "usage: exo run MODEL [PROMPT] [flags]\n"
            "  MODEL               a model directory, or an id org/name in the models dir\n"
            "  --max-tokens N      tokens to generate (default 256)\n"
            "  --temperature T     0 = greedy (default 0.7)\n"
            "  --seed N            sampling seed (default 42)\n"
            "  --raw               no chat template: the prompt is fed as is\n"
            "  --tokens 1,2,3      the prompt as token ids (prints ids)\n"
            "  --threads N         CPU threads (default: all cores)\n"
            "  --context N         context length (default: the model's)\n"
            "  --models-dir DIR    where model ids are looked up (default $EXO_MODELS_DIR or\n"
            "                      $XDG_DATA_HOME/exo/models)\n");
}

static int parse_flags(int argc, char **argv, run_flags *f) {
    *f = (run_flags){.max_tokens = 256, .temperature = 0.7f, .seed = 42};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        if (!strcmp(a, "--raw")) {
            f->raw = 1;
            continue;
        }
        if (a[0] == '-' && a[1] == '-') {
            if (!v) {
                fprintf(stderr, "exo run: %s needs a value\n", a);
                return -1;
            }
            i++;
            errno = 0;
            if (!strcmp(a, "--max-tokens")) f->max_tokens = (int)strtol(v, &end, 10);
            else if (!strcmp(a, "--temperature")) f->temperature = strtof(v, &end);
            else if (!strcmp(a, "--seed")) f->seed = strtoull(v, &end, 10);
            else if (!strcmp(a, "--threads")) f->threads = (int)strtol(v, &end, 10);
            else if (!strcmp(a, "--context")) f->context = (int)strtol(v, &end, 10);
            else if (!strcmp(a, "--tokens")) f->tokens = v, end = (char *)v + strlen(v);
            else if (!strcmp(a, "--models-dir")) f->models_dir = v, end = (char *)v + strlen(v);
            else {
                fprintf(stderr, "exo run: unknown flag %s\n", a);
                return -1;
            }
            if (errno || !end || *end) {
                fprintf(stderr, "exo run: bad value '%s' for %s\n", v, a);
                return -1;
            }
            continue;
        }
        if (!f->model) f->model = a;
        else if (!f->prompt) f->prompt = a;
        else {
            fprintf(stderr, "exo run: unexpected argument '%s' (quote the prompt)\n", a);
            return -1;
        }
    }
    if (!f->model) return 1;
    if (f->max_tokens < 1) {
        fprintf(stderr, "exo run: --max-tokens must be at least 1\n");
        return -1;
    }
    return 0;
}

/* A directory as given, else <models-dir>/org--name. */
static int resolve_model(const run_flags *f, char *out, size_t n) {
    if (paths_is_dir(f->model)) {
        snprintf(out, n, "%s", f->model);
        return 0;
    }
    char dir[1024];
    const char *env = getenv("EXO_MODELS_DIR");
    if (f->models_dir) snprintf(dir, sizeof dir, "%s", f->models_dir);
    else if (env && env[0]) snprintf(dir, sizeof dir, "%s", env);
    else if (paths_default_data_dir(dir, sizeof dir - 8) == 0) strcat(dir, "/models");
    char id[512];
    if (strlen(f->model) * 2 >= sizeof id) {
        fprintf(stderr, "exo run: model id too long\n");
        return -1;
    }
    snprintf(id, sizeof id, "%s", f->model);
    for (char *p = strchr(id, '/'); p; p = strchr(p, '/')) *p = '-', memmove(p + 1, p, strlen(p) + 1);
    snprintf(out, n, "%s/%s", dir, id);
    if (paths_is_dir(out)) return 0;
    fprintf(stderr, "exo run: no model '%s': not a directory, and %s does not exist\n", f->model,
            out);
    return -1;
}

static int parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16;
    *ids = malloc((size_t)cap * sizeof **ids);
    *n = 0;
    while (*ids && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) return -1;
        if (*n == cap) {
            int32_t *g = realloc(*ids, (size_t)(cap *= 2) * sizeof **ids);
            if (!g) return -1;
            *ids = g;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return *ids && *n > 0 ? 0 : -1;
}

int cmd_run_main(int argc, char **argv) {
    run_flags f;
    int pr = parse_flags(argc, argv, &f);
    if (pr != 0) {
        usage();
        return pr > 0 ? (f.model ? 0 : 2) : 2;
    }
    char dir[2048];
    if (resolve_model(&f, dir, sizeof dir) != 0) return 1;
    int32_t *prompt = NULL;
    int n_prompt = 0;
    if (!f.tokens) {
        fprintf(stderr, "exo run: text prompts need the tokenizer, which this build lacks; "
                "pass the prompt as --tokens 1,2,3\n");
        return 2;
    }
    if (parse_ids(f.tokens, &prompt, &n_prompt) != 0) {
        fprintf(stderr, "exo run: --tokens wants comma-separated token ids\n");
        free(prompt);
        return 2;
    }
    char err[512] = "";
    uint64_t t0 = clock_now_ns();
    engine_options o = {.model_dir = dir, .n_threads = f.threads, .context_length = f.context,
                        .max_sequences = 1};
    engine *e = engine_open(&o, err, sizeof err);
    if (!e) {
        fprintf(stderr, "exo run: %s\n", err);
        free(prompt);
        return 1;
    }
    const engine_info *info = engine_get_info(e);
    fprintf(stderr, "loaded %s (%s, %d layers) in %.2f s\n", dir, info->architecture,
            info->n_layers, (double)(clock_now_ns() - t0) / 1e9);
    engine_request req = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = f.max_tokens};
    req.sampling = sampling_params_default();
    req.sampling.temperature = f.temperature;
    req.sampling.seed = f.seed;
    int rc = 0;
    if (engine_submit(e, 1, &req, err, sizeof err) != 0) {
        fprintf(stderr, "exo run: %s\n", err);
        rc = 1;
    }
    uint64_t start = clock_now_ns(), first = 0;
    int n_gen = 0;
    engine_finish fin = ENGINE_FINISH_NONE;
    while (rc == 0 && engine_pending(e)) {
        engine_event ev[4];
        int n = engine_step(e, ev, 4);
        if (n < 0) {
            fprintf(stderr, "\nexo run: the engine failed\n");
            rc = 1;
            break;
        }
        for (int i = 0; i < n; i++) {
            if (ev[i].token >= 0) {
                if (!n_gen++) first = clock_now_ns();
                printf("%s%d", n_gen > 1 ? " " : "", ev[i].token);
                fflush(stdout);
            }
            if (ev[i].finish) fin = ev[i].finish;
            if (ev[i].finish == ENGINE_FINISH_ERROR) fprintf(stderr, "\nexo run: %s\n", ev[i].error);
        }
    }
    uint64_t end = clock_now_ns();
    printf("\n");
    if (n_gen) {
        double pre = (double)(first - start) / 1e9, dec = (double)(end - first) / 1e9;
        fprintf(stderr, "prompt: %d tokens, %.1f tok/s | generated: %d tokens, %.1f tok/s | %s\n",
                n_prompt, n_prompt / (pre > 0 ? pre : 1e-9), n_gen,
                n_gen > 1 ? (n_gen - 1) / (dec > 0 ? dec : 1e-9) : 0.0,
                fin == ENGINE_FINISH_STOP ? "stop" : fin == ENGINE_FINISH_LENGTH ? "length" : "error");
    }
    engine_close(e);
    free(prompt);
    return rc;
}
