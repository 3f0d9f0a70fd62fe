# Script behind the consumer tests (cmake -P); tests/CMakeLists.txt registers them.
#   ACTION=install: INSTALL_FROM (a build tree) is installed into a fresh INSTALL_PREFIX.
#   ACTION=build:   SOURCE_DIR is configured into a fresh BINARY_DIR with GENERATOR and the
#                   initial cache INITIAL_CACHE (compilers, prefix path, options), built, and its
#                   own tests (the consumer program) are run.
# CONFIG is the build configuration (may be empty with single-config generators).

function(consumer_run what)
  string(REPLACE ";" " " _line "${ARGN}")
  message(STATUS "${what}: ${_line}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${_rc})")
  endif()
endfunction()

set(_config_args "")
set(_ctest_config_args "")
if(CONFIG)
  set(_config_args --config "${CONFIG}")
  set(_ctest_config_args -C "${CONFIG}")
endif()

if(ACTION STREQUAL "install")
  file(REMOVE_RECURSE "${INSTALL_PREFIX}")
  consumer_run("install" "${CMAKE_COMMAND}" --install "${INSTALL_FROM}" --prefix "${INSTALL_PREFIX}"
               ${_config_args})
  # The installed API: public headers, and of detail/ only host_device.h (dtype.h includes it).
  file(GLOB _detail RELATIVE "${INSTALL_PREFIX}" "${INSTALL_PREFIX}/include/detops/detail/*")
  if(NOT _detail STREQUAL "include/detops/detail/host_device.h")
    message(FATAL_ERROR "install: include/detops/detail/ holds '${_detail}'; expected host_device.h alone")
  endif()
elseif(ACTION STREQUAL "build")
  file(REMOVE_RECURSE "${BINARY_DIR}")
  set(_build_type "")
  if(CONFIG)
    set(_build_type "-DCMAKE_BUILD_TYPE=${CONFIG}")
  endif()
  consumer_run("configure" "${CMAKE_COMMAND}" -C "${INITIAL_CACHE}" -S "${SOURCE_DIR}"
               -B "${BINARY_DIR}" -G "${GENERATOR}" ${_build_type})
  consumer_run("build" "${CMAKE_COMMAND}" --build "${BINARY_DIR}" ${_config_args})
  consumer_run("run" "${CTEST_COMMAND}" --test-dir "${BINARY_DIR}" --verbose
               ${_ctest_config_args})
else()
  message(FATAL_ERROR "consumer_test.cmake: ACTION must be install or build, not '${ACTION}'")
endif()
