#!/usr/bin/env bash
# h200-suite.sh: the GPU verification run in one command, for a lent GPU machine that has
# no network: configure and build (jansson from the ignored .deps/ when the system lacks
# its dev files), run every ctest labelled gpu (gpu;mpi included), the Python torch tests,
# the ops benchmark and the main program. Logs go to $OUT (or ./h200-out) when set.
# Golden vectors: $GDP_GOLDEN_DIR, else ./.golden (an ignored copy of ../shared/golden).
# Usage: launch/h200-suite.sh [all|tests|bench|run|serve|hostprof|loop|alone|experiments|profile|sanitize|chunk|chunkprof|stagesprof|hopper|hopperab|hopperalone|hopperprof|decode|decodeprof|prefront]
# (default all; the others are not part of all: serve times gdp-run at the serving shape,
# loop and alone repeat the gpu tests GDP_LOOP_RUNS times under ctest -j4 and one at a time,
# experiments times each measured switch every way, profile lists the layer step's kernels
# with their ncu durations, hostprof runs the decode-heavy serving workload under Nsight
# Systems (CUDA API and kernel summaries), sanitize runs every gpu test under
# compute-sanitizer, which takes far longer; chunk is the chunk op's short loop: its test under
# every kernel path, the prefill rows under each, the fused kernel's phase cycles and the
# staged stages' times; chunkprof its ncu stall card; stagesprof the staged path's WY, state
# sweep and output kernels by source line; hopper the one-pass Hopper kernel's short loop (check, test,
# rows, phases, the rows through the Python package), hopperab the same kernel against other trees (GDP_AB_SRC, colon-separated, e.g.
# `git archive main` unpacked: all built, each tree's hopper test path, the prefill rows alternated
# between them with the split off and on auto, this tree's staged rows and phases, then the rows as
# one table a setting by launch/ab_table.py), hopperalone the
# kernel with each role's math left out in turn (bench_hopper_skip1..3: what sets a chunk's period)
# and hopperprof its ncu card by
# source line);
# decode likewise for the decode op: its test, then its ops rows under
# each decode kernel, then the memory ceiling of the row kernel's scheme; decodeprof the row kernel's
# ncu card at B=256, fp32 and bf16 state, by source line through launch/ncu_lines.py).
#   GDP_BUILD_DIR            build folder (default build)
#   GDP_AB_SRC, GDP_AB_PATCHES  hopperab: the other trees (dirs), or patches that make them from this one
#                            (each colon-separated; both may be given)
#   GDP_AB_SEGMENTS          hopperab: the GDP_CHUNK_SEGMENT values its rows run under (default "off auto")
#   GDP_AB_ROUNDS            hopperab: rounds of the rows over all trees (default 2)
#   GDP_SANITIZE_TOOLS       sanitizer tools, in order (default "memcheck racecheck")
#   GDP_SANITIZE_TESTS       ctest -R regex of the gpu tests to sanitize (default: all of them)
#   GDP_SANITIZE_TIMEOUT     seconds per sanitized test run (default 1800)
#   GDP_SANITIZE_API_ERRORS  compute-sanitizer --report-api-errors (default no: NCCL's init
#                            probes kernels of other architectures, and its cudaFuncGetAttributes
#                            returns cudaErrorNoKernelImageForDevice, which NCCL handles but the
#                            sanitizer counts as an error; gdp checks every CUDA return itself,
#                            and a test fails on any of them)
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
build=${GDP_BUILD_DIR:-build}

targets=()
[ "$stage" = chunk ] && targets=(--target test_chunk_gpu gdp-bench bench_chunk_stages wgmma_check) # what the short loop runs
[ "$stage" = chunkprof ] && targets=(--target gdp-bench)
[ "$stage" = hopper ] && targets=(--target wgmma_check test_chunk_gpu gdp-bench bench_chunk_stages gdp)
[ "$stage" = hopperab ] && targets=(--target test_chunk_gpu gdp-bench bench_chunk_stages)
[ "$stage" = hopperalone ] &&
    targets=(--target bench_chunk_stages bench_hopper_skip1 bench_hopper_skip2 bench_hopper_skip3)
