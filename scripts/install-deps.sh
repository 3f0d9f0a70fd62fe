#!/usr/bin/env bash
# Installs what building, testing and the golden-vector script of detops need, from Debian's
# packages. Idempotent: when every package is already installed it returns at once, without apt.
set -euo pipefail

packages=(
  build-essential cmake ninja-build                  # toolchain (nvcc, when present, is found by CMake)
  libfmt-dev libgtest-dev libbenchmark-dev           # fmt, GoogleTest (+ its sources), Google Benchmark
  libopenmpi-dev openmpi-bin                         # detops::mpi and its multi-process tests (mpirun)
  python3 python3-numpy python3-torchvision python3-matplotlib   # golden vectors, plots
)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages are installed"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
