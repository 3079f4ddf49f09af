#!/usr/bin/env bash
# Download throughput: exo's downloader (curl multi + SHA-256 verification + .partial/rename)
# against plain `curl -o` fetching the same file from the same local server, interleaved.
# Prints per run: wall time and MB/s, CPU seconds (user+sys) of the client and of the server
# during that download; then medians and the median ratio curl time / exo time (target >= 0.80).
#   bash bench/download/run.sh [build/release] [SIZE_MB]
# Environment:
#   RUNS=5          paired runs (curl, exo[, baseline] back to back)
#   BASE=DIR        also time DIR/tools/download (e.g. a build of main) in the same runs (A/B)
#   SERVER=cdn      (default) the fake Hub (tests/e2e/lib/fake-hf.mjs) answering the file's
#                   resolve with a 302 to a CDN, as huggingface.co does for LFS files; the CDN
#                   is exo's peer file server (`download serve`: libmicrohttpd + sendfile), so
#                   the bytes cost the serving side almost no CPU, like a remote server
#   SERVER=node     the fake Hub serving the bytes itself (Node.js streams from disk: ~0.7
#                   CPU-s per GiB on the same cores as the client)
#   SERVER=peer     exo's peer file server directly, exo fetching it as a peer (manifest +
#                   files routes)
#   LOCK=FILE       flock held around each timed download (default /tmp/exo-bench.lock; empty: none)
#   WORK=DIR        scratch dir (default a mktemp dir under /tmp; must hold 2x SIZE_MB)
set -eu
build=${1:-build/release}
size_mb=${2:-2048}
server=${SERVER:-cdn}
cd "$(dirname "$0")/../.."
dl="$build/tools/download"
[ -x "$dl" ] || { echo "no $dl: run make RELEASE=1 $dl"; exit 1; }
base=${BASE:+$BASE/tools/download}
work=$(mktemp -d "${WORK:-/tmp}/exo-bench-dl-XXXXXX")
srv= srvs= # every server process started (their CPU is measured)
trap 'for p in $srv $srvs; do kill $p 2>/dev/null; done; rm -rf "$work"' EXIT
bytes=$((size_mb * 1024 * 1024))
mkdir -p "$work/src/bench--big"
src="$work/src/bench--big/model.safetensors"
head -c "$bytes" /dev/urandom > "$src"
peer_url=
if [ "$server" = peer ] || [ "$server" = cdn ]; then
  sha=$(sha256sum "$src" | cut -d' ' -f1)
  printf '{"model_id":"bench/big","revision":"main","files":[{"path":"model.safetensors","size":%s,"sha256":"%s"}]}\n' \
    "$bytes" "$sha" > "$work/src/bench--big/.exo-manifest.json"
  port=$((20000 + RANDOM % 20000))
  "$dl" serve --models-dir "$work/src" --port "$port" > "$work/serve.log" 2>&1 &
  srv=$!
  peer_url="http://127.0.0.1:$port"
  for _ in $(seq 1 100); do curl -sf -o /dev/null "$peer_url/models/bench/big/manifest" && break; sleep 0.1; done
fi
curl_args=()
if [ "$server" = peer ]; then
  curl_url="$peer_url/models/bench/big/files/model.safetensors"
  exo_args=(--peer "$peer_url")
  export HF_ENDPOINT=http://127.0.0.1:9 # never used: the peer has the model
else
  cdn=${peer_url:+$peer_url/models/bench/big/files/model.safetensors}
  node bench/download/serve.mjs "$src" $cdn > "$work/url" &
  hub=$!
  srv=${srv:-$hub}
  srvs="$srvs $hub"
  for _ in $(seq 1 600); do [ -s "$work/url" ] && break; sleep 0.1; done
  url=$(cat "$work/url")
  curl_url="$url/bench/big/resolve/main/model.safetensors"
  curl_args=(-L) # cdn: follow the Hub's redirect, as exo does
  exo_args=()
  export HF_ENDPOINT="$url"
