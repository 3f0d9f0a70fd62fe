// SyncBatchNorm over MpiCommunicator against the single-process result (label mpi; run with 1, 2
// and 4 processes). Every rank builds the same seeded batch x [7, 5, 6, 5] float32 (one channel
// with mean 1e4, one constant channel) and grad_y, takes an unequal slice of the batch (4 ranks:
// 2, 0, 4 and 1 images, so one rank has none), runs the forward and the backward over the world
// and, alone, over the full batch with communicator nullptr, in both modes and both layouts:
//   kExact    save_mean, save_invstd, running statistics, num_batches_tracked and this rank's
//             slice of y and grad_x are the single-process bits;
//   kDefault  equal within 1e-12 (relative) on the statistics and 1e-5 on the float32 outputs;
//             the bits themselves with one process;
//   both      every rank holds the same save_mean/save_invstd bits; a second run gives the same
//             bits as the first; the sum over ranks of the local grad_weight/grad_bias is the
//             single-process gradient (within float32 rounding).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "detops/mpi.h"
#include "detops/sync_batch_norm.h"
#include "mpi_test_util.h"
#include "test_util.h"

namespace {

using namespace detops;
using test::make_tensor;
using test::to_vector;

constexpr std::int64_t kN = 7, kC = 5, kH = 6, kW = 5, kPlane = kC * kH * kW;

/// Images of each rank: unequal, one empty with 4 ranks.
std::vector<std::int64_t> split(int ranks) {
  switch (ranks) {
    case 1: return {7};
    case 2: return {3, 4};
    case 3: return {3, 0, 4};
    case 4: return {2, 0, 4, 1};
    default: break;
  }
  std::vector<std::int64_t> s(static_cast<std::size_t>(ranks), 0);  // more ranks than images: 1 each, then 0
  for (std::int64_t i = 0; i < kN; ++i) s[static_cast<std::size_t>(i % ranks)] += 1;
  return s;
}

struct Batch {
  std::vector<double> x, dy, weight, bias;
};

Batch make_batch() {
  Batch b;
  b.x = test::random_values(static_cast<std::size_t>(kN * kPlane), 1234, -1.0, 1.0);
  b.dy = test::random_values(static_cast<std::size_t>(kN * kPlane), 5678, -1.0, 1.0);
  for (std::int64_t n = 0; n < kN; ++n)
    for (std::int64_t c = 0; c < kC; ++c)
      for (std::int64_t i = 0; i < kH * kW; ++i) {
        double& v = b.x[static_cast<std::size_t>(n * kPlane + c * kH * kW + i)];
        if (c == 1) v = 1e4 + v;               // large mean, small spread
        if (c == 3) v = 0.75;                  // constant channel: var 0
        if (c == 4) v = 3.0 * v - 0.5;         // wider spread
      }
  b.weight = {0.5, 1.25, -0.75, 2.0, 1.0};
  b.bias = {0.0, -0.5, 0.25, 1.0, -2.0};
  return b;
}

std::vector<double> rows(const std::vector<double>& v, std::int64_t begin, std::int64_t count) {
  return {v.begin() + begin * kPlane, v.begin() + (begin + count) * kPlane};
}

struct Outputs {
  Tensor y, save_mean, save_invstd, running_mean, running_var, nbt, grad_x, grad_weight, grad_bias;
};

/// Forward and backward of the images [begin, begin + count) over comm (nullptr: alone).
Outputs run(const Batch& b, std::int64_t begin, std::int64_t count, Layout layout, SyncBnMode mode,
            Communicator* comm) {
  Tensor x = make_tensor({count, kC, kH, kW}, DType::kFloat32, rows(b.x, begin, count), layout);
  Tensor dy = make_tensor({count, kC, kH, kW}, DType::kFloat32, rows(b.dy, begin, count), layout);
  Tensor weight = make_tensor({kC}, DType::kFloat32, b.weight);
  Tensor bias = make_tensor({kC}, DType::kFloat32, b.bias);
  Outputs o;
  o.y = Tensor::empty({count, kC, kH, kW}, DType::kFloat32, Device::cpu(), layout);
  o.grad_x = Tensor::empty({count, kC, kH, kW}, DType::kFloat32, Device::cpu(), layout);
  o.save_mean = Tensor::zeros({kC}, DType::kFloat64);
  o.save_invstd = Tensor::zeros({kC}, DType::kFloat64);
  o.running_mean = Tensor::zeros({kC}, DType::kFloat32);
  o.running_var = make_tensor({kC}, DType::kFloat32, std::vector<double>(kC, 1.0));
  o.nbt = Tensor::zeros({1}, DType::kInt64);
  o.grad_weight = Tensor::zeros({kC}, DType::kFloat32);
  o.grad_bias = Tensor::zeros({kC}, DType::kFloat32);

  SyncBnParams params;
  params.weight = weight;
  params.bias = bias;
  params.running_mean = o.running_mean;
  params.running_var = o.running_var;
  params.num_batches_tracked = o.nbt;
  SyncBnOptions opts;
  opts.mode = mode;
  sync_batch_norm_forward(x, params, o.y, o.save_mean, o.save_invstd, comm, opts);
  sync_batch_norm_backward(dy, x, weight, o.save_mean, o.save_invstd, o.grad_x, o.grad_weight, o.grad_bias, comm, opts);
  return o;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

/// Largest |a - b| / (|b| + floor), and the index where it is.
double worst(const std::vector<double>& a, const std::vector<double>& b, double floor, std::size_t* at = nullptr) {
  double e = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double r = std::abs(a[i] - b[i]) / (std::abs(b[i]) + floor);
    if (r > e || std::isnan(r)) {
      e = std::isnan(r) ? INFINITY : r;
      if (at) *at = i;
    }
  }
  return a.size() == b.size() ? e : INFINITY;
}

void expect_bits(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  std::size_t at = 0;
  const double e = worst(a, b, 1e-300, &at);
  MPI_EXPECT(same_bits(a, b), "%s: not the single-process bits (size %zu vs %zu, worst relative error %.3g at %zu: "
             "%.17g vs %.17g)", what.c_str(), a.size(), b.size(), e, at, at < a.size() ? a[at] : 0.0,
             at < b.size() ? b[at] : 0.0);
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double tolerance, double floor,
                  const std::string& what) {
  std::size_t at = 0;
  const double e = worst(a, b, floor, &at);
  MPI_EXPECT(e <= tolerance, "%s: relative error %.3g > %.1g at %zu (%.17g vs %.17g)", what.c_str(), e, tolerance,
             at, at < a.size() ? a[at] : 0.0, at < b.size() ? b[at] : 0.0);
}

std::vector<double> all_outputs(const Outputs& o) {
  std::vector<double> v;
  for (const Tensor* t : {&o.y, &o.save_mean, &o.save_invstd, &o.running_mean, &o.running_var, &o.grad_x,
                          &o.grad_weight, &o.grad_bias}) {
    const std::vector<double> part = to_vector(*t);
    v.insert(v.end(), part.begin(), part.end());
  }
  v.push_back(static_cast<double>(*o.nbt.data<std::int64_t>()));
  return v;
}

/// Every rank's vector of `count` doubles, rank after rank.
std::vector<double> gather_world(const std::vector<double>& mine) {
  std::vector<double> all(mine.size() * static_cast<std::size_t>(test::world_size()));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(), static_cast<int>(mine.size()),
                MPI_DOUBLE, MPI_COMM_WORLD);
  return all;
}

