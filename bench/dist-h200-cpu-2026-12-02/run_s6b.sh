#!/usr/bin/env bash
# Issue 28, sixth session, second run: 8B 4-bit tensor parallel at 0.1 ms / 10 Gbit/s with the
# busy-polling proxy on cores of its own (netproxy --busy-poll, PROXY_CORES=12-15), 3 cores per
# node, one-hop all-reduce (auto). Run from the repo root, .devcarry/dist/dist.tar.xz carried.
set -u
mkdir -p /tmp/x && tar xJf .devcarry/dist/dist.tar.xz -C /tmp/x
export LD_LIBRARY_PATH=/tmp/x/lib
B=/tmp/x/bin M=/dev/shm/models
mkdir -p $M
t0=$(date +%s)
[ -d $M/llama-3.1-8b-4bit ] || $B/tools/mkmodel --out $M/llama-3.1-8b-4bit --preset llama-3.1-8b --quant-bits 4 --group-size 64 --tokenizer none --vocab 128256 --seed 1 >/dev/null
echo "model made in $(( $(date +%s) - t0 )) s"
export CORES_PER_RANK=3 PROXY_CORES=12-15 NETS="0.1:10" MODES=tensor
echo "== 8B 4-bit, tensor"
TG=32 REPS=2 timeout 200 bash bench/dist_scaling.sh $M/llama-3.1-8b-4bit $B
echo "== done at $(( $(date +%s) - t0 )) s"
cp bench/RESULTS-dist.log $OUT/dist-s6b.log 2>/dev/null
