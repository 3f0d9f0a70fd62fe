#!/usr/bin/env bash
# The reliability stages of issue 6: stages 3-5 of scripts/test.sh (so of CI), or run alone
# (stage 5 configures build/ itself when scripts/test.sh has not made it).
#   ./scripts/reliability.sh             fuzzing (3), ThreadSanitizer (4), large tensors (5)
#   DETOPS_FUZZ_SECONDS=300 ./scripts/reliability.sh     a longer fuzzing session (per target)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
jobs=$(nproc)
SECONDS=0

# ---------------------------------------------------------------------------------------------
# Reliability stages (issue 6), after the two of scripts/test.sh (which calls this script):
#   3. build-asan/: clang, libFuzzer + ASan + UBSan (stage 2's build: built here only when the
#      script runs alone), then each fuzz target of the build (tests/fuzz/*_fuzz.cpp; found as the fuzz
#      label's replay tests, ctest -N -L fuzz) runs from a scratch copy of its committed corpus
#      (plus the regression inputs), DETOPS_FUZZ_JOBS (nproc) at a time, for DETOPS_FUZZ_SECONDS
#      each: by default DETOPS_FUZZ_TOTAL_SECONDS (360, i.e. 45 s for each of 8 targets) shared
#      evenly by the targets, at least 20 s each, so a new target costs the stage little time;
#      any crash, sanitizer report or failed check fails the stage (inputs land in
#      build-asan/fuzz-artifacts/);
#   4. build-tsan/: CPU-only, ThreadSanitizer: the cpu tests (without the 20-run repeats);
#   5. build/: the large-tensor tests (label large, ~9 GB) when MemAvailable >= 14 GB.
# DETOPS_SKIP_FUZZ=1, DETOPS_SKIP_TSAN=1, DETOPS_SKIP_LARGE=1 skip one of them.

if [[ "${DETOPS_SKIP_FUZZ:-0}" == "1" ]]; then
  echo "== stage 3 (fuzzing) skipped: DETOPS_SKIP_FUZZ=1 =="
