#!/usr/bin/env bash
# Lays out the GPU-host payload of bench/gguf4-xeon/run.sh in DEST (default
# /work/main/.devcarry-gguf4): DEST/run.sh (and run2.sh, the optional second run; setup.sh, which
# both source) beside gguf4.tar.xz = a portable exo and mkmodel of
# this branch (make RELEASE=1 OPT=-O3 BUILD=build/portable), llama.cpp's Xeon build
# (LLAMACPP_TARGET=xeon bash scripts/llamacpp.sh, or LLAMACPP_REF=path to an existing one),
# their Debian libraries, bench/gguf.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-/work/main/.devcarry-gguf4}
ref=${LLAMACPP_REF:-build/llamacpp-xeon/llamacpp-ref}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/tools" "$stage/bench" "$stage/lib" "$dest"
strip -o "$stage/build/exo" build/portable/exo
strip -o "$stage/build/tools/mkmodel" build/portable/tools/mkmodel
strip -o "$stage/build/llamacpp-ref" "$ref"
cp bench/gguf.sh "$stage/bench/"
for bin in "$stage"/build/exo "$stage"/build/tools/mkmodel "$stage"/build/llamacpp-ref; do ldd "$bin"; done |
  awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
echo "exo $(git rev-parse --short HEAD) (branch gguf4), llama.cpp cui-llama.rn 1.12.2 LLAMACPP_TARGET=xeon" > "$stage/COMMIT"
tar cJf "$dest/gguf4.tar.xz" -C "$stage" .
cp bench/gguf4-xeon/run.sh bench/gguf4-xeon/run2.sh bench/gguf4-xeon/setup.sh "$dest/"
du -sh "$dest"/*
