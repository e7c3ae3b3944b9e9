#!/usr/bin/env bash
# gdp_run_options.sh MPIEXEC GDP_RUN POISON_CKPT DIR: gdp-run's option parsing and load-time
# checks, one CPU rank each (docs/gdp-run.md, docs/limits.md):
#   --check 0 runs without a check (it used to say "unknown argument '0'"), --check -1 is refused;
#   a model with a NaN weight is refused naming the tensor, and runs with --no-finite-check;
#   a JSONL prompt_len of 2^31 - 1 and an arrival of 1e9 s fail at once naming the limit and the
#   option; --max-arrival raises the horizon, --no-arrivals ignores it; --max-prompt-len and
#   --max-new-tokens lower the limits; a synthetic rate of 1e-9/s fails naming the horizon;
#   --schedule fcfs|shortest and --schedule-age-ms run, a bad value of either is refused;
#   --ssm-state bf16 runs and the report names the state dtype, a bad value is refused;
#   --swap-memory host|device runs (on the CPU both are host memory; the report says so), a bad
#   value is refused.
set -uo pipefail
mpiexec=$1 run=$2 poison=$3 dir=$4/gdp_run_options_$$
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
small="--backend cpu --progress 0 --layers 1 --hidden 32 --heads 2 --groups 1 --head-dim 16 --state-dim 16 --vocab 64"
# gdp RUN_ARGS...: runs one rank, prints the output, sets $rc and $out
gdp() {
    out=$(timeout 120 "$mpiexec" -n 1 "$run" "$@" 2>&1)
    rc=$?
    echo "--- gdp-run $* -> exit $rc"
    grep -A1 -E "^(gdp-run|check:|wrote|# gdp)" <<<"$out" | head -n 4
}
expect() { # expect RC REGEX WHAT
    [ "$rc" -eq "$1" ] || fail "$3: exit $rc, expected $1"
    grep -Eq -- "$2" <<<"$out" || fail "$3: the output lacks /$2/"
}

gdp $small --workload synthetic:n=2,prompt=8,new=2 --check 0
expect 0 "generated|throughput|requests" "--check 0"
grep -q "unknown argument" <<<"$out" && fail "--check 0 still gives 'unknown argument'"
grep -q "^check:" <<<"$out" && fail "--check 0 still ran the check"
gdp $small --check -1
expect 2 "--check -1: expected a request count in \[0, 1048576\]" "--check -1"
gdp $small --workload synthetic:n=2,prompt=8,new=2 --check 1
expect 0 "^check: .* 1 requests: .*OK" "--check 1"

gdp $small --workload synthetic:n=3,prompt=8-40,new=2 --schedule fcfs --check 0
expect 0 "generated|throughput|requests" "--schedule fcfs"
gdp $small --workload synthetic:n=3,prompt=8-40,new=2 --schedule shortest --schedule-age-ms 0 --check 0
expect 0 "generated|throughput|requests" "--schedule shortest --schedule-age-ms 0"
gdp $small --schedule lifo
expect 2 "--schedule lifo: expected fcfs or shortest" "--schedule lifo"
gdp $small --schedule-age-ms -1
expect 2 "--schedule-age-ms -1: expected an integer" "--schedule-age-ms -1"
gdp $small --workload synthetic:n=3,prompt=8-40,new=2 --ssm-state bf16 --check 0
expect 0 "engine   : .*, bf16 ssm state" "--ssm-state bf16"
gdp $small --ssm-state fp16
expect 2 "--ssm-state fp16: expected fp32 or bf16" "--ssm-state fp16"
for where in host device; do
    gdp $small --workload synthetic:n=3,prompt=8-40,new=2 --swap-memory $where --check 0
    expect 0 "preempt  : .*swapped to host memory" "--swap-memory $where"
done
gdp $small --swap-memory disk
expect 2 "--swap-memory disk: expected host or device" "--swap-memory disk"

model=$dir/model.safetensors bad=$dir/poisoned.safetensors
gdp $small --write-model "$model"
expect 0 "wrote" "--write-model"
"$poison" "$model" "$bad" layers.0.in_proj.z 70 nan || fail "poison_ckpt failed"
gdp --model "$bad" --backend cpu --progress 0 --workload synthetic:n=2,prompt=8,new=2
expect 1 "layers.0.in_proj.z' holds a non-finite weight: nan at index \[2, 6\].*--no-finite-check" "a NaN weight"
gdp --model "$bad" --backend cpu --progress 0 --workload synthetic:n=2,prompt=8,new=2 --no-finite-check
expect 0 "throughput|requests" "--no-finite-check"

printf '{"prompt_len": 2147483647, "max_new_tokens": 1}\n' >"$dir/long.jsonl"
gdp $small --workload "$dir/long.jsonl"
expect 1 "long.jsonl:1: the prompt length 2147483647 exceeds the limit of 1048576 tokens.*--max-prompt-len" "prompt_len 2^31-1"
printf '{"prompt": [1, 2], "max_new_tokens": 2, "arrival": 1e9}\n' >"$dir/late.jsonl"
gdp $small --workload "$dir/late.jsonl"
expect 1 "late.jsonl:1: \"arrival\" = 1e\+09 s is past the arrival horizon of 86400 s.*--max-arrival" "arrival 1e9"
gdp $small --workload "$dir/late.jsonl" --no-arrivals
expect 0 "throughput|requests" "arrival 1e9 with --no-arrivals"
gdp $small --workload "$dir/late.jsonl" --max-arrival 1e10 --max-prompt-len 1
expect 1 "prompt length 2 exceeds the limit of 1 tokens" "--max-prompt-len 1"
gdp $small --workload "$dir/late.jsonl" --no-arrivals --max-new-tokens 1
expect 1 "\"max_new_tokens\" = 2 exceeds the limit of 1" "--max-new-tokens 1"
gdp $small --workload synthetic:n=3,rate=1e-9,prompt=8,new=2
expect 1 "past the arrival horizon of 86400 s: rate = 1e-09" "synthetic rate 1e-9"
gdp $small --workload synthetic:n=3,prompt=8,new=2 --max-requests 2
expect 1 "n = 3 requests exceeds the limit of 2" "--max-requests 2"
gdp $small --max-arrival -4
expect 2 "--max-arrival -4: expected a finite number" "--max-arrival -4"

[ "$failures" -eq 0 ] && echo "PASS: gdp-run options" || { echo "$failures failure(s)"; exit 1; }
