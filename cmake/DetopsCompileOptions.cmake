# detops_target_options(<target>): the flags every detops target (library, tests, benchmarks,
# examples) is built with, set on the target alone so that nothing reaches a parent project.
#   - C++17; warnings on.
#   - -ffp-contract=off: no a*b+c fused into an FMA behind our back. The math in
#     include/detops/detail/ is compiled into the library and into tests that compare bits with
#     it, and both must round the same way (CUDA code gets --fmad=false, see CMakeLists.txt).
#   - -fno-trapping-math: we never unmask floating-point traps, so the compiler may evaluate both
#     sides of a select (e.g. the ReLU mask of the FrozenBatchNorm2d backward) and vectorize it.
#     It changes no value: rounding and operation order stay as written.
#   - DETOPS_SANITIZE (e.g. "address;undefined"): -fsanitize on compile and link. A library
#     passes the link flag on to what links it, so a sanitized static detops links anywhere.

function(detops_target_options target)
  target_compile_features(${target} PRIVATE cxx_std_17)
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang,AppleClang>:-Wall -Wextra -ffp-contract=off -fno-trapping-math>)

  if(DETOPS_SANITIZE)
    list(JOIN DETOPS_SANITIZE "," _sanitizers)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_sanitizers} -fno-sanitize-recover=all -fno-omit-frame-pointer>)
    get_target_property(_type ${target} TYPE)
    if(_type MATCHES "LIBRARY")
      target_link_options(${target} PUBLIC -fsanitize=${_sanitizers})
    else()
      target_link_options(${target} PRIVATE -fsanitize=${_sanitizers})
    endif()
  endif()
endfunction()
