#!/usr/bin/env bash
# Runs on the GPU machine (one H200) from a folder laid out by bench/cuda/carry.sh: the CUDA op
# tests, the reference fixtures on the GPU, `exo run` and node info on the GPU, then exo bench
# --device cuda on the Llama-3.1-8B shape (random weights, bf16 and MLX 4-bit g64), generated
# here by mkmodel into /dev/shm while the tests run. Logs go to $OUT as they are written.
#   MODELS="bf16 4bit" (default both)   SANITIZE=1 (compute-sanitizer memcheck of the op tests)
#   BATCH=1,64   PP=512,2048   GRAPHS_AB=1 (b1 bf16 decode again with EXO_CUDA_GRAPHS=0)
#   PROFILE=1 (ncu over a few 4-bit decode steps: where the one-token GEMV spends its time)
set -uo pipefail
export EXO_BUILD=build
MODELS=${MODELS:-bf16 4bit} BATCH=${BATCH:-1,64} PP=${PP:-512,2048}
# the carried libraries only for exo's own binaries (system tools keep the image's)
cudalib=$(dirname "$(ls /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda*/lib*/libcublas.so.13 \
  $(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia/cu13/lib/libcublas.so.13 2>/dev/null | head -1)")
X() { LD_LIBRARY_PATH="$PWD/lib:$cudalib" "$@"; }
echo "cuBLAS from $cudalib"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import lzma,glob,os
for f in glob.glob('lib/*.xz')+glob.glob('.cache/tokenizers/*/*.xz'):
    open(f[:-3],'wb').write(lzma.open(f).read()); os.remove(f)"
chmod +x build/exo build/tools/* build/tests/*
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/gpu.log"
m=/dev/shm/exo-models; mkdir -p $m
gen() { X ./build/tools/mkmodel --out "$m/llama8b-$1" --preset llama-3.1-8b --tokenizer none --vocab 128256 --seed 1 "${@:2}" >"$OUT/mkmodel-$1.log" 2>&1; }
for q in $MODELS; do # the 4-bit one takes longest (~110 s): both in parallel with the tests
  if [ "$q" = 4bit ]; then (time gen 4bit --quant-bits 4 --group-size 64) 2>>"$OUT/mkmodel-time.log" &
  else (time gen "$q") 2>>"$OUT/mkmodel-time.log" &
  fi
done
{
  echo "== test_cuda_ops"; X timeout 120 ./build/tests/test_cuda_ops; echo "rc=$?"
  echo "== test_engine_reference (GPU passes)"; EXO_TEST_DEVICE=cuda X timeout 240 ./build/tests/test_engine_reference; echo "rc=$?"
  echo "== exo run --device cuda"; X timeout 60 ./build/exo run .cache/reference-models/qwen3-tiny "Hello there" --max-tokens 12 --temperature 0 --raw --device cuda; echo "rc=$?"
  echo "== nodeinfo (gpus)"; X timeout 30 ./build/tools/nodeinfo 2>&1 | grep -A12 '"gpus"'
  if [ "${SANITIZE:-1}" = 1 ]; then
    echo "== compute-sanitizer memcheck test_cuda_ops"; X timeout 200 compute-sanitizer --tool memcheck --print-limit 20 ./build/tests/test_cuda_ops 2>&1 | tail -30
  fi
} > "$OUT/tests.log" 2>&1
grep -E "rc=|PASSED|FAILED|ERROR SUMMARY|skipped" "$OUT/tests.log"
wait
grep real "$OUT/mkmodel-time.log"
for q in $MODELS; do
  echo "== exo bench --model $m/llama8b-$q --device cuda --pp $PP --tg 128 --batch $BATCH --reps 3"
  X timeout 240 ./build/exo bench --model "$m/llama8b-$q" --device cuda --pp "$PP" --tg 128 --batch "$BATCH" --reps 3 2>&1 | grep -v "^mem "
done 2>&1 | tee "$OUT/bench.log"
if [ "${GRAPHS_AB:-0}" = 1 ]; then
  echo "== the same b1 decode without CUDA graphs (EXO_CUDA_GRAPHS=0)" | tee -a "$OUT/bench.log"
  EXO_CUDA_GRAPHS=0 X timeout 120 ./build/exo bench --model "$m/llama8b-bf16" --device cuda --pp 128 --tg 128 --batch 1 --reps 2 2>&1 | grep "decode" | tee -a "$OUT/bench.log"
fi
if [ "${PROFILE:-0}" = 1 ] && [ -d "$m/llama8b-4bit" ]; then
  echo "== ncu: 4-bit decode kernels" | tee "$OUT/ncu.log"
  EXO_CUDA_GRAPHS=0 X timeout 300 ncu --clock-control none --launch-skip 2000 --launch-count 40 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    ./build/exo bench --model "$m/llama8b-4bit" --device cuda --pp 16 --tg 8 --batch 1 --reps 1 >> "$OUT/ncu.log" 2>&1
  grep -E "gemv|attention|Duration|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Stall" "$OUT/ncu.log" | head -80
fi
