// SyncBatchNorm over MpiCommunicator when the ranks do not agree (label mpi; 3 processes). One
// program, three scenarios chosen by the first argument:
//   mismatch      rank 1 calls with other channels, another dtype or another mode (forward and
//                 backward): every rank gets Error(kCommunication), no rank hangs, no output is
//                 written;
//   failing-rank  rank 1 passes an invalid argument (a weight of C + 1 elements; a grad_x of the
//                 wrong shape): rank 1 gets kInvalidArgument, every other rank kCommunication
//                 with a message naming rank 1, nothing is written; afterwards the same
//                 communicator works again and gives the single-process bits;
//   dying-rank    rank 1 exits (std::_Exit(3)) before the collective: the other ranks wait in
//                 MPI_Allgather and mpiexec must end the job with a non-zero status (the test
//                 runs it through expect_job_failure.cmake). This scenario never passes by itself.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "detops/mpi.h"
#include "detops/sync_batch_norm.h"
#include "mpi_test_util.h"
#include "test_util.h"

namespace {

using namespace detops;

constexpr std::int64_t kC = 4, kH = 3, kW = 5;

const char* code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::kInvalidArgument: return "kInvalidArgument";
    case ErrorCode::kOutOfMemory: return "kOutOfMemory";
    case ErrorCode::kCudaError: return "kCudaError";
    case ErrorCode::kNotCompiled: return "kNotCompiled";
    case ErrorCode::kCommunication: return "kCommunication";
  }
  return "?";
}

/// One rank's problem: x and grad_y [n, channels, H, W], parameters, outputs poisoned (0x5A) so
/// that a write is seen.
struct Problem {
  Tensor x, dy, weight, bias, running_mean, running_var, y, save_mean, save_invstd, grad_x, grad_weight, grad_bias;
  Problem(std::int64_t n, std::int64_t channels, DType dtype, std::int64_t weight_size, std::uint64_t seed) {
    const auto numel = static_cast<std::size_t>(n * channels * kH * kW);
    x = test::make_tensor({n, channels, kH, kW}, dtype, test::random_values(numel, seed));
    dy = test::make_tensor({n, channels, kH, kW}, dtype, test::random_values(numel, seed + 1));
    weight = test::make_tensor({weight_size}, DType::kFloat32, std::vector<double>(weight_size, 1.5));
    bias = test::make_tensor({channels}, DType::kFloat32, std::vector<double>(channels, 0.25));
    running_mean = Tensor::zeros({channels}, DType::kFloat32);
    running_var = test::make_tensor({channels}, DType::kFloat32, std::vector<double>(channels, 1.0));
    y = Tensor::empty({n, channels, kH, kW}, dtype);
    grad_x = Tensor::empty({n, channels, kH, kW}, dtype);
    save_mean = Tensor::empty({channels}, DType::kFloat64);
    save_invstd = Tensor::empty({channels}, DType::kFloat64);
    grad_weight = Tensor::empty({channels}, DType::kFloat32);
    grad_bias = Tensor::empty({channels}, DType::kFloat32);
    poison_outputs();
  }
  SyncBnParams params() const {
    SyncBnParams p;
    p.weight = weight;
    p.bias = bias;
    p.running_mean = running_mean;
    p.running_var = running_var;
    return p;
  }
  void poison_outputs() {
    for (Tensor* t : {&y, &grad_x, &save_mean, &save_invstd, &grad_weight, &grad_bias}) t->fill_bytes(0x5A);
  }
  /// Whether grad_* (and, with forward_outputs, y, save_* and the running statistics) are as they
  /// were before the call that failed.
  bool untouched(bool forward_outputs) const {
    auto poisoned = [](const Tensor& t) {
      const auto* p = static_cast<const unsigned char*>(t.view().data);
      for (std::size_t i = 0; i < t.nbytes(); ++i)
        if (p[i] != 0x5A) return false;
      return true;
    };
    bool ok = poisoned(grad_x) && poisoned(grad_weight) && poisoned(grad_bias);
    if (!forward_outputs) return ok;  // after a valid forward: only the backward's outputs
    ok = ok && poisoned(y) && poisoned(save_mean) && poisoned(save_invstd);
    for (double v : test::to_vector(running_mean)) ok = ok && v == 0.0;
    for (double v : test::to_vector(running_var)) ok = ok && v == 1.0;
    return ok;
  }
  void forward(Communicator* comm, const SyncBnOptions& opts) {
    sync_batch_norm_forward(x, params(), y, save_mean, save_invstd, comm, opts);
  }
  void backward(Communicator* comm, const SyncBnOptions& opts) {
    sync_batch_norm_backward(dy, x, weight, save_mean, save_invstd, grad_x, grad_weight, grad_bias, comm, opts);
  }
};

