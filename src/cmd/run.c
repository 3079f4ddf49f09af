/* exo run MODEL [PROMPT] — one model in this terminal: load it (a directory, or an id org/name
 * found as <models-dir>/org--name), render the prompt with the model's chat template (unless
 * --raw), stream the reply as it is generated, and print prefill and decode speed at the end.
 * Without PROMPT it is an interactive chat: each line is a user turn, the conversation is kept
 * (the prefix cache makes earlier turns free). Refuses: serving (that is the node's job). */
#include "base/clock.h"
#include "base/paths.h"
#include "model/gguf.h"
#include "model/store.h"
#include "download/download.h"
#include "base/strbuf.h"
#include "cmd/cmd.h"
#include "compute/device.h"
#include "infer/engine.h"
#include "text/chat.h"
#include "runner/model_text.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <unistd.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "hf.co/org/repo:Q4_K_M" (Ollama's spelling of a Hugging Face GGUF) is exo's "org/repo:Q4_K_M". */
static const char *without_hub_host(const char *model) {
    static const char *hosts[] = {"hf.co/", "huggingface.co/", "https://huggingface.co/"};
    for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++)
        if (!strncmp(model, hosts[i], strlen(hosts[i]))) return model + strlen(hosts[i]);
    return model;
}

typedef struct run_flags {
    const char *model;
    const char *prompt;
    const char *tokens; /* comma-separated ids instead of a text prompt */
    int max_tokens;
    float temperature;
    uint64_t seed;
    int raw;
    int no_think;
    int threads;
    int context;
    const char *device; /* --device cpu|cuda|auto */
    const char *models_dir;
    const char *models_path;
    int offline; /* --offline / EXO_OFFLINE: never download a missing model */
    const char *speculative; /* --speculative ngram|mtp|draft:DIR|off */
    int spec_tokens;         /* --spec-k N */
} run_flags;

static void usage(FILE *out) {
    fprintf(out,
            "usage: exo run MODEL [PROMPT] [flags]\n"
            "  MODEL               a model directory, or an id org/name in the models dir\n"
            "  --max-tokens N      tokens to generate (default 256)\n"
            "  --temperature T     0 = greedy (default 0.7)\n"
            "  --seed N            sampling seed (default 42)\n"
            "  --raw               no chat template: the prompt is fed as is\n"
            "  --no-think          ask thinking models (Qwen3) not to think\n"
            "  --offline           never download a missing model (env EXO_OFFLINE)\n"
            "  --tokens 1,2,3      the prompt as token ids (prints ids)\n"
            "  --threads N         CPU threads (default: the cores this process may use, the big\n"
            "                      ones only on big.LITTLE / P+E-core CPUs)\n"
            "  --device DEV        cpu, cuda or auto (default: the GPU when there is one)\n"
            "  --context N         context length (default: the model's)\n"
            "  --speculative M     speculative decoding: ngram (prompt lookup), mtp (the\n"
            "                      model's MTP head, Qwen3-Next / Qwen3.5), draft:DIR (a small\n"
            "                      model of the same tokenizer) or off (default)\n"
            "  --spec-k N          most tokens drafted per step (default 4, at most 16)\n"
            "  --models-path DIRS  read-only model dirs, colon-separated ($EXO_MODELS_PATH)\n"
            "  --models-dir DIR    where model ids are looked up (default $EXO_MODELS_DIR or\n"
            "                      $XDG_DATA_HOME/exo/models)\n");
}

/* parse_flags: 0 run, RUN_HELP --help (usage on stdout, exit 0), else bad usage (exit 2). */
#define RUN_HELP 3

static int parse_flags(int argc, char **argv, run_flags *f) {
    *f = (run_flags){.max_tokens = 256, .temperature = 0.7f, .seed = 42};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return RUN_HELP;
        if (!strcmp(a, "--raw")) {
            f->raw = 1;
            continue;
        }
        if (!strcmp(a, "--no-think")) {
            f->no_think = 1;
            continue;
        }
        if (!strcmp(a, "--offline")) {
            f->offline = 1;
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
            else if (!strcmp(a, "--device")) f->device = v, end = (char *)v + strlen(v);
            else if (!strcmp(a, "--speculative")) f->speculative = v, end = (char *)v + strlen(v);
            else if (!strcmp(a, "--spec-k")) f->spec_tokens = (int)strtol(v, &end, 10);
            else if (!strcmp(a, "--models-dir")) f->models_dir = v, end = (char *)v + strlen(v);
            else if (!strcmp(a, "--models-path")) f->models_path = v, end = (char *)v + strlen(v);
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
        if (!f->model) f->model = without_hub_host(a);
        else if (!f->prompt) f->prompt = a;
        else {
            fprintf(stderr, "exo run: unexpected argument '%s' (quote the prompt)\n", a);
            return -1;
        }
    }
    if (!f->model) return 1;
    if (f->tokens && f->prompt) {
        fprintf(stderr, "exo run: give a PROMPT or --tokens, not both\n");
        return -1;
    }
    if (f->max_tokens < 1) {
        fprintf(stderr, "exo run: --max-tokens must be at least 1\n");
        return -1;
    }
    return 0;
}

