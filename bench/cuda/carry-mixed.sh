#!/usr/bin/env bash
# Lays out the payload that runs bench/cuda/mixed_pipeline.py on the GPU machine (issue 18 item
# 4: a pipeline instance over a GPU node and a CPU node): `bash .devcarry-dist4/run.sh` from the
# repository root there, results in $OUT/dist4/ (summary.txt, mixed.log, the nodes' logs).
# Carried, xz-compressed (~15 MB): exo and mkmodel of BUILD (default build/cuda: `make CUDA=1
# build/cuda/exo build/cuda/tools/mkmodel`), the Debian libraries they link less those any Ubuntu
# 24.04 with python3 and apt holds (OpenBLAS itself travels: the CPU node's numbers are real
# ones), the qwen3 and llama3_1 tokenizers, the script. The models are made there by mkmodel:
# qwen3-tiny (the reference fixture's model, 2 layers) and a random Llama-3.2-1B shape (bf16).
#
#   bench/cuda/carry-mixed.sh [DEST]    default /work/main/.devcarry-dist4
# MODELS, TG and PIPE_ENVS set here become the payload's defaults (run.sh says what they mean).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/carry-lib.sh
final=${1:-/work/main/.devcarry-dist4}
b=${BUILD:-build/cuda}
for f in "$b/exo" "$b/tools/mkmodel"; do
  [ -e "$f" ] || { echo "carry-mixed: $f missing (make CUDA=1 $f)" >&2; exit 1; }