fi
cat "$src" > /dev/null # the source file is in the page cache for every run
tck=$(getconf CLK_TCK)
servers=$(echo $srv $srvs | tr ' ' '\n' | sort -u | tr '\n' ' ')
# CPU seconds of every server process (the Hub's redirects and the CDN's bytes in cdn mode)
srv_cpu() { for p in $servers; do cat "/proc/$p/stat"; done | awk -v t="$tck" '{ s += $14 + $15 } END { printf "%.2f", s / t }'; }
# timed NAME CMD...: runs CMD after a sync with no dirty pages left (writeback throttling would
# otherwise charge one tool for the other's bytes); sets T (wall s), C (client CPU s), S (server CPU s)
TIMEFORMAT='%R %U %S'
# Each timed download holds the shared benchmark lock (LOCK, default /tmp/exo-bench.lock; LOCK=
# turns it off) so that other people's measurements do not overlap it; waiting is not timed.
lock=${LOCK-/tmp/exo-bench.lock}
[ -n "$lock" ] && exec 9>>"$lock"
timed() {
  sync
  local s0 s1 out
  [ -n "$lock" ] && flock 9
  s0=$(srv_cpu)
  out=$( { time "$@" > /dev/null 2>&1; } 2>&1 )
  s1=$(srv_cpu)
  [ -n "$lock" ] && flock -u 9
  T=$(echo "$out" | awk '{ print $1 }')
  C=$(echo "$out" | awk '{ printf "%.2f", $2 + $3 }')
  S=$(awk -v a="$s0" -v b="$s1" 'BEGIN { printf "%.2f", b - a }')
}
rate() { awk -v b="$bytes" -v s="$1" 'BEGIN { printf "%.0f", b / s / 1e6 }'; }
runs=${RUNS:-5}
declare -A col
add() { col[$1]="${col[$1]:-} $2"; }
echo "server $server, $size_mb MiB, $(nproc) cores, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for run in $(seq 1 "$runs"); do
  rm -f "$work/curl.bin"
  timed curl -s "${curl_args[@]}" -o "$work/curl.bin" "$curl_url"
  cmp -s "$src" "$work/curl.bin" || { echo "curl download differs"; exit 1; }
  rm -f "$work/curl.bin"
  ct=$T; add curl "$(rate "$T")"; add curl_cpu "$C"; add curl_srv "$S"
  line="run $run: curl $(rate "$T") MB/s (${T}s, cpu ${C}s, server cpu ${S}s)"
  for v in exo ${base:+base}; do
    bin=$dl; [ "$v" = base ] && bin=$base
    rm -rf "$work/models"
    timed "$bin" get bench/big --models-dir "$work/models" "${exo_args[@]}" --json
    cmp -s "$src" "$work/models/bench--big/model.safetensors" || { echo "$v download differs"; exit 1; }
    rm -rf "$work/models"
    add "$v" "$(rate "$T")"; add "${v}_cpu" "$C"; add "${v}_srv" "$S"
    add "${v}_ratio" "$(awk -v a="$ct" -v b="$T" 'BEGIN { printf "%.3f", a / b }')"
    line="$line  $v $(rate "$T") MB/s (${T}s, cpu ${C}s, server cpu ${S}s)"
  done
  echo "$line"
done
med() { echo $1 | tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
for v in curl exo ${base:+base}; do
  echo "$v MB/s:${col[$v]} (median $(med "${col[$v]}")); client CPU s:${col[${v}_cpu]} (median $(med "${col[${v}_cpu]}")); server CPU s median $(med "${col[${v}_srv]}")"
done
echo "exo: per-run ratios (curl time / exo time):${col[exo_ratio]}; median $(med "${col[exo_ratio]}") (target >= 0.80)"
[ -n "$base" ] && echo "base: per-run ratios (curl time / base time):${col[base_ratio]}; median $(med "${col[base_ratio]}")"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
