#!/usr/bin/env bash
# Runs on the GPU machine (one H200) from a folder laid out by bench/cuda/carry.sh: the CUDA op
# tests, the GEMV kernels alone (tools/gemvbench: GB/s per 8B shape, new kernel against
# EXO_CUDA_GEMV=old), the reference fixtures on the GPU, `exo run`, node info and the HTTP API
# (api_smoke.py) on the GPU,
# then exo bench --device cuda on the Llama-3.1-8B shape (random weights, bf16 and MLX 4-bit
# g64, generated here by mkmodel into /dev/shm while the tests run), then a per-kernel time
# breakdown of b1 decode steps through ncu (graphs off). Logs go to $OUT as they are written;
# summary.txt (the lines worth reading) last.
#   MODELS="bf16 4bit" (default both)   SANITIZE=1 (compute-sanitizer memcheck of the op tests)
#   BATCH=1,64   PP=2048   REPS=2   PROFILE=1 (ncu, default on)   GEMVBENCH=1 (default on)
#   ALT, GEMVBENCH_ARGS, NCU_SECTIONS: below   PROFILE_B64=1: ncu of a 4-bit b64 decode step
set -uo pipefail
export EXO_BUILD=build
MODELS=${MODELS:-bf16 4bit} BATCH=${BATCH:-1,64} PP=${PP:-2048} REPS=${REPS:-2}
# ALT: environments for a b1 A/B run of each model (words VAR=VALUE, several: comma-free, one
# run each); GEMVBENCH_ARGS: gemvbench's arguments; NCU_SECTIONS: the kernels ncu details
ALT=${ALT:-EXO_CUDA_GEMV1=prev}
GEMVBENCH_ARGS=${GEMVBENCH_ARGS:---reps 5 --tokens 1,2,4,8,64}
NCU_SECTIONS=${NCU_SECTIONS:-gemv_xreg|attention_tile}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*"; }
# the carried libraries only for exo's own binaries (system tools keep the image's)
cudalib=$(dirname "$(ls /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda*/lib*/libcublas.so.13 \
  $(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia/cu13/lib/libcublas.so.13 2>/dev/null | head -1)")
X() { LD_LIBRARY_PATH="$PWD/lib:$cudalib" "$@"; }
echo "cuBLAS from $cudalib"
# for tools that must keep the image's libraries themselves (ncu): exo behind a wrapper
printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$PWD/lib:$cudalib" "$PWD/build/exo" > exo-libs
chmod +x exo-libs
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import lzma,glob,os
for f in glob.glob('lib/*.xz')+glob.glob('build/*.xz')+glob.glob('build/*/*.xz')+glob.glob('.cache/tokenizers/*/*.xz'):
    open(f[:-3],'wb').write(lzma.open(f).read()); os.remove(f)"
