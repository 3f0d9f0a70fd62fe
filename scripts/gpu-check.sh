#!/usr/bin/env bash
# GPU check: one command for a lent GPU machine (NVIDIA GPU, CUDA, CMake, ninja, PyTorch with
# torchvision; no network, no apt), sized to the lease (one command may run 10 minutes, the whole
# lease is 15 including the machine's start). Builds only what the check needs, against the
# dependencies that scripts/stage-gpu-deps.sh put in .deps/ (carry it). First, within seconds:
#   driver      the NVIDIA driver against nvcc's CUDA version (CUDA 13 needs r580 or newer, 12
#               r525, 11 r450; and nvidia-smi's "CUDA Version" at least nvcc's major): an older
#               driver fails the check here, before anything is built, since it would make every
#               CUDA call fail and so every GPU test skip
#   machine     GPU, driver, nvcc, compilers, the Python with torch and torchvision, NCCL
# then the build (GoogleTest, configure, build: what `cmake --workflow --preset gpu` configures and
# builds, plus the staged dependencies' paths) and, in this order:
#   tests       ctest -L gpu with CUDA_LAUNCH_BLOCKING=1 (the CUDA backend against the CPU, bit for
#               bit; the NCCL test when NCCL was found): blocking launches, so that an asynchronous
#               fault is reported by the test that caused it; FAILED when a GPU is visible but
#               every test skipped. NCCL suites whose one-rank bootstrap (ncclCommInitAll) the
#               machine refuses -- a sandbox without the shared memory or sockets NCCL wants --
#               are probed first, left out and reported as skipped with NCCL's reason
#   tests-async ctest -L gpu again, launches asynchronous as in use (stream-ordering mistakes that
#               blocking launches hide); skipped, not failed, when out of time or without a GPU
#   compare     detops vs torchvision CUDA, alternating (benchmarks/compare_torchvision.py:
#               compare-gpu-<date>.{json,txt}), torchvision's deterministic fallback included
#   bench       Google Benchmark, the key CUDA runs of each benchmarks/<op>_bench.cpp
#               (gpu-<op>-<date>.json, <op> with '-' for '_')
#   compare-bn  SyncBatchNorm vs torch.nn.BatchNorm2d training forward+backward
#               (benchmarks/compare_torch_bn.py: compare-bn-gpu-<date>.{json,txt})
#   sanitizer   compute-sanitizer over a few cases of each tests/*_cuda_test.cpp suite
#               ("unsupported" when the machine's runtime refuses it: not a failure of detops)
#   torch-build the PyTorch binding (cmake/DetopsTorch.cmake) in the same build directory,
#               reconfigured with DETOPS_TORCH=ON for the picked Python's torch (libdetops' CUDA
#               objects are reused, not recompiled): _C.so, the Python package, the LibTorch consumer
#   torch       ctest -L torch: bindings/torch/tests (pytest, or unittest where the machine has no
#               pytest), the Mask R-CNN smoke run and the LibTorch consumer; the counts of the
#               Python tests inside (run, skipped) go into the summary
#   maskrcnn    examples/torch/train_maskrcnn.py on CUDA (maskrcnn-gpu-<date>.json, also copied
#               to $OUT/maskrcnn.json): per variant, runs identical or not, step time, peak memory
#   plots       the charts from the JSON (also possible later, where the JSON is copied to)
# The comparisons and the binding's phases use the torch and torchvision already installed (the
# GPU machine has them and no package registry: nothing is ever installed here); without them, or
# without a CUDA device that torch can use, they are skipped with the reason (the binding's phases
# also when it did not configure or build).
# Every phase is timed and gets at most its own cap and what is left of GPU_CHECK_BUDGET; one
# that would get under 20 s is skipped and the summary says so. After every phase the summary
# (benchmarks/results/gpu-<date>-summary.txt) and, when $OUT is set, $OUT/summary.txt and
# $OUT/gpu-check.tgz (benchmarks/results/*gpu*-<date>* and build-gpu/gpu-check/*.log), and
# $OUT/maskrcnn.json once the demo has written it, are rewritten, so a run stopped from outside
# still leaves what it finished. Unpack the archive in the repository root: `tar xzf gpu-check.tgz`.
#   GPU_CHECK_BUDGET            seconds for the whole run (default 480)
#   GPU_CHECK_PHASES            phases to run after the build (default: all, in the order above)
#   DETOPS_CUDA_ARCHITECTURES   CUDA architectures (default 90: H100/H200)
#   BENCH_MIN_TIME              --benchmark_min_time in seconds (default 0.01: CUDA time per call,
#                               and an iteration runs 10 calls, so about 0.1 s of device time)
#   BENCH_REPETITIONS           repetitions, for the medians (default 3)
#   PYTHON                      the python with torch and torchvision (default: the first of
#                               python3, python, /usr/bin/python3, /usr/local/bin/python3,
#                               /opt/conda/bin/python that imports them)
#   COMPARE_ARGS                arguments for compare_torchvision.py (default: --devices cuda
#                               --rounds 3 --tv-compile off --min-time 0.02)
#   COMPARE_BN_ARGS             arguments for compare_torch_bn.py (default: --device cuda --shapes
#                               res2,res5,box --modes default,exact --rounds 3 --min-time 0.01)
#   MASKRCNN_ARGS               arguments for train_maskrcnn.py (default: --device cuda --steps 3
#                               --size 512); it runs under `timeout 90` (MASKRCNN_TIMEOUT)
#   GPU_CHECK_TORCH_CPU         1: run the binding's phases even where torch sees no CUDA device
#   GPU_CHECK_TORCH_ABI         the binding's registration layer: classic (default) or stable (the
#                               wheel's: its CUDA stream and scratch come through torch's C shim)
#                               (a dry run on a CPU machine: the CUDA tests skip; pass a CPU
#                               MASKRCNN_ARGS)
#   SANITIZER_TOOLS             compute-sanitizer tools (default "memcheck"; add racecheck,
#                               initcheck when there is time; empty: the phase is skipped)
#   SANITIZER_FILTER_<exe>      --gtest_filter for one executable (defaults: see sanitizer_filter)
#   NCCL_ROOT                   where nccl.h and libnccl are (default: the nvidia-nccl wheel of
#                               $PYTHON, when there is one)
#   GPU_CHECK_CMAKE_ARGS        extra configure arguments
#   GPU_CHECK_BUILD_DIR         build directory (default build-gpu)
#   GPU_CHECK_JOBS              build jobs (default: every core)
#   CUDACXX                     the nvcc to build with and to check the driver against (default:
#                               nvcc on PATH, else $CUDA_HOME/bin/nvcc, else /usr/local/cuda/bin)
# On a lent machine: scripts/stage-gpu-deps.sh here first, then one device call carrying .deps:
#   GPU_CHECK_BUDGET=480 ./scripts/gpu-check.sh   (timeout_s 540: the budget leaves it margin)
# Exit status: nonzero when the driver is too old for nvcc, or the build, a test, a benchmark or a
# comparison failed.
# Nothing here names an op: what runs is found by the file naming conventions of
# tests/CMakeLists.txt and benchmarks/CMakeLists.txt, so a new op is checked without an edit here:
#   tests       the label gpu (tests/*_cuda_test.cpp and the NCCL test), built as detops_tests_gpu;
#               the NCCL suites (probed, and left out when NCCL refuses to start) are those of the
#               detops_nccl_communicator_test executable
#   bench       per benchmarks/<op>_bench.cpp, the benchmarks its "// gpu-check bench: <regex>"
#               line selects; without one, its CUDA benchmarks ^BM_<Op>[A-Za-z]*/cuda/ (<Op>: the
#               stem in CamelCase, e.g. deform_conv_bench.cpp -> BM_DeformConv...)
#   sanitizer   per tests/<name>_cuda_test.cpp (detops_<name>_cuda_test), the cases its
#               "// gpu-check sanitizer: <gtest filter>" line selects; without one, the first
#               instance of each parameterized test and the *BadInput suites
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$PWD

