#!/usr/bin/env bash
cd /work/main
out=/work/notes/quiet3
B=build/release
M=.cache/bench
echo "start-b $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) git $(git describe --always --dirty)" | tee -a $out/meta.txt
run() { local name=$1; shift; echo "== $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg): $*" | tee -a $out/$name.txt; timeout ${T:-500} "$@" 2>&1 | tee -a $out/$name.txt; }
run decode-bf16-b $B/exo bench --model $M/llama-3.2-1b-bf16 --pp 16 --tg 64 --batch 1,8 --reps 2
run streams-b $B/exo bench --model $M/llama-3.2-1b-4bit --streams 1,2,4,8,16,32,64 --stream-prompt 16 --tg 32
run decode-4bit-b $B/exo bench --model $M/llama-3.2-1b-4bit --pp 16 --tg 64 --batch 1,2 --reps 3
echo "end-b $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/meta.txt
