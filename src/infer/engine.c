/* The engine: model + KV cache + scheduler + sampler behind engine.h.
 *
 * Scheduling, one engine_step at a time (continuous batching):
 *   1. report cancellations;
 *   2. decode: every running sequence whose prompt is done contributes its one pending token;
 *      when the cache has no block for it, the newest running sequence is preempted (its blocks
 *      freed, it goes back to waiting and is recomputed later: outputs do not change);
 *   3. prefill: sequences still processing their prompt, then waiting ones while fewer than
 *      max_sequences run, take chunks of what is left of max_batch_tokens -- short remainders
 *      first, so a short request arriving during a long prefill starts at the next step; a step
 *      that gives some prompt its first token caps the step to an eighth of the budget (long
 *      prefills still get at least a block), so that step is short too;
 *   4. one forward over the flat batch; every sequence whose chunk reached its last known token
 *      samples its next token.
 * Hybrid models (GatedDeltaNet layers, model_config_is_hybrid) also keep a recurrent state per
 * running sequence: a slot is taken when it is first batched and given back when it finishes or
 * is preempted (a recomputed sequence starts again at position 0, which resets its state). A
 * cached prefix restores both: the state after a prefix is snapshotted whenever a sequence's
 * computed tokens end on a block boundary (prefill chunks are cut there: at the prompt's last
 * boundary, and at a boundary when the budget splits a prompt; decode crosses one every block,
 * unless a step of verified drafts steps over it), and admission takes the longest cached prefix
 * that has a snapshot. Not in an overlapped pipeline, whose stages run a sequence's next chunk
 * before its previous one is applied.
 * Refuses: prompts that cannot fit the context or the whole cache (engine_submit fails). */
#include "infer/engine_internal.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "compute/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void engine_set_error(engine *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->error, sizeof e->error, fmt, ap);
    va_end(ap);
}

const char *engine_last_error(const engine *e) { return e->error; }

static size_t available_memory(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    size_t kb = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb ? kb * 1024 : (size_t)2 << 30;
}

static int open_kv(engine *e, const engine_options *o, char *err, size_t errlen) {
    const model_config *c = &e->cfg;
    int n_local = e->w.layer_end - e->w.layer_start;
    int64_t kv_dim = (int64_t)(c->n_kv_heads / e->w.tp_size) * c->head_dim;
    dtype type = DTYPE_F16;
    const char *name = o->kv_cache_dtype;
    if (name && !strcmp(name, "f32")) type = DTYPE_F32;
    else if (name && !strcmp(name, "bf16")) type = DTYPE_BF16;
    else if (name && strcmp(name, "f16")) {
        error_set(err, errlen, "KV cache dtype '%.16s' is not one of f16, bf16, f32", name);
        return -1;
    }
    size_t block_bytes = kv_cache_block_bytes(n_local, kv_dim, e->block_size, type);
    size_t bytes = o->kv_cache_bytes;
    if (!bytes) { /* enough for every sequence at full context, within a quarter of free RAM
                   * (on a GPU: 80% of what the weights and buffers left free) */
        size_t want = (size_t)e->max_sequences * (size_t)e->info.context_length /
                      (size_t)e->block_size * block_bytes + block_bytes;
        size_t cap = available_memory() / 4, gpu_free = 0, gpu_total = 0;
        if (e->be->memory_info && e->be->memory_info(e->be, &gpu_free, &gpu_total) == 0)
            cap = gpu_free / 10 * 8;
        bytes = want < cap ? want : cap;
    }
    size_t n_blocks = bytes / block_bytes;
    if (n_blocks < 2) {
        error_set(err, errlen,
                  "KV cache budget of %zu bytes holds fewer than 2 blocks of %zu bytes", bytes,
                  block_bytes);
        return -1;
    }
    if (n_blocks > (1u << 30)) n_blocks = 1u << 30;
    int agreed = (int)n_blocks;
    if (e->dist && engine_dist_agree(e, &agreed, err, errlen)) return -1;
    e->kv = kv_cache_create(e->be, n_local, kv_dim, e->block_size, agreed, type, err, errlen);
    return e->kv ? 0 : -1;
}

static int alloc_staging(engine *e) {
    int T = e->max_batch_tokens > e->max_sequences ? e->max_batch_tokens : e->max_sequences;
    e->max_batch_tokens = T;
    e->b_tokens = malloc((size_t)T * 4);
    e->b_positions = malloc((size_t)T * 4);
    e->b_seq = malloc((size_t)T * 4);
    e->b_slots = malloc((size_t)T * 4);
    e->b_table_start = malloc((size_t)T * 4);
    e->b_logit_rows = malloc((size_t)T * 4);
    e->b_members = malloc((size_t)T * sizeof *e->b_members);
    int samples_here = e->w.has_head && e->d.rank == e->d.head_rank; /* 0, 0 in one process */
    if (samples_here) /* only the sampling rank sees whole logits */
        e->logits = malloc((size_t)e->max_logit_rows * (size_t)e->cfg.vocab_size * sizeof(float));
    e->samples = calloc((size_t)e->max_logit_rows, sizeof *e->samples);
    /* a hybrid that speculates keeps a second state per sequence (speculative.c) */
    e->n_sequence_slots = e->max_sequences * (e->hybrid && e->drafter ? 2 : 1);
    e->free_slots = malloc((size_t)e->n_sequence_slots * sizeof *e->free_slots);
    e->b_state_slots = malloc((size_t)e->max_sequences * sizeof *e->b_state_slots);
    for (int i = 0; e->free_slots && i < e->n_sequence_slots; i++)
        e->free_slots[e->n_free_slots++] = e->n_sequence_slots - 1 - i;
    if (!e->free_slots || !e->b_state_slots) return -1;
    e->backend_params = calloc((size_t)e->max_logit_rows, sizeof *e->backend_params);
    e->backend_results = calloc((size_t)e->max_logit_rows, sizeof *e->backend_results);
    e->seqs = calloc((size_t)e->max_sequences * 4 + 16, sizeof *e->seqs);
    return e->b_tokens && e->b_positions && e->b_seq && e->b_slots && e->b_table_start &&
                   e->b_logit_rows && e->b_members && (e->logits || !samples_here) &&
                   e->samples && e->backend_params && e->backend_results && e->seqs &&
                   sampler_scratch_init(&e->sampler, e->cfg.vocab_size) == 0
               ? 0
               : -1;
}

