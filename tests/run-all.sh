#!/usr/bin/env bash
# `make test`: unit tests, then end-to-end tests; one summary line at the end.
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
bash tests/run-unit.sh "$build" | tee "$build/unit.out"; unit_rc=${PIPESTATUS[0]}
bash tests/run-e2e.sh "$build" | tee "$build/e2e.out"; e2e_rc=${PIPESTATUS[0]}
up=$(grep -E '^unit: ' "$build/unit.out" | awk '{print $2}'); uf=$(grep -E '^unit: ' "$build/unit.out" | awk '{print $4}')
ep=$(grep -E '^e2e: ' "$build/e2e.out" | awk '{print $2}'); ef=$(grep -E '^e2e: ' "$build/e2e.out" | awk '{print $4}')
echo
echo "total: $(( ${up:-0} + ${ep:-0} )) passed, $(( ${uf:-0} + ${ef:-0} )) failed"
[ "$unit_rc" -eq 0 ] && [ "$e2e_rc" -eq 0 ]
