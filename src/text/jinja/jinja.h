/* jinja — a Jinja2 template engine in C, for the chat templates that models ship.
 *
 * It renders templates the way Hugging Face transformers' apply_chat_template does with Python
 * Jinja2 3.1: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * extensions=[loopcontrols, generation tracker]), tojson as json.dumps(ensure_ascii=False),
 * globals raise_exception, strftime_now, range, dict, namespace. Output is byte-for-byte what
 * Jinja2 prints, including Python's repr of lists, dicts and floats.
 *
 * It refuses: template inheritance and loading (extends, include, import, block), autoescape,
 * mutating lists/dicts from a template (the sandbox forbids it too), and anything that would run
 * without bound — rendering stops with an error past the limits below. Every failure (syntax,
 * unsupported feature, raise_exception, type error) is an error message naming the template line.
 *
 * A compiled template is immutable; rendering it from several threads at once is safe. */
#ifndef EXO_TEXT_JINJA_H
#define EXO_TEXT_JINJA_H

#include <jansson.h>
#include <stddef.h>

typedef struct jinja_template jinja_template;

typedef struct jinja_limits {
    size_t max_output_bytes;  /* rendered text; default 64 MiB */
    size_t max_memory_bytes;  /* values made while rendering; default 512 MiB */
    long long max_iterations; /* loop iterations + macro calls in one render; default 10M */
    int max_depth;            /* nesting of macro calls / expressions; default 200 */
} jinja_limits;

/* Compiles template source (UTF-8, len bytes). NULL + err ("line N: ...") on syntax errors. */
jinja_template *jinja_compile(const char *source, size_t len, char *err, size_t errlen);
void jinja_free(jinja_template *t);

/* Renders with the variables of `context` (a JSON object; may be NULL). limits may be NULL for
 * the defaults. Returns malloc'd NUL-terminated text, or NULL with err ("line N: ..."). */
char *jinja_render(const jinja_template *t, const json_t *context, const jinja_limits *limits,
                   char *err, size_t errlen);

#endif
