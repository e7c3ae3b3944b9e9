#!/usr/bin/env bash
# decode_h200.sh: the decode op's GPU run in one command (issue 14): configure and build the
# decode targets in build-dec, run the decode GPU tests (the default kernel, then every
# GDP_DECODE_STATE named in $KERNELS, e.g. "regs smem head"), compute-sanitizer memcheck and
# racecheck on them, the bf16-cache drift test, gdp-bench ops decode rows (default), a sweep of
# switches (GDP_DECODE_STATE, GDP_DECODE_PREFETCH, ...) over the four target rows ($SWEEP:
# "name:ENV=VAL,ENV=VAL ..."), and the Python package beside
# the C call. Logs go to $OUT (or ./dec-out). Stages: $STAGES (default "build tests san drift
# bench sweep py").
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$root/dec-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -d "$root/.golden" ] && export GDP_GOLDEN_DIR=${GDP_GOLDEN_DIR:-$root/.golden}
[ -d "$root/.deps/usr" ] && export JANSSON_HOME=${JANSSON_HOME:-$root/.deps/usr}
stages=${STAGES:-build tests san drift bench sweep py}
has() { [[ " $stages " == *" $1 "* ]]; }
B=build-dec
summary=()
note() { summary+=("$1"); echo "== $1"; }

if has build; then
    t0=$(date +%s)
    if ! { cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release ${JANSSON_HOME:+-DJANSSON_HOME=$JANSSON_HOME} \
               >"$out/configure.log" 2>&1 &&
           cmake --build $B -j"$(nproc)" --target gdp test_recurrent_gpu test_decode_drift_gpu gdp-bench \
               >"$out/build.log" 2>&1; }; then
        tail -30 "$out/configure.log" "$out/build.log"
        exit 1
    fi
    note "build ok in $(( $(date +%s) - t0 )) s"
fi
nvidia-smi -L
if has tests; then
    $B/tests/test_recurrent_gpu >"$out/test_decode.log" 2>&1
    note "test_recurrent_gpu (default kernel): rc=$? $(tail -1 "$out/test_decode.log")"
    for t in ${KERNELS:-}; do
        GDP_DECODE_STATE=$t $B/tests/test_recurrent_gpu >"$out/test_decode_$t.log" 2>&1
        note "test_recurrent_gpu (GDP_DECODE_STATE=$t): rc=$? $(tail -1 "$out/test_decode_$t.log")"
    done
fi
if has san; then
    for tool in memcheck racecheck; do
        timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_recurrent_gpu \
            >"$out/san_$tool.log" 2>&1
        note "compute-sanitizer $tool test_recurrent_gpu: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/san_$tool.log" | tail -1)"
    done
fi
if has drift; then
    $B/tests/test_decode_drift_gpu >"$out/drift.log" 2>&1
    note "test_decode_drift_gpu: rc=$?"
    grep -E "^#|^  " "$out/drift.log"
fi
if has bench; then
    $B/examples/gdp-bench ops --op decode >"$out/bench_decode.log" 2>&1
    note "gdp-bench ops --op decode: rc=$?"
fi
if has sweep; then
    for item in ${SWEEP:-}; do
        name=${item%%:*}
        envs=${item#*:}
        env ${envs//,/ } $B/examples/gdp-bench ops --op decode-key >"$out/sweep_$name.log" 2>&1
        echo "-- $name ($envs) rc=$?" >>"$out/sweep.txt"
        grep "^decode" "$out/sweep_$name.log" | cut -c10-91,103-111,130-136,154- | sed "s/^/$name /" >>"$out/sweep.txt"
    done
fi
if has py; then
    GDP_LIBRARY=$root/$B/libgdp.so PYTHONPATH=$root/python PYTHONUNBUFFERED=1 \
        python3 python/tests/bench_decode_gpu.py >"$out/py_bench.log" 2>&1
    note "python bench: rc=$?"
fi
echo "================ summary"
for s in "${summary[@]}"; do echo "$s"; done
[ -f "$out/sweep.txt" ] && cat "$out/sweep.txt"
[ -f "$out/bench_decode.log" ] && grep -E "^decode|^# Out" "$out/bench_decode.log"
[ -f "$out/py_bench.log" ] && cat "$out/py_bench.log"
exit 0
