#!/usr/bin/env bash
# check-layout — fails (exit 1, one line per problem naming the file and the rule) when the
# source tree breaks the layout of /work/shared/DESIGN.md section 2 (docs/architecture.md):
#   root        no .c (or .h) file at src/ root but main.c (commands live in src/cmd/)
#   options     no header outside src/cmd/ includes cmd/options.h (modules take their own config)
#   direction   a module includes only itself and the modules listed below for it
#   route       no HTTP route (method + path, capture names aside) is registered twice
#   cpu         compute/cpu/cpu_internal.h is included only inside src/compute/cpu/
#
#   scripts/check-layout.sh [ROOT]     check the tree at ROOT (default: this repository)
#   scripts/check-layout.sh --self-test
#                                      plant one violation of each rule in a copy of src/ and
#                                      check that each is caught (and that the copy passes first)
set -u

# Allowed include directions, one per line: "FROM -> TO", where FROM is a folder of src/
# (main = src/main.c) and TO a folder of src/ or one header in it. A module may always include
# its own headers. Everything not listed is refused.
#   node side:   cmd -> api -> worker -> cluster -> download -> model, text, base
#   runner side: runner -> infer -> arch -> compute -> base;  infer, arch -> dist -> base
#   both sides share model/, text/, base/ and the runner protocol's message types.
ALLOWED_DIRECTIONS='
main -> cmd
main -> base
cmd -> api
cmd -> worker
cmd -> cluster
cmd -> download
cmd -> runner
cmd -> infer
cmd -> arch
cmd -> dist
cmd -> compute
cmd -> model
cmd -> text
cmd -> base
api -> worker
api -> cluster
api -> download
api -> model
api -> text
api -> base
api -> runner/protocol.h
worker -> cluster
worker -> download
worker -> model
worker -> text
worker -> base
worker -> runner/protocol.h
cluster -> download
cluster -> model
cluster -> text
cluster -> base
download -> model
download -> text
download -> base
runner -> infer
runner -> arch
runner -> dist
runner -> compute
runner -> model
runner -> text
runner -> base
infer -> arch
infer -> dist
infer -> compute
infer -> model
infer -> text
infer -> base
arch -> dist
arch -> compute
arch -> model
arch -> base
dist -> base
compute -> model/weight_types.h
compute -> base
model -> base
text -> base
'
# compute/ sees model/ only through the leaf header of dtypes and weight views.

self_test() {
    local here tmp fails=0
    here=$(cd "$(dirname "$0")/.." && pwd)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    fresh() { rm -rf "$tmp/tree"; mkdir -p "$tmp/tree/tests/unit" "$tmp/tree/tools"; cp -r "$here/src" "$tmp/tree/src"; }
    # expect NAME RULE FILE: the check must fail and name RULE and FILE.
    expect() {
        local out
        if out=$(bash "$here/scripts/check-layout.sh" "$tmp/tree" 2>&1); then
            echo "self-test FAIL: $1: the check passed"; fails=$((fails + 1)); return
        fi
        if ! grep -F "[$2]" <<<"$out" | grep -qF "$3"; then
            echo "self-test FAIL: $1: no line naming $3 and [$2] in:"; echo "$out" | sed 's/^/  | /'
            fails=$((fails + 1)); return
        fi
        echo "self-test ok: $1 -> $(grep -F "[$2]" <<<"$out" | grep -F "$3" | head -1)"
    }
    fresh
    if ! bash "$here/scripts/check-layout.sh" "$tmp/tree" >"$tmp/clean.out" 2>&1; then
        echo "self-test FAIL: the unchanged copy of src/ does not pass:"; sed 's/^/  | /' "$tmp/clean.out"
        return 1
    fi
    echo "self-test ok: the unchanged copy of src/ passes"

    fresh; echo 'int planted(void) { return 0; }' >"$tmp/tree/src/planted.c"
    expect "a .c file at src/ root" root "src/planted.c"

    fresh; printf '#include "cmd/options.h"\n' >>"$tmp/tree/src/worker/worker.h"
    expect "a header outside cmd/ includes the options header" options "src/worker/worker.h"

    fresh; printf '#include "api/api.h"\n' >>"$tmp/tree/src/cluster/placement.c"
    expect "a lower module includes a higher one (cluster -> api)" direction "src/cluster/placement.c"

    fresh; printf '#include "infer/engine.h"\n' >>"$tmp/tree/src/compute/compute.c"
    expect "the runner side upside down (compute -> infer)" direction "src/compute/compute.c"

    fresh; printf '#include "runner/runner.h"\n' >>"$tmp/tree/src/api/metrics.c"
    expect "a header of a module only partly allowed (api -> runner/runner.h)" direction "src/api/metrics.c"

    fresh; printf 'static void planted(api_server *sv) {\n    api_route_add(sv, "GET",\n                  "/state", 0, 0, 0);\n}\n' >>"$tmp/tree/src/api/metrics.c"
    expect "a route registered twice (over two lines, other file)" route "src/api/metrics.c:"

    fresh; printf 'static void planted(api_server *sv) { api_route_add(sv, "GET", "/instance/{other}", 0, 0, 0); }\n' >>"$tmp/tree/src/api/metrics.c"
    expect "a route registered twice (another capture name)" route "src/api/metrics.c:"

    fresh; printf '#include "compute/cpu/cpu_internal.h"\n' >>"$tmp/tree/tests/unit/test_planted.c"
    expect "cpu_internal.h outside compute/cpu/ (a test)" cpu "tests/unit/test_planted.c"

    fresh; printf '#include "compute/cpu/cpu_internal.h"\n' >>"$tmp/tree/src/compute/compute.c"
    expect "cpu_internal.h outside compute/cpu/ (compute/)" cpu "src/compute/compute.c"

    if [ "$fails" -ne 0 ]; then echo "check-layout self-test: $fails failed"; return 1; fi
    echo "check-layout self-test: every rule fires"
}

