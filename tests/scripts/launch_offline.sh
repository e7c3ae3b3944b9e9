#!/usr/bin/env bash
# launch_offline.sh ROOT BUILD MPIEXEC: the launchers on a machine that can install nothing.
# apt-get, sudo and pip are stubs that fail (no network), and cmake is a stub that fails (a
# rebuild that cannot find jansson's headers); every call is logged. Then:
#   1. launch/gdp-run with the existing build: no package manager is called, the failed rebuild
#      is reported, and the existing build runs and succeeds;
#   2. GDP_NO_BUILD=1: not even cmake is called;
#   3. launch/setup.sh (no --tests) with the existing build: only `cmake --build` (a stub that
#      succeeds here), no package manager.
set -uo pipefail
root=$1 build=$2 mpiexec=$3
stubs=$(mktemp -d)
trap 'rm -rf "$stubs"' EXIT
calls=$stubs/calls.log
for tool in apt-get sudo pip pip3; do
    printf '#!/bin/sh\necho "%s $*" >>"%s"\necho "%s: no network" >&2\nexit 100\n' "$tool" "$calls" "$tool" \
        >"$stubs/$tool"
done
printf '#!/bin/sh\necho "cmake $*" >>"%s"\necho "fatal error: jansson.h: No such file or directory" >&2\nexit "${CMAKE_STUB_RC:-2}"\n' \
    "$calls" >"$stubs/cmake"
chmod +x "$stubs"/*
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
args=(-n 1 --backend cpu --progress 0 --layers 1 --hidden 32 --heads 2 --groups 1 --head-dim 16 --state-dim 16
      --vocab 64 --workload synthetic:n=2,prompt=8,new=2)
export GDP_BUILD_DIR=$build MPIRUN=$mpiexec PATH=$stubs:$PATH OPENBLAS_NUM_THREADS=1

: >"$calls"
out=$("$root/launch/gdp-run" "${args[@]}" 2>&1)
rc=$?
echo "--- 1. launch/gdp-run, rebuild failing -> exit $rc"; grep -E "gdp-run|jansson|throughput" <<<"$out" | head -5
echo "calls: $(tr '\n' ';' <"$calls")"
[ "$rc" -eq 0 ] || fail "launch/gdp-run exited $rc with an existing build"
grep -q "rebuilding .* failed; running the build that is there" <<<"$out" || fail "no warning about the failed rebuild"
grep -q "jansson.h" <<<"$out" || fail "the warning does not quote the build's last lines"
grep -qE "^(apt-get|sudo|pip)" "$calls" && fail "launch/gdp-run called a package manager: $(cat "$calls")"
grep -q "^cmake --build $build" "$calls" || fail "launch/gdp-run did not try to rebuild"

: >"$calls"
out=$(GDP_NO_BUILD=1 "$root/launch/gdp-run" "${args[@]}" 2>&1)
rc=$?
echo "--- 2. GDP_NO_BUILD=1 -> exit $rc; calls: $(tr '\n' ';' <"$calls")"
[ "$rc" -eq 0 ] || fail "GDP_NO_BUILD=1 launch/gdp-run exited $rc"
[ -s "$calls" ] && fail "GDP_NO_BUILD=1 still called: $(cat "$calls")"

: >"$calls"
out=$(CMAKE_STUB_RC=0 "$root/launch/setup.sh" 2>&1)
rc=$?
echo "--- 3. launch/setup.sh with an existing build -> exit $rc; calls: $(tr '\n' ';' <"$calls")"
[ "$rc" -eq 0 ] || fail "launch/setup.sh exited $rc with an existing build: $out"
[ "$(cat "$calls")" = "cmake --build $build -j$(nproc 2>/dev/null || echo 2)" ] ||
    fail "launch/setup.sh with an existing build did more than rebuild: $(cat "$calls")"

[ "$failures" -eq 0 ] && echo "PASS: the launchers install nothing for an existing build" || exit 1
