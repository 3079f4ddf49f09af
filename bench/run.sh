#!/usr/bin/env bash
# The benchmark run recorded in bench/RESULTS.md (`make bench` calls it with build/release).
#   bench/run.sh [BUILD_DIR]          kernels, then every model already generated under
#                                     .cache/bench/ (bench/models.sh generates the issue's four)
#   BENCH_QUICK=1 bench/run.sh        small sweeps (smoke test; numbers not meaningful)
#   BENCH_MODELS="a b" bench/run.sh   only these model directories
# Prints everything and keeps a copy in .cache/bench-out/<timestamp>.txt (not committed).
# Every ratio is against a baseline measured in the same run: the read-only memory bandwidth
# (decode roofline) and the f32 GEMM peak (prefill).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
exo="$build/exo"
[ -x "$exo" ] || { echo "bench: $exo not built (make RELEASE=1)" >&2; exit 1; }
mkdir -p .cache/bench-out
log=".cache/bench-out/$(date -u +%Y%m%dT%H%M%SZ).txt"
quick=()
[ "${BENCH_QUICK:-0}" = 1 ] && quick=(--quick)
{
  echo "# exo bench run $(date -u +%FT%TZ) on $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# git: $(git describe --always --dirty 2>/dev/null)"
  "$exo" bench "${quick[@]}"
  models=${BENCH_MODELS:-$(ls -d .cache/bench/*/ .cache/bench-models/*/ 2>/dev/null)}
  for m in $models; do
    [ -f "$m/config.json" ] || continue
    if [ "${BENCH_QUICK:-0}" = 1 ]; then
      "$exo" bench --quick --model "$m" --pp 128 --tg 16 --batch 1
    else
      echo "== $m: $exo bench --model $m --pp 128,512,2048 --tg 128 --batch 1,8"
      "$exo" bench --model "$m" --pp 128,512,2048 --tg 128 --batch 1,8
    fi
  done
  echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$log"
echo "bench: log in $log"
