#!/usr/bin/env bash
# Issue 24 on the GPU machine's 16-core Xeon (AMX; the GPU unused), ~7 min: bench/gguf.sh, exo
# (main after session 10: AMX prefill with 2 tile products, two 16-row blocks in flight, the GGUF
# arena fix) beside llama.cpp's AMX build (cui-llama.rn 1.12.2, LLAMACPP_TARGET=xeon) on the same
# GGUF files (mkmodel --gguf-row-pool 64 into /dev/shm): 1B (pp512 tg64) and 8B (pp128 tg32) Llama
# shapes, Q4_0 / Q4_K_M / Q8_0, 8 threads pinned to cores 0-7, exo then llama.cpp per model, twice.
# Then the 8B once more at 16 threads (all cores). Results: $OUT/gguf6/bench.log
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/gguf6-out}/gguf6
mkdir -p "$out"
work=$(mktemp -d /dev/shm/gguf6.XXXXXX)
trap 'rm -rf "$work" /dev/shm/gguf6-models' EXIT
tar xJf "$here/gguf6.tar.xz" -C "$work"
export LD_LIBRARY_PATH=$work/lib
start=$(date +%s)
left() { local v=$(( $1 - $(date +%s) + start )); [ "$v" -ge 1 ] || v=1; echo "$v"; }
{
  echo "== host"; nproc; lscpu | grep -E 'Model name|L3|NUMA node0|Thread'; free -g | head -2
  echo "load: $(cat /proc/loadavg)"; cat "$work/COMMIT"
  cd "$work"
  export GGUF_DIR=/dev/shm/gguf6-models GGUF_SHAPES="1b 8b" EXO_LLAMACPP_REF=build/llamacpp-ref
  GGUF_RUNS=" " timeout 120 bash bench/gguf.sh build | grep '^# models'
  echo "== 8 threads ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
  GGUF_RUNS="${GGUF6_RUNS:-1b:8:2 8b:8:2}" GGUF_DEADLINE=$(left 330) timeout $(left 400) bash bench/gguf.sh build
  echo "== 16 threads ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
  GGUF_RUNS="8b:16:1" GGUF_DEADLINE=$(left 420) timeout $(left 480) bash bench/gguf.sh build
  echo "== done in $(( $(date +%s) - start )) s"
} > "$out/bench.log" 2>&1
tail -40 "$out/bench.log"