static int prepare_weight(weight_matrix *m, void *backend) {
    compute_backend *b = backend;
    return b->prepare_weight(b, m);
}

typedef struct weight_loading {
    compute_backend *be;
    char *err;
    size_t errlen;
    int failed;
} weight_loading;

static void load_weight(weight_matrix *m, void *ctx) {
    weight_loading *wl = ctx;
    if (!wl->failed && m->data && wl->be->load_weight(wl->be, m, wl->err, wl->errlen) != 0)
        wl->failed = 1;
}

/* The backend for o->device, described in info->device. Some work runs on the CPU only
 * (cpu_only names it, else NULL): a tensor-parallel rank, whose all-reduce (dist/) sums host
 * memory between backend ops, which a GPU backend's buffers and recorded steps are not. There
 * `auto` picks the CPU and an explicit `cuda` is refused. */
static int open_backend(engine *e, const engine_options *o, const char *cpu_only, char *err,
                        size_t errlen) {
    compute_device asked, d;
    if (compute_device_parse(o->device, &asked, err, errlen) != 0) return -1;
    d = compute_device_resolve(asked);
    if (cpu_only && d == COMPUTE_DEVICE_CUDA) {
        if (asked == COMPUTE_DEVICE_CUDA) {
            int tp = !strcmp(cpu_only, "tensor parallel");
            error_set(err, errlen, "--device cuda: %s runs on the CPU only (use --device cpu%s)",
                      cpu_only, tp ? ", or a pipeline split on GPUs" : "");
            return -1;
        }
        log_info("engine: %s runs on the CPU (device auto)", cpu_only);
        d = COMPUTE_DEVICE_CPU;
    }
    e->be = compute_backend_open(d, o->n_threads, err, errlen);
    if (!e->be) return -1;
    char why[256];
    if (asked == COMPUTE_DEVICE_AUTO && d == COMPUTE_DEVICE_CUDA &&
        transformer_backend_check(&e->cfg, e->be, why, sizeof why) != 0) {
        log_info("engine: %s; device auto: running on the CPU", why);
        e->be->destroy(e->be);
        d = COMPUTE_DEVICE_CPU;
        e->be = compute_backend_open(d, o->n_threads, err, errlen);
        if (!e->be) return -1;
    }
    compute_gpu g;
    e->info.on_gpu = d == COMPUTE_DEVICE_CUDA;
    if (e->info.on_gpu && compute_gpu_get(0, &g) == 0)
        snprintf(e->info.device, sizeof e->info.device, "cuda (%s, %.1f GB)", g.name,
                 (double)g.memory_total / 1e9);
    else
        snprintf(e->info.device, sizeof e->info.device, "%s", compute_device_name(d));
    return 0;
}

engine *engine_open(const engine_options *o, char *err, size_t errlen) {
    engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    if (model_config_load(o->model_dir, &e->cfg, err, errlen) != 0) goto fail;
    const model_config *c = &e->cfg;
    model_shard shard = {.layer_start = o->layer_start, .layer_end = o->layer_end};
    if (o->dist && engine_dist_init(e, o, &shard, err, errlen)) goto fail;
    /* only the files holding this stage's tensors: a node may have downloaded just those */
    e->st = safetensors_set_open_stage(o->model_dir, c->n_layers, c->tie_word_embeddings,
                                       shard.layer_start, shard.layer_end, err, errlen);
    if (!e->st) goto fail;
    const char *cpu_only = shard.tp_size > 1 ? "tensor parallel" : NULL;
    if (open_backend(e, o, cpu_only, err, errlen) != 0) goto fail;
    /* a backend with memory of its own copies the weights there: no host copy first */
    shard.memory = e->be->load_weight ? WEIGHTS_MEM_MMAP : WEIGHTS_MEM_AUTO;
    if (model_weights_load_shard(e->st, c, &shard, &e->w, err, errlen)) goto fail;
    /* the views now read the arena's copy: a GGUF file's converted tensors are garbage */
    if (e->w.arena) safetensors_set_drop_built(e->st);
    if (e->be->load_weight) {
        weight_loading wl = {.be = e->be, .err = err, .errlen = errlen};
        model_weights_for_each(&e->w, load_weight, &wl);
        if (wl.failed) goto fail;
    }
    if (e->be->prepare_weight) model_weights_rewrite(&e->w, prepare_weight, e->be);
    e->max_batch_tokens = o->max_batch_tokens > 0 ? o->max_batch_tokens : 512;
    e->hybrid = model_config_is_hybrid(c);
    /* a hybrid's recurrent state costs every slot its full size up front (Qwen3.5-9B: ~50 MB) */
    e->max_sequences = o->max_sequences > 0 ? o->max_sequences : e->hybrid ? 16 : 64;
    e->block_size = ENGINE_BLOCK_SIZE;
    engine_info *info = &e->info;
    snprintf(info->architecture, sizeof info->architecture, "%s", c->architecture);
    info->vocab_size = c->vocab_size;
    info->context_length = o->context_length > 0 && o->context_length < c->max_position_embeddings
                               ? o->context_length
                               : c->max_position_embeddings;
    info->n_layers = c->n_layers;
    info->n_eos = c->n_eos;
    memcpy(info->eos_ids, c->eos_ids, sizeof info->eos_ids);
    info->bos_id = c->bos_id;
    info->weight_bytes = e->w.bytes_per_token;
    int spec_rows = 0;
    if (spec_open(e, o, &spec_rows, err, errlen) != 0) goto fail;
    e->max_logit_rows = e->max_sequences + spec_rows;
    if (alloc_staging(e) != 0) goto oom;
    e->tf = transformer_create(c, &e->w, e->be, e->max_batch_tokens, e->max_logit_rows, err,
                               errlen);
    if (!e->tf || (e->dist && engine_dist_start(e, err, errlen)) || open_kv(e, o, err, errlen))
        goto fail;
    if (e->hybrid) { /* as many snapshots as sequences: each can leave its prefix behind */
        e->n_snapshots = e->max_sequences;
        e->snapshots = calloc((size_t)e->n_snapshots, sizeof *e->snapshots);
        if (!e->snapshots ||
            transformer_reserve_state_slots(e->tf, e->n_sequence_slots + e->n_snapshots, err,
                                            errlen))
            goto fail;
    }
    return e;
oom:
    error_set(err, errlen, "out of memory opening %s", o->model_dir);
fail:
    engine_close(e);
    return NULL;
}

