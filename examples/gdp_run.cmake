# gdp-run: the main program (see examples/gdp_run.c).
add_executable(gdp-run ${CMAKE_CURRENT_LIST_DIR}/gdp_run.c)
target_link_libraries(gdp-run PRIVATE gdp gdp_options)
