#!/bin/bash
# Waits up to $1 seconds (default 120) for a second with the CPUs >= 90% idle; exit 1 if none.
lim=${1:-120}; t=0
while [ $t -lt $lim ]; do
  read -r _ u n s i w q sq st _ < /proc/stat; a=$((u+n+s+i+w+q+sq+st)); b=$((i+w))
  sleep 1
  read -r _ u n s i w q sq st _ < /proc/stat; a2=$((u+n+s+i+w+q+sq+st)); b2=$((i+w))
  [ $(( (b2-b)*100 / (a2-a) )) -ge 90 ] && exit 0
  t=$((t+1))
done
exit 1
