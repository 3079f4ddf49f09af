#!/usr/bin/env bash
# ab.sh (bench/gguf5, issue 24): GGUF prefill and decode, exo's AMX tiles with 3 products
# (EXO_AMX_PRODUCTS=3, the kernel before gguf5), with 2 (the default since gguf5) and llama.cpp,
# alternated round by round on one model, each run under the shared bench lock and after a quiet
# second (bench/gguf.sh's wait_quiet). Prints one line per run; the medians are read off by hand.
#   bench/gguf5/ab.sh MODEL_DIR THREADS PP TG ROUNDS [CORES]
# Environment: EXO (default build/release/exo), EXO_BASE (the exo of the "exo3" runs, e.g. a build
# of the commit before; default EXO), EXO_LLAMACPP_REF (build/llamacpp/llamacpp-ref),
# LOCK (default /work/prompts/bench.lock), QUIET seconds to wait for a quiet second (default 120).
set -uo pipefail
cd "$(dirname "$0")/../.."
m=$1 threads=$2 pp=$3 tg=$4 rounds=$5 cores=${6:-0-$(( $2 - 1 ))}
exo=${EXO:-build/release/exo} ref=${EXO_LLAMACPP_REF:-build/llamacpp/llamacpp-ref}
lock=${LOCK:-/work/prompts/bench.lock}
quiet() { # up to QUIET seconds for a second with the CPUs >= 90% idle
  local until=$(( $(date +%s) + ${QUIET:-120} )) a b
  while [ "$(date +%s)" -lt "$until" ]; do
    a=$(head -1 /proc/stat); sleep 1; b=$(head -1 /proc/stat)
    awk -v a="$a" -v b="$b" 'BEGIN { n = split(a, x); split(b, y); t = 0
      for (i = 2; i <= n; i++) t += y[i] - x[i]
      exit !(t > 0 && (y[5] - x[5] + y[6] - x[6]) / t >= 0.9) }' && { echo quiet; return; }
  done
  echo "NOT quiet"
}
for r in $(seq "$rounds"); do
  for cfg in 3 2 llama; do
    exec 9>"$lock"; flock 9
    q=$(quiet); l=$(cut -d' ' -f1 /proc/loadavg)
    if [ "$cfg" = llama ]; then
      o=$(taskset -c "$cores" "$ref" bench "$m/model.gguf" "$threads" "$pp" "$tg" 2>/dev/null | tail -1)
      p=$(echo "$o" | sed -n 's/.*"prefill_tok_s": *\([0-9.]*\).*/\1/p'); d=$(echo "$o" | sed -n 's/.*"decode_tok_s": *\([0-9.]*\).*/\1/p')
    else
      bin=$exo; [ "$cfg" = 3 ] && bin=${EXO_BASE:-$exo}
      o=$(EXO_AMX_PRODUCTS=$cfg taskset -c "$cores" "$bin" bench --threads "$threads" --model "$m" --pp "$pp" --tg "$tg" --batch 1 --reps 1 2>&1)
      p=$(echo "$o" | sed -n 's/^prefill[^:]*: *\([0-9.]*\) tok\/s.*/\1/p'); d=$(echo "$o" | sed -n 's/^decode[^:]*: *\([0-9.]*\) tok\/s.*/\1/p')
    fi
    exec 9>&-
    printf 'round %d %-6s prefill pp%d %8s tok/s  decode tg%d %7s tok/s  (%s, load %s)\n' "$r" \
      "$([ "$cfg" = llama ] && echo llama || echo "exo$cfg")" "$pp" "$p" "$tg" "$d" "$q" "$l"
  done
done