/* A directory as given, else the model store: --models-dir, --models-path, built-in models. */
static int resolve_model(const run_flags *f, char *out, size_t n) {
    char gguf[4096];
    if (paths_is_dir(f->model) || gguf_model_file(f->model, gguf, sizeof gguf)) {
        snprintf(out, n, "%s", f->model);
        return 0;
    }
    char dir[1024], err[256];
    const char *env = getenv("EXO_MODELS_DIR");
    if (f->models_dir) snprintf(dir, sizeof dir, "%s", f->models_dir);
    else if (env && env[0]) snprintf(dir, sizeof dir, "%s", env);
    else if (paths_default_data_dir(dir, sizeof dir - 8) == 0) strcat(dir, "/models");
    const char *path = f->models_path ? f->models_path : getenv("EXO_MODELS_PATH");
    model_store store;
    if (store_init(&store, dir, path, err, sizeof err) || store_id_valid(f->model, err, sizeof err)) {
        fprintf(stderr, "exo run: %s\n", err);
        return -1;
    }
    enum store_state st = store_locate(&store, f->model, out, n);
    if (st == STORE_COMPLETE) return 0;
    char why[1024];
    store_missing_reason(&store, f->model, why, sizeof why);
    const char *off = getenv("EXO_OFFLINE");
    int offline = f->offline || (off && off[0] && strcmp(off, "0") && strcmp(off, "false"));
    if (!offline && strchr(f->model, '/')) {
        /* Not here: fetch it (HF_ENDPOINT, resumable) into the models dir, with a progress bar. */
        fprintf(stderr, "exo run: %s: %s; downloading it into %s\n", f->model, why, dir);
        if (setenv("EXO_MODELS_DIR", dir, 1) == 0 &&
            download_model_blocking(f->model, download_progress_bar, stderr, out, n, err,
                                    sizeof err) == 0)
            return 0;
        fprintf(stderr, "exo run: cannot download '%s': %s\n", f->model, err);
        return -1;
    }
    fprintf(stderr, "exo run: no model '%s': %s (looked in %s%s%s and the built-in models)\n",
            f->model, strcmp(why, "it is not on disk") ? why : "not found", dir, path && path[0] ? ", " : "", path && path[0] ? path : "");
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

/* What one conversation needs besides the engine. */
typedef struct run_session {
    const run_flags *f;
    engine *e;
    tokenizer *tok;          /* NULL: token-id mode */
    chat_template *tmpl;     /* NULL: raw prompts */
    json_t *messages;        /* the conversation so far (chat mode) */
    int32_t stop_ids[4];
    int n_stop;
    uint64_t next_id;
    int harmony;             /* gpt-oss: the reply's channels are parsed (output_harmony.c) */
} run_session;

/* Token ids of the next prompt: the rendered conversation (chat) or the text itself (raw). */
static int encode_prompt(run_session *rs, const char *text, int32_t **ids, char *err,
                         size_t errlen) {
    if (!rs->tmpl) return tokenizer_encode(rs->tok, text, strlen(text), 1, ids, err, errlen);
    json_array_append_new(rs->messages,
                          json_pack("{s:s, s:s}", "role", "user", "content", text));
    chat_render_options ro = {.add_generation_prompt = 1,
                              .enable_thinking = rs->f->no_think ? 0 : -1,
                              .bos_token = tokenizer_bos_token(rs->tok),
                              .eos_token = tokenizer_eos_token(rs->tok)};
    char *prompt = chat_template_render(rs->tmpl, rs->messages, NULL, &ro, err, errlen);
    if (!prompt) return -1;
    int n = tokenizer_encode(rs->tok, prompt, strlen(prompt), 0, ids, err, errlen);
    free(prompt);
    return n;
}

/* Prints decoded text: as it is, or through the parser (reasoning to stderr, content to stdout);
 * what the conversation keeps goes to `reply`. final flushes the parser. */
static void print_reply(output_parser *parser, const char *piece, size_t len, int final, strbuf *reply) {
    if (!parser) {
        fwrite(piece, 1, len, stdout);
        strbuf_append(reply, piece, len);
        return;
    }
    output_delta d;
    output_parser_feed(parser, piece, len, &d);
    for (int pass = 0; pass < 1 + final; pass++) {
        if (pass) output_parser_finish(parser, &d);
        if (d.reasoning) fputs(d.reasoning, stderr);
        if (d.content) {
            fputs(d.content, stdout);
            strbuf_append_str(reply, d.content);
        }
        output_delta_free(&d);
    }
}

/* Generates one reply to `prompt` ids, streaming it; returns the reply text in chat mode. */
static int generate(run_session *rs, const int32_t *prompt, int n_prompt, char **reply) {
    const run_flags *f = rs->f;
    char err[512];
    engine_request req = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = f->max_tokens,
                          .stop_tokens = rs->stop_ids, .n_stop_tokens = rs->n_stop};
    req.sampling = sampling_params_default();
    req.sampling.temperature = f->temperature;
    req.sampling.seed = f->seed;
    uint64_t id = rs->next_id++;
    if (engine_submit(rs->e, id, &req, err, sizeof err) != 0) {
        fprintf(stderr, "exo run: %s\n", err);
        return -1;
    }
    /* gpt-oss: its markup is special tokens; the parser turns the channels into reasoning (to
     * stderr) and the answer (to stdout, and the conversation) */
    detokenizer *dt = rs->tok ? detokenizer_new(rs->tok, !rs->harmony) : NULL;
    output_parser *parser = rs->harmony ? output_parser_new(OUTPUT_FORMAT_HARMONY, 0, 0) : NULL;
    strbuf text = {0};
    char piece[1024];
    uint64_t start = clock_now_ns(), first = 0;
    int n_gen = 0, cached = 0, rc = 0;
    engine_finish fin = ENGINE_FINISH_NONE;
    engine_stats s0, s1;
    engine_get_stats(rs->e, &s0);
    while (engine_pending(rs->e)) {
        engine_event ev[32]; /* several tokens per step with speculation */
        int n = engine_step(rs->e, ev, 32);
        if (n < 0) {
            fprintf(stderr, "\nexo run: the engine failed\n");
            rc = -1;
            break;
        }
        for (int i = 0; i < n; i++) {
            cached = ev[i].cached_tokens;
            if (ev[i].token >= 0) {
                if (!n_gen++) first = clock_now_ns();
                if (dt) {
                    size_t len = detokenizer_push(dt, ev[i].token, piece, sizeof piece);
                    print_reply(parser, piece, len, 0, &text);
                } else {
                    printf("%s%d", n_gen > 1 ? " " : "", ev[i].token);
                }
                fflush(stdout);
            }
            if (ev[i].finish) fin = ev[i].finish;
            if (ev[i].finish == ENGINE_FINISH_ERROR) fprintf(stderr, "\nexo run: %s\n", ev[i].error);
        }
    }
    if (dt) {
        size_t len = detokenizer_flush(dt, piece, sizeof piece);
        print_reply(parser, piece, len, 1, &text);
        detokenizer_free(dt);
    }
    output_parser_free(parser);
    uint64_t end = clock_now_ns();
    printf("\n");
    fflush(stdout);
    if (n_gen) {
        double pre = (double)(first - start) / 1e9, dec = (double)(end - first) / 1e9;
        fprintf(stderr,
                "[prompt %d tokens (%d cached), %.1f tok/s | generated %d tokens, %.1f tok/s | "
                "%s]\n",
                n_prompt, cached, (n_prompt - cached) / (pre > 0 ? pre : 1e-9), n_gen,
                n_gen > 1 ? (n_gen - 1) / (dec > 0 ? dec : 1e-9) : 0.0,
                fin == ENGINE_FINISH_STOP ? "stop" : fin == ENGINE_FINISH_LENGTH ? "length" : "error");
    }
    engine_get_stats(rs->e, &s1);
    uint64_t drafted = s1.spec_drafted - s0.spec_drafted, kept = s1.spec_accepted - s0.spec_accepted;
    if (drafted)
        fprintf(stderr, "[speculative %s: %llu of %llu drafted tokens accepted (%.0f%%), %.2f "
                        "tokens per verifying step]\n",
                engine_speculative(rs->e), (unsigned long long)kept, (unsigned long long)drafted,
                100.0 * (double)kept / (double)drafted,
                (double)(kept + s1.spec_verifies - s0.spec_verifies) /
                    (double)(s1.spec_verifies - s0.spec_verifies));
    *reply = strbuf_detach(&text);
    return rc;
}

