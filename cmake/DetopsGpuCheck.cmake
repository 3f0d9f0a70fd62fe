# The GPU check as CTest tests (DETOPS_GPU_CHECK=ON, set by the gpu preset): what a lent GPU
# machine runs besides `ctest -L gpu`, registered from the file naming conventions, so that a new
# op is checked without an edit here or in scripts/gpu-check.sh (which only orders the presets'
# steps within a time budget and collects what they write into <build>/gpu-check/):
#   label check-bench      per benchmarks/<op>_bench.cpp, gpu_bench.<op>: detops_bench over the
#                        file's key CUDA runs (its "// gpu-check bench: <regex>" line, else
#                        ^BM_<Op>[A-Za-z]*/cuda/), medians of DETOPS_GPU_CHECK_BENCH_REPETITIONS,
#                        JSON in gpu-check/gpu-<op>.json ('-' for '_'); a filter that matches
#                        nothing fails; skipped without a device (the program's first line says so)
#   label check-sanitizer  per tests/<name>_cuda_test.cpp and tool of DETOPS_GPU_CHECK_SANITIZER_TOOLS,
#                        gpu_sanitizer.<tool>.<name>: compute-sanitizer over the cases of the
#                        file's "// gpu-check sanitizer: <gtest filter>" line, else the first
#                        instance of each parameterized test and every *BadInput suite
#                        (cmake/DetopsComputeSanitizer.cmake); skipped where the machine refuses
#                        the sanitizer or has no device; log in gpu-check/sanitizer-<tool>-<name>.log
#   label check-compare    gpu_compare.torchvision (benchmarks/compare_torchvision.py) and
#                        gpu_compare.torch_bn (compare_torch_bn.py) on CUDA with
#                        DETOPS_GPU_CHECK_PYTHON's torch, JSON and table in gpu-check/
#   label check-demo       with the binding built: examples/torch/train_maskrcnn.py on CUDA
#                        (gpu-check/maskrcnn-gpu.json)
# None of these is in `ctest -L gpu`, and nothing is registered unless DETOPS_GPU_CHECK is ON, so
# the other builds (and CI) never run them.
option(DETOPS_GPU_CHECK "Register the GPU check's benchmark, compute-sanitizer and comparison runs as CTest tests (labels check-bench, check-sanitizer, check-compare, check-demo)" OFF)
set(DETOPS_GPU_CHECK_SANITIZER_TOOLS "memcheck" CACHE STRING
    "compute-sanitizer tools of the check-sanitizer tests (e.g. \"memcheck;racecheck;initcheck\")")
set(DETOPS_GPU_CHECK_BENCH_MIN_TIME "0.01" CACHE STRING
    "--benchmark_min_time of the check-bench tests, in seconds (a CUDA iteration runs 10 calls)")
set(DETOPS_GPU_CHECK_BENCH_REPETITIONS "3" CACHE STRING "--benchmark_repetitions of the check-bench tests")
set(DETOPS_GPU_CHECK_PYTHON "" CACHE FILEPATH
    "The Python with torch and torchvision for the check-compare tests (default: the binding's, else python3)")

