# ab_lib.sh: the hopperab measurement and the pending patches' test (pending_is_record; also sourced by
# launch/ab_call.sh and tests/scripts/pending_patches_apply.sh), sourced by launch/h200-suite.sh (trees built on the device) and
# launch/prebuilt.sh ab (trees linked there from a pack built elsewhere). Functions only.

# ab_hopper_test TEST_BIN LOG: test_chunk_gpu on the Hopper path into LOG, then its summary: the failures
# first (at most 30), the kernel's call count and the summary line, which a cut of every matching line
# could lose now that the copies and segment cases print dozens. Returns the test's exit status.
ab_hopper_test() {
    local status=0
    GDP_TEST_CHUNK_PATH=hopper "$1" >"$2" 2>&1 || status=$?
    grep -E "FAIL" "$2" | head -30
    grep -E "Hopper kernel ran" "$2" | tail -2
    grep -E "checks" "$2" | tail -1
    return $status
}

# ab_hopper_tests OUT LABEL=TEST_BIN ...: ab_hopper_test of each tree, its log OUT/chunk_test_hopper_LABEL.log
# (LABEL's last path part) after a "## LABEL" header, "FAILED (exit N)" under a failing one. Returns 1 if
# any failed.
ab_hopper_tests() {
    local out=$1 pair st rc=0
    shift
    for pair in "$@"; do
        echo "## ${pair%%=*}: GDP_TEST_CHUNK_PATH=hopper test_chunk_gpu"
        st=0
        ab_hopper_test "${pair#*=}" "$out/chunk_test_hopper_$(basename "${pair%%=*}").log" || st=$?
        [ $st -eq 0 ] || { rc=1; echo "FAILED (exit $st)"; }
    done
    return $rc
}

# ab_rows LOG LABEL=BENCH ...: gdp-bench's prefill rows under GDP_CHUNK_PATH=hopper, for each
# GDP_AB_SEGMENTS value (default "off auto") and GDP_AB_ROUNDS round (default 2), the trees alternated in
# the order given, into LOG (launch/ab_table.py reads it: a label without "-ab" is the base).
ab_rows() {
    local log=$1 seg round pair
    shift
    for seg in ${GDP_AB_SEGMENTS:-off auto}; do
        for round in $(seq 1 "${GDP_AB_ROUNDS:-2}"); do
            for pair in "$@"; do
                echo "## ${pair%%=*}: GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=$seg, round $round"
                GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=$seg "${pair#*=}" ops --op prefill 2>&1 | grep -E "^prefill|rror"
            done
        done
    done 2>&1 | tee "$log"
}

# ab_staged_rows LOG LABEL BENCH: the staged chain on the same rows, appended to LOG: the reference each
# Hopper row is weighed against (and the K = 64 row's, which auto's K = 64 constants need)
ab_staged_rows() {
    echo "## $2: GDP_CHUNK_PATH=staged" | tee -a "$1"
    GDP_CHUNK_PATH=staged "$3" ops --op prefill 2>&1 | grep -E "^prefill|rror" | tee -a "$1"
}

# pending_is_record PATCH: whether a kernels/chunk/pending patch is a record of a measured failure (a
# "Record:" line in its header, before the diff) rather than a candidate that must apply to this tree
# (tests/scripts/pending_patches_apply.sh checks the candidates; launch/ab_call.sh builds them)
pending_is_record() {
    sed -n '1,/^diff --git/p' "$1" | grep -q '^Record:'
}

# with_decode_entry ENTRY COMMAND...: COMMAND under GDP_DECODE_STATE=KERNEL and the variables of a decode
# kernel entry KERNEL[,VAR=VALUE...] (GDP_CALL_DECODE_KERNELS); decode_entry_name ENTRY: the entry as the logs
# head it ("GDP_DECODE_STATE=ring GDP_DECODE_RING_KSPLIT=2").
with_decode_entry() {
    local -a vars
    IFS=, read -r -a vars <<<"$1"
    shift
    env GDP_DECODE_STATE="${vars[0]}" "${vars[@]:1}" "$@"
}
decode_entry_name() {
    local -a vars
    IFS=, read -r -a vars <<<"$1"
    echo "GDP_DECODE_STATE=${vars[0]}${vars[1]:+ ${vars[*]:1}}"
}

# decode_stage TEST_BIN BENCH_BIN LOG_DIR: test_recurrent_gpu, then gdp-bench ops --op decode under each
# GDP_DECODE_STATE of GDP_CALL_DECODE_KERNELS (default "auto"; an entry KERNEL,VAR=VALUE,... also sets those
# variables, e.g. ring,GDP_DECODE_RING_KSPLIT=2), the list run twice in turn so that every kernel meets the
# card in two states; logs recurrent_test.log and decode.log in LOG_DIR (launch/ab_call.sh and
# launch/bin_call.sh, stage decode).
decode_stage() {
    local test_bin=$1 bench_bin=$2 logs=$3 st=0 kernel
    timeout 200 "$test_bin" >"$logs/recurrent_test.log" 2>&1 || st=$?
    echo "## test_recurrent_gpu: exit $st"
    grep -E "FAIL|checks|GDP_DECODE_STATE=" "$logs/recurrent_test.log" | head -30
    for kernel in ${GDP_CALL_DECODE_KERNELS:-auto} ${GDP_CALL_DECODE_KERNELS:-auto}; do
        echo "## $(decode_entry_name "$kernel")"
        with_decode_entry "$kernel" timeout 60 "$bench_bin" ops --op decode 2>&1 | grep -E "^decode|rror"
    done | tee "$logs/decode.log"
}

# chunk_sanitize TOOL PATH TEST_BIN LOG SECONDS [OPTION...]: compute-sanitizer --tool TOOL (with the
# OPTIONs) over TEST_BIN (test_chunk_gpu) with GDP_TEST_CHUNK_PATH=PATH into LOG, cut after SECONDS; then
# its exit status (0 clean, 86 reports, 124 cut) and its summary lines (launch/bin_call.sh stage sanitize,
# launch/ab_call.sh stage fusedrace).
chunk_sanitize() {
    local tool=$1 path=$2 test_bin=$3 log=$4 seconds=$5 st=0
    shift 5
    GDP_TEST_CHUNK_PATH=$path timeout "$seconds" compute-sanitizer --tool "$tool" "$@" --error-exitcode 86 \
        "$test_bin" >"$log" 2>&1 || st=$?
    echo "## compute-sanitizer --tool $tool ${*:+$* }$(basename "$test_bin") ($path): exit $st (0 clean, 86 reports," \
        "124 cut); $(grep -c "Race reported" "$log") race reports"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|checks," "$log" | tail -3
}
