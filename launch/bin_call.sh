#!/usr/bin/env bash
# bin_call.sh: one device call over programs built here (this machine has the device's CUDA 13
# toolkit), for one tree, no A/B: a device call then spends its minutes running, not in nvcc.
#   launch/bin_call.sh pack BUNDLE PROGRAM...   here, after the build: the programs (paths under build/)
#                             into BUNDLE (.tar.xz). A call carries 64 MiB with the tree and .golden (15
#                             MB), and these programs are 5-17 MB each compressed (their fatbins do not
#                             shrink): test_chunk_gpu with gdp-bench fit one call (.pre/bins.tar.xz), the
#                             four Hopper lab benches another (.pre/lab.tar.xz)
#   launch/bin_call.sh run    on the device, carrying the bundles GDP_CALL_BINS names (space-separated,
#                             default .pre/bins.tar.xz), .deps and .golden: unpacks them into build/ and
#                             runs GDP_CALL_STAGES in order, each under its own timeout, its logs tarred
#                             into $OUT/logs.tgz as soon as it ends (a call cut at its limit still returns
#                             what ran)
# Stages (default "chunktest prefill alone sanitize decodeprof"):
#   chunktest   test_chunk_gpu under the op's own choice (auto) and the Hopper path
#   prefill     gdp-bench ops --op prefill under auto, the Hopper kernel unsplit, the staged chain
#   alone       the Hopper kernel with each role's math left out, or one block of the aux chain
#               (bench_hopper_skip1..3, 4, 8, 16: hopper.cuh's GDP_HOPPER_DEV_SKIP; those missing from the
#               bundle are skipped)
#   hphases     bench_chunk_stages --hopper-phases: clock cycles a chunk by phase, unsplit
#   hcard       ncu --set full over one Hopper kernel launch (lab row GDP_CALL_CARD_ROW, default 1): its
#               per-SASS-instruction CSV (stall samples by reason) comes back as hcard_source.csv.gz, read
#               here by launch/sass_stalls.py (each role's samples by segment and by instruction)
#   sanitize    compute-sanitizer GDP_CALL_SANITIZE (default "synccheck racecheck memcheck") over
#               test_chunk_gpu on the Hopper path, GDP_CALL_SANITIZE_TIMEOUT seconds each (default 150),
#               GDP_CALL_SANITIZE_ARGS more compute-sanitizer options (e.g. --kernel-name kns=hop); the
#               test's own GDP_TEST_CHUNK_ONLY=segments (and GDP_TEST_CHUNK_REPEAT=0: no determinism
#               reruns, so a racecheck of the segment cases fits one call) pass through
#   decode      test_recurrent_gpu, then gdp-bench ops --op decode under each GDP_DECODE_STATE of
#               GDP_CALL_DECODE_KERNELS (default auto), the list twice (ab_lib.sh, decode_stage)
#   decodeprof  the decode row kernel's ncu card by source line at B=256, fp32 and bf16 state
#               (h200-suite.sh decodeprof)
#   decodelayer the layer bench's graph-replayed decode rows (GDP_CALL_LAYER_BATCHES, default
#               1,16,64,128,256; 2 layers of the issue 11 shape) under each GDP_CALL_DECODE_KERNELS entry
#               (KERNEL[,VAR=VALUE...]) and state dtype of GDP_CALL_LAYER_STATES (default "fp32 bf16"), two
#               rounds, through GDP_CALL_MPIRUN (default "mpirun -n 1")
#   layerprof   ncu's duration of every kernel of the layer bench's decode steps (GDP_CALL_PROF_BATCHES,
#               default 64; 2 layers of the issue 11 shape), in launch order, under each GDP_CALL_DECODE_KERNELS
#               entry, caches kept (--cache-control none) as in a replayed step, clocks free
#   decodesan   compute-sanitizer GDP_CALL_DECODE_SAN_TOOLS (default "memcheck racecheck") of test_recurrent_gpu
#               on the kernels named GDP_CALL_DECODE_SAN_KERNEL (default recurrent_ring),
#               GDP_CALL_SANITIZE_TIMEOUT seconds each
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${GDP_CALL_BUILD:-$root/build} # where the programs are (pack) or go (run); tests/scripts/bin_call_check.sh