static void release_state_slot(engine *e, sequence *s) {
    if (s->state_slot >= 0) e->free_slots[e->n_free_slots++] = s->state_slot;
    if (s->spare_slot >= 0) e->free_slots[e->n_free_slots++] = s->spare_slot;
    s->state_slot = s->spare_slot = -1;
    s->catch_up = 0; /* a recomputed sequence starts over at position 0 */
}

/* Whether hybrid prefixes are reused (see the top of this file). */
static int hybrid_prefix_reuse(const engine *e) {
    return e->hybrid && e->snapshots && e->pipeline_steps <= 1;
}

static int find_snapshot(const engine *e, uint64_t hash) {
    for (int i = 0; i < e->n_snapshots; i++)
        if (e->snapshots[i].hash == hash) return i;
    return -1;
}

/* After a step: snapshots s's state when its computed tokens end on a registered block. */
static void snapshot_take(engine *e, sequence *s) {
    int bs = e->block_size;
    if (!hybrid_prefix_reuse(e) || s->no_prefix_cache || s->state_slot < 0 || s->n_computed == 0 ||
        s->n_computed % bs || s->n_hashed * bs != s->n_computed)
        return;
    int k = find_snapshot(e, s->last_hash);
    if (k < 0) { /* an unused one, else the least recently used */
        k = 0;
        for (int i = 1; i < e->n_snapshots && e->snapshots[k].hash; i++)
            if (!e->snapshots[i].hash || e->snapshots[i].used < e->snapshots[k].used) k = i;
        transformer_copy_state(e->tf, e->n_sequence_slots + k, s->state_slot);
        e->snapshots[k].hash = s->last_hash;
    }
    e->snapshots[k].used = ++e->snapshot_tick;
}

void engine_free_sequence(engine *e, sequence *s) {
    spec_forget_sequence(e, s);
    if (s->constraint.ctx && s->constraint.release) s->constraint.release(s->constraint.ctx);
    release_state_slot(e, s);
    for (int i = 0; i < s->n_blocks; i++) kv_cache_release_block(e->kv, s->blocks[i]);
    free(s->blocks);
    free(s->tokens);
    free(s->stops);
    free(s);
}

void engine_close(engine *e) {
    if (!e) return;
    if (e->dist) engine_dist_close(e); /* rank 0: tells the followers to stop */
    for (int i = 0; i < e->n_seqs; i++) engine_free_sequence(e, e->seqs[i]);
    spec_close(e);
    kv_cache_destroy(e->kv);
    transformer_destroy(e->tf);
    if (e->be) e->be->destroy(e->be);
    model_weights_free(&e->w);
    safetensors_set_close(e->st);
    sampler_scratch_free(&e->sampler);
    free(e->b_tokens);
    free(e->b_positions);
    free(e->b_seq);
    free(e->b_slots);
    free(e->b_table_start);
    free(e->b_logit_rows);
    free(e->b_tables);
    free(e->b_members);
    free(e->free_slots);
    free(e->b_state_slots);
    free(e->snapshots);
    free(e->logits);
    free(e->backend_params);
    free(e->backend_results);
    free(e->samples);
    free(e->seqs);
    free(e->cancelled);
    free(e);
}

const engine_info *engine_get_info(const engine *e) {
    return &e->info;
}

void engine_get_stats(const engine *e, engine_stats *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < e->n_seqs; i++) {
        if (e->seqs[i]->state == SEQ_RUNNING) out->n_running++;
        else out->n_waiting++;
    }
    out->kv_blocks_total = e->kv->n_blocks;
    out->kv_blocks_free = kv_cache_available(e->kv);
    out->kv_blocks_cached = e->kv->n_cached;
    out->kv_block_tokens = e->block_size;
    out->preemptions = e->preemptions;
    out->steps = e->steps;
    out->step_ns = e->step_ns;
    out->comm_ns = e->comm_ns;
    out->spec_verifies = e->spec_verifies;
    out->spec_drafted = e->spec_drafted;
    out->spec_accepted = e->spec_accepted;
}

const char *engine_speculative(const engine *e) {
    return e->drafter ? e->drafter->name : NULL;
}

int engine_pending(const engine *e) {
    return e->n_seqs + e->n_cancelled + e->d.queued_submits;
}

static sequence *find_seq(const engine *e, uint64_t id, int *index) {
    for (int i = 0; i < e->n_seqs; i++)
        if (e->seqs[i]->id == id) {
            if (index) *index = i;
            return e->seqs[i];
        }
    return NULL;
}

