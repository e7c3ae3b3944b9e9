#!/usr/bin/env bash
# gdp_run_failures.sh: gdp-run's output guarantees and failure paths (docs/failures.md),
# one mode per ctest entry (tests/failures.cmake):
#   output       an unwritable --output (missing directory, a directory) fails before the
#                run starts, saying "cannot write PATH: REASON"
#   write-model  --write-model through a symlink writes its target (the link stays); over a
#                regular file keeps its mode; a directory or FIFO is refused; a full
#                character device (/dev/full, or a private node of it) fails with exit != 0
#                and stays a device
#   sigterm      SIGTERM (sigint: SIGINT) to mpirun mid-run: the job ends within seconds,
#                rank 0 says what it was doing, how many requests finished and what
#                --output holds, and --output holds those complete lines
#   kill9        kill -9 of rank 1 mid-run: the job ends within seconds, exit != 0, the
#                streamed lines stay
#   stall        SIGSTOP of rank 1 mid-run with --watchdog 3: the job ends within the
#                timeout + a few seconds, naming rank 1 (its pid), the step and where rank 0 waited
#   arrival-gap  a 5 s gap between arrivals with --watchdog 2: the idle root is not a stall
# usage: gdp_run_failures.sh MODE GDP_RUN MPIEXEC
# Exit 0: pass, 1: fail, 77: skip (write-model's device part needs root).
set -uo pipefail
mode=$1 gdp_run=$2 mpiexec=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/gdp-run-failures.XXXXXX")
job=""
stopped=""
cleanup() {
    # the processes this script started, by their ids only
    [ -z "$stopped" ] || { kill -CONT "$stopped" 2>/dev/null; kill -KILL "$stopped" 2>/dev/null; }
    [ -z "$job" ] || kill -KILL "$job" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL ($mode): $*" >&2; [ ! -f "$work/log" ] || { echo "--- output:" >&2; cat "$work/log" >&2; }; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
run() { "$mpiexec" -n 2 --oversubscribe "$gdp_run" --backend cpu --progress 0 "$@"; }

# Every line of a results file is one whole JSON object of a request.
check_lines() {
    local f=$1 n=0
    while IFS= read -r line; do
        n=$((n + 1))
        case "$line" in
        '{"id":'*'"finish":'*'}') ;;
        *)
            echo "line $n of $f is not a whole result line: ${line:0:120}" >&2
            return 1
            ;;
        esac
    done <"$f"
    echo "$n"
}

# Starts a long run in the background with --output; waits until it has streamed $1 lines.
start_long_run() {
    local want=$1
    shift
    "$mpiexec" -n 2 --oversubscribe "$gdp_run" --backend cpu --progress 0 --slots 4 --budget 512 \
        --workload synthetic:n=400,rate=0,prompt=16-64,new=1-48,seed=3 --output "$work/out.jsonl" "$@" \
        >"$work/log" 2>&1 &
    job=$!
    local t0
    t0=$(now)
    while :; do
        local have=0
        [ -f "$work/out.jsonl" ] && have=$(wc -l <"$work/out.jsonl")
        [ "$have" -ge "$want" ] && break
        kill -0 "$job" 2>/dev/null || fail "the run ended before streaming $want lines"
        [ "$(awk -v e="$(elapsed "$t0")" 'BEGIN { print (e > 120) }')" = 1 ] &&
            fail "no $want streamed lines after 120 s: --output is not written as requests finish"
        sleep 0.2
    done
    echo "streamed $(wc -l <"$work/out.jsonl") lines while running"
}

# Pid of world rank $1 of the job: a child of mpirun with that OMPI_COMM_WORLD_RANK.
rank_pid() {
    local want=$1 p
    for p in $(ps -o pid= --ppid "$job"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$want"; then
            echo "$p"
            return
        fi
    done
}

# Waits up to $1 s for the job to end; sets rc; fails if it did not end.
wait_job() {
    local limit=$1 t0
    t0=$(now)
    while kill -0 "$job" 2>/dev/null; do
        [ "$(awk -v e="$(elapsed "$t0")" -v l="$limit" 'BEGIN { print (e > l) }')" = 1 ] &&
            fail "the job did not end within $limit s"
        sleep 0.1
    done
    wait "$job"
    rc=$?
    job=""
    took=$(elapsed "$t0")
    echo "job ended after $took s with exit $rc"
    [ "$rc" -ne 0 ] || fail "the job exited 0"
}

case "$mode" in
output)
    for bad in "$work/no-such-dir/out.jsonl" "$work"; do
        t0=$(now)
        run --output "$bad" >"$work/log" 2>&1 && fail "--output $bad: exit 0"
        grep -q "gdp-run: cannot write $bad: " "$work/log" || fail "--output $bad: no 'cannot write $bad: REASON'"
        grep -q "^# gdp " "$work/log" && fail "--output $bad: the run started before the path was checked"
        echo "--output $bad refused in $(elapsed "$t0") s: $(grep 'cannot write' "$work/log")"
    done
    grep -q "No such file or directory" <(run --output "$work/no-such-dir/x" 2>&1) || fail "no errno text"
    ;;