if [ "${1:-}" = pack ]; then
    [ $# -ge 3 ] || { echo "usage: launch/bin_call.sh pack BUNDLE.tar.xz PROGRAM..." >&2; exit 2; }
    bundle=$2
    shift 2
    for b in "$@"; do
        [ -e "$build/$b" ] || { echo "bin_call.sh pack: $build/$b is not built (GDP_BUILD_CHUNK_DEV=ON for the lab benches)" >&2; exit 2; }
    done
    mkdir -p "$(dirname "$bundle")"
    tar -C "$build" -cf - "$@" | xz -T2 -6 >"$bundle" || exit 1
    ls -la "$bundle"
    exit 0
fi
[ "${1:-}" = run ] || { echo "usage: launch/bin_call.sh pack|run" >&2; exit 2; }

export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export JANSSON_HOME=$root/.deps/usr
# the programs find CUDA's libraries where that machine keeps them, and libgdp.so beside them
export LD_LIBRARY_PATH=$JANSSON_HOME/lib/x86_64-linux-gnu:$build:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export GDP_GOLDEN_DIR=$root/.golden
PATH=$PATH:/usr/local/cuda/bin # compute-sanitizer, ncu, cuobjdump, nvdisasm
final=${OUT:?OUT must name the folder whose files come back}
out=${GDP_CALL_LOGS:-/tmp/bin_call_out} # the stages' logs; $final/logs.tgz after each stage (a call returns few files)
rm -rf "$out" && mkdir -p "$out"
work=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
SECONDS=0
save_logs() { echo "[$1 at ${SECONDS}s]" | tee -a "$out/times.txt"; tar -czf "$final/logs.tgz" -C "$(dirname "$out")" "$(basename "$out")"; }
mkdir -p "$build"
for bundle in ${GDP_CALL_BINS:-.pre/bins.tar.xz}; do
    tar -xJf "$bundle" -C "$build" || { echo "no bundle at $bundle" >&2; exit 1; }
done
. "$root/launch/ncu_lib.sh"
. "$root/launch/ab_lib.sh" # decode_stage, chunk_sanitize

stage_chunktest() {
    local p st
    for p in auto hopper; do
        st=0
        GDP_TEST_CHUNK_PATH=$p timeout 240 "$build/tests/test_chunk_gpu" >"$out/chunk_test_$p.log" 2>&1 || st=$?
        echo "## test_chunk_gpu, GDP_TEST_CHUNK_PATH=$p: exit $st"
        grep -E "FAIL" "$out/chunk_test_$p.log" | head -20
        grep -E "^  auto: |Hopper kernel ran|checks" "$out/chunk_test_$p.log" | tail -14
    done
}
stage_prefill() {
    local run
    for run in "" "GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=off" "GDP_CHUNK_PATH=staged"; do
        echo "## ${run:-auto}"
        env $run timeout 120 "$build/examples/gdp-bench" ops --op prefill 2>&1 | grep -E "^prefill|ran the|rror"
    done | tee "$out/prefill.log"
}
stage_alone() {
    local bin
    for bin in bench_chunk_stages bench_hopper_skip{1,2,3,4,8,16}; do
        [ -x "$build/examples/$bin" ] || continue # a bundle may leave some out (the carry's 64 MiB)
        echo "## $bin (whole / skip1: aux math out / skip2: state math out / skip3: both out / skip4: level 64 out /" \
            "skip8: level 32 out / skip16: A's exponents out)"
        GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=off timeout 100 "$build/examples/$bin" 2>&1
    done >"$out/hopper_alone.log" 2>&1
    grep -vE "^#" "$out/hopper_alone.log" | head -60
}
stage_hphases() { # the Hopper kernel's clock cycles a chunk by phase (one aux and one state thread), unsplit
    GDP_CHUNK_SEGMENT=off timeout 100 "$build/examples/bench_chunk_stages" --hopper-phases 2>&1 | tee "$out/hopper_phases.log"
}
stage_hcard() { # ncu --set full over one launch of the Hopper kernel on lab row GDP_CALL_CARD_ROW (default 1: 8x2048
    # M2), unsplit: the per-SASS-instruction CSV (stall samples by reason) comes back for launch/sass_stalls.py
    local row=${GDP_CALL_CARD_ROW:-1}
    GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=off timeout 300 ncu --clock-control none --set full --import-source yes \
        --kernel-name regex:chunk_hopper_kernel --launch-skip 3 --launch-count 1 -o "$work/hcard" -f \
        "$build/examples/bench_chunk_stages" --row "$row" >"$out/hcard_ncu.log" 2>&1
    tail -3 "$out/hcard_ncu.log"
    ncu -i "$work/hcard.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$out/hcard_source.csv.gz"
    ncu -i "$work/hcard.ncu-rep" --page details >"$out/hcard_details.txt" 2>&1
    grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc" "$out/hcard_details.txt" | head -8
}
stage_sanitize() {
    local tool
    for tool in ${GDP_CALL_SANITIZE:-synccheck racecheck memcheck}; do # (ab_lib.sh's chunk_sanitize)
        chunk_sanitize "$tool" hopper "$build/tests/test_chunk_gpu" "$out/sanitize_$tool.log" \
            "${GDP_CALL_SANITIZE_TIMEOUT:-150}" ${GDP_CALL_SANITIZE_ARGS:-}
    done
}
stage_decode() { decode_stage "$build/tests/test_recurrent_gpu" "$build/examples/gdp-bench" "$out"; } # (ab_lib.sh)
stage_decodelayer() {
    local r kernel sdt
    for r in 1 2; do
        for kernel in ${GDP_CALL_DECODE_KERNELS:-auto}; do
            for sdt in ${GDP_CALL_LAYER_STATES:-fp32 bf16}; do
                echo "## round $r, $(decode_entry_name "$kernel"), -S $sdt"
                with_decode_entry "$kernel" timeout 100 ${GDP_CALL_MPIRUN-mpirun -n 1} "$build/examples/gdp-bench" layer \
                    -b cuda -d 2048 -l 2 -H 16 -g 4 -p 128 -n 128 -m 2 -S "$sdt" \
                    -D "${GDP_CALL_LAYER_BATCHES:-1,16,64,128,256}" -P 64 2>&1 | grep -E "^ +decode|rror"
            done
        done
    done | tee "$out/decode_layer.log"
}
stage_layerprof() {
    local kernel name
    for kernel in ${GDP_CALL_DECODE_KERNELS:-auto}; do
        name=$(decode_entry_name "$kernel")
        echo "## $name, decode rows ${GDP_CALL_PROF_BATCHES:-64}"
        with_decode_entry "$kernel" timeout 200 ncu --clock-control none --cache-control none \
            --metrics gpu__time_duration.sum --csv "$build/examples/gdp-bench" layer -b cuda -d 2048 -l 2 -H 16 -g 4 \
            -p 128 -n 128 -m 2 -D "${GDP_CALL_PROF_BATCHES:-64}" -P 64 -w 1 -i 1 -c 0 \
            >"$out/layerprof_${name//[^A-Za-z0-9]/_}.csv" 2>"$out/layerprof_${name//[^A-Za-z0-9]/_}.err"
        echo "ncu rc=$?"
        python3 launch/ncu_durations.py --order "$out/layerprof_${name//[^A-Za-z0-9]/_}.csv"
    done | tee "$out/layerprof.log"
}
stage_decodesan() {
    local tool st
    for tool in ${GDP_CALL_DECODE_SAN_TOOLS:-memcheck racecheck}; do
        st=0
        timeout "${GDP_CALL_SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool "$tool" \
            --kernel-name "kns=${GDP_CALL_DECODE_SAN_KERNEL:-recurrent_ring}" --error-exitcode 86 \
            "$build/tests/test_recurrent_gpu" >"$out/decode_san_$tool.log" 2>&1 || st=$?
        echo "## compute-sanitizer --tool $tool test_recurrent_gpu (kns=${GDP_CALL_DECODE_SAN_KERNEL:-recurrent_ring}):" \
            "exit $st (0 clean, 86 reports, 124 cut)"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|checks," "$out/decode_san_$tool.log" | tail -3
    done
}
stage_decodeprof() {
    local sdt
    ncu_sass recurrent_rows_kernel recurrent "$build/examples/gdp-bench"
    for sdt in 0 1; do
        echo "## row kernel, state dtype $sdt (0 fp32, 1 bf16), B=256, H 16, K = V = 128, M 2"
        ncu_card "decodeprof_$sdt" "recurrent_rows_kernel<\\(int\\)$sdt, \\(int\\)16" 2 \
            "recurrent_rows_kernelILi${sdt}ELi16ELi32ELi2ELi1EE" recurrent "$build/examples/gdp-bench" ops --op decode-key \
            -i 10 -w 1
    done >"$out/decodeprof.log" 2>&1
    head -80 "$out/decodeprof.log"
}
for st in ${GDP_CALL_STAGES:-chunktest prefill alone sanitize decodeprof}; do
    "stage_$st"
    save_logs "$st"
done
rm -rf "$work"
