#!/usr/bin/env bash
# GGUF decode and prefill, exo beside llama.cpp on the same files, threads and cores (issue 24).
# The one script for the development machine and the GPU host's CPU (.devcarry payloads call it).
#
#   bench/gguf.sh [BUILD_DIR]       BUILD_DIR holds exo and tools/mkmodel (default build/release)
#
# Environment (all optional):
#   GGUF_DIR       where the models live (default .cache/bench-gguf): SHAPE-TYPE/model.gguf, e.g.
#                  l1b-Q4_0; a missing one is written first by mkmodel (--preset llama-3.2-1b or
#                  llama-3.1-8b, random weights, --gguf-row-pool 64: every block a real quantized
#                  block, written at copy speed; the types of Q4_K_M are llama.cpp's mix)
#   GGUF_SHAPES    "1b 8b" or one of them (default "1b")
#   GGUF_TYPES     default "Q4_0 Q4_K_M Q8_0"
#   GGUF_THREADS   thread counts, e.g. "4 8" (default: nproc). A run of N threads is pinned with
#                  taskset to cores GGUF_FIRST_CORE .. +N-1 (default 0), the same for both engines
#   GGUF_REPS      exo / llama.cpp alternations per (model, threads) (default 2); best of them
#   GGUF_RUNS      the runs in order, "SHAPE:THREADS[:REPS] ..." (default: every shape with every
#                  thread count and GGUF_REPS), e.g. "1b:8:2 8b:8:1 1b:4:1": the most wanted
#                  first when GGUF_DEADLINE may cut the list
#   GGUF_PP, GGUF_TG          prompt and decode tokens for 1b (default 512, 64)
#   GGUF_PP_8B, GGUF_TG_8B    the same for 8b (default 128, 32)
#   GGUF_DEADLINE  seconds: no run starts later than this after the script began (default: none)
#   GGUF_ENGINES   "exo llama" (default), or one of them (e.g. a second llama.cpp build alone)
#   GGUF_LOCK      a file: every timed run (one engine, one model) holds `flock` on it, so runs of
#                  others that take the same lock (a shared machine's bench lock) never overlap them
#   GGUF_QUIET     seconds: before each timed run, wait up to this long for a second in which the
#                  machine was >= 90% idle (a shared machine's builds and tests come and go; one
#                  busy core halves llama.cpp's spinning threads). The wait is printed
#   EXO_LLAMACPP_REF  the llama.cpp driver (default build/llamacpp/llamacpp-ref, made by
#                  scripts/llamacpp.sh; LLAMACPP_TARGET=xeon for the GPU host)
# exo: `exo bench --model` prefill ppN and decode tgN at batch 1; its decode line carries the memory
# roofline measured in the same process (read bandwidth of the same threads, probed before and
# after) over the bytes exo reads and over the GGUF file's own bytes (what llama.cpp reads).
# llama.cpp: the prefill of N tokens in one batch, then tgN greedy decode steps (llamacpp_ref.c).
# Output: every raw line, then one summary table (best of reps; ratio = exo / llama.cpp).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
exo="$build/exo"
mkmodel="$build/tools/mkmodel"
ref=${EXO_LLAMACPP_REF:-build/llamacpp/llamacpp-ref}
dir=${GGUF_DIR:-.cache/bench-gguf}
shapes=${GGUF_SHAPES:-1b}
types=${GGUF_TYPES:-Q4_0 Q4_K_M Q8_0}
threads_list=${GGUF_THREADS:-$(nproc)}
first_core=${GGUF_FIRST_CORE:-0}
reps=${GGUF_REPS:-2}
deadline=${GGUF_DEADLINE:-0}
start=$(date +%s)
engines=${GGUF_ENGINES:-exo llama}
# wait_quiet: up to GGUF_QUIET seconds for a second with the CPUs >= 90% idle (/proc/stat).
wait_quiet() {
  local until=$(( $(date +%s) + ${GGUF_QUIET:-0} )) a b
  while [ "$(date +%s)" -lt "$until" ]; do
    a=$(head -1 /proc/stat); sleep 1; b=$(head -1 /proc/stat)
    awk -v a="$a" -v b="$b" 'BEGIN { n = split(a, x); split(b, y); t = 0
      for (i = 2; i <= n; i++) t += y[i] - x[i]
      exit !(t > 0 && (y[5] - x[5] + y[6] - x[6]) / t >= 0.9) }' && return 0
  done
  echo "# not quiet after ${GGUF_QUIET:-0} s (load $(cut -d' ' -f1 /proc/loadavg)): timed anyway" >&3
}
exec 3>&1 # wait_quiet's note, past the engines' filtered output
export -f wait_quiet
export GGUF_QUIET
lock=()
[ -n "${GGUF_LOCK:-}" ] && lock=(flock "$GGUF_LOCK")
[ "${GGUF_QUIET:-0}" -gt 0 ] && lock+=(bash -c 'wait_quiet; exec "$@"' _)
want() { case " $engines " in *" $1 "*) return 0 ;; esac; return 1; }
[ -x "$exo" ] || { echo "gguf bench: $exo not built (make RELEASE=1)" >&2; exit 1; }
[ -x "$ref" ] || { echo "gguf bench: $ref not built (bash scripts/llamacpp.sh)" >&2; exit 1; }

