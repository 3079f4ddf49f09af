#!/usr/bin/env bash
# Issue 24, helper gguf3, second GPU-host run (diagnostic, ~2 min): the first run (run.sh,
# bench.log) showed exo's prefill with the AMX tiles no faster than without (457 vs 487 tok/s,
# 1B Q4_0, 8 threads) where one core of the dev VM's Xeon runs them 2x the VNNI passes. Is AMX
# granted here (the header line says "AMX tiles on" or why not), and what does it give per core
# and on 8 cores? All A/B pairs alternate EXO_AMX=1 / 0 in the same minute.
#  A. one core (core 2), thread CPU time: exo bench --section matvec pp512 column (GGUF Q4_0/Q8_0
#     matrices of the 1B shapes, 512 tokens), x2;
#  B. 8 threads on cores 0-7, wall time: the same, x1;
#  C. exo bench --model (1B Q4_0 and Q8_0, pp512 tg8, 8 threads on cores 0-7), x2;
#  D. decode (1B Q4_0 and Q8_0, tg32) on cores 0-7 against 8 cores that share no physical core
#     (from /sys topology), x2: whether 0-7 are hyperthread pairs, which would make the 4-bit
#     decode kernel compute-bound (run.sh: Q4_0 matrices stream at 47-60 GB/s whatever the
#     prefetch, Q8_0 at 55-73).
# Results: $OUT/gguf3/bench2.log
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/gguf3-out}/gguf3
mkdir -p "$out"
work=$(mktemp -d /dev/shm/gguf3.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar xJf "$here/gguf3.tar.xz" -C "$work"
export LD_LIBRARY_PATH=$work/lib
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
{
  echo "== host"; lscpu | grep -E 'Model name|Thread|Core|Socket|MHz|L2|L3|NUMA'
  for c in 0 1 2 3 4 5 6 7; do echo "cpu$c siblings $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list 2>/dev/null)"; done
  echo "load: $(cat /proc/loadavg)"; cat "$work/COMMIT"
  cd "$work"
  m=$work/models; mkdir -p "$m"
  for t in Q4_0 Q8_0; do
    build/tools/mkmodel --out "$m/l1b-$t" --preset llama-3.2-1b --tokenizer none --vocab 128256 --seed 1 \
      --gguf "$t" --gguf-row-pool 64 >/dev/null &
  done
  wait
  echo "== A. one core ($(date -u +%T))"
  for r in 1 2; do for a in 1 0; do
    [ "$(elapsed)" -lt 100 ] || continue
    EXO_AMX=$a timeout 40 taskset -c 2 build/exo bench --section matvec --threads 1 --cpu-time --sweep-mib 1 \
      --formats gguf --tokens 1 --reps 3 2>&1 | grep -E '^(exo bench|gemm  f32|gguf)' | sed "s/^/[r$r AMX=$a] /"
  done; done
  echo "== B. 8 threads ($(date -u +%T))"
  for a in 1 0; do
    [ "$(elapsed)" -lt 130 ] || continue
    EXO_AMX=$a timeout 40 taskset -c 0-7 build/exo bench --section matvec --threads 8 --sweep-mib 1 \
      --formats gguf --tokens 1 --reps 3 2>&1 | grep -E '^(exo bench|gemm  f32|gguf)' | sed "s/^/[AMX=$a] /"
  done
  echo "== C. exo bench --model, 8 threads ($(date -u +%T))"
  for r in 1 2; do for t in Q4_0 Q8_0; do for a in 1 0; do
    [ "$(elapsed)" -lt 200 ] || continue
    EXO_AMX=$a timeout 40 taskset -c 0-7 build/exo bench --threads 8 --model "$m/l1b-$t" --pp 512 --tg 8 \
      --batch 1 --reps 1 2>&1 | grep -E '^(exo bench|prefill|decode)' | sed "s/^/[r$r $t AMX=$a] /"
  done; done; done
  echo "== D. decode, cores 0-7 against one thread per physical core ($(date -u +%T))"
  spread=$(for c in /sys/devices/system/cpu/cpu[0-9]*; do cut -d, -f1 "$c/topology/thread_siblings_list" 2>/dev/null | cut -d- -f1; done |
           sort -n -u | head -8 | paste -sd,)
  echo "one per physical core: $spread"
  for r in 1 2; do for t in Q4_0 Q8_0; do for cores in 0-7 "$spread"; do
    [ "$(elapsed)" -lt 250 ] || continue
    timeout 40 taskset -c "$cores" build/exo bench --threads 8 --model "$m/l1b-$t" --pp 16 --tg 32 \
      --batch 1 --reps 1 2>&1 | grep -E '^decode' | sed "s/^/[r$r $t cores $cores] /"
  done; done; done
  echo "== done in $(elapsed) s"
} > "$out/bench2.log" 2>&1
tail -30 "$out/bench2.log"
