#!/usr/bin/env bash
# Runs the end-to-end tests (tests/e2e/*.test.mjs) with node's test runner against $1/exo.
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
export EXO_BIN="$PWD/$build/exo" EXO_BUILD="$PWD/$build" EXO_ROOT="$PWD"
files=$(ls tests/e2e/*.test.mjs 2>/dev/null)
if [ -z "$files" ]; then echo "e2e: 0 passed, 0 failed"; exit 0; fi
# Each file runs in its own process; files run one at a time (servers use fixed ports).
node --test --test-concurrency=1 --test-reporter=spec $files 2>&1 | tee "$build/e2e.log"
rc=${PIPESTATUS[0]}
pass=$(grep -E '^ℹ pass ' "$build/e2e.log" | tail -1 | awk '{print $3}')
fail=$(grep -E '^ℹ fail ' "$build/e2e.log" | tail -1 | awk '{print $3}')
echo "e2e: ${pass:-0} passed, ${fail:-0} failed"
exit $rc
