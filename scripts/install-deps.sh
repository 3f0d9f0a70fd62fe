#!/usr/bin/env bash
# Installs what building and testing the C++ library needs (scripts/test.sh, scripts/demo.sh, CI
# on a fresh machine), from Debian's packages. The Python packages of the golden-vector scripts,
# the comparisons with torch and the charts are scripts/install-python-deps.sh.
# Idempotent: when every package is already installed it returns at once, without apt.
set -euo pipefail

packages=(
  build-essential cmake ninja-build                  # toolchain (nvcc, when present, is found by CMake)
  libfmt-dev libgtest-dev libbenchmark-dev           # fmt, GoogleTest (+ its sources), Google Benchmark
  libopenmpi-dev openmpi-bin                         # detops::mpi and its multi-process tests (mpirun)
  python3                                            # ctests detops_isa_symbols, detops_readme_snippets
  python3-venv                                       # scripts/torch-venv.sh: PyPI's torch (stage 1b)
  clang libclang-rt-dev                              # test.sh stage 3: clang build, libFuzzer + ASan/UBSan
  libtorch-dev python3-torchvision python3-pytest    # the PyTorch binding (DETOPS_TORCH), its tests (ctest -L torch)
)
# Skipped where the release has no such package (before Debian 12 and Ubuntu 23.04, clang's own
# packages carry the sanitizer and libFuzzer runtimes; without LibTorch the binding is left out,
# DETOPS_TORCH=AUTO).
optional=(libclang-rt-dev libtorch-dev python3-torchvision python3-pytest)

installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]; }
is_optional() { [[ " ${optional[*]} " == *" $1 "* ]]; }
# Whether apt knows the package; "unknown" until apt has package lists at all.
apt_has() {
  if apt-cache policy "$1" 2>/dev/null | grep 'Candidate:' | grep -qv '(none)'; then echo yes
  elif compgen -G '/var/lib/apt/lists/*_Packages*' > /dev/null; then echo no
  else echo unknown; fi
}

missing=() absent=()
for package in "${packages[@]}"; do
  installed "$package" && continue
  if is_optional "$package" && [[ $(apt_has "$package") == no ]]; then absent+=("$package"); continue; fi
  missing+=("$package")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages are installed${absent[*]:+ (not in this release: ${absent[*]})}"
  exit 0
fi

sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
install=()
for package in "${missing[@]}"; do
  if is_optional "$package" && [[ $(apt_has "$package") != yes ]]; then
    echo "install-deps: $package is not in this release; skipped"
  else
    install+=("$package")
  fi
done
echo "install-deps: installing ${install[*]}"
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${install[@]}"
