#!/usr/bin/env bash
# prebuilt_ab_check.sh ROOT: launch/prebuilt.sh ab (the device A/B over linked trees) on stand-in trees
# whose gdp-bench prints prefill rows and whose test_chunk_gpu passes (one tree's fails): every tree's
# test runs (a passing log has no FAIL line, which must not stop the script), the rows alternate over the
# rounds, the table gives medians and ratios to main, the staged rows come from main, and the exit
# status reports the failing test.
set -uo pipefail
root=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
. "$root/tests/scripts/ab_check_lib.sh" # prefill_row, expect
for t in main split; do
    mkdir -p "$dir/pack/$t/bin"
    us=$([ "$t" = main ] && echo 440.0 || echo 400.0)
    # a stand-in gdp-bench: the row at this tree's time (784.1 under the staged path)
    { echo '#!/usr/bin/env bash'; declare -f prefill_row
      echo "[ \"\$GDP_CHUNK_PATH\" = staged ] && prefill_row 'H=16 K=128 V=128 M=2 8x2048' 16384 784.1 ||"
      echo "    prefill_row 'H=16 K=128 V=128 M=2 8x2048' 16384 $us"; } >"$dir/pack/$t/bin/gdp-bench"
    status=$([ "$t" = split ] && echo 1 || echo 0)
    { echo '#!/usr/bin/env bash'; [ "$status" = 0 ] || echo 'echo "FAIL: a made-up case"'
      printf 'echo "Hopper kernel ran 12 times"\necho "100 checks, %s failures"\nexit %s\n' "$status" "$status"; } \
        >"$dir/pack/$t/bin/test_chunk_gpu"
    chmod +x "$dir/pack/$t/bin/"*
done
out=$(OUT=$dir/out GDP_AB_SEGMENTS=auto GDP_AB_ROUNDS=2 GDP_AB_TESTS=first GDP_AB_TREES=main:split \
      bash "$root/launch/prebuilt.sh" ab "$dir/pack" 2>&1)
rc=$?
echo "$out"
expect "## main: GDP_TEST_CHUNK_PATH=hopper test_chunk_gpu"
expect "## split-ab: GDP_TEST_CHUNK_PATH=hopper test_chunk_gpu"
expect "FAIL: a made-up case"
expect "FAILED (exit 1)"
expect "## split-ab: GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=auto, round 2"
expect "| row | split-ab | main |"
expect "| H=16 K=128 V=128 M=2 8x2048 | 400.0 (0.909) | 440.0 |"
expect "| H=16 K=128 V=128 M=2 8x2048 | 784.1 |"
[ -f "$dir/out/hopper_ab_table.md" ] || { echo "FAIL: no hopper_ab_table.md"; fail=1; }
[ "$rc" -eq 1 ] || { echo "FAIL: exit status $rc with a failing tree (expected 1)"; fail=1; }
[ "$fail" -eq 0 ] && echo "PASS: prebuilt.sh ab" || exit 1
