#!/usr/bin/env bash
# Distributed decode scaling (issue 28): one model over 1, 2 and 4 local ranks, tensor and pipeline
# parallel, each rank pinned to its own CORES_PER_RANK cores, the data plane on loopback through
# tools/netproxy (one-way delay and rate limit in both directions; the kernel has no netem).
# Prints every rank's read bandwidth alone and together, decode tok/s per batch and the step time
# split into compute and communication (exo bench --model DIR --tp N | --pp-ranks N).
#   bash bench/dist_scaling.sh MODEL_DIR [BUILD_DIR]
# Env: CORES_PER_RANK (4), RANKS ("1 2 4"), MODES ("tensor pipeline"), NETS ("0:0 0.1:10 0.1:1
# 1:10 1:1", each DELAY_MS:GBIT, 0:0 = no proxy), BATCH (1,4), TG (64), REPS (2), PROXY_CORES (a
# taskset CPU list for netproxy, e.g. 12-15: the proxy stands in for the network, so it should not
# take a rank's cores; given, the proxy also busy-polls (netproxy --busy-poll: exact delays, where a
# sleeping proxy's wake-ups added ~0.1 ms per message); default unpinned and sleeping), PREFILL (a
# prompt length: also measure prefill, BATCH prompts of PREFILL tokens at once; TG=0 skips decode).
# Appends to bench/RESULTS-dist.log; copy the numbers into bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: bench/dist_scaling.sh MODEL_DIR [BUILD_DIR]}
build=${2:-build/release}
cpr=${CORES_PER_RANK:-4}
ranks_list=${RANKS:-1 2 4}
modes=${MODES:-tensor pipeline}
nets=${NETS:-0:0 0.1:10 0.1:1 1:10 1:1}
port_base=21000 offset=100
proxy_pid=
stop_proxy() { [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null && wait "$proxy_pid" 2>/dev/null; proxy_pid=; }
trap stop_proxy EXIT

cores_for() { # N ranks -> "0-3/4-7/..."
  local n=$1 out= k
  for ((k = 0; k < n; k++)); do out+="${out:+/}$((k * cpr))-$((k * cpr + cpr - 1))"; done
  echo "$out"
}

run() { # mode ranks delay gbit
  local mode=$1 n=$2 delay=$3 gbit=$4 flag=--tp net=()
  local path="net $delay ms one way / $gbit Gbit/s"
  [ "$mode" = pipeline ] && flag=--pp-ranks
  [ "$delay:$gbit" = 0:0 ] && path="direct loopback"
  echo "== $mode x$n, $path ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
  if [ "$n" -gt 1 ] && [ "$delay:$gbit" != 0:0 ]; then
    # ranks listen on 127.0.0.2, dial the proxy on 127.0.0.1 (it must sort below the ranks')
    ${PROXY_CORES:+taskset -c "$PROXY_CORES"} "$build/tools/netproxy" --listen 127.0.0.1:$((port_base + offset)) \
      --target 127.0.0.2:$port_base --count $((n * n)) --delay-ms "$delay" --rate-gbit "$gbit" ${PROXY_CORES:+--busy-poll} &
    proxy_pid=$!
    sleep 0.3
    net=(--dist-bind 127.0.0.2 --dist-advertise 127.0.0.1 --dist-port-base $port_base
         --dist-advertise-offset $offset)
  fi
  "$build/exo" bench --threads 1 --mem-mib 16 --model "$model" "$flag" "$n" --cores "$(cores_for "$n")" \
    --batch "${BATCH:-1,4}" --tg "${TG:-64}" --reps "${REPS:-2}" ${PREFILL:+--prefill "$PREFILL"} "${net[@]}" \
    2>&1 | grep '^dist' || true
  stop_proxy
}

{
  for mode in $modes; do
    for n in $ranks_list; do
      if [ "$n" -eq 1 ]; then run "$mode" 1 0 0; continue; fi
      for net in $nets; do run "$mode" "$n" "${net%%:*}" "${net##*:}"; done
    done
  done
} 2>&1 | tee -a bench/RESULTS-dist.log
