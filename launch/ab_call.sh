#!/usr/bin/env bash
# ab_call.sh: one device call over trees built here (launch/prebuilt.sh pack, carried as
# .pre/pack.tar.xz with .deps and .golden): link them, then in order of worth, each stage under its
# own timeout and its logs tarred into $OUT/logs.tgz as soon as it ends (a call cut at its limit still
# returns what ran): ab, every patch tree of the pack against main (unsplit and on the op's own segment
# choice); engine, the engine's GPU test (device and host swaps compared bit for bit); serve, the
# mixed serving workload under each preemption setting; layer, the layer bench with cuBLASLt and with
# the skinny GEMM; decode (not by default), main's test_recurrent_gpu and the decode rows (ab_lib.sh's
# decode_stage: GDP_CALL_DECODE_KERNELS, the GDP_DECODE_STATE values to alternate); ranks2 (not by
# default), the host-staged comm's two-rank GPU tests (test_comm_mpi_gpu_np2, test_layer_cp_gpu_np2,
# test_layer_tp_gpu_np2, test_layer_tp_gpu_sp_np2; GDP_CALL_RANKS2_TESTS= (empty) skips them), then for
# GDP_CALL_RANKS2_ROUNDS rounds (default 1) over GDP_CALL_RANKS2_TREES (colon-separated, default main)
# gdp-bench coll and the two serving workloads of issue 11 on two ranks of the one GPU (MPI comm,
# host-staged), then main's on one rank; GDP_CALL_RANKS2_TIMEOUT seconds a run (default 120); fusedrace (not
# by default), racecheck of the fused kernel's first GDP_CALL_FUSEDRACE_LAUNCHES launches (default 6) on
# every tree, GDP_CALL_FUSEDRACE_TIMEOUT seconds each (default 100; the fused-* pending experiments); normgemm
# (not by default), gdp-bench ops --op gemm (the norm-GEMM rows; GDP_CALL_NG_OPS=0 skips it), main's
# test_gemm_gpu, the layer and engine GPU tests (GDP_CALL_NG_TESTS=0 skips them, quick runs the NCCL layer test and the engine test only), then the layer bench's decode
# rows (GDP_CALL_NG_BATCHES, default 1,2,4,8,64) of each tree of GDP_CALL_NG_TREES (default main) under each GDP_NORM_GEMM of GDP_CALL_NG_MODES (default "chain
# serial pdl"; a mode X+skinny also sets GDP_GEMM_SKINNY=on, X+blas off), two rounds; profile (not by default), ncu's duration
# of every kernel of main's layer bench in launch order (decode rows GDP_CALL_PROF_BATCHES, default 1,128), then per kernel
# name over gdp-run's decode-heavy workload cut to GDP_CALL_PROF_NEW (default 6) new tokens; split
# (not by default), the layer bench's decode rows GDP_CALL_SPLIT_BATCHES also as GDP_CALL_SPLITS micro-batches
# on their own streams (--split), under each GDP_DECODE_BLOCKS_PER_SM of GDP_CALL_SPLIT_BPS (default "0 1 items"),
# two rounds; python (not by default), the Python package's torch GPU tests and its decode bench beside the C call
# (a libgdp.so linked there from the pack); packab (not by default), main of a second pack (GDP_CALL_PACK_B) against
# the first's: its GEMM, conv, layer, engine and recurrent GPU tests, then the ops gemm rows and the layer's decode
# rows of both, alternated (GDP_CALL_PAB_TREE, a tree of the first pack instead; GDP_CALL_PAB_SKINNY, GDP_CALL_PAB_BATCHES;
# GDP_CALL_PAB_OPS=0 skips the ops rows); serveab (not by default), the serving
# workloads of two trees, alternated (GDP_CALL_SA_ROUNDS; b: GDP_CALL_SA_TREE of the first pack or main of the
# second, as packab's GDP_CALL_PAB_TREE; packab and serveab run side a under GDP_CALL_AB_ENV_A and b under
# GDP_CALL_AB_ENV_B, e.g. one tree's two settings); gemvfloor (not by default),
# kernels/dev/gemv_floor.cu built and run there (then its weights as L2 hits; GDP_CALL_GF_L2=0 skips that); gemmskinny (not by default), kernels/dev/gemm_skinny.cu built and
# run there (cuBLASLt's heuristic results and split-k forms of the decode projections, rows GDP_CALL_GS_ROWS); opsdecode (not by default), main's decode op rows
# twice, without decode's tests; opsprefill (not by default), main's prefill op rows with their stages
# twice (GDP_CALL_OPF_ENV: the environment they run under); segsweep (not by default), main's (or tree
# GDP_CALL_SEG_TREE's) split prefill rows under each forced segment length, and first segment length (stage_segsweep); chunkab (not by default), each tree of GDP_CALL_CAB_TREE
# (space-separated): its test_chunk_gpu (GDP_CALL_CAB_PATHS, default Hopper path and auto), its segment cases under
# GDP_CALL_CAB_SANITIZE's tools (trees GDP_CALL_CAB_SANITIZE_TREES), then the trees' prefill rows beside main's (GDP_CALL_CAB_ROUNDS); gemvprof (not by default), ncu's detailed set
# (throughput, occupancy, warp stalls) of the layer's one-row kernels, with cuBLASLt's in_proj and the skinny one
# (GDP_CALL_GEMVPROF_ENVS, default "GDP_GEMM_SKINNY=auto GDP_GEMM_SKINNY=on");
# layerenv (not by default), main's (or tree GDP_CALL_LE_TREE's) layer decode rows under settings GDP_CALL_LE_ENVS alternated (stage_layerenv);
# ncuop (not by default), ncu's durations of the decode kernels over the op bench's decode-key rows under settings and
# ncu cache controls (stage_ncuop); ncustall (not by default), ncu's warp stall reasons of the decode kernel on two of
# those rows under the same settings and cache controls (stage_ncustall); layerstall (not by default), the same for
# every kernel of the layer bench's decode step (stage_layerstall);
# ngsrc (not by default), ncu's full set with source counters (report, details and the per-instruction SASS table
# in logs.tgz) on the layer's out_proj launch at B = 1 of tree GDP_CALL_NGSRC_TREE (default main) under
# GDP_CALL_NGSRC_MODES (default auto: the norm-GEMV; under chain at two rows out_proj is cuBLASLt's); other kernels
# and rows by GDP_CALL_NGSRC_KERNEL (a regex), GDP_CALL_NGSRC_D, _SKIP and _COUNT (launches skipped and profiled);
# sampab (not by default), the sampling kernels of main and of tree GDP_CALL_SAMP_TREE: the tree's test_sampling_gpu,
# then both trees' test_sampling_gpu --bench alternated (GDP_CALL_SAMP_ROUNDS); decodeab (not by default), a decode
# kernel change: tree GDP_CALL_DAB_TREE's test_recurrent_gpu, then the decode op rows and the layer's decode rows
# (GDP_CALL_DAB_BATCHES, fp32 and bf16 states) of main and the tree alternated under each GDP_CALL_DECODE_KERNELS
# entry (GDP_CALL_DAB_ROUNDS); gemmfront (not by default), in_proj
# with the decode front: test_conv1d_gpu, the layer and engine GPU tests under GDP_GEMM_FRONT=fused, then the
# layer's decode rows GDP_CALL_GF_BATCHES (default 1,2,4,8) with cuBLASLt and the front (chain), the skinny GEMV and the front (skinny) and the one launch (fused), two rounds. The A/B
# runs its prefill rows (which check their own results) before the trees' Hopper test paths, so a cut
# call still returns the timings. Without a pack, or if linking fails, it builds the pending patches'
# trees there (launch/h200-suite.sh hopperab; the patches not marked
# "Record:", ab_lib.sh's pending_is_record).
#
# Environment: GDP_CALL_STAGES (default "ab engine serve layer"): the stages, in order;
# GDP_CALL_AB_SEGMENTS (default "off auto"), GDP_CALL_AB_ROUNDS (default 2); GDP_CALL_PACK (default
# .pre/pack.tar.xz).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export JANSSON_HOME=$PWD/.deps/usr
# the linked binaries find CUDA's libraries where that machine keeps them (no rpath to them from here)
export LD_LIBRARY_PATH=$JANSSON_HOME/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export GDP_GOLDEN_DIR=$PWD/.golden
# ncu, nvcc and cuobjdump where that machine keeps them, behind any on its PATH (the ncu and dev-tool stages)
export PATH=$PATH:/usr/local/cuda/bin
[ -d .golden ] || echo "ab_call: no .golden carried: the GPU tests' golden checks will fail (carry .golden)"
# the layer bench's model, every stage's: issue 11's shape (2 layers, D 2048, H 16, G 4, P = N = 128, M 2)
layer_shape=(-b cuda -d 2048 -l 2 -H 16 -g 4 -p 128 -n 128 -m 2)
final=${OUT:?OUT must name the folder whose files come back}
export OUT=/tmp/ab_call_out # the stages' logs; $final/logs.tgz after each stage (the call returns few files)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
SECONDS=0
save_logs() { tar -czf "$final/logs.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"; echo "[$1 at ${SECONDS}s]" | tee -a "$OUT/times.txt"; }
P=/tmp/ab_call_pack/pack
. launch/ab_lib.sh # decode_stage, chunk_sanitize, pending_is_record
# a pack's top folder is named pack here whatever it was named at pack time (e.g. .pre/packS); symlink
# targets (prebuilt_pick.py's references) are relative and left alone
untar_pack() { rm -rf "$2" && mkdir -p "$2" && tar -xJf "$1" -C "$2" --transform 's,^[^/]*,pack,S'; }
untar_pack "${GDP_CALL_PACK:-.pre/pack.tar.xz}" /tmp/ab_call_pack &&
    launch/prebuilt.sh link "$P" >"$OUT/link.log" 2>&1
