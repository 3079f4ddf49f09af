/* chat — renders a model's chat template over a conversation with the variables transformers'
 * apply_chat_template passes: messages, tools (None when absent), documents=None,
 * add_generation_prompt, bos_token/eos_token, enable_thinking only when the caller sets it, and
 * any extra variables (e.g. reasoning_effort). Messages reach the template as given: like
 * transformers, it does not rewrite tool-call arguments (templates differ on string vs object).
 * Refuses: nothing of its own; template errors come back naming the template line. */
#include "text/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/jinja.h"

struct chat_template {
    jinja_template *jt;
};

chat_template *chat_template_compile(const char *source, char *err, size_t errlen) {
    if (!source) {
        if (errlen) snprintf(err, errlen, "the model has no chat template");
        return NULL;
    }
    jinja_template *jt = jinja_compile(source, strlen(source), err, errlen);
    if (!jt) return NULL;
    chat_template *t = malloc(sizeof *t);
    if (!t) {
        jinja_free(jt);
        if (errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    t->jt = jt;
    return t;
}

void chat_template_free(chat_template *t) {
    if (!t) return;
    jinja_free(t->jt);
    free(t);
}

char *chat_template_render(const chat_template *t, const json_t *messages, const json_t *tools,
                           const chat_render_options *options, char *err, size_t errlen) {
    if (!t) {
        if (errlen) snprintf(err, errlen, "no chat template");
        return NULL;
    }
    chat_render_options defaults = {.enable_thinking = -1};
    if (!options) options = &defaults;
    json_t *ctx = json_object();
    if (!ctx) {
        if (errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (messages)
        json_object_set(ctx, "messages", (json_t *)messages);
    else
        json_object_set_new(ctx, "messages", json_array());
    if (tools)
        json_object_set(ctx, "tools", (json_t *)tools);
    else
        json_object_set_new(ctx, "tools", json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(options->add_generation_prompt));
    /* like transformers' special_tokens_map: a token the tokenizer lacks is not passed at all */
    if (options->bos_token) json_object_set_new(ctx, "bos_token", json_string(options->bos_token));
    if (options->eos_token) json_object_set_new(ctx, "eos_token", json_string(options->eos_token));
    if (options->enable_thinking >= 0)
        json_object_set_new(ctx, "enable_thinking", json_boolean(options->enable_thinking));
    if (options->extra_vars && json_is_object(options->extra_vars))
        json_object_update(ctx, (json_t *)options->extra_vars);
    char *out = jinja_render(t->jt, ctx, NULL, err, errlen);
    json_decref(ctx);
    return out;
}
