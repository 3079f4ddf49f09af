#!/usr/bin/env bash
# Issue 24, helper gguf4, optional second GPU-host run (~2 min; the tarball of run.sh): in the
# first run (bench.log) the 1B prefill with the tiles read 402-434 tok/s where gguf3's quiet run
# read 682-795, on a host whose read probe swung 52-101 GB/s. Here, alternated in the same
# minute, 8 threads on cores 0-7:
#  A. 1B Q4_0 and Q8_0 pp512: EXO_AMX_PREFETCH=0 (gguf3's tiles) / 1 (this branch) / EXO_AMX=0, x2;
#  B. 8B Q4_K_M pp128: exo (prefetch on) / llama.cpp, x2 (the one prefill bar still under 1x).
# Results: $OUT/gguf4/bench2.log
set -u
. "$(dirname "$0")/setup.sh" # here, out, work, start, elapsed, left
{
  echo "load: $(cat /proc/loadavg)"; cat "$work/COMMIT"
  cd "$work"
  th=${GGUF4_THREADS:-8}
  cores="0-$((th - 1))"
  m=/dev/shm/gguf4-models
  mkdir -p "$m"
  for st in 1b:Q4_0 1b:Q8_0 8b:Q4_K_M; do
    s=${st%%:*} t=${st##*:}
    build/tools/mkmodel --out "$m/l$s-$t" --preset "$([ "$s" = 8b ] && echo llama-3.1-8b || echo llama-3.2-1b)" \
      --tokenizer none --vocab 128256 --seed 1 --gguf "$t" --gguf-row-pool 64 >/dev/null &
  done
  wait
  echo "== A. 1B pp512 ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
  for r in 1 2; do for t in Q4_0 Q8_0; do for cfg in EXO_AMX_PREFETCH=0 EXO_AMX_PREFETCH=1 EXO_AMX=0; do
    [ "$(elapsed)" -lt 110 ] || { echo "[r$r 1b $t $cfg] deadline"; continue; }
    env "$cfg" timeout 20 taskset -c "$cores" build/exo bench --threads "$th" --model "$m/l1b-$t" \
      --pp 512 --tg 2 --batch 1 --reps 1 2>&1 | grep -E '^prefill' | sed "s/^/[r$r 1b $t $cfg] /"
  done; done; done
  echo "== B. 8B Q4_K_M pp128, exo / llama.cpp ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
  for r in 1 2; do
    [ "$(elapsed)" -lt 150 ] || { echo "[r$r] deadline"; continue; }
    timeout 25 taskset -c "$cores" build/exo bench --threads "$th" --model "$m/l8b-Q4_K_M" \
      --pp 128 --tg 2 --batch 1 --reps 1 2>&1 | grep -E '^prefill' | sed "s/^/[r$r exo] /"
    echo "[r$r llama.cpp] $(timeout 25 taskset -c "$cores" build/llamacpp-ref bench "$m/l8b-Q4_K_M/model.gguf" "$th" 128 2 2>/dev/null | tail -1)"
  done
  echo "== done in $(elapsed) s"
} > "$out/bench2.log" 2>&1
tail -30 "$out/bench2.log"