int engine_submit(engine *e, uint64_t seq_id, const engine_request *r, char *err, size_t errlen) {
    if (find_seq(e, seq_id, NULL)) {
        error_set(err, errlen, "sequence id %llu is already live", (unsigned long long)seq_id);
        return -1;
    }
    if (!r->prompt || r->n_prompt < 1) {
        error_set(err, errlen, "the prompt is empty");
        return -1;
    }
    if (r->max_tokens < 1) {
        error_set(err, errlen, "max_tokens must be at least 1");
        return -1;
    }
    int ctx = e->info.context_length;
    if (r->n_prompt >= ctx) {
        error_set(err, errlen, "prompt of %d tokens does not fit the context length %d",
                  r->n_prompt, ctx);
        return -1;
    }
    if (r->n_prompt + 1 > e->kv->n_blocks * e->block_size) {
        error_set(err, errlen, "prompt of %d tokens does not fit the KV cache (%d tokens)",
                  r->n_prompt, e->kv->n_blocks * e->block_size);
        return -1;
    }
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->cfg.vocab_size) {
            error_set(err, errlen, "prompt token %d (id %d) is outside the vocabulary of %d", i,
                      r->prompt[i], e->cfg.vocab_size);
            return -1;
        }
    if (sampler_params_check(&r->sampling, err, errlen) != 0) return -1;
    int queued = e->n_seqs + e->d.queued_submits;
    if (queued >= e->max_sequences * 4 + 16) {
        error_set(err, errlen, "too many queued requests (%d)", queued);
        return -1;
    }
    if (e->dist) return engine_dist_queue_submit(e, seq_id, r, err, errlen);
    if (engine_add_sequence(e, seq_id, r)) {
        error_set(err, errlen, "out of memory queueing a request");
        return -1;
    }
    return 0;
}

int engine_add_sequence(engine *e, uint64_t seq_id, const engine_request *r) {
    int ctx = e->info.context_length;
    sequence *s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->id = seq_id;
    s->state_slot = s->spare_slot = -1;
    s->serial = ++e->next_serial;
    s->n_prompt = s->n_tokens = r->n_prompt;
    int max_total = r->n_prompt + r->max_tokens;
    s->cap = max_total < ctx ? max_total : ctx;
    s->max_tokens = r->max_tokens;
    s->tokens = malloc((size_t)s->cap * sizeof *s->tokens);
    s->n_stops = e->info.n_eos + (r->n_stop_tokens > 0 ? r->n_stop_tokens : 0);
    s->stops = malloc((size_t)(s->n_stops + 1) * sizeof *s->stops);
    if (!s->tokens || !s->stops) {
        free(s->tokens);
        free(s->stops);
        free(s);
        return -1;
    }
    memcpy(s->tokens, r->prompt, (size_t)r->n_prompt * sizeof *s->tokens);
    memcpy(s->stops, e->info.eos_ids, (size_t)e->info.n_eos * sizeof *s->stops);
    if (r->n_stop_tokens > 0)
        memcpy(s->stops + e->info.n_eos, r->stop_tokens, (size_t)r->n_stop_tokens * 4);
    s->ban_eos = r->ban_eos;
    s->no_prefix_cache = r->no_prefix_cache;
    s->sampling = r->sampling;
    s->constraint = r->constraint;
    sampler_rng_seed(&s->rng, r->sampling.seed);
    spec_init_sequence(e, s, r);
    e->seqs[e->n_seqs++] = s;
    return 0;
}

static void remove_seq(engine *e, int index) {
    engine_free_sequence(e, e->seqs[index]);
    memmove(&e->seqs[index], &e->seqs[index + 1],
            (size_t)(e->n_seqs - index - 1) * sizeof *e->seqs);
    e->n_seqs--;
}

void engine_cancel(engine *e, uint64_t seq_id) {
    if (e->dist) engine_dist_queue_cancel(e, seq_id);
    else engine_cancel_local(e, seq_id);
}

void engine_cancel_local(engine *e, uint64_t seq_id) {
    int i;
    if (!find_seq(e, seq_id, &i)) return;
    remove_seq(e, i);
    if (e->n_cancelled == e->cancelled_cap) {
        int cap = e->cancelled_cap ? e->cancelled_cap * 2 : 16;
        uint64_t *n = realloc(e->cancelled, (size_t)cap * sizeof *n);
        if (!n) return; /* the sequence is gone; only its event is lost */
        e->cancelled = n;
        e->cancelled_cap = cap;
    }
    e->cancelled[e->n_cancelled++] = seq_id;
}

/* Frees a sequence's cache and sends it back to waiting: it is recomputed when readmitted. */
static void preempt(engine *e, sequence *s) {
    for (int i = 0; i < s->n_blocks; i++) kv_cache_release_block(e->kv, s->blocks[i]);
    s->n_blocks = 0;
    s->n_computed = 0;
    s->n_hashed = 0;
    s->last_hash = 0;
    s->state = SEQ_WAITING;
    release_state_slot(e, s);
    e->preemptions++;
}

int engine_ensure_blocks(engine *e, sequence *s, int n_pos) {
    int need = (n_pos + e->block_size - 1) / e->block_size;
    if (need > s->blocks_cap) {
        int cap = need * 2;
        int32_t *n = realloc(s->blocks, (size_t)cap * sizeof *n);
        if (!n) return -1;
        s->blocks = n;
        s->blocks_cap = cap;
    }
    while (s->n_blocks < need) {
        int32_t b = kv_cache_alloc_block(e->kv);
        if (b < 0) return -1;
        s->blocks[s->n_blocks++] = b;
    }
    return 0;
}

/* Admission of a hybrid: keeps the longest of the cached blocks s found whose state has a
 * snapshot, and restores that state into a slot of its own. */