ab_builds=() ab_pids=()
if [ "$stage" = hopperab ]; then # the other trees (GDP_AB_SRC, colon-separated), built beside this one's below
    IFS=: read -r -a ab_srcs <<<"${GDP_AB_SRC:-}"
    # GDP_AB_PATCHES (colon-separated patch files): each a tree of its own, this one's sources with the
    # patch applied (git apply --directory from here: run inside the nested tree, git apply would take
    # the paths as this repository's and skip them, quietly)
    IFS=: read -r -a ab_patches <<<"${GDP_AB_PATCHES:-}"
    for pf in "${ab_patches[@]}"; do
        [ -f "$pf" ] || { echo "hopperab: no patch $pf" >&2; exit 2; }
        src="$build-src-$(basename "$pf" .patch)"
        rm -rf "$src" && mkdir -p "$src" &&
            tar -C "$root" --exclude='./build*' --exclude='./.*' --exclude='./h200-out' -c . | tar -x -C "$src" &&
            git apply --unsafe-paths --directory="$src" "$pf" ||
            { echo "hopperab: $pf does not apply to this tree" >&2; exit 2; }
        ab_srcs+=("$src")
    done
    [ ${#ab_srcs[@]} -gt 0 ] ||
        { echo "hopperab: GDP_AB_SRC (trees) or GDP_AB_PATCHES (patches) must name something to compare" >&2; exit 2; }
    for k in "${!ab_srcs[@]}"; do
        src=${ab_srcs[$k]} ab="$build-ab$((k + 1))"
        [ -f "$src/CMakeLists.txt" ] || { echo "hopperab: $src is not a gdp tree" >&2; exit 2; }
        echo "hopperab: $ab is built from $src" | tee -a "$out/hopper_ab_trees.log"
        { cmake -S "$src" -B "$ab" -DCMAKE_BUILD_TYPE=Release -DGDP_BUILD_CHUNK_DEV=ON "${extra[@]}" &&
            cmake --build "$ab" -j"$(($(nproc) / (${#ab_srcs[@]} + 1) + 1))" --target gdp-bench test_chunk_gpu; } \
            >"$out/build_ab$((k + 1)).log" 2>&1 &
        ab_pids+=($!) ab_builds+=("$ab")
    done
fi
[ "$stage" = stagesprof ] && targets=(--target gdp-bench gdp) # gdp: libgdp.so, whose cubin ncu_sass disassembles
[ "$stage" = decodeprof ] && targets=(--target gdp-bench gdp)
[ "$stage" = hopperprof ] && targets=(--target gdp-bench gdp)
[ "$stage" = decode ] && targets=(--target test_recurrent_gpu gdp-bench bench_decode_ceiling)
[ "$stage" = prefront ] && targets=(--target test_conv1d_gpu gdp-bench)
if ! { cmake -B "$build" -DCMAKE_BUILD_TYPE=Release -DGDP_BUILD_CHUNK_DEV=ON -DGDP_BUILD_DECODE_DEV=ON "${extra[@]}" >"$out/configure.log" 2>&1 &&
       cmake --build "$build" -j"$(nproc)" "${targets[@]}" >"$out/build.log" 2>&1; }; then
    tail -40 "$out/configure.log" "$out/build.log"
    exit 1
fi
nvidia-smi -L
rc=0
if [ "$stage" = all ] || [ "$stage" = tests ]; then
    (cd "$build" && ctest -L gpu --output-on-failure -j4 --timeout 300) 2>&1 | tee "$out/ctest_gpu.log" | tail -40 || rc=1
    GDP_LIBRARY="$root/$build/libgdp.so" python3 -m pytest -q -rs python/tests/test_torch_gpu.py 2>&1 |
        tee "$out/pytest_gpu.log" | tail -15 || rc=1
fi
if [ "$stage" = all ] || [ "$stage" = bench ]; then
    "./$build/examples/gdp-bench" ops 2>&1 | tee "$out/bench_ops.log" || rc=1
    # A whole layer step on one GPU (rank 0 of NCCL), at the performance.md head shape.
    mpirun -n 1 "./$build/examples/gdp-bench" layer -b cuda -d 2048 -l 2 -H 16 -g 4 -p 128 -n 128 -m 2 \
        -D 1,64,256 -P 2048,16384 2>&1 | tee "$out/bench_layer.log" || rc=1
fi
if [ "$stage" = all ] || [ "$stage" = run ]; then
    ./launch/gdp-run 2>&1 | tee "$out/gdp_run.log" | tail -40 || rc=1
fi
if [ "$stage" = loop ]; then
    # every gpu test, GDP_LOOP_RUNS times in a row under ctest -j4 (issue 12: a flaky test shows a bug)
    runs=${GDP_LOOP_RUNS:-20} pass=0
    for i in $(seq 1 "$runs"); do
        if (cd "$build" && ctest -L gpu -j4 --timeout 300 >"$out/loop_$i.log" 2>&1); then
            pass=$((pass + 1))
        else
            grep -E "\*\*\*Failed|Timeout" "$out/loop_$i.log" | sed "s/^/run $i: /"
            rc=1
        fi
    done
    echo "gpu tests under ctest -L gpu -j4: $pass of $runs runs passed"
fi
if [ "$stage" = alone ]; then
    # every gpu test GDP_LOOP_RUNS times in a row, one at a time with nothing else on the GPU
    # (issue 12's "alone" bar; GDP_LOOP_TESTS: a ctest -R regex to run a subset)
    runs=${GDP_LOOP_RUNS:-20}
    (cd "$build" && ctest -L gpu -R "${GDP_LOOP_TESTS:-.}" -j1 --timeout 300 --repeat until-fail:"$runs") \
        >"$out/alone.log" 2>&1 || rc=1
    grep -E "tests passed|Failed|Timeout|Total Test" "$out/alone.log" | tail -8
    echo "gpu tests alone: $(grep -c ' Passed' "$out/alone.log") passed runs ($runs per test)"
fi
if [ "$stage" = experiments ]; then
    # A/B of the switches under measurement:
    # GDP_DECODE_STATE (regs | smem | head: where the decode kernel keeps its state tile, and
    # whether a block spans 32 value columns or the whole head; each forces one kernel, the
    # default picks by batch and dtype), GDP_CHUNK_STATE_VB (64 | 32 | 16: value columns per
    # block of the chunk op's state sweep; unset, the launcher picks by SM fill),
    # GDP_CHUNK_WY_INVERSE (tf32 | fp32: the chunk op's WY inverse on tensor or CUDA cores),
    # GDP_CHUNK_STATE_COPY (producer | tma | warps: who issues the state sweep's copies; an
    # unknown value is refused),
    # GDP_DECODE_END (fused | split: the decode op and the gated norm in one launch or two;
    # unset, auto fuses up to 16 requests) on the layer bench's decode and prefill rows.
    # A switch a build does not know changes nothing, so the lines of its set then agree.
    for v in regs smem head rows; do
        echo "## GDP_DECODE_STATE=$v"
        GDP_DECODE_STATE=$v "./$build/examples/gdp-bench" ops --op decode 2>&1 | grep -E "^decode|Out of"
    done 2>&1 | tee "$out/exp_decode.log"
    for v in 64 32 16; do
        echo "## GDP_CHUNK_STATE_VB=$v"
        GDP_CHUNK_STATE_VB=$v "./$build/examples/gdp-bench" ops --op prefill 2>&1 | grep -E "^chunk|^prefill|Out of"
    done 2>&1 | tee "$out/exp_chunk.log"
    for v in tf32 fp32; do
        echo "## GDP_CHUNK_WY_INVERSE=$v"
        GDP_CHUNK_WY_INVERSE=$v "./$build/examples/gdp-bench" ops --op prefill 2>&1 | grep -E "^chunk|^prefill|^#|Out of"
    done 2>&1 | tee -a "$out/exp_chunk.log"
    for round in 1 2; do # GDP_CHUNK_STATE_COPY: who issues the state sweep's copies (alternated twice)
        for v in producer tma warps; do
            echo "## GDP_CHUNK_STATE_COPY=$v (round $round)"
            GDP_CHUNK_STATE_COPY=$v "./$build/examples/gdp-bench" ops --op prefill 2>&1 | grep -E "^prefill|^#|Out of"
        done
    done 2>&1 | tee -a "$out/exp_chunk.log"
    for v in fused split; do
        echo "## GDP_DECODE_END=$v"
        GDP_DECODE_END=$v mpirun -n 1 "./$build/examples/gdp-bench" layer -b cuda -d 2048 -l 2 -H 16 -g 4 -p 128 \
            -n 128 -m 2 -D 1,8,16,32,64,128,256 -P 2048 2>&1 | grep -E "^ +decode|^ +prefill"
    done 2>&1 | tee "$out/exp_decode_end.log"
fi
if [ "$stage" = chunk ]; then
    # the chunk op's short loop (issue 13): its GPU test under every kernel path, then the prefill
    # rows of the ops table under each path (staged, fused, hopper; auto is whichever the op picks); first
    # the one-pass kernel's wgmma helpers against a double product (kernels/dev/wgmma_check.cu)
    "./$build/examples/wgmma_check" 2>&1 | tee "$out/wgmma_check.log" || rc=1
    (cd "$build" && ctest -R '^test_chunk_gpu$' --output-on-failure --timeout 300) 2>&1 | tee "$out/chunk_test.log" |
        grep -E "== GDP|FAIL|fail|Passed|tests passed|Error|error" | head -60 || rc=1
    for v in staged fused hopper; do
        echo "## GDP_CHUNK_PATH=$v"
        GDP_CHUNK_PATH=$v "./$build/examples/gdp-bench" ops --op prefill 2>&1 | grep -E "^prefill|Out of"
    done 2>&1 | tee "$out/chunk_bench.log"
    # where the one-pass kernels' time goes: cycles per chunk of each phase of both roles (block 0),
    # and the staged chain's per-stage times for comparison
    { "./$build/examples/bench_chunk_stages" --hopper-phases; "./$build/examples/bench_chunk_stages" --fused-phases
      "./$build/examples/bench_chunk_stages"; } 2>&1 | tee "$out/chunk_phases.log"
fi
if [ "$stage" = prefront ]; then
    # the prefill front (gdp_prefill_conv_prepare, branch next-session-prefill-front): its test
    # (one pass against the two ops, bitwise), memcheck of it, then the layer bench's prefill rows
    # with GDP_PREFILL_FRONT=chain and auto alternated
    "./$build/tests/test_conv1d_gpu" >"$out/prefront_test.log" 2>&1 || rc=1
    grep -E "FAIL|prefill conv|of 6|checks" "$out/prefront_test.log" | head -20
    command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
    compute-sanitizer --tool memcheck --error-exitcode 86 "./$build/tests/test_conv1d_gpu" >"$out/prefront_memcheck.log" 2>&1 || rc=1
    tail -1 "$out/prefront_memcheck.log"
    for v in chain auto chain auto; do
        echo "## GDP_PREFILL_FRONT=$v"
        GDP_PREFILL_FRONT=$v mpirun -n 1 "./$build/examples/gdp-bench" layer -b cuda -d 2048 -l 2 -H 16 -g 4 -p 128 \
            -n 128 -m 2 -D 1 -P 2048,16384 2>&1 | grep -E "^ +prefill|rror"
    done 2>&1 | tee "$out/prefront_layer.log"
fi
if [ "$stage" = decode ]; then
    # the decode op's short loop (issue 14): its GPU test (every kernel), then the decode rows of
    # the ops table under the default, smem and rows
    (cd "$build" && ctest -R '^test_recurrent_gpu$' --output-on-failure --timeout 300) 2>&1 |
        tee "$out/decode_test.log" | grep -E "FAIL|fail|Passed|tests passed|Error|error" | head -60 || rc=1
    for v in auto smem rows; do
        echo "## GDP_DECODE_STATE=$v"
        GDP_DECODE_STATE=$v "./$build/examples/gdp-bench" ops --op decode 2>&1 | grep -E "^decode|Out of"
    done 2>&1 | tee "$out/decode_bench.log"
    # the memory ceiling of the row kernel's access scheme (kernels/dev/decode_ceiling.cu)
    "./$build/examples/bench_decode_ceiling" 2>&1 | tee "$out/decode_ceiling.log" || rc=1
fi
if [ "$stage" = profile ]; then
    # ncu's duration of every kernel of the layer bench (one warm-up and one timed step per shape,
    # eager then graph-replayed; graph nodes are profiled one by one): profile_layer.csv in launch
    # order, and per kernel name the count and median in us over every shape of the run (set
    # GDP_PROFILE_DECODE / GDP_PROFILE_PREFILL to one shape each for a per-shape table).
    command -v ncu >/dev/null || PATH=$PATH:/usr/local/cuda/bin
    ncu --clock-control none --metrics gpu__time_duration.sum --csv "./$build/examples/gdp-bench" layer -b cuda \
        -d 2048 -l 2 -H 16 -g 4 -p 128 -n 128 -m 2 -D "${GDP_PROFILE_DECODE:-1,64,256}" \
        -P "${GDP_PROFILE_PREFILL:-2048}" -w 1 -i 1 -c 0 >"$out/profile_layer.csv" 2>"$out/profile_layer.err" || rc=1
    python3 "$root/launch/ncu_durations.py" "$out/profile_layer.csv"
fi
if [ "$stage" = chunkprof ]; then
    # the fused chunk kernel's stall card (kernels/NOTES-chunk.md, "Where f4's instructions go"):
    # one launch on the first prefill row under ncu, warp states (dependency, barrier and
    # no-instruction stalls), instruction mix and scheduler issue rate
    command -v ncu >/dev/null || PATH=$PATH:/usr/local/cuda/bin
    GDP_CHUNK_PATH=fused ncu --clock-control none --section WarpStateStats --section InstructionStats \
        --section SchedulerStats --section LaunchStats --kernel-name regex:chunk_fused --launch-count 1 \
        "./$build/examples/gdp-bench" ops --op prefill -i 2 -w 1 2>&1 | grep -v "^==PROF==" |
        tee "$out/chunkprof.log" | grep -vE "^prefill|^#" || rc=1
fi
. "$root/launch/ncu_lib.sh" # ncu_sass, ncu_card: a kernel launch's source-line card
. "$root/launch/ab_lib.sh" # ab_hopper_test(s), ab_rows, ab_staged_rows
if [ "$stage" = hopper ]; then
    # the one-pass Hopper chunk kernel's loop (kernels/NOTES-chunk.md): the wgmma helpers, its test path
    # (both copy modes, V = 64 and 128, the exact segment split), the prefill rows under hopper with
    # each copy mode (the split on auto) and unsplit (GDP_CHUNK_SEGMENT=off), and under staged, then its
    # phase cycles per chunk under each copy mode
    "./$build/examples/wgmma_check" 2>&1 | tee "$out/wgmma_check.log" | tail -6 || rc=1
    ab_hopper_test "./$build/tests/test_chunk_gpu" "$out/chunk_test_hopper.log" || rc=1
    for run in "threads auto" "tma auto" "tma off"; do
        set -- $run
        echo "## GDP_CHUNK_PATH=hopper GDP_CHUNK_HOPPER_COPY=$1 GDP_CHUNK_SEGMENT=$2"
        GDP_CHUNK_PATH=hopper GDP_CHUNK_HOPPER_COPY=$1 GDP_CHUNK_SEGMENT=$2 "./$build/examples/gdp-bench" ops --op prefill 2>&1 |
            grep -E "^prefill|rror"
    done 2>&1 | tee "$out/hopper_bench.log"
    echo "## GDP_CHUNK_PATH=staged" | tee -a "$out/hopper_bench.log"
    GDP_CHUNK_PATH=staged "./$build/examples/gdp-bench" ops --op prefill 2>&1 | grep -E "^prefill|rror" |
        tee -a "$out/hopper_bench.log"
    for v in threads tma; do
        echo "## --hopper-phases, GDP_CHUNK_HOPPER_COPY=$v"
        GDP_CHUNK_HOPPER_COPY=$v "./$build/examples/bench_chunk_stages" --hopper-phases
    done 2>&1 | tee "$out/hopper_phases.log"
    # the same rows through the Python package, the op's own choice with and without max_seqlen
    GDP_LIBRARY="$root/$build/libgdp.so" PYTHONPATH="$root/python" python3 python/tests/bench_prefill_gpu.py 2>&1 |
        tee "$out/hopper_py_bench.log" || rc=1
fi
if [ "$stage" = hopperab ]; then
    for k in "${!ab_pids[@]}"; do
        wait "${ab_pids[$k]}" || { tail -30 "$out/build_ab$((k + 1)).log"; exit 1; }
    done
    pairs=() tests=()
    for tree in "${ab_builds[@]}" "$build"; do
        pairs+=("$tree=./$tree/examples/gdp-bench") tests+=("$tree=./$tree/tests/test_chunk_gpu")
    done
    ab_hopper_tests "$out" "${tests[@]}" || rc=1 # every tree's Hopper kernel against the CPU reference
    ab_rows "$out/hopper_ab.log" "${pairs[@]}"
    ab_staged_rows "$out/hopper_ab.log" "$build" "./$build/examples/gdp-bench"
    GDP_CHUNK_SEGMENT=off "./$build/examples/bench_chunk_stages" --hopper-phases 2>&1 | tee "$out/hopper_phases.log"
    # the rows as one table a setting: medians over the rounds, each tree's ratio to this one's
    python3 "$root/launch/ab_table.py" "$out/hopper_ab.log" | tee "$out/hopper_ab_table.md"
fi
if [ "$stage" = hopperalone ]; then
    # the Hopper kernel unsplit, whole and with the aux warpgroup's math, the state side's or both left
    # out (loads and barriers kept; GDP_HOPPER_DEV_SKIP, hopper.cuh): the time of each role's chain
    # with the loads, and of the loads and barriers alone ('total' column, median us)
    for bin in bench_chunk_stages bench_hopper_skip1 bench_hopper_skip2 bench_hopper_skip3; do
        echo "## $bin (whole / skip1: aux math out / skip2: state math out / skip3: both out)"
        GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=off "./$build/examples/$bin" 2>&1 || rc=1
    done 2>&1 | tee "$out/hopper_alone.log"
fi
if [ "$stage" = hopperprof ]; then
    # the one-pass Hopper chunk kernel (GDP_CHUNK_PATH=hopper, kernels/chunk/hopper.cuh) by source line
    # on the first prefill row (8x2048 M2): which role's waits and which phases hold a chunk
    command -v ncu >/dev/null || PATH=$PATH:/usr/local/cuda/bin
    work=$(mktemp -d)
    ncu_sass chunk_hopper_kernel hopper
    echo "## chunk_hopper_kernel (8x2048 M2, launch 0)" >"$out/hopperprof.log"
    GDP_CHUNK_PATH=hopper NCU_TOP=40 ncu_card hopperprof chunk_hopper_kernel 0 chunk_hopper_kernelI13__nv_bfloat16 hopper \
        "./$build/examples/gdp-bench" ops --op prefill -i 10 -w 1 >>"$out/hopperprof.log" 2>&1 || rc=1
    cat "$out/hopperprof.log"
    rm -rf "$work"
fi
if [ "$stage" = stagesprof ]; then
    # the staged chunk path's kernels by source line (kernels/NOTES-chunk.md): WY and the outputs
    # on the first prefill row (8x2048 M2); the state sweep on the 1x16384 row, the 47th chunk call
    # of `ops --op prefill -i 10 -w 1` (each row makes 23: the first call, 1 warm-up, 10 timed,
    # the check, 10 profiled for the stages)
    command -v ncu >/dev/null || PATH=$PATH:/usr/local/cuda/bin
    work=$(mktemp -d)
    ncu_sass chunk_wy_kernel chunk
    for spec in "stagesprof_wy chunk_wy_kernel 0 chunk_wy_kernelI13__nv_bfloat16Li128ELb1E" \
                "stagesprof_out chunk_out_kernel 0 chunk_out_kernelI13__nv_bfloat16Li128" \
                "stagesprof_state chunk_state_kernel 46 chunk_state_kernelI13__nv_bfloat16Li128ELi4ELi16ELb1E"; do
        set -- $spec
        echo "## $2 (launch $3 of its kind)"
        ncu_card "$1" "$2" "$3" "$4" chunk "./$build/examples/gdp-bench" ops --op prefill -i 10 -w 1 || rc=1
    done >"$out/stagesprof.log" 2>&1
    cat "$out/stagesprof.log"
    rm -rf "$work"
fi
if [ "$stage" = decodeprof ]; then
    # the decode row kernel's stall card by source line (kernels/NOTES-ops.md, eleventh session):
    # one launch of the B=256 row (fp32 state, then bf16)
    command -v ncu >/dev/null || PATH=$PATH:/usr/local/cuda/bin
    work=$(mktemp -d)
    ncu_sass recurrent_rows_kernel recurrent
    for sdt in 0 1; do
        echo "## row kernel, state dtype $sdt (0 fp32, 1 bf16), B=256, H 16, K = V = 128, M 2"
        ncu_card "decodeprof_$sdt" "recurrent_rows_kernel<\\(int\\)$sdt, \\(int\\)16" 2 \
            "recurrent_rows_kernelILi${sdt}ELi16ELi32ELi2ELi1EE" recurrent "./$build/examples/gdp-bench" ops --op decode-key \
            -i 10 -w 1 || rc=1
    done >"$out/decodeprof.log" 2>&1
    cat "$out/decodeprof.log"
    rm -rf "$work"
fi
if [ "$stage" = hostprof ]; then
    # Where the decode-heavy serving step's wall time goes beyond the device's (the report's
    # "host" share, 18.8 % with the pipeline in the third session): the decode-heavy workload
    # (fewer new tokens) under Nsight Systems, CUDA API and kernel summaries, when nsys exists.
    command -v nsys >/dev/null || PATH=$PATH:/usr/local/cuda/bin
    if command -v nsys >/dev/null; then
        ckpt=${TMPDIR:-/tmp}/gdp_serve_model.safetensors
        ./$build/examples/gdp-run --layers 8 --hidden 2048 --heads 16 --groups 4 --head-dim 128 --state-dim 128 \
            --householder 2 --vocab 32000 --write-model "$ckpt" >/dev/null || rc=1
        nsys profile -t cuda,osrt -o "$out/hostprof" --force-overwrite true --stats=true \
            ./$build/examples/gdp-run --model "$ckpt" --progress 0 --slots 128 --budget 1152 --prefill-chunk 1024 \
            --workload synthetic:n=128,rate=0,prompt=64-128,new=128,seed=3 >"$out/hostprof.log" 2>&1 || rc=1
        grep -E "time per output|by phase|^  [a-zGh]" "$out/hostprof.log"
        grep -A25 -E "cuda_api_sum|CUDA API Statistics" "$out/hostprof.log" | head -40
        grep -A15 -E "cuda_gpu_kern_sum|CUDA Kernel Statistics" "$out/hostprof.log" | head -25
        rm -f "$out"/hostprof.nsys-rep "$out"/hostprof.sqlite # large; the log holds the summaries
    else
        echo "hostprof: no nsys on this machine"
    fi
fi
if [ "$stage" = serve ]; then
    # gdp-run at the serving shape of docs/performance.md (8 layers, D 2048, H 16, G 4, P = N = 128,
    # M 2, vocab 32000; one rank, CUDA + NCCL, graphs on): the decode-heavy and the mixed workload
    # (the preemption policy and the old one: swap at once), each also with a bf16 ssm state, a
    # 2-rank MPI run on the one GPU, and the layer-step benchmark with its graph-replayed column.
    model=(--layers 8 --hidden 2048 --heads 16 --groups 4 --head-dim 128 --state-dim 128 --householder 2
           --vocab 32000)
    ckpt=${TMPDIR:-/tmp}/gdp_serve_model.safetensors
    run1() { mpirun -n "${NP:-1}" ./$build/examples/gdp-run --model "$ckpt" --progress 0 "$@"; }
    ./$build/examples/gdp-run "${model[@]}" --write-model "$ckpt" >/dev/null || rc=1
    decode=(--slots 128 --budget 1152 --prefill-chunk 1024 --workload synthetic:n=128,rate=0,prompt=64-128,new=512,seed=3)
    mixed=(--slots 64 --budget 2048 --prefill-chunk 1024 --workload synthetic:n=256,rate=0,prompt=128-2048,new=128,seed=7)
    # the figures without --check (its kept logits make every step wait for the last one);
    # the self check on its own run (it reports MISMATCH past ~60 decode steps: docs/gdp-run.md)
    { echo "## decode-heavy"; run1 "${decode[@]}"; } 2>&1 | tee "$out/serve_decode.log" || rc=1
    { echo "## decode-heavy, --check 2 (self check; not timed)"; run1 "${decode[@]}" --check 2; } 2>&1 |
        tee "$out/serve_check.log"
    { echo "## decode-heavy, no overlap (the step loop waits for each step)"; run1 "${decode[@]}" --no-overlap; } 2>&1 |
        tee "$out/serve_decode_nooverlap.log" || rc=1
    { echo "## decode-heavy, bf16 ssm state (docs/gdp-run.md, \"The state dtype\")"; run1 "${decode[@]}" --ssm-state bf16; } \
        2>&1 | tee "$out/serve_decode_bf16.log" || rc=1
    { echo "## mixed, bf16 ssm state"; run1 "${mixed[@]}" --ssm-state bf16; } 2>&1 | tee "$out/serve_mixed_bf16.log" || rc=1
    { echo "## mixed, preemption policy (default)"; run1 "${mixed[@]}"; } 2>&1 | tee "$out/serve_mixed.log" || rc=1
    { echo "## mixed, admission in arrival order (--schedule fcfs; the default is shortest first)";
      run1 "${mixed[@]}" --schedule fcfs; } 2>&1 | tee "$out/serve_mixed_fcfs.log" || rc=1
    { echo "## mixed, old policy (swap at once)"; run1 "${mixed[@]}" --preempt-wait-ms 0; } 2>&1 |
        tee "$out/serve_mixed_old.log" || rc=1
    # swaps in device memory (the default since the twenty-seventh session) wait for nothing: a
    # waiter's turn after 200 or 100 ms instead of 2 s (tests/scripts/schedule_sim.py predicts TTFT
    # p50 0.86x and 0.94x for a 1.13-1.15x wall; 0.86x for 1.08x with victims that ran 32 steps), and
    # 200 ms through pinned host memory (4.9x wall)
    for w in 200 100; do
        { echo "## mixed, waiting $w ms, swaps in device memory"; run1 "${mixed[@]}" --preempt-wait-ms $w; } 2>&1 |
            tee "$out/serve_mixed_wait$w.log" || rc=1
    done
    { echo "## mixed, waiting 200 ms, victims that ran 32 steps, swaps in device memory";
      run1 "${mixed[@]}" --preempt-wait-ms 200 --preempt-after 32; } 2>&1 | tee "$out/serve_mixed_wait200_after32.log" || rc=1
    { echo "## mixed, waiting 200 ms, swaps in host memory"; run1 "${mixed[@]}" --preempt-wait-ms 200 \
        --swap-memory host; } 2>&1 | tee "$out/serve_mixed_wait200_host.log" || rc=1
    { echo "## mixed, no preemption"; run1 "${mixed[@]}" --no-preempt; } 2>&1 | tee "$out/serve_mixed_none.log" || rc=1
    mpirun -n 1 ./$build/examples/gdp-bench layer -b cuda -d 2048 -l 2 -H 16 -g 4 -p 128 -n 128 -m 2 \
        -D 1,64,256 -P 2048,16384 2>&1 | tee "$out/bench_layer.log" || rc=1
    { echo "## decode-heavy, 2 ranks on one GPU (MPI comm), 32 requests"; NP=2 run1 --slots 32 --budget 1056 \
        --prefill-chunk 1024 --workload synthetic:n=32,rate=0,prompt=64-128,new=128,seed=3; } 2>&1 |
        tee "$out/serve_decode_np2.log" || rc=1
    grep -h -E "^## |throughput|time per output|time to first|wall time|preemptions|by phase|^  [a-zGh]|floor|check:" \
        "$out"/serve_*.log
fi
if [ "$stage" = sanitize ]; then
    # compute-sanitizer over every ctest labelled gpu, one tool at a time: a one-process test
    # runs as `compute-sanitizer --tool T test args`, an mpirun test as `mpirun -n N ...
    # compute-sanitizer --tool T test args` (each rank under its own sanitizer). The commands,
    # environments and skip codes come from ctest itself (--show-only=json-v1), so a new gpu
    # test is covered without editing this list. Exit codes: 0 clean, 77 skipped (no GPU),
    # 86 the sanitizer found errors, anything else the test itself failed. One log for all
    # (sanitize.log; $OUT returns few files), a table at the end.
    tools=${GDP_SANITIZE_TOOLS:-memcheck racecheck}
    filter=${GDP_SANITIZE_TESTS:-.}
    limit=${GDP_SANITIZE_TIMEOUT:-1800}
    api_errors=${GDP_SANITIZE_API_ERRORS:-no}
    command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
    log="$out/sanitize.log"
    : >"$log"
    (cd "$build" && ctest -L gpu -R "$filter" --show-only=json-v1) >"$out/gpu_tests.json" || rc=1
    # one line per test: name <TAB> dir <TAB> env <TAB> launcher... <TAB> program args... (shell-quoted)
    lines=$(python3 - "$out/gpu_tests.json" <<'PY'
import json, os, shlex, sys
for t in json.load(open(sys.argv[1]))["tests"]:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    cmd = t["command"]
    # the program is the first executable file after the launcher's own options (mpiexec
    # -n N --oversubscribe ...), or the command itself for a one-process test
    at = 0
    if os.path.basename(cmd[0]) in ("mpiexec", "mpirun"):
        at = next(i for i in range(1, len(cmd)) if os.path.isfile(cmd[i]) and os.access(cmd[i], os.X_OK))
    print("\t".join([t["name"], props.get("WORKING_DIRECTORY", "."),
                     shlex.join(props.get("ENVIRONMENT", [])), shlex.join(cmd[:at]), shlex.join(cmd[at:])]))
PY
)
    table=()
    for tool in $tools; do
        while IFS=$'\t' read -r name dir envs launcher program; do
            [ -n "$name" ] || continue
            echo "==== $tool $name" >>"$log"
            start=$SECONDS
            (cd "$dir" && eval "env $envs timeout $limit $launcher compute-sanitizer --tool $tool \
                --report-api-errors $api_errors --error-exitcode 86 --print-limit 20 $program") </dev/null >>"$log" 2>&1
            code=$?
            case $code in
            0) verdict=clean ;; 77) verdict=skipped ;; 86) verdict="ERRORS"; rc=1 ;;
            124) verdict="TIMEOUT"; rc=1 ;; *) verdict="FAILED ($code)"; rc=1 ;;
            esac
            echo "==== $tool $name: $verdict in $((SECONDS - start)) s" >>"$log"
            table+=("$(printf '%-10s %-30s %-12s %5ss' "$tool" "$name" "$verdict" "$((SECONDS - start))")")
        done <<<"$lines"
    done
    printf '%-10s %-30s %-12s %6s\n' tool test verdict time
    printf '%s\n' "${table[@]}"
fi
exit $rc
