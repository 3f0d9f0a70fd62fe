# Runs an MPI job that must fail: passes only when mpiexec ends within LIMIT seconds with a
# non-zero status. A hang (the limit reached) or success fails the test.
#   cmake -DMPIEXEC=... -DNUMPROC_FLAG=-n -DRANKS=3 -DFLAGS=... -DPOSTFLAGS=... -DPROGRAM=...
#         -DARGS=... -DLIMIT=60 -P expect_job_failure.cmake
foreach(var MPIEXEC NUMPROC_FLAG RANKS PROGRAM LIMIT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "expect_job_failure: ${var} is not set")
  endif()
endforeach()

set(command "${MPIEXEC}" ${NUMPROC_FLAG} ${RANKS} ${FLAGS} "${PROGRAM}" ${POSTFLAGS} ${ARGS})
list(JOIN command " " shown)
message(STATUS "running (limit ${LIMIT} s): ${shown}")
string(TIMESTAMP start "%s")
execute_process(COMMAND ${command} TIMEOUT ${LIMIT} RESULT_VARIABLE status)
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")

if(NOT status MATCHES "^-?[0-9]+$")
  # "Process terminated due to timeout", or a signal's name.
  if(status MATCHES "timeout")
    message(FATAL_ERROR "the job hung: still running after ${LIMIT} s (${status})")
  endif()
  message(STATUS "the job ended after ${seconds} s: ${status} (expected a failure)")
elseif(status EQUAL 0)
  message(FATAL_ERROR "the job succeeded after ${seconds} s; expected a non-zero status")
else()
  message(STATUS "the job failed as expected after ${seconds} s with status ${status}")
endif()
