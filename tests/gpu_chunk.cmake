# GPU tests of the CUDA chunked prefill and cumsum (tests/test_chunk_gpu.c): golden files, the
# CPU backend as reference, cache mode, padding, CUDA graphs. Exit 77 (skip) without a GPU.
gdp_add_test(test_chunk_gpu LABEL gpu)
