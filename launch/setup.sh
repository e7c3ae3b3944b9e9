#!/usr/bin/env bash
# setup.sh: makes sure gdp is built in ${GDP_BUILD_DIR:-build}, installing only what is missing
# for a build that is not there yet. Called by the README's commands (launch/gdp-run, and
# launch/run-tests with --tests); safe to rerun.
#
#   launch/setup.sh           no configured build yet: installs the system packages it lacks
#                             (apt-get: cmake, Open MPI, OpenBLAS, jansson, pkg-config) and
#                             configures. Then builds (incrementally: nothing when up to date).
#                             A configured build never triggers package installation, so an
#                             existing build needs no network.
#   launch/setup.sh --tests   also the Python modules ctest's test_python uses
#                             (python/requirements-test.txt: numpy, pytest, ml_dtypes, setuptools,
#                             wheel), installed with pip where missing; where pip may not install
#                             into the system Python (PEP 668), into a venv in the build directory,
#                             which the tests then use (-DGDP_PYTHON3).
# Environment: GDP_BUILD_DIR, GDP_CMAKE_ARGS (extra configure arguments).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${GDP_BUILD_DIR:-$root/build}
tests=0
case "${1:-}" in
--tests) tests=1 ;;
"") ;;
*) echo "setup: unknown argument '$1' (use --tests or nothing)" >&2; exit 2 ;;
esac

apt_updated=0
apt_install() {
    echo "setup: installing $* (apt-get)" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    if [ "$apt_updated" -eq 0 ]; then
        $sudo apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

configured=0
[ -f "$build/CMakeCache.txt" ] && configured=1

# 1. System packages: only for a build that is not there (an existing one found them already).
if [ "$configured" -eq 0 ]; then
    need=()
    command -v cmake >/dev/null || need+=(cmake)
    command -v mpicc >/dev/null || need+=(libopenmpi-dev openmpi-bin)
    command -v pkg-config >/dev/null || need+=(pkg-config)
    command -v xz >/dev/null || need+=(xz-utils) # launch/bin_call.sh and prebuilt.sh bundles (their cpu checks)
    [ -e /usr/include/jansson.h ] || [ -n "${JANSSON_HOME:-}" ] || need+=(libjansson-dev)
    # OpenBLAS itself, not any cblas.h: an image may carry only netlib's reference BLAS, whose GEMMs
    # run the CPU backend about 18x slower (CMakeLists.txt)
    [ -n "${OPENBLAS_HOME:-}" ] || compgen -G "/usr/lib/*/libopenblas.so" >/dev/null ||
        compgen -G "/usr/lib/libopenblas.so" >/dev/null || compgen -G "/usr/lib64/libopenblas.so" >/dev/null ||
        need+=(libopenblas-dev)
    [ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"
fi

# 2. The Python test modules (--tests only; gdp-run needs no Python).
python_args=()
if [ "$tests" -eq 1 ]; then
    requirements=$root/python/requirements-test.txt
    # Prints the modules of requirements-test.txt that `$1` cannot import (or that are too old).
    py_missing() {
        "$1" - <<'PY' 2>/dev/null || echo "python"
import importlib
missing = []
for name in ("numpy", "pytest", "ml_dtypes", "setuptools", "wheel"):
    try:
        mod = importlib.import_module(name)
    except Exception:
        missing.append(name)
        continue
    if name == "setuptools" and int(mod.__version__.split(".")[0]) < 61:
        missing.append("setuptools>=61")
print(" ".join(missing))
PY
    }
    python=$(command -v python3 || true)
    if [ -z "$python" ]; then
        apt_install python3 python3-pip python3-venv
        python=$(command -v python3)
    fi
    venv=$build/python-venv
    [ ! -x "$venv/bin/python" ] || python=$venv/bin/python # made by an earlier run (PEP 668 system)
    missing=$(py_missing "$python")
    if [ -n "$missing" ]; then
        echo "setup: installing the Python test modules $missing for $python (pip)" >&2
        "$python" -m pip --version >/dev/null 2>&1 || "$python" -m ensurepip --upgrade >/dev/null 2>&1 ||
            apt_install python3-pip
        log=$(mktemp)
        if ! "$python" -m pip install --quiet -r "$requirements" 2>"$log"; then
            if grep -q "externally-managed-environment" "$log"; then
                # A system Python that pip may not change: a venv that still sees its packages.
                echo "setup: $python is managed by the system; using a venv in $venv" >&2
                mkdir -p "$build"
                "$python" -m venv --system-site-packages "$venv" 2>/dev/null || {
                    apt_install python3-venv
                    "$python" -m venv --system-site-packages "$venv"
                }
                python=$venv/bin/python
                "$python" -m pip install --quiet -r "$requirements" 2>"$log" || cat "$log" >&2
            else
                cat "$log" >&2
            fi
        fi
        rm -f "$log"
        missing=$(py_missing "$python")
        [ -z "$missing" ] || echo "setup: warning: $python still lacks $missing (no network?); ctest test_python" \
            "will fail until they are installed (python3 -m pip install -r python/requirements-test.txt)" >&2
    fi
    python_args=(-DGDP_PYTHON3="$python")
fi

# 3. Configure (a new build, or the tests' Python changed) and build.
# The CUDA toolkit (nvcc, cuBLASLt, NCCL) lives in /usr/local/cuda when installed.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
jobs=$(nproc 2>/dev/null || echo 2)
if [ "$configured" -eq 0 ]; then
    # shellcheck disable=SC2086 # GDP_CMAKE_ARGS holds several arguments
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "${python_args[@]}" ${GDP_CMAKE_ARGS:-} >&2
elif [ ${#python_args[@]} -gt 0 ] && ! grep -qxF "GDP_PYTHON3:FILEPATH=${python_args[0]#-DGDP_PYTHON3=}" \
    "$build/CMakeCache.txt"; then
    cmake "${python_args[@]}" "$build" >&2
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
