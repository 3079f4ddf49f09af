#!/usr/bin/env bash
# `make run`: start a node serving the built-in demo model (exo/demo-dictionary, shipped in
# resources/models) and print the dashboard URL. Extra arguments go to `exo`.
set -euo pipefail
build=${1:-build/release}
cd "$(dirname "$0")/.."
port=${EXO_API_PORT:-52415}
echo
echo "  exo is starting: dashboard at http://localhost:$port/"
echo "  try: curl http://localhost:$port/v1/chat/completions -H 'content-type: application/json' \\"
echo "         -d '{\"model\":\"exo/demo-dictionary\",\"messages\":[{\"role\":\"user\",\"content\":\"What does harbour mean?\"}]}'"
echo
exec "$build/exo" --api-port "$port" --model exo/demo-dictionary "${@:2}"