static int one_turn(run_session *rs, const char *text) {
    char err[512];
    int32_t *ids = NULL;
    int n;
    if (rs->f->tokens) {
        if (parse_ids(rs->f->tokens, &ids, &n) != 0) {
            fprintf(stderr, "exo run: --tokens wants comma-separated token ids\n");
            free(ids);
            return -1;
        }
    } else {
        n = encode_prompt(rs, text, &ids, err, sizeof err);
        if (n < 0) {
            fprintf(stderr, "exo run: %s\n", err);
            return -1;
        }
    }
    char *reply = NULL;
    int rc = generate(rs, ids, n, &reply);
    if (rc == 0 && rs->tmpl)
        json_array_append_new(rs->messages,
                              json_pack("{s:s, s:s}", "role", "assistant", "content", reply));
    free(reply);
    free(ids);
    return rc;
}

/* Loads the tokenizer and (unless --raw) the chat template; token-id mode needs neither. */
static int open_text(run_session *rs, const char *dir) {
    char err[512];
    if (rs->f->tokens) return 0;
    rs->tok = model_text_tokenizer_load(dir, err, sizeof err);
    if (!rs->tok) {
        fprintf(stderr, "exo run: %s (pass the prompt as --tokens 1,2,3 to run without one)\n", err);
        return -1;
    }
    int32_t eos = tokenizer_eos_token(rs->tok) ? tokenizer_token_id(rs->tok, tokenizer_eos_token(rs->tok)) : -1;
    if (eos >= 0) rs->stop_ids[rs->n_stop++] = eos;
    const char *src = tokenizer_chat_template(rs->tok);
    if (rs->f->raw || !src) {
        if (!rs->f->raw) fprintf(stderr, "exo run: the model has no chat template; prompts are raw\n");
        return 0;
    }
    rs->harmony = output_format_detect(NULL, src) == OUTPUT_FORMAT_HARMONY;
    for (const char *const *t = output_format_stop_tokens(rs->harmony ? OUTPUT_FORMAT_HARMONY : OUTPUT_FORMAT_PLAIN);
         *t && rs->n_stop < 4; t++) {
        int32_t id = tokenizer_token_id(rs->tok, *t);
        if (id >= 0) rs->stop_ids[rs->n_stop++] = id;
    }
    rs->tmpl = chat_template_compile(src, err, sizeof err);
    if (!rs->tmpl) {
        fprintf(stderr, "exo run: chat template: %s\n", err);
        return -1;
    }
    rs->messages = json_array();
    return 0;
}