void check(const Batch& b, Layout layout, SyncBnMode mode) {
  const int me = test::world_rank(), world = test::world_size();
  const std::vector<std::int64_t> counts = split(world);
  std::int64_t begin = 0;
  for (int r = 0; r < me; ++r) begin += counts[static_cast<std::size_t>(r)];
  const std::int64_t count = counts[static_cast<std::size_t>(me)];
  const bool exact = mode == SyncBnMode::kExact;
  const std::string tag = std::string(exact ? "exact" : "default") + (layout == Layout::kNHWC ? " nhwc" : " nchw") +
                          " rank " + std::to_string(me) + "/" + std::to_string(world) + " (" +
                          std::to_string(count) + " images)";

  const Outputs ref = run(b, 0, kN, layout, mode, nullptr);
  MpiCommunicator comm(MPI_COMM_WORLD);
  const Outputs got = run(b, begin, count, layout, mode, &comm);
  const Outputs again = run(b, begin, count, layout, mode, &comm);  // same communicator, later sequence numbers

  const std::vector<double> ref_y = rows(to_vector(ref.y), begin, count);
  const std::vector<double> ref_gx = rows(to_vector(ref.grad_x), begin, count);
  const bool bitwise = exact || world == 1;
  auto stats = [&](const Tensor& g, const Tensor& r, const char* name) {
    if (bitwise)
      expect_bits(to_vector(g), to_vector(r), tag + " " + name);
    else
      expect_close(to_vector(g), to_vector(r), 1e-12, 1e-300, tag + " " + name);
  };
  stats(got.save_mean, ref.save_mean, "save_mean");
  stats(got.save_invstd, ref.save_invstd, "save_invstd");
  if (bitwise) {
    expect_bits(to_vector(got.running_mean), to_vector(ref.running_mean), tag + " running_mean");
    expect_bits(to_vector(got.running_var), to_vector(ref.running_var), tag + " running_var");
    expect_bits(to_vector(got.y), ref_y, tag + " y");
    expect_bits(to_vector(got.grad_x), ref_gx, tag + " grad_x");
  } else {
    // float32 running statistics: the float64 values may round to neighbouring floats.
    expect_close(to_vector(got.running_mean), to_vector(ref.running_mean), 1e-6, 1e-6, tag + " running_mean");
    expect_close(to_vector(got.running_var), to_vector(ref.running_var), 1e-6, 1e-6, tag + " running_var");
    expect_close(to_vector(got.y), ref_y, 1e-5, 1.0, tag + " y");
    expect_close(to_vector(got.grad_x), ref_gx, 1e-5, 1.0, tag + " grad_x");
  }
  const std::int64_t nbt = *got.nbt.data<std::int64_t>(), ref_nbt = *ref.nbt.data<std::int64_t>();
  MPI_EXPECT(nbt == ref_nbt && nbt == 1, "%s num_batches_tracked %lld, single process %lld", tag.c_str(),
             static_cast<long long>(nbt), static_cast<long long>(ref_nbt));

  // The same statistics bits on every rank.
  std::vector<double> mine = to_vector(got.save_mean);
  const std::vector<double> invstd = to_vector(got.save_invstd);
  mine.insert(mine.end(), invstd.begin(), invstd.end());
  const std::vector<double> all = gather_world(mine);
  for (int r = 0; r < world; ++r)
    MPI_EXPECT(std::memcmp(all.data() + r * mine.size(), mine.data(), mine.size() * sizeof(double)) == 0,
               "%s: save_mean/save_invstd differ from rank %d's", tag.c_str(), r);

  // Run to run.
  MPI_EXPECT(same_bits(all_outputs(got), all_outputs(again)), "%s: a second run gave other bits", tag.c_str());

  // grad_weight and grad_bias are local contributions: their sum over ranks is the full gradient.
  std::vector<double> grads = to_vector(got.grad_weight);
  const std::vector<double> gb = to_vector(got.grad_bias);
  grads.insert(grads.end(), gb.begin(), gb.end());
  const std::vector<double> all_grads = gather_world(grads);
  std::vector<double> sum(grads.size(), 0.0);
  for (int r = 0; r < world; ++r)
    for (std::size_t i = 0; i < grads.size(); ++i) sum[i] += all_grads[r * grads.size() + i];
  std::vector<double> ref_grads = to_vector(ref.grad_weight);
  const std::vector<double> ref_gb = to_vector(ref.grad_bias);
  ref_grads.insert(ref_grads.end(), ref_gb.begin(), ref_gb.end());
  expect_close(sum, ref_grads, 1e-4, 1.0, tag + " sum over ranks of grad_weight, grad_bias");
  if (count == 0)
    MPI_EXPECT(same_bits(grads, std::vector<double>(grads.size(), 0.0)), "%s: a rank without images has non-zero "
               "grad_weight/grad_bias", tag.c_str());
}

void run_all(int, char**) {
  const Batch b = make_batch();
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact})
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) check(b, layout, mode);
}

}  // namespace

int main(int argc, char** argv) { return detops::test::mpi_main(argc, argv, run_all); }
