# The optional communicator components: detops::mpi (MpiCommunicator, detops/mpi.h) and
# detops::nccl (NcclCommunicator, detops/nccl.h), each a library of its own linking detops, so
# that detops itself never depends on MPI or NCCL. Sets DETOPS_WITH_MPI and DETOPS_WITH_NCCL
# (ON/OFF) for detopsConfig.cmake.in and the tests.
#   DETOPS_MPI   AUTO (when find_package(MPI COMPONENTS CXX) succeeds), ON (required) or OFF
#   DETOPS_NCCL  AUTO (when the CUDA backend is built and nccl.h + libnccl are found), ON or OFF;
#                NCCL_ROOT (CMake or environment variable) points at a NCCL outside the toolkit
# Included from the top CMakeLists.txt after the detops target is defined and
# DETOPS_INSTALL_CMAKEDIR is set, before detopsConfig.cmake is configured. Each component is
# installed and exported (install and build tree) in an export set of its own,
# detops{Mpi,Nccl}Targets, which detopsConfig.cmake includes when the component was built.

set(DETOPS_MPI AUTO CACHE STRING
    "Build detops::mpi (MpiCommunicator): AUTO (when MPI is found), ON or OFF")
set_property(CACHE DETOPS_MPI PROPERTY STRINGS AUTO ON OFF)
set(DETOPS_NCCL AUTO CACHE STRING
    "Build detops::nccl (NcclCommunicator): AUTO (with the CUDA backend, when NCCL is found), ON or OFF")
set_property(CACHE DETOPS_NCCL PROPERTY STRINGS AUTO ON OFF)

# AUTO / ON / OFF from a cache value (any CMake boolean spelling for ON and OFF).
function(_detops_comm_mode value out)
  string(TOUPPER "${value}" _mode)
  if(_mode STREQUAL "AUTO")
    set(${out} AUTO PARENT_SCOPE)
  elseif(value)
    set(${out} ON PARENT_SCOPE)
  else()
    set(${out} OFF PARENT_SCOPE)
  endif()
endfunction()

# Library properties shared with detops: version, PIC, flags, export name.
function(_detops_comm_library target export_name)
  add_library(detops::${export_name} ALIAS ${target})
  target_compile_features(${target} PUBLIC cxx_std_17)
  # src/ for internal/common.h (detops::internal::fail, fmt). Nothing of it reaches consumers.
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${target} PUBLIC detops::detops)
  detops_use_fmt(${target})
  detops_target_options(${target})
  set_target_properties(${target} PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    VERSION ${PROJECT_VERSION}
    SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
    EXPORT_NAME ${export_name})
endfunction()

