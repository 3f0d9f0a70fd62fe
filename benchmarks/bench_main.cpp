// main() of detops_bench, the one benchmark program of every benchmarks/*_bench.cpp (see
// benchmarks/CMakeLists.txt). A benchmark file registers its benchmarks statically and needs
// nothing here, unless what it registers depends on the command line or on the device: then it
// adds a main hook (add_main_hook, below), as roi_align_bench.cpp does.
//   detops_bench [--detops_full] [<file flags>] [<Google Benchmark flags>]
//   --detops_full   every combination instead of each file's default selection (the files that
//                   register statically read DETOPS_BENCH_FULL=1 from the environment instead)
// Before Google Benchmark's own output it prints one line (the first: benchmarks/bench_common.py
// reads it) with the detops version, the CUDA state ("N device(s), benchmarks on cuda:0" when
// the CUDA benchmarks run), the CPU and each hook's workload; the JSON output's "context" gets
// detops_version, detops_cuda, detops_cpu_isa and detops_workload.
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"  // DETOPS_BENCH_CUDA
#include "detops/detops.h"

namespace detops {
namespace bench {

/// A benchmark file's part of main(). take_flags runs first and removes the file's own flags from
/// argv; it returns -1 to go on, or an exit status to end the program there (e.g. after writing a
/// file a flag asked for). register_benchmarks runs after Google Benchmark has read its flags:
/// it registers the file's benchmarks for `full` (--detops_full) and, when `cuda_skip` is empty,
/// its CUDA benchmarks (otherwise placeholders that skip with cuda_skip as the reason), and
/// returns its workload for the first line and the JSON context ("" for none).
using TakeFlags = int (*)(int* argc, char** argv);
using RegisterBenchmarks = std::string (*)(bool full, const std::string& cuda_skip);
bool add_main_hook(TakeFlags take_flags, RegisterBenchmarks register_benchmarks);

namespace {

struct MainHook {
  TakeFlags take_flags;
  RegisterBenchmarks register_benchmarks;
};

/// Filled during static initialization (construct on first use: any file may add first).
std::vector<MainHook>& main_hooks() {
  static std::vector<MainHook> hooks;
  return hooks;
}

/// Removes `flag` from argv; true when it was there.
bool take_flag(int* argc, char** argv, const char* flag) {
  for (int i = 1; i < *argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) {
      for (int j = i; j + 1 < *argc; ++j) argv[j] = argv[j + 1];
      --*argc;
      return true;
    }
  }
  return false;
}

}  // namespace

bool add_main_hook(TakeFlags take_flags, RegisterBenchmarks register_benchmarks) {
  main_hooks().push_back({take_flags, register_benchmarks});
  return true;
}

}  // namespace bench
}  // namespace detops

int main(int argc, char** argv) {
  using namespace detops;
  const bool full = bench::take_flag(&argc, argv, "--detops_full");
  for (const bench::MainHook& hook : bench::main_hooks()) {
    if (hook.take_flags == nullptr) continue;
    const int status = hook.take_flags(&argc, argv);
    if (status >= 0) return status;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  // Whether the CUDA benchmarks run: cuda_state for the first line, cuda_skip for the hooks'
  // placeholders (the statically registered CUDA benchmarks check for a device when they run).
  std::string cuda_state, cuda_skip;
  if (!cuda_compiled()) {
    cuda_state = "not in this build";
    cuda_skip = "no CUDA backend in this build";
  } else if (const int devices = cuda_device_count(); devices == 0) {
    cuda_state = "compiled, no device (" + cuda_unavailable_reason() + ")";
    cuda_skip = "no CUDA device";
  } else if (!DETOPS_BENCH_CUDA) {
    cuda_state = fmt::format("{} device(s), but built without DETOPS_BENCH_CUDA", devices);
    cuda_skip = "CUDA timing needs DETOPS_BENCH_CUDA=1 and the CUDA runtime at compile time";
  } else {
    cuda_state = fmt::format("{} device(s), benchmarks on cuda:0", devices);
  }

  std::string workloads;
  for (const bench::MainHook& hook : bench::main_hooks()) {
    const std::string workload = hook.register_benchmarks ? hook.register_benchmarks(full, cuda_skip) : "";
    if (workload.empty()) continue;
    if (!workloads.empty()) workloads += " | ";
    workloads += workload;
  }

  // One context line (also in the JSON output's "context"), before Google Benchmark's own.
  const std::string isa = cpu_isa_name(cpu_isa_supported());
  fmt::print("detops {} benchmarks | CUDA: {} | CPU hardware threads: {} | CPU vector instructions: {}{}{}{}\n",
             version_string(), cuda_state, std::thread::hardware_concurrency(), isa, workloads.empty() ? "" : " | ",
             workloads, full ? " | --detops_full" : "");
  std::fflush(stdout);
  benchmark::AddCustomContext("detops_version", version_string());
  benchmark::AddCustomContext("detops_cuda", cuda_state);
  // the CPU kernels' instruction set when a benchmark does not name one (/isa_<name>)
  benchmark::AddCustomContext("detops_cpu_isa", isa);
  if (!workloads.empty()) benchmark::AddCustomContext("detops_workload", workloads);

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
