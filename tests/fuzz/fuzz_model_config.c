/* libFuzzer target: config.json parsing on arbitrary text. Accepted configs must satisfy the
 * invariants the forward pass relies on. */
#include "arch/transformer.h"
#include "model/model_config.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    model_config c;
    char err[256];
    if (model_config_parse((const char *)data, size, &c, err, sizeof err) != 0) return 0;
    if (c.n_heads < 1 || c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads || c.head_dim < 2 ||
        c.head_dim % 2 || c.hidden_size < 1 || c.vocab_size < 1 || c.n_layers < 1)
        abort();
    if (c.n_experts && (c.n_experts_per_tok < 1 || c.n_experts_per_tok > c.n_experts)) abort();
    for (int i = 0; i < c.n_eos; i++)
        if (c.eos_ids[i] < 0 || c.eos_ids[i] >= c.vocab_size) abort();
    float freq[512], af;
    rope_inv_freq(&c.rope, c.head_dim, freq, &af);
    for (int l = 0; l < c.n_layers; l++) (void)model_config_layer_is_moe(&c, l);
    return 0;
}
