# gdp-run's failure paths and output guarantees (docs/failures.md), each a mode of
# tests/scripts/gdp_run_failures.sh under mpirun with 2 CPU ranks: unwritable --output
# refused before the run; --write-model through symlinks, never over devices, ENOSPC
# reported; SIGTERM/SIGINT/kill -9 end the job in seconds and keep the streamed results;
# a SIGSTOPped rank ends the job through the watchdog, named; an idle root is no stall.
if(TARGET gdp-run)
  foreach(mode output write-model sigterm sigint kill9 stall arrival-gap)
    add_test(NAME gdp_run_failure_${mode}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/gdp_run_failures.sh ${mode} $<TARGET_FILE:gdp-run>
                     ${MPIEXEC_EXECUTABLE})
    set_tests_properties(gdp_run_failure_${mode} PROPERTIES LABELS mpi PROCESSORS 2 TIMEOUT 240 SKIP_RETURN_CODE 77
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
endif()
