#!/usr/bin/env bash
# Load test: CONN (64) concurrent clients, each streaming chat completions back to back for DUR
# (60s), against a node serving a tiny model; run twice. Reports wrk's numbers, bad streams
# (not 200, no [DONE], or an error frame) and the node's RSS after warm-up and after each round
# (flat = no leak). Not part of `make test`.
#   bash bench/api/load.sh [BUILD_DIR]        env: CONN=64 DUR=60s TOKENS=16
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
CONN=${CONN:-64} DUR=${DUR:-60s} TOKENS=${TOKENS:-16}
export TOKENS EXO_BUILD="$PWD/$build" EXO_ROOT="$PWD"
dir=$(node -e "import('./tests/e2e/lib/models.mjs').then(async m => console.log(await m.tinyModel('qwen3-tiny')))")
port=$(node -e "const s=require('net').createServer().listen(0,()=>{console.log(s.address().port);s.close()})")
"$build/exo" --api-port "$port" --models-path "$(dirname "$dir")" -q &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
url="http://127.0.0.1:$port"
for _ in $(seq 100); do curl -sf "$url/node_id" >/dev/null && break; sleep 0.1; done
rss() { awk '/VmRSS/{print $2}' "/proc/$pid/status"; }
curl -sf "$url/v1/chat/completions" -d '{"model":"qwen3-tiny","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}' >/dev/null
wrk -t2 -c"$CONN" -d5s --timeout 60s -s bench/api/stream.lua "$url/v1/chat/completions" >/dev/null
echo "node RSS after warm-up: $(rss) KiB"
for round in 1 2; do
  echo "== round $round: $CONN connections, $DUR, $TOKENS tokens per stream"
  wrk -t2 -c"$CONN" -d"$DUR" --timeout 60s --latency -s bench/api/stream.lua "$url/v1/chat/completions"
  sleep 1
  echo "node RSS after round $round: $(rss) KiB; open connections: $(curl -s "$url/metrics" | awk '/^exo_open_connections/{print $2}')"
done
