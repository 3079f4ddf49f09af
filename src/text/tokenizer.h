/* tokenizer — Hugging Face tokenizer.json (+ tokenizer_config.json) in C: byte-level BPE
 * (GPT-2/Llama 3/Qwen), SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Gemma),
 * normalizers, pre-tokenizers, decoders, added/special tokens, post-processor BOS/EOS.
 * Token ids equal those of the Hugging Face `tokenizers` library.
 *
 * A loaded tokenizer is immutable and may be used from many threads at once. */
#ifndef EXO_TEXT_TOKENIZER_H
#define EXO_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

/* Loads <model_dir>/tokenizer.json and, if present, <model_dir>/tokenizer_config.json.
 * Returns NULL with a message naming the file and the problem. */
tokenizer *tokenizer_load(const char *model_dir, char *err, size_t errlen);
/* Same from memory (config_json may be NULL). */
tokenizer *tokenizer_load_from_json(const char *tokenizer_json, size_t len, const char *config_json,
                                    size_t config_len, char *err, size_t errlen);
void tokenizer_free(tokenizer *t);

/* Encodes UTF-8 text. add_special_tokens applies the post-processor (e.g. BOS) as
 * `tokenizer.encode(text, add_special_tokens=...)` does; special tokens written in the text are
 * always recognised. Returns the number of ids (written to *ids_out, malloc'd, caller frees),
 * or -1 with err. Invalid UTF-8 is treated as U+FFFD replacement characters per byte. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_special_tokens,
                     int32_t **ids_out, char *err, size_t errlen);

/* Decodes ids to UTF-8 text (malloc'd, NUL-terminated) as `tokenizer.decode(ids,
 * skip_special_tokens=...)`. *len_out (if not NULL) gets its length in bytes. */
char *tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, int skip_special_tokens,
                       size_t *len_out);

/* The raw bytes one token contributes to decoded output (byte-level/byte-fallback resolved,
 * `▁` as space), for logprobs `bytes`. Returns the byte count (may exceed cap: then truncated). */
size_t tokenizer_token_bytes(const tokenizer *t, int32_t id, uint8_t *buf, size_t cap);
/* The bytes of tokenizer_token_bytes as text (malloc'd, NUL-terminated; invalid UTF-8 as U+FFFD):
 * what the token reads as in the middle of a text, leading space kept, for logprobs. */
char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len_out);
/* The vocabulary string of a token (as in tokenizer.json), or NULL for an unknown id. */
const char *tokenizer_token_string(const tokenizer *t, int32_t id);
/* The id of an exact vocabulary or added-token string, or -1. */
int32_t tokenizer_token_id(const tokenizer *t, const char *token);
int tokenizer_vocab_size(const tokenizer *t);
int tokenizer_is_special(const tokenizer *t, int32_t id);

/* From tokenizer_config.json: bos/eos token strings (NULL if absent), the chat template
 * (NULL if absent; a named-template list yields the "default" one). */
const char *tokenizer_bos_token(const tokenizer *t);
const char *tokenizer_eos_token(const tokenizer *t);
const char *tokenizer_chat_template(const tokenizer *t);

/* Streaming detokenizer: turns ids into text as they arrive, never emitting a partial UTF-8
 * character (incomplete bytes are held until completed), with the same text as a one-shot
 * tokenizer_decode of all ids (leading-space rules and byte fallback included). */
typedef struct detokenizer detokenizer;
detokenizer *detokenizer_new(const tokenizer *t, int skip_special_tokens);
void detokenizer_free(detokenizer *d);
/* Appends the newly completed text for `id` to out (out_cap bytes incl. NUL); returns bytes
 * written (may be 0). The caller passes a buffer of at least 256 bytes. */
size_t detokenizer_push(detokenizer *d, int32_t id, char *out, size_t out_cap);
/* Emits whatever is held (incomplete bytes become U+FFFD). */
size_t detokenizer_flush(detokenizer *d, char *out, size_t out_cap);
/* Bytes of finished text that did not fit in the caller's buffer and wait for the next
 * push/flush (call detokenizer_flush again while this is > 0 to drain everything). */
size_t detokenizer_pending(const detokenizer *d);

#endif
