/* cards — parsing, writing and cataloguing model cards (see cards.h). */
#include "model/cards.h"

#include "base/log.h"
#include "base/paths.h"
#include "base/strbuf.h"
#include "base/toml.h"
#include "model/store.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int copy_str(char *dst, size_t n, const char *src) {
    size_t len = strlen(src);
    if (len >= n) return -1;
    memcpy(dst, src, len + 1);
    return 0;
}

static int get_list(const toml_value *t, const char *key, char out[][32], int *n_out,
                    char *err, size_t errlen) {
    *n_out = 0;
    const toml_value *a = toml_get(t, key);
    if (!a) return 0;
    if (a->type != TOML_ARRAY) goto bad;
    for (size_t i = 0; i < a->u.array.n; i++) {
        const toml_value *v = a->u.array.items[i];
        if (v->type != TOML_STRING || *n_out == CARD_MAX_LIST) goto bad;
        if (copy_str(out[*n_out], 32, v->u.string.data) < 0) goto bad;
        (*n_out)++;
    }
    return 0;
bad:
    snprintf(err, errlen, "field '%s': expected a list of at most %d short strings", key,
             CARD_MAX_LIST);
    return -1;
}

static int get_sampling(const toml_value *t, const char *prefix, card_sampling *s, char *err,
                        size_t errlen) {
    static const struct {
        const char *name;
        unsigned bit;
        size_t offset;
    } fields[] = {
        {"temperature", CARD_SAMPLING_TEMPERATURE, offsetof(card_sampling, temperature)},
        {"top_p", CARD_SAMPLING_TOP_P, offsetof(card_sampling, top_p)},
        {"min_p", CARD_SAMPLING_MIN_P, offsetof(card_sampling, min_p)},
        {"repetition_penalty", CARD_SAMPLING_REPETITION_PENALTY,
         offsetof(card_sampling, repetition_penalty)},
        {"presence_penalty", CARD_SAMPLING_PRESENCE_PENALTY, offsetof(card_sampling, presence_penalty)},
    };
    memset(s, 0, sizeof *s);
    const toml_value *tab = toml_get(t, prefix);
    if (!tab) return 0;
    if (tab->type != TOML_TABLE) {
        snprintf(err, errlen, "field '%s': expected a table", prefix);
        return -1;
    }
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const toml_value *v = toml_get(tab, fields[i].name);
        if (!v) continue;
        double d;
        if (toml_get_double(tab, fields[i].name, &d) < 0) {
            snprintf(err, errlen, "field '%s.%s': expected a number", prefix, fields[i].name);
            return -1;
        }
        *(double *)((char *)s + fields[i].offset) = d;
        s->has |= fields[i].bit;
    }
    if (toml_get(tab, "top_k")) {
        if (toml_get_int(tab, "top_k", &s->top_k) < 0 || s->top_k < 0) {
            snprintf(err, errlen, "field '%s.top_k': expected a non-negative integer", prefix);
            return -1;
        }
        s->has |= CARD_SAMPLING_TOP_K;
    }
    return 0;
}

static int get_positive(const toml_value *t, const char *key, int64_t *out, int required,
                        char *err, size_t errlen) {
    const toml_value *v = toml_get(t, key);
    if (!v && !required) return 0;
    if (!v || v->type != TOML_INTEGER || v->u.integer <= 0) {
        snprintf(err, errlen, "field '%s': %s", key,
                 v ? "expected a positive integer" : "missing (required)");
        return -1;
    }
    *out = v->u.integer;
    return 0;
}

static int get_opt_string(const toml_value *t, const char *key, char *dst, size_t n, char *err,
                          size_t errlen) {
    const toml_value *v = toml_get(t, key);
    if (!v) return 0;
    if (v->type != TOML_STRING || copy_str(dst, n, v->u.string.data) < 0) {
        snprintf(err, errlen, "field '%s': expected a string shorter than %zu bytes", key, n);
        return -1;
    }
    return 0;
}

