# One gpu-sanitizer test (cmake/DetopsGpuCheck.cmake): compute-sanitizer --tool TOOL over the
# cases FILTER selects of the GoogleTest program EXE, its output in LOG.
#   cmake -DSANITIZER=<compute-sanitizer> -DTOOL=memcheck -DEXE=<test program> [-DFILTER=<filter>]
#         -DLOG=<file> -P DetopsComputeSanitizer.cmake
# Without FILTER: the first instance of each parameterized test and every test of a *BadInput
# suite (from --gtest_list_tests). racecheck, the slowest tool, runs the first case only.
# Fails on a sanitizer error, a test failure, or a filter that ran nothing; prints "gpu-check:
# skipped: <why>" (the test's skip expression) without compute-sanitizer, without a device, or
# where the machine refuses the sanitizer ("Device not supported", e.g. under gVisor).
cmake_minimum_required(VERSION 3.21)
foreach(var TOOL EXE LOG)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "DetopsComputeSanitizer.cmake: -D${var}= is required")
  endif()
endforeach()
if(NOT SANITIZER)
  message("gpu-check: skipped: no compute-sanitizer found at configure time (not next to nvcc, in CUDA_HOME or on PATH)")
  return()
endif()

if(NOT FILTER)
  execute_process(COMMAND "${EXE}" --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc})")
  endif()
  string(REPLACE "\n" ";" lines "${listing}")
  set(picked "")
  set(seen "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([^ ].*\\.)")          # a suite: "Prefix/Suite." or "Suite."
      set(suite "${CMAKE_MATCH_1}")
    elseif(line MATCHES "^  ([^ ]+)")         # a test: "Test" or "Test/param"
      set(test "${CMAKE_MATCH_1}")
      string(REGEX REPLACE "/.*" "" base "${test}")
      if(NOT test STREQUAL base)
        if(NOT "${suite}${base}" IN_LIST seen)
          list(APPEND seen "${suite}${base}")
          list(APPEND picked "${suite}${test}")
        endif()
      elseif(suite MATCHES "BadInput\\.$")
        list(APPEND picked "${suite}${test}")
      endif()
    endif()
  endforeach()
  list(JOIN picked ":" FILTER)
endif()
if(TOOL STREQUAL "racecheck")
  string(REGEX REPLACE ":.*" "" FILTER "${FILTER}")
endif()

execute_process(COMMAND "${SANITIZER}" --tool "${TOOL}" --error-exitcode 86 --print-limit 20
                        "${EXE}" "--gtest_filter=${FILTER}" --gtest_brief=1
                OUTPUT_VARIABLE output ERROR_VARIABLE output RESULT_VARIABLE rc)
file(WRITE "${LOG}" "${SANITIZER} --tool ${TOOL} ${EXE} --gtest_filter=${FILTER}\n${output}")
if(output MATCHES "Device not supported")
  message("gpu-check: skipped: compute-sanitizer refuses this machine ('Device not supported')")
  return()
endif()
if(output MATCHES "no CUDA device: [^;\n]*")
  message("gpu-check: skipped: ${CMAKE_MATCH_0}")
  return()
endif()
string(REGEX MATCH "(ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards? displayed)" summary "${output}")
string(REGEX MATCH "[0-9]+ tests? from [0-9]+ test suites? ran" ran "${output}")
message("${TOOL} over ${FILTER}: ${ran}; ${summary}")
if(rc EQUAL 86)
  string(SUBSTRING "${output}" 0 6000 head)
  message(FATAL_ERROR "compute-sanitizer reported errors:\n${head}")
elseif(NOT rc EQUAL 0)
  string(LENGTH "${output}" n)
  math(EXPR from "${n} > 6000 ? ${n} - 6000 : 0")
  string(SUBSTRING "${output}" ${from} -1 tail)
  message(FATAL_ERROR "exit ${rc}:\n${tail}")
elseif(NOT ran)
  message(FATAL_ERROR "no test ran: check the filter '${FILTER}'")
endif()
