#!/usr/bin/env bash
# ptxas_probe.sh: registers, stack and spills of single kernel instances in seconds, without a GPU
# and without compiling the whole translation unit (kernels/chunk/hopper.cu holds 43 kernels and
# takes 2-4 minutes on one core, kernels/recurrent.cu 5; one instance takes 3-7 seconds).
#
#   kernels/dev/ptxas_probe.sh hopper [VP [COPY [KP]]]   chunk_hopper_kernel<bf16, KP, VP, COPY>
#                                                         (VP 64 | 128, default 128; COPY 0 threads,
#                                                         1 tma, default 1; KP 64 | 128, default 128;
#                                                         a tree from before the KP parameter: KP
#                                                         ignored)
#   kernels/dev/ptxas_probe.sh rows SDT,R,LPR,MT,DT ...  recurrent_rows_kernel instances (dtype codes
#                                                         of gdp.h: 0 fp32, 1 bf16, 2 fp16; DT -1 and
#                                                         MT 0: the generic launch); default: the
#                                                         whole-row K = V = 128 instances, both state
#                                                         dtypes, M = 1, 2, 3
#   hopper options (before the kind's arguments):
#     --regs AUX,STATE     the setmaxnreg split to compile with (HOP_AUX_REGS, HOP_STATE_REGS),
#                          the registers' static_assert dropped: which role spills
#     --search aux|state   the fewest registers (a multiple of 8) that role needs without a spill,
#                          the other at its value in the tree (or --regs)
#     --split              also the segment split's kernels of the same widths (hopper_split.cuh:
#                          chunk_hopper_seg_run_kernel, MAIN and F, and chunk_hopper_seg_pass2_kernel),
#                          a line each (not with --search)
#
# Environment: GDP_PROBE_SRC (the tree to read, default this one), NVCC (default nvcc).
# Prints one line per kernel: registers at launch, stack frame, spill stores and loads (bytes).
# ptxas allocates each setmaxnreg role within its own count, but reports the launch count.
set -euo pipefail
root=${GDP_PROBE_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
nvcc=${NVCC:-nvcc}
regs="" search="" split=0
while [ $# -gt 0 ]; do
    case "$1" in
    --regs) regs=$2; shift 2 ;;
    --search) search=$2; shift 2 ;;
    --split) split=1; shift ;;
    *) break ;;
    esac
