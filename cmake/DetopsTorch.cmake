# The optional PyTorch/LibTorch component (issues 15, 26): the op library registering
# torch.ops.detops.* (built as <build>/python/detops_torch/_C.so next to the Python package
# detops_torch), in one of two registration layers over one set of op glue
# (bindings/torch/csrc/<op>.cpp, one per entry of DETOPS_OPS):
#   stable   LibTorch's stable ABI only (torch/csrc/stable, the C shim): one _C.so serves every
#            torch from DETOPS_TORCH_STABLE_FLOOR up (autograd and fake kernels in Python). The
#            wheel's layer. Built against any torch >= the floor with TORCH_TARGET_VERSION = the
#            floor; build it against the floor's own headers (scripts/build-wheel.sh does).
#   classic  the dispatcher API of one LibTorch (TORCH_LIBRARY, C++ autograd) plus detops::torch,
#            the header-only adapter include/detops/torch.h: source builds for LibTorch C++
#            programs and for torch older than the floor (Debian's 1.13). C++20 where torch's
#            headers need it (torch >= 2.10), C++17 below; the core library stays C++17.
#   DETOPS_TORCH          AUTO (when torch is found), ON (required) or OFF; default AUTO when
#                         detops is the top-level project, OFF in a parent's build
#   DETOPS_TORCH_ABI      AUTO (stable for a Python build, i.e. scikit-build-core, against torch >=
#                         the floor; classic otherwise), stable or classic
#   DETOPS_TORCH_PYTHON   the Python interpreter whose torch the binding is built for; found
#                         automatically (the first of Python3_EXECUTABLE, Python_EXECUTABLE,
#                         /usr/bin/python3, python3 on PATH that imports torch). Its
#                         torch.utils.cmake_prefix_path is searched for TorchConfig.cmake (pip's
#                         torch), then the system (Debian's libtorch-dev).
#   DETOPS_TORCH_FMT_HEADER_ONLY  compile detops with fmt header-only, so that _C.so needs no
#                         libfmt.so at run time (pyproject.toml turns it on for wheels)
# Sets DETOPS_WITH_TORCH (ON/OFF: the classic layer and its exported targets, for
# detopsConfig.cmake.in) and DETOPS_WITH_TORCH_STABLE. Included from the top CMakeLists.txt after
# DetopsComm.cmake; detops_torch_add_tests() is called from there once testing is enabled.
# No pybind11 and no libpython: the same _C.so serves Python (torch.ops.load_library) and, in the
# classic layer, LibTorch C++ programs. libdetops is linked statically into it.

