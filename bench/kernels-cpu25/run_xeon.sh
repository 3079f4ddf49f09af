#!/usr/bin/env bash
# cpu25 (issue 25) on the GPU machine's Xeon, its GPU unused: batch-1 decode of the Llama-3.2-1B
# shape (random weights, MLX 8-bit and 4-bit g64) against the memory roofline each run measures
# (exo bench --model: read probe of the same threads before and after), pinned to 2 cores
# (taskset, --threads 2: this dev VM's core count). base = main at 60b2098, new = branch cpu25 at 3e85783;
# both portable builds (-O3, no -march) carried with their Debian libraries. Runs alternate
# base/new. Writes $OUT/cpu25/log.txt. About 2 minutes.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/cpu25-out}/cpu25
mkdir -p "$out"
x=/tmp/cpu25x
rm -rf $x && mkdir -p $x && tar xJf "$here/payload.tar.xz" -C $x
export LD_LIBRARY_PATH=$x/lib
M=/dev/shm/cpu25
CORES=${CORES:-2,3}
TG=${TG:-64}
REPS=${REPS:-1}
t0=$(date +%s)
{
echo "== host"; nproc; lscpu | grep -E 'Model name|Thread|Socket|L2|L3|NUMA node0'
lscpu | grep -o -E 'avx512_vnni|avx_vnni|avx512vbmi|amx_int8' | sort -u | tr '\n' ' '; echo
free -g | head -2; uptime
mkdir -p $M
for b in 4 8; do
  [ -f $M/llama-3.2-1b-${b}bit/model.safetensors ] || \
    $x/new/mkmodel --out $M/llama-3.2-1b-${b}bit --preset llama-3.2-1b --quant-bits $b --group-size 64 \
      --tokenizer none --vocab 128256 --seed 1 >/dev/null &
done
wait; echo "models made in $(( $(date +%s) - t0 )) s"; du -sh $M/*
run() { # label, exo (base|new), bits, env...
  local label=$1 which=$2 bits=$3; shift 3
  echo "== $label ($(( $(date +%s) - t0 )) s, load $(cut -d' ' -f1-3 /proc/loadavg)): $* $which bench --threads 2 --model 1b-${bits}bit --pp 16 --tg $TG --batch 1 --reps $REPS"
  env "$@" taskset -c $CORES $x/$which/exo bench --threads 2 --model $M/llama-3.2-1b-${bits}bit --pp 16 --tg $TG \
    --batch 1 --reps $REPS 2>&1 | grep -E "^(decode|mem   read|exo bench)"
}
for r in 1 2; do
  echo "#### round $r"
  run "q8 avx512 base" base 8 X=1
  run "q8 avx512 new" new 8 X=1
  run "q4 avx2 vpmaddubsw base" base 4 EXO_CPU_SIMD=avx2 EXO_AVX2_VNNI=0
  run "q4 avx2 vpmaddubsw new" new 4 EXO_CPU_SIMD=avx2 EXO_AVX2_VNNI=0
done
echo "#### new only"
run "q8 avx2 vpmaddwd new" new 8 EXO_CPU_SIMD=avx2 EXO_AVX2_VNNI=0
run "q8 avx2 avx-vnni new" new 8 EXO_CPU_SIMD=avx2
echo "== done in $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$out/log.txt"
rm -rf $x $M
