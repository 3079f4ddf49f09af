#!/usr/bin/env bash
# Lays out run_s7.sh's folder in DEST (default /work/main/.devcarry-dist3): run.sh, this tree's
# bench/dist_scaling.sh, a portable release build (make RELEASE=1 OPT=-O3 BUILD=build/portable:
# no -march=native, the GPU host's CPU is another) of exo, mkmodel and netproxy, stripped, and the
# Debian libraries they link that the GPU image lacks (xz; run.sh unpacks them with python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-/work/main/.devcarry-dist3}
b=build/portable
make -j2 RELEASE=1 OPT=-O3 BUILD=$b $b/exo $b/tools/mkmodel $b/tools/netproxy >/dev/null
rm -rf "$dest"; mkdir -p "$dest"/{build/tools,bench,lib}
cp bench/dist-h200-cpu-2026-12-02/run_s7.sh "$dest/run.sh"
cp bench/dist_scaling.sh "$dest/bench/"
strip -o "$dest/build/exo" $b/exo
for t in mkmodel netproxy; do strip -o "$dest/build/tools/$t" $b/tools/$t; done
for bin in "$dest"/build/exo "$dest"/build/tools/*; do ldd "$bin"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so' |
  while read -r l; do xz -T1 -9e -c "$l" > "$dest/lib/$(basename "$l").xz"; done
du -sh "$dest"
