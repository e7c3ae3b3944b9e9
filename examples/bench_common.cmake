# gdp_bench_common: the benchmarks' option table, timing loops and table footers
# (examples/bench_common.{h,c}), compiled once for gdp-bench and bench_chunk.
add_library(gdp_bench_common STATIC ${CMAKE_CURRENT_LIST_DIR}/bench_common.c)
target_include_directories(gdp_bench_common PUBLIC ${CMAKE_CURRENT_LIST_DIR})
# the static library: gdp-bench's gemm rows call the layer's projection GEMM, which libgdp.so
# does not export
target_link_libraries(gdp_bench_common PUBLIC gdp_static gdp_options)