/// Runs f(), which must throw Error with `expected`; with `must_name`, the message must contain it.
template <class F>
void expect_error(F&& f, ErrorCode expected, const std::string& must_name, const std::string& what) {
  try {
    f();
    MPI_EXPECT(false, "%s: no error (expected %s)", what.c_str(), code_name(expected));
  } catch (const Error& e) {
    MPI_EXPECT(e.code() == expected, "%s: %s (expected %s): %s", what.c_str(), code_name(e.code()),
               code_name(expected), e.what());
    MPI_EXPECT(must_name.empty() || std::string(e.what()).find(must_name) != std::string::npos,
               "%s: the message does not name '%s': %s", what.c_str(), must_name.c_str(), e.what());
    if (test::world_rank() == 0) std::printf("%s, rank 0 got: %s\n", what.c_str(), e.what());
  }
}

void mismatch() {
  const int me = test::world_rank();
  const bool odd = me == 1;
  const std::int64_t n = 2 + me;
  {
    MpiCommunicator comm(MPI_COMM_WORLD);
    Problem p(n, odd ? kC + 1 : kC, DType::kFloat32, odd ? kC + 1 : kC, 10 + me);
    expect_error([&] { p.forward(&comm, {}); }, ErrorCode::kCommunication, "", "forward, rank 1 has other channels");
    MPI_EXPECT(p.untouched(true), "forward with other channels: outputs written");
  }
  {
    MpiCommunicator comm(MPI_COMM_WORLD);
    Problem p(n, kC, odd ? DType::kFloat64 : DType::kFloat32, kC, 20 + me);
    expect_error([&] { p.forward(&comm, {}); }, ErrorCode::kCommunication, "", "forward, rank 1 has another dtype");
    MPI_EXPECT(p.untouched(true), "forward with another dtype: outputs written");
  }
  {
    MpiCommunicator comm(MPI_COMM_WORLD);
    Problem p(n, kC, DType::kFloat32, kC, 30 + me);
    SyncBnOptions opts;
    opts.mode = odd ? SyncBnMode::kExact : SyncBnMode::kDefault;
    expect_error([&] { p.forward(&comm, opts); }, ErrorCode::kCommunication, "", "forward, rank 1 has another mode");
    MPI_EXPECT(p.untouched(true), "forward with another mode: outputs written");
  }
  {
    // A valid forward in exact mode, then a backward in which rank 1 switches to the default mode.
    MpiCommunicator comm(MPI_COMM_WORLD);
    Problem p(n, kC, DType::kFloat32, kC, 40 + me);
    SyncBnOptions opts;
    opts.mode = SyncBnMode::kExact;
    p.forward(&comm, opts);
    for (Tensor* t : {&p.grad_x, &p.grad_weight, &p.grad_bias}) t->fill_bytes(0x5A);
    if (odd) opts.mode = SyncBnMode::kDefault;
    expect_error([&] { p.backward(&comm, opts); }, ErrorCode::kCommunication, "", "backward, rank 1 has another mode");
    MPI_EXPECT(p.untouched(false), "backward with another mode: outputs written");
  }
}

