#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU, CUDA, CMake and ninja but no network or apt:
# builds detops with the CUDA backend against the dependencies that scripts/stage-gpu-deps.sh put
# in .deps/, runs every test (the gpu label included), runs the benchmarks into
# benchmarks/results/gpu-<date>.json, compares with torchvision (benchmarks/compare_torchvision.py:
# benchmarks/results/compare-gpu-<date>.{json,txt}), compares SyncBatchNorm with
# torch.nn.BatchNorm2d training forward+backward (benchmarks/compare_torch_bn.py:
# benchmarks/results/compare-bn-gpu-<date>.{json,txt}), draws the charts (benchmarks/plot_results.py:
# benchmarks/results/roi_align_*-gpu-<date>.png, when matplotlib is there), and prints a summary
# last (also kept as benchmarks/results/gpu-<date>-summary.txt). Each phase is timed.
#   DETOPS_CUDA_ARCHITECTURES   CUDA architectures (default 90: H100/H200)
#   BENCH_FILTER                --benchmark_filter regex (default: /cuda/ (every op's CUDA grid, SyncBN's
#                               included) plus the f32 box-head RoIAlign CPU runs and SyncBN's res5 CPU
#                               train step on one rank (t1, t2) and on two ThreadGroup ranks)
#   BENCH_MIN_TIME              --benchmark_min_time in seconds (default 0.2)
#   BENCH_REPETITIONS           repetitions, for the medians (default 3)
#   BENCH_TIMEOUT               seconds the benchmark run may take (default 300)
#   PYTHON                      the python with torch and torchvision (default python3)
#   COMPARE_ARGS                arguments for compare_torchvision.py (default: --devices cuda --rounds 3
#                               --tv-compile off; add cpu, or --tv-compile on, when there is time)
#   COMPARE_TIMEOUT             seconds the comparison may take (default 300; rounds stop at 3/4 of it)
#   COMPARE_BN_ARGS             arguments for compare_torch_bn.py (default: --device cuda --shapes
#                               res2,res5,box --modes default,exact --rounds 3 --min-time 0.2)
#   COMPARE_BN_TIMEOUT          seconds the SyncBN comparison may take (default 240; rounds stop at 3/4)
#   SANITIZER_TOOLS             compute-sanitizer tools run over the CUDA tests (default
#                               "memcheck racecheck initcheck"; empty: the phase is skipped)
#   SANITIZER_TIMEOUT           seconds one tool may take on one test executable (default 60)
#   SANITIZER_FILTER_<exe>      --gtest_filter for one executable under memcheck and initcheck,
#                               e.g. SANITIZER_FILTER_detops_sync_batch_norm_cuda_test (defaults
#                               below: a few cases each, ~2-3 minutes for all tools on an H200);
#                               racecheck runs the first pattern of each filter only
#   GPU_CHECK_CMAKE_ARGS        extra configure arguments (e.g. '-DCMAKE_IGNORE_PREFIX_PATH=/usr;/'
#                               to prove that only .deps/ is used)
#   OUT                         when set, the logs, the JSON and the summary are copied there
# Exit status: nonzero when the build, a test or the benchmark run failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

arch=${DETOPS_CUDA_ARCHITECTURES:-90}
jobs=$(nproc)
build=build-gpu
logs=$build/gpu-check
prefix=$root/.deps/prefix
date=$(date +%Y-%m-%d)
bench_json=benchmarks/results/gpu-$date.json
compare_json=benchmarks/results/compare-gpu-$date.json
compare_txt=benchmarks/results/compare-gpu-$date.txt
compare_bn_json=benchmarks/results/compare-bn-gpu-$date.json
compare_bn_txt=benchmarks/results/compare-bn-gpu-$date.txt
modes_png=benchmarks/results/roi_align_modes-gpu-$date.png
vs_png=benchmarks/results/roi_align_vs_torchvision-gpu-$date.png
bn_png=benchmarks/results/sync-bn-vs-torch-gpu-$date.png
python=${PYTHON:-python3}
summary=$logs/summary.txt
status=0
phases=()

if [[ ! -d .deps/prefix || ! -d .deps/src/googletest ]]; then
  echo "gpu-check: .deps/ is missing; run scripts/stage-gpu-deps.sh where the packages are" >&2
  exit 2
fi
mkdir -p "$logs" benchmarks/results

# phase NAME LOG COMMAND...: runs COMMAND with its output on the terminal and in LOG, and records
# the name, seconds and exit status.
phase() {
  local name=$1 log=$2
  shift 2
  echo "== $name =="
  local start=$SECONDS rc
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  phases+=("$(printf '%-10s %4ds  %s' "$name" $((SECONDS - start)) "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)")")")
  [[ $rc -eq 0 ]] || status=1
  return "$rc"
}