static void restore_state(engine *e, sequence *s) {
    int bs = e->block_size, keep = s->n_blocks, k = -1;
    uint64_t h = s->last_hash;
    while (keep > 0 && (k = find_snapshot(e, h)) < 0) { /* the chain hash one block shorter */
        keep--;
        h = 0;
        for (int i = 0; i < keep; i++) h = kv_cache_chain_hash(h, s->tokens + (size_t)i * bs, bs);
    }
    if (keep > 0 && s->state_slot < 0 && e->n_free_slots > 0)
        s->state_slot = e->free_slots[--e->n_free_slots];
    if (keep > 0 && s->state_slot < 0) keep = 0; /* cannot happen: a slot per admitted sequence */
    for (int i = keep; i < s->n_blocks; i++) kv_cache_release_block(e->kv, s->blocks[i]);
    s->n_blocks = s->n_hashed = keep;
    s->n_computed = keep * bs;
    s->last_hash = keep ? h : 0;
    if (!keep) return;
    transformer_copy_state(e->tf, s->state_slot, e->n_sequence_slots + k);
    e->snapshots[k].used = ++e->snapshot_tick;
}

/* Admission: shares the cached blocks that hold s's leading full blocks of tokens. At least one
 * token is always left to compute, so the step has logits to sample from. */
static void take_cached_prefix(engine *e, sequence *s) {
    int bs = e->block_size;
    int max_hits = (s->n_tokens - 1) / bs;
    if (s->no_prefix_cache || (e->hybrid && !hybrid_prefix_reuse(e))) return;
    if (max_hits > 0 && s->blocks_cap < max_hits) {
        int32_t *n = realloc(s->blocks, (size_t)max_hits * 2 * sizeof *n);
        if (!n) return;
        s->blocks = n;
        s->blocks_cap = max_hits * 2;
    }
    while (s->n_blocks < max_hits) {
        const int32_t *tok = s->tokens + (size_t)s->n_blocks * bs;
        uint64_t h = kv_cache_chain_hash(s->last_hash, tok, bs);
        int32_t b = kv_cache_lookup(e->kv, h, s->last_hash, tok);
        if (b < 0) break;
        s->blocks[s->n_blocks++] = b;
        s->last_hash = h;
        s->n_hashed = s->n_blocks;
        s->n_computed = s->n_blocks * bs;
    }
    if (e->hybrid) restore_state(e, s);
    if (!s->admitted) s->cached_tokens = s->n_computed < s->n_prompt ? s->n_computed : s->n_prompt;
    s->admitted = 1;
}

/* Registers the blocks s has completed since the last step in the prefix cache. */
static void register_full_blocks(engine *e, sequence *s) {
    int bs = e->block_size;
    while ((s->n_hashed + 1) * bs <= s->n_computed) {
        const int32_t *tok = s->tokens + (size_t)s->n_hashed * bs;
        uint64_t h = kv_cache_chain_hash(s->last_hash, tok, bs);
        if (!s->no_prefix_cache) kv_cache_register(e->kv, s->blocks[s->n_hashed], h, s->last_hash, tok);
        s->last_hash = h;
        s->n_hashed++;
    }
}

/* The newest running sequence holding blocks that is not already in this step's batch. */
static sequence *newest_running(engine *e, const sequence *keep) {
    for (int i = e->n_seqs - 1; i >= 0; i--) {
        sequence *s = e->seqs[i];
        if (s->state == SEQ_RUNNING && s != keep && s->n_blocks && !s->chunk && !s->in_flight)
            return s;
    }
    return NULL;
}

/* A hybrid's prefill chunk, cut to end on a block boundary where its state can be snapshotted:
 * the prompt's last boundary (before its last token), or, when the budget ends the chunk before
 * that, the last boundary inside the chunk. */
static int snapshot_aligned_chunk(const engine *e, const sequence *s, int chunk) {
    int bs = e->block_size, start = s->n_computed, end = start + chunk;
    int last_boundary = (s->n_tokens - 1) / bs * bs;
    if (last_boundary > start && end > last_boundary) return last_boundary - start;
    int aligned = end / bs * bs;
    return end < s->n_tokens && aligned > start ? aligned - start : chunk;
}

