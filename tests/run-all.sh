#!/usr/bin/env bash
# `make test`: unit tests, then end-to-end tests; one summary line at the end.
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
# llama.cpp itself, compiled from its public source (scripts/llamacpp.sh: ~2 min of 2 cores the
# first time, nothing after), for test_gguf's differential test; EXO_LLAMACPP_REQUIRED makes that
# test fail, not skip, when the build did not succeed. EXO_TEST_LLAMACPP=0 leaves both out.
if [ "${EXO_TEST_LLAMACPP:-1}" != 0 ]; then
  echo "building llama.cpp for the GGUF differential test (log: $build/llamacpp-build.out)"
  JOBS=$(nproc) bash scripts/llamacpp.sh >"$build/llamacpp-build.out" 2>&1 || tail -20 "$build/llamacpp-build.out"
  export EXO_LLAMACPP_REQUIRED=1
fi
bash tests/run-unit.sh "$build" | tee "$build/unit.out"; unit_rc=${PIPESTATUS[0]}
bash tests/run-e2e.sh "$build" | tee "$build/e2e.out"; e2e_rc=${PIPESTATUS[0]}
# The kernel and engine tests again as on an AVX2-only CPU (EXO_CPU_SIMD=avx2: no AVX-512 kernel,
# attention or layout anywhere), where this machine has AVX-512.
avx2_rc=0; ap=0; af=0
if [ "$build" != build/san ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "unit tests with the AVX-512 path disabled (EXO_CPU_SIMD=avx2):"
  EXO_CPU_SIMD=avx2 UNIT_ONLY="test_ops test_forward test_engine test_engine_reference test_tensor_parallel" \
    bash tests/run-unit.sh "$build" | tee "$build/unit-avx2.out"; avx2_rc=${PIPESTATUS[0]}
  ap=$(grep -E '^unit: ' "$build/unit-avx2.out" | awk '{print $2}'); af=$(grep -E '^unit: ' "$build/unit-avx2.out" | awk '{print $4}')
fi
# The aarch64 cross build's tests under qemu-user (tests/run-cross.sh); EXO_TEST_CROSS=0 skips.
cross_rc=0; cp=0; cf=0
if [ "$build" != build/san ] && [ "${EXO_TEST_CROSS:-1}" != 0 ] && [ "$(uname -m)" = x86_64 ]; then
  if make --no-print-directory -j"$(nproc)" CROSS=aarch64-linux-gnu- all >"build/cross-build.out" 2>&1; then
    bash tests/run-cross.sh build/aarch64 "$build" | tee build/aarch64/unit.out; cross_rc=${PIPESTATUS[0]}
    cp=$(grep -E '^unit: ' build/aarch64/unit.out | awk '{s+=$2} END {print s+0}')
    cf=$(grep -E '^unit: ' build/aarch64/unit.out | awk '{s+=$4} END {print s+0}')
  else
    echo "aarch64 cross build failed (bash scripts/deps.sh --cross installs the toolchain):"
    tail -30 build/cross-build.out; cross_rc=1; cf=1
  fi
fi
# Unit tests again under ASan+UBSan+LSan (build/san), unless this run already is the sanitized
# one or EXO_TEST_SAN=0. test_engine_reference is left out of this pass: it already ran above
# and takes ~300 s under ASan on 2 cores versus ~25 s for all the others together; so are the
# layout checks (scripts, no sanitized code: they ran above).
san_rc=0; sp=0; sf=0
if [ "$build" != build/san ] && [ "${EXO_TEST_SAN:-1}" != 0 ]; then
  echo "unit tests under ASan+UBSan (build/san):"
  if make --no-print-directory -j"$(nproc)" SAN=1 all >"build/san-build.out" 2>&1; then
    UNIT_SKIP="test_engine_reference check-layout check-layout-self-test" bash tests/run-unit.sh build/san | tee build/san/unit.out
    san_rc=${PIPESTATUS[0]}
    sp=$(grep -E '^unit: ' build/san/unit.out | awk '{print $2}'); sf=$(grep -E '^unit: ' build/san/unit.out | awk '{print $4}')
  else
    tail -30 build/san-build.out; san_rc=1; sf=1
  fi
fi
up=$(grep -E '^unit: ' "$build/unit.out" | awk '{print $2}'); uf=$(grep -E '^unit: ' "$build/unit.out" | awk '{print $4}')
ep=$(grep -E '^e2e: ' "$build/e2e.out" | awk '{print $2}'); ef=$(grep -E '^e2e: ' "$build/e2e.out" | awk '{print $4}')
echo
# The failing tests of every pass, each with its failing lines, last: CI keeps only the tail of
# this output, and a failure named far above it would be cut off.
for out in "$build/unit.out" "$build/unit-avx2.out" build/aarch64/unit.out build/san/unit.out; do
  [ -f "$out" ] || continue
  for name in $(grep -E '^  [^ ]+ +FAIL \(' "$out" | awk '{print $1}'); do
    echo "FAILED: $name in $out"
    log="$(dirname "$out")/tests/$name.log"
    [ -f "$log" ] || continue
    # A cmocka group: each failing case's own lines (from its RUN to its verdict), which the
    # group's later cases would push out of a plain tail; else the end of the log.
    cases=$(grep -E '^\[  FAILED  \] [A-Za-z_0-9]+$' "$log" | awk '{print $4}' | sort -u)
    if [ -n "$cases" ]; then
      for c in $cases; do
        awk -v c="$c" '$0 ~ "^\\[ RUN +\\] " c "$" {on=1} on {print} on && $0 ~ "^\\[  FAILED  \\] " c "$" {exit}' "$log" |
          tail -25 | sed 's/^/    | /'
      done
    else
      tail -15 "$log" | sed 's/^/    | /'
    fi
  done
done
[ "$e2e_rc" -ne 0 ] && grep -E '^✖ ' "$build/e2e.log" 2>/dev/null | head -20 | sed 's/^/FAILED (e2e): /'
echo "total: $(( ${up:-0} + ${ep:-0} + ${sp:-0} + ${ap:-0} + ${cp:-0} )) passed, $(( ${uf:-0} + ${ef:-0} + ${sf:-0} + ${af:-0} + ${cf:-0} )) failed"
[ "$unit_rc" -eq 0 ] && [ "$e2e_rc" -eq 0 ] && [ "$san_rc" -eq 0 ] && [ "$avx2_rc" -eq 0 ] && [ "$cross_rc" -eq 0 ]
