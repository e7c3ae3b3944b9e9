# Serving engine tests (src/engine.c, src/model.c, src/workload.c): the workload reader and
# generator, the model's embedding and LM head, engine config errors and a TP = 1 run on one
# process; under mpirun, engine variants at TP = 1, 2 and 4 whose generated tokens must agree
# by the rule of gdp-math.md 8.1, and bad input on every rank; the same on the CUDA backend
# (gpu;mpi, exits 77 without a GPU).
gdp_add_test(test_engine_units SOURCES test_engine.c LABEL cpu TIMEOUT 60 ARGS --units)
gdp_add_test(test_engine_np4 SOURCES test_engine.c LABEL mpi NPROCS 4 TIMEOUT 120)
gdp_add_test(test_engine_np2 SOURCES test_engine.c LABEL mpi NPROCS 2 TIMEOUT 120)
gdp_add_test(test_engine_gpu_np2 SOURCES test_engine.c LABEL "gpu;mpi" NPROCS 2 TIMEOUT 300 ARGS --backend cuda)
# The workload readers' limits, request defaults and sampling fields, NUL bytes, duplicate ids.
gdp_add_test(test_workload LABEL cpu TIMEOUT 60)
# gdp-run's option parsing (--check 0, --no-finite-check, the workload limits) and its
# refusal of a poisoned model and of workloads past a limit (tests/scripts/gdp_run_options.sh).
add_executable(poison_ckpt poison_ckpt.c)
target_link_libraries(poison_ckpt PRIVATE gdp_test_common)
if(TARGET gdp-run)
  add_test(NAME gdp_run_options
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/gdp_run_options.sh ${MPIEXEC_EXECUTABLE}
                   $<TARGET_FILE:gdp-run> $<TARGET_FILE:poison_ckpt> ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(gdp_run_options PROPERTIES LABELS mpi TIMEOUT 300
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1")
endif()
# The launchers on a machine that can install nothing (package managers and the rebuild stubbed
# to fail): launch/gdp-run still runs the existing build (tests/scripts/launch_offline.sh).
if(TARGET gdp-run)
  add_test(NAME launch_gdp_run_offline
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/launch_offline.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
                   ${MPIEXEC_EXECUTABLE})
  set_tests_properties(launch_gdp_run_offline PROPERTIES LABELS mpi TIMEOUT 180
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endif()
