# Token sampling (include/gdp/sampling.h): one source, two programs. test_sampling runs the
# CPU reference; test_sampling_gpu the CUDA kernels against it (exit 77 without a GPU;
# `test_sampling_gpu --bench` times stage 1 + 2, not a test).
gdp_add_test(test_sampling SOURCES test_sampling.c LABEL cpu)
gdp_add_test(test_sampling_gpu SOURCES test_sampling.c LABEL gpu)
target_compile_definitions(test_sampling_gpu PRIVATE GDP_TEST_SAMPLING_GPU=1)
