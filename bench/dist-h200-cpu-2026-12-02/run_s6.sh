#!/usr/bin/env bash
# Issue 28, sixth session: 8B-shape decode scaling with the one-hop all-reduce (auto = direct for
# decode-sized sums), 3 cores per node and netproxy on cores of its own (12-15): the proxy plays
# the network, so it must not take a node's cores. 4-bit (tensor and pipeline) and bf16 (tensor).
# Run from the repo root on the GPU machine with .devcarry/dist/dist.tar.xz carried (portable
# build + its Debian libraries, see bench/RESULTS.md).
set -u
root=$PWD
mkdir -p /tmp/x && tar xJf .devcarry/dist/dist.tar.xz -C /tmp/x
export LD_LIBRARY_PATH=/tmp/x/lib
B=/tmp/x/bin M=/dev/shm/models
mkdir -p $M
echo "== host"; nproc; lscpu | grep -E 'Model name|Thread|L3' ; free -g | head -2
t0=$(date +%s)
$B/tools/mkmodel --out $M/llama-3.1-8b-4bit --preset llama-3.1-8b --quant-bits 4 --group-size 64 --tokenizer none --vocab 128256 --seed 1 >/dev/null &
$B/tools/mkmodel --out $M/llama-3.1-8b-bf16 --preset llama-3.1-8b --tokenizer none --vocab 128256 --seed 1 >/dev/null &
wait; echo "models made in $(( $(date +%s) - t0 )) s"; du -sh $M/*
echo "== data plane, 4 ranks through the proxy at 0.1 ms / 10 Gbit/s"
timeout 40 $B/exo bench --section dist --ranks 4 --delay-ms 0.1 --rate-gbit 10 2>&1 | tail -12
export CORES_PER_RANK=3 PROXY_CORES=12-15 NETS="0.1:10"
echo "== 8B 4-bit, tensor and pipeline"
TG=32 REPS=2 timeout 260 bash bench/dist_scaling.sh $M/llama-3.1-8b-4bit $B
echo "== 8B bf16, tensor, batch 1"
MODES=tensor BATCH=1 TG=12 REPS=1 timeout 150 bash bench/dist_scaling.sh $M/llama-3.1-8b-bf16 $B
echo "== done at $(( $(date +%s) - t0 )) s"
cp bench/RESULTS-dist.log $OUT/ 2>/dev/null
