# expect_job_failure.cmake: runs an MPI job that must fail, and passes only if mpirun
# exits non-zero within MAX_SECONDS and the output matches every regex in EXPECT
# (a ';'-separated list). Run as:
#   cmake -DMPIEXEC=mpirun -DNP=2 -DEXE=path/to/prog -DMODE=abort -DMAX_SECONDS=20
#         "-DEXPECT=re1;re2" [-DFLAGS=--oversubscribe] -P expect_job_failure.cmake
foreach(v MPIEXEC NP EXE MODE MAX_SECONDS EXPECT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "expect_job_failure.cmake: -D${v}=... is required")
  endif()
endforeach()
string(REPLACE " " ";" flags "${FLAGS}")
string(TIMESTAMP start "%s")
# The hard timeout is well above MAX_SECONDS so a hang is reported as such, not killed silently.
math(EXPR hard_limit "${MAX_SECONDS} * 3")
execute_process(COMMAND ${MPIEXEC} -n ${NP} ${flags} ${EXE} ${MODE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT ${hard_limit})
string(TIMESTAMP stop "%s")
math(EXPR elapsed "${stop} - ${start}")
message(STATUS "mpirun -n ${NP} ${EXE} ${MODE}: exit '${rc}' after ${elapsed} s; output:\n${out}")
if(rc STREQUAL "0")
  message(FATAL_ERROR "the job exited 0 although one rank failed: the failure did not reach every rank")
endif()
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself (${rc}): a rank hung after its peer failed")
endif()
if(elapsed GREATER ${MAX_SECONDS})
  message(FATAL_ERROR "the job took ${elapsed} s to end after the failure (limit ${MAX_SECONDS} s)")
endif()
if(out MATCHES "UNEXPECTED")
  message(FATAL_ERROR "a rank went on past the failure (see UNEXPECTED above)")
endif()
foreach(re ${EXPECT})
  if(NOT out MATCHES "${re}")
    message(FATAL_ERROR "the output lacks a line matching '${re}'")
  endif()
endforeach()
message(STATUS "ok: non-zero exit (${rc}) on failure within ${elapsed} s (limit ${MAX_SECONDS} s)")
