#!/usr/bin/env bash
# prebuilt.sh: the A/B trees built on this machine (no GPU needed), linked and run on the device
# without compiling there. A device call that builds four trees spends most of its 600 s in nvcc
# (kernels/NOTES-chunk.md, twenty-fifth session); linking from objects takes seconds.
#
#   launch/prebuilt.sh pack DIR [PATCH ...]   on this machine, from a clean tree: brings BUILD up to
#       date for the targets below, saves its static library, the targets' objects, local libraries
#       and link lines into DIR/main; then for each patch (kernels/chunk/pending/*.patch) applies it,
#       rebuilds, saves into DIR/<patch name> the objects whose sources it changed (prebuilt_pick.py:
#       an earlier patch's identical ones by reference) and restores the tree. DIR holds libgdp.a once
#       and a few MB a patch; `tar -cJf` it into a carried file (42 MB for five patches).
#   launch/prebuilt.sh link DIR               on the device: DIR/<tree>/bin/<target> for every tree
#       (main's library with the tree's changed members replaced), linked with the device's g++
#       against its CUDA, MPI, BLAS and jansson (JANSSON_HOME, e.g. the carried .deps/usr).
#   launch/prebuilt.sh ab DIR                 on the device, after link: the suite's hopperab
#       measurement over the linked trees (GDP_AB_TREES, colon-separated, default all; main is the
#       base; GDP_AB_SEGMENTS, GDP_AB_ROUNDS as the suite's; GDP_AB_TESTS first | last | none: each
#       tree's Hopper test path before the rows, after them, or not), logs and the table under $OUT.
#
# Targets: gdp-bench, test_chunk_gpu, gdp-run, test_gemm_gpu, test_conv1d_gpu, test_engine_gpu_np2, test_layer_tp_gpu_nccl_np1,
# test_layer_tp_gpu_np2, test_sampling_gpu and test_recurrent_gpu for every tree (packab's and sampab's tests of side b); test_comm_mpi_gpu_np2,
# test_layer_cp_gpu_np2 and test_layer_tp_gpu_sp_np2 for main.
# Environment: GDP_BUILD_DIR (default build). The patches may touch sources only (no new targets).
# A patch whose header (the text before its first diff) has a line "Pack-keep-only: FILE ..." (file
# names, e.g. "layer.c core.c copy_kernels.cu") keeps only the objects built from one of them (by their
# depfiles; prebuilt_pick.py) and takes main's for the rest: for a header change that reaches objects it
# cannot alter (fields appended to a host struct, new declarations), where every includer is rebuilt and
# kept (35 MB for one such tree). The line is the author's claim: it must name every source the change
# can alter, the one that allocates a grown struct included (kernels/NOTES-ops.md, forty-fifth session).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${GDP_BUILD_DIR:-build}
tree_targets=(gdp-bench test_chunk_gpu gdp-run test_gemm_gpu test_conv1d_gpu test_engine_gpu_np2 test_layer_tp_gpu_nccl_np1
              test_layer_tp_gpu_np2 test_sampling_gpu test_recurrent_gpu)
main_targets=(test_comm_mpi_gpu_np2 test_layer_cp_gpu_np2 test_layer_tp_gpu_sp_np2)
mode=${1:-}
dir=${2:-}
[ -n "$mode" ] && [ -n "$dir" ] || { sed -n '2,20p' "${BASH_SOURCE[0]}" >&2; exit 2; }
shift 2

# the CMake target folder of a target (its link.txt, objects1 and linkLibs.rsp)
target_dir() { find "$root/$build" -path "*/CMakeFiles/$1.dir" -type d | head -1; }

