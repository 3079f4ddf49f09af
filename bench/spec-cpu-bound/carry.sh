#!/usr/bin/env bash
# Lays out what bench/spec-cpu-bound/run_on_gpu_host.sh needs in DEST (default
# /work/main/.devcarry-spec2): this build's exo and mkmodel (make; CPU only, SIMD chosen at run
# time) and the Debian libraries they link besides libc (xz; the GPU image lacks them).
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-/work/main/.devcarry-spec2}
rm -rf "$dest"; mkdir -p "$dest"/{build/tools,lib}
cp bench/spec-cpu-bound/run_on_gpu_host.sh "$dest/run.sh"
strip -o "$dest/build/exo" build/exo
strip -o "$dest/build/tools/mkmodel" build/tools/mkmodel
for bin in "$dest"/build/exo "$dest"/build/tools/*; do ldd "$bin"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so' |
  while read -r l; do xz -T1 -6 -c "$l" > "$dest/lib/$(basename "$l").xz"; done
du -sh "$dest"
