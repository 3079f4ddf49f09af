#!/usr/bin/env bash
# Issue 24, helper gguf4, on the GPU machine's 16-core Xeon (AMX; the GPU unused), ~5 min:
#  B. bench/gguf.sh: exo (this branch: AMX prefill with the next block pair prefetched, decode with
#     two 16-row blocks in flight per thread) beside llama.cpp's AMX build (cui-llama.rn 1.12.2,
#     LLAMACPP_TARGET=xeon) on the same GGUF files: 1B and 8B Llama shapes, Q4_0 / Q4_K_M / Q8_0
#     (mkmodel --gguf-row-pool 64 into /dev/shm), 8 threads pinned to cores 0-7, prefill (1B
#     pp512, 8B pp128) and decode (tg64 / tg32), exo then llama.cpp per model;
#  A. decode A/B, alternated: EXO_MATVEC_STREAMS=1 (one block at a time: the kernel before this
#     branch) / 2 (the default) / 4, exo bench --model --pp 16 --tg 32, 8 threads, 1B Q4_0 and
#     Q8_0 x2 rounds, then 8B Q4_0 and Q8_0 x1; each decode line carries the read roofline of the
#     same 8 threads measured in the same process;
#  C. 8B prefill (pp128) A/B, alternated: EXO_AMX_PREFETCH=0 (the tiles before this branch) / 1,
#     Q4_0 and Q4_K_M, and EXO_AMX=0 (the VNNI passes) once each.
# Every step has a deadline so the whole stays under ~330 s. Results: $OUT/gguf4/bench.log.
set -u
. "$(dirname "$0")/setup.sh" # here, out, work, start, elapsed, left
{
  echo "== host"; nproc; lscpu | grep -E 'Model name|L3|NUMA node0|Thread'; free -g | head -2
  echo "load: $(cat /proc/loadavg)"; cat "$work/COMMIT"
  cd "$work"
  th=${GGUF4_THREADS:-8}
  cores="0-$((th - 1))"
  m=/dev/shm/gguf4-models
  export GGUF_DIR=$m GGUF_SHAPES="${GGUF4_SHAPES:-1b 8b}" EXO_LLAMACPP_REF=build/llamacpp-ref
  GGUF_RUNS=" " timeout 90 bash bench/gguf.sh build | grep '^# models'
  echo "== B. exo beside llama.cpp (AMX), $th threads ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
  GGUF_RUNS="${GGUF4_RUNS:-1b:$th:1 8b:$th:1}" GGUF_DEADLINE=$(left 150) timeout $(left 200) bash bench/gguf.sh build
  echo "== A. decode, EXO_MATVEC_STREAMS 1 / 2 / 4 alternated ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
  for run in 1b:1 1b:2 8b:1; do
    s=${run%%:*} r=${run##*:}
    for t in Q4_0 Q8_0; do for st in 1 2 4; do
      [ "$s" = 8b ] && [ "$st" = 4 ] && continue
      [ "$(elapsed)" -lt 275 ] || { echo "[r$r $s $t S=$st] deadline"; continue; }
      EXO_MATVEC_STREAMS=$st timeout 30 taskset -c "$cores" build/exo bench --threads "$th" --model "$m/l$s-$t" \
        --pp 16 --tg 32 --batch 1 --reps 1 2>&1 | grep -E '^decode' | sed "s/^/[r$r $s $t S=$st] /"
    done; done
  done
  echo "== C. 8B prefill pp128, EXO_AMX_PREFETCH 0 / 1 alternated, then EXO_AMX=0 ($(date -u +%T))"
  for t in Q4_0 Q4_K_M; do for cfg in EXO_AMX_PREFETCH=0 EXO_AMX_PREFETCH=1 EXO_AMX=0; do
    [ "$(elapsed)" -lt 315 ] || { echo "[8b $t $cfg] deadline"; continue; }
    env "$cfg" timeout 25 taskset -c "$cores" build/exo bench --threads "$th" --model "$m/l8b-$t" \
      --pp 128 --tg 2 --batch 1 --reps 1 2>&1 | grep -E '^prefill' | sed "s/^/[8b $t $cfg] /"
  done; done
  echo "== done in $(elapsed) s"
} > "$out/bench.log" 2>&1
tail -60 "$out/bench.log"
