/* chat — turns a conversation into the prompt a model expects, by rendering the model's own
 * Jinja chat template (text/jinja/) the way Hugging Face transformers' apply_chat_template does.
 *
 * Messages and tools are jansson values in OpenAI shape: [{"role", "content" (string or list of
 * parts), "tool_calls"?, "tool_call_id"?, "reasoning_content"?}], tools [{"type":"function",
 * "function":{name, description, parameters}}]. */
#ifndef EXO_TEXT_CHAT_H
#define EXO_TEXT_CHAT_H

#include <jansson.h>
#include <stddef.h>

typedef struct chat_template chat_template;

typedef struct chat_render_options {
    int add_generation_prompt; /* append the assistant turn opener */
    int enable_thinking;       /* -1 = leave undefined for the template; 0/1 = pass as a variable */
    const char *bos_token;     /* from tokenizer_config.json (NULL = "") */
    const char *eos_token;
    const json_t *extra_vars;  /* optional object of extra template variables (may be NULL) */
} chat_render_options;

/* Compiles a template's source. Returns NULL with an error naming the line on syntax errors. */
chat_template *chat_template_compile(const char *source, char *err, size_t errlen);
void chat_template_free(chat_template *t);

/* Renders; returns a malloc'd NUL-terminated prompt or NULL with err (template errors, including
 * raise_exception(), name the template line). */
char *chat_template_render(const chat_template *t, const json_t *messages, const json_t *tools,
                           const chat_render_options *options, char *err, size_t errlen);

#endif
