/* engine-pace — the engine alone, for the API overhead benchmark (bench/api/overhead.mjs): loads
 * a model once, renders one user message with the model's chat template exactly as a runner
 * does, and for every line read on stdin generates TOKENS tokens with EOS banned (what
 * /bench/chat/completions asks the runner for; greedy, as bench/api/overhead.mjs asks), printing
 * one JSON line per generation:
 *   {"tokens":N,"ttft_ms":submit->first token,"per_token_ms":(last-first)/(N-1)}
 * Timestamps are taken when engine_step returns a token, the same place the runner stamps them.
 *
 *   build/tools/engine-pace MODEL_DIR "PROMPT" TOKENS THREADS
 *
 * It refuses: everything a runner does after the engine (detokenizing, stop strings, the output
 * parser, the socket) — that is the API path whose cost the benchmark measures. */
#include "base/clock.h"
#include "infer/engine.h"
#include "text/chat.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: engine-pace MODEL_DIR PROMPT TOKENS THREADS\n");
        return 2;
    }
    const char *dir = argv[1], *prompt_text = argv[2];
    int tokens = atoi(argv[3]), threads = atoi(argv[4]);
    char err[512];
    tokenizer *tok = tokenizer_load(dir, err, sizeof err);
    if (!tok) {
        fprintf(stderr, "engine-pace: %s\n", err);
        return 1;
    }
    engine_options eo = {.model_dir = dir, .n_threads = threads};
    engine *e = engine_open(&eo, err, sizeof err);
    if (!e) {
        fprintf(stderr, "engine-pace: %s\n", err);
        return 1;
    }
    char *prompt = NULL;
    const char *src = tokenizer_chat_template(tok);
    chat_template *t = src ? chat_template_compile(src, err, sizeof err) : NULL;
    if (t) {
        json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", prompt_text);
        chat_render_options o = {.add_generation_prompt = 1, .enable_thinking = -1,
                                 .bos_token = tokenizer_bos_token(tok),
                                 .eos_token = tokenizer_eos_token(tok)};
        prompt = chat_template_render(t, msgs, NULL, &o, err, sizeof err);
        json_decref(msgs);
        chat_template_free(t);
    }
    if (!prompt) prompt = strdup(prompt_text);
    int32_t *ids = NULL;
    int n = tokenizer_encode(tok, prompt, strlen(prompt), 0, &ids, err, sizeof err);
    free(prompt);
    if (n <= 0) {
        fprintf(stderr, "engine-pace: cannot tokenize the prompt: %s\n", err);
        return 1;
    }
    engine_event ev[64];
    char line[64];
    printf("{\"ready\":true,\"prompt_tokens\":%d}\n", n);
    fflush(stdout);
    for (uint64_t id = 1; fgets(line, sizeof line, stdin); id++) {
        engine_request q = {.prompt = ids, .n_prompt = n, .sampling = sampling_params_default(),
                            .max_tokens = tokens, .ban_eos = 1};
        q.sampling.temperature = 0; /* greedy, as the benchmark's requests ask */
        uint64_t t0 = clock_now_ns(), first = 0, last = 0;
        if (engine_submit(e, id, &q, err, sizeof err)) {
            fprintf(stderr, "engine-pace: %s\n", err);
            return 1;
        }
        int got = 0;
        while (engine_pending(e)) {
            int k = engine_step(e, ev, 64);
            if (k < 0) return 1;
            uint64_t now = clock_now_ns();
            for (int i = 0; i < k; i++)
                if (ev[i].token >= 0) {
                    if (!got++) first = now;
                    last = now;
                }
        }
        printf("{\"tokens\":%d,\"ttft_ms\":%.3f,\"per_token_ms\":%.4f}\n", got,
               (double)(first - t0) / 1e6, got > 1 ? (double)(last - first) / 1e6 / (got - 1) : 0.0);
        fflush(stdout);
    }
    free(ids);
    engine_close(e);
    tokenizer_free(tok);
    return 0;
}
