#!/usr/bin/env bash
# Installs the Python packages detops' Python scripts need, from Debian's packages (for
# /usr/bin/python3): torch and torchvision for the golden-vector generators (scripts/gen_golden_*.py)
# and the comparisons (benchmarks/compare_torchvision.py, benchmarks/compare_torch_bn.py,
# scripts/measure_sync_bn_accuracy.py), numpy, and matplotlib for the charts
# (benchmarks/plot_*.py). Building and testing the library needs none of them (scripts/install-deps.sh).
# Idempotent: when every package is already installed it returns at once, without apt.
set -euo pipefail

packages=(
  python3 python3-numpy                              # the interpreter, numpy
  python3-torchvision                                # torchvision and, through it, torch (python3-torch)
  python3-matplotlib                                 # charts
)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-python-deps: all ${#packages[@]} packages are installed"
  exit 0
fi

echo "install-python-deps: installing ${missing[*]}"
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