budget=${GPU_CHECK_BUDGET:-480}
arch=${DETOPS_CUDA_ARCHITECTURES:-90}
jobs=${GPU_CHECK_JOBS:-$(nproc)}
build=${GPU_CHECK_BUILD_DIR:-build-gpu}
logs=$build/gpu-check
prefix=$root/.deps/prefix
# GoogleTest is built on the machine that runs the check and installed into the build directory,
# not into .deps/: a .deps/ that a dry run elsewhere used stays free of binaries built there.
gtest_prefix=$build/_deps/prefix
[[ $gtest_prefix == /* ]] || gtest_prefix=$root/$gtest_prefix
date=$(date +%Y-%m-%d)
results=benchmarks/results
compare_json=$results/compare-gpu-$date.json
compare_txt=$results/compare-gpu-$date.txt
compare_bn_json=$results/compare-bn-gpu-$date.json
compare_bn_txt=$results/compare-bn-gpu-$date.txt
roi_json=$results/gpu-roi-align-$date.json
modes_png=$results/roi_align_modes-gpu-$date.png
vs_png=$results/roi_align_vs_torchvision-gpu-$date.png
bn_png=$results/sync-bn-vs-torch-gpu-$date.png
python=${PYTHON:-python3}  # replaced by pick_python below
summary=$logs/summary.txt
sanitizer_txt=$logs/sanitizer-summary.txt
ctest_out=$logs/ctest.txt
ctest_async_out=$logs/ctest-async.txt
nccl_skip_txt=$logs/nccl-skip.txt  # written by the tests phase (a subshell): the NCCL probe's verdict
ctest_torch_out=$logs/ctest-torch.txt
ctest_torch_full=$logs/ctest-torch-output.log  # ctest -V: every torch test's own output
torch_state=$logs/torch-build.txt  # written by the torch-build phase (a subshell): "ok" or why not
maskrcnn_json=$results/maskrcnn-gpu-$date.json
maskrcnn_ran=0  # 1 once this run started the demo: an older JSON of the same date is not reported
status=0
phases=()
gpu_visible=0

# The ops with benchmarks (benchmarks/<op>_bench.cpp) and the gpu suites (tests/<name>_cuda_test.cpp
# -> detops_<name>_cuda_test), by file name.
bench_order=()
for f in benchmarks/*_bench.cpp; do
  [[ -e $f ]] && bench_order+=("$(basename "$f" _bench.cpp | tr _ -)")
done
cuda_tests=()
for f in tests/*_cuda_test.cpp; do
  [[ -e $f ]] && cuda_tests+=("detops_$(basename "$f" .cpp)")
done

# The --benchmark_filter of one op (roi-align): the "// gpu-check bench:" line of its file, or all
# of its CUDA benchmarks by the naming convention.
bench_filter() {
  local file=benchmarks/${1//-/_}_bench.cpp line
  line=$(sed -nE 's|^// gpu-check bench: *(.*[^ ]) *$|\1|p' "$file" | head -n 1)
  [[ -n $line ]] && { echo "$line"; return; }
  echo "^BM_$(sed -E 's/(^|_)([a-z])/\U\2/g' <<< "${1//-/_}")[A-Za-z]*/cuda/"
}

# The --gtest_filter of one gpu suite under compute-sanitizer: SANITIZER_FILTER_<exe>, else the
# "// gpu-check sanitizer:" line of its source, else (from --gtest_list_tests) the first instance
# of each parameterized test and every test of a *BadInput suite.
sanitizer_filter() {
  local exe=$1 var=SANITIZER_FILTER_$1 line
  [[ -n ${!var:-} ]] && { echo "${!var}"; return; }
  line=$(sed -nE 's|^// gpu-check sanitizer: *(.*[^ ]) *$|\1|p' "tests/${exe#detops_}.cpp" 2> /dev/null | head -n 1)
  [[ -n $line ]] && { echo "$line"; return; }
  "$build/tests/$exe" --gtest_list_tests 2> /dev/null | awk '
    /^[^ ]/ { suite = $1; next }
    {
      test = $1; base = test; sub(/\/.*/, "", base)
      if (test != base) { if (!((suite base) in seen)) { seen[suite base] = 1; out = out sep suite test; sep = ":" } }
      else if (suite ~ /BadInput\.$/) { out = out sep suite test; sep = ":" }
    }
    END { print out }'
}

if [[ ! -d .deps/prefix || ! -d .deps/src/googletest ]]; then
  echo "gpu-check: .deps/ is missing; run scripts/stage-gpu-deps.sh where the packages are, and carry .deps" >&2
  exit 2
fi
mkdir -p "$logs" "$results"
# what an earlier run's binding phases left in the build directory must not reach this summary
rm -f "$torch_state" "$ctest_torch_out" "$ctest_torch_full" "$logs/maskrcnn.log"

left() { echo $((budget - SECONDS)); }

# phase NAME CAP COMMAND...: runs COMMAND (a function) with PHASE_LIMIT = at most CAP seconds and
# what is left of the budget, less 15 s for the summary, and PHASE_DEADLINE (in $SECONDS) where
# that ends; the function runs its long commands through `limited`, which stops each at the
# deadline. Its output goes to the terminal and to build-gpu/gpu-check/NAME.log; the name,
# seconds and result are recorded; then it publishes. A phase with under 20 s left is skipped;
# skipping one the check cannot do without (gtest, configure, build, tests) fails the check.
phase() {
  local name=$1 cap=$2 log=$logs/$1.log
  shift 2
  local limit=$(( $(left) - 15 ))
  ((limit > cap)) && limit=$cap
  if ((limit < 20)); then
    echo "== $name: skipped, out of time (budget ${budget}s) =="
    case $name in
      gtest | configure | build | tests)
        phases+=("$(printf '%-11s %4ds  %s' "$name" 0 "FAILED: skipped, out of time")")
        status=1 ;;
      *) phases+=("$(printf '%-11s %4ds  %s' "$name" 0 "skipped: out of time")") ;;
    esac
    publish
    return 1
  fi
  echo "== $name (up to ${limit}s) =="
  local start=$SECONDS rc
  PHASE_LIMIT=$limit
  PHASE_DEADLINE=$((SECONDS + limit))
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local result
  case $rc in
    0) result=ok ;;
    75) result="partly skipped: out of time" ;;  # the phase's own choice, not a failure
    124 | 137) result="FAILED (stopped at its ${limit}s limit)" ;;
    *) result="FAILED ($rc)" ;;
  esac
  phases+=("$(printf '%-11s %4ds  %s' "$name" $((SECONDS - start)) "$result")")
  [[ $rc -eq 0 || $rc -eq 75 ]] || status=1
  publish
  return "$rc"
}