int card_parse(const char *text, size_t len, model_card *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    toml_value *t = toml_parse(text, len, err, errlen);
    if (!t) return -1;
    int rc = -1;
    const char *id;
    if (toml_get_string(t, "model_id", &id) < 0) {
        snprintf(err, errlen, "field 'model_id': missing (required)");
        goto out;
    }
    char why[160];
    if (store_id_valid(id, why, sizeof why) < 0 || copy_str(c->model_id, sizeof c->model_id, id) < 0) {
        snprintf(err, errlen, "field 'model_id': %s", why);
        goto out;
    }
    int64_t storage = 0;
    if (get_positive(t, "n_layers", &c->n_layers, 1, err, errlen) < 0 ||
        get_positive(t, "hidden_size", &c->hidden_size, 1, err, errlen) < 0 ||
        get_positive(t, "num_key_value_heads", &c->num_key_value_heads, 0, err, errlen) < 0 ||
        get_positive(t, "context_length", &c->context_length, 0, err, errlen) < 0 ||
        get_positive(t, "storage_size.in_bytes", &storage, 1, err, errlen) < 0)
        goto out;
    c->storage_bytes = (uint64_t)storage;
    if (toml_get(t, "supports_tensor") && toml_get_bool(t, "supports_tensor", &c->supports_tensor) < 0) {
        snprintf(err, errlen, "field 'supports_tensor': expected true or false");
        goto out;
    }
    if (toml_get(t, "trust_remote_code") &&
        toml_get_bool(t, "trust_remote_code", &c->trust_remote_code) < 0) {
        snprintf(err, errlen, "field 'trust_remote_code': expected true or false");
        goto out;
    }
    if (get_list(t, "tasks", c->tasks, &c->n_tasks, err, errlen) < 0 ||
        get_list(t, "capabilities", c->capabilities, &c->n_capabilities, err, errlen) < 0 ||
        get_opt_string(t, "family", c->family, sizeof c->family, err, errlen) < 0 ||
        get_opt_string(t, "quantization", c->quantization, sizeof c->quantization, err, errlen) < 0 ||
        get_opt_string(t, "base_model", c->base_model, sizeof c->base_model, err, errlen) < 0)
        goto out;
    if (c->n_tasks == 0) {
        strcpy(c->tasks[0], "TextGeneration");
        c->n_tasks = 1;
    }
    if (c->n_capabilities == 0) {
        strcpy(c->capabilities[0], "text");
        c->n_capabilities = 1;
    }
    if (get_sampling(t, "sampling_defaults", &c->sampling, err, errlen) < 0 ||
        get_sampling(t, "sampling_defaults.thinking", &c->sampling_thinking, err, errlen) < 0 ||
        get_sampling(t, "sampling_defaults.non_thinking", &c->sampling_non_thinking, err, errlen) < 0)
        goto out;
    const toml_value *custom = toml_get(t, "is_custom");
    if (custom && custom->type == TOML_BOOLEAN) c->is_custom = custom->u.boolean;
    rc = 0;
out:
    toml_free(t);
    return rc;
}

static void toml_quote(strbuf *sb, const char *s) {
    strbuf_append_char(sb, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            strbuf_append_char(sb, '\\');
            strbuf_append_char(sb, (char)*p);
        } else if (*p < 0x20 || *p == 0x7f) {
            strbuf_appendf(sb, "\\u%04x", *p);
        } else {
            strbuf_append_char(sb, (char)*p);
        }
    }
    strbuf_append_char(sb, '"');
}

static void toml_list(strbuf *sb, const char *key, char list[][32], int n) {
    strbuf_appendf(sb, "%s = [", key);
    for (int i = 0; i < n; i++) {
        if (i) strbuf_append_str(sb, ", ");
        toml_quote(sb, list[i]);
    }
    strbuf_append_str(sb, "]\n");
}

static void toml_sampling(strbuf *sb, const char *header, const card_sampling *s) {
    if (!s->has) return;
    strbuf_appendf(sb, "\n[%s]\n", header);
    if (s->has & CARD_SAMPLING_TEMPERATURE) strbuf_appendf(sb, "temperature = %.17g\n", s->temperature);
    if (s->has & CARD_SAMPLING_TOP_P) strbuf_appendf(sb, "top_p = %.17g\n", s->top_p);
    if (s->has & CARD_SAMPLING_TOP_K) strbuf_appendf(sb, "top_k = %lld\n", (long long)s->top_k);
    if (s->has & CARD_SAMPLING_MIN_P) strbuf_appendf(sb, "min_p = %.17g\n", s->min_p);
    if (s->has & CARD_SAMPLING_REPETITION_PENALTY)
        strbuf_appendf(sb, "repetition_penalty = %.17g\n", s->repetition_penalty);
    if (s->has & CARD_SAMPLING_PRESENCE_PENALTY)
        strbuf_appendf(sb, "presence_penalty = %.17g\n", s->presence_penalty);
}

