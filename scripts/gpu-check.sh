#!/usr/bin/env bash
# The GPU check on a lent machine (NVIDIA GPU, CUDA, CMake, ninja, PyTorch with torchvision; no
# network, no apt): the gpu and gpu-torch workflow presets of CMakePresets.json, step by step,
# each under what is left of a time budget, then a summary. What the steps run is CTest tests
# found by file name (tests/CMakeLists.txt, cmake/DetopsGpuCheck.cmake): nothing here names an op.
#   scripts/gpu-check.sh [--out DIR] [--budget SECONDS] [--python PY] [--steps "STEP..."] [-- CMAKE_ARG...]
#     --out DIR       the summary (summary.txt) and one archive (gpu-check.tgz: the results under
#                     benchmarks/results/ and the logs; unpack it in the repository root), rewritten
#                     after every step, so a run stopped from outside keeps what it finished
#                     (default: $OUT, else build-gpu/gpu-check/out)
#     --budget S      seconds for the whole check (default 480: one device command may run 600)
#     --python PY     the Python with torch and torchvision (default: the first of python3, python,
#                     /usr/bin/python3, /usr/local/bin/python3, /opt/conda/bin/python that has them)
#     --steps LIST    the steps to run (default all, in this order):
#       configure     cmake --preset gpu (CUDA required; NCCL from PY's nvidia-nccl wheel when there)
#       build         cmake --build --preset gpu: the gpu suites and detops_bench
#       tests         ctest --preset gpu: the CUDA backend against the CPU bit for bit, launches
#                     blocking (a fault names its test); no device fails (DETOPS_REQUIRE_GPU)
#       tests-async   ctest --preset gpu-async: the same, launches asynchronous as in use
#       bench         ctest --preset gpu-bench: each op's key CUDA benchmarks, one JSON per op
#       compare       ctest --preset gpu-compare: detops vs torchvision's RoIAlign, torch's BatchNorm2d
#       sanitizer     ctest --preset gpu-sanitizer: compute-sanitizer over a few cases of each suite
#       torch-configure, torch-build, torch
#                     the gpu-torch preset: the binding for PY's torch in the same build directory
#                     (libdetops' objects kept), its tests with CUDA, the Mask R-CNN demo on CUDA
#     after --         extra arguments of both configure steps (e.g. -DDETOPS_TORCH_ABI=stable)
# Before it, where the packages are: scripts/stage-gpu-deps.sh (fmt, GoogleTest, Google Benchmark
# into .deps/, which the gpu preset reads); carry .deps. First, in seconds, the driver against
# nvcc's CUDA (13 needs r580, 12 r525, 11 r450): a driver too old fails the check before the build,
# since every CUDA call would fail. Without a GPU (a dry run) the steps that need one are skipped.
# Exit status: nonzero when the driver is too old or a step failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

