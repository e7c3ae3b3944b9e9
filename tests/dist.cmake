# Communication and checkpoint tests (dist/, src/checkpoint.c): the MPI comm backend at
# 2 and 4 ranks, checkpoint sharding on one process and under mpirun, and the job-wide
# failure path (one rank fails, every rank ends non-zero within seconds).
gdp_add_test(test_comm_mpi_np2 SOURCES test_comm_mpi.c LABEL mpi NPROCS 2 TIMEOUT 60)
gdp_add_test(test_comm_mpi_np4 SOURCES test_comm_mpi.c LABEL mpi NPROCS 4 TIMEOUT 60)
# the host-staged device path (two ranks on one GPU or two); skips (77) without a GPU
gdp_add_test(test_comm_mpi_gpu_np2 SOURCES test_comm_mpi.c LABEL "gpu;mpi" NPROCS 2 TIMEOUT 120 ARGS --device)
gdp_add_test(test_checkpoint LABEL cpu TIMEOUT 60)
gdp_add_test(test_checkpoint_mpi SOURCES test_checkpoint.c LABEL mpi NPROCS 2 TIMEOUT 60 ARGS --mpi)

# test_rank_failure must fail as a job: a cmake -P wrapper runs mpirun and asserts a
# non-zero exit within MAX_SECONDS plus the messages every rank must print.
add_executable(test_rank_failure test_rank_failure.c)
target_link_libraries(test_rank_failure PRIVATE gdp_test_common)
set(_gdp_failure_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
foreach(np 2 4)
  math(EXPR last "${np} - 1")
  # abort: the failing rank prints "host:rank file:line message" and MPI_Abort ends the job.
  add_test(NAME test_rank_failure_abort_np${np}
           COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DNP=${np} -DFLAGS=--oversubscribe
                   -DEXE=$<TARGET_FILE:test_rank_failure> -DMODE=abort -DMAX_SECONDS=20
                   "-DEXPECT=[^ \n]+:${last} test_rank_failure.c:[0-9]+ rank ${last} cannot load its checkpoint: .*no-such-checkpoint"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/scripts/expect_job_failure.cmake)
  # agree: every rank reports the failure itself (rank 0 names the failing rank) and exits 1.
  add_test(NAME test_rank_failure_agree_np${np}
           COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DNP=${np} -DFLAGS=--oversubscribe
                   -DEXE=$<TARGET_FILE:test_rank_failure> -DMODE=agree -DMAX_SECONDS=20
                   "-DEXPECT=rank 0: exiting with remote error.*rank ${last} failed.*no-such-checkpoint;rank ${last}: exiting with system error.*no-such-checkpoint"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/scripts/expect_job_failure.cmake)
  set_tests_properties(test_rank_failure_abort_np${np} test_rank_failure_agree_np${np} PROPERTIES
                       LABELS mpi PROCESSORS ${np} TIMEOUT 90 ENVIRONMENT "${_gdp_failure_env}")
endforeach()

# The watchdog (dist/watchdog.c): an idle peer does not trip it and a waiting rank sleeps
# (test_watchdog idle); a rank that stops itself (SIGSTOP) at step 5 makes the others fail
# within the timeout (2 s) + grace (0.5 s), naming that rank and the step, and the job end
# (stall0: the root stops; stall2: the last of 3 ranks).
gdp_add_test(test_watchdog_idle_np2 SOURCES test_watchdog.c LABEL mpi NPROCS 2 TIMEOUT 60 ARGS idle)
foreach(stopper 0 2)
  add_test(NAME test_watchdog_stall${stopper}_np3
           COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DNP=3 -DFLAGS=--oversubscribe
                   -DEXE=$<TARGET_FILE:test_watchdog_idle_np2> -DMODE=stall${stopper} -DMAX_SECONDS=20
                   "-DEXPECT=rank ${stopper}: stopping itself \\(SIGSTOP\\) at step 5;watchdog: rank [0-9] \\(world rank [0-9], host [^,]+, pid [0-9]+\\) of 3 waited [0-9.]+ s at step 5 in gdp_comm_[a-z_]+ [^\n]* for rank ${stopper} \\(world rank ${stopper}, host [^,]+, pid [0-9]+\\), which does not answer;fail-fast ok"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/scripts/expect_job_failure.cmake)
  set_tests_properties(test_watchdog_stall${stopper}_np3 PROPERTIES LABELS mpi PROCESSORS 3 TIMEOUT 90
                       ENVIRONMENT "${_gdp_failure_env};GDP_WATCHDOG_TIMEOUT=2")
endforeach()
