#!/usr/bin/env bash
# cpu26 (issue 25) on the GPU machine's Xeon, its GPU unused, 2 pinned cores (taskset, --threads 2:
# the dev VM's core count). base = main at 3f24c6e (its AVX-512 interleaved kernels carry no
# software prefetch: GCC deleted the loop), new = branch cpu26 at 59b7f95 (the prefetch restored,
# into L2 on Intel); portable builds (-O3, no -march) carried with their Debian libraries as
# bin/*.xz, lib/*.xz (scripts/carry-lib.sh). Three parts, each line printing the load:
#   1. ab: a synthetic batch-1 decode step of the Llama-3.2-1B shape (16 layers' q/k/v + o +
#      gate/up + down, the tied 128256-row lm_head; MLX 8- or 4-bit g64 in one 2 MiB-aligned
#      huge-page arena, interleaved) with new's kernels, configurations LEVEL:L2:DISTANCE timed in
#      turn step by step (L2 1 = prefetcht1, 0 = prefetcht0; DISTANCE 0 = no prefetch, i.e. base's
#      AVX-512 kernel): medians of GB/s and of the ratio to the first; 2 threads (wall clock) and
#      1 thread (its CPU clock). Source: bench/kernels-cpu26/ab.c.
#   2. exo bench --model, batch-1 decode against the roofline each run measures (read probe of the
#      same threads before and after): 8-bit base avx512 / new avx512 / new EXO_CPU_SIMD=avx2,
#      5 rounds; 4-bit base / new avx512 in the first 3.
# Writes $OUT/cpu26/log.txt. About 3.5 minutes; parts are skipped past 225 s.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${OUT:-/tmp/cpu26-out}/cpu26
mkdir -p "$out"
x=/tmp/cpu26x
rm -rf $x && mkdir -p $x && cp -r "$here/bin" "$here/lib" $x/
. "$root/scripts/carry-lib.sh"
carry_unpack $x/bin/*.xz $x/lib/*.xz
chmod +x $x/bin/*
export LD_LIBRARY_PATH=$x/lib
M=/dev/shm/cpu26
CORES=${CORES:-2,3}
ONE=${CORES%%,*}
t0=$(date +%s)
late() { [ $(( $(date +%s) - t0 )) -gt 225 ]; }
stamp() { echo "($(( $(date +%s) - t0 )) s, load $(cut -d' ' -f1-3 /proc/loadavg))"; }
{
echo "== host"; nproc; lscpu | grep -E 'Model name|Thread|Socket|L2|L3|NUMA node0'
lscpu | grep -o -E 'avx512_vnni|avx_vnni|avx512vbmi|amx_int8' | sort -u | tr '\n' ' '; echo
free -g | head -2; uptime; cat /sys/kernel/mm/transparent_hugepage/enabled
mkdir -p $M
for b in 4 8; do
  [ -f $M/llama-3.2-1b-${b}bit/model.safetensors ] || \
    $x/bin/mkmodel --out $M/llama-3.2-1b-${b}bit --preset llama-3.2-1b --quant-bits $b --group-size 64 \
      --tokenizer none --vocab 128256 --seed 1 >/dev/null &
done
echo "#### 1. synthetic decode step $(stamp)"
taskset -c $CORES $x/bin/ab 8 15 2 avx512:0:0 avx512:0:2048 avx512:1:2048 avx2:0:2048 avx512:1:1024 avx512:1:4096
echo "$(stamp)"
taskset -c $CORES $x/bin/ab 4 15 2 avx512:0:0 avx512:0:2048 avx512:1:2048 avx2:0:2048
echo "$(stamp)"
taskset -c $ONE $x/bin/ab 8 9 1 avx512:0:0 avx512:0:2048 avx512:1:2048 avx2:0:2048
taskset -c $ONE $x/bin/ab 4 9 1 avx512:0:0 avx512:0:2048 avx512:1:2048 avx2:0:2048
wait; echo "models made $(stamp)"; du -sh $M/*
run() { # label, exo (base|new), bits, env...
  local label=$1 which=$2 bits=$3; shift 3
  if late; then echo "== $label: skipped (time)"; return; fi
  echo "== $label $(stamp): $* exo-$which bench --threads 2 --model 1b-${bits}bit --pp 16 --tg 64 --batch 1 --reps 1"
  env "$@" timeout 60 taskset -c $CORES $x/bin/exo-$which bench --threads 2 --model $M/llama-3.2-1b-${bits}bit \
    --pp 16 --tg 64 --batch 1 --reps 1 2>&1 | grep -E "^(decode|mem   read)"
}
echo "#### 2. decode"
for r in 1 2 3 4 5; do
  echo "## round $r"
  run "q8 avx512 base" base 8 X=1
  run "q8 avx512 new" new 8 X=1
  run "q8 avx2 new" new 8 EXO_CPU_SIMD=avx2
  [ $r -le 3 ] || continue
  run "q4 avx512 base" base 4 X=1
  run "q4 avx512 new" new 4 X=1
done
echo "== done $(stamp)"
} 2>&1 | tee "$out/log.txt"
rm -rf $x $M
