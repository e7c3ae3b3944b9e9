# gdp-bench: the benchmark program, tables in the nccl-tests format. `gdp-bench ops` times the
# ops on the shapes of performance.md on one GPU (examples/gdp_bench.c); `gdp-bench layer|coll`
# (under mpirun) the layer steps and the TP collectives across ranks (examples/bench_layer.c).
add_executable(gdp-bench ${CMAKE_CURRENT_LIST_DIR}/gdp_bench.c ${CMAKE_CURRENT_LIST_DIR}/bench_layer.c)
target_link_libraries(gdp-bench PRIVATE gdp_bench_common gdp_static gdp_options m)
target_include_directories(gdp-bench PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}) # backend.h