/* Chooses this step's chunk for every live sequence. Returns the number of batch members. */
static int plan_batch(engine *e, int max_members) {
    int budget = e->max_batch_tokens, n_members = 0, running = 0;
    for (int i = 0; i < e->n_seqs; i++) {
        e->seqs[i]->chunk = 0;
        e->seqs[i]->logit_index = -1;
        /* a sequence in flight (overlapped pipeline) keeps its drafts until its step applies */
        if (!e->seqs[i]->in_flight) e->seqs[i]->n_draft = 0;
        running += e->seqs[i]->state == SEQ_RUNNING;
    }
    /* a pipeline with steps in flight: each step decodes its share of the running sequences, so
     * the next steps have sequences to carry and every stage works (engine_dist.c) */
    int decode_cap = max_members;
    if (e->pipeline_steps > 1) {
        int share = (running + e->pipeline_steps - 1) / e->pipeline_steps;
        decode_cap = share > 0 && share < decode_cap ? share : decode_cap;
    }
    /* decode first: one token each (a hybrid catching up after rejected drafts: the tokens since
     * its restored state); when the cache is full, the newest sequence yields */
    for (int i = 0; i < e->n_seqs && budget > 0 && n_members < decode_cap; i++) {
        sequence *s = e->seqs[i];
        int left = s->n_tokens - s->n_computed;
        if (s->state != SEQ_RUNNING || s->in_flight || (left != 1 && !s->catch_up) ||
            left > budget)
            continue;
        int ok;
        while (!(ok = engine_ensure_blocks(e, s, s->n_tokens) == 0)) {
            sequence *victim = newest_running(e, s);
            if (!victim) break;
            preempt(e, victim);
            running--;
        }
        if (!ok) {
            preempt(e, s);
            running--;
            continue;
        }
        s->chunk = left;
        budget -= left;
        e->b_members[n_members++] = s;
    }
/* prefill, in four passes so a short prompt never waits behind a long one: short remainders
     * (<= a quarter of the budget) of running then waiting sequences, then long remainders of
     * running then waiting ones, each pass oldest first */
    int short_limit = e->max_batch_tokens / 4 > 0 ? e->max_batch_tokens / 4 : 1;
    int admission_stuck = 0, first_token_soon = 0;
    for (int pass = 0; pass < 4; pass++) {
        int want_waiting = pass % 2, want_short = pass < 2;
        if (pass == 2 && first_token_soon) {
            /* a short prompt gets its first token from this step: keep the step short (an eighth
             * of the budget, at least a block, for long prefills), so its time to first token is
             * the step it arrived during plus a fraction of a chunk. Long
             * prefills still advance (at least a block), so a stream of short arrivals slows a
             * long prompt but cannot starve it. */
            int used = e->max_batch_tokens - budget, eighth = e->max_batch_tokens / 8;
            int cap = eighth - used > e->block_size ? eighth - used : e->block_size;
            if (budget > cap) budget = cap;
        }
        if (want_waiting && admission_stuck) continue;
        for (int i = 0; i < e->n_seqs && budget > 0 && n_members < max_members; i++) {
            sequence *s = e->seqs[i];
            int left = s->n_tokens - s->n_computed;
            if (s->chunk || s->in_flight || left < 1 || (left <= short_limit) != want_short)
                continue;
            if (want_waiting != (s->state == SEQ_WAITING)) continue;
            if (!want_waiting && left == 1) continue; /* decode, handled above */
            if (want_waiting && running >= e->max_sequences) break;
            if (want_waiting && s->n_blocks == 0) take_cached_prefix(e, s);
            left = s->n_tokens - s->n_computed;
            int chunk = left < budget ? left : budget;
            if (hybrid_prefix_reuse(e) && !s->no_prefix_cache)
                chunk = snapshot_aligned_chunk(e, s, chunk);
            if (engine_ensure_blocks(e, s, s->n_computed + chunk) != 0) {
                int have = s->n_blocks * e->block_size - s->n_computed;
                chunk = have < chunk ? have : chunk;
            }
            if (chunk <= 0) {
                if (want_waiting) { /* keep arrival order: nobody overtakes a stuck request */
                    preempt(e, s); /* hand back shared prefix blocks while waiting */
                    e->preemptions--;
                    admission_stuck = 1;
                    break;
                }
                continue;
            }
            if (s->state == SEQ_WAITING) running++;
            if (want_short && chunk == left && s->n_generated == 0) first_token_soon = 1;
            s->state = SEQ_RUNNING;
            s->chunk = chunk;
            budget -= chunk;
            e->b_members[n_members++] = s;
        }
    }
    return n_members;
}

int engine_stage_batch(engine *e, int n_members, transformer_batch *b) {
    int n_tok = 0, n_entries = 0, n_logits = 0;
    for (int m = 0; m < n_members; m++) n_entries += e->b_members[m]->n_blocks;
    if (n_entries > e->b_tables_cap) {
        int32_t *t = realloc(e->b_tables, (size_t)n_entries * 2 * sizeof *t);
        if (!t) return -1;
        e->b_tables = t;
        e->b_tables_cap = n_entries * 2;
    }
    n_entries = 0;
    for (int m = 0; m < n_members; m++) {
        sequence *s = e->b_members[m];
        if (e->hybrid && s->state_slot < 0) {
            if (e->n_free_slots == 0) return -1; /* cannot happen: one per running sequence */
            s->state_slot = e->free_slots[--e->n_free_slots];
        }
        e->b_state_slots[m] = s->state_slot;
        e->b_table_start[m] = n_entries;
        s->batch_row = n_tok;
        memcpy(e->b_tables + n_entries, s->blocks, (size_t)s->n_blocks * sizeof *s->blocks);
        n_entries += s->n_blocks;
        for (int j = 0; j < s->chunk; j++) {
            int pos = s->n_computed + j;
            e->b_tokens[n_tok] = s->tokens[pos];
            e->b_positions[n_tok] = pos;
            e->b_seq[n_tok] = m;
            e->b_slots[n_tok] = s->blocks[pos / e->block_size] * e->block_size +
                                pos % e->block_size;
            n_tok++;
        }
        if (s->n_computed + s->chunk == s->n_tokens + s->n_draft) {
            /* the last known token's row, then one per drafted token (verification) */
            s->logit_index = n_logits;
            for (int j = s->n_draft; j >= 0; j--) e->b_logit_rows[n_logits++] = n_tok - 1 - j;
        }
    }
    *b = (transformer_batch){.n_tokens = n_tok, .tokens = e->b_tokens,
                             .positions = e->b_positions, .seq_of_token = e->b_seq,
                             .slots = e->b_slots, .n_seqs = n_members,
                             .block_table_start = e->b_table_start, .block_tables = e->b_tables,
                             .n_block_entries = n_entries, .n_logits = n_logits,
                             .logit_rows = e->b_logit_rows,
                             .state_slots = e->hybrid ? e->b_state_slots : NULL};
    return 0;
}

static int is_stop(const sequence *s, int32_t token) {
    for (int i = 0; i < s->n_stops; i++)
        if (s->stops[i] == token) return 1;
    return 0;
}

sampler_input engine_sampler_input(const sequence *s, int n_history) {
    return (sampler_input){.params = &s->sampling, .history = s->tokens, .n_history = n_history,
                           .n_prompt = s->n_prompt, .banned = s->ban_eos ? s->stops : NULL,
                           .n_banned = s->ban_eos ? s->n_stops : 0};
}

void engine_sample_all(engine *e, int n_members) {
    for (int m = 0; m < n_members; m++) {
        sequence *s = e->b_members[m];
        if (s->logit_index < 0) continue;
        if (s->n_draft > 0) {
            spec_verify_member(e, s);
            continue;
        }
        sampler_input in = engine_sampler_input(s, s->n_tokens);
        float *logits = e->logits + (size_t)s->logit_index * (size_t)e->cfg.vocab_size;
        if (s->constraint.ctx) s->constraint.mask(s->constraint.ctx, logits, e->cfg.vocab_size);
        sampler_sample(&e->sampler, logits, &in, &s->rng, &e->samples[s->logit_index]);
    }
}

