# Chunk family tests: the chunked prefill CPU reference against the per-token recurrence
# (double math, varlen, cache mode, chunk states, bad inputs), the L2 norm and the
# chunk-local cumsums; and the CPU op and oracle against the chunk_* golden files.
gdp_add_test(test_chunk_cpu LABEL cpu)
gdp_add_test(test_golden_chunk LABEL cpu)