done
kind=${1:-}
[ -n "$kind" ] || { sed -n '2,24p' "${BASH_SOURCE[0]}" >&2; exit 2; }
shift
work=$(mktemp -d /tmp/gdp-ptxas-probe.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/kernels"

# ptxas -v's lines for the named kernels, one summary line each
summarize() {
    python3 -c '
import re, subprocess, sys
name = None
for line in sys.stdin:
    m = re.search(r"Compiling entry function .(\S+). for", line)
    if m:
        name = m.group(1)
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and name:
        stack, st, ld = m.groups()
        continue
    m = re.search(r"Used (\d+) registers", line)
    if m and name and sys.argv[1] in name:
        short = subprocess.run(["c++filt"], input=name, capture_output=True, text=True).stdout.strip() or name
        short = re.sub(r"\(anonymous namespace\)::", "", short)
        print(f"{short}: {m.group(1)} registers at launch, stack {stack}, spill stores {st}, loads {ld}")
        name = None
' "$1"
}

compile() { # $1: the probe source, $2: the arch (90a for the Hopper kernel, 90 as the library builds the rest)
    (cd "$work" && "$nvcc" -std=c++17 -O3 -gencode=arch=compute_$2,code=sm_$2 -I"$work" -I"$root" \
        -I"$root/include" -I"$root/src" -c "$1" -o probe.o -Xptxas -v 2>&1)
}

case "$kind" in
hopper)
    vp=${1:-128} copy=${2:-1} kp=${3:-128}
    cp -r "$root/kernels/chunk" "$work/kernels/"
    cp "$root"/kernels/*.cuh "$root"/kernels/*.h "$work/kernels/"
    targs="$kp, $vp, $copy" # the kernel's template arguments after T
    grep -q "int KP, int VP, int COPY>" "$root/kernels/chunk/hopper.cuh" || targs="$vp, $copy"
    cat >"$work/probe.cu" <<EOF
#include <cuda_bf16.h>
#include "kernels/chunk/hopper.cuh"
namespace {
template __global__ void chunk_hopper_kernel<__nv_bfloat16, $targs>(const ChunkParams, const __grid_constant__ HopperMaps);
}
EOF
    if [ "$split" = 1 ]; then
        [ -z "$search" ] || { echo "ptxas_probe: --split and --search do not go together" >&2; exit 2; }
        cat >>"$work/probe.cu" <<EOF
#include "kernels/chunk/hopper_split.cuh"
namespace {
template __global__ void chunk_hopper_seg_run_kernel<__nv_bfloat16, $kp, $vp, $copy, HOP_MAIN>(const ChunkParams, const __grid_constant__ HopperMaps, const HopSegPlan);
template __global__ void chunk_hopper_seg_run_kernel<__nv_bfloat16, $kp, $kp, $copy, HOP_MAP_F>(const ChunkParams, const __grid_constant__ HopperMaps, const HopSegPlan);
template __global__ void chunk_hopper_seg_pass2_kernel<__nv_bfloat16, $kp, $vp, $copy>(const ChunkParams, const __grid_constant__ HopperMaps, const HopSegPlan);
}
EOF
    fi
    base="$work/hopper.cuh.orig"
    cp "$work/kernels/chunk/hopper.cuh" "$base"
    # the split as the tree writes it: "constexpr int HOP_AUX_REGS = A, HOP_STATE_REGS = S;" or, by VP,
    # "static constexpr int AUX = VP == 128 ? A128 : A64, STATE = VP == 128 ? S128 : S64;" (HopRegs)
    split_regs() { # $1 file, $2 (optional) "aux,state" to write in: prints "aux state" for this VP, or rewrites
        python3 - "$1" "$vp" "${2:-}" <<'PY'
import re, sys
path, vp, new = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = open(path).read()
flat = re.search(r"constexpr int HOP_AUX_REGS = (\d+), HOP_STATE_REGS = (\d+);", s)
byvp = re.search(r"static constexpr int AUX = VP == 128 \? (\d+) : (\d+), STATE = VP == 128 \? (\d+) : (\d+);", s)
if not new:
    if flat:
        print(flat.group(1), flat.group(2))
    elif byvp:
        a = byvp.group(1) if vp == 128 else byvp.group(2)
        st = byvp.group(3) if vp == 128 else byvp.group(4)
        print(a, st)
    sys.exit(0)
a, st = new.split(",")
if flat:
    s = s[:flat.start()] + f"constexpr int HOP_AUX_REGS = {a}, HOP_STATE_REGS = {st};" + s[flat.end():]
elif byvp:
    s = s[:byvp.start()] + f"static constexpr int AUX = {a}, STATE = {st};" + s[byvp.end():]
s = re.sub(r"static_assert\(HOP_AUX_THREADS \* ", "static_assert(1 || HOP_AUX_THREADS * ", s)
open(path, "w").write(s)
PY
    }
    read -r aux0 state0 < <(split_regs "$base")
    [ -n "${aux0:-}" ] || { echo "ptxas_probe: no register split found in hopper.cuh" >&2; exit 1; }
    [ -n "$regs" ] && IFS=, read -r aux0 state0 <<<"$regs"
    probe_split() { # $1 aux, $2 state: the summary line
        cp "$base" "$work/kernels/chunk/hopper.cuh"
        split_regs "$work/kernels/chunk/hopper.cuh" "$1,$2"
        compile probe.cu 90a | summarize chunk_hopper_
    }
    if [ -z "$search" ]; then
        echo "aux $aux0, state $state0 registers a thread:"
        probe_split "$aux0" "$state0"
    else
        [ "$search" = aux ] || [ "$search" = state ] || { echo "ptxas_probe: --search aux|state" >&2; exit 2; }
        lo=24 hi=256 # spills at lo (assumed), none at hi
        while [ $((hi - lo)) -gt 8 ]; do
            mid=$(((lo + hi) / 16 * 8))
            # a split ptxas refuses (too few registers for the role's code) counts as a spill
            if [ "$search" = aux ]; then line=$(probe_split "$mid" "$state0") || line=""; else
                line=$(probe_split "$aux0" "$mid") || line=""; fi
            case "$line" in *"spill stores 0,"*) hi=$mid ;; *) lo=$mid ;; esac
        done
        echo "$search needs $hi registers a thread (spills at $lo; the other role at its $([ "$search" = aux ] && echo "$state0" || echo "$aux0"))"
    fi
    ;;
rows)
    cp "$root"/kernels/*.cuh "$root"/kernels/*.h "$work/kernels/"
    n=$(grep -n '#include "recurrent_rows.cuh"' "$root/kernels/recurrent.cu" | cut -d: -f1)
    head -n "$n" "$root/kernels/recurrent.cu" >"$work/kernels/probe.cu"
    insts=("$@")
    [ ${#insts[@]} -gt 0 ] || insts=(0,16,32,1,1 0,16,32,2,1 0,16,32,3,1 1,16,32,1,1 1,16,32,2,1 1,16,32,3,1)
    for i in "${insts[@]}"; do
        IFS=, read -r sdt r lpr mt dt <<<"$i"
        echo "template __global__ void recurrent_rows_kernel<$sdt, $r, $lpr, $mt, $dt>(const RecurrentParams);" \
            >>"$work/kernels/probe.cu"
    done
    echo "} // namespace" >>"$work/kernels/probe.cu"
    compile kernels/probe.cu 90 | summarize recurrent_rows_kernel
    ;;
*)
    echo "ptxas_probe: unknown kind '$kind' (hopper or rows)" >&2
    exit 2
    ;;
esac
