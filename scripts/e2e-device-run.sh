#!/usr/bin/env bash
# run.sh of the payload scripts/carry-e2e-device.sh lays out: on the GPU machine, from the
# repository root, `bash .devcarry-cudae2e/run.sh` runs the API e2e suite with every exo node
# and `exo run` on `--device cuda` (tests/run-e2e-device.sh), in a tree of its own under /tmp
# (the payload stays as carried). Results in $OUT/cudae2e/: summary.txt (what ran where, the
# pass/fail counts, every test's line, the failures) and logs.tar.gz (the whole log, the setup).
#   DEVICE=cpu (or auto)   the same suite on another device (a check of the plumbing)
#   E2E_TIMEOUT=225        seconds the suite may take (the payload's window is 4 minutes; the
#                          first run on the H200 took 198 s, 85 of them in failing structured tests)
#   ONLY="gguf api-openai" only those files of the suite
#   CARRIED_NODE=1         use the carried node even where the machine has one
set -u
start=$(date +%s)
payload=$(cd "$(dirname "$0")" && pwd)
repo=$PWD
device=${DEVICE:-cuda}
out=${OUT:-/tmp/out}/cudae2e
root=${E2E_ROOT:-/tmp/cudae2e-root}
mkdir -p "$out"; rm -rf "$root"; mkdir -p "$root/build/bin" "$root/build/tools" "$root/bin" "$root/lib"
setup=$out/setup.log
stamp() { echo "[$(( $(date +%s) - start )) s] $*"; }
. "$payload/carry-lib.sh"

{
  stamp "unpacking $payload into $root"
  python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$payload/tree.tar.xz" "$root"
  cp "$payload/exo.xz" "$payload/mkmodel.xz" "$root/build/bin/"
  cp "$payload"/lib/*.xz "$root/lib/"
  carry_unpack "$root"/build/bin/*.xz "$root"/lib/*.xz

  # node >= 20 (the tests use import.meta.dirname): the machine's, else the carried one
  have=$(node --version 2>/dev/null)
  if [ -z "${CARRIED_NODE:-}" ] && [ "${have:-v0}" != v0 ] && [ "$(echo "${have#v}" | cut -d. -f1)" -ge 20 ]; then
    echo "node: the machine's $(command -v node) $have"
  else
    cp "$payload/node.xz" "$root/bin/" && carry_unpack "$root/bin/node.xz" && chmod +x "$root/bin/node"
    export PATH=$root/bin:$PATH
    echo "node: carried, $(node --version) (the machine's: ${have:-none})"
  fi

  # exo and mkmodel behind wrappers that give them (only them) the carried libraries and CUDA's;
  # the real exo in build/bin finds ../../resources: the repository's built-in models and cards
  cudalib=$(carry_cuda_libdir)
  echo "CUDA libraries: ${cudalib:-none found}"
  ln -s "$repo/resources" "$root/resources"
  carry_wrapper "$root/build/exo" "$root/build/bin/exo" "$root/lib${cudalib:+:$cudalib}"
  carry_wrapper "$root/build/tools/mkmodel" "$root/build/bin/mkmodel" "$root/lib"
  # the payload leaves the libraries every Ubuntu 24.04 has to the image: any it lacks show here
  LD_LIBRARY_PATH="$root/lib${cudalib:+:$cudalib}" ldd "$root/build/bin/exo" | grep "not found" &&
    echo "exo: libraries missing (above)"
  "$root/build/exo" --version
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
  stamp "setup done"
} > "$setup" 2>&1

stamp "e2e suite, --device $device" > "$out/e2e.log"
# the GPU's compute processes every 2 s while the suite runs: the runners show up there when
# they compute on it (evidence beside the flag itself)
if command -v nvidia-smi > /dev/null; then
  while sleep 2; do nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader; done > "$out/gpu-apps.log" 2>&1 &
  sampler=$!
fi
(cd "$root" && timeout -k 5 "${E2E_TIMEOUT:-225}" bash tests/run-e2e-device.sh "$device" build ${ONLY:-}) >> "$out/e2e.log" 2>&1
rc=$?
[ -n "${sampler:-}" ] && kill "$sampler"
stamp "suite exit $rc$( [ $rc = 124 ] && echo ' (timed out)')" >> "$out/e2e.log"

{
  echo "# API e2e suite on --device $device ($(date -u), $(( $(date +%s) - start )) s, exit $rc)"
  grep -E "^node:|^CUDA|^exo |^exo:|not found|NVIDIA|H200|Error|error" "$setup"
  grep -E "^e2e" "$out/e2e.log"
  [ -f "$out/gpu-apps.log" ] && awk -F', ' '$3 ~ /MiB/ {n++; pids[$1]; m = ($3 + 0 > m) ? $3 + 0 : m}
    END {k = 0; for (p in pids) k++; printf "GPU compute processes while the suite ran: %d samples, %d distinct pids, up to %d MiB each\n", n, k, m}' "$out/gpu-apps.log"
  grep -E "^ℹ (tests|pass|fail|cancelled|skipped|duration)" "$out/e2e.log" | tr '\n' ' '; echo
  echo "## tests"
  sed '/failing tests:/q' "$out/e2e.log" | grep -E "^ {0,3}[✔✖﹣] " | grep -v "failing tests:"
  echo "## failures"
  sed -n '/failing tests:/,$p' "$out/e2e.log" | grep -vE "^ +at " | head -150
  tail -2 "$out/e2e.log"
} > "$out/summary.txt"
cp "$root/build/e2e.log" "$out/e2e-tee.log" 2>/dev/null
(cd "$out" && tar czf /tmp/cudae2e-logs.tar.gz --exclude summary.txt . && mv /tmp/cudae2e-logs.tar.gz logs.tar.gz &&
  find . -maxdepth 1 -type f ! -name logs.tar.gz ! -name summary.txt -delete)
cat "$out/summary.txt"