machine_info() {
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  else
    echo "no nvidia-smi: no GPU driver here (gpu tests and CUDA benchmarks will skip)"
  fi
  nvcc --version 2>/dev/null | tail -n 1 || /usr/local/cuda/bin/nvcc --version | tail -n 1
  cmake --version | head -n 1
  c++ --version | head -n 1
  echo "cores: $jobs"
}

build_googletest() {
  if [[ -f $prefix/lib/cmake/GTest/GTestConfig.cmake || -f $prefix/lib64/cmake/GTest/GTestConfig.cmake ]]; then
    echo "GoogleTest already installed in $prefix"
    return 0
  fi
  # CMAKE_POLICY_VERSION_MINIMUM: googletest 1.12 asks for CMake 3.5, which CMake 4 refuses.
  cmake -S .deps/src/googletest -B "$build/_deps/googletest" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_INSTALL_PREFIX="$prefix" \
        -DCMAKE_POLICY_VERSION_MINIMUM=3.5 &&
    cmake --build "$build/_deps/googletest" -j "$jobs" &&
    cmake --install "$build/_deps/googletest"
}

configure() {
  # shellcheck disable=SC2086  # GPU_CHECK_CMAKE_ARGS is a list of words
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDETOPS_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_PREFIX_PATH="$prefix" ${GPU_CHECK_CMAKE_ARGS:-}
}

run_benchmarks() {
  local args=(--benchmark_out="$bench_json" --benchmark_out_format=json
              --benchmark_min_time="${BENCH_MIN_TIME:-0.2}"
              --benchmark_repetitions="${BENCH_REPETITIONS:-3}"
              --benchmark_report_aggregates_only=true)
  args+=(--benchmark_filter="${BENCH_FILTER:-/cuda/|/cpu/f32/(nchw|nhwc)/box/sr2/avg|^BM_SyncBn(TrainStep|ThreadGroup)/cpu/res5/f32/nchw/default/}")
  timeout "${BENCH_TIMEOUT:-300}" "$build/benchmarks/detops_bench" "${args[@]}"
}

# detops vs torchvision on the same shapes, alternating (torchvision missing: detops only, still 0).
run_compare() {
  local limit=${COMPARE_TIMEOUT:-300}
  # shellcheck disable=SC2086  # COMPARE_ARGS is a list of words
  timeout "$limit" "$python" benchmarks/compare_torchvision.py --bench "$build/benchmarks/detops_bench" \
    --json "$compare_json" --table "$compare_txt" --max-seconds $((limit * 3 / 4)) \
    ${COMPARE_ARGS:---devices cuda --rounds 3 --tv-compile off}
}

# SyncBatchNorm (one rank) vs torch.nn.BatchNorm2d training forward+backward, alternating (no
# torch: detops only, still 0).
run_compare_bn() {
  local limit=${COMPARE_BN_TIMEOUT:-240}
  # shellcheck disable=SC2086  # COMPARE_BN_ARGS is a list of words
  timeout "$limit" "$python" benchmarks/compare_torch_bn.py --bench "$build/benchmarks/detops_bench" \
    --out "$compare_bn_json" --table "$compare_bn_txt" --max-seconds $((limit * 3 / 4)) \
    ${COMPARE_BN_ARGS:---device cuda --shapes res2,res5,box --modes default,exact --rounds 3 --min-time 0.2}
}

# compute-sanitizer (memcheck, racecheck, initcheck) over a small --gtest_filter subset of each
# CUDA test executable (ctest label gpu). Writes one line per tool and executable to
# $sanitizer_txt (copied into the summary); fails when a tool reports an error, or a run fails
# or times out. Without compute-sanitizer or a GPU it prints why and is recorded as skipped.
sanitizer_txt=$logs/sanitizer-summary.txt
declare -A sanitizer_filters=(
  [detops_roi_align_cuda_test]='All/RoiAlignCuda.ForwardAndExactBackwardEqualCpuBitwise/float32_nhwc_avg_sr2:All/RoiAlignCuda.TruncatedAndAtomicAgreeWithCpu/float16_nchw_max_adaptive:RoiAlignCudaBadInput.*:RoiAlignCudaSemantics.*'
  [detops_frozen_batch_norm_cuda_test]='All/FrozenBnCuda.ForwardAndBackwardEqualCpuBitwise/float32_nhwc_add_relu:All/FrozenBnCuda.ForwardAndBackwardEqualCpuBitwise/bfloat16_slice_relu:FrozenBnCudaFold.*:FrozenBnCudaBadInput.*:FrozenBnCudaSemantics.EmptyProblemsLaunchNothing'
  [detops_sync_batch_norm_cuda_test]='All/SyncBnCuda.ForwardAndBackwardEqualCpuBitwise/float32_nhwc_exact:All/SyncBnCuda.ForwardAndBackwardEqualCpuBitwise/bfloat16_strided_default:All/SyncBnCuda.RecordsEqualCpuBitwise/float64_nchw_exact'
)

