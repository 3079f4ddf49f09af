#!/usr/bin/env bash
# Issue 24 (GGUF), helper gguf3, on the GPU machine's 16-core Xeon (AMX; the GPU unused):
#  1. the decode kernel's prefetch on this CPU: `exo bench --section matvec` (8 threads pinned to
#     cores 0-7, 512 MiB sweeps of GGUF Q4_0 and Q8_0 matrices, 1 token, GB/s against the read probe
#     of the same threads) under EXO_MATVEC_PREFETCH_HINT (t0 = into L1, the default; t1 = into
#     L2; nta) x EXO_MATVEC_PREFETCH (bytes ahead, 0 = none); the best is used below;
#  2. bench/gguf.sh: exo beside llama.cpp's CPU build with its AMX kernels (cui-llama.rn 1.12.2,
#     LLAMACPP_TARGET=xeon) on the same GGUF files (1B and 8B Llama shapes, Q4_0 / Q4_K_M / Q8_0,
#     mkmodel --gguf-row-pool 64 into /dev/shm), 8 threads on cores 0-7, prefill and decode; exo
#     prefills on its AMX tiles (compute/cpu/matmul_amx.c);
#  3. exo alone: EXO_AMX=0 (the AVX-512 passes, as before this branch) on the 1B prefill, and
#     the default prefetch on the 8B decode when step 1 picked another.
# Hard limit ~330 s. Results: $OUT/gguf3/bench.log (and sweep.log).
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/gguf3-out}/gguf3
mkdir -p "$out"
work=$(mktemp -d /dev/shm/gguf3.XXXXXX)
trap 'rm -rf "$work" /dev/shm/gguf3-models' EXIT
tar xJf "$here/gguf3.tar.xz" -C "$work"
export LD_LIBRARY_PATH=$work/lib
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
left() { local v=$(( $1 - $(elapsed) )); [ "$v" -ge 1 ] || v=1; echo "$v"; } # seconds until $1 (at least 1)
{
  echo "== host"; nproc; lscpu | grep -E 'Model name|L3|NUMA node0'; free -g | head -2
  grep -o -w -E 'amx_int8|amx_bf16|amx_tile|avx512_vnni|avx512_bf16' /proc/cpuinfo | sort | uniq -c
  echo "load: $(cat /proc/loadavg)"; cat "$work/COMMIT"
  cd "$work"
  # GGUF3_SHAPES / GGUF3_THREADS / GGUF3_SWEEP_MIB: smaller for a smoke test on another machine
  th=${GGUF3_THREADS:-8}
  export GGUF_DIR=/dev/shm/gguf3-models GGUF_SHAPES="${GGUF3_SHAPES:-1b 8b}" EXO_LLAMACPP_REF=build/llamacpp-ref
  # the models first (written in parallel, ~10 s), so nothing writes during a measurement
  GGUF_RUNS=" " timeout 60 bash bench/gguf.sh build | grep '^# models'
  echo "== 1. decode kernel, prefetch sweep ($(date -u +%T))"
  best="" bestv=0
  for cfg in t0:2048 t0:0 t0:4096 t0:8192 t1:2048 t1:4096 t1:8192 nta:4096; do
    [ "$(elapsed)" -lt 110 ] || { echo "[$cfg] deadline"; continue; }
    h=${cfg%%:*} d=${cfg##*:}
    r=$(EXO_MATVEC_PREFETCH_HINT=$h EXO_MATVEC_PREFETCH=$d timeout 40 taskset -c 0-$((th - 1)) build/exo bench --section matvec \
        --threads "$th" --sweep-mib "${GGUF3_SWEEP_MIB:-512}" --formats gguf --tokens 1 --no-prefill --reps 3 2>&1 | grep -E '^(mem   read|gguf)')
    echo "$r" | sed "s/^/[$cfg] /"
    v=$(echo "$r" | awk '/^gguf/ {s += $4} END {print s + 0}')
    echo "[$cfg] sum of the four b1 GB/s: $v"
    if awk "BEGIN{exit !($v > $bestv)}"; then best=$cfg bestv=$v; fi
  done
  best=${best:-t0:2048}
  echo "== best: $best ($bestv)"
  export EXO_MATVEC_PREFETCH_HINT=${best%%:*} EXO_MATVEC_PREFETCH=${best##*:}
  echo "== 2. exo (AMX prefill, prefetch $best) beside llama.cpp (AMX) ($(date -u +%T))"
  GGUF_RUNS="${GGUF3_RUNS:-1b:$th:1 8b:$th:1}" GGUF_DEADLINE=$(left 250) timeout $(left 290) bash bench/gguf.sh build
  echo "== 3a. exo with EXO_AMX=0 (the AVX-512 passes), 1B ($(date -u +%T))"
  EXO_AMX=0 GGUF_ENGINES=exo GGUF_RUNS="1b:$th:1" GGUF_TG=16 GGUF_DEADLINE=$(left 290) timeout $(left 310) bash bench/gguf.sh build
  if [ "$best" != t0:2048 ]; then
    echo "== 3b. exo with the default prefetch (t0:2048), 8B decode ($(date -u +%T))"
    EXO_MATVEC_PREFETCH_HINT=t0 EXO_MATVEC_PREFETCH=2048 GGUF_ENGINES=exo GGUF_RUNS="${GGUF3_RUNS3B:-8b:$th:1}" GGUF_PP_8B=16 \
      GGUF_TYPES="Q4_0 Q8_0" GGUF_DEADLINE=$(left 310) timeout $(left 325) bash bench/gguf.sh build
  fi
  echo "== done in $(( $(date +%s) - start )) s"
} > "$out/bench.log" 2>&1
tail -40 "$out/bench.log"
