#!/bin/bash
# Alternated decode A/B runs of the issue 24/25 bar command (bench/RESULTS.md, cpu29).
# usage: bench/cpu29/ab.sh ROUNDS MODEL BIN[:ENV=V,ENV=V] ...   (PP, TG: prompt/decode tokens)
# Per run: takes /tmp/exo-bench.lock (LOCK=...), waits for a second with the CPUs >= 90% idle
# (idle.sh: on the shared VM another session's nice-19 build still takes half a core), then
# prints the load average at the start and exo bench's decode line.
R=$1; M=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd); la=$(mktemp)
for r in $(seq 1 "$R"); do
  for spec in "$@"; do
    b=${spec%%:*}; e=""; [ "$spec" != "$b" ] && e=$(echo "${spec#*:}" | tr ',' ' ')
    out=$(flock "${LOCK:-/tmp/exo-bench.lock}" bash -c "$here/idle.sh 300; cat /proc/loadavg > $la;
          env $e $b bench --threads 2 --model $M --pp ${PP:-16} --tg ${TG:-64} --batch 1 --reps 1 2>&1")
    echo "r$r $(basename "$b") $e load[$(cut -d' ' -f1-3 "$la")] :: $(echo "$out" | grep '^decode' | sed 's/ \+/ /g')"
  done
done
rm -f "$la"
