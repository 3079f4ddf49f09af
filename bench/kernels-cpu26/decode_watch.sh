#!/usr/bin/env bash
# decode_watch.sh (cpu26; cpu27 added the bench lock held per set (LOCK=file), the order of the
# configurations rotated set by set, and the read probe printed) — batch-1 decode A/B taken only at a shared machine's quiet moments: whenever
# the machine was >= IDLE% (default 90) idle for a second, runs every configuration once back to back
# (exo bench --threads 2 --model MODEL --pp 16 --tg 64 --batch 1 --reps 1) and prints the decode
# lines and the idle share after them (keep the sets still >= 90% idle after; bench/RESULTS.md,
# issue 25 cpu26). Stops after DUR seconds (default 2400).
#   bash bench/kernels-cpu26/decode_watch.sh MODEL_DIR EXO[:ENV=V,ENV=V] ...
# e.g. decode_watch.sh /tmp/q/llama-3.2-1b-8bit /tmp/main-exo build/release/exo \
#      build/release/exo:EXO_CPU_SIMD=avx2
set -u
model=$1; shift
end=$(( $(date +%s) + ${DUR:-2400} ))
idle() { # percent of CPU time idle over one second, all CPUs
  local a b c d e f g h t1 i1
  read -r _ a b c d e f g h _ < /proc/stat; t1=$((a+b+c+d+e+f+g+h)); i1=$((d+e)); sleep 1
  read -r _ a b c d e f g h _ < /proc/stat; echo $(( 100 * (d + e - i1) / (a+b+c+d+e+f+g+h - t1) ))
}
n=0
while [ "$(date +%s)" -lt $end ]; do
  i=$(idle)
  if [ "$i" -lt "${IDLE:-90}" ]; then sleep 2; continue; fi
  n=$((n+1)); echo "#### set $n idle-before $i $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  [ -n "${LOCK:-}" ] && exec 9<"$LOCK" && flock 9
  cfgs=("$@"); k=$(( (n - 1) % ${#cfgs[@]} ))
  for cfg in "${cfgs[@]:$k}" "${cfgs[@]:0:$k}"; do
    exo=${cfg%%:*}; envs=; [ "$exo" != "$cfg" ] && envs=${cfg#*:}
    echo -n "$cfg: "
    env ${envs//,/ } X=1 "$exo" bench --threads 2 --model "$model" --pp 16 --tg 64 --batch 1 --reps 1 2>&1 | grep -E '^decode'
  done
  [ -n "${LOCK:-}" ] && exec 9<&-
  echo "idle-after $(idle)"
done
