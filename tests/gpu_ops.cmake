# GPU tests of the prepare, decode (fused recurrent), conv1d and norm CUDA kernels: one
# program (test_ops_gpu.c), one CTest entry per op family (its first argument). Each compares
# the CUDA backend with the golden files and the CPU backend; without a GPU it exits 77
# (skipped). Properties as gdp_add_test gives a one-process gpu test.
add_executable(test_ops_gpu test_ops_gpu.c)
target_link_libraries(test_ops_gpu PRIVATE gdp_test_common)
foreach(family prepare decode conv norm)
  add_test(NAME test_${family}_gpu COMMAND test_ops_gpu ${family})
  set_tests_properties(test_${family}_gpu PROPERTIES LABELS gpu TIMEOUT 600 SKIP_RETURN_CODE 77
                       ENVIRONMENT "NCCL_NVLS_ENABLE=0" RESOURCE_GROUPS "gpus:1")
endforeach()
# The bf16 ssm cache against the fp32 one over 1,000 decode steps of a two-layer stack
# (relative RMS of outputs and states at steps 1, 10, 100, 1000; docs/performance.md).
add_executable(test_decode_drift_gpu test_decode_drift_gpu.c)
target_link_libraries(test_decode_drift_gpu PRIVATE gdp_test_common)
add_test(NAME test_decode_drift_gpu COMMAND test_decode_drift_gpu)
set_tests_properties(test_decode_drift_gpu PROPERTIES LABELS gpu TIMEOUT 600 SKIP_RETURN_CODE 77
                     ENVIRONMENT "NCCL_NVLS_ENABLE=0" RESOURCE_GROUPS "gpus:1")