int cmd_run_main(int argc, char **argv) {
    run_flags f;
    int pr = parse_flags(argc, argv, &f);
    if (pr == RUN_HELP) {
        usage(stdout);
        return 0;
    }
    if (pr != 0) {
        usage(stderr);
        return 2;
    }
    char dir[2048], derr[256];
    compute_device dev;
    if (compute_device_check(f.device, &dev, derr, sizeof derr) != 0) {
        fprintf(stderr, "exo run: %s\n", derr);
        return 2;
    }
    if (resolve_model(&f, dir, sizeof dir) != 0) return 1;
    run_session rs = {.f = &f, .next_id = 1};
    if (open_text(&rs, dir) != 0) return 1;
    char err[512] = "";
    uint64_t t0 = clock_now_ns();
    engine_options o = {.model_dir = dir, .n_threads = f.threads, .context_length = f.context,
                        .max_sequences = 1, .device = f.device,
                        .speculative = f.speculative, .spec_tokens = f.spec_tokens};
    rs.e = engine_open(&o, err, sizeof err);
    int rc = 0;
    if (!rs.e) {
        fprintf(stderr, "exo run: %s\n", err);
        rc = 1;
        goto done;
    }
    const engine_info *info = engine_get_info(rs.e);
    fprintf(stderr, "[loaded %s: %s, %d layers, context %d, in %.2f s]\n", dir,
            info->architecture, info->n_layers, info->context_length,
            (double)(clock_now_ns() - t0) / 1e9);
    if (f.prompt || f.tokens) {
        rc = one_turn(&rs, f.prompt) ? 1 : 0;
    } else { /* interactive chat */
        char line[8192];
        int tty = isatty(0);
        for (;;) {
            if (tty) fprintf(stderr, "> ");
            if (!fgets(line, sizeof line, stdin)) break;
            line[strcspn(line, "\n")] = 0;
            if (!line[0]) continue;
            if (one_turn(&rs, line) != 0) {
                rc = 1;
                break;
            }
        }
    }
done:
    engine_close(rs.e);
    chat_template_free(rs.tmpl);
    json_decref(rs.messages);
    tokenizer_free(rs.tok);
    return rc;
}
