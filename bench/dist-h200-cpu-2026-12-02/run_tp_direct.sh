#!/usr/bin/env bash
# Issue 28: tensor-parallel decode through netproxy (0.1 ms / 10 Gbit/s), direct vs ring all-reduce.
cd "$(dirname "$0")"; mkdir -p x && tar xJf dist.tar.xz -C x
export LD_LIBRARY_PATH=$PWD/x/lib; B=$PWD/x/bin; M=/dev/shm/l1b
$B/tools/mkmodel --out $M --preset llama-3.2-1b --quant-bits 4 --group-size 64 --tokenizer none --vocab 128256 --seed 1 >/dev/null
run() { # algo n delay
  local algo=$1 n=$2 extra=() pid=
  if [ "$n" -gt 1 ]; then
    $B/tools/netproxy --listen 127.0.0.1:23100 --target 127.0.0.2:23000 --count $((n*n)) --delay-ms 0.1 --rate-gbit 10 >/dev/null 2>&1 & pid=$!
    sleep 0.2; extra=(--dist-bind 127.0.0.2 --dist-advertise 127.0.0.1 --dist-port-base 23000 --dist-advertise-offset 100)
  fi
  cores=0-3; [ "$n" = 2 ] && cores=0-3/4-7; [ "$n" = 4 ] && cores=0-3/4-7/8-11/12-15
  echo "== tensor x$n, all-reduce $algo, 0.1 ms / 10 Gbit/s"
  EXO_DIST_ALLREDUCE=$algo timeout 40 $B/exo bench --threads 1 --mem-mib 16 --model $M --tp $n --cores $cores --batch 1,4 --tg 32 --reps 2 "${extra[@]}" 2>&1 | grep -E '^dist (tensor|  rank 0, decode)'
  [ -n "$pid" ] && kill $pid; wait 2>/dev/null
}
run auto 1; run ring 2; run direct 2; run ring 4; run direct 4