chmod +x build/exo build/tools/* build/tests/*
{ command -v node && node --version; } &> "$OUT/node-probe.log"
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/gpu.log"
m=/dev/shm/exo-models; mkdir -p $m
gen() { X ./build/tools/mkmodel --out "$m/llama8b-$1" --preset llama-3.1-8b --tokenizer none --vocab 128256 --seed 1 "${@:2}" >"$OUT/mkmodel-$1.log" 2>&1; }
for q in $MODELS; do # the 4-bit one takes longest (~100 s): both in parallel with the tests
  if [ "$q" = 4bit ]; then (time gen 4bit --quant-bits 4 --group-size 64) 2>>"$OUT/mkmodel-time.log" &
  else (time gen "$q") 2>>"$OUT/mkmodel-time.log" &
  fi
done
{
  stamp "== test_cuda_ops"; X timeout 150 ./build/tests/test_cuda_ops; echo "rc=$?"
  if [ "${GEMVBENCH:-1}" = 1 ]; then
    stamp "== gemvbench $GEMVBENCH_ARGS"; eval X timeout 120 ./build/tools/gemvbench $GEMVBENCH_ARGS | tee "$OUT/gemvbench.log"; echo "rc=$?"
  fi
  stamp "== test_engine_reference (GPU passes)"; EXO_TEST_DEVICE=cuda X timeout 150 ./build/tests/test_engine_reference; echo "rc=$?"
  stamp "== exo run --device cuda"; X timeout 60 ./build/exo run .cache/reference-models/qwen3-tiny "Hello there" --max-tokens 12 --temperature 0 --raw --device cuda; echo "rc=$?"
  stamp "== nodeinfo (gpus)"; X timeout 30 ./build/tools/nodeinfo 2>&1 | grep -A12 '"gpus"'
  stamp "== API on the GPU (api_smoke.py: OpenAI, Claude, Ollama; GPU node against CPU node)"
  EXO_LIBS="$PWD/lib:$cudalib" timeout 120 python3 api_smoke.py ./build/exo .cache/reference-models qwen3-tiny; echo "rc=$?"
  if [ "${SANITIZE:-0}" = 1 ]; then
    stamp "== compute-sanitizer memcheck test_cuda_ops"; X timeout 200 compute-sanitizer --tool memcheck --print-limit 20 ./build/tests/test_cuda_ops 2>&1 | tail -30
  fi
  stamp "== tests done"
} > "$OUT/tests.log" 2>&1
wait
stamp "models generated"; grep real "$OUT/mkmodel-time.log"
for q in $MODELS; do
  stamp "== exo bench --model $m/llama8b-$q --device cuda --pp $PP --tg 128 --batch $BATCH --reps $REPS"
  X timeout 150 ./build/exo bench --model "$m/llama8b-$q" --device cuda --pp "$PP" --tg 128 --batch "$BATCH" --reps "$REPS" 2>&1 | grep -v "^mem "
  if [ "$q" = bf16 ]; then
    for alt in $ALT; do
      stamp "== bf16 b1 with $alt"
      env $alt LD_LIBRARY_PATH="$PWD/lib:$cudalib" timeout 60 ./build/exo bench --model "$m/llama8b-$q" --device cuda --pp 16 --tg 128 --batch 1 --reps 1 2>&1 | grep -E "decode"
    done
  fi
  if [ "$q" = 4bit ]; then
    for alt in $ALT; do
      stamp "== 4-bit b1 with $alt"
      env $alt LD_LIBRARY_PATH="$PWD/lib:$cudalib" timeout 60 ./build/exo bench --model "$m/llama8b-$q" --device cuda --pp 16 --tg 128 --batch 1 --reps 1 2>&1 | grep -E "decode"
    done
  fi
done 2>&1 | tee "$OUT/bench.log"
if [ "${PROFILE:-1}" = 1 ]; then
  # ncu times each kernel alone (one launch at a time, graphs off): durations per kernel name,
  # summed over the profiled launches; the decode window is reached by skipping the first
  # launches of exo's own kernels (prefill, warm-up steps).
  for q in 4bit bf16; do # the 4-bit GEMV first: it is the one furthest from its bar
    [ -d "$m/llama8b-$q" ] || continue
    if [ $(( $(date +%s) - start )) -gt ${TIME_BUDGET:-200} ]; then stamp "ncu $q skipped: past the time budget"; continue; fi
    stamp "== ncu: b1 decode kernels, $q"
    EXO_CUDA_GRAPHS=0 timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum \
      --kernel-name regex:'gemv|attention|rmsnorm|rope|embed|gather|silu|add|kv_write' \
      --launch-skip 1500 --launch-count 300 --csv --print-units base \
      ./exo-libs bench --model "$m/llama8b-$q" --device cuda --pp 16 --tg 40 --batch 1 --reps 1 \
      > "$OUT/ncu-$q.csv" 2> "$OUT/ncu-$q.err"
    python3 - "$OUT/ncu-$q.csv" <<'EOF'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("  (no ncu rows)"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); gi = h.index("Grid Size")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    name = r[ki].split("(")[0].strip() + " " + r[gi]
    tot[name] += v; cnt[name] += 1
layers = sum(c for k, c in cnt.items() if k.startswith("void rope_kv_write")) or 1
print("  %-58s %6s %9s %11s" % ("kernel (grid)", "count", "avg us", "us/32 lyr"))
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
    print("  %-58s %6d %9.2f %11.1f" % (k[:58], cnt[k], v / cnt[k] / 1e3, v / 1e3 * 32 / layers))
print("  sum: %.1f us per 32 layers (%d layers profiled)" % (sum(tot.values()) / 1e3 * 32 / layers, layers))
EOF
  done 2>&1 | tee "$OUT/ncu-summary.log"
  if [ -d "$m/llama8b-4bit" ] && [ $(( $(date +%s) - start )) -lt ${TIME_BUDGET:-200} ]; then
    stamp "== ncu sections: $NCU_SECTIONS, 4-bit (one layer)" | tee -a "$OUT/ncu-summary.log"
    EXO_CUDA_GRAPHS=0 timeout 60 ncu --clock-control none --kernel-name regex:"$NCU_SECTIONS" \
      --launch-skip 400 --launch-count 6 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats \
      ./exo-libs bench --model "$m/llama8b-4bit" --device cuda --pp 16 --tg 20 --batch 1 --reps 1 \
      > "$OUT/ncu-gemv4.log" 2>&1
    grep -E "$NCU_SECTIONS|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers|Stall|Issued Warp|No Eligible|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" \
      "$OUT/ncu-gemv4.log" | head -80 | tee -a "$OUT/ncu-summary.log"
  fi
  if [ "${PROFILE_B64:-0}" = 1 ] && [ -d "$m/llama8b-4bit" ]; then
    # a 4-bit b64 decode step: per-kernel times (qgemm4 and the rest), then qgemm4's sections
    stamp "== ncu: b64 decode kernels, 4bit" | tee -a "$OUT/ncu-summary.log"
    EXO_CUDA_GRAPHS=0 timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum \
      --launch-skip 3000 --launch-count 400 --csv --print-units base \
      ./exo-libs bench --model "$m/llama8b-4bit" --device cuda --pp 16 --tg 12 --batch 64 --reps 1 \
      > "$OUT/ncu-b64.csv" 2> "$OUT/ncu-b64.err"
    python3 - "$OUT/ncu-b64.csv" <<'EOF2' | tee -a "$OUT/ncu-summary.log"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("  (no ncu rows)"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); gi = h.index("Grid Size")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    name = r[ki].split("(")[0].strip()[:40] + " " + r[gi]
    tot[name] += v; cnt[name] += 1
print("  %-58s %6s %9s %11s" % ("kernel (grid)", "count", "avg us", "total us"))
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:25]:
    print("  %-58s %6d %9.2f %11.1f" % (k[:58], cnt[k], v / cnt[k] / 1e3, v / 1e3))
print("  sum: %.1f us over %d launches" % (sum(tot.values()) / 1e3, sum(cnt.values())))
EOF2
    EXO_CUDA_GRAPHS=0 timeout 60 ncu --clock-control none --kernel-name regex:qgemm4 \
      --launch-skip 500 --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
      ./exo-libs bench --model "$m/llama8b-4bit" --device cuda --pp 16 --tg 12 --batch 64 --reps 1 \
      > "$OUT/ncu-qgemm.log" 2>&1
    grep -E "qgemm4|Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Max Bandwidth|Issue Slots|Executed Ipc|stalled|Shared" \
      "$OUT/ncu-qgemm.log" | head -80 | tee -a "$OUT/ncu-summary.log"
  fi
fi
{
  echo "# summary ($(date -u), $(( $(date +%s) - start )) s)"
  head -3 "$OUT/gpu.log"; cat "$OUT/node-probe.log"
  grep -E "rc=|PASSED|FAILED|ERROR SUMMARY|skipped|^\[[0-9]+ s\]|sample .*row|matmul_fused .*FAILED|^api " "$OUT/tests.log"
  [ -f "$OUT/gemvbench.log" ] && cat "$OUT/gemvbench.log"
  grep -E "^==|prefill|decode|copy" "$OUT/bench.log"
  [ -f "$OUT/ncu-summary.log" ] && cat "$OUT/ncu-summary.log"
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
