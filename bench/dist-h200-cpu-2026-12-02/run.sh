#!/usr/bin/env bash
# Issue 28 scaling run on the GPU machine's CPU cores (see bench/dist_scaling.sh).
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
mkdir -p x && tar xJf dist.tar.xz -C x
export LD_LIBRARY_PATH=$PWD/x/lib
B=$PWD/x/bin
echo "== host"; nproc; lscpu | grep -E 'Model name|Thread|Socket|NUMA|L3|Flags' | cut -c1-200; free -g | head -2
M=/dev/shm/models; mkdir -p $M
t0=$(date +%s)
$B/tools/mkmodel --out $M/llama-3.2-1b-4bit --preset llama-3.2-1b --quant-bits 4 --group-size 64 --tokenizer none --vocab 128256 --seed 1 >/dev/null &
$B/tools/mkmodel --out $M/llama-3.1-8b-4bit --preset llama-3.1-8b --quant-bits 4 --group-size 64 --tokenizer none --vocab 128256 --seed 1 >/dev/null &
wait; echo "models made in $(( $(date +%s) - t0 )) s"; du -sh $M/*
echo "== data plane: our all-reduce beside a bare Gloo ring"
timeout 30 $B/exo bench --section dist 2>&1 | tail -25
timeout 30 $B/exo bench --section dist --ranks 4 2>&1 | tail -25
timeout 30 $B/exo bench --section dist --delay-ms 0.1 --rate-gbit 10 2>&1 | tail -25
cd "$root"
echo "== 8B shape"
NETS="0:0 0.1:10" TG=32 REPS=2 timeout 280 bash bench/dist_scaling.sh $M/llama-3.1-8b-4bit $B
echo "== 1B shape"
NETS="0:0 0.1:10 1:1" TG=32 REPS=2 timeout 110 bash bench/dist_scaling.sh $M/llama-3.2-1b-4bit $B
echo "== done at $(( $(date +%s) - t0 )) s"