if [ "$mode" = pack ]; then
    cd "$root"
    git diff --quiet && git diff --cached --quiet ||
        { echo "prebuilt.sh pack: the tree has uncommitted changes; pack from a clean tree" >&2; exit 2; }
    mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
    rm -rf "${dir:?}"/*
    [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build" -j"$(nproc)" --target "${tree_targets[@]}" "${main_targets[@]}" >"$dir/build_main.log" 2>&1 ||
        { tail -20 "$dir/build_main.log"; exit 1; }
    save() { # save TREE FILE...: build-relative files into DIR/TREE
        local t=$1
        shift
        for f in "$@"; do
            mkdir -p "$dir/$t/$(dirname "$f")"
            cp "$root/$build/$f" "$dir/$t/$f"
        done
    }
    # main: the library, and per target its link line (link.txt) with every relative file it names:
    # response files, objects, local libraries (not the shared libgdp: link takes the static one)
    save main libgdp.a
    for t in "${tree_targets[@]}" "${main_targets[@]}"; do
        td=$(target_dir "$t")
        [ -n "$td" ] || { echo "prebuilt.sh pack: no CMake folder for $t" >&2; exit 1; }
        rel=${td#"$root/$build/"}
        tgt_home=$(dirname "$(dirname "$rel")") # the folder the target is linked in
        save main "$rel/link.txt"
        names=$(tr ' ' '\n' <"$td/link.txt" | tr -d '"')
        for at in $(echo "$names" | sed -n 's/^@//p'); do names="$names"$'\n'"$(tr ' ' '\n' <"$root/$build/$tgt_home/$at" | tr -d '"')"; done
        for n in $(echo "$names" | sed 's/^@//'); do
            case "$n" in /* | -* | *.so | *.so.* | "$t") continue ;; esac # (the output too)
            [ -f "$root/$build/$tgt_home/$n" ] && save main "$(realpath -m --relative-to="$root/$build" "$root/$build/$tgt_home/$n")"
        done
        echo "$t $tgt_home" >>"$dir/main/targets"
    done
    echo "$root/$build" >"$dir/main/build_path"
    # the library's members and the targets' objects, by checksum: what a patch changes
    (cd "$root/$build" && find . -name '*.o' -o -name '*.a' | sort | xargs md5sum) >"$dir/main.md5"
    # the files any patch touches, with their contents under main and under each patch (prebuilt_pick.py
    # tells a real change from a recompile by them: nvcc's per-compile module id makes bytes useless)
    watched=$(sed -n -e 's|^+++ b/||p' -e 's|^--- a/||p' "$@" | sort -u)
    record_hashes() { for f in $watched; do
        if [ -f "$f" ]; then echo "$f $(git hash-object "$f")"; else echo "$f -"; fi; done >"$dir/.hashes_$1"; }
    record_hashes main
    for pf in "$@"; do
        name=$(basename "$pf" .patch)
        untracked_before=$(git status --porcelain --untracked-files=all | awk '$1 == "??" {print $2}' | sort)
        git apply "$pf" || { echo "prebuilt.sh pack: $pf does not apply" >&2; exit 2; }
        new_files=$(comm -13 <(echo "$untracked_before") \
                    <(git status --porcelain --untracked-files=all | awk '$1 == "??" {print $2}' | sort))
        record_hashes "$name"
        status=0
        cmake --build "$build" -j"$(nproc)" --target "${tree_targets[@]}" >"$dir/build_$name.log" 2>&1 || status=$?
        # restore the tree before anything can stop the script
        git checkout -- . && { [ -z "$new_files" ] || rm -rf $new_files; }
        [ $status -eq 0 ] || { tail -20 "$dir/build_$name.log"; exit 1; }
        (cd "$root/$build" && find . -name '*.o' -o -name '*.a' | sort | xargs md5sum) >"$dir/$name.md5"
        changed=$(diff <(cat "$dir/main.md5") <(cat "$dir/$name.md5") | awk '$1 == ">" {print $3}' |
                  grep -E '/(gdp_objects|gdp_hopper_objects)\.dir/.*\.o$|/CMakeFiles/[^/]+\.dir/[^/]+\.o$' || true)
        mkdir -p "$dir/$name"
        # the patch header's "Pack-keep-only:" sources (the author's list of those whose objects can differ)
        sed -n -e '/^diff --git/q' -e 's/^Pack-keep-only: *//p' "$pf" | head -1 >"$dir/.keep_$name"
        changed=$(python3 "$root/launch/prebuilt_pick.py" "$dir" "$name" "$root" "$build" $(for f in $changed; do echo "${f#./}"; done))
        for f in $changed; do save "$name" "$f"; done
        echo "$name" >>"$dir/.trees"
        echo "prebuilt.sh pack: $name: kept $(for f in $changed; do basename "$f"; done | tr '\n' ' ')$(
            [ ! -f "$dir/$name/inherit" ] || awk '{n = split($1, p, "/"); printf "; %s from %s", p[n], $2}' "$dir/$name/inherit")"
        rm -f "$dir/$name.md5"
    done
    rm -f "$dir/main.md5" "$dir"/.hashes_* "$dir"/.keep_* "$dir/.trees"
    # the library members the trees replace are named by their object's basename: they must be unique
    dups=$(ar t "$dir/main/libgdp.a" | sort | uniq -d)
    [ -z "$dups" ] || { echo "prebuilt.sh pack: libgdp.a has members of one name: $dups" >&2; exit 1; }
    du -sh "$dir"
    exit 0
fi

