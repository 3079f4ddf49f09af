#!/usr/bin/env bash
# `make run`: start a node serving the demo model and print the dashboard URL.
set -euo pipefail
build=${1:-build/release}
cd "$(dirname "$0")/.."
port=${EXO_API_PORT:-52415}
echo "exo: dashboard at http://localhost:$port/"
exec "$build/exo" --api-port "$port" "${@:2}"
