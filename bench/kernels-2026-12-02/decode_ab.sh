#!/usr/bin/env bash
# Issue 25 decode runs: batch-1 decode of the Llama-3.2-1B shape (4-bit and 8-bit, g64) for the
# new kernels and the previous main (BASE), one configuration after another, ROUNDS times.
#   bash bench/kernels-2026-12-02/decode_ab.sh BASE_EXO [ROUNDS]
set -u
cd "$(dirname "$0")/../.."
base=${1:?usage: decode_ab.sh BASE_EXO [ROUNDS]}
rounds=${2:-1}
new=build/release/exo
q4=.cache/bench/llama-3.2-1b-4bit
q8=.cache/bench/llama-3.2-1b-8bit
run() { # label, env..., -- exo model
  local label=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local exo=$1 model=$2
  echo "== $label ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)): ${envs[*]} $exo bench --model $model --pp 16 --tg 64 --batch 1 --reps 3"
  env "${envs[@]}" "$exo" bench --model "$model" --pp 16 --tg 64 --batch 1 --reps 3 2>&1 | grep -E "^(decode|mem   read|exo bench)"
}
for r in $(seq 1 "$rounds"); do
  echo "#### round $r"
  run "q4 avx512 new" X=1 -- "$new" $q4
  run "q4 avx512 base" X=1 -- "$base" $q4
  run "q4 avx2 rows16 vnni new" EXO_CPU_SIMD=avx2 -- "$new" $q4
  run "q4 avx2 rows16 maddubs new" EXO_CPU_SIMD=avx2 EXO_AVX2_VNNI=0 -- "$new" $q4
  run "q4 avx2 mlx-order new" EXO_CPU_SIMD=avx2 EXO_Q4_LAYOUT=mlx -- "$new" $q4
  run "q4 avx2 base" EXO_CPU_SIMD=avx2 -- "$base" $q4
  run "q8 avx512 rows16 new" X=1 -- "$new" $q8
  run "q8 avx512 mlx-order new" EXO_Q8_LAYOUT=mlx -- "$new" $q8
  run "q8 avx512 base" X=1 -- "$base" $q8
done
