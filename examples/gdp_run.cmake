# gdp-run: the main program, the serving engine over a workload on N ranks (examples/gdp_run.c;
# launch/gdp-run starts it under mpirun; docs/gdp-run.md).
add_executable(gdp-run ${CMAKE_CURRENT_LIST_DIR}/gdp_run.c)
target_link_libraries(gdp-run PRIVATE gdp gdp_options)