char *card_to_toml(const model_card *c) {
    strbuf sb = {0};
    strbuf_append_str(&sb, "model_id = ");
    toml_quote(&sb, c->model_id);
    strbuf_appendf(&sb, "\nn_layers = %lld\nhidden_size = %lld\n", (long long)c->n_layers,
                   (long long)c->hidden_size);
    if (c->num_key_value_heads)
        strbuf_appendf(&sb, "num_key_value_heads = %lld\n", (long long)c->num_key_value_heads);
    strbuf_appendf(&sb, "supports_tensor = %s\n", c->supports_tensor ? "true" : "false");
    toml_list(&sb, "tasks", (char(*)[32])c->tasks, c->n_tasks);
    strbuf_append_str(&sb, "family = ");
    toml_quote(&sb, c->family);
    strbuf_append_str(&sb, "\nquantization = ");
    toml_quote(&sb, c->quantization);
    strbuf_append_str(&sb, "\nbase_model = ");
    toml_quote(&sb, c->base_model);
    strbuf_append_char(&sb, '\n');
    toml_list(&sb, "capabilities", (char(*)[32])c->capabilities, c->n_capabilities);
    if (c->context_length) strbuf_appendf(&sb, "context_length = %lld\n", (long long)c->context_length);
    if (c->trust_remote_code) strbuf_append_str(&sb, "trust_remote_code = true\n");
    if (c->is_custom) strbuf_append_str(&sb, "is_custom = true\n");
    strbuf_appendf(&sb, "\n[storage_size]\nin_bytes = %llu\n", (unsigned long long)c->storage_bytes);
    toml_sampling(&sb, "sampling_defaults", &c->sampling);
    toml_sampling(&sb, "sampling_defaults.thinking", &c->sampling_thinking);
    toml_sampling(&sb, "sampling_defaults.non_thinking", &c->sampling_non_thinking);
    return strbuf_detach(&sb);
}

int card_has_capability(const model_card *c, const char *cap) {
    for (int i = 0; i < c->n_capabilities; i++)
        if (!strcmp(c->capabilities[i], cap)) return 1;
    return 0;
}

static json_t *json_list(char list[][32], int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_string(list[i]));
    return a;
}

json_t *card_to_json(const model_card *c) {
    const char *slash = strrchr(c->model_id, '/');
    const char *name = slash ? slash + 1 : c->model_id;
    char desc[320];
    snprintf(desc, sizeof desc, "%s%s%s", c->base_model[0] ? c->base_model : name,
             c->quantization[0] ? " " : "", c->quantization);
    json_t *tags = json_array();
    if (c->quantization[0]) json_array_append_new(tags, json_string(c->quantization));
    if (c->family[0]) json_array_append_new(tags, json_string(c->family));
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:s, s:I, s:o, s:I, s:b, s:o, s:b, s:s, "
                     "s:s, s:s, s:o, s:I, s:I}",
                     "id", c->model_id, "object", "model", "created", (json_int_t)0,
                     "owned_by", "exo", "hugging_face_id", c->model_id, "name", name,
                     "description", desc, "context_length", (json_int_t)c->context_length,
                     "tags", tags, "storage_size_megabytes",
                     (json_int_t)(c->storage_bytes / (1024 * 1024)), "supports_tensor",
                     c->supports_tensor, "tasks", json_list((char(*)[32])c->tasks, c->n_tasks),
                     "is_custom", c->is_custom, "family", c->family, "quantization",
                     c->quantization, "base_model", c->base_model, "capabilities",
                     json_list((char(*)[32])c->capabilities, c->n_capabilities), "n_layers",
                     (json_int_t)c->n_layers, "hidden_size", (json_int_t)c->hidden_size);
}

