#!/usr/bin/env bash
# check-prefetch — fails (exit 1, one line per problem) when the matvec kernels' software
# prefetch is missing from the compiled code. GCC 12 deletes loops of __builtin_prefetch (and
# _mm_prefetch) as code without effect: for sessions the AVX-512 interleaved kernels carried no
# prefetch at all while their source asked for one (issue 25, cpu26). So:
#   primitive  cpu_rows16_prefetch called in a loop beside other work, compiled at -O2, must
#              emit prefetcht0 (L1) and prefetcht1 (L2)
#   kernels    BUILD's matmul_avx512.o must hold prefetcht1 (only the interleaved kernels' L2
#              path issues it) and matmul_avx2.o prefetcht0
# x86-64 only: prints "skipped" and passes elsewhere (the aarch64 kernels prefetch nothing).
#   scripts/check-prefetch.sh [BUILD]    (default build)
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
case "$(uname -m)" in x86_64) ;; *) echo "check-prefetch: skipped (not x86-64)"; exit 0;; esac
obj=$build/obj/src/compute/cpu
# a cross build (make CROSS=..., tests/run-cross.sh) has no x86 kernels: its cpu.o tells
if [ -f "$obj/cpu.o" ] && ! objdump -f "$obj/cpu.o" | grep -q 'x86-64'; then
  echo "check-prefetch: skipped ($build is not an x86-64 build)"; exit 0
fi
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/probe.c" <<'C'
#include "compute/cpu/cpu_internal.h"
float probe(const weight_matrix *w, const float *x, int l2) {
    cpu_rows16_block blk = cpu_rows16_block_at(w, 3, 2048);
    blk.to_l2 = l2;
    float s = 0;
    for (int g = 0; g < 32; g++) {
        cpu_rows16_prefetch(&blk, g);
        s += x[g * 7];
    }
    return s;
}
C
if ! ${CC:-gcc} -std=c17 -O2 -D_GNU_SOURCE -Isrc -S "$tmp/probe.c" -o "$tmp/probe.s" 2>"$tmp/err"; then
  echo "check-prefetch: primitive: the probe does not compile:"; cat "$tmp/err"; exit 1
fi
for i in prefetcht0 prefetcht1; do
  grep -q "$i" "$tmp/probe.s" || { echo "check-prefetch: primitive: cpu_rows16_prefetch emits no $i at -O2"; fail=1; }
done
for f in "matmul_avx512.o prefetcht1" "matmul_avx2.o prefetcht0"; do
  set -- $f
  if [ ! -f "$obj/$1" ]; then echo "check-prefetch: kernels: $obj/$1 missing (build first)"; fail=1; continue; fi
  objdump -d "$obj/$1" | grep -q "$2" || { echo "check-prefetch: kernels: $obj/$1 holds no $2"; fail=1; }
done
[ $fail = 0 ] && echo "check-prefetch: ok"
exit $fail
