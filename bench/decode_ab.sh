#!/usr/bin/env bash
# Interleaved A/B of the decode knobs (weights placement, matvec split, q/k/v + gate/up fusion,
# software prefetch) on one model: every round runs each variant once, in turn, so slow phases of
# a shared machine hit all variants alike; prints the median over rounds of decode b1 and b8 tok/s
# and of the read bandwidth measured in the same process.
#   bash bench/decode_ab.sh MODEL_DIR [ROUNDS] [BASELINE_EXO]
# BASELINE_EXO: another exo binary (e.g. built from main) run as variant "baseline".
# Env: EXO (default build/release/exo), TG (32), BATCH (1,8), VARIANTS ("name|VAR=V ...;name|...",
# replaces the list below), LOCK (a file: each run holds `flock LOCK`, e.g. /tmp/exo-bench.lock on
# a machine shared with other benchmarks). Prints the share of the roofline too (b1%, ...).
set -euo pipefail
model=${1:?usage: bench/decode_ab.sh MODEL_DIR [ROUNDS] [BASELINE_EXO]}
rounds=${2:-3}
baseline=${3:-}
exo=${EXO:-build/release/exo}
tg=${TG:-32}
batch=${BATCH:-1,8}
variants=(
  "default|X=1"
  "mmap-weights|EXO_WEIGHTS_MEM=mmap"
  "dynamic-split|EXO_MATVEC_SPLIT=dynamic"
  "no-fusion|EXO_MATMUL_FUSE=0"
  "prefetch-2k|EXO_MATVEC_PREFETCH=2048"
)
if [ -n "${VARIANTS:-}" ]; then IFS=';' read -r -a variants <<<"$VARIANTS"; fi
[ -n "$baseline" ] && variants=("baseline|X=1" "${variants[@]}")
log=$(mktemp)
for r in $(seq "$rounds"); do
  for v in "${variants[@]}"; do
    name=${v%%|*} envs=${v#*|} bin=$exo
    [ "$name" = baseline ] && bin=$baseline
    # shellcheck disable=SC2086
    ${LOCK:+flock "$LOCK"} env $envs "$bin" bench --model "$model" --pp 16 --tg "$tg" --batch "$batch" --reps 2 2>&1 |
      awk -v n="$name" -v r="$r" -v load="$(cut -d' ' -f1 /proc/loadavg)" '
        /read-only/ {print n, r, "bw", $(NF-5), load}
        /^decode/ {b = $3; sub(/:$/, "", b); match($0, /[0-9.]+ tok\/s/); t = substr($0, RSTART, RLENGTH - 6)
                   match($0, /= *[0-9.]+%/); p = substr($0, RSTART, RLENGTH); gsub(/[= %]/, "", p)
                   print n, r, b, t, load; print n, r, b "%", p, load}' | tee -a "$log"
  done
done
echo "== medians over $rounds rounds (tok/s; bw in GB/s)"
awk '{k=$1" "$3; v[k]=v[k]" "$4} END {for (k in v) print k, v[k]}' "$log" | sort |
  while read -r name what vals; do
    med=$(echo "$vals" | tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
    printf "%-14s %-4s median %8.2f   (%s)\n" "$name" "$what" "$med" "$vals"
  done
rm -f "$log"