/* ---- custom cards from config.json ---- */

static int64_t cfg_int(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (!json_is_integer(v)) {
        json_t *text = json_object_get(cfg, "text_config"); /* multimodal configs nest it */
        v = json_is_object(text) ? json_object_get(text, key) : NULL;
    }
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
}

static void guess_family(const char *model_type, const char *id, char *out, size_t n) {
    static const char *known[][2] = {
        {"llama", "llama"},   {"qwen", "qwen"},         {"gpt_oss", "gpt-oss"},
        {"deepseek", "deepseek"}, {"glm", "glm"},       {"kimi", "kimi"},
        {"minimax", "minimax"}, {"gemma", "gemma"},     {"mistral", "mistral"},
        {"phi", "phi"},       {"nemotron", "nemotron"},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strstr(model_type, known[i][0])) {
            snprintf(out, n, "%s", known[i][1]);
            return;
        }
    (void)id;
    snprintf(out, n, "%s", model_type[0] ? model_type : "unknown");
}

int card_from_hf_config(const char *model_id, const char *config_json, uint64_t weight_bytes,
                        model_card *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (store_id_valid(model_id, err, errlen) < 0) return -1;
    json_error_t je;
    json_t *cfg = json_loads(config_json, 0, &je);
    if (!json_is_object(cfg)) {
        snprintf(err, errlen, "config.json is not a JSON object (line %d: %s)", je.line, je.text);
        json_decref(cfg);
        return -1;
    }
    snprintf(c->model_id, sizeof c->model_id, "%s", model_id);
    c->n_layers = cfg_int(cfg, "num_hidden_layers");
    if (!c->n_layers) c->n_layers = cfg_int(cfg, "n_layer");
    c->hidden_size = cfg_int(cfg, "hidden_size");
    if (!c->hidden_size) c->hidden_size = cfg_int(cfg, "n_embd");
    int64_t heads = cfg_int(cfg, "num_attention_heads");
    c->num_key_value_heads = cfg_int(cfg, "num_key_value_heads");
    if (!c->num_key_value_heads) c->num_key_value_heads = heads;
    c->context_length = cfg_int(cfg, "max_position_embeddings");
    if (c->n_layers <= 0 || c->hidden_size <= 0) {
        snprintf(err, errlen, "config.json has no %s",
                 c->n_layers <= 0 ? "num_hidden_layers" : "hidden_size");
        json_decref(cfg);
        return -1;
    }
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    guess_family(mt ? mt : "", model_id, c->family, sizeof c->family);
    json_t *q = json_object_get(cfg, "quantization");
    if (!json_is_object(q)) q = json_object_get(cfg, "quantization_config");
    int64_t bits = json_is_object(q) ? (int64_t)json_integer_value(json_object_get(q, "bits")) : 0;
    const char *qm = json_is_object(q) ? json_string_value(json_object_get(q, "quant_method")) : NULL;
    if (bits) snprintf(c->quantization, sizeof c->quantization, "%lldbit", (long long)bits);
    else if (qm) snprintf(c->quantization, sizeof c->quantization, "%s", qm);
    else {
        const char *dt = json_string_value(json_object_get(cfg, "torch_dtype"));
        if (!dt) dt = json_string_value(json_object_get(cfg, "dtype"));
        snprintf(c->quantization, sizeof c->quantization, "%s",
                 dt && !strcmp(dt, "bfloat16") ? "bf16" : dt && !strcmp(dt, "float16") ? "f16" : "");
    }
    const char *slash = strchr(model_id, '/');
    snprintf(c->base_model, sizeof c->base_model, "%s", slash ? slash + 1 : model_id);
    strcpy(c->tasks[0], "TextGeneration");
    c->n_tasks = 1;
    strcpy(c->capabilities[c->n_capabilities++], "text");
    if (json_object_get(cfg, "vision_config")) strcpy(c->capabilities[c->n_capabilities++], "vision");
    /* tensor parallel needs the heads to split evenly over at least two ranks */
    c->supports_tensor = heads > 1 && c->num_key_value_heads > 0 && heads % 2 == 0;
    c->storage_bytes = weight_bytes;
    c->is_custom = 1;
    json_decref(cfg);
    return 0;
}