void failing_rank() {
  const int me = test::world_rank();
  const bool odd = me == 1;
  const std::int64_t n = 3 - me % 3;  // 3, 2, 1 images
  MpiCommunicator comm(MPI_COMM_WORLD);
  const ErrorCode expected = odd ? ErrorCode::kInvalidArgument : ErrorCode::kCommunication;
  const std::string names = odd ? "" : "rank 1";
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    const std::string tag = mode == SyncBnMode::kExact ? " (exact)" : " (default)";
    SyncBnOptions opts;
    opts.mode = mode;
    {
      Problem p(n, kC, DType::kFloat32, odd ? kC + 1 : kC, 50 + me);
      expect_error([&] { p.forward(&comm, opts); }, expected, names, "forward, rank 1 has a weight of C + 1" + tag);
      MPI_EXPECT(p.untouched(true), "forward with a bad weight on rank 1%s: outputs written", tag.c_str());
    }
    {
      // The forward is valid everywhere; rank 1's grad_x has one image too many.
      Problem p(n, kC, DType::kFloat32, kC, 60 + me);
      p.forward(&comm, opts);
      Tensor bad = Tensor::empty({n + 1, kC, kH, kW}, DType::kFloat32);
      bad.fill_bytes(0x5A);
      for (Tensor* t : {&p.grad_x, &p.grad_weight, &p.grad_bias}) t->fill_bytes(0x5A);
      if (odd) p.grad_x = std::move(bad);
      expect_error([&] { p.backward(&comm, opts); }, expected, names, "backward, rank 1 has a bad grad_x" + tag);
      MPI_EXPECT(p.untouched(false), "backward with a bad grad_x on rank 1%s: outputs written", tag.c_str());
    }
  }

  // The communicator still works after the failures, and gives the single-process bits (exact
  // mode: any split of the batch).
  std::vector<double> x_all, dy_all;
  const std::int64_t sizes[3] = {3, 2, 1};
  std::int64_t begin = 0, total = 0;
  for (int r = 0; r < test::world_size(); ++r) {
    const std::int64_t images = sizes[r % 3];
    const auto numel = static_cast<std::size_t>(images * kC * kH * kW);
    const std::vector<double> xr = test::random_values(numel, 70 + r), dyr = test::random_values(numel, 71 + r);
    x_all.insert(x_all.end(), xr.begin(), xr.end());
    dy_all.insert(dy_all.end(), dyr.begin(), dyr.end());
    if (r < me) begin += images;
    total += images;
  }
  SyncBnOptions opts;
  opts.mode = SyncBnMode::kExact;
  Problem mine(n, kC, DType::kFloat32, kC, 0), full(total, kC, DType::kFloat32, kC, 0);
  const std::int64_t plane = kC * kH * kW;
  test::fill_from(mine.x, {x_all.begin() + begin * plane, x_all.begin() + (begin + n) * plane});
  test::fill_from(mine.dy, {dy_all.begin() + begin * plane, dy_all.begin() + (begin + n) * plane});
  test::fill_from(full.x, x_all);
  test::fill_from(full.dy, dy_all);
  mine.forward(&comm, opts);
  mine.backward(&comm, opts);
  full.forward(nullptr, opts);
  full.backward(nullptr, opts);
  const std::vector<double> y_full = test::to_vector(full.y), gx_full = test::to_vector(full.grad_x);
  MPI_EXPECT(test::to_vector(mine.save_mean) == test::to_vector(full.save_mean) &&
                 test::to_vector(mine.save_invstd) == test::to_vector(full.save_invstd),
             "after the failures: statistics differ from the single-process ones");
  MPI_EXPECT(test::to_vector(mine.y) ==
                 std::vector<double>(y_full.begin() + begin * plane, y_full.begin() + (begin + n) * plane),
             "after the failures: y differs from the single-process one");
  MPI_EXPECT(test::to_vector(mine.grad_x) ==
                 std::vector<double>(gx_full.begin() + begin * plane, gx_full.begin() + (begin + n) * plane),
             "after the failures: grad_x differs from the single-process one");
}

void dying_rank() {
  const int me = test::world_rank();
  MpiCommunicator comm(MPI_COMM_WORLD);
  Problem p(2, kC, DType::kFloat32, kC, 80 + me);
  if (me == 1) {
    std::fprintf(stderr, "[rank 1] exiting with status 3 before the collective\n");
    std::_Exit(3);
  }
  p.forward(&comm, {});  // waits for rank 1 until mpiexec ends the job
  std::fprintf(stderr, "[rank %d] the forward returned although rank 1 is gone\n", me);
}

}  // namespace

int main(int argc, char** argv) {
  return test::mpi_main(argc, argv, [](int argc, char** argv) {
    const std::string scenario = argc > 1 ? argv[1] : "";
    if (scenario == "mismatch")
      mismatch();
    else if (scenario == "failing-rank")
      failing_rank();
    else if (scenario == "dying-rank")
      dying_rank();
    else {
      std::fprintf(stderr, "usage: %s mismatch|failing-rank|dying-rank\n", argv[0]);
      ++test::mpi_failures();
    }
  });
}
