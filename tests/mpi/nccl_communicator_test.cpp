// NcclCommunicator over a one-rank NCCL world (label gpu; every test skips without a device, or
// where the machine refuses NCCL's bootstrap):
//   - rank, size and device from the borrowed communicator, which is left alive;
//   - all_gather of device buffers (ncclAllGather on the caller's stream) and of host buffers
//     (staged through a device buffer), zero bytes, a device other than the communicator's refused;
//   - SyncBatchNorm forward and backward on CUDA tensors over NcclCommunicator: the bits of the
//     CPU backend with communicator nullptr (both modes, NCHW and NHWC, float32 and float64), and
//     the same bits for CPU tensors with the NcclCommunicator passed. With one rank the one-call
//     path gathers nothing (size 1 needs no exchange: no header, no records, so no host staging
//     either), so these check the CUDA backend and the communicator's plumbing, not NCCL's
//     transport; host buffers staged through the device are AllGatherDeviceAndHost's;
//   - the forward phases driven by hand with every record moved by ncclAllGather on the stream
//     (device records, as a multi-rank run moves them): the one-call CPU bits.
// NCCL allows one rank per GPU: more ranks need more GPUs (not available where this runs).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "detops/nccl.h"
#include "detops/sync_batch_norm.h"
#include "gpu_test.h"
#include "test_util.h"

