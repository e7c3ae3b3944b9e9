# CPU reference tests of the prepare, decode (fused recurrent), conv1d and norm ops:
# golden vectors from ../shared/golden plus self-consistency and bad-input cases.
gdp_add_test(test_prepare_cpu SOURCES test_prepare_cpu.c LABEL cpu)
gdp_add_test(test_recurrent_cpu SOURCES test_recurrent_cpu.c LABEL cpu)
gdp_add_test(test_conv1d_cpu SOURCES test_conv1d_cpu.c LABEL cpu)
gdp_add_test(test_norm_cpu SOURCES test_norm_cpu.c LABEL cpu)
gdp_add_test(test_op_contract LABEL cpu)
