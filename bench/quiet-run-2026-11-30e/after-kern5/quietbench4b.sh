#!/usr/bin/env bash
# Fourth-session final run (after kern5). Output: /work/notes/quiet4b/
cd /work/main
out=/work/notes/quiet4b
mkdir -p $out
B=build/release
M=.cache/bench
echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) git $(git describe --always --dirty)" | tee -a $out/meta.txt
run() { local name=$1; shift; echo "== $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg): $*" | tee -a $out/$name.txt; timeout ${T:-500} "$@" 2>&1 | tee -a $out/$name.txt; }
for r in 1 2; do
run decode-4bit $B/exo bench --model $M/llama-3.2-1b-4bit --pp 16 --tg 64 --batch 1,2 --reps 3
run decode-bf16 $B/exo bench --model $M/llama-3.2-1b-bf16 --pp 16 --tg 64 --batch 1 --reps 2
run streams $B/exo bench --model $M/llama-3.2-1b-4bit --streams 1,2,4,8 --stream-prompt 16 --tg 32
done
echo "end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/meta.txt