if [ "${1:-}" = --self-test ]; then self_test; exit $?; fi

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
[ -d src ] || { echo "check-layout: no src/ in $root"; exit 2; }
problems=0
problem() { echo "$1"; problems=$((problems + 1)); }

# root: commands are files of src/cmd/; src/main.c only dispatches.
for f in src/*.c src/*.h; do
    [ -e "$f" ] || continue
    [ "$f" = src/main.c ] && continue
    problem "$f: [root] a source file at src/ root; only main.c lives there (commands go in src/cmd/, everything else in its module)"
done

# Every '#include "..."' of src/, as "file:line:target".
includes=$(grep -rn --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' src |
           sed -E 's/^([^:]+):([0-9]+):.*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1:\2:\3/')

# options: only cmd/ knows the command line.
while IFS=: read -r file line target; do
    [ -n "$file" ] || continue
    case "$file" in src/cmd/*) continue ;; *.h) ;; *) continue ;; esac
    case "$target" in cmd/options.h | options.h)
        problem "$file:$line: [options] a header outside src/cmd/ includes $target; take a config struct that cmd/ fills instead" ;;
    esac
done <<<"$includes"

# direction: FROM may include TO only when "FROM -> TO" (folder or exact header) is listed.
allowed() {
    local from=$1 target=$2 to=${2%%/*}
    grep -qxF "$from -> $to" <<<"$ALLOWED_DIRECTIONS" || grep -qxF "$from -> $target" <<<"$ALLOWED_DIRECTIONS"
}
while IFS=: read -r file line target; do
    [ -n "$file" ] || continue
    rel=${file#src/}
    from=${rel%%/*}
    if [ "$rel" = "$from" ]; then  # a file at src/ root: main.c, or one the root rule reports
        [ "$rel" = main.c ] || continue
        from=main
    fi
    case "$target" in */*) ;; *) continue ;; esac  # "x.h": a file beside it, same module
    to=${target%%/*}
    [ "$to" = "$from" ] && continue
    [ -d "src/$to" ] || continue  # not a module of src/ (e.g. a system header in quotes)
    allowed "$from" "$target" ||
        problem "$file:$line: [direction] $from may not include $target ($from -> $to is not an allowed direction; see ALLOWED_DIRECTIONS in scripts/check-layout.sh)"
done <<<"$includes"

# route: every '"METHOD", "/path"' pair in src/ (api_route_add calls and the ROUTE macros that
# wrap them, also split over lines) is one registration; capture names do not count.
routes=$(find src -name '*.c' -print0 | xargs -0 perl -0777 -ne '
    while (/"(GET|POST|PUT|DELETE|PATCH)"\s*,\s*"(\/[^"]*)"/g) {
        my ($method, $path) = ($1, $2);
        my $line = 1 + (substr($_, 0, $-[0]) =~ tr/\n//);
        (my $shape = $path) =~ s/\{[^}\/]*\.\.\.\}/{...}/g;
        $shape =~ s/\{[^}\/.]*\}/{}/g;
        print "$method $shape\t$ARGV:$line\t$path\n";
    }')
dups=$(cut -f1 <<<"$routes" | sort | uniq -d)
while IFS= read -r key; do
    [ -n "$key" ] || continue
    where=$(awk -F'\t' -v k="$key" '$1 == k { printf "%s%s (%s)", sep, $2, $3; sep = ", " }' <<<"$routes")
    last=$(awk -F'\t' -v k="$key" '$1 == k { w = $2 } END { print w }' <<<"$routes")
    problem "$last: [route] ${key%% *} ${key#* } is registered more than once: $where; register each route once, in api/"
done <<<"$dups"

# cpu: compute/cpu/cpu_internal.h is private to compute/cpu/ (tests and benchmarks use cpu_levels.h).
while IFS=: read -r file line _; do
    [ -n "$file" ] || continue
    case "$file" in src/compute/cpu/*) continue ;; esac
    problem "$file:$line: [cpu] includes compute/cpu/cpu_internal.h, which is private to src/compute/cpu/; use compute/cpu/cpu_levels.h or cpu.h"
done < <(for dir in src tests tools bench; do
             [ -d "$dir" ] && grep -rn --include='*.c' --include='*.h' --include='*.cu' --include='*.cc' \
                 --include='*.cpp' -E '#[[:space:]]*include[[:space:]]+"([^"]*/)?cpu_internal\.h"' "$dir"
         done)

if [ "$problems" -ne 0 ]; then
    echo "check-layout: $problems problem(s) (rules: docs/architecture.md, scripts/check-layout.sh)"
    exit 1
fi
echo "check-layout: ok (src/ root, options header, include directions, routes, cpu_internal.h)"
