#!/usr/bin/env bash
# Distributed decode scaling (issue 28): one model split over 1, 2 and 4 "nodes" on one many-core
# host, each node a set of ranks pinned to its own cores, joined by the real data plane (Gloo TCP
# on loopback), with latency and bandwidth imposed by tools/netproxy in the data path (ranks
# advertise the proxy's ports; this kernel class has no netem).
#
#   bash bench/dist/scaling.sh BUILD_DIR MODEL_DIR [MODEL_DIR ...]
#
# Environment: CORES_PER_NODE (4), NODES ("1 2 4"), MODES ("tensor pipeline"),
# LINKS ("direct 0.1:10 1:1" = one-way delay ms : Gbit/s), TG (32), REPS (2), BATCH_TP ("1"),
# BATCH_PP ("1,4": 4 concurrent streams is the pipeline's throughput case).
# Prints, in order: each node's read bandwidth alone and all nodes together (exo bench --section
# mem pinned to each node's cores), the data plane's all-reduce overhead beside a bare Gloo ring
# (exo bench --section dist), then one "dist ..." block per (model, mode, nodes, link) with
# rank 0's decode tok/s and the per-step split into compute and communication.
set -uo pipefail
build=${1:?build dir}; shift
bin=$build/exo proxy=$build/tools/netproxy
C=${CORES_PER_NODE:-4}
NODES=${NODES:-"1 2 4"} MODES=${MODES:-"tensor pipeline"} LINKS=${LINKS:-"direct 0.1:10 1:1"}
TG=${TG:-32} REPS=${REPS:-2} BATCH_TP=${BATCH_TP:-1} BATCH_PP=${BATCH_PP:-1,4}
PORT_BASE=${PORT_BASE:-30000} OFFSET=1000

cores_of() { echo "$(( $1 * C ))-$(( $1 * C + C - 1 ))"; }   # node i -> "a-b"
cores_list() { local n=$1 s="" i; for ((i = 0; i < n; i++)); do s+="${s:+/}$(cores_of $i)"; done; echo "$s"; }

echo "== host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(date -u +%FT%TZ)"
echo "== read bandwidth per node ($C cores each), alone and all together"
maxn=1; for n in $NODES; do [ "$n" -gt "$maxn" ] && maxn=$n; done
for ((i = 0; i < maxn; i++)); do
  printf 'node %d alone (cores %s): ' "$i" "$(cores_of $i)"
  taskset -c "$(cores_of $i)" "$bin" bench --section mem --threads "$C" --quick 2>&1 | grep -m1 -i 'read' || echo '?'
done
echo "all $maxn nodes at once:"
for ((i = 0; i < maxn; i++)); do
  (taskset -c "$(cores_of $i)" "$bin" bench --section mem --threads "$C" --quick 2>&1 | grep -m1 -i 'read' | sed "s/^/  node $i: /") &
done
wait

echo "== data plane: all-reduce overhead beside a bare Gloo ring (2 ranks, loopback)"
"$bin" bench --section dist 2>&1 | tail -20

for model in "$@"; do
  for mode in $MODES; do
    for n in $NODES; do
      for link in $LINKS; do
        [ "$n" = 1 ] && [ "$link" != direct ] && continue   # one node has no links
        flag=--tp batch=$BATCH_TP
        [ "$mode" = pipeline ] && flag=--pp-ranks batch=$BATCH_PP
        extra=() pid=
        if [ "$link" != direct ]; then
          delay=${link%%:*} rate=${link##*:}
          "$proxy" --listen 127.0.0.1:$((PORT_BASE + OFFSET)) --target 127.0.0.1:$PORT_BASE \
            --count $((n * n)) --delay-ms "$delay" --rate-gbit "$rate" >/dev/null 2>&1 &
          pid=$!
          sleep 0.3
          extra=(--dist-advertise-offset $OFFSET)
        fi
        echo "== $(basename "$model") $mode nodes=$n link=$link (delay ms:Gbit/s) cores=$(cores_list "$n")"
        timeout 300 "$bin" bench --model "$model" $flag "$n" --batch "$batch" --tg "$TG" --reps "$REPS" \
          --cores "$(cores_list "$n")" --threads-per-rank "$C" --dist-port-base $PORT_BASE "${extra[@]}" 2>&1 |
          grep -E '^dist|error|Error' | grep -v '^dist  *rank [1-9]'
        [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
        PORT_BASE=$((PORT_BASE + 100))   # fresh ports: no TIME_WAIT clashes between runs
      done
    done
  done
done