done
dest=$(carry_begin "$final")
mkdir -p "$dest/lib"
cp scripts/carry-lib.sh bench/cuda/mixed_pipeline.py "$dest/"
carry_pack "$b/exo" "$dest/exo"
carry_pack "$b/tools/mkmodel" "$dest/mkmodel"
CARRY_SKIP_LIBS=$CARRY_IMAGE_LIBS carry_shared_libs "$dest/lib" "$b/exo" "$b/tools/mkmodel"
carry_tokenizers "$dest/tokenizers" qwen3 llama3_1
{
  [ -n "${MODELS:-}" ] && printf 'MODELS=${MODELS:-%q}\n' "$MODELS"
  [ -n "${TG:-}" ] && printf 'TG=${TG:-%q}\n' "$TG"
  [ -n "${PIPE_ENVS+set}" ] && printf 'PIPE_ENVS=${PIPE_ENVS-%q}\n' "$PIPE_ENVS"
  true
} > "$dest/defaults.env"
cat > "$dest/run.sh" <<'EOF'
#!/usr/bin/env bash
# bash .devcarry-dist4/run.sh (from the repository root): a pipeline over a GPU node and a CPU
# node (bench/cuda/mixed_pipeline.py), results in $OUT/dist4 (summary.txt first)
#   MODELS="qwen3-tiny llama-1b"  TG=128  GPU_DEVICE=cuda (cpu: a dry run where there is no GPU)
#   PIPE_ENVS=";EXO_CUDA_MATMUL=exact": one pipeline run per ;-separated K=V,... list, those
#     variables on the GPU node (EXO_NODE_MEMORY_BYTES=N there: a GPU that holds less)
set -u
. "$(dirname "$0")/defaults.env" # the defaults carry-mixed.sh was given
MODELS=${MODELS:-qwen3-tiny llama-1b}
IFS=';' read -ra pipe_envs <<< "${PIPE_ENVS-;EXO_CUDA_MATMUL=exact}"
gpu_env_args=()
for e in "${pipe_envs[@]}"; do gpu_env_args+=(--gpu-env "$e"); done
[ ${#gpu_env_args[@]} -gt 0 ] || gpu_env_args=(--gpu-env "")
start=$(date +%s)
payload=$(cd "$(dirname "$0")" && pwd)
repo=$PWD
out=${OUT:-/tmp/out}/dist4
root=/tmp/dist4-root
m=/dev/shm/dist4-models
mkdir -p "$out"; rm -rf "$root" "$m"; mkdir -p "$root/build/bin" "$root/lib" "$root/.cache" "$m"
stamp() { echo "[$(( $(date +%s) - start )) s] $*"; }
. "$payload/carry-lib.sh"
{
  stamp "unpacking"
  cp "$payload/exo.xz" "$payload/mkmodel.xz" "$root/build/bin/"
  cp "$payload"/lib/*.xz "$root/lib/"
  cp -r "$payload/tokenizers" "$root/.cache/tokenizers"
  carry_unpack "$root"/build/bin/*.xz "$root"/lib/*.xz "$root"/.cache/tokenizers/*/*.xz
  chmod +x "$root"/build/bin/*
  ln -s "$repo/resources" "$root/resources" # exo in build/bin finds ../../resources
  cudalib=$(carry_cuda_libdir)
  echo "CUDA libraries: ${cudalib:-none found}"
  echo "EXO_LIBS=$root/lib${cudalib:+:$cudalib}" > "$root/libs.env"
  LD_LIBRARY_PATH="$root/lib${cudalib:+:$cudalib}" ldd "$root/build/bin/exo" | grep "not found" &&
    echo "exo: libraries missing (above)"
  LD_LIBRARY_PATH="$root/lib${cudalib:+:$cudalib}" "$root/build/bin/exo" --version
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.mem,driver_version --format=csv 2>&1 | head -3
  nproc; grep -m1 "model name" /proc/cpuinfo; free -g | head -2
  stamp "models (mkmodel)"
  cd "$root" # mkmodel reads .cache/tokenizers/NAME
  LD_LIBRARY_PATH="$root/lib" ./build/bin/mkmodel --out "$m/qwen3-tiny" --arch qwen3 --tokenizer qwen3 --seed 1
  case " $MODELS " in *" llama-1b "*)
    LD_LIBRARY_PATH="$root/lib" ./build/bin/mkmodel --out "$m/llama-1b" --preset llama-3.2-1b --seed 1 ;;
  esac
  du -sh "$m"/*
  stamp "setup done"
} > "$out/setup.log" 2>&1
. "$root/libs.env"; export EXO_LIBS
# the GPU's compute processes every 2 s: which runners compute on it (evidence beside the flag)
if command -v nvidia-smi > /dev/null; then
  while sleep 2; do nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader; done > "$out/gpu-apps.log" 2>&1 &
  sampler=$!
fi
stamp "mixed_pipeline.py $MODELS; pipeline runs with GPU node variables: ${gpu_env_args[*]}" > "$out/mixed.log"
(cd "$root" && timeout -k 5 "${MIXED_TIMEOUT:-230}" python3 "$payload/mixed_pipeline.py" "$root/build/bin/exo" "$m" \
  $MODELS --tg "${TG:-128}" --streams 4 --gpu-device "${GPU_DEVICE:-cuda}" "${gpu_env_args[@]}" \
  --logs "$out") >> "$out/mixed.log" 2>&1
rc=$?
[ -n "${sampler:-}" ] && kill "$sampler"
stamp "exit $rc$( [ $rc = 124 ] && echo ' (timed out)')" >> "$out/mixed.log"
{
  echo "# dist4: pipeline over a GPU node and a CPU node ($(date -u), $(( $(date +%s) - start )) s, exit $rc)"
  grep -E "NVIDIA|H200|model name|^[0-9]+$|Mem:|not found|exo |CUDA lib|G	|\] " "$out/setup.log"
  grep -E "^\[.*(node (gpu|cpu) \(|placed |decode b1)" "$out/mixed.log"
  sed -n '/## summary/,$p' "$out/mixed.log"
  grep -q "## summary" "$out/mixed.log" || tail -30 "$out/mixed.log"
  [ -f "$out/gpu-apps.log" ] && echo "GPU compute processes seen: $(awk -F', ' '$3 ~ /MiB/ {print $1}' "$out/gpu-apps.log" | sort -u | wc -l) pids, up to $(awk -F', ' '$3 ~ /MiB/ {v = $3 + 0; if (v > m) m = v} END {print m + 0}' "$out/gpu-apps.log") MiB"
  grep -hiE "error|fail|refused" "$out"/mixed-*.log | grep -v "^$" | sort | uniq -c | sort -rn | head -20
} > "$out/summary.txt" 2>&1
cat "$out/summary.txt"
rm -rf "$m"
EOF
chmod +x "$dest/run.sh"
carry_finish "$final"
