# Decides whether this build has the CUDA backend (DETOPS_CUDA = AUTO, ON or OFF), enables the
# CUDA language for it and picks default architectures. Sets DETOPS_WITH_CUDA (ON/OFF).
# Included at directory scope: enable_language() may not be called from a function.

string(TOUPPER "${DETOPS_CUDA}" _detops_cuda_mode)
if(_detops_cuda_mode STREQUAL "AUTO")
  set(_detops_cuda_mode AUTO)
elseif(DETOPS_CUDA)
  set(_detops_cuda_mode ON)
else()
  set(_detops_cuda_mode OFF)
endif()

# A pip build (scikit-build-core sets SKBUILD) serves the torch it is built against: with AUTO, a
# torch without CUDA gets the CPU backend only, even where nvcc is installed (the CUDA backend
# would cost a long build and a _C.so that needs libcudart, for kernels such a torch never calls).
# -C cmake.define.DETOPS_CUDA=ON builds them anyway.
if(SKBUILD AND _detops_cuda_mode STREQUAL "AUTO")
  set(_detops_skbuild_torch_cuda "")
  foreach(_py IN ITEMS ${Python_EXECUTABLE} ${Python3_EXECUTABLE} ${DETOPS_TORCH_PYTHON})
    execute_process(COMMAND "${_py}" -c "import torch; print(torch.version.cuda or 'none')"
      RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 120)
    if(_rc EQUAL 0)
      set(_detops_skbuild_torch_cuda "${_out}")
      break()
    endif()
  endforeach()
  if(_detops_skbuild_torch_cuda STREQUAL "none")
    message(STATUS "detops: the torch of this pip build has no CUDA: CPU backend only "
                   "(-C cmake.define.DETOPS_CUDA=ON builds the CUDA kernels anyway)")
    set(_detops_cuda_mode OFF)
  endif()
endif()

# Sanitizer builds are CPU-only: ASan's shadow memory and the CUDA driver do not mix well.
if(DETOPS_SANITIZE AND NOT _detops_cuda_mode STREQUAL "OFF")
  if(_detops_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "detops: DETOPS_SANITIZE needs a CPU-only build; set -DDETOPS_CUDA=OFF")
  endif()
  message(STATUS "detops: DETOPS_SANITIZE is set, so the CUDA backend is left out")
  set(_detops_cuda_mode OFF)
endif()

set(DETOPS_WITH_CUDA OFF)
if(NOT _detops_cuda_mode STREQUAL "OFF")
  # nvcc is often installed but not on PATH: fall back to the toolkit's usual place. CUDACXX is
  # what check_language()'s test project and enable_language() read.
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND "$ENV{CUDACXX}" STREQUAL "")
    find_program(_detops_nvcc_on_path nvcc NO_CACHE NO_DEFAULT_PATH PATHS ENV PATH)
    if(NOT _detops_nvcc_on_path AND EXISTS /usr/local/cuda/bin/nvcc)
      set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)   # caches CMAKE_CUDA_COMPILER, or NOTFOUND
  if(CMAKE_CUDA_COMPILER)
    set(DETOPS_WITH_CUDA ON)
  elseif(_detops_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "detops: DETOPS_CUDA=ON but no working CUDA compiler was found; set "
                        "CMAKE_CUDA_COMPILER (or CUDACXX) to nvcc, or use -DDETOPS_CUDA=OFF")
  else()
    message(STATUS "detops: no CUDA compiler found, building the CPU backend only")
  endif()
endif()

if(DETOPS_WITH_CUDA)
  # Default architectures, unless the user (or a parent project) chose: every real architecture
  # from Turing to Blackwell that this nvcc supports, plus PTX of the newest for future GPUs.
  # A normal variable, so it stays in detops' directories and never reaches a parent's cache.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND "$ENV{CUDAARCHS}" STREQUAL "")
    set(_detops_wanted 75 80 86 89 90 100 120)
    set(_detops_supported ${_detops_wanted})
    execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --list-gpu-arch
      OUTPUT_VARIABLE _detops_arch_list RESULT_VARIABLE _detops_rc ERROR_QUIET)
    if(_detops_rc EQUAL 0)
      string(REGEX MATCHALL "compute_[0-9]+" _detops_arch_list "${_detops_arch_list}")
      string(REPLACE "compute_" "" _detops_arch_list "${_detops_arch_list}")
      set(_detops_supported "")
      foreach(_arch IN LISTS _detops_wanted)
        if(_arch IN_LIST _detops_arch_list)
          list(APPEND _detops_supported ${_arch})
        endif()
      endforeach()
    endif()
    if(_detops_supported)
      set(CMAKE_CUDA_ARCHITECTURES "")
      foreach(_arch IN LISTS _detops_supported)
        list(APPEND CMAKE_CUDA_ARCHITECTURES ${_arch}-real)
      endforeach()
      list(POP_BACK _detops_supported _detops_newest)
      list(APPEND CMAKE_CUDA_ARCHITECTURES ${_detops_newest}-virtual)
      message(STATUS "detops: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES} "
                     "(set CMAKE_CUDA_ARCHITECTURES to choose, e.g. 90 for an H100/H200 only)")
    endif()
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # One CUDA runtime per program, the shared one (the library links CUDA::cudart): CMake's default
  # would add cudart_static to every detops executable as well. Initializes CUDA_RUNTIME_LIBRARY
  # of the targets in detops' directories only.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
endif()
