#!/usr/bin/env bash
# Lays out what bench/spec-gpu/run_on_gpu.sh needs in DEST (default /work/main/.devcarry-spec):
# the CUDA build's exo, mkmodel and test_speculative (make CUDA=1), the Debian libraries they
# link that the GPU image lacks (xz), the reference fixtures and their two tokenizers.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-/work/main/.devcarry-spec}
b=build/cuda
rm -rf "$dest"; mkdir -p "$dest"/{build/tools,build/tests,lib,tests/fixtures,.cache/tokenizers}
cp bench/spec-gpu/run_on_gpu.sh "$dest/run.sh"
strip -o "$dest/build/exo" $b/exo
strip -o "$dest/build/tools/mkmodel" $b/tools/mkmodel
strip -o "$dest/build/tests/test_speculative" $b/tests/test_speculative
cp -r tests/fixtures/reference "$dest/tests/fixtures/"
for t in qwen3 llama3_1; do
  mkdir -p "$dest/.cache/tokenizers/$t"
  cp .cache/tokenizers/$t/tokenizer_config.json "$dest/.cache/tokenizers/$t/"
  xz -T1 -6 -c .cache/tokenizers/$t/tokenizer.json > "$dest/.cache/tokenizers/$t/tokenizer.json.xz"
done
for bin in "$dest"/build/exo "$dest"/build/tests/* "$dest"/build/tools/*; do ldd "$bin"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so|/cuda' |
  while read -r l; do xz -T1 -6 -c "$l" > "$dest/lib/$(basename "$l").xz"; done
du -sh "$dest"