lrc=$?
tail -8 "$OUT/link.log"
save_logs "link rc=$lrc"
if [ $lrc -ne 0 ]; then
    patches=$(for pf in kernels/chunk/pending/*.patch; do pending_is_record "$pf" || printf '%s:' "$pf"; done)
    echo "no linked trees: building the pending patches' A/B on the device instead (${patches%:})"
    OUT=$final GDP_AB_PATCHES=${patches%:} GDP_AB_SEGMENTS="${GDP_CALL_AB_SEGMENTS:-off auto}" GDP_AB_ROUNDS=1 \
        ./launch/h200-suite.sh hopperab >"$final/ab.log" 2>&1
    exit
fi
# a second pack (GDP_CALL_PACK_B, built from another commit), linked beside the first for stage packab
PB=/tmp/ab_call_pack_b/pack
if [ -n "${GDP_CALL_PACK_B:-}" ]; then
    untar_pack "$GDP_CALL_PACK_B" /tmp/ab_call_pack_b &&
        launch/prebuilt.sh link "$PB" >"$OUT/link_b.log" 2>&1
    echo "pack b link rc=$?"
fi
# run_gpu_tests BIN LOG LABEL SPEC...: each SPEC "RANKS TARGET ARG..." under mpirun from folder BIN, its log
# $OUT/LOG_TARGET.log, then "LABELTARGET rc=" and the log's checks line (packab, normgemm, gemmfront)
run_gpu_tests() {
    local bin=$1 log=$2 label=$3 t
    shift 3
    for t in "$@"; do
        set -- $t
        [ -x "$bin/$2" ] || { echo "$label$2: not linked in $bin (a patch tree links prebuilt.sh's tree_targets only)"; continue; }
        timeout 150 mpirun -n "$1" "$bin/$2" "${@:3}" >"$OUT/${log}_$2.log" 2>&1
        echo "$label$2 rc=$?"
        grep -E "checks|FAIL|skipped" "$OUT/${log}_$2.log" | tail -2
    done
}
b_bin() { # b_bin TREE: the binaries of the A/B's side b: TREE of the first pack when named, else main of pack b
    if [ -n "$1" ]; then echo "$P/$1/bin"; else echo "$PB/main/bin"; fi
}
setting_env() { # setting_env ENTRY: a settings entry (VAR=VALUE[,VAR=VALUE...], "-" for none) as env's assignments
    [ "$1" = - ] || echo "${1//,/ }"
}
side_env() { # side_env a|b: the environment assignments of an A/B side (GDP_CALL_AB_ENV_A, _B; default none),
    # so that one tree's two settings can be the two sides (b: GDP_CALL_PAB_TREE / GDP_CALL_SA_TREE = main)
    if [ "$1" = b ]; then echo "${GDP_CALL_AB_ENV_B:-}"; else echo "${GDP_CALL_AB_ENV_A:-}"; fi
}
stage_packab() { # main of GDP_CALL_PACK (a) against main of GDP_CALL_PACK_B, or its tree GDP_CALL_PAB_TREE (b): b's GEMM, conv, layer, engine and
    # recurrent GPU tests (GDP_CALL_PAB_TESTS=gemv: the GEMM and conv ones only), then per round (GDP_CALL_PAB_ROUNDS,
    # default 2) and GDP_GEMM_SKINNY value (GDP_CALL_PAB_SKINNY, default "auto on") gdp-bench ops --op gemm and the
    # layer bench's decode rows (GDP_CALL_PAB_BATCHES, default 1,2,4,8,64) of a, then of b
    local round tree sk bbin
    bbin=$(b_bin "${GDP_CALL_PAB_TREE:-}")
    [ -x "$bbin/gdp-bench" ] || { echo "packab: no tree b ($bbin)"; return; }
    local tests=("1 test_gemm_gpu" "1 test_conv1d_gpu" "1 test_layer_tp_gpu_nccl_np1 --backend cuda --comm nccl"
        "2 test_layer_tp_gpu_np2 --backend cuda" "2 test_engine_gpu_np2 --backend cuda" "1 test_recurrent_gpu")
    [ "${GDP_CALL_PAB_TESTS:-all}" = gemv ] && tests=("1 test_gemm_gpu" "1 test_conv1d_gpu")
    local benv
    benv=$(side_env b)
    ( [ -z "$benv" ] || export $benv; run_gpu_tests "$bbin" pab "b: " "${tests[@]}" ) # b's tests under b's settings
    for round in $(seq 1 "${GDP_CALL_PAB_ROUNDS:-2}"); do
        for sk in ${GDP_CALL_PAB_SKINNY:-auto on}; do
            for tree in a b; do
                local bin=$P/main/bin
                [ $tree = b ] && bin=$bbin
                echo "## round $round tree $tree GDP_GEMM_SKINNY=$sk $(side_env $tree)" | tee -a "$OUT/pab_ops.log" >>"$OUT/pab_layer.log"
                [ "${GDP_CALL_PAB_OPS:-1}" = 1 ] && env $(side_env $tree) GDP_GEMM_SKINNY=$sk timeout 120 "$bin/gdp-bench" ops --op gemm >>"$OUT/pab_ops.log" 2>&1
                env $(side_env $tree) GDP_GEMM_SKINNY=$sk timeout 90 mpirun -n 1 "$bin/gdp-bench" layer "${layer_shape[@]}" \
                    -D ${GDP_CALL_PAB_BATCHES:-1,2,4,8,64} -P 64 >>"$OUT/pab_layer.log" 2>&1
            done
        done
    done
    grep -E "^## |^#  *op|gemm " "$OUT/pab_ops.log" | head -80
    grep -E "^## |^ *decode|wrong" "$OUT/pab_layer.log" | head -80
}
stage_decode() { decode_stage "$P/main/bin/test_recurrent_gpu" "$P/main/bin/gdp-bench" "$OUT"; } # (ab_lib.sh)
stage_opsdecode() { # gdp-bench ops --op decode of main, twice (the decode rows alone, without decode's tests)
    local r
    for r in 1 2; do
        echo "## round $r"
        timeout 60 "$P/main/bin/gdp-bench" ops --op decode 2>&1 | grep -E "^decode|rror"
    done | tee "$OUT/opsdecode.log"
}
stage_opsprefill() { # gdp-bench ops --op prefill of main under GDP_CALL_OPF_ENV (e.g. GDP_CHUNK_SEGMENT=off): the
    # prefill rows with each row's time by stage (the split's runs, fix-up and correction), twice
    local r
    for r in 1 2; do
        echo "## round $r ${GDP_CALL_OPF_ENV:-}"
        env ${GDP_CALL_OPF_ENV:-} timeout 120 "$P/main/bin/gdp-bench" ops --op prefill 2>&1
    done | tee -a "$OUT/opsprefill.log"
}
stage_segsweep() { # the split's segment length by measurement: the prefill rows that split (1 x 16384, mixed) of
    # tree GDP_CALL_SEG_TREE (default main) under each entry of GDP_CALL_SEG_LIST (default "auto 32 40 48 56 64 72 80"),
    # alternated, GDP_CALL_SEG_ROUNDS rounds (default 2): an entry S sets GDP_CHUNK_SEGMENT=S (auto: the op's own
    # choice, src/descriptors.c's estimate), S/F also GDP_CHUNK_SEGMENT_FIRST=F (the first segment's length, a tree
    # with kernels/chunk/pending/seg-first.patch)
    local r entry tree=${GDP_CALL_SEG_TREE:-main} first
    [ -x "$P/$tree/bin/gdp-bench" ] || { echo "segsweep: no tree $tree in the pack"; return; }
    for r in $(seq 1 "${GDP_CALL_SEG_ROUNDS:-2}"); do
        for entry in ${GDP_CALL_SEG_LIST:-auto 32 40 48 56 64 72 80}; do
            first=auto
            [ "${entry#*/}" = "$entry" ] || first=${entry#*/}
            echo "## round $r $tree GDP_CHUNK_SEGMENT=${entry%%/*} GDP_CHUNK_SEGMENT_FIRST=$first"
            GDP_CHUNK_SEGMENT=${entry%%/*} GDP_CHUNK_SEGMENT_FIRST=$first timeout 60 "$P/$tree/bin/gdp-bench" ops \
                --op prefill 2>&1 | grep -A1 -E "^prefill .*(1x16384|mixed)|rror|wrong"
        done
    done | tee "$OUT/segsweep.log"
}
stage_chunkab() { # a chunk-op change: each tree of GDP_CALL_CAB_TREE (space-separated)'s test_chunk_gpu on the Hopper
    # path and under auto, then gdp-bench ops --op prefill of main and of the trees alternated (GDP_CALL_CAB_ROUNDS,
    # default 2): the rows and their stages
    local trees=${GDP_CALL_CAB_TREE:?chunkab needs GDP_CALL_CAB_TREE} t r tree path tool
    for t in $trees; do
        # GDP_CALL_CAB_TESTS=0: none; GDP_CALL_CAB_PATHS: the test's paths (default "hopper auto")
        for path in $([ "${GDP_CALL_CAB_TESTS:-1}" = 1 ] && echo "${GDP_CALL_CAB_PATHS:-hopper auto}"); do
            GDP_TEST_CHUNK_PATH=$path timeout 240 "$P/$t/bin/test_chunk_gpu" >"$OUT/cab_test_${t}_$path.log" 2>&1
            echo "$t: GDP_TEST_CHUNK_PATH=$path test_chunk_gpu rc=$?"
            grep -E "checks|FAIL|Hopper kernel ran" "$OUT/cab_test_${t}_$path.log" | tail -4
        done
        # GDP_CALL_CAB_SANITIZE (e.g. "memcheck racecheck"): the tree's segment cases under each tool, kernels
        # GDP_CALL_CAB_KERNELS (default kns=hop_: the split's plan, fix-up and correction), on the trees of
        # GDP_CALL_CAB_SANITIZE_TREES (default all)
        [[ " ${GDP_CALL_CAB_SANITIZE_TREES:-$trees} " == *" $t "* ]] || continue
        for tool in ${GDP_CALL_CAB_SANITIZE:-}; do
            GDP_TEST_CHUNK_ONLY=segments GDP_TEST_CHUNK_REPEAT=0 chunk_sanitize "$tool" hopper "$P/$t/bin/test_chunk_gpu" \
                "$OUT/cab_${t}_$tool.log" 200 --kernel-name "${GDP_CALL_CAB_KERNELS:-kns=hop_}"
        done
    done
    for r in $(seq 1 "${GDP_CALL_CAB_ROUNDS:-2}"); do
        for tree in main $trees; do
            echo "## round $r tree $tree"
            timeout 120 "$P/$tree/bin/gdp-bench" ops --op prefill 2>&1 | grep -E "^prefill|chunk stages|rror|wrong"
        done
    done | tee "$OUT/cab_rows.log"
}
stage_layerenv() { # one setting of main (or of tree GDP_CALL_LE_TREE of the pack) against another in the layer: each
    # GDP_CALL_LE_ENVS entry (space-separated; VAR=VALUE[,VAR=VALUE...], "-" for none; default "-") runs the layer bench's
    # decode rows (GDP_CALL_LE_BATCHES, default 1,16,64,128,256) with each state dtype of GDP_CALL_LE_STATES (default
    # "fp32 bf16"), the entries alternated, GDP_CALL_LE_ROUNDS rounds (default 2)
    local r e sdt tree=${GDP_CALL_LE_TREE:-main}
    [ -x "$P/$tree/bin/gdp-bench" ] || { echo "layerenv: no tree $tree in the pack"; return; }
    for r in $(seq 1 "${GDP_CALL_LE_ROUNDS:-2}"); do
        for sdt in ${GDP_CALL_LE_STATES:-fp32 bf16}; do
            for e in ${GDP_CALL_LE_ENVS:--}; do
                echo "## round $r -S $sdt $e ($tree)"
                env $(setting_env "$e") timeout 90 mpirun -n 1 "$P/$tree/bin/gdp-bench" layer "${layer_shape[@]}" \
                    -S "$sdt" -D "${GDP_CALL_LE_BATCHES:-1,16,64,128,256}" -P 64 2>&1 | grep -E "^ +decode|rror|wrong"
            done
        done
    done | tee "$OUT/layerenv.log"
}
stage_decodeab() { # a decode-kernel change: tree GDP_CALL_DAB_TREE's test_recurrent_gpu, then gdp-bench ops --op decode
    # of main and of the tree alternated under each GDP_CALL_DECODE_KERNELS entry (default auto; KERNEL[,VAR=VALUE...]
    # as ab_lib.sh's decode_stage), then the layer bench's decode rows (GDP_CALL_DAB_BATCHES, default 1,64,256) with
    # an fp32 and a bf16 state under the same entries, GDP_CALL_DAB_ROUNDS rounds (default 2)
    local t=${GDP_CALL_DAB_TREE:?stage decodeab needs GDP_CALL_DAB_TREE, a tree of the pack} r tree kernel sdt
    run_gpu_tests "$P/$t/bin" dab "b: " "1 test_recurrent_gpu"
    for r in $(seq 1 "${GDP_CALL_DAB_ROUNDS:-2}"); do
        for kernel in ${GDP_CALL_DECODE_KERNELS:-auto}; do
            for tree in main "$t"; do
                echo "## round $r tree $tree $(decode_entry_name "$kernel")"
                with_decode_entry "$kernel" timeout 60 "$P/$tree/bin/gdp-bench" ops --op decode 2>&1 | grep -E "^decode|rror"
            done
        done
    done | tee "$OUT/dab_ops.log"
    for r in $(seq 1 "${GDP_CALL_DAB_ROUNDS:-2}"); do
        for kernel in ${GDP_CALL_DECODE_KERNELS:-auto}; do
            for sdt in fp32 bf16; do
                for tree in main "$t"; do
                    echo "## round $r tree $tree $(decode_entry_name "$kernel") -S $sdt"
                    with_decode_entry "$kernel" timeout 90 mpirun -n 1 "$P/$tree/bin/gdp-bench" layer "${layer_shape[@]}" \
                        -S "$sdt" -D "${GDP_CALL_DAB_BATCHES:-1,64,256}" -P 64 2>&1 | grep -E "^ +decode|rror|wrong"
                done
            done
        done
    done | tee "$OUT/dab_layer.log"
}
stage_sampab() { # the sampling kernels of main against tree GDP_CALL_SAMP_TREE: the tree's test_sampling_gpu, then
    # test_sampling_gpu --bench (stage 1 + 2, 256 rows) of both, alternated, GDP_CALL_SAMP_ROUNDS rounds (default 2)
    local tree=${GDP_CALL_SAMP_TREE:?stage sampab needs GDP_CALL_SAMP_TREE, a tree of the pack} r side
    run_gpu_tests "$P/$tree/bin" samp "b: " "1 test_sampling_gpu"
    for r in $(seq 1 "${GDP_CALL_SAMP_ROUNDS:-2}"); do
        for side in main "$tree"; do
            echo "## round $r tree $side"
            timeout 120 "$P/$side/bin/test_sampling_gpu" --bench 2>&1 | grep -vE "^$"
        done
    done | tee "$OUT/sampab.log"
}
stage_fusedrace() { # racecheck of the fused kernel's first launches on every tree (the fused-* experiments)
    local tree_dir tree
    for tree_dir in "$P"/*/; do
        tree=$(basename "$tree_dir")
        [ -x "$tree_dir/bin/test_chunk_gpu" ] || continue
        echo "## tree $tree"
        chunk_sanitize racecheck fused "$tree_dir/bin/test_chunk_gpu" \
            "$OUT/fusedrace_$tree.log" "${GDP_CALL_FUSEDRACE_TIMEOUT:-100}" --kernel-name kns=chunk_fused \
            --launch-count "${GDP_CALL_FUSEDRACE_LAUNCHES:-6}" # (ab_lib.sh)
    done
}
stage_engine() {
    timeout 150 mpirun -n 2 "$P/main/bin/test_engine_gpu_np2" --backend cuda >"$OUT/engine.log" 2>&1
    echo "test_engine_gpu_np2 rc=$?"
    tail -3 "$OUT/engine.log"
}
# issue 11's serving model and its two workloads (stages serve and ranks2)
serve_model=(--layers 8 --hidden 2048 --heads 16 --groups 4 --head-dim 128 --state-dim 128 --householder 2
             --vocab 32000)
