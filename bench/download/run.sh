#!/usr/bin/env bash
# Download throughput: exo's downloader (curl multi + SHA-256 verification + .partial/rename)
# against plain `curl -o` fetching the same file from the same local server, interleaved.
# Prints both rates per run and the median ratio (target >= 0.80).
#   bash bench/download/run.sh [build/release] [SIZE_MB]
# Environment:
#   RUNS=5          paired runs (curl then exo, back to back)
#   SERVER=node     the fake Hub (tests/e2e/lib/fake-hf.mjs, Node.js streams; ~1 CPU-s per GB)
#   SERVER=peer     exo's own peer file server (`download serve`, libmicrohttpd + sendfile;
#                   ~0.15 CPU-s per GB), exo fetching it as a peer (manifest + files route)
#   WORK=DIR        scratch dir (default a mktemp dir under /tmp; must hold 2x SIZE_MB)
set -eu
build=${1:-build/release}
size_mb=${2:-2048}
server=${SERVER:-node}
cd "$(dirname "$0")/../.."
dl="$build/tools/download"
[ -x "$dl" ] || { echo "no $dl: run make RELEASE=1 $dl"; exit 1; }
work=$(mktemp -d "${WORK:-/tmp}/exo-bench-dl-XXXXXX")
srv=
trap '[ -n "$srv" ] && kill $srv 2>/dev/null; rm -rf "$work"' EXIT
bytes=$((size_mb * 1024 * 1024))
mkdir -p "$work/src/bench--big"
head -c "$bytes" /dev/urandom > "$work/src/bench--big/model.safetensors"
src="$work/src/bench--big/model.safetensors"
if [ "$server" = peer ]; then
  sha=$(sha256sum "$src" | cut -d' ' -f1)
  printf '{"model_id":"bench/big","revision":"main","files":[{"path":"model.safetensors","size":%s,"sha256":"%s"}]}\n' \
    "$bytes" "$sha" > "$work/src/bench--big/.exo-manifest.json"
  port=$((20000 + RANDOM % 20000))
  "$dl" serve --models-dir "$work/src" --port "$port" > "$work/serve.log" 2>&1 &
  srv=$!
  url="http://127.0.0.1:$port"
  for _ in $(seq 1 100); do curl -sf -o /dev/null "$url/models/bench/big/manifest" && break; sleep 0.1; done
  curl_url="$url/models/bench/big/files/model.safetensors"
  exo_args=(--peer "$url")
  export HF_ENDPOINT=http://127.0.0.1:9 # never used: the peer has the model
else
  node bench/download/serve.mjs "$src" > "$work/url" &
  srv=$!
  for _ in $(seq 1 600); do [ -s "$work/url" ] && break; sleep 0.1; done
  url=$(cat "$work/url")
  curl_url="$url/bench/big/resolve/main/model.safetensors"
  exo_args=()
  export HF_ENDPOINT="$url"
fi
cat "$src" > /dev/null # the source file is in the page cache for every run
rate() { awk -v b="$bytes" -v s="$1" 'BEGIN { printf "%.0f", b / s / 1e6 }'; }
now() { date +%s.%N; }
runs=${RUNS:-5}
ratios=""; curls=""; exos=""
echo "server $server, $size_mb MiB, load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
for run in $(seq 1 "$runs"); do
  # each timed download starts with no dirty pages left by the previous one (writeback
  # throttling would otherwise charge one tool for the other's bytes); both write a new file
  # on the same filesystem
  rm -f "$work/curl.bin"; rm -rf "$work/models"; sync
  t0=$(now); curl -s -o "$work/curl.bin" "$curl_url"; t1=$(now)
  c=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  cmp -s "$src" "$work/curl.bin" || { echo "curl download differs"; exit 1; }
  rm -f "$work/curl.bin"; sync
  t0=$(now)
  "$dl" get bench/big --models-dir "$work/models" "${exo_args[@]}" --json > "$work/exo.out"
  t1=$(now)
  e=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  cmp -s "$src" "$work/models/bench--big/model.safetensors" || { echo "exo download differs"; exit 1; }
  rm -rf "$work/models"
  echo "run $run: curl $(rate "$c") MB/s (${c}s)  exo $(rate "$e") MB/s (${e}s, verified)"
  ratios="$ratios $(awk -v a="$c" -v b="$e" 'BEGIN { printf "%.3f", a / b }')"
  curls="$curls $(rate "$c")"; exos="$exos $(rate "$e")"
done
med() { echo $1 | tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "curl MB/s:$curls (median $(med "$curls"))"
echo "exo MB/s:$exos (median $(med "$exos"))"
echo "per-run ratios (curl time / exo time):$ratios; median $(med "$ratios") (target >= 0.80)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
