#!/usr/bin/env bash
# The three bars of issue 25 in turn, ROUNDS times: 8-bit interleaved vs MLX order (AVX-512),
# 4-bit AVX2-only (interleaved, both dot forms), 4-bit AVX-512.   bash decode_focus.sh [ROUNDS]
set -u
cd "$(dirname "$0")/../.."
for r in $(seq 1 "${1:-2}"); do
  for cfg in "X=1|llama-3.2-1b-8bit" "EXO_Q8_LAYOUT=mlx|llama-3.2-1b-8bit" "EXO_CPU_SIMD=avx2|llama-3.2-1b-4bit" \
             "EXO_CPU_SIMD=avx2 EXO_AVX2_VNNI=0|llama-3.2-1b-4bit" "X=1|llama-3.2-1b-4bit"; do
    envs=${cfg%%|*}; m=${cfg#*|}
    echo "== r$r $envs $m ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
    env $envs build/release/exo bench --model .cache/bench/$m --pp 16 --tg 64 --batch 1 --reps 3 2>&1 | grep -E "^decode"
  done
done