else
  echo "== stage 3: build-asan/ (clang, libFuzzer + address;undefined) =="
  stage_start=$SECONDS
  if ! command -v clang++ > /dev/null; then
    echo "stage 3: installing clang (libFuzzer)"
    sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends clang libclang-rt-dev \
      || DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends clang
  fi
  cmake --preset fuzz                         # = the asan preset's build-asan/
  cmake --build --preset fuzz -j "$jobs"      # the fuzz targets (nothing to do after stage 2)
  # the targets: one replay test detops_fuzz_<target>_replay (label fuzz) per tests/fuzz/<target>_fuzz.cpp
  mapfile -t targets < <(ctest --test-dir build-asan -N -L fuzz |
                         sed -nE 's/^ *Test +#[0-9]+: detops_fuzz_(.+)_replay$/\1/p')
  if (( ${#targets[@]} == 0 )); then
    echo "stage 3 failed: ctest -N -L fuzz in build-asan/ lists no detops_fuzz_<target>_replay test"
    exit 1
  fi
  fuzz_total=${DETOPS_FUZZ_TOTAL_SECONDS:-360}
  fuzz_seconds=${DETOPS_FUZZ_SECONDS:-$(( fuzz_total / ${#targets[@]} > 20 ? fuzz_total / ${#targets[@]} : 20 ))}
  fuzz_jobs=${DETOPS_FUZZ_JOBS:-$jobs}
  echo "stage 3: ${#targets[@]} fuzz targets, ${fuzz_seconds}s each, $fuzz_jobs at a time: ${targets[*]}"
  fuzz_tmp=$(mktemp -d)
  artifacts=build-asan/fuzz-artifacts
  mkdir -p "$artifacts"
  run_fuzz_target() {
    local t=$1 regressions=()
    mkdir -p "$fuzz_tmp/corpus/$t"
    if [[ -d tests/fuzz/corpus/$t ]]; then cp tests/fuzz/corpus/$t/* "$fuzz_tmp/corpus/$t/" 2> /dev/null || true; fi
    if [[ -d tests/fuzz/regressions/$t ]]; then regressions=("tests/fuzz/regressions/$t"); fi
    local rc=0
    DETOPS_FUZZ_STATS=1 ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1 \
      UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1 \
      "build-asan/tests/fuzz/detops_fuzz_$t" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -timeout=25 \
      -artifact_prefix="$artifacts/$t-" -print_final_stats=1 "$fuzz_tmp/corpus/$t" "${regressions[@]}" \
      > "$fuzz_tmp/$t.log" 2>&1 || rc=$?
    echo "$rc" > "$fuzz_tmp/$t.rc"
  }
  running=0
  for t in "${targets[@]}"; do
    if (( running >= fuzz_jobs )); then wait -n || true; running=$((running - 1)); fi
    run_fuzz_target "$t" &
    running=$((running + 1))
  done
  wait
  fuzz_failed=0
  for t in "${targets[@]}"; do
    rc=$(cat "$fuzz_tmp/$t.rc" 2> /dev/null || echo 1)
    runs=$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$fuzz_tmp/$t.log" | tail -1 || true)
    stats=$(grep -E '^detops fuzz stats:' "$fuzz_tmp/$t.log" | tail -1 | sed 's/^detops fuzz stats: //' || true)
    if [[ "$rc" == "0" ]]; then
      echo "fuzz $t: ${runs:-no 'Done' line}s; $stats"
    else
      fuzz_failed=1
      echo "fuzz $t: FAILED (exit $rc); the input is in $artifacts/; the end of its log:"
      tail -n 60 "$fuzz_tmp/$t.log"
    fi
  done
  rm -rf "$fuzz_tmp"
  echo "== stage 3 done in $((SECONDS - stage_start))s (${SECONDS}s in all) =="
  if [[ "$fuzz_failed" != "0" ]]; then
    echo "stage 3 failed: replay an input with build-asan/tests/fuzz/detops_fuzz_<target> <file>"
    exit 1
  fi
fi

if [[ "${DETOPS_SKIP_TSAN:-0}" == "1" ]]; then
  echo "== stage 4 (ThreadSanitizer) skipped: DETOPS_SKIP_TSAN=1 =="
else
  echo "== stage 4: build-tsan/ (CPU-only, ThreadSanitizer) =="
  stage_start=$SECONDS
  cmake --preset tsan
  cmake --build --preset tsan -j "$jobs"
  ctest --preset tsan       # the cpu label except the 20-run repeats, TSAN_OPTIONS halt_on_error=1
  echo "== stage 4 done in $((SECONDS - stage_start))s (${SECONDS}s in all) =="
fi

mem_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2> /dev/null || echo 0)
if [[ "${DETOPS_SKIP_LARGE:-0}" == "1" ]]; then
  echo "== stage 5 (large tensors) skipped: DETOPS_SKIP_LARGE=1 =="
elif (( ${mem_kb:-0} < 14 * 1024 * 1024 )); then
  echo "== stage 5 (large tensors) skipped: MemAvailable is $((${mem_kb:-0} / 1024)) MiB, it needs 14 GiB =="
else
  echo "== stage 5: build/, the large-tensor tests (> 2^31 elements, ~9 GB) =="
  stage_start=$SECONDS
  if [[ ! -f build/CTestTestfile.cmake ]]; then cmake --preset release; fi   # run alone: stage 1 made build/
  cmake --build --preset release -j "$jobs" --target detops_tests_large   # the tests/large_*_test.cpp
  ctest --preset large      # label large, DETOPS_LARGE_TESTS=1, one at a time
  echo "== stage 5 done in $((SECONDS - stage_start))s (${SECONDS}s in all) =="
fi