# Install rules and the build-tree export of one component (export set detops<Set>Targets).
function(_detops_comm_export target set_name)
  export(TARGETS ${target} NAMESPACE detops:: FILE "${PROJECT_BINARY_DIR}/detops${set_name}Targets.cmake")
  if(DETOPS_INSTALL)
    install(TARGETS ${target} EXPORT detops${set_name}Targets
      ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
      LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
      RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
    install(EXPORT detops${set_name}Targets NAMESPACE detops:: DESTINATION "${DETOPS_INSTALL_CMAKEDIR}")
  endif()
endfunction()

# ---------------------------------------------------------------------------------------------
# detops::mpi
_detops_comm_mode("${DETOPS_MPI}" _detops_mpi_mode)
set(DETOPS_WITH_MPI OFF)
if(NOT _detops_mpi_mode STREQUAL "OFF")
  if(_detops_mpi_mode STREQUAL "ON")
    find_package(MPI COMPONENTS CXX)
    if(NOT MPI_CXX_FOUND)
      message(FATAL_ERROR "detops: DETOPS_MPI=ON but no MPI for C++ was found (Debian: libopenmpi-dev "
                          "openmpi-bin); set MPI_CXX_COMPILER or MPI_HOME, or use -DDETOPS_MPI=OFF")
    endif()
  else()
    find_package(MPI QUIET COMPONENTS CXX)
  endif()
  if(MPI_CXX_FOUND)
    set(DETOPS_WITH_MPI ON)
    message(STATUS "detops: MPI ${MPI_CXX_VERSION} (${MPIEXEC_EXECUTABLE})")
  else()
    message(STATUS "detops: no MPI found, detops::mpi is left out")
  endif()
endif()

if(DETOPS_WITH_MPI)
  add_library(detops_mpi src/comm/mpi_communicator.cpp)
  _detops_comm_library(detops_mpi mpi)
  # PUBLIC: detops/mpi.h includes <mpi.h>.
  target_link_libraries(detops_mpi PUBLIC MPI::MPI_CXX)
  _detops_comm_export(detops_mpi Mpi)
else()
  file(REMOVE "${PROJECT_BINARY_DIR}/detopsMpiTargets.cmake")  # no stale component after OFF
endif()

# ---------------------------------------------------------------------------------------------
# detops::nccl. A host-compiled .cpp over the NCCL and CUDA runtime APIs (no kernels of its own),
# so it needs the CUDA backend's toolkit but not nvcc.
_detops_comm_mode("${DETOPS_NCCL}" _detops_nccl_mode)
set(DETOPS_WITH_NCCL OFF)
if(NOT _detops_nccl_mode STREQUAL "OFF")
  if(NOT DETOPS_WITH_CUDA)
    if(_detops_nccl_mode STREQUAL "ON")
      message(FATAL_ERROR "detops: DETOPS_NCCL=ON needs the CUDA backend (DETOPS_CUDA AUTO or ON "
                          "with a working nvcc)")
    endif()
  else()
    get_filename_component(_detops_cuda_root "${CUDAToolkit_LIBRARY_DIR}" DIRECTORY)
    find_path(DETOPS_NCCL_INCLUDE_DIR nccl.h
      HINTS ${NCCL_ROOT} ENV NCCL_ROOT ENV NCCL_HOME ${CUDAToolkit_INCLUDE_DIRS}
      PATH_SUFFIXES include)
    find_library(DETOPS_NCCL_LIBRARY nccl
      HINTS ${NCCL_ROOT} ENV NCCL_ROOT ENV NCCL_HOME ${CUDAToolkit_LIBRARY_DIR} ${_detops_cuda_root}
      PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
    mark_as_advanced(DETOPS_NCCL_INCLUDE_DIR DETOPS_NCCL_LIBRARY)
    if(DETOPS_NCCL_INCLUDE_DIR AND DETOPS_NCCL_LIBRARY)
      set(DETOPS_WITH_NCCL ON)
      message(STATUS "detops: NCCL ${DETOPS_NCCL_LIBRARY}")
    elseif(_detops_nccl_mode STREQUAL "ON")
      message(FATAL_ERROR "detops: DETOPS_NCCL=ON but nccl.h or libnccl was not found; set NCCL_ROOT "
                          "or DETOPS_NCCL_INCLUDE_DIR and DETOPS_NCCL_LIBRARY, or use -DDETOPS_NCCL=OFF")
    else()
      message(STATUS "detops: NCCL not found, detops::nccl is left out")
    endif()
  endif()
endif()

if(DETOPS_WITH_NCCL)
  # NCCL::NCCL, unless a parent project already defines it (one NCCL per program). detopsConfig
  # defines it the same way for consumers.
  if(NOT TARGET NCCL::NCCL)
    add_library(NCCL::NCCL UNKNOWN IMPORTED)
    set_target_properties(NCCL::NCCL PROPERTIES
      IMPORTED_LOCATION "${DETOPS_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${DETOPS_NCCL_INCLUDE_DIR}")
  endif()
  add_library(detops_nccl src/comm/nccl_communicator.cpp)
  _detops_comm_library(detops_nccl nccl)
  # PUBLIC: detops/nccl.h includes <nccl.h>, which includes <cuda_runtime.h>.
  target_link_libraries(detops_nccl PUBLIC NCCL::NCCL CUDA::cudart)
  _detops_comm_export(detops_nccl Nccl)
else()
  file(REMOVE "${PROJECT_BINARY_DIR}/detopsNcclTargets.cmake")
endif()

message(STATUS "detops: communicators: mpi ${DETOPS_WITH_MPI}, nccl ${DETOPS_WITH_NCCL}")
