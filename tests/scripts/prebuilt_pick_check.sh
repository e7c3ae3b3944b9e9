#!/usr/bin/env bash
# prebuilt_pick_check.sh ROOT: launch/prebuilt_pick.py, which of a patch's rebuilt objects
# launch/prebuilt.sh pack keeps, on a made-up tree: an object whose sources read as main's is dropped
# (a recompile), one whose sources read as an earlier patch's is inherited from the tree that holds it
# (also through a tree that itself inherited it), one whose sources differ from all is kept; a patch's
# Pack-keep-only list (DIR/.keep_NAME) limits both to its sources' objects.
set -uo pipefail
root=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
src=$dir/src out=$dir/pack
mkdir -p "$src/build/o" "$out/p1/o" "$out/p2" "$out/p3"
# three objects and their depfiles (make syntax, absolute paths, continuation lines)
printf 'o/a.o : %s/a.cu \\\n    %s/common.cuh /usr/include/x.h\n' "$src" "$src" >"$src/build/o/a.o.d"
printf 'o/b.o: %s/b.cu %s/common.cuh\n' "$src" "$src" >"$src/build/o/b.o.d"
printf 'o/c.o: %s/c.c\n' "$src" >"$src/build/o/c.o.d"
hashes() { printf 'a.cu %s\nb.cu %s\ncommon.cuh %s\nc.c %s\n' "$@"; }
hashes A0 B0 H0 C0 >"$out/.hashes_main"
hashes A1 B0 H0 C0 >"$out/.hashes_p1" # p1 changes a.cu
hashes A1 B0 H0 C1 >"$out/.hashes_p2" # p2 = p1 + c.c
hashes A1 B0 H0 C2 >"$out/.hashes_p3" # p3 = p1 + another c.c
touch "$out/p1/o/a.o"                 # p1 kept a.o
printf 'p1\np2\n' >"$out/.trees"
echo "o/a.o p1" >"$out/p2/inherit"    # p2 inherited a.o from p1
fail=0
check() { # check NAME EXPECTED_KEPT EXPECTED_INHERIT OBJ...
    local name=$1 want=$2 want_inh=$3
    shift 3
    local got
    got=$(python3 "$root/launch/prebuilt_pick.py" "$out" "$name" "$src" build "$@" | tr '\n' ' ')
    [ "$got" = "$want" ] || { echo "FAIL: $name kept '$got', expected '$want'"; fail=1; }
    local inh
    inh=$(cat "$out/$name/inherit" 2>/dev/null | tr '\n' ';')
    [ "$inh" = "$want_inh" ] || { echo "FAIL: $name inherit '$inh', expected '$want_inh'"; fail=1; }
}
# p3: a.o's sources are p1's (held by p1; p2 only inherited it), b.o is main's (a recompile), c.o is new
check p3 "o/c.o " "o/a.o p1;" o/a.o o/b.o o/c.o
# the same sources as main everywhere: nothing kept or inherited
hashes A0 B0 H0 C0 >"$out/.hashes_p4" && mkdir -p "$out/p4"
check p4 "" "" o/a.o o/b.o o/c.o
# a change to a shared header: both of its objects kept
hashes A0 B0 H9 C0 >"$out/.hashes_p5" && mkdir -p "$out/p5"
check p5 "o/a.o o/b.o " "" o/a.o o/b.o
# the same header change with the patch's Pack-keep-only list naming b.cu: only b.o kept (a.o is main's)
hashes A0 B0 H9 C0 >"$out/.hashes_p6" && mkdir -p "$out/p6" && echo "b.cu" >"$out/.keep_p6"
check p6 "o/b.o " "" o/a.o o/b.o
# a list that names none of them: nothing kept, nothing inherited (p3's a.o and c.o under a list of b.cu)
cp "$out/.hashes_p3" "$out/.hashes_p7" && mkdir -p "$out/p7" && echo "b.cu" >"$out/.keep_p7"
check p7 "" "" o/a.o o/b.o o/c.o
[ "$fail" -eq 0 ] && echo "PASS: prebuilt_pick.py" || exit 1
