#!/usr/bin/env bash
# Runs every C unit test binary in $1/tests, then the source layout check (scripts/check-layout.sh)
# and its self-test and the prefetch check (scripts/check-prefetch.sh), and prints "unit: N passed,
# N failed". Each binary is a cmocka group; its own
# exit code says whether it passed.
# Unit tests run from the repository root (they read tests/fixtures/ and .cache/).
# UNIT_EXEC: a command each test binary runs under (qemu-aarch64 for a cross build, see
# tests/run-cross.sh); UNIT_TOOLS_BUILD: the build whose tools/ the tests call (default $1).
set -u
build=${1:-build}
# In a sanitized build (build/san) any ASan/UBSan/LSan report makes the binary exit non-zero.
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
cd "$(dirname "$0")/.."
passed=0; failed=0; failed_names=()
# run_one NAME COMMAND...: one test; its exit code says whether it passed.
run_one() {
  local name=$1; shift
  # UNIT_SKIP: space-separated names run-all.sh leaves out of the sanitized pass (they ran above).
  case " ${UNIT_SKIP:-} " in *" $name "*) echo "  $name (not in this pass: UNIT_SKIP)"; return;; esac
  # UNIT_ONLY: space-separated names a focused pass runs (run-all.sh's AVX2 and aarch64 passes).
  if [ -n "${UNIT_ONLY:-}" ]; then case " $UNIT_ONLY " in *" $name "*) ;; *) return;; esac; fi
  local log="$build/tests/$name.log" start status
  start=$(date +%s%N)
  if EXO_BUILD="${UNIT_TOOLS_BUILD:-$build}" ${UNIT_EXEC:-} "$@" >"$log" 2>&1; then
    passed=$((passed + 1)); status=ok
  else
    failed=$((failed + 1)); status=FAIL; failed_names+=("$name")
  fi
  printf '  %-40s %s (%.1fs)\n' "$name" "$status" "$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN{print (b-a)/1e9}')"
  if [ "$status" = FAIL ]; then sed 's/^/    | /' "$log" | tail -40; fi
}
for t in "$build"/tests/test_*; do
  [ -x "$t" ] || continue
  run_one "$(basename "$t")" "$t"
done
# The source layout (docs/architecture.md): the rules, and proof that each rule catches a violation.
mkdir -p "$build/tests"
run_one check-layout bash scripts/check-layout.sh
run_one check-layout-self-test bash scripts/check-layout.sh --self-test
# The matvec kernels' software prefetch is in the compiled code (GCC deletes __builtin_prefetch loops).
run_one check-prefetch bash scripts/check-prefetch.sh "$build"
echo "unit: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
