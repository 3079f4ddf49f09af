#!/usr/bin/env bash
# `make test`: unit tests, then end-to-end tests; one summary line at the end.
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
bash tests/run-unit.sh "$build" | tee "$build/unit.out"; unit_rc=${PIPESTATUS[0]}
bash tests/run-e2e.sh "$build" | tee "$build/e2e.out"; e2e_rc=${PIPESTATUS[0]}
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
echo "total: $(( ${up:-0} + ${ep:-0} + ${sp:-0} )) passed, $(( ${uf:-0} + ${ef:-0} + ${sf:-0} )) failed"
[ "$unit_rc" -eq 0 ] && [ "$e2e_rc" -eq 0 ] && [ "$san_rc" -eq 0 ]
