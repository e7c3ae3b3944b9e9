# The tensor-parallel GDP layer on the CUDA backend (labels gpu;mpi): test_layer_tp.c with
# --backend cuda runs the TP stack and a TP = 1 stack on the GPU plus a TP = 1 stack on the
# CPU backend, under the GPU bars of gdp-math.md 8.1. np2 and np4 use the MPI comm with
# device buffers (host-staged, so the ranks may share GPU 0); np1 uses NCCL. Every rank
# exits 77 (skipped) without a GPU, or without NCCL for the NCCL variant.
gdp_add_test(test_layer_tp_gpu_nccl_np1 SOURCES test_layer_tp.c layer_harness.c LABEL "gpu;mpi" NPROCS 1 TIMEOUT 300
             ARGS --backend cuda --comm nccl)
gdp_add_test(test_layer_tp_gpu_np2 SOURCES test_layer_tp.c layer_harness.c LABEL "gpu;mpi" NPROCS 2 TIMEOUT 300 ARGS --backend cuda)
gdp_add_test(test_layer_tp_gpu_np4 SOURCES test_layer_tp.c layer_harness.c LABEL "gpu;mpi" NPROCS 4 TIMEOUT 300 ARGS --backend cuda)
gdp_add_test(test_layer_tp_gpu_sp_np2 SOURCES test_layer_tp.c layer_harness.c LABEL "gpu;mpi" NPROCS 2 TIMEOUT 300
             ARGS --backend cuda --sp)
