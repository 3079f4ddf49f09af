# Sourced by run.sh and run2.sh on the GPU host (carry.sh lays it beside them): unpacks the
# payload's tarball into /dev/shm (removed at exit with the models), puts its libraries first,
# and gives the deadline helpers. Sets here, out ($OUT/gguf4), work, start; elapsed, left.
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/gguf4-out}/gguf4
mkdir -p "$out"
work=$(mktemp -d /dev/shm/gguf4.XXXXXX)
trap 'rm -rf "$work" /dev/shm/gguf4-models' EXIT
tar xJf "$here/gguf4.tar.xz" -C "$work"
export LD_LIBRARY_PATH=$work/lib
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
left() { local v=$(( $1 - $(elapsed) )); [ "$v" -ge 1 ] || v=1; echo "$v"; } # seconds until $1 (at least 1)
