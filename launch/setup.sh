#!/usr/bin/env bash
# setup.sh: installs what gdp needs (Open MPI, OpenBLAS, jansson, pkg-config, cmake via
# apt-get where missing), then configures and builds gdp into ${GDP_BUILD_DIR:-build}.
# Called by the README's two commands (launch/gdp-run and launch/run-tests); safe to
# rerun: it installs nothing that is there and rebuilds only what changed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${GDP_BUILD_DIR:-$root/build}

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v mpicc >/dev/null || need+=(libopenmpi-dev openmpi-bin)
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -e /usr/include/jansson.h ] || [ -n "${JANSSON_HOME:-}" ] || need+=(libjansson-dev)
compgen -G "/usr/include/cblas.h" >/dev/null || compgen -G "/usr/include/*/cblas.h" >/dev/null ||
    compgen -G "/usr/include/*/*/cblas.h" >/dev/null || need+=(libopenblas-dev)
if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing ${need[*]}" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Python package tests (ctest test_python, python/tests): numpy and pytest from PyPI when
# missing. Not fatal (e.g. no network): test_python then fails and says what is missing.
if command -v python3 >/dev/null && ! python3 -c "import numpy, pytest" >/dev/null 2>&1; then
    echo "setup: installing numpy and pytest for the Python tests" >&2
    python3 -m pip install --quiet numpy pytest ||
        echo "setup: warning: could not install numpy and pytest; ctest test_python will fail" >&2
fi
# The CUDA toolkit (nvcc, cuBLASLt, NCCL) lives in /usr/local/cuda when installed.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
jobs=$(nproc 2>/dev/null || echo 2)
if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release ${GDP_CMAKE_ARGS:-} >&2
fi
cmake --build "$build" -j"$jobs" >&2

# The fuzz stage's compiler (GDP_SETUP_FUZZ=1, set by launch/run-tests): a clang that links
# libFuzzer and knows _Float16 (clang >= 15), installed from Debian (clang-16) where none is
# there; its name goes to $build/fuzz-cc for run-tests. Not fatal: without one the fuzz stage
# says so and fails.
if [ "${GDP_SETUP_FUZZ:-0}" = 1 ]; then
    fuzz_probe() {
        local dir
        dir=$(mktemp -d)
        printf '#include <stddef.h>\n#include <stdint.h>\n_Float16 h;\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { h = (_Float16)n; return d == 0; }\n' >"$dir/probe.c"
        "$1" -fsanitize=fuzzer,address,undefined "$dir/probe.c" -o "$dir/probe" >/dev/null 2>&1
        local ok=$?
        rm -rf "$dir"
        return $ok
    }
    fuzz_find() {
        local cc
        for cc in ${GDP_FUZZ_CC:-} clang-16 clang-17 clang-18 clang-19 clang-15 clang; do
            if command -v "$cc" >/dev/null && fuzz_probe "$cc"; then
                echo "$cc"
                return 0
            fi
        done
        return 1
    }
    fuzz_cc=$(fuzz_find || true)
    if [ -z "$fuzz_cc" ]; then
        echo "setup: installing clang-16 and libFuzzer (apt-get) for the fuzz stage" >&2
        fuzz_sudo=""
        [ "$(id -u)" -eq 0 ] || fuzz_sudo="sudo"
        $fuzz_sudo apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive $fuzz_sudo apt-get install -y -qq --no-install-recommends clang-16 \
                libclang-rt-16-dev llvm-16 >/dev/null ||
            echo "setup: warning: could not install clang-16 for the fuzz stage" >&2
        fuzz_cc=$(fuzz_find || true)
    fi
    echo "$fuzz_cc" >"$build/fuzz-cc"
fi
