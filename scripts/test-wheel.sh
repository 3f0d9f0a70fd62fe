#!/usr/bin/env bash
# Stage 1b of scripts/test.sh: detops_torch as a user of PyPI's torch gets it. Builds the CPU wheel
# once (scripts/build-wheel.sh, against the floor torch), installs it with pip into a fresh venv
# per torch version (each venv sees one cached PyPI torch through a .pth file: scripts/torch-venv.sh),
# and runs the binding's whole Python suite and the README's quickstart against the installed
# wheel, from outside the source tree.
#
#   scripts/test-wheel.sh                  # torch 2.11.0 (the floor) and 2.15.0 (the newest)
#   DETOPS_WHEEL_TORCH="2.11.0 2.13.0 2.15.0" scripts/test-wheel.sh
#   DETOPS_WHEEL=dist/detops_torch-...whl scripts/test-wheel.sh   # test a wheel built before
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
versions=${DETOPS_WHEEL_TORCH:-"2.11.0 2.15.0"}
SECONDS=0

for version in $versions; do
  ./scripts/torch-venv.sh "$version" > /dev/null
done
echo "test-wheel: torch venvs ready after ${SECONDS}s"

wheel=${DETOPS_WHEEL:-}
if [[ -z "$wheel" ]]; then
  wheel=$(./scripts/build-wheel.sh --variant cpu --out build-wheel-dist)
fi
echo "test-wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) after ${SECONDS}s"
if [[ -z "${DETOPS_WHEEL:-}" && -f build-wheel-cpu/build.ninja ]]; then
  # The CUDA wheel's glue (the shim's stream, USE_CUDA), compiled in the CPU wheel's build folder.
  cmake --build build-wheel-cpu --target detops_torch_cuda_glue
  echo "test-wheel: the stable layer's CUDA glue compiles (${SECONDS}s)"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for version in $versions; do
  torch_venv=$(./scripts/torch-venv.sh "$version")
  venv="$work/venv-$version"
  "$torch_venv/bin/python" -m venv "$venv"
  # The fresh venv sees the cached torch (and pytest) as if installed in it; the wheel is installed
  # into it for real.
  base=$("$torch_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base" > "$site/torch-venv.pth"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "$wheel"
  where=$(cd "$work" && "$venv/bin/python" -c 'import detops_torch, torch; print(torch.__version__, detops_torch.__file__)')
  echo "test-wheel: torch ${where%% *}: detops_torch from ${where#* }"
  if [[ "$where" != *"$venv"* ]]; then
    echo "test-wheel: detops_torch was not imported from the installed wheel" >&2
    exit 1
  fi
  # From outside the source tree: only the tests come from the repository.
  (cd "$work" && "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
     "$repo/bindings/torch/tests") || status=1
  (cd "$work" && "$venv/bin/python" "$repo/examples/torch/quickstart.py" > "$work/quickstart-$version.log") || {
    cat "$work/quickstart-$version.log"; status=1; }
  echo "test-wheel: torch $version done after ${SECONDS}s"
done
exit $status
