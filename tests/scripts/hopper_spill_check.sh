#!/usr/bin/env bash
# hopper_spill_check.sh ROOT: the Hopper chunk kernel (kernels/chunk/hopper.cuh) compiles without a stack
# frame or a spill in each of its key/value widths and both copy modes (kernels/dev/ptxas_probe.sh: one
# instance at a time, no GPU). The kernel's roles run at a fixed register split (setmaxnreg, 120 aux / 192
# state) sized to the last register: a change that makes either role spill slows every prefill row (an
# aux spill cost 5 % on the first row and 40 % at V = 64 on the H100; kernels/NOTES-chunk.md, fiftieth
# session) while every result stays right, so no GPU test would notice. Exits 77 (skip) without nvcc.
set -uo pipefail
root=${1:?usage: hopper_spill_check.sh ROOT}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "hopper_spill_check: no nvcc: skipped"; exit 77; }
export NVCC=$nvcc
fails=0 probes=0
# KP VP COPY (1 the copy engine's loads, the library's default; 0 the threads' copies)
for inst in "128 128 1" "64 128 1" "128 64 1" "64 64 1" "128 128 0"; do
    read -r kp vp copy <<<"$inst"
    line=$(bash "$root/kernels/dev/ptxas_probe.sh" hopper "$vp" "$copy" "$kp" 2>&1 | grep "chunk_hopper_kernel" | tail -1)
    probes=$((probes + 1))
    if [[ "$line" =~ stack\ ([0-9]+),\ spill\ stores\ ([0-9]+),\ loads\ ([0-9]+) ]]; then
        if [ "${BASH_REMATCH[1]}" != 0 ] || [ "${BASH_REMATCH[2]}" != 0 ] || [ "${BASH_REMATCH[3]}" != 0 ]; then
            echo "FAIL: K $kp V $vp copy $copy: $line"
            echo "      a role of the Hopper kernel spills: find the change that lengthened its live ranges" \
                 "(kernels/dev/ptxas_probe.sh --search aux|state tells which role and by how much)"
            fails=$((fails + 1))
        else
            echo "ok: K $kp V $vp copy $copy: $line"
        fi
    else
        echo "FAIL: K $kp V $vp copy $copy: no ptxas summary (the probe's output: ${line:-none})"
        fails=$((fails + 1))
    fi
done
echo "hopper_spill_check: $probes instances, $fails failures"
[ "$fails" = 0 ]
