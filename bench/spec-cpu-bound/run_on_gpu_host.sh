#!/usr/bin/env bash
# Runs on the GPU machine's CPU (a quiet 16-core host, unlike the shared 2-core VM), from the
# folder carry.sh laid out, as `bash .devcarry-spec2/run.sh` from the repo root: the cost of
# speculation that never lands (issue 21's bound: no slowdown beyond 10% at 0% acceptance, with
# adaptive k), and the oracle's k=2 / k=4 speed-up, on the Llama-3.2-1B shape in MLX 4-bit
# (random weights made here by mkmodel: greedy output is all the bench needs), then the MTP
# drafter on a ~2B Qwen3.5-shaped hybrid (24 layers, hidden 2048, 4-bit) whose MTP head agrees
# with it (mkmodel --mtp agree: acceptance ~100%, so this is the head's best case: what drafting
# with one extra layer per token buys on a hybrid at batch 1). Every line of
# exo bench --spec alternates plain and speculative runs of the same greedy request in one engine
# and checks their tokens are identical. Pinned to CORES (default 2-7) with as many threads, so
# other work on the host stays off them. At most 4 minutes (about 3).
# Output: $OUT/spec2/{bench.log,env.log}.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
OUT=${OUT:-/tmp/out}/spec2; mkdir -p "$OUT"
python3 -c "import lzma,glob,os
for f in glob.glob('lib/*.xz'):
    open(f[:-3],'wb').write(lzma.open(f).read()); os.remove(f)"
chmod +x build/exo build/tools/*
X() { LD_LIBRARY_PATH="$here/lib" "$@"; }
cores=${CORES:-2-7}
threads=$(taskset -c "$cores" nproc)
{ date -u; nproc; lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)|L3"; uptime; } > "$OUT/env.log" 2>&1
m=/dev/shm/exo-spec2-1b
X timeout 30 ./build/tools/mkmodel --out $m --preset llama-3.2-1b --tokenizer none --vocab 128256 \
  --quant-bits 4 --group-size 64 --seed 1 >/dev/null 2>&1 || echo "mkmodel failed" >> "$OUT/env.log"
bench() { # LIMIT_S ARGS...
  local limit=$1; shift
  echo "== taskset -c $cores exo bench --threads $threads --model $(basename $m) --device cpu $*"
  X timeout "$limit" taskset -c "$cores" ./build/exo bench --threads "$threads" --model $m --device cpu "$@" 2>&1 |
    grep -E "^speculative|exo bench:"
}
{
  bench 75 --spec miss --spec-k 4 --tg 128 --reps 6
  bench 35 --spec oracle --spec-k 2,4 --tg 64 --reps 4
  rm -rf $m
  m=/dev/shm/exo-spec2-hybrid
  X timeout 35 ./build/tools/mkmodel --out $m --preset qwen3.5-9b --tokenizer none --vocab 151936 \
    --hidden 2048 --layers 24 --intermediate 6144 --linear-value-heads 16 --quant-bits 4 \
    --group-size 64 --seed 1 --mtp agree >/dev/null 2>&1 || echo "mkmodel (hybrid) failed"
  bench 45 --spec mtp --spec-k 2,4 --tg 48 --reps 3
  uptime
} 2>&1 | tee "$OUT/bench.log"
rm -rf $m