skip_phase() {  # NAME WHY
  echo "== $1: $2 =="
  phases+=("$(printf '%-11s %4ds  %s' "$1" 0 "$2")")
  publish
}

# seconds to the phase's deadline (at least 1)
until_deadline() {
  local t=$((PHASE_DEADLINE - SECONDS))
  ((t < 1)) && t=1
  echo "$t"
}
limited() { timeout --kill-after=5 "$(until_deadline)" "$@"; }

wanted() { [[ -z ${GPU_CHECK_PHASES:-} || " $GPU_CHECK_PHASES " == *" $1 "* ]]; }

machine_info() {
  if [[ $gpu_visible == 1 ]]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  else
    echo "no GPU visible (nvidia-smi missing or failing): gpu tests and CUDA benchmarks will skip"
  fi
  echo "nvcc: ${nvcc:-not found}: $("${nvcc:-false}" --version 2> /dev/null | tail -n 1)"
  cmake --version | head -n 1
  c++ --version | head -n 1
  echo "python: $python: ${torch_info:-$torch_missing}"
  echo "NCCL: ${nccl_root:-not found (the NCCL test is left out)}"
  echo "cores: $jobs, budget: ${budget}s"
}

# The nvcc that CMake will use: $CUDACXX, else nvcc on PATH, else the toolkit's usual places.
find_nvcc() {
  local c
  for c in "${CUDACXX:-}" "$(command -v nvcc 2> /dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
    [[ -n $c && -x $c ]] && { echo "$c"; return 0; }
  done
  return 1
}

# The oldest driver branch that runs a toolkit major version (CUDA's minor-version compatibility:
# every 13.x runs on r580 or newer, every 12.x on r525, every 11.x on r450).
min_driver_for() {
  case $1 in
    11) echo 450 ;;
    12) echo 525 ;;
    13) echo 580 ;;
    *) echo "" ;;
  esac
}

# Fails (rc 4) when the driver is older than nvcc's CUDA needs. Nothing to compare without a GPU
# or without nvcc (the build reports that); the versions come from nvidia-smi, not from a CUDA
# call, so this takes a second, before the build.
check_driver() {
  if [[ $gpu_visible != 1 ]]; then echo "no GPU visible: no driver to check"; return 0; fi
  if [[ -z ${nvcc:-} ]]; then echo "no nvcc found (CUDACXX, PATH, \$CUDA_HOME/bin): the build will say so"; return 0; fi
  local release major driver branch need smi_cuda
  release=$("$nvcc" --version | sed -nE 's/.*release ([0-9]+)\.([0-9]+).*/\1.\2/p' | head -n 1)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2> /dev/null | head -n 1 | tr -d ' ')
  smi_cuda=$(nvidia-smi 2> /dev/null | sed -nE 's/.*CUDA Version: *([0-9]+\.[0-9]+).*/\1/p' | head -n 1)
  major=${release%%.*}
  branch=${driver%%.*}
  need=$(min_driver_for "$major")
  echo "nvcc $nvcc: CUDA ${release:-?}; driver ${driver:-?} (nvidia-smi: supports CUDA up to ${smi_cuda:-?})"
  if [[ -z $release || ! $branch =~ ^[0-9]+$ ]]; then
    echo "gpu-check: could not read the versions (nvcc '${release}', driver '${driver}'): not checked"
    return 0
  fi
  if [[ -n $need ]] && ((branch < need)); then
    echo "gpu-check: FAILED: the driver is too old for this toolkit: nvcc is CUDA $release, which needs an NVIDIA" \
         "driver r$need or newer, and this machine's driver is $driver. Every CUDA call would fail" \
         "(cudaErrorInsufficientDriver) and every GPU test would skip. Build with a toolkit this driver" \
         "runs (CUDACXX=<its nvcc>; CUDA ${smi_cuda:-that the driver supports} or older) or use a newer driver."
    return 4
  fi
  if [[ -n $smi_cuda ]] && ((${smi_cuda%%.*} < major)); then
    echo "gpu-check: FAILED: the driver is too old for this toolkit: nvcc is CUDA $release and driver $driver" \
         "supports CUDA up to $smi_cuda. Every CUDA call would fail and every GPU test would skip."
    return 4
  fi
  echo "driver ok for CUDA $release${need:+ (needs r$need or newer)}"
}

# The Python for the comparisons: $PYTHON when set, else the first interpreter here that imports
# torch and torchvision (the GPU machine has them preinstalled and no package registry: nothing is
# installed, ever). Sets python and torch_info ("torch X torchvision Y cuda True|False"), or
# torch_missing (why there is none). Runs in the main shell, before the phases.
pick_python() {
  local candidates=() c out first_error=""
  if [[ -n ${PYTHON:-} ]]; then
    candidates=("$PYTHON")
  else
    candidates=(python3 python /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python)
  fi
  torch_info="" torch_missing=""
  for c in "${candidates[@]}"; do
    command -v "$c" > /dev/null 2>&1 || continue
    if out=$(timeout 120 "$c" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.cuda.is_available())' 2>&1); then
      python=$c
      torch_info=$(tail -n 1 <<< "$out")
      return 0
    fi
    [[ -n $first_error ]] || first_error="$c: $(grep -E '[A-Za-z]*Error' <<< "$out" | tail -n 1)"
  done
  python=${candidates[0]}
  torch_missing="no torch with torchvision (tried ${candidates[*]}; ${first_error:-none of them runs})"
  return 1
}

# Why a comparison cannot run (empty when it can): no torch/torchvision, no GPU, or a torch that
# sees no CUDA device (e.g. a torch built for a newer driver).
compare_blocker() {
  if [[ -z $torch_info ]]; then echo "$torch_missing"
  elif [[ $gpu_visible != 1 ]]; then echo "no GPU visible"
  elif [[ $torch_info != *"cuda True"* ]]; then echo "$python's ${torch_info% cuda*} sees no CUDA device"
  fi
}

# NCCL: $NCCL_ROOT, else the nvidia-nccl wheel next to PyTorch (include/nccl.h, lib/libnccl.so.2;
# find_library wants libnccl.so, so the library is named explicitly).
find_nccl() {
  local dir=${NCCL_ROOT:-}
  if [[ -z $dir ]]; then
    dir=$("$python" -c 'import nvidia.nccl as m, os; print(list(m.__path__)[0])' 2> /dev/null) || dir=""
  fi
  [[ -n $dir && -f $dir/include/nccl.h ]] || return 1
  local lib
  lib=$(ls "$dir"/lib/libnccl.so "$dir"/lib/libnccl.so.[0-9]* 2> /dev/null | head -n 1)
  [[ -n $lib ]] || return 1
  echo "$dir|$lib"
}

