/* perplexity — scores token sequences with exo's forward pass (arch/transformer on the CPU
 * backend) and prints the perplexity, to compare with what Hugging Face transformers reports for
 * the same model and ids (a real-model correctness check; see tests/fixtures/demo-dictionary/).
 *
 *   build/tools/perplexity MODEL_DIR IDS_FILE [--threads N] [--kv f32|f16|bf16]
 *
 * IDS_FILE holds one sequence per line, token ids separated by commas or spaces. Each sequence is
 * scored on its own (teacher forcing, one forward over all its tokens): the NLL of tokens 1..n-1
 * given their prefix, summed over all sequences; perplexity = exp(total NLL / predicted tokens).
 *
 * Refuses: sequences longer than the model's context or 4096 tokens; ids outside the vocab. */
#include "arch/transformer.h"
#include "infer/kv_cache.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 16
#define MAX_SEQ 4096

typedef struct seq_list {
    int32_t *ids;   /* all sequences back to back */
    int *start;     /* [n + 1] */
    int n, max_len;
} seq_list;

static int read_ids(const char *path, int vocab, seq_list *out) {
    FILE *f = fopen(path, "r");
    if (!f) return fprintf(stderr, "perplexity: cannot open %s\n", path), -1;
    size_t cap = 1 << 16, n = 0, scap = 1024;
    out->ids = malloc(cap * sizeof *out->ids);
    out->start = malloc(scap * sizeof *out->start);
    out->n = 0, out->max_len = 0, out->start[0] = 0;
    char *line = NULL;
    size_t lcap = 0;
    int rc = 0, lineno = 0;
    while (rc == 0 && getline(&line, &lcap, f) >= 0) {
        lineno++;
        size_t before = n;
        for (char *p = line, *end; *p; p = end) {
            while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
            if (!*p) break;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= vocab) {
                fprintf(stderr, "perplexity: %s line %d: bad token id (vocab %d)\n", path, lineno, vocab);
                rc = -1;
                break;
            }
            if (n == cap) out->ids = realloc(out->ids, (cap *= 2) * sizeof *out->ids);
            out->ids[n++] = (int32_t)v;
        }
        int len = (int)(n - before);
        if (rc || len == 0) continue;
        if (len > MAX_SEQ) {
            fprintf(stderr, "perplexity: %s line %d: %d tokens, more than %d\n", path, lineno, len, MAX_SEQ);
            rc = -1;
            break;
        }
        if ((size_t)out->n + 2 > scap) out->start = realloc(out->start, (scap *= 2) * sizeof *out->start);
        out->start[++out->n] = (int)n;
        if (len > out->max_len) out->max_len = len;
    }
    free(line);
    fclose(f);
    return rc;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *ids_path = NULL, *kv_name = "f32";
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) kv_name = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: perplexity MODEL_DIR IDS_FILE [--threads N] [--kv f32|f16|bf16]\n");
            return 2;
        } else if (!dir) dir = argv[i];
        else if (!ids_path) ids_path = argv[i];
    }
    if (!dir || !ids_path) {
        fprintf(stderr, "usage: perplexity MODEL_DIR IDS_FILE [--threads N] [--kv f32|f16|bf16]\n");
        return 2;
    }
    dtype kv_type = !strcmp(kv_name, "f16") ? DTYPE_F16 : !strcmp(kv_name, "bf16") ? DTYPE_BF16 : DTYPE_F32;
    char err[512];
    model_config cfg;
    if (model_config_load(dir, &cfg, err, sizeof err) != 0) return fprintf(stderr, "perplexity: %s\n", err), 1;
    seq_list s;
    if (read_ids(ids_path, cfg.vocab_size, &s) != 0 || s.n == 0) return 1;
    if (s.max_len > cfg.max_position_embeddings)
        return fprintf(stderr, "perplexity: a sequence is longer than the context\n"), 1;
    safetensors_set *st = safetensors_set_open(dir, err, sizeof err);
    model_weights w;
    if (!st || model_weights_load(st, &cfg, 0, 0, &w, err, sizeof err) != 0)
        return fprintf(stderr, "perplexity: %s\n", err), 1;
    compute_backend *be = compute_backend_cpu(threads);
    int T = s.max_len, nb = (T + BLOCK - 1) / BLOCK;
    transformer *tf = transformer_create(&cfg, &w, be, T, T, err, sizeof err);
    kv_cache *kv = tf ? kv_cache_create(be, cfg.n_layers, (int64_t)cfg.n_kv_heads * cfg.head_dim, BLOCK, nb + 1,
                                        kv_type, err, sizeof err)
                      : NULL;
    if (!tf || !kv) return fprintf(stderr, "perplexity: %s\n", err), 1;
    int32_t *pos = malloc((size_t)T * 4), *seq = calloc((size_t)T, 4), *slots = malloc((size_t)T * 4);
    int32_t *rows = malloc((size_t)T * 4), *blocks = malloc((size_t)nb * 4), zero = 0;
    float *logits = malloc((size_t)T * (size_t)cfg.vocab_size * sizeof(float));
    double nll = 0;
    long predicted = 0;
    for (int q = 0; q < s.n; q++) {
        const int32_t *ids = s.ids + s.start[q];
        int n = s.start[q + 1] - s.start[q];
        if (n < 2) continue;
        int nblk = (n + BLOCK - 1) / BLOCK;
        for (int b = 0; b < nblk; b++) blocks[b] = kv_cache_alloc_block(kv);
        for (int i = 0; i < n; i++) {
            pos[i] = i, rows[i] = i;
            slots[i] = blocks[i / BLOCK] * BLOCK + i % BLOCK;
        }
        transformer_batch b = {.n_tokens = n, .tokens = ids, .positions = pos, .seq_of_token = seq,
                               .slots = slots, .n_seqs = 1, .block_table_start = &zero,
                               .block_tables = blocks, .n_block_entries = nblk, .n_logits = n - 1,
                               .logit_rows = rows};
        if (transformer_forward(tf, kv->layers, BLOCK, &b, logits, err, sizeof err) != 0)
            return fprintf(stderr, "perplexity: %s\n", err), 1;
        for (int i = 0; i < n - 1; i++) {
            const float *row = logits + (size_t)i * (size_t)cfg.vocab_size;
            float mx = row[0];
            for (int v = 1; v < cfg.vocab_size; v++) mx = row[v] > mx ? row[v] : mx;
            double sum = 0;
            for (int v = 0; v < cfg.vocab_size; v++) sum += exp((double)row[v] - mx);
            nll += (double)mx + log(sum) - (double)row[ids[i + 1]];
        }
        predicted += n - 1;
        for (int bk = 0; bk < nblk; bk++) kv_cache_release_block(kv, blocks[bk]);
    }
    printf("sequences %d predicted_tokens %ld nll %.6f perplexity %.6f\n", s.n, predicted, nll,
           exp(nll / (double)predicted));
    free(pos), free(seq), free(slots), free(rows), free(blocks), free(logits);
    free(s.ids), free(s.start);
    kv_cache_destroy(kv);
    transformer_destroy(tf);
    be->destroy(be);
    model_weights_free(&w);
    safetensors_set_close(st);
    return 0;
}
