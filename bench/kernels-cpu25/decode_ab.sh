#!/usr/bin/env bash
# Issue 25, cpu25 branch: batch-1 decode of the Llama-3.2-1B shape against the memory roofline,
# BASE_EXO (main before the branch) and build/release/exo (the branch) alternated, ROUNDS times:
# 8-bit AVX-512, 4-bit AVX2-only (vpmaddubsw, as on CPUs without AVX-VNNI) and 8-bit AVX2-only.
#   bash bench/kernels-cpu25/decode_ab.sh BASE_EXO [ROUNDS]
# Models: build/release/tools/mkmodel --out .cache/bench/llama-3.2-1b-Nbit --preset llama-3.2-1b
# --quant-bits N --group-size 64 --seed 1 (N = 4, 8). The GPU machine's run is run_xeon.sh here
# (the same lines, pinned to 2 cores, portable builds; see bench/RESULTS.md).
set -u
cd "$(dirname "$0")/../.."
base=${1:?usage: decode_ab.sh BASE_EXO [ROUNDS]}
for r in $(seq 1 "${2:-2}"); do
  for cfg in "X=1|8" "EXO_CPU_SIMD=avx2 EXO_AVX2_VNNI=0|4" "EXO_CPU_SIMD=avx2 EXO_AVX2_VNNI=0|8"; do
    envs=${cfg%%|*} bits=${cfg#*|}
    for exo in "$base" build/release/exo; do
      echo "== r$r $envs $exo q$bits ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
      env $envs "$exo" bench --model .cache/bench/llama-3.2-1b-${bits}bit --pp 16 --tg 64 --batch 1 --reps 3 2>&1 |
        grep -E "^(decode|mem   read)"
    done
  done
done