build_googletest() {
  if [[ -f $gtest_prefix/lib/cmake/GTest/GTestConfig.cmake || -f $gtest_prefix/lib64/cmake/GTest/GTestConfig.cmake ]]; then
    echo "GoogleTest already installed in $gtest_prefix"
    return 0
  fi
  # CMAKE_POLICY_VERSION_MINIMUM: googletest 1.12 asks for CMake 3.5, which CMake 4 refuses.
  limited cmake -S .deps/src/googletest -B "$build/_deps/googletest" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_INSTALL_PREFIX="$gtest_prefix" \
        -DCMAKE_POLICY_VERSION_MINIMUM=3.5 &&
    limited cmake --build "$build/_deps/googletest" -j "$jobs" &&
    limited cmake --install "$build/_deps/googletest"
}

configure() {
  local cmake_args=()
  if [[ -n ${nccl_lib:-} ]]; then  # NCCL from $NCCL_ROOT or the nvidia-nccl wheel
    cmake_args=(-DDETOPS_NCCL_INCLUDE_DIR="$nccl_root/include" -DDETOPS_NCCL_LIBRARY="$nccl_lib")
  fi
  # the nvcc the driver was checked against
  [[ -n ${nvcc:-} ]] && cmake_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
  # The torch binding stays OFF here (the torch-build phase turns it on): a torch whose CMake
  # config fails must not cost the CUDA tests.
  # shellcheck disable=SC2086  # GPU_CHECK_CMAKE_ARGS is a list of words
  limited cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDETOPS_CUDA=ON -DDETOPS_MPI=OFF -DDETOPS_TORCH=OFF \
        -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_PREFIX_PATH="$prefix;$gtest_prefix" "${cmake_args[@]}" ${GPU_CHECK_CMAKE_ARGS:-}
}

# Only what the check runs: the gpu suites (detops_tests_gpu: the CUDA tests, and the NCCL test
# when configured) and detops_bench; -k 0: one target that fails to build does not stop the others.
build_targets() {
  echo "targets: detops_tests_gpu (${cuda_tests[*]}, the NCCL test when configured) detops_bench"
  limited cmake --build "$build" -j "$jobs" --target detops_tests_gpu detops_bench -- -k 0
}

# NCCL may refuse to bootstrap even a one-rank world where the machine is a sandbox (no shared
# memory, no sockets): that is the machine, not detops. The NCCL executable's first test is run
# alone; when it fails with ncclCommInitAll's error (or does not return), its suites are left out
# of both test passes and $nccl_skip_txt says why (line 1: the ctest -E regex, line 2: the
# reason, line 3: how many tests). Anything else is left to ctest to report.
nccl_probe() {
  rm -f "$nccl_skip_txt"
  local exe list first out rc reason suites count
  exe=$(find "$build/tests" -name detops_nccl_communicator_test -type f -perm -u+x 2> /dev/null | head -n 1)
  [[ -n $exe && $gpu_visible == 1 ]] || return 0
  list=$(limited "$exe" --gtest_list_tests 2> /dev/null) || return 0
  first=$(awk '/^[^ ]/ { suite = $1; next } { print suite $1; exit }' <<< "$list")
  [[ -n $first ]] || return 0
  out=$(timeout 60 "$exe" --gtest_filter="$first" 2>&1)
  rc=$?
  if ((rc == 124)); then
    reason="ncclCommInitAll did not return within 60 s ($first)"
  elif ((rc != 0)) && reason=$(grep -m 1 -oE 'ncclCommInitAll[^:]*failed: .*' <<< "$out"); then
    reason="$reason ($first)"
  else
    echo "NCCL probe: $first ran (exit $rc): the NCCL suites run with the others"
    return 0
  fi
  # ctest names the cases Suite.Test (parameterized: Prefix/Suite.Test/Param): one regex of suites
  suites=$(awk '/^[^ ]/ { sub(/\.$/, "", $1); gsub(/[][.*+?^$(){}|\\]/, "\\\\&", $1); printf "%s%s", sep, $1; sep = "|" }' <<< "$list")
  count=$(grep -c '^  ' <<< "$list")
  printf '^(%s)[.]\n%s\n%s\n' "$suites" "$reason" "$count" > "$nccl_skip_txt"
  echo "NCCL probe: the machine refuses NCCL's bootstrap: $reason; its $count tests are skipped"
  tail -n 20 <<< "$out"
}

# ctest -L gpu, pass 1 (CUDA_LAUNCH_BLOCKING=1: a fault is reported at the launch that caused it)
# or pass 2 (async: launches as in use). Pass 1 first probes NCCL (above) and fails when a GPU is
# visible and every test skipped (a driver too old for the toolkit reads as "no device" to the
# tests).
run_tests() {
  local pass=$1 out=$ctest_out exclude=() rc line total skipped
  if [[ $pass == first ]]; then
    nccl_probe
  else
    out=$ctest_async_out
  fi
  if [[ -s $nccl_skip_txt ]]; then
    exclude=(-E "$(head -n 1 "$nccl_skip_txt")")
    echo "left out (NCCL refused to start): ${exclude[1]}"
  fi
  if [[ $pass == first ]]; then
    echo "ctest -L gpu with CUDA_LAUNCH_BLOCKING=1 (a fault is reported by the test whose launch caused it)"
    CUDA_LAUNCH_BLOCKING=1 limited ctest --test-dir "$build" -L gpu "${exclude[@]}" --output-on-failure -j 8 --timeout 150 > "$out" 2>&1
  else
    echo "ctest -L gpu with asynchronous launches (stream-ordering mistakes that blocking launches hide)"
    env -u CUDA_LAUNCH_BLOCKING timeout --kill-after=5 "$(until_deadline)" \
      ctest --test-dir "$build" -L gpu "${exclude[@]}" --output-on-failure -j 8 --timeout 150 > "$out" 2>&1
  fi
  rc=$?
  cat "$out"
  [[ $pass == first ]] || return "$rc"
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$out" | tail -n 1)
  total=$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<< "$line")
  skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$out")
  if [[ $gpu_visible == 1 && -n $total && $total -gt 0 && $skipped -eq $total ]]; then
    # ctest does not print a skipped test's output: ask one test binary why
    echo "gpu-check: a GPU is visible but all $total gpu tests skipped:" \
      "$("$build/tests/${cuda_tests[0]}" 2>&1 | grep -m 1 -o 'no CUDA device: [^;]*')"
    return 3
  fi
  return "$rc"
}

