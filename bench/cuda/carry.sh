#!/usr/bin/env bash
# Lays out what bench/cuda/run_on_gpu.sh needs in DEST (default /work/main/.devcarry/cuda, a
# folder the device tool carries): the CUDA build's binaries (make CUDA=1, no -march=native:
# the GPU machine's CPU may differ), the Debian libraries they link that an Ubuntu image lacks
# (xz-compressed), the reference fixtures and the two tokenizers they use.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-/work/main/.devcarry/cuda}
b=build/cuda
rm -rf "$dest"; mkdir -p "$dest"/{build/tools,build/tests,lib,tests/fixtures,.cache/tokenizers}
cp bench/cuda/run_on_gpu.sh "$dest/run.sh"
strip -o "$dest/build/exo" $b/exo
for t in mkmodel nodeinfo; do strip -o "$dest/build/tools/$t" $b/tools/$t; done
for t in test_cuda_ops test_engine_reference; do strip -o "$dest/build/tests/$t" $b/tests/$t; done
cp -r tests/fixtures/reference "$dest/tests/fixtures/"
for t in qwen3 llama3_1; do
  mkdir -p "$dest/.cache/tokenizers/$t"
  cp .cache/tokenizers/$t/tokenizer_config.json "$dest/.cache/tokenizers/$t/"
  xz -T1 -6 -c .cache/tokenizers/$t/tokenizer.json > "$dest/.cache/tokenizers/$t/tokenizer.json.xz"
done
# every shared library outside glibc, libstdc++/libgcc and CUDA (those the image has)
for bin in "$dest"/build/exo "$dest"/build/tests/*; do ldd "$bin"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so|/cuda' |
  while read -r l; do xz -T1 -6 -c "$l" > "$dest/lib/$(basename "$l").xz"; done
du -sh "$dest"
