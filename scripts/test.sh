#!/usr/bin/env bash
# The test command of the README (and of CI, through .ci/run):
#   1. build/: Release, CUDA backend when nvcc is found (sm_90 unless DETOPS_CUDA_ARCHITECTURES
#      says otherwise), the PyTorch binding (required when libtorch-dev is installed, as
#      install-deps.sh does where the release has it), every test: cpu, gpu (each skips without a
#      device), consumer and torch;
#   1b. scripts/test-wheel.sh: the wheel (stable ABI, built once against PyPI's torch 2.11, the
#      floor), pip-installed into fresh venvs with PyPI's torch 2.11 and 2.15 (cached under
#      ~/.cache/detops by scripts/torch-venv.sh), the binding's Python suite on each;
#   2. build-asan/: CPU-only clang, AddressSanitizer + UBSan at -O1: every target (the tests and
#      the libFuzzer targets of stage 3; the only clang build of the tests), then the cpu tests;
#   3-5. scripts/reliability.sh: fuzzing (build-asan/), ThreadSanitizer (build-tsan/), and the
#      large-tensor tests (build/, only when MemAvailable >= 14 GiB); see that script.
# DETOPS_SKIP_SANITIZERS=1 skips stages 2-5 for a quick local run; DETOPS_SKIP_WHEEL=1 skips stage
# 1b; DETOPS_SKIP_FUZZ=1, DETOPS_SKIP_TSAN=1 and DETOPS_SKIP_LARGE=1 skip one of stages 3-5.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/install-deps.sh

jobs=$(nproc)
arch=${DETOPS_CUDA_ARCHITECTURES:-90}
SECONDS=0

# With LibTorch installed the binding must build: a configure that quietly left it out would skip
# its tests.
torch=AUTO
[[ $(dpkg-query -W -f='${Status}' libtorch-dev 2>/dev/null || true) == "install ok installed" ]] && torch=ON

echo "== stage 1: build/ (CUDA ${arch} when available, PyTorch binding ${torch}) =="
cmake --preset release -DCMAKE_CUDA_ARCHITECTURES="$arch" -DDETOPS_TORCH="$torch"
cmake --build --preset release -j "$jobs"
ctest --preset release    # = ctest --test-dir build --output-on-failure -j2
echo "== stage 1 done after ${SECONDS}s =="

if [[ "${DETOPS_SKIP_WHEEL:-0}" == "1" ]]; then
  echo "== stage 1b (the wheel on PyPI's torch) skipped: DETOPS_SKIP_WHEEL=1 =="
else
  stage_start=$SECONDS
  echo "== stage 1b: the wheel on PyPI's torch (scripts/test-wheel.sh) =="
  ./scripts/test-wheel.sh
  echo "== stage 1b done in $((SECONDS - stage_start))s (${SECONDS}s in all) =="
fi

if [[ "${DETOPS_SKIP_SANITIZERS:-0}" == "1" ]]; then
  echo "== stage 2 (sanitizers) skipped: DETOPS_SKIP_SANITIZERS=1 =="
  exit 0
fi

# One sanitizer build serves stages 2 and 3 (a separate GCC ASan build of the same tests cost
# about ten minutes of CI and found nothing the clang one does not).
echo "== stage 2: build-asan/ (CPU-only clang, address;undefined, libFuzzer targets) =="
cmake --preset asan
cmake --build --preset asan -j "$jobs"
ctest --preset asan       # the cpu label, with ASAN_OPTIONS/UBSAN_OPTIONS halt_on_error=1
echo "== stage 2 done after ${SECONDS}s in all =="

stages_start=$SECONDS
./scripts/reliability.sh
echo "== stages 3-5 done in $((SECONDS - stages_start))s (${SECONDS}s in all) =="
