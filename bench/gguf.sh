#!/usr/bin/env bash
# GGUF decode and prefill, exo beside llama.cpp on the same files and threads (issue 24).
#   bench/gguf.sh [BUILD_DIR]     default build/release (make RELEASE=1)
# Models: every .cache/bench-gguf/*/model.gguf; GGUF_MODELS="dir1 dir2" to choose. Make them with
#   build/release/tools/mkmodel --out .cache/bench-gguf/l1b-q4_0 --preset llama-3.2-1b \
#       --tokenizer llama3_1 --gguf Q4_0          (Q8_0, Q4_K_M; --preset llama-3.1-8b)
# llama.cpp: build/llamacpp/llamacpp-ref (bash scripts/llamacpp.sh; -O2 -march=native, its CPU
# backend with its repacked kernels) or $EXO_LLAMACPP_REF. Threads: GGUF_THREADS (default nproc).
# Each model: exo bench --model (prefill pp512, decode tg64 at batch 1, with its memory roofline),
# then llama.cpp's prefill of 512 tokens and 64 greedy decode steps, alternating engines
# GGUF_REPS times (default 2) so a change in the host's load hits both.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
exo="$build/exo"
ref=${EXO_LLAMACPP_REF:-build/llamacpp/llamacpp-ref}
threads=${GGUF_THREADS:-$(nproc)}
reps=${GGUF_REPS:-2}
pp=${GGUF_PP:-512}
[ -x "$exo" ] || { echo "gguf bench: $exo not built (make RELEASE=1)" >&2; exit 1; }
[ -x "$ref" ] || { echo "gguf bench: $ref not built (bash scripts/llamacpp.sh)" >&2; exit 1; }
models=${GGUF_MODELS:-$(ls -d .cache/bench-gguf/*/ 2>/dev/null)}
echo "# gguf bench $(date -u +%FT%TZ), $threads threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# git: $(git describe --always --dirty 2>/dev/null)"
for m in $models; do
  m=${m%/}
  f="$m/model.gguf"
  [ -f "$f" ] || continue
  echo "== $f ($(du -m "$f" | cut -f1) MB)"
  for r in $(seq "$reps"); do
    "$exo" bench --threads "$threads" --model "$m" --pp "$pp" --tg 64 --batch 1 --reps 1 2>&1 |
      grep -E '^(mem   read|model|prefill|decode)' | sed 's/^/exo       /'
    echo "llama.cpp $("$ref" bench "$f" "$threads" "$pp" 64 2>/dev/null)"
  done
done