namespace detops {
namespace {

/// A one-rank NCCL world on device 0, destroyed by the test (the communicator only borrows it).
class OneRankWorld {
 public:
  OneRankWorld() {
    int device = 0;
    result_ = ncclCommInitAll(&comm_, 1, &device);
  }
  ~OneRankWorld() {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  bool ok() const { return result_ == ncclSuccess; }
  /// A sandbox without the shared memory or sockets NCCL's bootstrap wants refuses even one rank
  /// (a system or internal error): that is the machine, not detops, so the test skips and says so.
  bool refused_by_machine() const { return result_ == ncclSystemError || result_ == ncclInternalError; }
  std::string error() const { return ncclGetErrorString(result_); }
  ncclComm_t comm() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
  ncclResult_t result_ = ncclSuccess;
};

#define DETOPS_NCCL_REQUIRE_WORLD(world)                                                                         \
  do {                                                                                                          \
    if ((world).refused_by_machine())                                                                           \
      GTEST_SKIP() << "the machine refuses NCCL's one-rank bootstrap: ncclCommInitAll: " << (world).error();    \
    ASSERT_TRUE((world).ok()) << "ncclCommInitAll for one rank failed: " << (world).error();                    \
  } while (0)

#define DETOPS_NCCL_WORLD(world) \
  DETOPS_REQUIRE_GPU();          \
  OneRankWorld world;            \
  DETOPS_NCCL_REQUIRE_WORLD(world)

TEST(NcclCommunicator, BorrowsTheCommunicator) {
  DETOPS_NCCL_WORLD(world);
  {
    NcclCommunicator comm(world.comm());
    EXPECT_EQ(comm.rank(), 0);
    EXPECT_EQ(comm.size(), 1);
    EXPECT_EQ(comm.cuda_device(), 0);
    EXPECT_TRUE(comm.accepts_device_memory());
    EXPECT_STREQ(comm.name(), "nccl");
    EXPECT_EQ(comm.comm(), world.comm());
  }
  int count = 0;  // still usable after the NcclCommunicator is gone
  EXPECT_EQ(ncclCommCount(world.comm(), &count), ncclSuccess);
  EXPECT_EQ(count, 1);
}

TEST(NcclCommunicator, NullCommIsInvalidArgument) {
  try {
    NcclCommunicator comm(nullptr);
    FAIL() << "a null communicator was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

TEST(NcclCommunicator, AllGatherDeviceAndHost) {
  DETOPS_NCCL_WORLD(world);
  NcclCommunicator comm(world.comm());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::vector<unsigned char> send(1001), recv(1001 + 8, 0xAB);
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<unsigned char>(i * 7 + 3);

  // Host memory: staged, complete on return.
  comm.all_gather(send.data(), recv.data(), send.size(), Device::cpu(), nullptr);
  EXPECT_EQ(std::memcmp(recv.data(), send.data(), send.size()), 0);
  for (std::size_t i = send.size(); i < recv.size(); ++i) EXPECT_EQ(recv[i], 0xAB) << "written past the end at " << i;

  // Device memory: enqueued on the stream.
  void *d_send = nullptr, *d_recv = nullptr;
  ASSERT_EQ(cudaMalloc(&d_send, send.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_recv, send.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_send, send.data(), send.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_recv, 0, send.size()), cudaSuccess);
  comm.all_gather(d_send, d_recv, send.size(), Device::cuda(0), stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<unsigned char> back(send.size());
  ASSERT_EQ(cudaMemcpy(back.data(), d_recv, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, send);

  comm.all_gather(d_send, d_recv, 0, Device::cuda(0), stream);  // zero bytes: nothing to do
  try {
    comm.all_gather(d_send, d_recv, 8, Device::cuda(1), stream);
    ADD_FAILURE() << "a device other than the communicator's was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  cudaFree(d_send);
  cudaFree(d_recv);
  cudaStreamDestroy(stream);
}

// ---------------------------------------------------------------------------------------------
// SyncBatchNorm over NcclCommunicator == CPU with communicator nullptr, bit for bit.

constexpr std::int64_t kN = 3, kC = 6, kH = 7, kW = 5;

struct Result {
  Tensor y, save_mean, save_invstd, running_mean, running_var, nbt, grad_x, grad_weight, grad_bias;
  std::vector<Tensor*> all() { return {&y, &save_mean, &save_invstd, &running_mean, &running_var, &nbt, &grad_x,
                                       &grad_weight, &grad_bias}; }
};

Result run(Device device, DType dtype, Layout layout, SyncBnMode mode, Communicator* comm, void* stream) {
  const std::size_t numel = static_cast<std::size_t>(kN * kC * kH * kW);
  std::vector<double> xv = test::random_values(numel, 91, -2.0, 2.0);
  for (std::size_t i = 0; i < numel; ++i)
    if ((i / (kH * kW)) % kC == 2) xv[i] += 1e4;  // one channel with a large mean
  const Tensor x = test::make_tensor({kN, kC, kH, kW}, dtype, xv, layout).to(device);
  const Tensor dy = test::make_tensor({kN, kC, kH, kW}, dtype, test::random_values(numel, 92), layout).to(device);
  const Tensor weight = test::make_tensor({kC}, DType::kFloat32, test::random_values(kC, 93, 0.5, 1.5)).to(device);
  const Tensor bias = test::make_tensor({kC}, DType::kFloat32, test::random_values(kC, 94)).to(device);
  Result r;
  r.y = Tensor::zeros({kN, kC, kH, kW}, dtype, device, layout);
  r.grad_x = Tensor::zeros({kN, kC, kH, kW}, dtype, device, layout);
  r.save_mean = Tensor::zeros({kC}, DType::kFloat64, device);
  r.save_invstd = Tensor::zeros({kC}, DType::kFloat64, device);
  r.running_mean = Tensor::zeros({kC}, DType::kFloat32, device);
  r.running_var = test::make_tensor({kC}, DType::kFloat32, std::vector<double>(kC, 1.0)).to(device);
  r.nbt = Tensor::zeros({1}, DType::kInt64, device);
  r.grad_weight = Tensor::zeros({kC}, DType::kFloat32, device);
  r.grad_bias = Tensor::zeros({kC}, DType::kFloat32, device);
  SyncBnParams params;
  params.weight = weight;
  params.bias = bias;
  params.running_mean = r.running_mean;
  params.running_var = r.running_var;
  params.num_batches_tracked = r.nbt;
  SyncBnOptions opts;
  opts.mode = mode;
  Context ctx;
  ctx.cuda_stream = stream;
  sync_batch_norm_forward(x, params, r.y, r.save_mean, r.save_invstd, comm, opts, ctx);
  sync_batch_norm_backward(dy, x, weight, r.save_mean, r.save_invstd, r.grad_x, r.grad_weight, r.grad_bias, comm, opts,
                           ctx);
  if (device.is_cuda()) {
    EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), cudaSuccess);
    for (Tensor* t : r.all()) *t = t->to(Device::cpu());
  }
  return r;
}

using Param = std::tuple<SyncBnMode, Layout, DType>;
/// A one-rank world, its NcclCommunicator and a non-blocking stream for each case.
class NcclSyncBatchNorm : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    DETOPS_REQUIRE_GPU();
    world_.emplace();
    DETOPS_NCCL_REQUIRE_WORLD(*world_);
    comm_.emplace(world_->comm());
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    comm_.reset();
    world_.reset();
  }
  std::optional<OneRankWorld> world_;
  std::optional<NcclCommunicator> comm_;
  cudaStream_t stream_ = nullptr;
};

TEST_P(NcclSyncBatchNorm, CudaOverNcclIsTheCpuBits) {
  const auto [mode, layout, dtype] = GetParam();
  NcclCommunicator& comm = *comm_;
  cudaStream_t stream = stream_;
  Result cpu = run(Device::cpu(), dtype, layout, mode, nullptr, nullptr);
  Result cuda = run(Device::cuda(0), dtype, layout, mode, &comm, stream);
  // CPU tensors with the NcclCommunicator passed: with one rank neither the header exchange nor the
  // record gathers run (size 1), so nothing is staged through the device here; this checks that
  // passing the communicator changes nothing. The host-staging path itself is AllGatherDeviceAndHost's.
  Result staged = run(Device::cpu(), dtype, layout, mode, &comm, nullptr);
  const char* names[] = {"y", "save_mean", "save_invstd", "running_mean", "running_var", "num_batches_tracked",
                         "grad_x", "grad_weight", "grad_bias"};
  const auto a = cpu.all(), b = cuda.all(), c = staged.all();
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(test::same_bytes(*a[i], *b[i])) << names[i] << ": CUDA over NCCL differs from the CPU bits";
    EXPECT_TRUE(test::same_bytes(*a[i], *c[i])) << names[i] << ": CPU over NCCL differs from the CPU bits";
  }
  EXPECT_EQ(*cuda.nbt.data<std::int64_t>(), 1);
}

// The forward phases with the records gathered through NCCL on the op's stream: the path a
// multi-rank run takes, which the one-rank one-call path skips.
TEST_P(NcclSyncBatchNorm, PhasesOverNcclAllGatherAreTheCpuBits) {
  const auto [mode, layout, dtype] = GetParam();
  NcclCommunicator& comm = *comm_;
  cudaStream_t stream = stream_;
  const Result cpu = run(Device::cpu(), dtype, layout, mode, nullptr, nullptr);

  const Device gpu = Device::cuda(0);
  const std::size_t numel = static_cast<std::size_t>(kN * kC * kH * kW);
  std::vector<double> xv = test::random_values(numel, 91, -2.0, 2.0);  // the inputs of run()
  for (std::size_t i = 0; i < numel; ++i)
    if ((i / (kH * kW)) % kC == 2) xv[i] += 1e4;
  const Tensor x = test::make_tensor({kN, kC, kH, kW}, dtype, xv, layout).to(gpu);
  const Tensor weight = test::make_tensor({kC}, DType::kFloat32, test::random_values(kC, 93, 0.5, 1.5)).to(gpu);
  const Tensor bias = test::make_tensor({kC}, DType::kFloat32, test::random_values(kC, 94)).to(gpu);
  Tensor y = Tensor::zeros({kN, kC, kH, kW}, dtype, gpu, layout);
  Tensor save_mean = Tensor::zeros({kC}, DType::kFloat64, gpu), save_invstd = Tensor::zeros({kC}, DType::kFloat64, gpu);
  Tensor running_mean = Tensor::zeros({kC}, DType::kFloat32, gpu);
  Tensor running_var = test::make_tensor({kC}, DType::kFloat32, std::vector<double>(kC, 1.0)).to(gpu);
  Tensor nbt = Tensor::zeros({1}, DType::kInt64, gpu);
  SyncBnParams params;
  params.weight = weight;
  params.bias = bias;
  params.running_mean = running_mean;
  params.running_var = running_var;
  params.num_batches_tracked = nbt;
  SyncBnOptions opts;
  opts.mode = mode;
  Context ctx;
  ctx.cuda_stream = stream;
  auto gather = [&](const Tensor& local, Tensor& gathered) {
    comm.all_gather(local.view().data, gathered.view().data, static_cast<std::size_t>(local.nbytes()), gpu, stream);
  };
  TensorView scales_view;
  Tensor scales;
  if (mode == SyncBnMode::kExact) {
    const std::int64_t sw = sync_batch_norm_scale_words(kC, false);
    Tensor local = Tensor::zeros({sw}, DType::kInt64, gpu), gathered = Tensor::zeros({1, sw}, DType::kInt64, gpu);
    scales = Tensor::zeros({sw}, DType::kInt64, gpu);
    sync_batch_norm_local_scales(x, {}, {}, local, ctx);
    gather(local, gathered);
    sync_batch_norm_merge_scales(gathered, scales, ctx);
    scales_view = scales;
  }
  const std::int64_t words = sync_batch_norm_record_words(kC, mode);
  Tensor record = Tensor::zeros({words}, DType::kInt64, gpu), gathered = Tensor::zeros({1, words}, DType::kInt64, gpu);
  sync_batch_norm_local_stats(x, record, mode, scales_view, ctx);
  gather(record, gathered);
  sync_batch_norm_finalize_stats(gathered, params, save_mean, save_invstd, opts, scales_view, ctx);
  sync_batch_norm_apply(x, params, save_mean, save_invstd, y, ctx);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Tensor* want[] = {&cpu.y, &cpu.save_mean, &cpu.save_invstd, &cpu.running_mean, &cpu.running_var, &cpu.nbt};
  const Tensor* got[] = {&y, &save_mean, &save_invstd, &running_mean, &running_var, &nbt};
  for (std::size_t i = 0; i < std::size(got); ++i)
    EXPECT_TRUE(test::same_bytes(*want[i], got[i]->to(Device::cpu()))) << i << ": phases over NCCL differ from the CPU";
}

INSTANTIATE_TEST_SUITE_P(All, NcclSyncBatchNorm,
                         ::testing::Combine(::testing::Values(SyncBnMode::kDefault, SyncBnMode::kExact),
                                            ::testing::Values(Layout::kNCHW, Layout::kNHWC),
                                            ::testing::Values(DType::kFloat32, DType::kFloat64)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(std::get<0>(info.param) == SyncBnMode::kExact ? "exact" : "default") +
                                  (std::get<1>(info.param) == Layout::kNHWC ? "_nhwc_" : "_nchw_") +
                                  std::string(dtype_name(std::get<2>(info.param)));
                         });

}  // namespace
}  // namespace detops
