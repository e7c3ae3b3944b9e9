#!/usr/bin/env bash
# ab_table_check.sh ROOT: launch/ab_table.py (the hopperab stage's summary) on a log of the shape
# launch/h200-suite.sh writes: medians over the rounds, the ratio to this tree's build, the patch names
# of the other builds, a row whose shape ends in a number ("mixed 16300"), one table a setting.
set -uo pipefail
root=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
. "$root/tests/scripts/ab_check_lib.sh" # prefill_row, expect
row() { prefill_row "$@"; }
{
    echo "## build-ab1: GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=auto, round 1"
    row "H=16 K=128 V=128 M=2 8x2048" 16384 430.0
    row "H=16 K=128 V=128 M=2 mixed 16300" 16300 900.0
    echo "## build: GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=auto, round 1"
    row "H=16 K=128 V=128 M=2 8x2048" 16384 440.0
    row "H=16 K=128 V=128 M=2 mixed 16300" 16300 1600.0
    echo "## build-ab1: GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=auto, round 2"
    row "H=16 K=128 V=128 M=2 8x2048" 16384 420.0
    row "H=16 K=128 V=128 M=2 mixed 16300" 16300 910.0
    echo "## build: GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=auto, round 2"
    row "H=16 K=128 V=128 M=2 8x2048" 16384 450.0
    row "H=16 K=128 V=128 M=2 mixed 16300" 16300 1560.0
    echo "## build: GDP_CHUNK_PATH=staged"
    row "H=16 K=128 V=128 M=2 8x2048" 16384 784.1
} >"$dir/hopper_ab.log"
echo "hopperab: build-ab1 is built from /x/build-src-hopper-split2" >"$dir/hopper_ab_trees.log"
out=$(python3 "$root/launch/ab_table.py" "$dir/hopper_ab.log") || { echo "FAIL: ab_table.py exited $?"; exit 1; }
echo "$out"
expect "### GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=auto: median us over the rounds (ratio to build)"
expect "| row | hopper-split2 | build |"
expect "| H=16 K=128 V=128 M=2 8x2048 | 425.0 (0.955) | 445.0 |"
expect "| H=16 K=128 V=128 M=2 mixed 16300 | 905.0 (0.573) | 1580.0 |"
expect "### GDP_CHUNK_PATH=staged GDP_CHUNK_SEGMENT=-"
expect "| H=16 K=128 V=128 M=2 8x2048 | 784.1 |"
[ "$fail" -eq 0 ] && echo "PASS: ab_table.py" || exit 1
