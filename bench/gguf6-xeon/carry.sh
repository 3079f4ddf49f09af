#!/usr/bin/env bash
# Lays out the GPU-host payload of bench/gguf6-xeon/run.sh in DEST (default /work/main/.devcarry-gguf6):
# DEST/run.sh (and scale.sh) beside gguf6.tar.xz = a portable exo and mkmodel of this commit
# (make RELEASE=1 OPT=-O3 BUILD=build/portable), llama.cpp's Xeon build (LLAMACPP_REF, default
# build/llamacpp-xeon/llamacpp-ref from LLAMACPP_TARGET=xeon bash scripts/llamacpp.sh), their
# Debian libraries and bench/gguf.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-/work/main/.devcarry-gguf6}
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
echo "exo $(git rev-parse --short HEAD), llama.cpp cui-llama.rn 1.12.2 LLAMACPP_TARGET=xeon" > "$stage/COMMIT"
tar cJf "$dest/gguf6.tar.xz" -C "$stage" .
cp bench/gguf6-xeon/run.sh bench/gguf6-xeon/scale.sh "$dest/"
du -sh "$dest"/*
