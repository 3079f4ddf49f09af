#!/usr/bin/env bash
# interleaved A/B of EXO_Q4_LAYOUT on the streams bench, each run under the shared lock
for r in ${ROUNDS:-1 2 3}; do
  for L in mlx rows16; do
    echo "== round $r layout $L load $(cut -d' ' -f1 /proc/loadavg)"
    EXO_Q4_LAYOUT=$L flock /tmp/exo-bench.lock build/release/exo bench --model /work/main/.cache/bench/llama-3.2-1b-4bit --streams ${STREAMS:-1,2,4,8} --stream-prompt 16 --tg 32 2>&1 | grep -E "^streams|read-only"
  done
done
