# gdp-bench: kernel benchmarks in the nccl-tests table format (see examples/gdp_bench.c).
# `gdp-bench ops` times the ops on the shapes of performance.md on one GPU.
# `gdp-bench layer|coll` (under mpirun) run the layer and collective benchmarks of bench_layer.c.
add_executable(gdp-bench ${CMAKE_CURRENT_LIST_DIR}/gdp_bench.c ${CMAKE_CURRENT_LIST_DIR}/bench_layer.c)
target_compile_definitions(gdp-bench PRIVATE GDP_BENCH_LAYER_NO_MAIN=1)
target_link_libraries(gdp-bench PRIVATE gdp gdp_options m)
