# gdp_bench_common: the benchmarks' option table, timing loops and table footers
# (examples/bench_common.{h,c}), compiled once for gdp-bench and bench_chunk.
add_library(gdp_bench_common STATIC ${CMAKE_CURRENT_LIST_DIR}/bench_common.c)
target_include_directories(gdp_bench_common PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(gdp_bench_common PUBLIC gdp gdp_options)
