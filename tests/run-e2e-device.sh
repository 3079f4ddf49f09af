#!/usr/bin/env bash
# The API e2e suite on one device: every exo node and `exo run` the tests start gets
# `--device DEVICE` (EXO_TEST_DEVICE, see tests/e2e/lib/exo.mjs), everything else is
# tests/run-e2e.sh over the files listed below.
#
#   tests/run-e2e-device.sh cuda build/cuda    the GPU machine (issue 18's "Done when")
#   tests/run-e2e-device.sh cpu                the same files on the CPU (the default build)
#   tests/run-e2e-device.sh cpu build gguf api-openai    only those files of the suite
#   tests/run-e2e-device.sh --list             the files, one a line
#
# The suite is every file that serves models through the HTTP APIs of one node (OpenAI, Claude,
# Ollama, Responses, exo's own endpoints, structured output, prefix cache, speculative decoding,
# GGUF and gpt-oss models, downloads that end in a chat) or through `exo run` on the way to
# them. Left out: files that run no model on the device (cli, models, download, cluster*,
# dashboard*: those need a browser), multi-node files (several runners per test on one GPU,
# CPU-only tensor parallelism), cuda.test.mjs (compiles the backend; needs the source tree),
# run.test.mjs (its fixtures are checked on the GPU by test_engine_reference already) and soak.
set -u
here=$(cd "$(dirname "$0")" && pwd)
SUITE=(api-openai api-claude-ollama api-edges api-lifecycle api-server structured prefix-cache
  speculative robustness slow-clients models-api model-ids placement autoplace chat-download
  run-download gguf gpt-oss)
if [ "${1:-}" = --list ]; then printf 'tests/e2e/%s.test.mjs\n' "${SUITE[@]}"; exit 0; fi
device=${1:?usage: tests/run-e2e-device.sh cpu|cuda|auto [build dir] (or --list)}
case $device in
cpu | cuda | auto) ;;
*) echo "run-e2e-device: device '$device' is not one of cpu, cuda, auto" >&2; exit 2 ;;
esac
build=${2:-build}
if [ $# -gt 2 ]; then
  for name in "${@:3}"; do
    [[ " ${SUITE[*]} " == *" $name "* ]] || { echo "run-e2e-device: '$name' is not in the suite (--list)" >&2; exit 2; }
  done
  SUITE=("${@:3}")
fi
export EXO_TEST_DEVICE=$device
E2E_FILES=$(printf 'tests/e2e/%s.test.mjs ' "${SUITE[@]}")
export E2E_FILES
echo "e2e on --device $device ($build/exo): ${#SUITE[@]} files"
exec bash "$here/run-e2e.sh" "$build"
