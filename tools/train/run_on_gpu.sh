#!/bin/bash
# Runs on the GPU machine from the repo root (with .devcarry/ laid out as tools/train/README.md says): trains, evaluates with transformers and with exo's
# own forward pass (CPU), and leaves what comes back in $OUT. Everything goes to $OUT as soon as it exists, so a run cut
# off by the device tool's time limit still returns its log and, once written, the model.
set -uo pipefail
cd .devcarry
export PYTHONUNBUFFERED=1
python3 train.py --data data --tokenizer tok --out /tmp/demo "$@" 2>&1 | grep -v "Warning\|warnings.warn" | tee $OUT/train.log
(cd /tmp/demo && split -b 12M 4bit/model.safetensors $OUT/q4.part- && sha256sum 4bit/model.safetensors bf16/model.safetensors &&
 tar czf $OUT/small.tgz results.json loss.png test-ids.txt.gz 4bit/config.json 4bit/generation_config.json bf16/config.json)
python3 -c "import lzma,glob;[open(f[:-3],\"wb\").write(lzma.open(f).read()) for f in glob.glob(\"lib/*.xz\")]"; export LD_LIBRARY_PATH=$PWD/lib
zcat /tmp/demo/test-ids.txt.gz > /tmp/test-ids.txt
for m in bf16 4bit; do echo "exo perplexity $m:"; ./bin/perplexity /tmp/demo/$m /tmp/test-ids.txt --threads 16 --kv f32; done 2>&1 | tee $OUT/ppl.log
ls -la $OUT