out=${OUT:-} budget=480 python="" wanted="" extra=()
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --steps) wanted=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
build="build-gpu"
folder=$build/gpu-check
logs=$folder/logs
out=${out:-$folder/out}
date=$(date +%Y-%m-%d)
status=0
mkdir -p "$logs" "$out" benchmarks/results
# what an earlier run left must not reach this summary
rm -f "$folder"/*.json "$folder"/*.txt "$folder"/*.log "$logs"/*.log
: > "$folder/steps.txt"
gpu=0
nvidia-smi -L > /dev/null 2>&1 && gpu=1

record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$folder/steps.txt"; }

# The results under their dated names in benchmarks/results/ (a dry run has none), the summary and
# the archive in $out.
publish() {
  local f final=${1:-}
  ((gpu)) && for f in "$folder"/*.json "$folder"/*.txt; do
    [[ -s $f && $f != */steps.txt ]] || continue
    f=${f##*/}
    cp "$folder/$f" "benchmarks/results/${f%.*}-$date.${f##*.}"
  done
  python3 benchmarks/gpu_summary.py "$folder" --budget "$budget" --elapsed "$SECONDS" ${final:+--final} \
    > "$out/summary.txt.tmp" 2>&1 && mv "$out/summary.txt.tmp" "$out/summary.txt"
  ((gpu)) && cp "$out/summary.txt" "benchmarks/results/gpu-$date-summary.txt"
  # shellcheck disable=SC2046
  tar czf "$out/gpu-check.tgz.tmp" $(ls -d benchmarks/results/*gpu*-"$date"* "$folder"/*.* "$logs"/*.log 2> /dev/null) &&
    mv "$out/gpu-check.tgz.tmp" "$out/gpu-check.tgz"
}

# step NAME CAP COMMAND...: at most CAP seconds and what is left of the budget (less 15 for the
# summary); ctest steps also stop their tests in time (--stop-time) so that CTest prints its summary.
step() {
  local name=$1 cap=$2 limit
  shift 2
  [[ -z $wanted || " $wanted " == *" $name "* ]] || return 0
  limit=$((budget - SECONDS - 15))
  ((limit > cap)) && limit=$cap
  if ((limit < 20)); then
    record "$name" 0 "FAILED: out of time"
    status=1
    publish
    return 1
  fi
  [[ $1 == ctest ]] && set -- "$@" --stop-time "$(date -d "+$((limit - 10)) seconds" +%H:%M:%S)"
  echo "== $name (up to ${limit}s): $* =="
  local start=$SECONDS rc
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$logs/$name.log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) record "$name" $((SECONDS - start)) ok ;;
    124 | 137) record "$name" $((SECONDS - start)) "FAILED (stopped at its ${limit}s limit)"; status=1 ;;
    *) record "$name" $((SECONDS - start)) "FAILED ($rc)"; status=1 ;;
  esac
  publish
  return "$rc"
}

skip() {  # NAME WHY
  [[ -z $wanted || " $wanted " == *" $1 "* ]] || return 0
  echo "== $1: skipped: $2 =="
  record "$1" 0 "skipped: $2"
}

driver_check() {
  local nvcc release major driver need
  nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
  release=$("$nvcc" --version 2> /dev/null | sed -nE 's/.*release ([0-9]+)\.([0-9]+).*/\1.\2/p' | head -n 1)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2> /dev/null | head -n 1 | tr -d ' ')
  major=${release%%.*}
  case $major in 11) need=450 ;; 12) need=525 ;; 13) need=580 ;; *) need=0 ;; esac
  echo "nvcc $nvcc: CUDA ${release:-?}; driver ${driver:-?}"
  if [[ $driver =~ ^[0-9]+ ]] && ((${driver%%.*} < need)); then
    echo "gpu-check: the driver $driver is too old for CUDA $release (needs r$need or newer): every CUDA" \
         "call would fail. Build with a toolkit this driver runs (CUDACXX=<its nvcc>) or use a newer driver."
    return 4
  fi
}

torch=""
pick_python() {
  local c
  for c in ${python:-python3 python /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python}; do
    command -v "$c" > /dev/null 2>&1 || continue
    torch=$(timeout 120 "$c" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.cuda.is_available())' 2> /dev/null | tail -n 1) || continue
    python=$(command -v "$c")
    return 0
  done
  torch=""
  return 1
}

echo "gpu-check: $(date -u +%FT%TZ), budget ${budget}s, results in $out"
pick_python
{
  if ((gpu)); then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1
  else echo "no GPU visible (nvidia-smi): a dry run, the steps that need a device are skipped"; fi
  echo "python: ${python:-none}: ${torch:-no torch with torchvision}"
  cmake --version | head -n 1
  nproc
} > "$logs/machine.log" 2>&1
cat "$logs/machine.log"
if ((gpu)); then
  driver_check 2>&1 | tee "$logs/driver.log"
  if ((PIPESTATUS[0])); then
    record driver 0 "FAILED: $(tail -n 1 "$logs/driver.log" | cut -c 12-200)"
    publish final
    cat "$out/summary.txt"
    exit 1
  fi