# ---------------------------------------------------------------------------------------------
# Tests (label torch), registered by the top CMakeLists.txt after enable_testing(); defined first
# because the rest of this file returns early when the binding is left out.
#   detops_torch_py_<file>  each bindings/torch/tests/test_*.py, run by the Python whose torch the
#                           binding was built for, PYTHONPATH=<build>/python; pytest when that
#                           Python has it, else unittest (the GPU machine may have no pytest)
#   detops_torch_example_*  examples/torch: quickstart.py (the README's example) and
#                           train_maskrcnn.py --smoke (two runs, same hashes)
#   detops_torch_consumer   tests/consumers/torch: a plain C++ program (no Python) training
#                           through torch.ops.detops.roi_align (also label consumer)
function(detops_torch_add_tests)
  if(NOT DETOPS_WITH_TORCH AND NOT DETOPS_WITH_TORCH_STABLE)
    return()
  endif()
  set(_tests_dir "${PROJECT_SOURCE_DIR}/bindings/torch/tests")
  # what the label's tests need, like detops_tests_<label> of tests/CMakeLists.txt
  add_custom_target(detops_tests_torch)
  add_dependencies(detops_tests_torch detops_torch detops_torch_python)
  if(DETOPS_TORCH_PYTHON_EXECUTABLE)
    execute_process(COMMAND "${DETOPS_TORCH_PYTHON_EXECUTABLE}" -c "import pytest"
                    RESULT_VARIABLE _no_pytest OUTPUT_QUIET ERROR_QUIET)
    file(GLOB _py_tests CONFIGURE_DEPENDS "${_tests_dir}/test_*.py")
    foreach(_file IN LISTS _py_tests)
      get_filename_component(_name "${_file}" NAME_WE)
      if(_no_pytest)
        set(_cmd -m unittest discover -s "${_tests_dir}" -t "${_tests_dir}" -p "${_name}.py")
      else()
        # No cache directory in the source tree; quiet output, failures in full.
        set(_cmd -m pytest -q -p no:cacheprovider "${_file}")
      endif()
      add_test(NAME detops_torch_py_${_name} COMMAND "${DETOPS_TORCH_PYTHON_EXECUTABLE}" ${_cmd}
               WORKING_DIRECTORY "${PROJECT_BINARY_DIR}")
      set_tests_properties(detops_torch_py_${_name} PROPERTIES
        LABELS torch TIMEOUT 600
        ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
    endforeach()
    # The examples, each checking its own result: the README's quickstart, and the training
    # demo's smoke run (two Mask R-CNN steps twice: identical hashes or exit 1).
    foreach(_example IN ITEMS "quickstart|quickstart.py" "maskrcnn|train_maskrcnn.py;--smoke")
      string(REPLACE "|" ";" _example "${_example}")
      list(POP_FRONT _example _name)
      list(POP_FRONT _example _script)
      add_test(NAME detops_torch_example_${_name}
               COMMAND "${DETOPS_TORCH_PYTHON_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/examples/torch/${_script}" ${_example}
               WORKING_DIRECTORY "${PROJECT_BINARY_DIR}")
      set_tests_properties(detops_torch_example_${_name} PROPERTIES
        LABELS torch TIMEOUT 300
        ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
    endforeach()
  endif()

  if(NOT DETOPS_WITH_TORCH)
    return()  # the stable layer has no C++ API: the consumer is the classic layer's test
  endif()
  add_executable(detops_torch_consumer tests/consumers/torch/main.cpp)
  # --no-as-needed: the program uses the op library only through the dispatcher (no symbol of
  # it), and the library must still be loaded for its registrations to run.
  target_link_libraries(detops_torch_consumer PRIVATE detops::torch "-Wl,--no-as-needed" detops::torch_ops)
  set_target_properties(detops_torch_consumer PROPERTIES CXX_STANDARD ${DETOPS_TORCH_CXX_STANDARD}
                        CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
  detops_target_options(detops_torch_consumer)
  add_dependencies(detops_tests_torch detops_torch_consumer)
  add_test(NAME detops_torch_consumer COMMAND detops_torch_consumer)
  set_tests_properties(detops_torch_consumer PROPERTIES LABELS "torch;consumer" TIMEOUT 300)
endfunction()

# A guest build (add_subdirectory, FetchContent) gets only the library unless it asks for more.
if(DETOPS_IS_TOP_LEVEL)
  set(_detops_torch_default AUTO)
else()
  set(_detops_torch_default OFF)
endif()
set(DETOPS_TORCH ${_detops_torch_default} CACHE STRING
    "Build the PyTorch binding (detops::torch, torch.ops.detops): AUTO (when Torch is found), ON or OFF")
set_property(CACHE DETOPS_TORCH PROPERTY STRINGS AUTO ON OFF)
set(DETOPS_TORCH_PYTHON "" CACHE FILEPATH "Python interpreter with the torch to build the binding for (empty: search)")
set(DETOPS_TORCH_ABI AUTO CACHE STRING
    "Registration layer of the op library: AUTO (stable for a scikit-build-core build against torch >= the floor), stable or classic")
set_property(CACHE DETOPS_TORCH_ABI PROPERTY STRINGS AUTO stable classic)
# The oldest torch the stable layer serves: 2.11, the first PyPI torch built with CUDA 13 (the
# toolkit detops' CUDA wheel is built with; 2.10 ships CUDA 12.8) and the stable ABI detops needs
# (str arguments and tensor creation with a memory format: 2.10; the shim's CUDA stream: 2.9).
set(DETOPS_TORCH_STABLE_FLOOR "2.11")
option(DETOPS_TORCH_FMT_HEADER_ONLY "Use fmt header-only in detops, so the torch binding needs no libfmt.so" OFF)
set(DETOPS_TORCH_PYTHON_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/detops/python" CACHE STRING
    "Where `cmake --install` puts the Python package detops_torch (a directory for PYTHONPATH), relative to the prefix")
mark_as_advanced(DETOPS_TORCH_PYTHON_INSTALL_DIR)

string(TOUPPER "${DETOPS_TORCH}" _detops_torch_mode)
if(NOT _detops_torch_mode STREQUAL "AUTO")
  if(DETOPS_TORCH)
    set(_detops_torch_mode ON)
  else()
    set(_detops_torch_mode OFF)
  endif()
endif()

set(DETOPS_WITH_TORCH OFF)
set(DETOPS_WITH_TORCH_STABLE OFF)
set(DETOPS_WITH_TORCH_CUDA OFF)
set(DETOPS_TORCH_PYTHON_EXECUTABLE "")
if(_detops_torch_mode STREQUAL "OFF")
  file(REMOVE "${PROJECT_BINARY_DIR}/detopsTorchTargets.cmake")
  message(STATUS "detops: torch binding OFF")
  return()
endif()

# ---------------------------------------------------------------------------------------------
# The Python interpreter with torch: its version goes into _build_info.py (the import-time guard
# compares it with the running torch), it runs the Python tests, and pip's torch is found through
# it. Several interpreters may exist (here: a pyenv python3 without torch first on PATH, Debian's
# /usr/bin/python3 with torch 1.13).
set(_detops_torch_candidates ${DETOPS_TORCH_PYTHON} ${Python3_EXECUTABLE} ${Python_EXECUTABLE} /usr/bin/python3)
find_program(_detops_path_python3 NAMES python3 python NO_CACHE)
if(_detops_path_python3)
  list(APPEND _detops_torch_candidates "${_detops_path_python3}")
endif()
list(REMOVE_DUPLICATES _detops_torch_candidates)
set(_detops_torch_py_version "")
set(_detops_torch_py_prefix "")
foreach(_py IN LISTS _detops_torch_candidates)
  if(NOT EXISTS "${_py}")
    continue()
  endif()
  execute_process(
    COMMAND "${_py}" -c "import os, torch, torch.utils; print(torch.__version__); print(torch.utils.cmake_prefix_path); print(torch.version.cuda or 'none'); print(os.path.dirname(torch.__file__))"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 120)
  if(_rc EQUAL 0)
    string(REPLACE "\n" ";" _out "${_out}")
    list(GET _out 0 _detops_torch_py_version)
    list(GET _out 1 _detops_torch_py_prefix)
    list(GET _out 2 _detops_torch_py_cuda)
    list(GET _out 3 _detops_torch_py_dir)
    set(DETOPS_TORCH_PYTHON_EXECUTABLE "${_py}")
    break()
  endif()
  if(DETOPS_TORCH_PYTHON AND _py STREQUAL DETOPS_TORCH_PYTHON)
    message(WARNING "detops: DETOPS_TORCH_PYTHON=${DETOPS_TORCH_PYTHON} cannot import torch")
  endif()
endforeach()
if(DETOPS_TORCH_PYTHON_EXECUTABLE)
  message(STATUS "detops: Python with torch ${_detops_torch_py_version}: ${DETOPS_TORCH_PYTHON_EXECUTABLE}")
endif()

# find_package(Torch) in a function scope: pip's TorchConfig (Caffe2's cuda.cmake) appends its own
# -gencode list (TORCH_CUDA_ARCH_LIST, down to compute_50, which nvcc 13 refuses) and defines to
# CMAKE_CUDA_FLAGS; at directory scope that would reach detops' own .cu files. Imported targets
# (torch_cpu, c10, ...) are directory-wide all the same; the variables needed are passed up.
function(_detops_find_torch mode py_prefix)
  # pip's torch carries its TorchConfig.cmake; Debian's torch.utils.cmake_prefix_path points at a
  # directory that does not exist (its config is in lib/<triplet>/cmake/Torch, the default search).
  # Prepended even when Torch_DIR is set: TorchConfig then finds Caffe2 (and the rest) of the same
  # torch, not a system one (measured: pip's Torch_DIR with Debian's libtorch-dev found Debian's).
  if(EXISTS "${py_prefix}/Torch/TorchConfig.cmake")
    list(PREPEND CMAKE_PREFIX_PATH "${py_prefix}")
  endif()
  if(mode STREQUAL "ON")
    find_package(Torch)
  else()
    find_package(Torch QUIET)
  endif()
  foreach(_var Torch_FOUND Torch_VERSION TORCH_INCLUDE_DIRS TORCH_CXX_FLAGS)
    set(${_var} "${${_var}}" PARENT_SCOPE)
  endforeach()
  # The C++ standard torch's headers need: torch >= 2.10's ATen refuses anything below C++20 and
  # says so only on the `torch` target (cxx_std_20), which detops does not link (torch_cpu, c10).
  set(_cxx_std 17)
  if(TARGET torch)
    get_target_property(_features torch INTERFACE_COMPILE_FEATURES)
    if(_features AND "cxx_std_20" IN_LIST _features)
      set(_cxx_std 20)
    endif()
  endif()
  set(DETOPS_TORCH_CXX_STANDARD ${_cxx_std} PARENT_SCOPE)
endfunction()
# The registration layer (see the top of this file).
string(REGEX MATCH "^[0-9]+[.][0-9]+" _detops_torch_py_mm "${_detops_torch_py_version}")
string(TOLOWER "${DETOPS_TORCH_ABI}" _detops_torch_abi)
if(_detops_torch_abi STREQUAL "auto")
  if(SKBUILD AND _detops_torch_py_mm AND _detops_torch_py_mm VERSION_GREATER_EQUAL DETOPS_TORCH_STABLE_FLOOR)
    set(_detops_torch_abi stable)
  else()
    set(_detops_torch_abi classic)
  endif()
elseif(NOT _detops_torch_abi MATCHES "^(stable|classic)$")
  message(FATAL_ERROR "detops: DETOPS_TORCH_ABI is '${DETOPS_TORCH_ABI}'; expected AUTO, stable or classic")
endif()

if(DETOPS_TORCH_FMT_HEADER_ONLY AND TARGET fmt::fmt-header-only)
  # libdetops is linked into _C.so; with fmt compiled in, the wheel depends on nothing but torch.
  foreach(_prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
    get_target_property(_libs detops ${_prop})
    if(_libs)
      list(TRANSFORM _libs REPLACE "^fmt::fmt$" "fmt::fmt-header-only")
      list(TRANSFORM _libs REPLACE "<LINK_ONLY:fmt::fmt>" "<LINK_ONLY:fmt::fmt-header-only>")
      set_target_properties(detops PROPERTIES ${_prop} "${_libs}")
    endif()
  endforeach()
endif()

if(_detops_torch_abi STREQUAL "classic")
  _detops_find_torch("${_detops_torch_mode}" "${_detops_torch_py_prefix}")
  if(NOT Torch_FOUND)
    if(_detops_torch_mode STREQUAL "ON")
      message(FATAL_ERROR "detops: DETOPS_TORCH=ON but LibTorch was not found (Debian: libtorch-dev; pip: "
                          "set DETOPS_TORCH_PYTHON to the interpreter with torch, or Torch_DIR), or use -DDETOPS_TORCH=OFF")
    endif()
    message(STATUS "detops: LibTorch not found, the torch binding is left out")
    file(REMOVE "${PROJECT_BINARY_DIR}/detopsTorchTargets.cmake")
    return()
  endif()
  set(DETOPS_WITH_TORCH ON)
endif()

# detops::torch_ops: the op library, one glue file per op. SHARED (not MODULE) so that C++
# programs can link it (classic layer); named _C.so in the package directory, so
# `PYTHONPATH=<build>/python` imports detops_torch.
set(DETOPS_TORCH_PACKAGE_DIR "${PROJECT_BINARY_DIR}/python/detops_torch")
set(_detops_torch_sources "")
foreach(_op IN LISTS DETOPS_OPS)
  list(APPEND _detops_torch_sources bindings/torch/csrc/${_op}.cpp)
endforeach()
add_library(detops_torch SHARED ${_detops_torch_sources})
add_library(detops::torch_ops ALIAS detops_torch)
detops_target_options(detops_torch)
set_target_properties(detops_torch PROPERTIES
  CXX_EXTENSIONS OFF
  PREFIX ""
  OUTPUT_NAME _C
  LIBRARY_OUTPUT_DIRECTORY "${DETOPS_TORCH_PACKAGE_DIR}"
  EXPORT_NAME torch_ops)
if(NOT BUILD_SHARED_LIBS)
  # Only the registration side effects are wanted: keep the exported dynamic symbol table small.
  target_link_options(detops_torch PRIVATE "LINKER:--exclude-libs,ALL")
endif()

if(_detops_torch_abi STREQUAL "stable")
  # ---- stable layer: torch's headers and the C shim's libraries, no find_package(Torch) ---------
  if(NOT _detops_torch_py_mm OR _detops_torch_py_mm VERSION_LESS DETOPS_TORCH_STABLE_FLOOR)
    message(FATAL_ERROR "detops: DETOPS_TORCH_ABI=stable needs torch >= ${DETOPS_TORCH_STABLE_FLOOR} in a Python "
                        "(DETOPS_TORCH_PYTHON); found '${_detops_torch_py_version}'. Use DETOPS_TORCH_ABI=classic.")
  endif()
  set(DETOPS_WITH_TORCH_STABLE ON)
  string(REPLACE "." ";" _floor "${DETOPS_TORCH_STABLE_FLOOR}")
  list(GET _floor 0 _floor_major)
  list(GET _floor 1 _floor_minor)
  # TORCH_TARGET_VERSION: 0xMMmm000000000000, the floor's stable ABI (headers of newer torches then
  # refuse what the floor lacks at compile time).
  math(EXPR _target "(${_floor_major} << 56) | (${_floor_minor} << 48)" OUTPUT_FORMAT HEXADECIMAL)
  find_library(_detops_libtorch_cpu NAMES torch_cpu PATHS "${_detops_torch_py_dir}/lib" NO_DEFAULT_PATH NO_CACHE REQUIRED)
  target_include_directories(detops_torch SYSTEM PRIVATE "${_detops_torch_py_dir}/include")
  target_compile_definitions(detops_torch PRIVATE DETOPS_TORCH_STABLE=1 TORCH_TARGET_VERSION=${_target}ULL)
  # The shim's C symbols live in libtorch_cpu (libtorch_cuda for the CUDA stream); torch has loaded
  # them by the time _C.so is (its NEEDED entries are unversioned sonames, resolved to the same).
  target_link_libraries(detops_torch PRIVATE detops::detops "${_detops_libtorch_cpu}")
  # Hidden visibility, as torch's stable headers declare their types: the library exports nothing,
  # it registers its kernels from static initializers.
  set_target_properties(detops_torch PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                        CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  if(DETOPS_WITH_CUDA AND NOT _detops_torch_py_cuda STREQUAL "none")
    find_library(_detops_libtorch_cuda NAMES torch_cuda PATHS "${_detops_torch_py_dir}/lib" NO_DEFAULT_PATH NO_CACHE)
    if(_detops_libtorch_cuda)
      set(DETOPS_WITH_TORCH_CUDA ON)
      target_link_libraries(detops_torch PRIVATE "${_detops_libtorch_cuda}")
      # USE_CUDA: the shim declares its CUDA functions (the current stream) only with it.
      target_compile_definitions(detops_torch PRIVATE DETOPS_TORCH_CUDA=1 USE_CUDA=1)
    endif()
  endif()
  # detops_torch_cuda_glue: the CUDA branch of the glue, compiled and not linked, for a CPU-only
  # build against a CUDA torch (EXCLUDE_FROM_ALL; scripts/test-wheel.sh builds it), so that CI,
  # which has no GPU and builds the CPU wheel, still compiles what the CUDA wheel adds.
  if(NOT DETOPS_WITH_TORCH_CUDA AND NOT _detops_torch_py_cuda STREQUAL "none")
    add_library(detops_torch_cuda_glue OBJECT EXCLUDE_FROM_ALL ${_detops_torch_sources})
    detops_target_options(detops_torch_cuda_glue)
    target_include_directories(detops_torch_cuda_glue SYSTEM PRIVATE "${_detops_torch_py_dir}/include")
    target_compile_definitions(detops_torch_cuda_glue PRIVATE DETOPS_TORCH_STABLE=1 TORCH_TARGET_VERSION=${_target}ULL
                               DETOPS_TORCH_CUDA=1 USE_CUDA=1)
    target_link_libraries(detops_torch_cuda_glue PRIVATE detops::detops)
    set_target_properties(detops_torch_cuda_glue PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                          CXX_EXTENSIONS OFF CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  endif()
  # The package records the floor: __init__.py refuses an older torch.
  set(DETOPS_TORCH_VERSION "${_detops_torch_py_version}")
  set(_detops_torch_abi_py stable)
  message(STATUS "detops: torch ${_detops_torch_py_version} (${_detops_torch_py_dir}), torch binding ON (stable ABI, "
                 "torch >= ${DETOPS_TORCH_STABLE_FLOOR}), CUDA kernels ${DETOPS_WITH_TORCH_CUDA}")
else()
  # ---- classic layer: find_package(Torch), the dispatcher API, detops::torch --------------------

  # The version the package records: what `torch.__version__` says (e.g. "1.13.0a0" for Debian's
  # 1.13.1, "2.11.0+cu130"), since that is what the import-time guard compares with. Without a
  # Python that imports torch, the C++ package version (the Python tests are then left out).
  if(_detops_torch_py_version)
    set(DETOPS_TORCH_VERSION "${_detops_torch_py_version}")
    string(REGEX MATCH "^[0-9]+[.][0-9]+" _cmake_mm "${Torch_VERSION}")
    if(_cmake_mm AND NOT _detops_torch_py_mm STREQUAL _cmake_mm)
      message(WARNING "detops: LibTorch ${Torch_VERSION} (${Torch_DIR}) is not the torch ${_detops_torch_py_version} "
                      "of ${DETOPS_TORCH_PYTHON_EXECUTABLE}: the Python package would refuse to load; set Torch_DIR "
                      "or DETOPS_TORCH_PYTHON so that they match. Python tests are left out.")
      set(DETOPS_TORCH_PYTHON_EXECUTABLE "")
    endif()
  else()
    set(DETOPS_TORCH_VERSION "${Torch_VERSION}")
  endif()

  # CUDA kernels of the binding: only when both detops' CUDA backend and torch's CUDA are there.
  if(DETOPS_WITH_CUDA AND TARGET torch_cuda AND TARGET c10_cuda)
    set(DETOPS_WITH_TORCH_CUDA ON)
  endif()
  message(STATUS "detops: LibTorch ${Torch_VERSION} (${Torch_DIR}), torch binding ON (classic, "
                 "C++${DETOPS_TORCH_CXX_STANDARD}), CUDA kernels ${DETOPS_WITH_TORCH_CUDA}")

  # detops::torch: the adapter header, with LibTorch's include directories and flags. Linking
  # torch_cpu and c10 (not `torch`) keeps libtorch_python and CUDA out; those imported targets do
  # not carry torch/csrc/api/include, hence TORCH_INCLUDE_DIRS (the installed config adds it again
  # from the consumer's own find_package(Torch)).
  add_library(detops_torch_headers INTERFACE)
  add_library(detops::torch ALIAS detops_torch_headers)
  # C++17 for detops' headers; C++20 when torch's headers need it (the core library stays C++17).
  target_compile_features(detops_torch_headers INTERFACE cxx_std_${DETOPS_TORCH_CXX_STANDARD})
  target_link_libraries(detops_torch_headers INTERFACE detops::detops torch_cpu c10)
  target_include_directories(detops_torch_headers SYSTEM INTERFACE "$<BUILD_INTERFACE:${TORCH_INCLUDE_DIRS}>")
  separate_arguments(_detops_torch_cxx_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(detops_torch_headers INTERFACE "$<BUILD_INTERFACE:${_detops_torch_cxx_flags}>")
  if(DETOPS_WITH_TORCH_CUDA)
    target_link_libraries(detops_torch_headers INTERFACE torch_cuda c10_cuda)
    target_compile_definitions(detops_torch_headers INTERFACE DETOPS_TORCH_CUDA=1)
  endif()
  set_target_properties(detops_torch_headers PROPERTIES EXPORT_NAME torch)

  target_link_libraries(detops_torch PRIVATE detops_torch_headers)
  # torch 1.13's own flags say C++14; detops' headers need C++17 (std::optional, string_view);
  # torch >= 2.10 needs C++20.
  set_target_properties(detops_torch PROPERTIES CXX_STANDARD ${DETOPS_TORCH_CXX_STANDARD} CXX_STANDARD_REQUIRED ON)
  if(DETOPS_WITH_TORCH_CUDA)
    target_compile_definitions(detops_torch PRIVATE DETOPS_TORCH_CUDA=1)
  endif()
  set(_detops_torch_abi_py classic)
endif()

# detops_torch_python: the pure-Python package next to _C.so (its subpackages too), with
# _build_info.py recording what it was built for (bindings/torch/detops_torch/__init__.py checks
# it before loading _C.so).
set(_detops_torch_py_root "${PROJECT_SOURCE_DIR}/bindings/torch/detops_torch")
file(GLOB_RECURSE _detops_torch_py RELATIVE "${_detops_torch_py_root}" CONFIGURE_DEPENDS "${_detops_torch_py_root}/*.py")
# A module moved or deleted in the source tree leaves no stale copy here to shadow its new place.
file(GLOB_RECURSE _detops_torch_py_built RELATIVE "${DETOPS_TORCH_PACKAGE_DIR}" "${DETOPS_TORCH_PACKAGE_DIR}/*.py")
foreach(_rel IN LISTS _detops_torch_py_built)
  if(NOT _rel IN_LIST _detops_torch_py AND NOT _rel STREQUAL "_build_info.py")
    file(REMOVE "${DETOPS_TORCH_PACKAGE_DIR}/${_rel}")
  endif()
endforeach()
set(_detops_torch_py_outputs "")
foreach(_rel IN LISTS _detops_torch_py)
  add_custom_command(OUTPUT "${DETOPS_TORCH_PACKAGE_DIR}/${_rel}"
    COMMAND "${CMAKE_COMMAND}" -E copy_if_different "${_detops_torch_py_root}/${_rel}" "${DETOPS_TORCH_PACKAGE_DIR}/${_rel}"
    DEPENDS "${_detops_torch_py_root}/${_rel}" COMMENT "detops_torch: ${_rel}" VERBATIM)
  list(APPEND _detops_torch_py_outputs "${DETOPS_TORCH_PACKAGE_DIR}/${_rel}")
endforeach()
if(DETOPS_WITH_TORCH_CUDA)
  set(_detops_torch_cuda_py True)
else()
  set(_detops_torch_cuda_py False)
endif()
file(CONFIGURE OUTPUT "${DETOPS_TORCH_PACKAGE_DIR}/_build_info.py" CONTENT [=[
# What this detops_torch was built for; written by cmake/DetopsTorch.cmake. __init__.py checks it
# before loading _C.so (a _C.so of the classic layer built for another torch can abort Python):
#   ABI "classic": TORCH_VERSION must be torch.__version__;
#   ABI "stable":  torch must be TORCH_FLOOR or newer (TORCH_VERSION: the torch it was built with).
ABI = "@_detops_torch_abi_py@"
TORCH_VERSION = "@DETOPS_TORCH_VERSION@"
TORCH_FLOOR = "@DETOPS_TORCH_STABLE_FLOOR@"
CUDA = @_detops_torch_cuda_py@
CUDA_VERSION = "@_detops_torch_py_cuda@"
DETOPS_VERSION = "@PROJECT_VERSION@"
]=] @ONLY)
add_custom_target(detops_torch_python ALL DEPENDS ${_detops_torch_py_outputs})
add_dependencies(detops_torch detops_torch_python)

# ---------------------------------------------------------------------------------------------
# Install (scikit-build-core: the wheel's platlib root) and, for the classic layer, export like
# detops::mpi: export set detopsTorchTargets. The Python package goes to
# DETOPS_TORCH_PYTHON_INSTALL_DIR/detops_torch.
if(SKBUILD)
  set(_detops_torch_py_dest "detops_torch")
else()
  set(_detops_torch_py_dest "${DETOPS_TORCH_PYTHON_INSTALL_DIR}/detops_torch")
endif()
if(DETOPS_WITH_TORCH)
  export(TARGETS detops_torch_headers detops_torch NAMESPACE detops::
         FILE "${PROJECT_BINARY_DIR}/detopsTorchTargets.cmake")
else()
  file(REMOVE "${PROJECT_BINARY_DIR}/detopsTorchTargets.cmake")
endif()
if(DETOPS_INSTALL OR SKBUILD)
  if(DETOPS_WITH_TORCH)
    install(TARGETS detops_torch_headers detops_torch EXPORT detopsTorchTargets
      LIBRARY DESTINATION "${_detops_torch_py_dest}"
      RUNTIME DESTINATION "${_detops_torch_py_dest}")
    if(DETOPS_INSTALL)
      install(EXPORT detopsTorchTargets NAMESPACE detops:: DESTINATION "${DETOPS_INSTALL_CMAKEDIR}")
    endif()
  else()
    install(TARGETS detops_torch LIBRARY DESTINATION "${_detops_torch_py_dest}")
  endif()
  foreach(_rel IN LISTS _detops_torch_py)
    get_filename_component(_dir "${_rel}" DIRECTORY)
    install(FILES "${_detops_torch_py_root}/${_rel}" DESTINATION "${_detops_torch_py_dest}/${_dir}")
  endforeach()
  install(FILES "${DETOPS_TORCH_PACKAGE_DIR}/_build_info.py" DESTINATION "${_detops_torch_py_dest}")
endif()
