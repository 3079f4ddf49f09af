#!/usr/bin/env bash
# Issue 24 (GGUF), helper gguf2: exo beside llama.cpp on the GPU machine's CPU (the GPU unused),
# the same GGUF files, the same threads pinned to the same cores (0-7 / 0-3), alternating.
# Llama-3.2-1B and Llama-3.1-8B shapes, random weights (mkmodel --gguf TYPE --gguf-row-pool 64,
# written here at copy speed into /dev/shm), Q4_0 / Q4_K_M / Q8_0. exo: `exo bench --model`
# (prefill, decode at batch 1, memory roofline measured in the same process, over exo's bytes and
# over the GGUF file's bytes); llama.cpp: its CPU backend built from source on the dev VM
# (scripts/llamacpp.sh LLAMACPP_TARGET=xeon: AVX-512 VNNI/BF16 + its AMX kernels, as its native
# build on this Xeon would be) driven by scripts/llamacpp_ref.c; then the same llama.cpp without
# AMX (xeon-noamx) on the runs time allows, to tell AMX's share. The whole comparison is
# bench/gguf.sh (carried in the tarball). Needs the machine's cores 0-7 to itself.
# Hard limit ~225 s. Results: $OUT/gguf2/bench.log
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/gguf2-out}/gguf2
mkdir -p "$out"
work=$(mktemp -d /dev/shm/gguf2.XXXXXX)
trap 'rm -rf "$work" /dev/shm/gguf2-models' EXIT
tar xJf "$here/gguf2.tar.xz" -C "$work"
export LD_LIBRARY_PATH=$work/lib
{
  echo "== host"; nproc; lscpu | grep -E 'Model name|L3|NUMA node0' ; free -g | head -2
  grep -o -w -E 'amx_int8|amx_tile|avx512_vnni|avx512_bf16' /proc/cpuinfo | sort | uniq -c
  echo "load: $(cat /proc/loadavg)"; cat "$work/COMMIT"
  cd "$work" && export GGUF_DIR=/dev/shm/gguf2-models GGUF_SHAPES="${GGUF_SHAPES:-1b 8b}"
  EXO_LLAMACPP_REF=build/llamacpp-ref GGUF_RUNS="${GGUF_RUNS:-1b:8:2 8b:8:1 1b:4:1}" \
    GGUF_DEADLINE=${GGUF_DEADLINE:-140} timeout 180 bash bench/gguf.sh build
  echo "== llama.cpp without AMX"
  EXO_LLAMACPP_REF=build/llamacpp-noamx-ref GGUF_ENGINES=llama GGUF_RUNS="${GGUF_RUNS2:-1b:8:1 8b:8:1}" \
    GGUF_DEADLINE=${GGUF_DEADLINE2:-22} timeout 35 bash bench/gguf.sh build
} > "$out/bench.log" 2>&1
tail -24 "$out/bench.log"
