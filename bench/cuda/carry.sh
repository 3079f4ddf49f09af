#!/usr/bin/env bash
# Lays out what bench/cuda/run_on_gpu.sh needs in DEST (default /work/main/.devcarry-cuda, a
# folder the device tool carries): the CUDA build's binaries (make CUDA=1, no -march=native:
# the GPU machine's CPU may differ), the Debian libraries they link that an Ubuntu image lacks,
# the reference fixtures and the two tokenizers they use; binaries and libraries xz-compressed
# (run_on_gpu.sh unpacks them). DEST/run.sh is what runs there, from the repository root:
# `bash .devcarry-cuda/run.sh`, results in $OUT/cuda/ (summary.txt, logs.tar.gz); a DEST named
# .devcarry-NAME writes $OUT/NAME/ instead. RUN_ENV (e.g. 'ALT="..." PROFILE=0') is set in run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/carry-lib.sh # carry_pack, carry_shared_libs (shared with scripts/carry-e2e-device.sh)
final=${1:-/work/main/.devcarry-cuda}
dest=$(carry_begin "$final")
b=${BUILD:-build/cuda}
mkdir -p "$dest"/{build/tools,build/tests,lib,tests/fixtures}
cp bench/cuda/run_on_gpu.sh bench/cuda/api_smoke.py "$dest/"
cat > "$dest/run.sh" <<'EOF'
#!/usr/bin/env bash
# bash .devcarry-cuda/run.sh (from the repository root): the CUDA payload, results in $OUT/cuda
cd "$(dirname "$0")" || exit 1
# the reference fixtures travel with the repository itself (not carried twice)
# (git carries no empty folder: tests/fixtures is made here)
[ -d tests/fixtures/reference ] || { mkdir -p tests/fixtures && cp -r ../tests/fixtures/reference tests/fixtures/; } ||
  echo "run.sh: the reference fixtures could not be copied: test_engine_reference will fail" >&2
export OUT="${OUT:-/tmp/out}/@NAME@"; mkdir -p "$OUT"
@RUN_ENV@ bash run_on_gpu.sh > "$OUT/console.log" 2>&1
cd "$OUT" && tar czf /tmp/@NAME@-logs.tar.gz --exclude summary.txt . && mv /tmp/@NAME@-logs.tar.gz logs.tar.gz &&
  find . -maxdepth 1 -type f ! -name logs.tar.gz ! -name summary.txt -delete
cat "$OUT/summary.txt"
EOF
name=$(basename "$final"); name=${name#.devcarry-}
sed -i "s|@NAME@|$name|g; s|@RUN_ENV@|${RUN_ENV:-}|" "$dest/run.sh"
carry_pack $b/exo "$dest/build/exo"
for t in mkmodel nodeinfo gemvbench; do carry_pack $b/tools/$t "$dest/build/tools/$t"; done
for t in test_cuda_ops test_engine_reference; do carry_pack $b/tests/$t "$dest/build/tests/$t"; done
carry_tokenizers "$dest/.cache/tokenizers" qwen3 llama3_1 gptoss
carry_shared_libs "$dest/lib" $b/exo $b/tests/test_cuda_ops $b/tests/test_engine_reference
carry_finish "$final"
