#!/usr/bin/env bash
# Runs on the GPU machine (one H200) from the folder bench/spec-gpu/carry.sh laid out, as
# `bash .devcarry-spec/run.sh` from the repo root: test_speculative on the GPU (greedy equality
# with every drafter on every reference fixture, the sampling chi-square), then exo bench --spec
# oracle at batch 1 on the Llama-3.2-1B shape (MLX 4-bit, as on the CPU) and oracle / miss on
# the Llama-3.1-8B shape (bf16), generated here by mkmodel into /dev/shm. About 3 minutes.
# Output: $OUT/spec/{tests.log,bench.log}.   MODELS="llama1b-4bit llama8b-bf16" (default both)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
export EXO_BUILD=build
cudalib=$(dirname "$(ls /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda*/lib*/libcublas.so.13 \
  $(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia/cu13/lib/libcublas.so.13 2>/dev/null | head -1)")
X() { LD_LIBRARY_PATH="$here/lib:$cudalib" "$@"; }
OUT=${OUT:-/tmp/out}/spec; mkdir -p "$OUT"
python3 -c "import lzma,glob,os
for f in glob.glob('lib/*.xz')+glob.glob('.cache/tokenizers/*/*.xz'):
    open(f[:-3],'wb').write(lzma.open(f).read()); os.remove(f)"
chmod +x build/exo build/tools/* build/tests/*
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$OUT/tests.log" 2>&1
m=/dev/shm/exo-spec-models; mkdir -p $m
MODELS=${MODELS:-llama1b-4bit llama8b-bf16}
(for model in $MODELS; do
  case $model in
    llama1b-4bit) X ./build/tools/mkmodel --out $m/$model --preset llama-3.2-1b --quant-bits 4 --group-size 64 --seed 1 ;;
    llama8b-bf16) X ./build/tools/mkmodel --out $m/$model --preset llama-3.1-8b --tokenizer none --vocab 128256 --seed 1 ;;
  esac >/dev/null 2>&1
done) &
{
  echo "== test_speculative (device auto = the GPU)"
  X timeout 170 ./build/tests/test_speculative; echo "rc=$?"
} >> "$OUT/tests.log" 2>&1
grep -E "rc=|PASSED|FAILED|drafted|position" "$OUT/tests.log"
wait
for model in $MODELS; do
  specs="oracle miss"; [ $model = llama1b-4bit ] && specs=oracle
  for spec in $specs; do
    echo "== exo bench --model $model --device cuda --spec $spec --spec-k 2,4 --tg 128 --reps 3"
    X timeout 40 ./build/exo bench --model "$m/$model" --device cuda --spec $spec --spec-k 2,4 --tg 128 --reps 3 2>&1 | grep -E "^speculative|exo bench:"
  done
done 2>&1 | tee "$OUT/bench.log"
rm -rf "$m"
