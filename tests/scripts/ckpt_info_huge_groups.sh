#!/usr/bin/env bash
# ckpt_info_huge_groups.sh GDP_CKPT DIR: `gdp-ckpt info` on a metadata-only checkpoint with
# H = G = 2^32 must answer at once (it used to try every tp in 1..G, 2^32 steps) and list the
# TP sizes that fit an int32 (the powers of two up to 2^30), then report the missing tensors.
set -euo pipefail
ckpt=$1
file=$2/gdp_huge_groups_$$.safetensors
header='{"__metadata__":{"format":"gdp-layer-checkpoint","hidden_size":"1","num_heads":"4294967296","num_groups":"4294967296","head_dim":"1","state_dim":"1","num_householder":"1","conv_width":"4","num_layers":"1","dtype":"fp32"}}'
n=${#header}
{
    printf "$(printf '\\%03o\\%03o' $((n & 255)) $(((n >> 8) & 255)))"
    printf '\0\0\0\0\0\0%s' "$header"
} >"$file"
start=$SECONDS
rc=0
out=$(timeout 60 "$ckpt" info "$file" 2>&1) || rc=$?
took=$((SECONDS - start))
rm -f "$file"
echo "$out"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$rc" -eq 1 ] || fail "gdp-ckpt info exited $rc, expected 1 (the layer tensors are missing)"
[ "$took" -le 5 ] || fail "gdp-ckpt info took $took s on a metadata-only file"
grep -q 'TP sizes it loads at.*: 1 2 4 8 .* 536870912 1073741824$' <<<"$out" || fail "wrong TP size list"
grep -q "INVALID at tp=1: .*has no tensor 'layers.0.norm.weight'" <<<"$out" || fail "no report of the missing tensor"
echo "PASS: answered in $took s"
