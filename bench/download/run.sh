#!/usr/bin/env bash
# Download throughput: exo's downloader (curl multi + SHA-256 verification + .partial/rename)
# against plain `curl -o` fetching the same 2 GB file from the same local fake-Hub server.
# Prints both rates and the ratio (target >= 0.80).
#   bash bench/download/run.sh [build/release] [SIZE_MB]
set -eu
build=${1:-build/release}
size_mb=${2:-2048}
cd "$(dirname "$0")/../.."
work=$(mktemp -d /tmp/exo-bench-dl-XXXXXX)
trap 'kill $srv 2>/dev/null || true; rm -rf "$work"' EXIT
head -c $((size_mb * 1024 * 1024)) /dev/urandom > "$work/src.bin"
node bench/download/serve.mjs "$work/src.bin" > "$work/url" &
srv=$!
for _ in $(seq 1 600); do [ -s "$work/url" ] && break; sleep 0.1; done
url=$(cat "$work/url")
bytes=$((size_mb * 1024 * 1024))
rate() { awk -v b="$bytes" -v s="$1" 'BEGIN { printf "%.0f", b / s / 1e6 }'; }
now() { date +%s.%N; }
runs=${RUNS:-5}
best_curl=0; best_exo=0; ratios=""
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
for run in $(seq 1 "$runs"); do
  # each timed download starts with no dirty pages left by the previous one (writeback
  # throttling would otherwise charge one tool for the other's 2 GB)
  rm -f "$work/curl.bin"; rm -rf "$work/models"; sync
  t0=$(now); curl -s -o "$work/curl.bin" "$url/bench/big/resolve/main/model.safetensors"; t1=$(now)
  c=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  rm -f "$work/curl.bin"; sync
  t0=$(now)
  HF_ENDPOINT="$url" "$build/tools/download" get bench/big --models-dir "$work/models" --json > "$work/exo.out"
  t1=$(now)
  e=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  cmp -s "$work/src.bin" "$work/models/bench--big/model.safetensors" || { echo "exo download differs"; exit 1; }
  rm -rf "$work/models"
  echo "run $run: curl $(rate "$c") MB/s (${c}s)  exo $(rate "$e") MB/s (${e}s, verified)"
  ratios="$ratios $(awk -v a="$c" -v b="$e" 'BEGIN { printf "%.3f", a / b }')"
  best_curl=$(awk -v a="$best_curl" -v b="$(rate "$c")" 'BEGIN { print (b > a) ? b : a }')
  best_exo=$(awk -v a="$best_exo" -v b="$(rate "$e")" 'BEGIN { print (b > a) ? b : a }')
done
median=$(echo $ratios | tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
echo "per-run ratios (curl time / exo time):$ratios; median $median"
echo "best: curl ${best_curl} MB/s, exo ${best_exo} MB/s, ratio $(awk -v a="$best_exo" -v b="$best_curl" 'BEGIN { printf "%.2f", a / b }') (target >= 0.80)"