fi

# why the torch steps cannot run (empty when they can)
blocker=""
if [[ -z $torch ]]; then blocker="no Python with torch and torchvision"
elif ((!gpu)); then blocker="no GPU visible"
elif [[ $torch != *"cuda True"* ]]; then blocker="$python's ${torch% cuda*} sees no CUDA device"
fi
nccl=()
if [[ -n $python ]] && dir=$("$python" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2> /dev/null) &&
   lib=$(ls "$dir"/lib/libnccl.so* 2> /dev/null | head -n 1) && [[ -f $dir/include/nccl.h ]]; then
  nccl=(-DDETOPS_NCCL_INCLUDE_DIR="$dir/include" -DDETOPS_NCCL_LIBRARY="$lib")
fi
py_args=()
[[ -n $python ]] && py_args=(-DDETOPS_GPU_CHECK_PYTHON="$python")

if step configure 120 cmake --preset gpu "${py_args[@]}" "${nccl[@]}" "${extra[@]}"; then
  step build 360 cmake --build --preset gpu -- -k 0
  if ((gpu)); then
    step tests 240 ctest --preset gpu
    step tests-async 150 ctest --preset gpu-async
    step bench 150 ctest --preset gpu-bench
    if [[ -z $blocker ]]; then step compare 150 ctest --preset gpu-compare; else skip compare "$blocker"; fi
    step sanitizer 120 ctest --preset gpu-sanitizer
  else
    for s in tests tests-async bench compare sanitizer; do skip "$s" "no GPU visible"; done
  fi
  if [[ -n $blocker ]]; then
    for s in torch-configure torch-build torch; do skip "$s" "$blocker"; done
  # Torch's cached find results are dropped first: a directory that once found another torch would
  # keep that torch's library paths next to the new config.
  elif step torch-configure 120 cmake --preset gpu-torch -U Torch_DIR -U 'Caffe2_*' -U 'TORCH_*LIBRARY*' \
         -U 'C10_*LIBRARY*' -U 'c10_*LIBRARY*' -DDETOPS_TORCH_PYTHON="$python" "${py_args[@]}" "${nccl[@]}" "${extra[@]}"; then
    if ! grep -qE 'torch binding ON.*CUDA kernels ON' "$logs/torch-configure.log"; then
      record torch-configure 0 "FAILED: the binding configured without its CUDA kernels (the CUDA tests would skip)"
      status=1
    fi
    step torch-build 180 cmake --build --preset gpu-torch -- -k 0 &&
      step torch 160 ctest --preset gpu-torch -V
  fi
fi
if [[ -s $folder/compare-gpu.json || -s $folder/compare-bn-gpu.json ]] && [[ -n $python ]]; then
  # the charts are a convenience (the JSON has it all): one that cannot be drawn is not a failure
  roi=()
  [[ -s $folder/gpu-roi-align.json ]] && roi=(--bench-json "$folder/gpu-roi-align.json" --bench-filter /f32/)
  [[ -s $folder/compare-gpu.json ]] && timeout 40 "$python" benchmarks/plot_results.py "$folder/compare-gpu.json" "${roi[@]}" \
    --modes-png "benchmarks/results/roi_align_modes-gpu-$date.png" \
    --vs-png "benchmarks/results/roi_align_vs_torchvision-gpu-$date.png" --if-available
  [[ -s $folder/compare-bn-gpu.json ]] && timeout 40 "$python" benchmarks/plot_sync_bn.py "$folder/compare-bn-gpu.json" \
    --out "benchmarks/results/sync-bn-vs-torch-gpu-$date.png"
fi
publish final
cat "$out/summary.txt"
grep -q '^gpu-check: PASSED' "$out/summary.txt" && exit "$status"
exit 1
