# gdp-bench-layer: layer and collective benchmarks across ranks in the nccl-tests format
# (examples/bench_layer.c: `gdp-bench-layer layer|coll`, under mpirun). Its entry points
# gdp_bench_layer_main / gdp_bench_coll_main are for gdp-bench (compile bench_layer.c with
# GDP_BENCH_LAYER_NO_MAIN there).
add_executable(gdp-bench-layer ${CMAKE_CURRENT_LIST_DIR}/bench_layer.c)
target_link_libraries(gdp-bench-layer PRIVATE gdp gdp_options m)
