#!/usr/bin/env bash
# End-to-end model benchmarks (issue 3): prefill pp128/512/2048 and decode tg128 at batch 1 and 8
# for random-weight models shaped like Llama-3.2-1B (bf16 and 4-bit), Qwen3-8B (4-bit) and
# Qwen3-30B-A3B (4-bit MoE), each next to this machine's measured bandwidth roofline and GEMM
# peak (exo bench --model). Models are generated once by tools/mkmodel into .cache/bench/.
#   bash bench/models.sh [BUILD_DIR] [MODEL_NAME ...]   (default: build/release, all models)
# Appends its output to bench/RESULTS-models.log; copy the numbers into bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
shift || true
declare -A ARGS=(
  [llama-3.2-1b-bf16]="--preset llama-3.2-1b"
  [llama-3.2-1b-4bit]="--preset llama-3.2-1b --quant-bits 4 --group-size 64"
  [qwen3-8b-4bit]="--preset qwen3-8b --quant-bits 4 --group-size 64"
  [qwen3-30b-a3b-4bit]="--preset qwen3-30b-a3b --quant-bits 4 --group-size 64 --moe-layout mlx"
)
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(llama-3.2-1b-bf16 llama-3.2-1b-4bit qwen3-8b-4bit qwen3-30b-a3b-4bit)
bash scripts/tokenizers.sh >/dev/null
for n in "${names[@]}"; do
  dir=.cache/bench/$n
  if [ ! -f "$dir/config.json" ]; then
    echo "== generating $n (${ARGS[$n]})"
    # shellcheck disable=SC2086
    "$build/tools/mkmodel" --out "$dir" --seed 1 ${ARGS[$n]}
  fi
  echo "== $n  ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
  echo "   $build/exo bench --model $dir --pp 128,512,2048 --tg 128 --batch 1,8"
  "$build/exo" bench --model "$dir" --pp 128,512,2048 --tg 128 --batch 1,8
done 2>&1 | tee -a bench/RESULTS-models.log
