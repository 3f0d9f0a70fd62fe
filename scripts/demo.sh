#!/usr/bin/env bash
# Builds detops (the same configuration as scripts/test.sh, stage 1) and runs the demo program:
#   scripts/demo.sh [arguments of detops_demo]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/install-deps.sh >&2
cmake --preset release -DCMAKE_CUDA_ARCHITECTURES="${DETOPS_CUDA_ARCHITECTURES:-90}" >&2
cmake --build --preset release -j "$(nproc)" --target detops_demo >&2
exec build/examples/detops_demo "$@"
