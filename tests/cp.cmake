# Context-parallel layer tests (src/layer.c, dist/shard.c; docs/cp.md): test_layer_cp.c runs a
# tp x cp job (rank = tp_rank + tp * cp_rank) against a TP = CP = 1 stack on every rank, over
# uneven varlen packs, chunked prefill, decode, prefix snapshots, draft tokens and greedy
# generation with the decode requests sharded over the CP ranks (gdp-math.md 8.1 CPU bars).
#   np2: cp = 2 (G/tp = 4 >= cp) and --groups 1 (G/tp = 1 < cp: the group replicated);
#   np4: tp = 2 x cp = 2, all-reduce (G/tp = 2 = cp) and sequence parallel with --groups 2
#        (G/tp = 1 < cp); tp = 1 x cp = 4 with --groups 2 (each group on 2 CP ranks).
gdp_add_test(test_layer_cp_np2 SOURCES test_layer_cp.c LABEL mpi NPROCS 2 TIMEOUT 180)
gdp_add_test(test_layer_cp_g1_np2 SOURCES test_layer_cp.c LABEL mpi NPROCS 2 TIMEOUT 180 ARGS --groups 1)
gdp_add_test(test_layer_cp_tp2_np4 SOURCES test_layer_cp.c LABEL mpi NPROCS 4 TIMEOUT 300 ARGS --tp 2)
gdp_add_test(test_layer_cp_tp2_sp_g2_np4 SOURCES test_layer_cp.c LABEL mpi NPROCS 4 TIMEOUT 300
             ARGS --tp 2 --sp --groups 2)
gdp_add_test(test_layer_cp_cp4_g2_np4 SOURCES test_layer_cp.c LABEL mpi NPROCS 4 TIMEOUT 300 ARGS --groups 2)
# The same on the CUDA backend (labels gpu;mpi): both stacks on the GPU plus a CPU TP = 1 stack,
# the MPI comm with device buffers (host-staged, so the ranks may share one GPU), the GPU bars
# of gdp-math.md 8.1. Every rank exits 77 (skipped) without a GPU.
gdp_add_test(test_layer_cp_gpu_np2 SOURCES test_layer_cp.c LABEL "gpu;mpi" NPROCS 2 TIMEOUT 300
             ARGS --backend cuda)
gdp_add_test(test_layer_cp_gpu_tp2_g2_np4 SOURCES test_layer_cp.c LABEL "gpu;mpi" NPROCS 4 TIMEOUT 300
             ARGS --backend cuda --tp 2 --groups 2)
