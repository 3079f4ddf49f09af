#!/usr/bin/env bash
# The unit tests of the aarch64 cross build (make CROSS=aarch64-linux-gnu-) under qemu-user, in
# two passes: a CPU with every extension (qemu's `max`: dotprod and i8mm, so both NEON levels run
# and the tests compare each with the reference), then a Cortex-A72 (Raspberry Pi 4: plain NEON,
# no dotprod), where run-time detection must pick the `neon` level; that pass runs the kernel and
# engine tests only. Tools the tests call (mkmodel) come from the native build ($2).
#   bash tests/run-cross.sh [CROSS_BUILD] [NATIVE_BUILD]
set -u
build=${1:-build/aarch64}
native=${2:-build}
cd "$(dirname "$0")/.."
qemu=$(command -v qemu-aarch64 || true)
if [ -z "$qemu" ]; then echo "cross: qemu-aarch64 missing (bash scripts/deps.sh --cross)"; exit 1; fi
# The arm64 loader and libraries come from the multiarch packages (/lib/ld-linux-aarch64.so.1).
rc=0
echo "aarch64 under qemu (-cpu max: neon, neon-dotprod):"
# test_engine_reference: one 4-bit model each (emulation is 20-40x slower than native: the four
# 4-bit fixtures took 18 minutes on the shared 2-core VM); the kernels themselves are compared
# with the reference on every format by test_cpu_matmul. The source checks (layout, prefetch) run
# native tools, not under qemu: the native pass runs them.
EXO_TEST_FILTER='test_qwen3_4bit' UNIT_EXEC="$qemu -cpu max" UNIT_TOOLS_BUILD="$native" \
  UNIT_SKIP="check-layout check-layout-self-test check-prefetch" bash tests/run-unit.sh "$build" || rc=1
echo "aarch64 under qemu (-cpu cortex-a72: neon only):"
EXO_TEST_FILTER='test_llama3_rope_4bit' UNIT_EXEC="$qemu -cpu cortex-a72" UNIT_TOOLS_BUILD="$native" \
  UNIT_ONLY="test_ops test_forward test_engine_reference" bash tests/run-unit.sh "$build" || rc=1
exit $rc