# Returns 75 when some op was skipped for time (and none failed).
run_benchmarks() {
  local name rc=0 json t skipped=0 filter
  for name in "${bench_order[@]}"; do
    json=$results/gpu-$name-$date.json
    t=$(until_deadline)
    ((t > PHASE_LIMIT / 2)) && t=$((PHASE_LIMIT / 2))
    if ((t < 15)); then echo "bench $name: skipped, out of time"; skipped=1; continue; fi
    filter=$(bench_filter "$name")
    # (without a device RoIAlign registers placeholders only: a miss fails only where a GPU is)
    if ! grep -q '^BM_' <<< "$("$build/benchmarks/detops_bench" --benchmark_list_tests --benchmark_filter="$filter" 2> /dev/null)"; then
      if [[ $gpu_visible == 1 ]]; then
        echo "bench $name: FAILED: no benchmark matches $filter (name them BM_<Op>.../cuda/..., or give" \
             "benchmarks/${name//-/_}_bench.cpp a '// gpu-check bench: <regex>' line)"
        rc=1
      else
        echo "bench $name: no benchmark matches $filter (no GPU visible)"
      fi
      continue
    fi
    echo "-- bench $name (up to ${t}s): $filter --"
    timeout "$t" "$build/benchmarks/detops_bench" --benchmark_filter="$filter" \
      --benchmark_out="$json" --benchmark_out_format=json --benchmark_min_time="${BENCH_MIN_TIME:-0.01}" \
      --benchmark_repetitions="${BENCH_REPETITIONS:-3}" --benchmark_report_aggregates_only=true || rc=1
  done
  ((rc == 0 && skipped)) && rc=75
  return "$rc"
}

# detops vs torchvision on the same shapes, alternating; rounds stop at 3/4 of the phase's time.
run_compare() {
  # shellcheck disable=SC2086  # COMPARE_ARGS is a list of words
  limited "$python" benchmarks/compare_torchvision.py --bench "$build/benchmarks/detops_bench" \
    --json "$compare_json" --table "$compare_txt" --max-seconds $((PHASE_LIMIT * 3 / 4)) --bench-timeout 60 \
    ${COMPARE_ARGS:---devices cuda --rounds 3 --tv-compile off --min-time 0.02}
}

run_compare_bn() {
  # shellcheck disable=SC2086  # COMPARE_BN_ARGS is a list of words
  limited "$python" benchmarks/compare_torch_bn.py --bench "$build/benchmarks/detops_bench" \
    --out "$compare_bn_json" --table "$compare_bn_txt" --max-seconds $((PHASE_LIMIT * 3 / 4)) --bench-timeout 40 \
    ${COMPARE_BN_ARGS:---device cuda --shapes res2,res5,box --modes default,exact --rounds 3 --min-time 0.01}
}

find_compute_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2> /dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
           "$(dirname "$(command -v nvcc 2> /dev/null || echo /nonexistent/nvcc)")/compute-sanitizer" \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -n $c && -x $c ]] && { echo "$c"; return 0; }
  done
  return 1
}

# compute-sanitizer over --gtest_filter subsets; one line per tool and executable in
# $sanitizer_txt. A first probe that the sanitizer refuses ("Device not supported": gVisor) ends
# the phase as unsupported, which is recorded but not a failure.
run_compute_sanitizer() {
  local cs=$1 failed=0 tool exe filter start rc log result errors ran
  : > "$sanitizer_txt"
  echo "compute-sanitizer: $cs ($("$cs" --version 2> /dev/null | grep -Eo 'Version [0-9.]+' | head -n 1))"
  for tool in ${SANITIZER_TOOLS-memcheck}; do
    for exe in "${cuda_tests[@]}"; do
      if [[ ! -x $build/tests/$exe ]]; then
        echo "$(printf '%-9s %-36s' "$tool" "$exe") FAILED (not built)" | tee -a "$sanitizer_txt"
        failed=1
        continue
      fi
      local t
      t=$(until_deadline)
      ((t > 90)) && t=90
      if ((t < 20)); then
        echo "$(printf '%-9s %-36s' "$tool" "$exe") skipped: out of time" | tee -a "$sanitizer_txt"
        continue
      fi
      filter=$(sanitizer_filter "$exe")
      [[ $tool == racecheck ]] && filter=${filter%%:*}  # racecheck is the slowest: one case
      log=$logs/sanitizer-$tool-$exe.log
      start=$SECONDS
      timeout "$t" "$cs" --tool "$tool" --error-exitcode 86 --print-limit 20 \
        "$build/tests/$exe" --gtest_filter="$filter" --gtest_brief=1 > "$log" 2>&1
      rc=$?
      if grep -q 'Device not supported' "$log"; then
        echo "compute-sanitizer: unsupported on this machine ('Device not supported'; gVisor?): phase not run" |
          tee -a "$sanitizer_txt"
        return 0
      fi
      errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards? displayed' "$log" | tail -n 1)
      ran=$(grep -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' "$log" | tail -n 1 | grep -Eo '^[0-9]+ tests?')
      [[ $rc -eq 0 && -z $ran ]] && rc=87  # the filter matched nothing (or gtest did not finish)
      case $rc in
        0) result="ok" ;;
        87) result="FAILED (no test ran: check the --gtest_filter)"; failed=1 ;;
        86) result="FAILED (errors reported)"; failed=1 ;;
        124) result="FAILED (timed out after ${t}s)"; failed=1 ;;
        *) result="FAILED (exit $rc)"; failed=1 ;;
      esac
      echo "$(printf '%-9s %-36s %4ds' "$tool" "$exe" $((SECONDS - start))) $result; ${ran:-no tests ran}; ${errors:-no sanitizer summary}" |
        tee -a "$sanitizer_txt"
      [[ $rc -eq 0 ]] || tail -n 40 "$log"
    done
  done
  return "$failed"
}

# Why the binding's phases cannot run (empty when they can): no torch/torchvision, no GPU, or a
# torch that sees no CUDA device. GPU_CHECK_TORCH_CPU=1 lets a CPU-only torch through (dry runs).
torch_blocker() {
  if [[ -z $torch_info ]]; then echo "$torch_missing"
  elif [[ ${GPU_CHECK_TORCH_CPU:-0} == 1 ]]; then return 0
  elif [[ $gpu_visible != 1 ]]; then echo "no GPU visible"
  elif [[ $torch_info != *"cuda True"* ]]; then echo "$python's ${torch_info% cuda*} sees no CUDA device"
  fi
}

