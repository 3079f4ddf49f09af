/* libFuzzer target for the Jinja engine: the input is template source, rendered against a fixed
 * chat-like context with small limits. Any crash, leak or sanitizer report is a bug; template
 * errors are fine (they must only come back as messages). */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "text/jinja/jinja.h"

static json_t *context(void) {
    static json_t *ctx;
    if (!ctx)
        ctx = json_loads(
            "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", "
            "\"content\": \"hi <b>\"},"
            " {\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"r\", "
            "\"tool_calls\": [{\"id\": \"c1\","
            " \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, "
            "\"b\": [1.5, true, null]}}}]},"
            " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"},"
            " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part\"}]}],"
            " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
            "\"description\": \"d\","
            " \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
            "\"integer\"}}, \"required\": [\"a\"]}}}],"
            " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", "
            "\"n\": 3, \"s\": \"héllo\"}",
            0, NULL);
    return ctx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    jinja_template *t = jinja_compile((const char *)data, size, err, sizeof err);
    if (!t) return 0;
    jinja_limits limits = {.max_output_bytes = 1 << 20,
                           .max_memory_bytes = 64 << 20,
                           .max_iterations = 100000,
                           .max_depth = 64};
    char *out = jinja_render(t, context(), &limits, err, sizeof err);
    free(out);
    jinja_free(t);
    return 0;
}
