/* cards — model cards: what exo knows about a model before (or without) downloading it.
 *
 * A card is a TOML file in exo's schema (model_id, n_layers, hidden_size, num_key_value_heads,
 * supports_tensor, tasks, family, quantization, base_model, capabilities, context_length,
 * [storage_size] in_bytes, optional trust_remote_code, [sampling_defaults] with optional
 * .thinking / .non_thinking sub-tables). The built-in catalog lives in resources/cards/;
 * custom cards (POST /models/add) are written to <data dir>/custom_cards/.
 *
 * It refuses cards with a missing or invalid required field (the message names the file, line
 * or field), and model ids that store_id_valid rejects. It does no network I/O: building a
 * custom card takes config.json text that download/ fetched. */
#ifndef EXO_MODEL_CARDS_H
#define EXO_MODEL_CARDS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define CARD_MAX_LIST 8

typedef struct card_sampling {
    unsigned has; /* bit per field below, CARD_SAMPLING_* */
    double temperature, top_p, min_p, repetition_penalty, presence_penalty;
    int64_t top_k;
} card_sampling;
enum {
    CARD_SAMPLING_TEMPERATURE = 1,
    CARD_SAMPLING_TOP_P = 2,
    CARD_SAMPLING_MIN_P = 4,
    CARD_SAMPLING_REPETITION_PENALTY = 8,
    CARD_SAMPLING_PRESENCE_PENALTY = 16,
    CARD_SAMPLING_TOP_K = 32,
};

typedef struct model_card {
    char model_id[256];           /* "org/name" on Hugging Face */
    int64_t n_layers;             /* transformer blocks (config num_hidden_layers) */
    int64_t hidden_size;          /* model width */
    int64_t num_key_value_heads;  /* KV heads (decides tensor-parallel splits) */
    int supports_tensor;          /* tensor parallel possible */
    char tasks[CARD_MAX_LIST][32];
    int n_tasks;
    char family[32];              /* "llama", "qwen", "gpt-oss", "deepseek", ... */
    char quantization[32];        /* "4bit", "8bit", "bf16", "mxfp4", "" */
    char base_model[128];         /* human name, "Llama 3.2 1B" */
    char capabilities[CARD_MAX_LIST][32]; /* text, thinking, thinking_toggle, vision, code */
    int n_capabilities;
    int64_t context_length;       /* tokens; 0 = unknown */
    uint64_t storage_bytes;       /* [storage_size] in_bytes: all weight files */
    int trust_remote_code;
    card_sampling sampling;       /* [sampling_defaults] (thinking mode when the model has one) */
    card_sampling sampling_thinking;     /* [sampling_defaults.thinking] */
    card_sampling sampling_non_thinking; /* [sampling_defaults.non_thinking] */
    int is_custom;                /* added by a user (POST /models/add) */
} model_card;

/* Parses one card. Returns 0, or -1 with "line N: ..." or "field 'x': ..." in err. */
int card_parse(const char *toml_text, size_t len, model_card *out, char *err, size_t errlen);
/* Writes a card as TOML (for custom cards); the result is malloc'd (free it). */
char *card_to_toml(const model_card *c);
/* The /models entry for a card (exo's fields). New reference. */
json_t *card_to_json(const model_card *c);
int card_has_capability(const model_card *c, const char *cap);

/* Builds a custom card from a Hugging Face config.json (text) and the total size of the weight
 * files. Fills family/quantization/capabilities by inspection; context_length from
 * max_position_embeddings. Returns 0 or -1 with a message (e.g. "config.json has no
 * num_hidden_layers"). */
int card_from_hf_config(const char *model_id, const char *config_json, uint64_t weight_bytes,
                        model_card *out, char *err, size_t errlen);

/* The catalog: built-in cards plus custom cards, loaded from directories of *.toml. */
typedef struct card_catalog {
    model_card *cards;
    size_t n, cap;
    char custom_dir[1024]; /* where custom cards are written ("" = none) */
} card_catalog;

/* Loads builtin_dir (NULL = card_builtin_dir()) and custom_dir (may be NULL). Bad card files
 * are skipped with a warning in the log. Returns 0, or -1 if builtin_dir cannot be read. */
int card_catalog_load(card_catalog *cat, const char *builtin_dir, const char *custom_dir);
void card_catalog_free(card_catalog *cat);
const model_card *card_catalog_find(const card_catalog *cat, const char *model_id);
/* Adds (or replaces) a custom card, writing <custom_dir>/<org--name>.toml. 0 or -1 + message. */
int card_catalog_add_custom(card_catalog *cat, const model_card *c, char *err, size_t errlen);
/* Removes a custom card and its file. 0, 1 if no such custom card, -1 on I/O error. */
int card_catalog_remove_custom(card_catalog *cat, const char *model_id, char *err, size_t errlen);

/* Where the built-in cards are: $EXO_CARDS_DIR, else resources/cards next to the binary
 * (<exe>/../resources/cards, <exe>/../../resources/cards), else /usr/share/exo/cards.
 * Returns 0 and fills out, or -1 if none exists. */
int card_builtin_dir(char *out, size_t n);

#endif