function(detops_gpu_check_add_tests)
  if(NOT DETOPS_GPU_CHECK)
    return()
  endif()
  set(out "${PROJECT_BINARY_DIR}/gpu-check")
  file(MAKE_DIRECTORY "${out}")

  # --- check-bench ------------------------------------------------------------------------------
  if(TARGET detops_bench)
    file(GLOB benches CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/benchmarks/*_bench.cpp")
    foreach(file IN LISTS benches)
      get_filename_component(stem "${file}" NAME_WE)
      string(REGEX REPLACE "_bench$" "" op "${stem}")
      file(STRINGS "${file}" line REGEX "^// gpu-check bench: " LIMIT_COUNT 1)
      if(line)
        string(REGEX REPLACE "^// gpu-check bench: *" "" filter "${line}")
        string(STRIP "${filter}" filter)
      else()
        string(REGEX REPLACE "(^|_)([a-z])" ";\\2" parts "${op}")
        set(camel "")
        foreach(part IN LISTS parts)
          if(part)
            string(SUBSTRING "${part}" 0 1 first)
            string(SUBSTRING "${part}" 1 -1 rest)
            string(TOUPPER "${first}" first)
            string(APPEND camel "${first}${rest}")
          endif()
        endforeach()
        set(filter "^BM_${camel}[A-Za-z]*/cuda/")
      endif()
      string(REPLACE "_" "-" name "${op}")
      add_test(NAME gpu_bench.${op}
               COMMAND detops_bench "--benchmark_filter=${filter}"
                       "--benchmark_out=${out}/gpu-${name}.json" --benchmark_out_format=json
                       "--benchmark_min_time=${DETOPS_GPU_CHECK_BENCH_MIN_TIME}"
                       "--benchmark_repetitions=${DETOPS_GPU_CHECK_BENCH_REPETITIONS}"
                       --benchmark_report_aggregates_only=true)
      set_tests_properties(gpu_bench.${op} PROPERTIES
        LABELS check-bench TIMEOUT 90 RUN_SERIAL TRUE
        FAIL_REGULAR_EXPRESSION "Failed to match any benchmarks"
        SKIP_REGULAR_EXPRESSION "CUDA: (not in this build|compiled, no device)")
    endforeach()
  endif()

  # --- check-sanitizer --------------------------------------------------------------------------
  if(DETOPS_BUILD_TESTS AND DETOPS_WITH_CUDA)
    get_filename_component(cuda_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    find_program(DETOPS_COMPUTE_SANITIZER compute-sanitizer
                 HINTS "${cuda_bin}" "${cuda_bin}/../compute-sanitizer" ENV CUDA_HOME PATH_SUFFIXES bin)
    file(GLOB cuda_tests CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/tests/*_cuda_test.cpp")
    foreach(file IN LISTS cuda_tests)
      get_filename_component(name "${file}" NAME_WE)
      file(STRINGS "${file}" line REGEX "^// gpu-check sanitizer: " LIMIT_COUNT 1)
      string(REGEX REPLACE "^// gpu-check sanitizer: *" "" filter "${line}")
      string(STRIP "${filter}" filter)
      foreach(tool IN LISTS DETOPS_GPU_CHECK_SANITIZER_TOOLS)
        add_test(NAME gpu_sanitizer.${tool}.${name}
                 COMMAND "${CMAKE_COMMAND}" "-DSANITIZER=${DETOPS_COMPUTE_SANITIZER}" "-DTOOL=${tool}"
                         "-DEXE=$<TARGET_FILE:detops_${name}>" "-DFILTER=${filter}"
                         "-DLOG=${out}/sanitizer-${tool}-${name}.log"
                         -P "${PROJECT_SOURCE_DIR}/cmake/DetopsComputeSanitizer.cmake")
        set_tests_properties(gpu_sanitizer.${tool}.${name} PROPERTIES
          LABELS check-sanitizer TIMEOUT 120 SKIP_REGULAR_EXPRESSION "gpu-check: skipped")
      endforeach()
    endforeach()
  endif()

  # --- check-compare and check-demo ---------------------------------------------------------------
  set(python "${DETOPS_GPU_CHECK_PYTHON}")
  if(NOT python)
    set(python "${DETOPS_TORCH_PYTHON_EXECUTABLE}")
  endif()
  if(NOT python)
    find_program(DETOPS_GPU_CHECK_PYTHON3 python3)
    set(python "${DETOPS_GPU_CHECK_PYTHON3}")
  endif()
  if(TARGET detops_bench AND python)
    add_test(NAME gpu_compare.torchvision
             COMMAND "${python}" "${PROJECT_SOURCE_DIR}/benchmarks/compare_torchvision.py"
                     --bench "$<TARGET_FILE:detops_bench>" --json "${out}/compare-gpu.json"
                     --table "${out}/compare-gpu.txt" --max-seconds 110 --bench-timeout 60
                     --devices cuda --rounds 3 --tv-compile off --min-time 0.02)
    add_test(NAME gpu_compare.torch_bn
             COMMAND "${python}" "${PROJECT_SOURCE_DIR}/benchmarks/compare_torch_bn.py"
                     --bench "$<TARGET_FILE:detops_bench>" --out "${out}/compare-bn-gpu.json"
                     --table "${out}/compare-bn-gpu.txt" --max-seconds 70 --bench-timeout 40
                     --device cuda --shapes res2,res5,box --modes default,exact --rounds 3 --min-time 0.01)
    set_tests_properties(gpu_compare.torchvision gpu_compare.torch_bn PROPERTIES
      LABELS check-compare TIMEOUT 150 RUN_SERIAL TRUE)
  endif()
  if(DETOPS_TORCH_PYTHON_EXECUTABLE AND (DETOPS_WITH_TORCH OR DETOPS_WITH_TORCH_STABLE))
    # every variant twice from one seed: identical hashes or exit 1; step time, peak memory
    add_test(NAME gpu_demo.maskrcnn
             COMMAND "${DETOPS_TORCH_PYTHON_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/examples/torch/train_maskrcnn.py"
                     --device cuda --steps 3 --size 512 --json "${out}/maskrcnn-gpu.json")
    set_tests_properties(gpu_demo.maskrcnn PROPERTIES
      LABELS check-demo TIMEOUT 100 RUN_SERIAL TRUE
      ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
  endif()
endfunction()
