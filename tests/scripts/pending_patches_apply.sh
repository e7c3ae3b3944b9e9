#!/usr/bin/env bash
# pending_patches_apply.sh ROOT: every kernels/chunk/pending/*.patch and kernels/pending/*.patch still applies to this tree
# (git apply --check, which also works in a copy without .git), unless its header marks it as a
# record ("Record:" at the start of a header line): a kernel change measured on the device later
# is made from these patches (launch/h200-suite.sh hopperab, GDP_AB_PATCHES), so an edit of main that
# breaks one must rebase it in the same change, not leave it for the session that has device time.
set -uo pipefail
root=$1
cd "$root" || exit 1
. launch/ab_lib.sh # pending_is_record
shopt -s nullglob
rc=0 checked=0
for pf in kernels/chunk/pending/*.patch kernels/pending/*.patch; do
    if pending_is_record "$pf"; then
        echo "skip   $pf (a record)"
        continue
    fi
    checked=$((checked + 1))
    if out=$(git apply --check "$pf" 2>&1); then
        echo "ok     $pf"
    else
        echo "FAILED $pf does not apply to this tree any more; rebase it (kernels/NOTES-chunk.md, twenty-sixth session):"
        echo "$out" | sed 's/^/       /'
        rc=1
    fi
done
echo "pending_patches_apply: $checked checked, $([ $rc = 0 ] && echo "all apply" || echo "some do not")"
exit $rc
