#!/usr/bin/env bash
# Runs every C unit test binary in $1/tests and prints "unit: N passed, N failed".
# Each binary is a cmocka group; its own exit code says whether it passed.
# Unit tests run from the repository root (they read tests/fixtures/ and .cache/).
set -u
build=${1:-build}
# In a sanitized build (build/san) any ASan/UBSan/LSan report makes the binary exit non-zero.
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
cd "$(dirname "$0")/.."
passed=0; failed=0; failed_names=()
for t in "$build"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  # UNIT_SKIP: space-separated names run-all.sh leaves out of the sanitized pass (they ran above).
  case " ${UNIT_SKIP:-} " in *" $name "*) echo "  $name (not in this pass: UNIT_SKIP)"; continue;; esac
  log="$build/tests/$name.log"
  start=$(date +%s%N)
  if EXO_BUILD="$build" "$t" >"$log" 2>&1; then
    passed=$((passed + 1)); status=ok
  else
    failed=$((failed + 1)); status=FAIL; failed_names+=("$name")
  fi
  printf '  %-40s %s (%.1fs)\n' "$name" "$status" "$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN{print (b-a)/1e9}')"
  if [ "$status" = FAIL ]; then sed 's/^/    | /' "$log" | tail -40; fi
done
echo "unit: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
