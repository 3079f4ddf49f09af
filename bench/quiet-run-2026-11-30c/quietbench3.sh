#!/usr/bin/env bash
# Third-session quiet-machine benchmark run (all helpers stopped). Output: /work/notes/quiet3/
cd /work/main
out=/work/notes/quiet3
mkdir -p $out
B=build/release
M=.cache/bench
echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) git $(git describe --always --dirty)" | tee $out/meta.txt
run() { local name=$1; shift; echo "== $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg): $*" | tee -a $out/$name.txt; timeout ${T:-500} "$@" 2>&1 | tee -a $out/$name.txt; }
run decode-4bit $B/exo bench --model $M/llama-3.2-1b-4bit --pp 128,512 --tg 64 --batch 1,8 --reps 2
run decode-bf16 $B/exo bench --model $M/llama-3.2-1b-bf16 --pp 128,512 --tg 64 --batch 1,8 --reps 2
run streams $B/exo bench --model $M/llama-3.2-1b-4bit --streams 1,2,4,8,16,32,64 --stream-prompt 16 --tg 32
run decode-4bit-2 $B/exo bench --model $M/llama-3.2-1b-4bit --pp 16 --tg 64 --batch 1,2,4 --reps 3
run download env RUNS=3 WORK=/dev/shm LOCK= bash bench/download/run.sh $B 2048
run download-node env RUNS=3 WORK=/dev/shm LOCK= SERVER=node bash bench/download/run.sh $B 2048
run interrupt $B/exo bench --model $M/llama-3.2-1b-4bit --interrupt 4096 --shorts 12 --reps 1
echo "end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/meta.txt
