#!/usr/bin/env bash
# Fills .deps/ (git-ignored) with the third-party C++ dependencies of the gpu preset (CMakePresets.json:
# CMAKE_PREFIX_PATH and DETOPS_GTEST_SOURCE_DIR point into .deps/) and so of scripts/gpu-check.sh, which
# runs on a GPU machine with CUDA, CMake and ninja but no network and maybe no fmt, GoogleTest or
# Google Benchmark. Everything comes from this machine's Debian packages:
#   .deps/prefix/include/fmt/              fmt headers, used header-only there (no binary that
#   .deps/prefix/lib/cmake/fmt/              must match that machine's system libraries)
#   .deps/src/googletest/                  GoogleTest sources, built within the gpu build where
#                                            no GoogleTest is installed (tests/CMakeLists.txt)
#   .deps/prefix/include/benchmark/        Google Benchmark headers and shared library (Debian
#   .deps/prefix/lib/libbenchmark.so.*       ships neither sources nor a static library)
#   .deps/prefix/lib/cmake/benchmark/
# The CMake package files are written here, relocatable: find_package finds them through
# CMAKE_PREFIX_PATH=<repo>/.deps/prefix wherever the tree lands.
# Not staged, on purpose: PyTorch and torchvision (too big to carry, and bound to that machine's
# CUDA; gpu-check.sh uses the ones installed there and skips the comparisons, saying why, where
# there are none) and NCCL (the nvidia-nccl wheel next to that PyTorch).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/install-deps.sh
deps=.deps
prefix=$deps/prefix
rm -rf "$deps"
mkdir -p "$prefix/include" "$prefix/lib/cmake/fmt" "$prefix/lib/cmake/benchmark" "$deps/src"

upstream_version() {  # Debian version of a package without epoch and revision: 9.1.0+ds1-2 -> 9.1.0
  dpkg-query -W -f='${Version}' "$1" | sed -E 's/^[0-9]+://; s/[+~-].*$//'
}

# --- fmt, header-only -------------------------------------------------------------------------
cp -r /usr/include/fmt "$prefix/include/"
fmt_version=$(upstream_version libfmt-dev)
cat > "$prefix/lib/cmake/fmt/fmt-config.cmake" <<'CMAKE'
# fmt, header-only (FMT_HEADER_ONLY), from Debian's libfmt-dev headers; written by
# scripts/stage-gpu-deps.sh. Same target names as fmt's own package: fmt::fmt, fmt::fmt-header-only.
get_filename_component(_fmt_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
foreach(_fmt_target fmt::fmt fmt::fmt-header-only)
  if(NOT TARGET ${_fmt_target})
    add_library(${_fmt_target} INTERFACE IMPORTED)
    set_target_properties(${_fmt_target} PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${_fmt_prefix}/include"
      INTERFACE_COMPILE_DEFINITIONS "FMT_HEADER_ONLY=1")
  endif()
endforeach()
unset(_fmt_target)
unset(_fmt_prefix)
CMAKE

# --- Google Benchmark, Debian's shared library -------------------------------------------------
cp -r /usr/include/benchmark "$prefix/include/"
bench_so=$(readlink -f /usr/lib/x86_64-linux-gnu/libbenchmark.so)
bench_soname=$(objdump -p "$bench_so" | awk '$1 == "SONAME" { print $2 }')
cp "$bench_so" "$prefix/lib/$bench_soname"   # under its soname: what the loader looks for
bench_version=$(upstream_version libbenchmark-dev)
cat > "$prefix/lib/cmake/benchmark/benchmark-config.cmake" <<CMAKE
# Google Benchmark $bench_version, Debian's shared library; written by scripts/stage-gpu-deps.sh.
get_filename_component(_benchmark_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
include(CMakeFindDependencyMacro)
find_dependency(Threads)
if(NOT TARGET benchmark::benchmark)
  add_library(benchmark::benchmark SHARED IMPORTED)
  set_target_properties(benchmark::benchmark PROPERTIES
    IMPORTED_LOCATION "\${_benchmark_prefix}/lib/$bench_soname"
    IMPORTED_SONAME "$bench_soname"
    INTERFACE_INCLUDE_DIRECTORIES "\${_benchmark_prefix}/include"
    INTERFACE_LINK_LIBRARIES Threads::Threads)
endif()
unset(_benchmark_prefix)
CMAKE

# Version files: the exact version, compatible with any request not newer than it.
for package in fmt:$fmt_version benchmark:$bench_version; do
  name=${package%%:*}
  version=${package#*:}
  cat > "$prefix/lib/cmake/$name/$name-config-version.cmake" <<CMAKE
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE
done

# --- GoogleTest sources (googlemock left out) --------------------------------------------------
mkdir -p "$deps/src/googletest"
cp /usr/src/googletest/CMakeLists.txt "$deps/src/googletest/"
cp -r /usr/src/googletest/googletest "$deps/src/googletest/"
rm -rf "$deps/src/googletest/googletest/"{docs,samples,test}
echo "googletest $(upstream_version googletest)" > "$deps/src/googletest/VERSION"

echo "stage-gpu-deps: fmt $fmt_version (header-only), benchmark $bench_version ($bench_soname)," \
     "googletest $(upstream_version googletest) (sources) in $deps/: $(du -sh "$deps" | cut -f1)"
