# Core tests: descriptors, API basics (status, version, dtypes, tensors, ctx), the
# safetensors reader/writer, and the exported-symbol check of libgdp.so.
gdp_add_test(test_descriptors LABEL cpu)
gdp_add_test(test_api LABEL cpu)
gdp_add_test(test_safetensors LABEL cpu)
add_test(NAME test_exported_symbols
         COMMAND ${CMAKE_COMMAND} -DLIB=$<TARGET_FILE:gdp> -P ${CMAKE_CURRENT_SOURCE_DIR}/scripts/check_symbols.cmake)
set_tests_properties(test_exported_symbols PROPERTIES LABELS cpu)