/* Appends s's sampled token r and reports it in ev; returns the finish reason. */
static engine_finish take_sample(sequence *s, const sampler_result *r, engine_event *ev) {
    s->tokens[s->n_tokens++] = r->token;
    s->n_generated++;
    if (s->constraint.ctx) s->constraint.accept(s->constraint.ctx, r->token);
    ev->token = r->token;
    ev->logprob = r->logprob;
    ev->n_top = r->n_top;
    memcpy(ev->top_ids, r->top_ids, sizeof ev->top_ids);
    memcpy(ev->top_logprobs, r->top_logprobs, sizeof ev->top_logprobs);
    if (!s->ban_eos && is_stop(s, r->token)) return ENGINE_FINISH_STOP;
    if (s->n_generated >= s->max_tokens || s->n_tokens >= s->cap) return ENGINE_FINISH_LENGTH;
    return ENGINE_FINISH_NONE;
}

/* Whether this step's rows can be sampled where the logits are (the backend's sample op): it
 * has one, and no member with logits needs the host's sampling: penalties (they read the
 * history), a constraint (its mask is computed on the host) or drafts to verify (several rows
 * a member, spec_verify_member's rule). Both of the last two were once sampled on the GPU,
 * unmasked and unverified (found by the API e2e suite on --device cuda). */
static int samples_on_backend(const engine *e, int n_members) {
    if (!e->be->sample) return 0;
    for (int m = 0; m < n_members; m++) {
        const sequence *s = e->b_members[m];
        const sampling_params *p = &s->sampling;
        if (s->logit_index >= 0 &&
            (p->repetition_penalty != 1.0f || p->presence_penalty != 0 || p->frequency_penalty != 0 ||
             s->constraint.ctx || s->n_draft > 0))
            return 0;
    }
    return 1;
}

/* The backend samples the rows of the logits it holds; one uniform draw per non-greedy row from
 * the sequence's own generator, as sampler_sample draws it. */
static int sample_on_backend(engine *e, int n_members, int n_logits) {
    sample_params *p = e->backend_params;
    sample_result *r = e->backend_results;
    for (int m = 0; m < n_members; m++) {
        sequence *s = e->b_members[m];
        if (s->logit_index < 0) continue;
        const sampling_params *sp = &s->sampling;
        p[s->logit_index] = (sample_params){
            .temperature = sp->temperature, .top_k = sp->top_k, .top_p = sp->top_p,
            .min_p = sp->min_p, .logprob = sp->logprobs, .n_top = sp->top_logprobs,
            .uniform = sp->temperature > 0 ? sampler_rng_uniform(&s->rng) : 0,
            .banned = s->ban_eos ? s->stops : NULL, .n_banned = s->ban_eos ? s->n_stops : 0};
    }
    char err[256];
    if (e->be->sample(e->be, transformer_logits(e->tf), n_logits, e->cfg.vocab_size, p, r) != 0) {
        if (!e->be->status || e->be->status(e->be, err, sizeof err) == 0)
            snprintf(err, sizeof err, "the backend could not sample");
        engine_set_error(e, "sampling: %s", err);
        return -1;
    }
    for (int i = 0; i < n_logits; i++) {
        sampler_result *o = &e->samples[i];
        memset(o, 0, sizeof *o);
        o->token = r[i].token;
        o->logprob = r[i].logprob;
        o->n_top = r[i].n_top;
        memcpy(o->top_ids, r[i].top_ids, (size_t)r[i].n_top * sizeof *o->top_ids);
        memcpy(o->top_logprobs, r[i].top_logprobs, (size_t)r[i].n_top * sizeof *o->top_logprobs);
    }
    return 0;
}

int engine_forward_local(engine *e, int n_members, const transformer_batch *b, float *hidden,
                         char *err, size_t errlen) {
    if (!e->w.has_head) /* a pipeline stage before the last: its hidden states to the host */
        return transformer_forward(e->tf, e->kv->layers, e->block_size, b, hidden, err, errlen);
    int on_backend = b->n_logits > 0 && samples_on_backend(e, n_members);
    if (transformer_forward(e->tf, e->kv->layers, e->block_size, b, on_backend ? NULL : e->logits,
                            err, errlen) != 0)
        return -1;
    if (on_backend) return sample_on_backend(e, n_members, b->n_logits) ? 1 : 0;
    engine_sample_all(e, n_members);
    return 0;
}

/* The model's part of a step: forward, then every batch member with logits gets its token in
 * e->samples (sampled here -- on the backend where it can, so the logits stay there -- or by the
 * sampling rank and received). */
static int forward_and_sample(engine *e, int n_members, const transformer_batch *b) {
    if (e->dist) return engine_dist_forward(e, n_members, b);
    char err[256];
    int rc = engine_forward_local(e, n_members, b, NULL, err, sizeof err);
    if (rc < 0) engine_set_error(e, "forward pass: %s", err);
    return rc ? -1 : 0;
}

int engine_idle_step_ms(const engine *e) {
    if (!e->dist || e->d.rank != 0) return -1;
    return e->d.timeout_ms / 4 > 0 ? e->d.timeout_ms / 4 : 1;
}

int engine_step(engine *e, engine_event *events, int max_events) {
    if (e->failed) return -1;
    uint64_t t0 = clock_now_ns(), steps = e->steps, comm_ns = e->comm_ns;
    int n;
    if (e->dist && e->d.overlap) {
        n = engine_dist_tick(e, events, max_events);
    } else {
        if (e->dist) {
            if (engine_dist_exchange_inputs(e, &max_events)) {
                e->failed = 1;
                return -1;
            }
            if (e->d.shut_down) return 0;
        }
        n = engine_step_local(e, events, max_events);
    }
    if (n < 0) e->failed = 1;
    if (e->steps != steps) e->step_ns += clock_now_ns() - t0;
    else e->comm_ns = comm_ns; /* an idle step (a keep-alive) is no step: neither time counts */
    return n;
}

