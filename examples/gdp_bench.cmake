# gdp-bench: kernel benchmarks in the nccl-tests table format (see examples/gdp_bench.c).
# `gdp-bench ops` times the ops on the shapes of performance.md on one GPU.
add_executable(gdp-bench ${CMAKE_CURRENT_LIST_DIR}/gdp_bench.c)
target_link_libraries(gdp-bench PRIVATE gdp gdp_options m)
