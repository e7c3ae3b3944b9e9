# Context-parallel layer tests (src/layer.c, dist/shard.c; docs/cp.md): test_layer_cp.c runs a
# tp x cp job (rank = tp_rank + tp * cp_rank) against a TP = CP = 1 stack on every rank, over
# uneven varlen packs, chunked prefill, decode, prefix snapshots, draft tokens and greedy
# generation with the decode requests sharded over the CP ranks (gdp-math.md 8.1 CPU bars).
#   np2: cp = 2 (G/tp = 4 >= cp) and --groups 1 (G/tp = 1 < cp: the group replicated);
#   np4: tp = 2 x cp = 2, all-reduce (G/tp = 2 = cp) and sequence parallel with --groups 2
#        (G/tp = 1 < cp); tp = 1 x cp = 4 with --groups 2 (each group on 2 CP ranks).
gdp_add_test(test_layer_cp_np2 SOURCES test_layer_cp.c layer_harness.c LABEL mpi NPROCS 2 TIMEOUT 180)
gdp_add_test(test_layer_cp_g1_np2 SOURCES test_layer_cp.c layer_harness.c LABEL mpi NPROCS 2 TIMEOUT 180 ARGS --groups 1)
gdp_add_test(test_layer_cp_tp2_np4 SOURCES test_layer_cp.c layer_harness.c LABEL mpi NPROCS 4 TIMEOUT 300 ARGS --tp 2)
gdp_add_test(test_layer_cp_tp2_sp_g2_np4 SOURCES test_layer_cp.c layer_harness.c LABEL mpi NPROCS 4 TIMEOUT 300
             ARGS --tp 2 --sp --groups 2)
gdp_add_test(test_layer_cp_cp4_g2_np4 SOURCES test_layer_cp.c layer_harness.c LABEL mpi NPROCS 4 TIMEOUT 300 ARGS --groups 2)
# The same on the CUDA backend (labels gpu;mpi): both stacks on the GPU plus a CPU TP = 1 stack,
# the MPI comm with device buffers (host-staged, so the ranks may share one GPU), the GPU bars
# of gdp-math.md 8.1. Every rank exits 77 (skipped) without a GPU.
gdp_add_test(test_layer_cp_gpu_np2 SOURCES test_layer_cp.c layer_harness.c LABEL "gpu;mpi" NPROCS 2 TIMEOUT 300
             ARGS --backend cuda)
gdp_add_test(test_layer_cp_gpu_tp2_g2_np4 SOURCES test_layer_cp.c layer_harness.c LABEL "gpu;mpi" NPROCS 4 TIMEOUT 300
             ARGS --backend cuda --tp 2 --groups 2)
# gdp-run and gdp-bench layer with --cp on the CPU backend (mpi): the engine over a tp x cp job
# must pass its decode vs recompute self check, and the layer benchmark must count no output
# element off its TP = 1 stack's (both exit non-zero otherwise; a header saying cp 1 fails too).
if(TARGET gdp-run AND TARGET gdp-bench)
  set(_gdp_cp_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
  add_test(NAME gdp_run_cp2_np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe $<TARGET_FILE:gdp-run>
                   --backend cpu --cp 2 --check 4 --draft 2 --progress 0
                   --workload synthetic:n=6,rate=0,prompt=16-200,new=8,seed=2)
  add_test(NAME gdp_bench_layer_tp2_cp2_np4
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe $<TARGET_FILE:gdp-bench>
                   layer -b cpu --cp 2 -D 1,4 -P 64,128 -w 1 -i 2)
  set_tests_properties(gdp_run_cp2_np2 PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 120 ENVIRONMENT "${_gdp_cp_env}"
                       FAIL_REGULAR_EXPRESSION "MISMATCH;tp [0-9]+ x cp 1")
  set_tests_properties(gdp_bench_layer_tp2_cp2_np4 PROPERTIES LABELS mpi PROCESSORS 4 TIMEOUT 120
                       ENVIRONMENT "${_gdp_cp_env}" FAIL_REGULAR_EXPRESSION "FAILED;tp [0-9]+ x cp 1 ")
endif()
