#!/usr/bin/env bash
# Builds the kernel benchmark alone (no HTTP/ZeroMQ libraries needed: only OpenBLAS), for machines
# that have a compiler and OpenBLAS but not exo's other dependencies. Prints the binary's path.
#   bash bench/standalone.sh [OUT_DIR]  ->  OUT_DIR/exo-bench-kernels bench [options of exo bench]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/standalone}
mkdir -p "$out"
cat > "$out/main.c" <<'C'
int cmd_bench_main(int argc, char **argv);
int main(int argc, char **argv) { return cmd_bench_main(argc - 1, argv + 1); }
C
blas_inc=$(ls -d /usr/include/x86_64-linux-gnu/openblas-pthread 2>/dev/null || echo /usr/include)
${CC:-cc} -std=c17 -O2 -g -D_GNU_SOURCE -pthread -Isrc -I"$blas_inc" \
  "$out/main.c" src/cmd_bench.c src/cmd_bench_model.c src/compute/compute.c src/compute/cpu/*.c \
  src/base/threadpool.c src/base/clock.c -lopenblas -lm -o "$out/exo-bench-kernels"
echo "$out/exo-bench-kernels"
