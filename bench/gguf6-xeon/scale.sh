#!/usr/bin/env bash
# 1B Q4_0 / Q8_0 decode at 4, 8, 12, 16 threads (exo only): where the per-token fixed costs show.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/gguf6-out}/gguf6; mkdir -p "$out"
work=$(mktemp -d /dev/shm/gguf6.XXXXXX); trap 'rm -rf "$work" /dev/shm/gguf6-models' EXIT
tar xJf "$here/gguf6.tar.xz" -C "$work"; export LD_LIBRARY_PATH=$work/lib
cd "$work"
{
  export GGUF_DIR=/dev/shm/gguf6-models GGUF_SHAPES="1b" GGUF_TYPES="Q4_0 Q8_0" EXO_LLAMACPP_REF=build/llamacpp-ref
  GGUF_RUNS=" " timeout 60 bash bench/gguf.sh build | grep '^# models'
  for r in 1 2; do for t in Q4_0 Q8_0; do for th in 4 8 12 16; do
    echo "[r$r $t threads $th] $(timeout 40 taskset -c 0-$((th-1)) build/exo bench --threads $th --model /dev/shm/gguf6-models/l1b-$t --pp 16 --tg 64 --batch 1 --reps 1 2>&1 | grep -E '^decode' | cut -c1-160)"
  done; done; done
  timeout 30 build/exo bench --section pool --threads 16 2>&1 | tail -1
  timeout 30 build/exo bench --section pool --threads 8 2>&1 | tail -1
} > "$out/scale.log" 2>&1
cat "$out/scale.log"