serve_mixed="--slots 64 --budget 2048 --prefill-chunk 1024 --workload synthetic:n=256,rate=0,prompt=128-2048,new=128,seed=7"
serve_decode="--slots 128 --budget 1152 --prefill-chunk 1024 --workload synthetic:n=128,rate=0,prompt=64-128,new=512,seed=3"
stage_serve() {
    local ckpt=/tmp/gdp_serve_model.safetensors
    "$P/main/bin/gdp-run" "${serve_model[@]}" --write-model "$ckpt" >/dev/null
    for v in "" "--preempt-wait-ms 200" "--preempt-wait-ms 200 --swap-memory host" "--preempt-wait-ms 100" \
        "--preempt-wait-ms 200 --preempt-after 32" "--preempt-wait-ms 0"; do
        echo "## mixed $v" >>"$OUT/serve.log"
        timeout 60 "$P/main/bin/gdp-run" --model "$ckpt" --progress 0 $serve_mixed $v >>"$OUT/serve.log" 2>&1
    done
    grep -E "^## |wall time|time to first|preemptions" "$OUT/serve.log"
}
stage_serveab() { # the two serving workloads of main of a (GDP_CALL_PACK) against b (main of GDP_CALL_PACK_B, or
    # the first pack's tree GDP_CALL_SA_TREE),
    # alternated a, b for GDP_CALL_SA_ROUNDS rounds (default 2), default options: an engine change's A/B
    local ckpt=/tmp/gdp_serve_model.safetensors round tree w bin bbin
    bbin=$(b_bin "${GDP_CALL_SA_TREE:-}")
    [ -x "$bbin/gdp-run" ] || { echo "serveab: no tree b ($bbin)"; return; }
    "$P/main/bin/gdp-run" "${serve_model[@]}" --write-model "$ckpt" >/dev/null
    for round in $(seq 1 "${GDP_CALL_SA_ROUNDS:-2}"); do
        for w in decode mixed; do
            for tree in a b; do
                bin=$P/main/bin
                [ $tree = b ] && bin=$bbin
                echo "## round $round tree $tree $w" >>"$OUT/serveab.log"
                if [ $w = decode ]; then set -- $serve_decode; else set -- $serve_mixed; fi
                env $(side_env $tree) timeout 120 "$bin/gdp-run" --model "$ckpt" --progress 0 "$@" >>"$OUT/serveab.log" 2>&1
            done
        done
    done
    grep -E "^## |wall time|time to first|time per output|throughput|^steps|^  [a-z]|floor" "$OUT/serveab.log" | grep -v "^  rank\|^  [0-9]"
}
# ranks2_run RANKS TREE LABEL WORKLOAD: gdp-run of TREE on RANKS ranks into ranks2.log (stage ranks2)
ranks2_run() {
    echo "## tree $2$3: $1 rank(s): $4" >>"$OUT/ranks2.log"
    timeout "${GDP_CALL_RANKS2_TIMEOUT:-120}" mpirun -n "$1" "$P/$2/bin/gdp-run" "${serve_model[@]}" $4 --progress 10 \
        >>"$OUT/ranks2.log" 2>&1
    echo "rc=$?" >>"$OUT/ranks2.log"
}
stage_ranks2() { # issue 11's multi-rank figures on one GPU: two ranks share it over the MPI comm (host-staged)
    local t
    [ -n "${GDP_CALL_RANKS2_TESTS-x}" ] && for t in "test_comm_mpi_gpu_np2 --device" "test_layer_cp_gpu_np2 --backend cuda" \
        "test_layer_tp_gpu_np2 --backend cuda" "test_layer_tp_gpu_sp_np2 --backend cuda --sp"; do
        timeout 120 mpirun -n 2 "$P/main/bin/"$t >"$OUT/ranks2_${t%% *}.log" 2>&1
        echo "$t rc=$?"
        grep -E "checks|FAIL|skipped" "$OUT/ranks2_${t%% *}.log" | tail -3
    done
    local w round tree trees=${GDP_CALL_RANKS2_TREES:-main}
    for round in $(seq "${GDP_CALL_RANKS2_ROUNDS:-1}"); do
        for tree in ${trees//:/ }; do
            echo "## tree $tree round $round: gdp-bench coll, 2 ranks" >>"$OUT/ranks2.log"
            timeout 60 mpirun -n 2 "$P/$tree/bin/gdp-bench" coll --backend cuda --hidden 2048 --tokens 1,64,1024,2048 \
                -w 2 -i 5 >>"$OUT/ranks2.log" 2>&1
            for w in "$serve_mixed" "$serve_decode"; do ranks2_run 2 "$tree" " round $round" "$w"; done
        done
    done
    # one rank: NCCL, graphs (the reference the two-rank figures compare with)
    for w in "$serve_mixed" "$serve_decode"; do ranks2_run 1 main "" "$w"; done
    grep -E "^ +(allreduce|reduce_scatter|allgather) |^## |^rc=|wall time|time to first|time per output|^  [a-z +]+ +[0-9.]+ s " \
        "$OUT/ranks2.log"
}
stage_layer() {
    for sk in off on; do
        echo "## GDP_GEMM_SKINNY=$sk" >>"$OUT/layer.log"
        GDP_GEMM_SKINNY=$sk timeout 90 mpirun -n 1 "$P/main/bin/gdp-bench" layer "${layer_shape[@]}" \
            -D 1,8,64,256 -P 2048,16384 >>"$OUT/layer.log" 2>&1
    done
    grep -E "^## |decode|prefill" "$OUT/layer.log" | head -30
}
stage_normgemm() { # the norm-GEMV (kernels/gemv.cu): its tests, then the layer's decode rows under each GDP_NORM_GEMM
    local mode round skinny
    [ "${GDP_CALL_NG_OPS:-1}" = 0 ] || timeout 120 "$P/main/bin/gdp-bench" ops --op gemm >"$OUT/ops_gemm.log" 2>&1
    echo "gdp-bench ops --op gemm rc=$?"
    grep -E "^#  *op|normgemm|gemm  *(in|out)_proj" "$OUT/ops_gemm.log"
    timeout 120 "$P/main/bin/test_gemm_gpu" >"$OUT/gemm.log" 2>&1
    echo "test_gemm_gpu rc=$?"
    grep -E "checks|FAIL|GDP_NORM_GEMM=" "$OUT/gemm.log" | tail -4
    local tests=("1 test_layer_tp_gpu_nccl_np1 --backend cuda --comm nccl" "2 test_layer_tp_gpu_np2 --backend cuda"
        "2 test_layer_tp_gpu_sp_np2 --backend cuda --sp" "2 test_engine_gpu_np2 --backend cuda" "2 test_layer_cp_gpu_np2 --backend cuda"
        "1 test_recurrent_gpu")
    [ "${GDP_CALL_NG_TESTS:-1}" = quick ] && tests=("${tests[0]}" "${tests[3]}") # one layer test and the engine's
    [ "${GDP_CALL_NG_TESTS:-1}" = 0 ] || run_gpu_tests "$P/main/bin" ng "" "${tests[@]}"
    local tree
    for round in 1 2; do
        for tree in ${GDP_CALL_NG_TREES:-main}; do # the pack's trees, each under every mode
            for mode in ${GDP_CALL_NG_MODES:-chain serial pdl}; do # a mode "X+skinny" also sets GDP_GEMM_SKINNY=on, "X+blas" off
                echo "## round $round tree $tree GDP_NORM_GEMM=$mode" >>"$OUT/layer_ng.log"
                skinny=auto
                [ "${mode%+skinny}" = "$mode" ] || skinny=on
                [ "${mode%+blas}" = "$mode" ] || skinny=off
                GDP_NORM_GEMM=${mode%+*} GDP_GEMM_SKINNY=$skinny timeout 90 mpirun -n 1 "$P/$tree/bin/gdp-bench" layer \
                    "${layer_shape[@]}" -D ${GDP_CALL_NG_BATCHES:-1,2,4,8,64} -P 2048 >>"$OUT/layer_ng.log" 2>&1
            done
        done
    done
    grep -E "^## |decode|prefill|wrong" "$OUT/layer_ng.log" | head -150 # (two trees, three modes: 84 lines)
}
stage_ncuop() { # ncu's durations of the decode kernels over the op bench's decode-key rows (each kernel alone) of tree
    # GDP_CALL_NCUOP_TREE (default main) under each GDP_CALL_NCUOP_ENVS entry (VAR=VALUE[,VAR=VALUE...], "-" for none;
    # default "GDP_DECODE_STATE=rows GDP_DECODE_STATE=ring") and each ncu cache control of GDP_CALL_NCUOP_CACHE
    # (default "all none"): whether a kernel's cost alone (ncu) against its graph rows (it after itself) is its caches
    local tree=${GDP_CALL_NCUOP_TREE:-main} e cc n=0
    [ -x "$P/$tree/bin/gdp-bench" ] || { echo "ncuop: no tree $tree in the pack"; return; }
    for e in ${GDP_CALL_NCUOP_ENVS:-GDP_DECODE_STATE=rows GDP_DECODE_STATE=ring}; do
        for cc in ${GDP_CALL_NCUOP_CACHE:-all none}; do
            n=$((n + 1))
            env $(setting_env "$e") timeout 120 ncu --clock-control none --cache-control "$cc" \
                -k regex:recurrent --launch-count 300 --metrics gpu__time_duration.sum --csv "$P/$tree/bin/gdp-bench" ops \
                --op decode-key -i 10 -w 3 >"$OUT/ncuop_$n.csv" 2>"$OUT/ncuop_$n.err"
            echo "## $e, ncu --cache-control $cc ($tree): rc=$? (decode-key rows in order, 15 launches a row)"
            python3 launch/ncu_durations.py --order "$OUT/ncuop_$n.csv" | awk '{print $NF}' | tr '\n' ' '
            echo
        done
    done | tee "$OUT/ncuop.log"
}
stage_ncustall() { # ncu's warp stall reasons (cycles a warp waits per issued instruction, by reason) of the decode
    # kernel on the op bench's decode-key rows of tree GDP_CALL_NCUOP_TREE (default main) under each GDP_CALL_NCUOP_ENVS
    # entry and ncu cache control (as stage_ncuop), on launch GDP_CALL_NCUSTALL_SKIPS (default "5 20": skipped launches;
    # decode-key runs 15 launches a row, B = 1 first, then fp32 B = 256): a kernel slower with every cache flushed
    # than with the L2 alone flushed (stage_ncuop) shows which wait grows (no_instruction: the instruction caches).
    # ncu replays the launch over several passes for these metrics: under none the duration is the first (cold)
    # pass's and the stall samples are later, warm passes'; stage_ncuop's single-metric runs give the warm duration
    local tree=${GDP_CALL_NCUOP_TREE:-main} e cc skip n=0 metrics
    [ -x "$P/$tree/bin/gdp-bench" ] || { echo "ncustall: no tree $tree in the pack"; return; }
    metrics=$(python3 launch/ncu_durations.py --metrics)
    for e in ${GDP_CALL_NCUOP_ENVS:-GDP_DECODE_STATE=rows GDP_DECODE_STATE=ring}; do
        for skip in ${GDP_CALL_NCUSTALL_SKIPS:-5 20}; do
            for cc in ${GDP_CALL_NCUOP_CACHE:-all none}; do
                n=$((n + 1))
                env $(setting_env "$e") timeout 120 ncu --clock-control none --cache-control "$cc" -k regex:recurrent \
                    --launch-skip "$skip" --launch-count 1 --csv --metrics "$metrics" \
                    "$P/$tree/bin/gdp-bench" ops --op decode-key -i 10 -w 3 >"$OUT/ncustall_$n.csv" 2>"$OUT/ncustall_$n.err"
                echo "## $e, launch $skip, ncu --cache-control $cc ($tree): rc=$? (us, warp instructions, stall cycles an issue)"
                python3 launch/ncu_durations.py --stalls "$OUT/ncustall_$n.csv"
            done
        done
    done | tee "$OUT/ncustall.log"
}
stage_layerstall() { # ncu's warp stall reasons of every kernel of main's layer bench (decode rows
    # GDP_CALL_PROF_BATCHES, default 1), in launch order, under each ncu cache control of GDP_CALL_NCUOP_CACHE (default
    # "all none"): how much of each kernel's issue time waits on instruction fetch (no_instruction) when its SM's
    # caches are cold, as between the step's kernels (kernels/NOTES-ops.md, forty-seventh session)
    local cc metrics
    metrics=$(python3 launch/ncu_durations.py --metrics)
    for cc in ${GDP_CALL_NCUOP_CACHE:-all none}; do
        timeout 300 ncu --clock-control none --cache-control "$cc" --csv --metrics "$metrics" \
            "$P/main/bin/gdp-bench" layer "${layer_shape[@]}" -D "${GDP_CALL_PROF_BATCHES:-1}" -P 64 -w 1 -i 1 -c 0 \
            >"$OUT/layerstall_$cc.csv" 2>"$OUT/layerstall_$cc.err"
        echo "## ncu --cache-control $cc: rc=$? (us, warp instructions, stall cycles an issue: no_instruction, then the largest)"
        python3 launch/ncu_durations.py --stalls "$OUT/layerstall_$cc.csv"
    done | tee "$OUT/layerstall.log"
}
stage_profile() { # ncu's duration of every kernel of main's layer bench, in launch order (decode rows GDP_CALL_PROF_BATCHES)
    timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv "$P/main/bin/gdp-bench" layer \
        "${layer_shape[@]}" -D "${GDP_CALL_PROF_BATCHES:-1,128}" -P 64 -w 1 -i 1 -c 0 \
        >"$OUT/profile_layer.csv" 2>"$OUT/profile_layer.err"
    echo "ncu layer rc=$?"
    python3 launch/ncu_durations.py --order "$OUT/profile_layer.csv"
    # gdp-run's decode-heavy step (8 layers, head and sampling), a few new tokens: per kernel name, count and median
    local ckpt=/tmp/ab_call_model.safetensors
    "$P/main/bin/gdp-run" --layers 8 --hidden 2048 --heads 16 --groups 4 --head-dim 128 --state-dim 128 \
        --householder 2 --vocab 32000 --write-model "$ckpt" >/dev/null 2>&1
    timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv "$P/main/bin/gdp-run" --model "$ckpt" \
        --progress 0 --slots 128 --budget 1152 --prefill-chunk 1024 \
        --workload synthetic:n=128,rate=0,prompt=64-128,new=${GDP_CALL_PROF_NEW:-6},seed=3 \
        >"$OUT/profile_run.csv" 2>"$OUT/profile_run.err"
    echo "ncu gdp-run rc=$?"
    python3 launch/ncu_durations.py "$OUT/profile_run.csv" | head -40
}
stage_split() { # the layer bench's decode rows as micro-batches on their own streams (gdp-bench layer --split)
    local n round bps
    for round in 1 2; do
        for bps in ${GDP_CALL_SPLIT_BPS:-0 1 items}; do
        for n in ${GDP_CALL_SPLITS:-2 4}; do
            echo "## round $round --split $n GDP_DECODE_BLOCKS_PER_SM=$bps" >>"$OUT/layer_split.log"
            GDP_DECODE_BLOCKS_PER_SM=$bps timeout 120 mpirun -n 1 "$P/main/bin/gdp-bench" layer "${layer_shape[@]}" \
                -D ${GDP_CALL_SPLIT_BATCHES:-8,64,128,256} -P 64 -c 0 -x "$n" >>"$OUT/layer_split.log" 2>&1
            echo "split $n bps $bps rc=$?"
        done
        done
    done
    grep -E "^## |^ *decode|split:" "$OUT/layer_split.log" | head -60
}
stage_gemmfront() { # in_proj with the decode front (GDP_GEMM_FRONT): its tests, then the layer's decode rows
    local mode round skinny
    timeout 150 "$P/main/bin/test_conv1d_gpu" >"$OUT/gf_conv.log" 2>&1
    echo "test_conv1d_gpu rc=$?"
    grep -E "checks|FAIL|in_proj \+ decode front" "$OUT/gf_conv.log" | tail -10
    (export GDP_GEMM_FRONT=fused
     run_gpu_tests "$P/main/bin" gf "GDP_GEMM_FRONT=fused " "1 test_layer_tp_gpu_nccl_np1 --backend cuda --comm nccl" \
         "2 test_layer_tp_gpu_np2 --backend cuda" "2 test_engine_gpu_np2 --backend cuda")
    for round in 1 2; do
        for mode in chain skinny fused; do # chain: cuBLASLt in_proj and the front; skinny: the skinny GEMV and the front
            echo "## round $round $mode" >>"$OUT/layer_gf.log"
            skinny=auto
            [ "$mode" = chain ] || skinny=on
            GDP_GEMM_FRONT=${mode/skinny/chain} GDP_GEMM_SKINNY=$skinny timeout 90 mpirun -n 1 "$P/main/bin/gdp-bench" layer \
                "${layer_shape[@]}" -D ${GDP_CALL_GF_BATCHES:-1,2,4,8} -P 64 >>"$OUT/layer_gf.log" 2>&1
        done
    done
    grep -E "^## |^ *decode|wrong" "$OUT/layer_gf.log" | head -60
}
stage_floor() { # what a kernel boundary costs against a grid barrier (kernels/dev/launch_floor.cu, built here: seconds)
    nvcc -O3 -arch=sm_90 -o /tmp/launch_floor kernels/dev/launch_floor.cu >"$OUT/floor.log" 2>&1 &&
        timeout 120 /tmp/launch_floor >>"$OUT/floor.log" 2>&1
    echo "launch_floor rc=$?"
    cat "$OUT/floor.log"
}
stage_python() { # the Python package on the GPU: its torch tests and the decode bench beside the C call (issue 14's
    # "within 1 us" row), against a libgdp.so linked here from the pack's static library (its objects are PIC)
    g++ -shared -o /tmp/libgdp.so -Wl,--whole-archive "$P/main/libgdp.a" -Wl,--no-whole-archive \
        -L/usr/local/cuda/lib64 -L/usr/local/cuda/targets/x86_64-linux/lib -lcudart -lcublasLt -lnccl \
        -L"$JANSSON_HOME/lib/x86_64-linux-gnu" -ljansson -lopenblas $(mpicc --showme:link 2>/dev/null) -lstdc++ -lm \
        >"$OUT/python.log" 2>&1
    echo "libgdp.so link rc=$?"
    if python3 -c "import pytest" 2>/dev/null; then
        GDP_LIBRARY=/tmp/libgdp.so timeout 200 python3 -m pytest -q -rs python/tests/test_torch_gpu.py >>"$OUT/python.log" 2>&1
        echo "pytest test_torch_gpu.py rc=$?"
    else
        echo "no pytest on this machine: test_torch_gpu.py not run"
    fi
    (cd python/tests && GDP_LIBRARY=/tmp/libgdp.so PYTHONPATH=$PWD/.. timeout 120 python3 bench_decode_gpu.py) >>"$OUT/python.log" 2>&1
    echo "bench_decode_gpu.py rc=$?"
    tail -12 "$OUT/python.log"
}
stage_gemvprof() { # ncu's detail of the layer's one-row kernels (why the projections run at a third of the copy rate)
    local env
    for env in ${GDP_CALL_GEMVPROF_ENVS:-GDP_GEMM_SKINNY=auto GDP_GEMM_SKINNY=on}; do
        echo "## $env" >>"$OUT/gemvprof.txt"
        env $env timeout 200 ncu --clock-control none --set detailed \
            --kernel-name regex:"norm_gemv|nvjet|gemv_nt|decode_core|recurrent_rows|norm_fast" --launch-count 12 \
            "$P/main/bin/gdp-bench" layer "${layer_shape[@]}" -D 1 -P 64 -w 1 -i 1 -c 0 \
            >>"$OUT/gemvprof.txt" 2>&1
        echo "ncu gemvprof $env rc=$?"
    done
    grep -E "^## |^  [a-zA-Z_<].*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued|One or More Eligible|Theoretical Occupancy" \
        "$OUT/gemvprof.txt" | head -150
}
stage_ngsrc() { # ncu's full set with source counters on kernels of the layer bench (default: the B = 1 out_proj norm-GEMV)
    local mode
    local tree=${GDP_CALL_NGSRC_TREE:-main}
    for mode in ${GDP_CALL_NGSRC_MODES:-auto}; do
        GDP_NORM_GEMM=$mode timeout 200 ncu --clock-control none --set full --import-source no \
            --kernel-name regex:"${GDP_CALL_NGSRC_KERNEL:-norm_gemv}" --launch-skip "${GDP_CALL_NGSRC_SKIP:-2}" \
            --launch-count "${GDP_CALL_NGSRC_COUNT:-1}" -o "$OUT/ngsrc_$mode" "$P/$tree/bin/gdp-bench" layer \
            "${layer_shape[@]}" -D "${GDP_CALL_NGSRC_D:-1}" -P 64 -w 1 -i 1 -c 0 \
            >"$OUT/ngsrc_$mode.log" 2>&1
        echo "ncu ngsrc $mode rc=$?"
        ncu --import "$OUT/ngsrc_$mode.ncu-rep" --page details >"$OUT/ngsrc_${mode}_details.txt" 2>&1
        ncu --import "$OUT/ngsrc_$mode.ncu-rep" --page source --print-source sass --csv >"$OUT/ngsrc_${mode}_sass.csv" 2>&1
        echo "## $tree $mode"
        grep -E "^  [a-zA-Z_<].*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Stall" \
            "$OUT/ngsrc_${mode}_details.txt" | head -40
    done
}
stage_gemvfloor() { # the one-to-four-row GEMV forms against a plain read (kernels/dev/gemv_floor.cu, built here: seconds),
    # the weights from DRAM, then (GDP_CALL_GF_L2=1, the default) as L2 hits
    nvcc -O3 -arch=sm_90 -diag-suppress 128 -Iinclude -Ikernels -o /tmp/gemv_floor kernels/dev/gemv_floor.cu >"$OUT/gemv_floor.log" 2>&1 &&
        timeout 120 /tmp/gemv_floor >>"$OUT/gemv_floor.log" 2>&1 &&
        { [ "${GDP_CALL_GF_L2:-1}" = 0 ] || timeout 120 /tmp/gemv_floor l2 >>"$OUT/gemv_floor.log" 2>&1; }
    echo "gemv_floor rc=$?"
    cat "$OUT/gemv_floor.log"
}
stage_gemmskinny() { # cuBLASLt's algorithms for the decode projections (kernels/dev/gemm_skinny.cu, built here: seconds)
    nvcc -O3 -arch=sm_90 -o /tmp/gemm_skinny kernels/dev/gemm_skinny.cu -lcublasLt >"$OUT/gemm_skinny.log" 2>&1 &&
        timeout 240 /tmp/gemm_skinny "${GDP_CALL_GS_ROWS:-8,32,64,128,256}" >>"$OUT/gemm_skinny.log" 2>&1
    echo "gemm_skinny rc=$?"
    cat "$OUT/gemm_skinny.log"
}
stage_ab() {
    GDP_AB_TESTS=last GDP_AB_SEGMENTS="${GDP_CALL_AB_SEGMENTS:-off auto}" \
        GDP_AB_ROUNDS="${GDP_CALL_AB_ROUNDS:-2}" timeout 400 launch/prebuilt.sh ab "$P" >"$OUT/ab.log" 2>&1
    echo "ab rc=$?"
    cp "$OUT/hopper_ab_table.md" "$OUT/ab_table.md" 2>/dev/null
    cat "$OUT/ab_table.md"
    grep -E "^## .*test_chunk|FAIL|checks|Hopper kernel ran" "$OUT/ab.log" | head -20
}
for st in ${GDP_CALL_STAGES:-ab engine serve layer}; do
    "stage_$st"
    save_logs "$st"
done