if [ "$mode" = link ]; then
    dir=$(cd "$dir" && pwd)
    jansson_lib=${JANSSON_HOME:+$JANSSON_HOME/lib/x86_64-linux-gnu/libjansson.so}
    [ -n "$jansson_lib" ] && [ -f "$jansson_lib" ] || jansson_lib=/usr/lib/x86_64-linux-gnu/libjansson.so
    cuda_libs=(-L/usr/local/cuda/targets/x86_64-linux/lib/stubs -L/usr/local/cuda/targets/x86_64-linux/lib
               -L/usr/local/cuda/lib64)
    for tree_dir in "$dir"/*/; do
        tree=$(basename "$tree_dir")
        work=$dir/.link_$tree
        rm -rf "$work" && cp -r "$dir/main" "$work" && rm -rf "$work/bin" # (main's binaries of an earlier link)
        if [ "$tree" != main ]; then # the tree's changed objects over main's, and into the library
            [ ! -f "$tree_dir/inherit" ] || while read -r o from; do # objects an earlier tree holds
                mkdir -p "$work/$(dirname "$o")" && cp "$dir/$from/$o" "$work/$o"
                echo "$o" >>"$work/.replaced"
            done <"$tree_dir/inherit"
            (cd "$tree_dir" && find . -name '*.o' | sed 's|^\./||') | while read -r o; do
                mkdir -p "$work/$(dirname "$o")" && cp "$tree_dir/$o" "$work/$o" && echo "$o" >>"$work/.replaced"
            done
            lib_objs=$(grep -E '/(gdp_objects|gdp_hopper_objects)\.dir/' "$work/.replaced" || true)
            [ -z "$lib_objs" ] || (cd "$work" && ar r libgdp.a $lib_objs 2>/dev/null && ranlib libgdp.a)
        fi
        mkdir -p "$tree_dir/bin"
        while read -r t home; do
            [ "$tree" = main ] || printf '%s\n' "${tree_targets[@]}" | grep -qx "$t" || continue
            rel=$(find "$work" -path "*/CMakeFiles/$t.dir" -type d | head -1)
            # the link line as CMake wrote it, with g++ as the driver (libgdp.a holds C++), the static
            # libgdp in place of the shared one, jansson where this machine has it, no rpath to the build
            cmd=$(sed -e 's|^[^ ]*/cc |g++ |' -e 's|^[^ ]*/g++ |g++ |' -e "s|$(cat "$dir/main/build_path"):||g" \
                      -e 's|\.\./libgdp\.so[.0-9]*|../libgdp.a|' "$rel/link.txt")
            echo "$cmd" >"$work/.cmd"
            # shared libraries by path as this machine has them: jansson where JANSSON_HOME says, any
            # other path missing here (the device keeps CUDA's under lib64 or targets/) by name
            python3 - "$jansson_lib" "$work/.cmd" "$work/$home"/CMakeFiles/*.dir/linkLibs.rsp <<'PY'
import os, re, shlex, sys
jansson = sys.argv[1]
for path in sys.argv[2:]:
    if not os.path.exists(path):
        continue
    out = []
    for tok in shlex.split(open(path).read()):
        m = re.match(r"^/.*/lib([^/]+?)\.so(\.[0-9.]+)?$", tok)
        if m and m.group(1) == "jansson":
            tok = jansson
        elif m and not os.path.exists(tok):
            tok = "-l" + m.group(1)
        out.append(tok)
    open(path, "w").write(shlex.join(out) + "\n")
PY
            cmd=$(cat "$work/.cmd")
            (cd "$work/$home" && eval "$cmd" "${cuda_libs[*]}" -lcudadevrt -lcudart_static -lrt -lpthread -ldl &&
                mv "$t" "$tree_dir/bin/$t") || { echo "prebuilt.sh link: $tree/$t failed" >&2; exit 1; }
        done <"$dir/main/targets"
        rm -rf "$work"
        echo "prebuilt.sh link: $tree: $(ls "$tree_dir/bin" | tr '\n' ' ')"
    done
    exit 0
fi
if [ "$mode" = ab ]; then
    set +e # a grep that finds no FAIL line is the good case; rc collects the real failures
    # hopperab's measurement (launch/h200-suite.sh) over linked trees: each tree's Hopper test path, the
    # prefill rows alternated between the trees (GDP_AB_SEGMENTS, GDP_AB_ROUNDS as there), main's staged
    # rows, then one table a setting (launch/ab_table.py; trees other than main are labelled NAME-ab)
    dir=$(cd "$dir" && pwd)
    out=${OUT:-$root/h200-out}
    mkdir -p "$out"
    export NCCL_NVLS_ENABLE=0
    [ -d "$root/.golden" ] && export GDP_GOLDEN_DIR=${GDP_GOLDEN_DIR:-$root/.golden}
    [ -n "${JANSSON_HOME:-}" ] && export LD_LIBRARY_PATH=$JANSSON_HOME/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
    IFS=: read -r -a trees <<<"${GDP_AB_TREES:-$(cd "$dir" && ls -d */ | tr -d / | tr '\n' :)}"
    label() { [ "$1" = main ] && echo main || echo "$1-ab"; }
    rc=0
    . "$root/launch/ab_lib.sh"
    pairs=() tests=()
    for t in "${trees[@]}"; do
        pairs+=("$(label "$t")=$dir/$t/bin/gdp-bench") tests+=("$(label "$t")=$dir/$t/bin/test_chunk_gpu")
    done
    hopper_tests() { ab_hopper_tests "$out" "${tests[@]}" || rc=1; }
    # GDP_AB_TESTS: first (the default, as the suite), last (the rows first, when a call may be cut), none
    [ "${GDP_AB_TESTS:-first}" = first ] && hopper_tests
    ab_rows "$out/hopper_ab.log" "${pairs[@]}"
    ab_staged_rows "$out/hopper_ab.log" main "$dir/main/bin/gdp-bench"
    python3 "$root/launch/ab_table.py" "$out/hopper_ab.log" /dev/null | tee "$out/hopper_ab_table.md"
    [ "${GDP_AB_TESTS:-first}" = last ] && hopper_tests
    exit $rc
fi
echo "prebuilt.sh: unknown mode $mode (pack | link | ab)" >&2
exit 2
