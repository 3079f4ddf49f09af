#!/usr/bin/env bash
# Runs the end-to-end tests (tests/e2e/*.test.mjs) with node's test runner against $1/exo.
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
export EXO_BIN="$PWD/$build/exo" EXO_BUILD="$PWD/$build" EXO_ROOT="$PWD"
# Sanitizer reports (ASan/UBSan/LSan in a build/san binary: node, runner, tool) go to files in
# $build/san-reports/ whatever process wrote them; any report fails the run (see the end).
sanlogs="$PWD/$build/san-reports"; rm -rf "$sanlogs"; mkdir -p "$sanlogs"
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}:log_path=$sanlogs/asan"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}:log_path=$sanlogs/ubsan"
files=${E2E_FILES:-$(ls tests/e2e/*.test.mjs 2>/dev/null)}
if [ -z "$files" ]; then echo "e2e: 0 passed, 0 failed"; exit 0; fi
# Each file runs in its own process; files run one at a time (servers use fixed ports).
node --test --test-concurrency=1 --test-reporter=spec $files 2>&1 | tee "$build/e2e.log"
rc=${PIPESTATUS[0]}
pass=$(grep -E '^ℹ pass ' "$build/e2e.log" | tail -1 | awk '{print $3}')
fail=$(grep -E '^ℹ fail ' "$build/e2e.log" | tail -1 | awk '{print $3}')
reports=$(ls "$sanlogs" 2>/dev/null)
if [ -n "$reports" ]; then
  for f in "$sanlogs"/*; do echo "== sanitizer report $f"; head -60 "$f"; done
  echo "e2e: sanitizer reports above ($(echo "$reports" | wc -l) files in $sanlogs)"
  fail=$(( ${fail:-0} + 1 )); rc=1
fi
echo "e2e: ${pass:-0} passed, ${fail:-0} failed"
exit $rc