int engine_report_cancelled(engine *e, engine_event *events, int limit) {
    int n_ev = 0;
    while (e->n_cancelled > 0 && n_ev < limit) {
        engine_event *ev = &events[n_ev++];
        memset(ev, 0, sizeof *ev);
        ev->seq_id = e->cancelled[0];
        ev->token = -1;
        ev->finish = ENGINE_FINISH_CANCELLED;
        memmove(e->cancelled, e->cancelled + 1, (size_t)--e->n_cancelled * sizeof *e->cancelled);
    }
    return n_ev;
}

int engine_plan_step(engine *e, int cap, int draft_room, transformer_batch *b,
                     engine_event *events, int *n_ev) {
    if (e->n_seqs == 0 || cap <= 0) return 0;
    int n_members = plan_batch(e, cap);
    int in_flight = 0;
    for (int i = 0; i < e->n_seqs; i++) in_flight |= e->seqs[i]->in_flight;
    while (n_members == 0 && !in_flight) { /* stuck prefills: the newest holder of blocks yields */
        sequence *victim = newest_running(e, NULL);
        if (!victim || victim == e->seqs[0]) break;
        preempt(e, victim);
        n_members = plan_batch(e, cap);
    }
    if (n_members == 0 && !in_flight) { /* the oldest request cannot fit even alone: it never will */
        sequence *s = e->seqs[0];
        engine_event *ev = &events[(*n_ev)++];
        memset(ev, 0, sizeof *ev);
        ev->seq_id = s->id;
        ev->token = -1;
        ev->finish = ENGINE_FINISH_ERROR;
        ev->prompt_tokens = s->n_prompt;
        snprintf(ev->error, sizeof ev->error, "the KV cache is too small for this request");
        remove_seq(e, 0);
        return 0;
    }
    if (n_members && draft_room > 0) spec_plan_drafts(e, n_members, draft_room);
    if (n_members && engine_stage_batch(e, n_members, b) != 0) {
        engine_set_error(e, "out of memory staging a batch");
        return -1;
    }
    for (int m = 0; m < n_members; m++) {
        sequence *s = e->b_members[m];
        if (e->pipeline_steps > 1 && s->logit_index < 0) {
            /* an overlapped pipeline's prefill chunk that samples nothing counts as computed at
             * once, so the next chunk can follow it through the stages back to back: each stage
             * runs the steps in order, so the chunk's K/V are in the cache before any later step
             * reads them there (the same holds for its prefix-cache blocks) */
            s->n_computed += s->chunk;
            register_full_blocks(e, s);
            s->chunk = 0; /* nothing left to apply when its step completes */
        } else {
            s->in_flight = 1;
        }
    }
    return n_members;
}

sequence *engine_find_serial(engine *e, uint64_t serial) {
    for (int i = 0; i < e->n_seqs; i++)
        if (e->seqs[i]->serial == serial) return e->seqs[i];
    return NULL;
}

void engine_finish_member(engine *e, sequence *s, int chunk, int logit_index,
                          const sampler_result *samples, engine_event *events, int *n_ev,
                          int max_events) {
    if (chunk || logit_index >= 0) s->in_flight = 0; /* else a chunk counted at its plan */
    /* verified drafts: the tokens kept plus the model's own next one; the K/V of the drafts
     * rejected after them are stale (never read: the next step overwrites those positions). A
     * chunk counted at its plan has none: the drafts s holds then are its next step's, in flight */
    int drafts = logit_index >= 0 ? s->n_draft : 0;
    int n_emit = drafts > 0 ? spec_emitted(s, samples + logit_index) : 1;
    s->catch_up = drafts > 0 && spec_rollback_state(e, s, n_emit - 1);
    int computed_before = s->n_computed;
    if (!s->catch_up) s->n_computed += chunk - (drafts - (n_emit - 1));
    if (s->n_computed > computed_before && !e->dist) spec_observe(e, s, computed_before);
    register_full_blocks(e, s);
    if (chunk) snapshot_take(e, s);
    engine_finish fin = ENGINE_FINISH_NONE;
    engine_event *ev = NULL;
    if (logit_index >= 0 || *n_ev < max_events) {
        ev = &events[(*n_ev)++];
        memset(ev, 0, sizeof *ev);
        ev->seq_id = s->id;
        ev->token = -1;
        ev->prompt_tokens = s->n_prompt;
        ev->cached_tokens = s->cached_tokens;
        ev->prefill_done = s->n_computed < s->n_prompt ? s->n_computed : s->n_prompt;
    }
    for (int i = 0; logit_index >= 0 && i < n_emit && fin == ENGINE_FINISH_NONE; i++) {
        if (i > 0) { /* more tokens of the same step: one event each */
            engine_event *first = ev;
            ev = &events[(*n_ev)++];
            *ev = *first;
        }
        fin = take_sample(s, &samples[logit_index + i], ev);
    }
    if (drafts > 0) spec_after_member(e, s, n_emit - 1);
    if (fin != ENGINE_FINISH_NONE) {
        ev->finish = fin;
        int i;
        if (find_seq(e, s->id, &i)) remove_seq(e, i);
    }
}

int engine_step_local(engine *e, engine_event *events, int max_events) {
    int n_ev = engine_report_cancelled(e, events, max_events);
    int room = max_events - n_ev;
    int cap = room < e->max_sequences ? room : e->max_sequences;
    transformer_batch b;
    int n_members = engine_plan_step(e, cap, room, &b, events, &n_ev);
    if (n_members <= 0) return n_members < 0 ? -1 : n_ev;
    if (forward_and_sample(e, n_members, &b)) return -1;
    e->steps++;
    for (int m = 0; m < n_members; m++) {
        sequence *s = e->b_members[m];
        engine_finish_member(e, s, s->chunk, s->logit_index, e->samples, events, &n_ev,
                             max_events);
    }
    return n_ev;
}
