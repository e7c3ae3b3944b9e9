# ncu_lib.sh: one kernel launch's ncu card by source line, sourced by launch/h200-suite.sh (stagesprof,
# decodeprof, hopperprof) and launch/bin_call.sh (decodeprof). Functions only; they read $root (the
# repository), $build (its build folder, relative), $work (a scratch folder) and $out (the logs).
# The source-line card of one kernel launch: the cubin holding `kernel` out of libgdp.so (or another
# binary that embeds it), its SASS with line marks (nvdisasm -g) into $work/<sass>.sass once, then
#   ncu_card NAME REGEX SKIP MANGLED SASS COMMAND...
# runs COMMAND under ncu --set full with the source counters for launch SKIP + 1 of the kernels
# matching REGEX, writes the details page to $out/NAME_details.txt and prints the hottest lines
# of the instance whose mangled name starts with MANGLED (launch/ncu_lines.py). Its status is
# returned, so the callers keep their loops out of pipelines (rc must survive).
ncu_sass() { # ncu_sass KERNEL SASS [BINARY]: the SASS of the cubin that holds KERNEL (in BINARY, default libgdp.so)
    (cd "$work" && cuobjdump -xelf all "${3:-$root/$build/libgdp.so}" >/dev/null)
    nvdisasm -g -c "$(grep -l "$1" "$work"/*.cubin | head -1)" >"$work/$2.sass"
}
ncu_card() {
    local name=$1 regex=$2 skip=$3 mangled=$4 sass=$5 status=0
    shift 5
    ncu --clock-control none --set full --import-source yes --kernel-name-base demangled --kernel-name "regex:$regex" \
        --launch-skip "$skip" --launch-count 1 -o "$work/$name" -f "$@" >"$work/ncu_$name.log" 2>&1 || status=1
    ncu -i "$work/$name.ncu-rep" --page source --csv --print-source sass >"$work/$name.csv" 2>&1
    ncu -i "$work/$name.ncu-rep" --page details >"$out/${name}_details.txt" 2>&1
    python3 launch/ncu_lines.py "$work/$name.csv" "$work/$sass.sass" "$mangled" --top "${NCU_TOP:-14}" || status=1
    return $status
}