# The build directory as an absolute path (PYTHONPATH for the demo).
build_abs() { if [[ $build == /* ]]; then echo "$build"; else echo "$root/$build"; fi; }

# The binding, in the build directory of the phases above, reconfigured with DETOPS_TORCH=ON for
# $python's torch. The first configure leaves it OFF, so that a torch whose CMake config fails
# cannot cost the CUDA tests; reconfiguring the same directory keeps libdetops' objects (torch's
# flags reach only the binding's targets), so only the binding's files compile. Torch's cached
# find results are dropped first: a directory that once found another torch (a carried one that
# saw Debian's libtorch) would otherwise keep that torch's library paths next to the new config.
# Torch_DIR is left unset on purpose: cmake/DetopsTorch.cmake then puts the Python's
# torch.utils.cmake_prefix_path first, which is also where TorchConfig's find_package(Caffe2) has
# to look (with Torch_DIR given, a system Caffe2 -- Debian's -- would be found before pip's).
# Writes $torch_state: "ok", or why the binding is not usable (the later phases skip with it).
build_torch() {
  local py cmake_args=() conf=$logs/torch-configure.txt line cuda out rc=0
  echo "the torch-build phase did not finish" > "$torch_state"
  py=$(command -v "$python") || { echo "binding: $python not found" | tee "$torch_state"; return 5; }
  cmake_args=(-U Torch_DIR -U 'Caffe2_*' -U 'TORCH_*LIBRARY*' -U 'C10_*LIBRARY*' -U 'c10_*LIBRARY*'
              -U 'CAFFE2_*LIBRARY*' -DDETOPS_TORCH=ON -DDETOPS_TORCH_PYTHON="$py"
              -DDETOPS_TORCH_ABI="${GPU_CHECK_TORCH_ABI:-classic}")
  echo "reconfiguring $build with ${cmake_args[*]}"
  limited cmake -S . -B "$build" "${cmake_args[@]}" > "$conf" 2>&1
  rc=$?
  cat "$conf"
  line=$(grep -m 1 -E 'detops: (LibTorch|torch) .*torch binding ON' "$conf")
  if ((rc != 0)) || [[ -z $line ]]; then
    echo "the binding did not configure (cmake exit $rc): $(grep -m 1 -A 2 'CMake Error' "$conf" | tr -s ' \n' ' ' | cut -c 1-300)" |
      tee "$torch_state"
    return 5
  fi
  cuda=$(sed -nE 's/.*CUDA kernels (ON|OFF).*/\1/p' <<< "$line")
  if [[ $cuda != ON && ${GPU_CHECK_TORCH_CPU:-0} != 1 ]]; then
    echo "gpu-check: FAILED: the binding configured without its CUDA kernels ($line): the CUDA tests would skip"
    rc=1
  fi
  echo "targets: detops_torch (_C.so) detops_torch_python detops_torch_consumer"
  limited cmake --build "$build" -j "$jobs" --target detops_torch detops_torch_python detops_torch_consumer -- -k 0 || rc=1
  if [[ ! -f $build/python/detops_torch/_C.so ]]; then
    echo "the binding did not build ($build/python/detops_torch/_C.so missing)" | tee "$torch_state"
    return 1
  fi
  # the import-time checks (torch version, _C.so's registrations) before minutes of tests
  if ! out=$(PYTHONPATH="$(build_abs)/python" limited "$py" -c 'import detops_torch, torch; print("detops_torch", detops_torch.__version__, "from", detops_torch.__file__, "torch", torch.__version__)' 2>&1); then
    echo "$out" | tail -n 15
    # the first error is the cause (an undefined symbol, a version guard), the last what import saw
    echo "detops_torch does not import: $(grep -E '^[A-Za-z.]*(Error|Exception)' <<< "$out" | sed -n '1p;$p' | uniq | cut -c 1-300 | paste -sd ';' -)" |
      tee "$torch_state"
    return 1
  fi
  echo "$out" | tail -n 1
  echo ok > "$torch_state"
  return "$rc"
}

# ctest -L torch: the tests stop at the phase's deadline less a margin (--stop-time: unlike
# --timeout it also caps tests with their own TIMEOUT, 600 s for the Python ones), so that CTest
# itself names a test that runs out of time and prints its summary. Verbose, into $ctest_torch_full: every test's own output
# (prefixed "<test number>: ") is kept for the counts of the Python tests inside (a CUDA test that
# skips passes as far as CTest is concerned); $ctest_torch_out is CTest's own lines, and a failed
# test's output is shown after them.
run_torch_tests() {
  local t rc n
  t=$(($(until_deadline) - 10))
  ((t < 10)) && t=10
  echo "ctest -L torch (stopping in ${t}s; torch.library.opcheck and torch.compile tests run on torch >= 2.1)"
  limited ctest --test-dir "$build" -L torch -V -j 4 --stop-time "$(date -d "+$t seconds" +%H:%M:%S)" > "$ctest_torch_full" 2>&1
  rc=$?
  grep -vE '^[0-9]+: ' "$ctest_torch_full" > "$ctest_torch_out"
  cat "$ctest_torch_out"
  # shellcheck disable=SC2013  # test numbers, one a line
  for n in $(sed -nE 's/^[0-9]+\/[0-9]+ Test +#([0-9]+): .*[*](Failed|Timeout|Exception|SEGFAULT|Not Run|Subprocess).*/\1/p' "$ctest_torch_out"); do
    echo "---- test #$n's output (last 40 lines; all of it in $ctest_torch_full) ----"
    grep -E "^$n: " "$ctest_torch_full" | tail -n 40
  done
  if ((rc == 124 || rc == 137)); then echo "ctest -L torch: stopped at the phase's limit (timeout)"; fi
  return "$rc"
}

# The Python tests inside the torch tests: run, passed, failed, skipped, from unittest's "Ran N
# tests ... OK (skipped=K)" and pytest's "N passed, K skipped in T s" lines.
torch_py_counts() {
  [[ -s $ctest_torch_full ]] || return 0
  python3 - "$ctest_torch_full" << 'PY' || echo "(python3 could not read $ctest_torch_full)"
import re, sys
# ctest -V prefixes each test's lines with its number
text = re.sub(r"(?m)^\d+: ", "", open(sys.argv[1], errors="replace").read())
n = {"passed": 0, "failed": 0, "skipped": 0}
reports = 0
for m in re.finditer(r"^Ran (\d+) tests? in [\d.]+s\s*\n\s*(OK|FAILED)(?: \(([^)]*)\))?", text, re.M):
    reports += 1
    extra = {}
    for kv in (m.group(3) or "").split(","):
        if "=" in kv:
            k, v = kv.split("=")
            extra[k.strip()] = int(v)
    failed = extra.get("failures", 0) + extra.get("errors", 0) + extra.get("unexpected successes", 0)
    skipped = extra.get("skipped", 0) + extra.get("expected failures", 0)
    n["failed"] += failed
    n["skipped"] += skipped
    n["passed"] += int(m.group(1)) - failed - skipped
# pytest -q: "10 passed, 1 skipped, 17 subtests passed, 5 warnings in 55.97s"
for m in re.finditer(r"^=*\s*(\d+ [a-z ]+(?:, \d+ [a-z ]+)*) in [\d.]+s", text, re.M):
    counts = {w: int(c) for c, w in re.findall(r"(\d+) ([a-z ]+)", m.group(1))}
    if not counts.keys() & {"passed", "failed", "skipped", "error", "errors"}:
        continue
    reports += 1
    n["passed"] += counts.get("passed", 0) + counts.get("xfailed", 0)
    n["failed"] += counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    n["skipped"] += counts.get("skipped", 0)
if reports:
    print(f"  Python tests inside ({reports} test files reported): {n['passed']} passed, {n['failed']} failed, "
          f"{n['skipped']} skipped")
PY
}

# The training demo on CUDA: every variant twice from one seed (identical hashes or not, step
# time, peak memory); the script exits 1 when detops' runs differ.
run_maskrcnn() {
  local t=${MASKRCNN_TIMEOUT:-90} left rc
  left=$(until_deadline)
  ((t > left)) && t=$left
  rm -f "$maskrcnn_json"
  echo "train_maskrcnn.py ${MASKRCNN_ARGS:---device cuda --steps 3 --size 512} (up to ${t}s)"
  # shellcheck disable=SC2086  # MASKRCNN_ARGS is a list of words
  PYTHONPATH="$(build_abs)/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 \
    timeout --kill-after=5 "$t" "$python" examples/torch/train_maskrcnn.py \
    ${MASKRCNN_ARGS:---device cuda --steps 3 --size 512} --json "$maskrcnn_json"
  rc=$?
  ((rc == 124 || rc == 137)) && echo "train_maskrcnn.py: timed out after ${t}s (it writes its JSON at the end: none)"
  return "$rc"
}

# The demo's figures for the summary: from its JSON, else the lines it printed before it stopped.
maskrcnn_table() {
  if [[ -s $maskrcnn_json ]]; then
    python3 - "$maskrcnn_json" << 'PY' || echo "(python3 could not read $maskrcnn_json)"
import json, sys
d = json.load(open(sys.argv[1]))
print(f"Mask R-CNN demo ({d.get('gpu') or d.get('device')}, torch {d.get('torch')}, torchvision {d.get('torchvision')}, "
      f"{d.get('steps')} steps, {d.get('size')} px x {d.get('images')} images, {d.get('rois')} RoIs)")
print(f"{'variant':<28} {'runs':>10} {'median step':>12} {'peak memory':>12}  last step hash")
for name, v in d.get("variants", {}).items():
    peak = f"{v['peak_memory_bytes'] / 2**20:.0f} MiB" if v.get("peak_memory_bytes") else "-"
    last = (v.get("hashes") or [[]])[0]
    last = str(last[-1])[:16] if last else "-"
    print(f"{name:<28} {'identical' if v.get('runs_identical') else 'DIFFER':>10} "
          f"{v.get('median_step_s', 0) * 1e3:>9.0f} ms {peak:>12}  {last}")
    for w in v.get("nondeterminism_warnings", []):
        print(f"  torch warned: {w[:120]}")
PY
  elif [[ -s $logs/maskrcnn.log ]]; then
    echo "Mask R-CNN demo: no JSON; what it printed:"
    grep -E '^[a-z-]+: runs (IDENTICAL|DIFFER)|timed out|Error' "$logs/maskrcnn.log" | head -n 10
  fi
}

# The charts are a convenience (they can be drawn later from the JSON): a chart that cannot be
# drawn is reported, not a failure.
run_plots() {
  if [[ -s $compare_json ]]; then
    local bench_args=()
    [[ -s $roi_json ]] && bench_args=(--bench-json "$roi_json" --bench-filter '/f32/')
    limited "$python" benchmarks/plot_results.py "$compare_json" "${bench_args[@]}" \
      --modes-png "$modes_png" --vs-png "$vs_png" --if-available || echo "plot_results: not every chart was drawn (see above)"
  fi
  if [[ -s $compare_bn_json ]]; then
    limited "$python" benchmarks/plot_sync_bn.py "$compare_bn_json" --out "$bn_png" || echo "plot_sync_bn failed (no matplotlib?)"
  fi
}

# Medians from the benchmark JSON files: name, time, and throughput where reported.
bench_table() {
  local files=() name
  for name in "${bench_order[@]}"; do [[ -s $results/gpu-$name-$date.json ]] && files+=("$results/gpu-$name-$date.json"); done
  ((${#files[@]})) || { echo "(no benchmark results)"; return; }
  python3 - "${files[@]}" << 'PY' || echo "(python3 could not read the benchmark JSON)"
import json, sys
print(f"{'benchmark (median)':<72} {'time':>12} {'items/s':>9} {'GB/s':>7}")
medians = {}  # name without the timing suffix -> median time
for path in sys.argv[1:]:
    try:
        benchmarks = json.load(open(path)).get("benchmarks", [])
    except ValueError:
        print(f"{path}: not complete JSON (the run was stopped)")
        continue
    key = lambda b: b.get("run_name", b["name"])
    rows = [b for b in benchmarks if b.get("aggregate_name") == "median"]
    if not rows:  # one repetition: no aggregates
        rows = [b for b in benchmarks if b.get("run_type", "iteration") == "iteration"]
    shown = {key(b) for b in rows}
    for b in benchmarks:  # runs that skipped or failed have no aggregates
        if b.get("error_occurred") and key(b) not in shown:
            rows.append(b)
            shown.add(key(b))
    for b in rows:
        name = key(b)[:72]
        if b.get("error_occurred"):
            print(f"{name:<72} skipped: {b.get('error_message', '')[:40]}")
            continue
        t = f"{b['real_time']:.3f} {b['time_unit']}"
        items = f"{b['items_per_second'] / 1e9:.2f}G" if "items_per_second" in b else "-"
        gbs = f"{b['bytes_per_second'] / 1e9:.1f}" if "bytes_per_second" in b else "-"
        print(f"{name:<72} {t:>12} {items:>9} {gbs:>7}")
        medians[key(b).split("/manual_time")[0].split("/real_time")[0]] = b["real_time"]

# Issue 5's FrozenBatchNorm2d target: the forward within 1.2x of a device-to-device copy of the
# same bytes (BM_FrozenBnCopy reads and writes the tensor once, as the forward does).
targets = []
for name, t in sorted(medians.items()):
    parts = name.split("/")  # BM_FrozenBnForward/cuda/res2/f32/nchw/none
    if parts[0] != "BM_FrozenBnForward" or parts[-1] != "none":
        continue
    copy = medians.get("/".join(["BM_FrozenBnCopy"] + parts[1:4]))
    if copy:
        r = t / copy
        targets.append(f"  [{'MET ' if r <= 1.2 else 'MISS'}] FrozenBatchNorm2d forward {'/'.join(parts[1:5])}: "
                       f"{r:.2f}x a device-to-device copy (goal <= 1.20x)")
if targets:
    print("\ntargets (issue 5)")
    print("\n".join(targets))
PY
}

# Test counts from a CTest log (pass 1 by default): run, passed, failed, skipped.
test_counts() {
  local log=${1:-$ctest_out} label=${2:-tests}
  [[ -s $log ]] || { echo "$label: not run"; return; }
  local line passed failed skipped total
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  if [[ -z $line ]]; then  # stopped from outside: what finished before
    echo "$label: CTest printed no summary (stopped?); $(grep -cE '^[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' "$log") passed before that (see $log)"
    grep -E '^[0-9]+/[0-9]+ Test +#[0-9]+: .*[*]' "$log" | head -n 20
    return
  fi
  skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$log")
  failed=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<< "$line")
  total=$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<< "$line")
  passed=$((total - failed - skipped))
  echo "$label: $passed passed, $failed failed, $skipped skipped (of $total)"
  grep -E '^[[:space:]]+[0-9]+ - .* \((Failed|Not Run|Timeout|SEGFAULT|Subprocess aborted|Exception)' "$log" | head -n 20
}

write_summary() {
  {
    echo "== gpu-check summary ($(date -u +%FT%TZ), ${SECONDS}s of ${budget}s) =="
    [[ -s $logs/machine.log ]] && head -n 1 "$logs/machine.log"
    printf '%s\n' "${phases[@]}"
    [[ -s $logs/driver.log ]] && grep -m 1 '^gpu-check: FAILED:' "$logs/driver.log"
    test_counts "$ctest_out" "tests (CUDA_LAUNCH_BLOCKING=1)"
    [[ -s $ctest_async_out ]] && test_counts "$ctest_async_out" "tests (async launches)"
    if [[ -s $nccl_skip_txt ]]; then
      echo "NCCL tests: $(sed -n 3p "$nccl_skip_txt") skipped, not failed: the machine refuses NCCL's bootstrap: $(sed -n 2p "$nccl_skip_txt")"
    fi
    if [[ -s $sanitizer_txt ]]; then echo "compute-sanitizer:"; cat "$sanitizer_txt"; fi
    [[ -s $torch_state && $(< "$torch_state") != ok ]] && echo "torch binding: $(< "$torch_state")"
    if [[ -s $ctest_torch_out ]]; then
      test_counts "$ctest_torch_out" "torch tests (ctest -L torch)"
      torch_py_counts
    fi
    echo
    bench_table
    echo
    if [[ -s $compare_txt ]]; then cat "$compare_txt"; else echo "(no torchvision comparison)"; fi
    echo
    if [[ -s $compare_bn_txt ]]; then cat "$compare_bn_txt"; else echo "(no torch BatchNorm2d comparison)"; fi
    echo
    if [[ $maskrcnn_ran == 1 ]]; then maskrcnn_table; echo; fi
    echo "results: $results/*gpu*-$date*; logs: $logs/"
    echo "gpu-check: $([[ $status -eq 0 ]] && echo "PASSED so far" || echo FAILED)"
  } > "$summary.tmp" && mv "$summary.tmp" "$summary"
  cp "$summary" "$results/gpu-$date-summary.txt"
}

# The summary and one archive into $OUT (at most 8 files come back from there), replaced whole.
publish() {
  write_summary
  [[ -n ${OUT:-} ]] || return 0
  mkdir -p "$OUT"
  cp "$summary" "$OUT/summary.txt.tmp" && mv "$OUT/summary.txt.tmp" "$OUT/summary.txt"
  # shellcheck disable=SC2046
  tar czf "$OUT/gpu-check.tgz.tmp" $(ls -d "$results"/*gpu*-"$date"* "$logs"/*.log "$logs"/*.txt 2> /dev/null) 2> /dev/null &&
    mv "$OUT/gpu-check.tgz.tmp" "$OUT/gpu-check.tgz"
  if [[ $maskrcnn_ran == 1 && -s $maskrcnn_json ]]; then cp "$maskrcnn_json" "$OUT/maskrcnn.json"; fi
}

# The summary, PASSED or FAILED, and the exit status.
finish() {
  publish
  sed -i 's/^gpu-check: PASSED so far$/gpu-check: PASSED/' "$summary" "$results/gpu-$date-summary.txt"
  [[ -n ${OUT:-} && -f $OUT/summary.txt ]] && cp "$summary" "$OUT/summary.txt"
  cat "$summary"
  exit "$status"
}

command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 && gpu_visible=1
nvcc=$(find_nvcc) || nvcc=""
torch_info="" torch_missing=""

echo "gpu-check: $(date -u +%FT%TZ), CUDA architectures $arch, $jobs jobs, budget ${budget}s"
# First, before anything slow (torch's import, the build): a driver too old for nvcc ends the check.
phase driver 20 check_driver || finish
pick_python
if nccl=$(find_nccl); then
  nccl_root=${nccl%%|*}
  nccl_lib=${nccl##*|}
fi
phase machine 30 machine_info
if phase gtest 180 build_googletest && phase configure 120 configure; then
  phase build 360 build_targets
  if wanted tests; then phase tests 240 run_tests first; fi
  if wanted tests-async; then
    if [[ $gpu_visible == 1 ]]; then phase tests-async 150 run_tests async; else skip_phase tests-async "skipped: no GPU visible"; fi
  fi
  if [[ -x $build/benchmarks/detops_bench ]]; then
    if wanted compare; then
      if why=$(compare_blocker) && [[ -n $why ]]; then skip_phase compare "skipped: $why"; else phase compare 150 run_compare; fi
    fi
    if wanted bench; then phase bench 150 run_benchmarks; fi
    if wanted compare-bn; then
      if why=$(compare_blocker) && [[ -n $why ]]; then skip_phase compare-bn "skipped: $why"; else phase compare-bn 90 run_compare_bn; fi
    fi
  else
    skip_phase bench "FAILED: $build/benchmarks/detops_bench was not built"
    status=1
  fi
  if wanted sanitizer; then
    if [[ -z ${SANITIZER_TOOLS-memcheck} ]]; then
      skip_phase sanitizer "skipped: SANITIZER_TOOLS is empty"
    elif ! cs=$(find_compute_sanitizer); then
      skip_phase sanitizer "skipped: no compute-sanitizer (not on PATH, in \$CUDA_HOME/bin or next to nvcc)"
    elif [[ $gpu_visible != 1 ]]; then
      skip_phase sanitizer "skipped: no GPU visible"
    else
      phase sanitizer 120 run_compute_sanitizer "$cs"
    fi
  fi
  # The PyTorch binding: its build, its tests (CUDA ones included), then the Mask R-CNN demo.
  # Each skips with the reason: no torch, no CUDA device for it, or no binding (torch_state).
  if wanted torch-build || wanted torch || wanted maskrcnn; then
    if why=$(torch_blocker) && [[ -n $why ]]; then
      skip_phase torch-build "skipped: $why"
    else
      phase torch-build 180 build_torch
    fi
    torch_why=$([[ -s $torch_state ]] && sed -n 1p "$torch_state")
    for name in torch maskrcnn; do
      wanted "$name" || continue
      if why=$(torch_blocker) && [[ -n $why ]]; then skip_phase "$name" "skipped: $why"
      elif [[ $torch_why != ok ]]; then skip_phase "$name" "skipped: ${torch_why:-the torch-build phase did not run}"
      elif [[ $name == torch ]]; then phase torch 150 run_torch_tests
      else
        maskrcnn_ran=1
        phase maskrcnn 100 run_maskrcnn
      fi
    done
  fi
  if wanted plots && [[ -s $compare_json || -s $compare_bn_json ]]; then phase plots 40 run_plots; fi
fi
finish