find_compute_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
           "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/nvcc)")/compute-sanitizer" \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -n $c && -x $c ]] && { echo "$c"; return 0; }
  done
  return 1
}

run_compute_sanitizer() {
  local cs=$1 failed=0 tool exe filter_var filter start rc log result errors ran
  : > "$sanitizer_txt"
  echo "compute-sanitizer: $cs ($("$cs" --version 2>/dev/null | grep -Eo 'Version [0-9.]+' | head -n 1))"
  for tool in ${SANITIZER_TOOLS-memcheck racecheck initcheck}; do
    for exe in detops_roi_align_cuda_test detops_frozen_batch_norm_cuda_test detops_sync_batch_norm_cuda_test; do
      if [[ ! -x $build/tests/$exe ]]; then
        echo "$(printf '%-9s %-36s' "$tool" "$exe") FAILED (not built)" | tee -a "$sanitizer_txt"
        failed=1
        continue
      fi
      filter_var=SANITIZER_FILTER_$exe
      filter=${!filter_var:-${sanitizer_filters[$exe]}}
      [[ $tool == racecheck ]] && filter=${filter%%:*}   # racecheck is the slowest: one case
      log=$logs/sanitizer-$tool-$exe.log
      start=$SECONDS
      timeout "${SANITIZER_TIMEOUT:-60}" "$cs" --tool "$tool" --error-exitcode 86 --print-limit 20 \
        "$build/tests/$exe" --gtest_filter="$filter" --gtest_brief=1 > "$log" 2>&1
      rc=$?
      errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards? displayed' "$log" | tail -n 1)
      ran=$(grep -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' "$log" | tail -n 1 | grep -Eo '^[0-9]+ tests?')
      [[ $rc -eq 0 && -z $ran ]] && rc=87   # the filter matched nothing (or gtest did not finish)
      case $rc in
        0) result="ok" ;;
        87) result="FAILED (no test ran: check the --gtest_filter)"; failed=1 ;;
        86) result="FAILED (errors reported)"; failed=1 ;;
        124) result="FAILED (timed out after ${SANITIZER_TIMEOUT:-60}s)"; failed=1 ;;
        *) result="FAILED (exit $rc)"; failed=1 ;;
      esac
      echo "$(printf '%-9s %-36s %4ds' "$tool" "$exe" $((SECONDS - start))) $result; ${ran:-no tests ran}; ${errors:-no sanitizer summary} ($log)" \
        | tee -a "$sanitizer_txt"
      [[ $rc -eq 0 ]] || tail -n 40 "$log"
    done
  done
  return "$failed"
}

# The charts; without matplotlib, nothing (make them where the JSON files are copied to).
run_plots() {
  if [[ -s $compare_json ]]; then
    "$python" benchmarks/plot_results.py "$compare_json" --bench-json "$bench_json" --bench-filter '/f32/' \
      --modes-png "$modes_png" --vs-png "$vs_png" --if-available
  fi
  if [[ -s $compare_bn_json ]]; then
    "$python" benchmarks/plot_sync_bn.py "$compare_bn_json" --out "$bn_png" || echo "plot_sync_bn failed (no matplotlib?)"
  fi
}

# Medians from the benchmark JSON: name, time, and throughput where reported.
bench_table() {
  [[ -s $bench_json ]] || { echo "(no benchmark results)"; return; }
  python3 - "$bench_json" <<'PY' || echo "(python3 could not read $bench_json)"
import json, sys
benchmarks = json.load(open(sys.argv[1])).get("benchmarks", [])
key = lambda b: b.get("run_name", b["name"])
rows = [b for b in benchmarks if b.get("aggregate_name") == "median"]
if not rows:  # one repetition: no aggregates
    rows = [b for b in benchmarks if b.get("run_type", "iteration") == "iteration"]
shown = {key(b) for b in rows}
for b in benchmarks:  # runs that skipped or failed have no aggregates
    if b.get("error_occurred") and key(b) not in shown:
        rows.append(b)
        shown.add(key(b))
print(f"{'benchmark (median)':<64} {'time':>14} {'items/s':>9} {'GB/s':>7}")
for b in rows:
    name = key(b)[:64]
    if b.get("error_occurred"):
        print(f"{name:<64} skipped: {b.get('error_message', '')[:40]}")
        continue
    t = f"{b['real_time']:.3f} {b['time_unit']}"
    items = f"{b['items_per_second'] / 1e9:.2f}G" if "items_per_second" in b else "-"
    gbs = f"{b['bytes_per_second'] / 1e9:.1f}" if "bytes_per_second" in b else "-"
    print(f"{name:<64} {t:>14} {items:>9} {gbs:>7}")
PY
}

