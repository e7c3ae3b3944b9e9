#!/usr/bin/env bash
# bin_call_check.sh ROOT: launch/bin_call.sh (one device call over programs built elsewhere) on stand-in
# programs: pack bundles them and refuses a missing one; run unpacks the bundle into its build folder,
# runs the chunktest, prefill, sanitize (a stand-in compute-sanitizer that runs the program and reports
# one race) and decode stages (each program's summary lines and its exit status in the output; decode
# under each GDP_CALL_DECODE_KERNELS value, twice, with an entry's variables), the decode layer rows and the
# decode sanitizers, and returns every stage's logs in $OUT/logs.tgz,
# without a GPU.
set -uo pipefail
root=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
. "$root/tests/scripts/ab_check_lib.sh" # prefill_row, expect
mkdir -p "$dir/src/tests" "$dir/src/examples" "$dir/out"
{ echo '#!/usr/bin/env bash'
  echo 'echo "  auto: a made-up case (path $GDP_TEST_CHUNK_PATH)"'
  echo 'echo "test_chunk_gpu: 10 checks, 0 failures"'; } >"$dir/src/tests/test_chunk_gpu"
{ echo '#!/usr/bin/env bash'
  echo 'echo "test_recurrent_gpu: 20 checks, 0 failures"'; } >"$dir/src/tests/test_recurrent_gpu"
{ echo '#!/usr/bin/env bash'; declare -f prefill_row
  echo "prefill_row 'H=16 K=128 V=128 M=2 8x2048' 16384 431.0"
  echo 'echo "#   ran the Hopper kernel, unsplit (GDP_CHUNK_PATH ${GDP_CHUNK_PATH:-unset: auto})"'
  echo 'if [ "$1" = layer ]; then echo "    decode        1      1   bf16  made up (GDP_DECODE_STATE ${GDP_DECODE_STATE:-unset} KSPLIT ${GDP_DECODE_RING_KSPLIT:-unset} $*)"; exit 0; fi'
  echo 'echo "decode   B=1 made up (GDP_DECODE_STATE ${GDP_DECODE_STATE:-unset})"'; } \
    >"$dir/src/examples/gdp-bench"
mkdir -p "$dir/tools"
{ echo '#!/usr/bin/env bash'
  echo 'echo "========= Error: Race reported between Write access at a made-up line"'
  echo '"${@: -1}"; echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; exit 86'; } \
    >"$dir/tools/compute-sanitizer"
chmod +x "$dir/src/tests/test_chunk_gpu" "$dir/src/tests/test_recurrent_gpu" "$dir/src/examples/gdp-bench" \
    "$dir/tools/compute-sanitizer"

GDP_CALL_BUILD=$dir/src bash "$root/launch/bin_call.sh" pack "$dir/b.tar.xz" tests/test_chunk_gpu examples/missing \
    >/dev/null 2>&1 && { echo "FAIL: pack took a program that is not built"; exit 1; }
GDP_CALL_BUILD=$dir/src bash "$root/launch/bin_call.sh" pack "$dir/b.tar.xz" tests/test_chunk_gpu tests/test_recurrent_gpu \
    examples/gdp-bench ||
    { echo "FAIL: pack"; exit 1; }
out=$(OUT=$dir/out GDP_CALL_BUILD=$dir/run GDP_CALL_LOGS=$dir/logs GDP_CALL_BINS=$dir/b.tar.xz \
      GDP_CALL_STAGES="chunktest prefill sanitize decode decodelayer decodesan" \
      GDP_CALL_DECODE_KERNELS="rows auto,GDP_DECODE_RING_KSPLIT=2" GDP_CALL_MPIRUN="" GDP_CALL_LAYER_STATES=bf16 \
      GDP_CALL_SANITIZE=racecheck GDP_CALL_SANITIZE_ARGS="--kernel-name kns=hop" PATH="$dir/tools:$PATH" \
      bash "$root/launch/bin_call.sh" run 2>&1)
echo "$out"
expect "## test_chunk_gpu, GDP_TEST_CHUNK_PATH=auto: exit 0"
expect "  auto: a made-up case (path hopper)"
expect "test_chunk_gpu: 10 checks, 0 failures"
expect "## GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=off"
expect "prefill  H=16 K=128 V=128 M=2 8x2048"
expect "#   ran the Hopper kernel, unsplit (GDP_CHUNK_PATH staged)"
expect "[prefill at "
expect "## compute-sanitizer --tool racecheck --kernel-name kns=hop test_chunk_gpu (hopper): exit 86"
expect "; 1 race reports"
expect "========= RACECHECK SUMMARY: 1 hazard displayed"
expect "## test_recurrent_gpu: exit 0"
expect "## GDP_DECODE_STATE=rows"
expect "decode   B=1 made up (GDP_DECODE_STATE auto)"
expect "## GDP_DECODE_STATE=auto GDP_DECODE_RING_KSPLIT=2"
expect "## round 2, GDP_DECODE_STATE=auto GDP_DECODE_RING_KSPLIT=2, -S bf16"
expect "made up (GDP_DECODE_STATE auto KSPLIT 2 layer -b cuda"
expect "## compute-sanitizer --tool memcheck test_recurrent_gpu (kns=recurrent_ring): exit 86"
[ "$(grep -c "^## GDP_DECODE_STATE=" <<<"$out")" -eq 4 ] || { echo "FAIL: decode ran the kernels other than twice each"; fail=1; }
logs=$(tar -tzf "$dir/out/logs.tgz" 2>/dev/null)
for f in chunk_test_auto.log chunk_test_hopper.log prefill.log sanitize_racecheck.log recurrent_test.log decode.log \
    decode_layer.log decode_san_memcheck.log decode_san_racecheck.log times.txt; do
    grep -q "logs/$f" <<<"$logs" || { echo "FAIL: logs.tgz lacks $f"; fail=1; }
done
[ -x "$dir/run/examples/gdp-bench" ] || { echo "FAIL: the bundle was not unpacked into GDP_CALL_BUILD"; fail=1; }
[ "$fail" -eq 0 ] && echo "PASS: bin_call.sh pack and run" || exit 1
