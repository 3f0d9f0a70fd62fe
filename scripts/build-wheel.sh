#!/usr/bin/env bash
# Builds detops_torch's wheel: one wheel per platform and variant that serves every Python 3 and
# every torch from the floor (2.11) up, because _C.so uses only torch's stable ABI and no libpython
# (tag py3-none-manylinux_*). It is built against the floor's own torch (a venv from
# scripts/torch-venv.sh), repaired by auditwheel with torch's and CUDA's libraries left to torch.
#
#   scripts/build-wheel.sh                     # CPU kernels only -> dist/detops_torch-*.whl
#   scripts/build-wheel.sh --variant cuda      # CPU and CUDA kernels (CUDA 13; torch's runtime)
#   options: --out DIR (default dist/), --torch VERSION (default 2.11.0, the floor),
#            --cuda-archs LIST (default "80;90;100;120", CMake's CMAKE_CUDA_ARCHITECTURES),
#            --jobs N (default nproc)
# The build folder (build-wheel-<variant>/) is kept, so a second run only rebuilds what changed.
# Prints the wheel's path last.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

variant=cpu out=dist torch_version=2.11.0 archs="80;90;100;120" jobs=$(nproc)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --variant) variant=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --torch) torch_version=$2; shift 2 ;;
    --cuda-archs) archs=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "build-wheel.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
case "$variant" in
  cpu) cuda=OFF ;;
  cuda) cuda=ON ;;
  *) echo "build-wheel.sh: --variant is '$variant'; expected cpu or cuda" >&2; exit 2 ;;
esac

venv=$(./scripts/torch-venv.sh "$torch_version")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
SECONDS=0
# --no-build-isolation: built against the venv's torch (the floor), not a freshly downloaded one.
CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$venv/bin/pip" wheel --no-build-isolation --no-deps -q -w "$work/raw" . \
  -C build-dir="build-wheel-$variant" \
  -C cmake.define.DETOPS_TORCH_ABI=stable \
  -C cmake.define.DETOPS_CUDA="$cuda" \
  -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$archs" >&2
raw=$(ls "$work"/raw/*.whl)
echo "build-wheel.sh: built $(basename "$raw") in ${SECONDS}s" >&2

# torch provides these at run time (its own libraries, and for CUDA the nvidia-* wheels it depends
# on): a wheel that carried copies would load a second libtorch or a second CUDA runtime.
excludes=()
for lib in libtorch_cpu.so libtorch_cuda.so libtorch.so libc10.so libc10_cuda.so \
           libcudart.so.13 libcuda.so.1 libnccl.so.2; do
  excludes+=(--exclude "$lib")
done
mkdir -p "$out"
PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair "${excludes[@]}" -w "$out" "$raw" >&2
wheel=$(ls -t "$out"/detops_torch-*"$(basename "$raw" | cut -d- -f2)"*manylinux*.whl | head -1)
echo "build-wheel.sh: $(basename "$wheel"), $(du -h "$wheel" | cut -f1), ${SECONDS}s in all" >&2
echo "$wheel"