/* ---- catalog ---- */

static void catalog_put(card_catalog *cat, const model_card *c) {
    for (size_t i = 0; i < cat->n; i++)
        if (!strcmp(cat->cards[i].model_id, c->model_id)) {
            cat->cards[i] = *c;
            return;
        }
    if (cat->n == cat->cap) {
        cat->cap = cat->cap ? cat->cap * 2 : 64;
        model_card *nc = realloc(cat->cards, cat->cap * sizeof *nc);
        if (!nc) abort();
        cat->cards = nc;
    }
    cat->cards[cat->n++] = *c;
}

static int load_dir(card_catalog *cat, const char *dir, int custom) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".toml") || e->d_name[0] == '.') continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len;
        char *text = paths_read_file(path, 1 << 20, &len);
        if (!text) continue;
        model_card c;
        char err[256];
        if (card_parse(text, len, &c, err, sizeof err) < 0) {
            log_warn("skipping model card %s: %s", path, err);
        } else {
            if (custom) c.is_custom = 1;
            catalog_put(cat, &c);
        }
        free(text);
    }
    closedir(d);
    return 0;
}

int card_builtin_dir(char *out, size_t n) {
    return paths_shipped_dir("EXO_CARDS_DIR", "resources/cards", out, n);
}

int card_catalog_load(card_catalog *cat, const char *builtin_dir, const char *custom_dir) {
    memset(cat, 0, sizeof *cat);
    char dir[1024];
    if (!builtin_dir) {
        if (card_builtin_dir(dir, sizeof dir) < 0) return -1;
        builtin_dir = dir;
    }
    if (custom_dir) snprintf(cat->custom_dir, sizeof cat->custom_dir, "%s", custom_dir);
    if (load_dir(cat, builtin_dir, 0) < 0) return -1;
    if (custom_dir) load_dir(cat, custom_dir, 1);
    return 0;
}

void card_catalog_free(card_catalog *cat) {
    free(cat->cards);
    memset(cat, 0, sizeof *cat);
}

const model_card *card_catalog_find(const card_catalog *cat, const char *model_id) {
    for (size_t i = 0; i < cat->n; i++)
        if (!strcmp(cat->cards[i].model_id, model_id)) return &cat->cards[i];
    return NULL;
}

static int custom_path(const card_catalog *cat, const char *id, char *out, size_t n) {
    char name[256];
    if (!cat->custom_dir[0] || store_id_to_dirname(id, name, sizeof name) < 0) return -1;
    snprintf(out, n, "%s/%s.toml", cat->custom_dir, name);
    return 0;
}

int card_catalog_add_custom(card_catalog *cat, const model_card *c, char *err, size_t errlen) {
    char path[2048], tmp[2100];
    if (custom_path(cat, c->model_id, path, sizeof path) < 0) {
        snprintf(err, errlen, "no custom card directory, or invalid model id");
        return -1;
    }
    const model_card *existing = card_catalog_find(cat, c->model_id);
    if (existing && !existing->is_custom) {
        snprintf(err, errlen, "%s is a built-in model; it needs no custom card", c->model_id);
        return -1;
    }
    if (paths_mkdir_p(cat->custom_dir) < 0) {
        snprintf(err, errlen, "cannot create %s: %s", cat->custom_dir, strerror(errno));
        return -1;
    }
    model_card copy = *c;
    copy.is_custom = 1;
    char *text = card_to_toml(&copy);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) ok = 0;
    free(text);
    if (!ok || rename(tmp, path) < 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    catalog_put(cat, &copy);
    return 0;
}

int card_catalog_remove_custom(card_catalog *cat, const char *model_id, char *err, size_t errlen) {
    for (size_t i = 0; i < cat->n; i++) {
        if (strcmp(cat->cards[i].model_id, model_id) || !cat->cards[i].is_custom) continue;
        char path[2048];
        if (custom_path(cat, model_id, path, sizeof path) == 0 && unlink(path) < 0 && errno != ENOENT) {
            snprintf(err, errlen, "cannot delete %s: %s", path, strerror(errno));
            return -1;
        }
        cat->cards[i] = cat->cards[--cat->n];
        return 0;
    }
    return 1;
}