preset() { [ "$1" = 8b ] && echo llama-3.1-8b || echo llama-3.2-1b; }
time_left() { [ "$deadline" -le 0 ] || [ $(( $(date +%s) - start )) -lt "$deadline" ]; }

echo "# gguf bench $(date -u +%FT%TZ), threads \"$threads_list\" from core $first_core, $reps reps"
echo "# host: $(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# git: $(git describe --always --dirty 2>/dev/null || echo none)"

# The models, written in parallel before any measurement (so writing never overlaps a run).
mkdir -p "$dir"
t0=$(date +%s)
for s in $shapes; do
  for t in $types; do
    m="$dir/l$s-$t"
    [ -f "$m/model.gguf" ] && continue
    "$mkmodel" --out "$m" --preset "$(preset "$s")" --tokenizer none --vocab 128256 --seed 1 \
      --gguf "$t" --gguf-row-pool 64 >/dev/null &
  done
done
wait
echo "# models ready in $(( $(date +%s) - t0 )) s"

runs=${GGUF_RUNS:-}
if [ -z "$runs" ]; then
  for s in $shapes; do for threads in $threads_list; do runs="$runs $s:$threads:$reps"; done; done
fi
summary=()
for run in $runs; do
  IFS=: read -r s threads run_reps <<< "$run"
  run_reps=${run_reps:-$reps}
  if [ "$s" = 8b ]; then pp=${GGUF_PP_8B:-128}; tg=${GGUF_TG_8B:-32}; else pp=${GGUF_PP:-512}; tg=${GGUF_TG:-64}; fi
  cores="$first_core-$(( first_core + threads - 1 ))"
  for t in $types; do
    m="$dir/l$s-$t"
    f="$m/model.gguf"
    [ -f "$f" ] || { echo "== $f missing (mkmodel failed)"; continue; }
    time_left || { echo "== deadline: $s $t $threads threads not run"; continue; }
    echo "== $s $t ($(du -m "$f" | cut -f1) MB), $threads threads on cores $cores, pp$pp tg$tg"
    best=(0 0 0 0 "" "")  # exo pp, exo tg, llama pp, llama tg, exo % roofline, % file roofline
    for r in $(seq "$run_reps"); do
      out=""
      want exo && out=$("${lock[@]}" taskset -c "$cores" "$exo" bench --threads "$threads" --model "$m" --pp "$pp" --tg "$tg" \
              --batch 1 --reps 1 2>&1 | grep -E '^(mem   read|model|prefill|decode)')
      [ -n "$out" ] && echo "$out" | sed 's/^/exo       /'
      ep=$(echo "$out" | sed -n 's/^prefill[^:]*: *\([0-9.]*\) tok\/s.*/\1/p')
      ed=$(echo "$out" | sed -n 's/^decode[^:]*: *\([0-9.]*\) tok\/s.*/\1/p')
      if awk "BEGIN{exit !(${ed:-0} > ${best[1]})}"; then
        best[4]=$(echo "$out" | awk -F'= *' '/^decode/ {split($2, a, "%"); print a[1]}')
        best[5]=$(echo "$out" | sed -n 's/.*GGUF file roofline.*= *\([0-9.]*\)%.*/\1/p')
      fi
      awk "BEGIN{exit !(${ep:-0} > ${best[0]})}" && best[0]=$ep
      awk "BEGIN{exit !(${ed:-0} > ${best[1]})}" && best[1]=$ed
      want llama || continue
      lo=$("${lock[@]}" taskset -c "$cores" "$ref" bench "$f" "$threads" "$pp" "$tg" 2>/dev/null | tail -1)
      echo "llama.cpp $lo"
      lp=$(echo "$lo" | sed -n 's/.*"prefill_tok_s": *\([0-9.]*\).*/\1/p')
      ld=$(echo "$lo" | sed -n 's/.*"decode_tok_s": *\([0-9.]*\).*/\1/p')
      awk "BEGIN{exit !(${lp:-0} > ${best[2]})}" && best[2]=$lp
      awk "BEGIN{exit !(${ld:-0} > ${best[3]})}" && best[3]=$ld
    done
    summary+=("$(awk -v s="$s" -v t="$t" -v th="$threads" -v pp="$pp" -v tg="$tg" \
      -v ep="${best[0]}" -v ed="${best[1]}" -v lp="${best[2]}" -v ld="${best[3]}" \
      -v rf="${best[4]:-?}" -v ff="${best[5]:-?}" 'BEGIN {
        printf "| %s %s | %d | pp%d %.1f | %.1f | %.2fx | tg%d %.2f | %.2f | %.2fx | %s%% | %s%% |",
          s, t, th, pp, ep, lp, (lp > 0 ? ep / lp : 0), tg, ed, ld, (ld > 0 ? ed / ld : 0), rf, ff }')")
  done
done
echo
echo "| model | threads | exo prefill tok/s | llama.cpp | ratio | exo decode tok/s | llama.cpp | ratio | exo % of roofline (its bytes) | % of GGUF file roofline |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${summary[@]}"
echo "# done in $(( $(date +%s) - start )) s"
