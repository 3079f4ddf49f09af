#!/usr/bin/env bash
# Issue 28, seventh session (branch dist3), on the GPU machine's 16-core CPU (GPU unused; it needs
# the whole CPU to itself). Run as `bash .devcarry-dist3/run.sh` from the repo root, from the
# folder carry_s7.sh lays out ({run.sh, bench/dist_scaling.sh, build/, lib/}).
#  1. Pipelined PREFILL scaling: the Llama-3.2-1B shape in MLX 4-bit (random weights made here),
#     4 prompts of 2048 tokens submitted at once, on 1 node and on a 2-node pipeline (then tensor
#     x2 beside it), 6 cores per node, the data plane through tools/netproxy at 0.1 ms one way /
#     10 Gbit/s, busy-polling on cores 12-15.
#  2. The quiet 1B-shape decode rerun of bench/dist_scaling.sh at 0.1 ms / 10 Gbit/s, pinned as
#     run_s6.sh (3 cores per node, proxy on 12-15): tensor and pipeline, 1/2/4 nodes, b1 and b4.
# Output: $OUT/dist3/{bench.log,env.log}. About 3 minutes; every part has a hard limit (the
# whole process group of a part is killed at it), 225 s in all.
# A smoke test on a small machine overrides the shape and layout: MODEL_ARGS, PROMPT, PREFILL_CPR,
# DECODE_CPR, DECODE_RANKS, PROXY.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}/dist3; mkdir -p "$OUT"
cd "$here"
python3 -c "import lzma,glob,os
for f in glob.glob('lib/*.xz'):
    open(f[:-3],'wb').write(lzma.open(f).read()); os.remove(f)"
chmod +x build/exo build/tools/*
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$here/build M=/dev/shm/exo-dist3-1b
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
# limited SECONDS CMD...: runs CMD in a process group of its own, killed whole at SECONDS (ranks
# and proxy included); polls, so nothing is left behind holding the log's pipe open
limited() {
  local s=$1 i=0; shift
  setsid "$@" & local p=$!
  while kill -0 "$p" 2>/dev/null; do
    if [ $i -ge $((s * 10)) ]; then echo "== killed after $s s: $*"; kill -9 -- -"$p" 2>/dev/null; break; fi
    sleep 0.1; i=$((i + 1))
  done
  wait "$p"
}
{ date -u; nproc; lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)|L3"; uptime; free -g | head -2; } > "$OUT/env.log" 2>&1
model_args=${MODEL_ARGS:---preset llama-3.2-1b --quant-bits 4 --group-size 64 --tokenizer none --vocab 128256}
prompt=${PROMPT:-2048}
limited 40 $B/tools/mkmodel --out $M $model_args --seed 1 >/dev/null 2>&1 || echo "mkmodel failed" >> "$OUT/env.log"
{
  echo "== model made at $(elapsed) s: $(du -sh $M)"
  echo "== prefill: 4 prompts x $prompt tokens at once, ${PREFILL_CPR:-6} cores per node, 0.1 ms / 10 Gbit/s"
  export CORES_PER_RANK=${PREFILL_CPR:-6} PROXY_CORES=${PROXY:-12-15} NETS="0.1:10" BATCH=4 TG=0 REPS=1 \
    PREFILL=$prompt
  limited 110 env MODES=pipeline RANKS="1 2" bash bench/dist_scaling.sh $M $B
  limited 35 env MODES=tensor RANKS=2 bash bench/dist_scaling.sh $M $B
  unset PREFILL
  echo "== decode: 3 cores per node (run_s6.sh's layout), 0.1 ms / 10 Gbit/s, at $(elapsed) s"
  export CORES_PER_RANK=${DECODE_CPR:-3} BATCH=1,4 TG=32 REPS=2
  left=$(( 220 - $(elapsed) ))
  limited $(( left > 10 ? left : 10 )) env RANKS="${DECODE_RANKS:-1 2 4}" bash bench/dist_scaling.sh $M $B
  echo "== done at $(elapsed) s"; uptime
} 2>&1 | tee "$OUT/bench.log"
rm -rf $M
