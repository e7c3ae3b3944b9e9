#!/usr/bin/env bash
# h200-suite.sh: the GPU verification run in one command, for a lent GPU machine that has
# no network: configure and build (jansson from the ignored .deps/ when the system lacks
# its dev files), run every ctest labelled gpu (gpu;mpi included), the Python torch tests,
# the ops benchmark and the main program. Logs go to $OUT (or ./h200-out) when set.
# Golden vectors: $GDP_GOLDEN_DIR, else ./.golden (an ignored copy of ../shared/golden).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/h200-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
[ -d "$root/.golden" ] && export GDP_GOLDEN_DIR=${GDP_GOLDEN_DIR:-$root/.golden}
extra=()
if [ ! -e /usr/include/jansson.h ]; then
    export JANSSON_HOME="$root/.deps/usr" # launch/setup.sh then installs nothing
    extra+=(-DJANSSON_HOME="$JANSSON_HOME")
fi
stage=${1:-all}

if ! { cmake -B build -DCMAKE_BUILD_TYPE=Release "${extra[@]}" >"$out/configure.log" 2>&1 &&
       cmake --build build -j"$(nproc)" >"$out/build.log" 2>&1; }; then
    tail -40 "$out/configure.log" "$out/build.log"
    exit 1
fi
nvidia-smi -L
rc=0
if [ "$stage" = all ] || [ "$stage" = tests ]; then
    (cd build && ctest -L gpu --output-on-failure -j4 --timeout 300) 2>&1 | tee "$out/ctest_gpu.log" | tail -40 || rc=1
    GDP_LIBRARY="$root/build/libgdp.so" python3 -m pytest -q -rs python/tests/test_torch_gpu.py 2>&1 |
        tee "$out/pytest_gpu.log" | tail -15 || rc=1
fi
if [ "$stage" = all ] || [ "$stage" = bench ]; then
    ./build/examples/gdp-bench ops 2>&1 | tee "$out/bench_ops.log" || rc=1
    # A whole layer step on one GPU (rank 0 of NCCL), at the performance.md head shape.
    mpirun -n 1 ./build/examples/gdp-bench layer -b cuda -d 2048 -l 2 -H 16 -g 4 -p 128 -n 128 -m 2 \
        -D 1,64,256 -P 2048,16384 2>&1 | tee "$out/bench_layer.log" || rc=1
fi
if [ "$stage" = all ] || [ "$stage" = run ]; then
    ./launch/gdp-run 2>&1 | tee "$out/gdp_run.log" | tail -40 || rc=1
fi
exit $rc
