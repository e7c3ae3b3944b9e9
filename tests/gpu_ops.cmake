# GPU tests of the prepare, decode (fused recurrent), conv1d and norm CUDA kernels: one program
# per op family (test_<family>_gpu.c beside test_<family>_cpu.c), sharing test_gpu.{h,c}. Each
# compares the CUDA backend with the golden files and the CPU backend; without a GPU it exits 77
# (skipped).
foreach(family prepare recurrent conv1d norm)
  gdp_add_test(test_${family}_gpu LABEL gpu)
endforeach()
# The bf16 ssm cache against the fp32 one over 1,000 decode steps of a two-layer stack
# (relative RMS of outputs and states at steps 1, 10, 100, 1000; docs/performance.md).
gdp_add_test(test_decode_drift_gpu LABEL gpu)
# The projection GEMM's two CUDA paths (the skinny kernel for a few rows, cuBLASLt) against a
# double-precision product (tests/test_gemm_gpu.c).
gdp_add_test(test_gemm_gpu LABEL gpu)