# Test counts from the CTest log: run, passed, failed, skipped.
test_counts() {
  local log=$logs/ctest.log
  [[ -s $log ]] || { echo "tests: not run"; return; }
  local line passed failed skipped total
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  [[ -n $line ]] || { echo "tests: CTest printed no summary (see $log)"; return; }
  skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$log")
  failed=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
  total=$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<<"$line")
  passed=$((total - failed - skipped))
  echo "tests: $passed passed, $failed failed, $skipped skipped (of $total)"
  grep -E '^[[:space:]]+[0-9]+ - .* \((Failed|Not Run|Timeout|SEGFAULT|Subprocess aborted|Exception)' "$log" | head -n 20
}

echo "gpu-check: $(date -u +%FT%TZ), CUDA architectures $arch, $jobs jobs"
phase machine "$logs/machine.log" machine_info
if phase gtest "$logs/gtest.log" build_googletest &&
   phase configure "$logs/configure.log" configure &&
   phase build "$logs/build.log" cmake --build "$build" -j "$jobs"; then
  phase tests "$logs/ctest.log" ctest --test-dir "$build" --output-on-failure -j 8 --timeout 300
  if [[ -z ${SANITIZER_TOOLS-memcheck racecheck initcheck} ]]; then
    sanitizer_skip="skipped: SANITIZER_TOOLS is empty"
  elif ! cs=$(find_compute_sanitizer); then
    sanitizer_skip="skipped: no compute-sanitizer (not on PATH, in \$CUDA_HOME/bin or next to nvcc)"
  elif ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
    sanitizer_skip="skipped: no GPU driver (nvidia-smi)"
  else
    sanitizer_skip=""
    phase sanitizer "$logs/sanitizer.log" run_compute_sanitizer "$cs"
  fi
  if [[ -n $sanitizer_skip ]]; then
    echo "== sanitizer =="
    echo "compute-sanitizer $sanitizer_skip" | tee "$logs/sanitizer.log" > "$sanitizer_txt"
    phases+=("$(printf '%-10s %4ds  %s' sanitizer 0 "$sanitizer_skip")")
  fi
  if [[ -x $build/benchmarks/detops_bench ]]; then
    phase bench "$logs/bench.log" run_benchmarks
    phase compare "$logs/compare.log" run_compare
    phase compare-bn "$logs/compare-bn.log" run_compare_bn
    [[ -s $compare_json || -s $compare_bn_json ]] && phase plots "$logs/plots.log" run_plots
  else
    echo "gpu-check: $build/benchmarks/detops_bench was not built" | tee "$logs/bench.log"
    status=1
  fi
fi

{
  echo "== gpu-check summary ($(date -u +%FT%TZ)) =="
  head -n 1 "$logs/machine.log"
  printf '%s\n' "${phases[@]}"
  test_counts
  if [[ -s $sanitizer_txt ]]; then echo "compute-sanitizer:"; cat "$sanitizer_txt"; fi
  echo
  bench_table
  echo
  if [[ -s $compare_txt ]]; then cat "$compare_txt"; else echo "(no torchvision comparison)"; fi
  echo
  if [[ -s $compare_bn_txt ]]; then cat "$compare_bn_txt"; else echo "(no torch BatchNorm2d comparison)"; fi
  echo
  echo "benchmark JSON: $bench_json; comparisons: $compare_json, $compare_txt, $compare_bn_json, $compare_bn_txt;" \
       "charts: $modes_png, $vs_png, $bn_png"
  echo "logs: $logs/"
  echo "gpu-check: $([[ $status -eq 0 ]] && echo PASSED || echo FAILED)"
} > "$summary"
cp "$summary" "benchmarks/results/gpu-$date-summary.txt"

if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  for f in "$summary" "$logs/ctest.log" "$logs/build.log" "$logs/bench.log" "$logs/configure.log" \
           "$bench_json" "$logs/compare.log" "$logs/plots.log" "$compare_json" "$compare_txt" "$modes_png" "$vs_png" "$bn_png" \
           "$logs/compare-bn.log" "$compare_bn_json" "$compare_bn_txt" "$logs/sanitizer.log" "$sanitizer_txt" \
           "$logs"/sanitizer-*-*.log; do
    [[ -f $f ]] && cp "$f" "$OUT/"
  done
fi
cat "$summary"
exit "$status"