write-model)
    small=(--layers 1 --hidden 64 --vocab 64)
    echo old >"$work/target"
    chmod 640 "$work/target"
    ln -s target "$work/link"
    run --write-model "$work/link" "${small[@]}" >"$work/log" 2>&1 || fail "writing through a symlink failed"
    [ -L "$work/link" ] || fail "the symlink was replaced by a file"
    [ "$(stat -c %s "$work/target")" -gt 1000 ] || fail "the symlink's target was not written"
    [ "$(stat -c %a "$work/target")" = 640 ] || fail "the target lost its mode: $(stat -c %a "$work/target")"
    ls "$work" | grep -q tmp && fail "a temporary file was left: $(ls "$work")"
    echo "through a symlink: the link stays, the target holds $(stat -c %s "$work/target") bytes, mode 640"
    mkdir "$work/dir"
    mkfifo "$work/fifo"
    for bad in dir fifo; do
        run --write-model "$work/$bad" "${small[@]}" >"$work/log" 2>&1 && fail "--write-model to a $bad: exit 0"
        grep -q "cannot write $work/$bad: " "$work/log" || fail "--write-model to a $bad: no 'cannot write'"
    done
    [ -d "$work/dir" ] && [ -p "$work/fifo" ] || fail "a refused path was replaced"
    echo "a directory and a FIFO are refused"
    if [ "$(id -u)" -ne 0 ]; then
        echo "skip: the full-device part needs root"
        exit 77
    fi
    # A private node of /dev/full where mknod is allowed, so a regression cannot replace the
    # machine's; /dev/full itself otherwise.
    dev=$work/full
    mknod "$dev" c 1 7 2>/dev/null || dev=/dev/full
    [ -c "$dev" ] || { echo "skip: no full device"; exit 77; }
    run --write-model "$dev" "${small[@]}" >"$work/log" 2>&1 && fail "--write-model $dev exited 0"
    [ -c "$dev" ] || fail "$dev is no longer a character device"
    grep -q "No space left on device" "$work/log" || fail "--write-model $dev: no ENOSPC message"
    echo "--write-model $dev: exit != 0, ENOSPC reported, still a character device"
    ;;
sigterm | sigint)
    start_long_run 3
    sig=TERM
    [ "$mode" = sigint ] && sig=INT
    kill -"$sig" "$job"
    wait_job 15
    [ "$(awk -v t="$took" 'BEGIN { print (t <= 8) }')" = 1 ] || fail "SIG$sig took $took s to end the job"
    msg=$(grep "gdp-run: ended by SIG" "$work/log") || fail "rank 0 did not say what was interrupted"
    echo "$msg"
    lines=$(check_lines "$work/out.jsonl") || fail "--output holds a partial line"
    echo "$msg" | grep -q "while serving the workload" || fail "the message does not say what was running"
    echo "$msg" | grep -Eq ": [0-9]+ of 400 requests finished; $lines of their results are in $work/out.jsonl" ||
        fail "the message does not match the $lines lines of --output"
    [ "$lines" -ge 3 ] || fail "only $lines lines survived"
    ;;
kill9)
    start_long_run 3
    victim=$(rank_pid 1)
    [ -n "$victim" ] || fail "rank 1's pid not found"
    kill -KILL "$victim"
    wait_job 15
    [ "$(awk -v t="$took" 'BEGIN { print (t <= 8) }')" = 1 ] || fail "kill -9 of a rank took $took s to end the job"
    lines=$(check_lines "$work/out.jsonl") || fail "--output holds a partial line"
    [ "$lines" -ge 3 ] || fail "only $lines lines survived"
    echo "kill -9 of rank 1 (pid $victim): $lines streamed lines kept"
    ;;
stall)
    timeout=3
    start_long_run 3 --watchdog "$timeout"
    victim=$(rank_pid 1)
    [ -n "$victim" ] || fail "rank 1's pid not found"
    kill -STOP "$victim"
    stopped=$victim
    echo "stopped rank 1 (pid $victim)"
    wait_job 30
    limit=$((timeout + 6))
    [ "$(awk -v t="$took" -v l="$limit" 'BEGIN { print (t <= l) }')" = 1 ] ||
        fail "the stalled rank ended the job after $took s (limit timeout $timeout + 6 s)"
    grep -E "watchdog: rank 0 \(world rank 0, host [^,]+, pid [0-9]+\) of 2 waited [0-9.]+ s at step [0-9]+ in gdp_comm_[a-z_]+[^;]* for rank 1 \(world rank 1, host [^,]+, pid $victim\), which does not answer" \
        "$work/log" || fail "no watchdog message naming rank 1 (pid $victim), the step and where rank 0 waited"
    lines=$(check_lines "$work/out.jsonl") || fail "--output holds a partial line"
    grep -q "gdp-run: $lines finished requests' results are in $work/out.jsonl" "$work/log" ||
        fail "rank 0 did not say what --output holds ($lines lines)"
    ;;
arrival-gap)
    # the root sleeps 2.5 timeouts for an arrival while rank 1 waits for its frame: an idle
    # root answers the watchdog's probes, so the run finishes
    printf '{"prompt": [1, 2, 3], "max_new_tokens": 2}\n{"arrival": 5, "prompt": [4, 5], "max_new_tokens": 2}\n' \
        >"$work/gap.jsonl"
    run --workload "$work/gap.jsonl" --watchdog 2 --output "$work/out.jsonl" >"$work/log" 2>&1 ||
        fail "a 5 s arrival gap with --watchdog 2 failed the run"
    grep -q "idle waiting for arrivals [4-9]\." "$work/log" || fail "the run did not wait for the arrival"
    [ "$(check_lines "$work/out.jsonl")" = 2 ] || fail "--output lacks the 2 results"
    echo "a 5 s arrival gap under --watchdog 2: the run finished"
    ;;
*)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac
echo "ok: $mode"
