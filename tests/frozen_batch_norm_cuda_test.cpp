// FrozenBatchNorm2d on CUDA against the CPU backend (label gpu). Plain C++ over the public API,
// built in every configuration; every test skips with a message when no CUDA device is present.
//   - forward and backward: CUDA == CPU byte for byte (the shared element math with FMA contraction
//     off on both sides), every dtype x layout x epilogue, on sizes whose H*W or C is and is not a
//     multiple of the 16-byte vector width, on views that start one element into their buffer
//     (not 16-byte aligned: the scalar fallback) and on strided views; the gaps of strided views
//     stay untouched on both;
//   - in place (y == x, grad_x == grad_y) on the device gives the same bytes;
//   - the fold and FrozenBatchNorm2d on device buffers: the same bits as on the CPU;
//   - bad input: mixed devices and bad device-resident running_var are errors, outputs untouched.
// Selected for compute-sanitizer by the gpu preset (cmake/DetopsGpuCheck.cmake):
// gpu-check sanitizer: All/FrozenBnCuda.ForwardAndBackwardEqualCpuBitwise/float32_nhwc_add_relu:All/FrozenBnCuda.ForwardAndBackwardEqualCpuBitwise/bfloat16_slice_relu:FrozenBnCudaFold.*:FrozenBnCudaBadInput.*:FrozenBnCudaSemantics.EmptyProblemsLaunchNothing

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "detops/frozen_batch_norm.h"
#include "frozen_batch_norm_test_util.h"
#include "gpu_test.h"
#include "test_util.h"

namespace detops {

namespace {

using namespace test::frozen_bn;

/// A 4-d view into a 1-d storage poisoned with 0xCD, on the CPU or the device (make_buf picks
/// the layout's strides).
using Buf = test::StridedBuf;

/// Writes NCHW-ordered values into a CPU view (any strides), rounding to its dtype.
void fill_view(const TensorView& v, const std::vector<double>& values) {
  const std::int64_t N = v.sizes[0], C = v.sizes[1], H = v.sizes[2], W = v.sizes[3];
  std::size_t k = 0;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t w = 0; w < W; ++w, ++k) {
          const std::int64_t o = n * v.strides[0] + c * v.strides[1] + h * v.strides[2] + w * v.strides[3];
          const double x = values[k];
          switch (v.dtype) {
            case DType::kFloat32: static_cast<float*>(v.data)[o] = static_cast<float>(x); break;
            case DType::kFloat64: static_cast<double*>(v.data)[o] = x; break;
            case DType::kFloat16: static_cast<Half*>(v.data)[o] = from_double<Half>(x); break;
            case DType::kBFloat16: static_cast<BFloat16*>(v.data)[o] = from_double<BFloat16>(x); break;
            default: break;
          }
        }
}

/// Whole storages (elements and gaps) equal byte for byte; says how many elements differ if not.
::testing::AssertionResult same_storage(const Buf& cpu, const Buf& gpu) {
  const Tensor back = gpu.storage.to(Device::cpu());
  if (back.nbytes() != cpu.storage.nbytes()) return ::testing::AssertionFailure() << "storage sizes differ";
  if (std::memcmp(back.view().data, cpu.storage.view().data, back.nbytes()) == 0) return ::testing::AssertionSuccess();
  TensorView gv = cpu.view;
  gv.data = static_cast<char*>(back.view().data) +
            (static_cast<const char*>(cpu.view.data) - static_cast<const char*>(cpu.storage.view().data));
  const std::vector<double> a = test::to_vector(cpu.view), b = test::to_vector(gv);
  std::int64_t differ = 0, first = -1;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++differ;
    }
  auto f = ::testing::AssertionFailure() << differ << " of " << a.size() << " elements differ";
  if (first >= 0) f << "; first at " << first << ": cpu " << a[first] << ", cuda " << b[first];
  else f << " (only bytes outside the view: the gaps were written)";
  return f;
}

// H*W and C multiples of 8 (the float16 vector width) or not, C = 1, H*W = 1, and one
// backbone-sized tensor.
constexpr Shape kShapes[] = {{2, 19, 5, 7}, {2, 16, 4, 8}, {1, 64, 7, 7}, {3, 3, 1, 1}, {1, 1, 6, 11},
                             {2, 24, 3, 5}, {2, 256, 25, 34}};

Tensor param(const std::vector<double>& v, DType dt, Device dev = Device::cpu()) {
  Tensor t = test::make_tensor({static_cast<std::int64_t>(v.size())}, dt, v);
  return dev.is_cpu() ? std::move(t) : t.to(dev);
}

using Param = std::tuple<DType, Lay, Epi>;
class FrozenBnCuda : public ::testing::TestWithParam<Param> {};

TEST_P(FrozenBnCuda, ForwardAndBackwardEqualCpuBitwise) {
  DETOPS_REQUIRE_GPU();
  const auto [dt, lay, epi] = GetParam();
  const DType pdt = dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  std::uint64_t seed = 500;
  for (const Shape& s : kShapes) {
    seed += 10;
    SCOPED_TRACE(::testing::Message() << "shape [" << s.N << ", " << s.C << ", " << s.H << ", " << s.W << "]");
    const std::size_t n = static_cast<std::size_t>(s.N * s.C * s.H * s.W);
    const std::vector<double> sc = test::random_values(static_cast<std::size_t>(s.C), seed, -2, 2);
    const std::vector<double> sh = test::random_values(static_cast<std::size_t>(s.C), seed + 1, -1, 1);
    const Tensor scale = param(sc, pdt), shift = param(sh, pdt);
    const Tensor scale_g = scale.to(gpu), shift_g = shift.to(gpu);

    Buf x = make_buf(s, dt, lay, cpu), r = make_buf(s, dt, lay, cpu);
    Buf gy = make_buf(s, dt, lay, cpu);
    fill_view(x.view, test::random_values(n, seed + 2, -3, 3));
    fill_view(r.view, test::random_values(n, seed + 3, -2, 2));
    fill_view(gy.view, test::random_values(n, seed + 4, -1, 1));
    const Buf xg = x.to(gpu), rg = r.to(gpu), gyg = gy.to(gpu);
    const bool add = epi == Epi::kAddRelu;

    // Forward
    Buf y = make_buf(s, dt, lay, cpu), yg = make_buf(s, dt, lay, gpu);
    frozen_batch_norm_forward(x.view, scale, shift, y.view, epi, add ? r.view : TensorView{});
    frozen_batch_norm_forward(xg.view, scale_g, shift_g, yg.view, epi, add ? rg.view : TensorView{});
    EXPECT_TRUE(same_storage(y, yg)) << "forward";

    // Forward in place on the device
    Buf xi = x.to(gpu);
    frozen_batch_norm_forward(xi.view, scale_g, shift_g, xi.view, epi, add ? rg.view : TensorView{});
    EXPECT_TRUE(same_storage(y, xi)) << "in-place forward (gaps compared too: x's gaps are y's poison)";

    // Backward, from the CPU forward's y on both sides
    const Buf yg_in = y.to(gpu);
    Buf gx = make_buf(s, dt, lay, cpu), gxg = make_buf(s, dt, lay, gpu);
    Buf gr = make_buf(s, dt, lay, cpu), grg = make_buf(s, dt, lay, gpu);
    frozen_batch_norm_backward(gy.view, scale, gx.view, epi, has_relu(epi) ? y.view : TensorView{},
                               add ? gr.view : TensorView{});
    frozen_batch_norm_backward(gyg.view, scale_g, gxg.view, epi, has_relu(epi) ? yg_in.view : TensorView{},
                               add ? grg.view : TensorView{});
    EXPECT_TRUE(same_storage(gx, gxg)) << "backward grad_x";
    EXPECT_TRUE(same_storage(gr, grg)) << "backward grad_residual (all poison unless add_relu)";

    // Backward in place on the device, with and without grad_residual
    Buf gi = gy.to(gpu);
    Buf gri = make_buf(s, dt, lay, gpu);
    frozen_batch_norm_backward(gi.view, scale_g, gi.view, epi, has_relu(epi) ? yg_in.view : TensorView{},
                               add ? gri.view : TensorView{});
    EXPECT_TRUE(same_storage(gx, gi)) << "in-place backward";
    EXPECT_TRUE(same_storage(gr, gri)) << "in-place backward grad_residual";
    if (add) {
      Buf gx2 = make_buf(s, dt, lay, gpu);
      frozen_batch_norm_backward(gyg.view, scale_g, gx2.view, epi, yg_in.view, TensorView{});
      EXPECT_TRUE(same_storage(gx, gx2)) << "backward without grad_residual";
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Param>& i) {
  const auto [dt, lay, epi] = i.param;
  return std::string(dtype_name(dt)) + "_" + lay_name(lay) + "_" + epi_name(epi);
}

INSTANTIATE_TEST_SUITE_P(All, FrozenBnCuda,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                                              DType::kBFloat16),
                                            ::testing::ValuesIn(kLays),
                                            ::testing::Values(Epi::kNone, Epi::kRelu, Epi::kAddRelu)),
                         case_name);

TEST(FrozenBnCudaSemantics, RepeatedRunsAndLargeTensorAgree) {
  DETOPS_REQUIRE_GPU();
  // A backbone activation ([2, 256, 200, 272] float16 NHWC, 56 MB), forward add+relu, 5 runs.
  const Device gpu = Device::cuda(0);
  const std::int64_t N = 2, C = 256, H = 200, W = 272;
  const Tensor scale = param(test::random_values(C, 1, -2, 2), DType::kFloat32);
  const Tensor shift = param(test::random_values(C, 2, -1, 1), DType::kFloat32);
  const std::vector<double> xv = test::random_values(static_cast<std::size_t>(N * C * H * W), 3, -3, 3);
  const Tensor x = test::make_tensor({N, C, H, W}, DType::kFloat16, xv, Layout::kNHWC);
  const Tensor r = test::make_tensor({N, C, H, W}, DType::kFloat16, xv, Layout::kNHWC);
  Tensor y = Tensor::empty({N, C, H, W}, DType::kFloat16, Device::cpu(), Layout::kNHWC);
  Context ctx;
  ctx.num_threads = 0;
  frozen_batch_norm_forward(x, scale, shift, y, Epi::kAddRelu, r, ctx);
  const Tensor xg = x.to(gpu), rg = r.to(gpu), sg = scale.to(gpu), hg = shift.to(gpu);
  Tensor yg = Tensor::empty({N, C, H, W}, DType::kFloat16, gpu, Layout::kNHWC);
  for (int run = 0; run < 5; ++run) {
    yg.fill_bytes(0);
    frozen_batch_norm_forward(xg, sg, hg, yg, Epi::kAddRelu, rg);
    ASSERT_TRUE(test::same_bytes(y, yg.to(Device::cpu()))) << "run " << run;
  }
}

TEST(FrozenBnCudaFold, DeviceBuffersFoldToTheCpuBits) {
  DETOPS_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const std::size_t C = 77;
  std::vector<double> v = test::random_values(C, 14, 0, 3);
  v[3] = 0.0;
  for (DType pdt : {DType::kFloat32, DType::kFloat64}) {
    SCOPED_TRACE(dtype_name(pdt));
    const Tensor w = param(test::random_values(C, 11, -2, 2), pdt), b = param(test::random_values(C, 12, -1, 1), pdt),
                 m = param(test::random_values(C, 13, -1, 1), pdt), rv = param(v, pdt);
    const BatchNormState st{w, b, m, rv, 1e-5};
    Tensor s = Tensor::empty({static_cast<std::int64_t>(C)}, pdt), h = Tensor::empty({static_cast<std::int64_t>(C)}, pdt);
    frozen_batch_norm_fold(st, s, h);
    const Tensor wg = w.to(gpu), bg = b.to(gpu), mg = m.to(gpu), rvg = rv.to(gpu);
    const BatchNormState stg{wg, bg, mg, rvg, 1e-5};
    Tensor sg = Tensor::empty({static_cast<std::int64_t>(C)}, pdt, gpu), hg = Tensor::empty({static_cast<std::int64_t>(C)}, pdt, gpu);
    frozen_batch_norm_fold(stg, sg, hg);
    EXPECT_TRUE(test::same_bytes(s, sg.to(Device::cpu()))) << "scale";
    EXPECT_TRUE(test::same_bytes(h, hg.to(Device::cpu()))) << "shift";
    // The module built on the device from CPU buffers, and its state on the device.
    const FrozenBatchNorm2d fbn = FrozenBatchNorm2d::from_state(st, gpu);
    EXPECT_TRUE(fbn.scale().view().device == gpu);
    EXPECT_TRUE(test::same_bytes(s, fbn.scale().to(Device::cpu())));
    EXPECT_TRUE(test::same_bytes(h, fbn.shift().to(Device::cpu())));
    const BatchNormState back = fbn.state();
    EXPECT_TRUE(back.running_var.device == gpu);
    // Read the device running_var back through a CPU module built from the device state.
    const std::vector<double> got = [&] {
      FrozenBatchNorm2d cpu_copy = FrozenBatchNorm2d::from_state(back, Device::cpu());
      return test::to_vector(cpu_copy.state().running_var);
    }();
    const std::vector<double> want = test::to_vector(rv);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(double))) << "running_var round trip";
  }
}

TEST(FrozenBnCudaIdentity, IdentityOnDeviceIsExact) {
  DETOPS_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const FrozenBatchNorm2d id = FrozenBatchNorm2d::identity(8, 1e-5, gpu);
  const Tensor x = test::make_tensor({2, 8, 5, 7}, DType::kFloat32, test::random_values(560, 9, -100, 100));
  const Tensor xg = x.to(gpu);
  Tensor yg = Tensor::empty({2, 8, 5, 7}, DType::kFloat32, gpu);
  id.forward(xg, yg);
  EXPECT_TRUE(test::same_bytes(x, yg.to(Device::cpu())));
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(FrozenBnCudaBadInput, MixedDevicesAndBadDeviceStatistics) {
  DETOPS_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Tensor x = test::make_tensor({2, 3, 4, 5}, DType::kFloat32, test::random_values(120, 1)).to(gpu);
  const Tensor scale_cpu = param({1, 2, 3}, DType::kFloat32), shift = param({0, 0, 0}, DType::kFloat32, gpu);
  Tensor y = Tensor::empty({2, 3, 4, 5}, DType::kFloat32, gpu);
  y.fill_bytes(0xA5);
  const std::string m1 = what_of([&] { frozen_batch_norm_forward(x, scale_cpu, shift, y); });
  EXPECT_NE(m1.find("frozen_batch_norm_forward"), std::string::npos) << m1;
  EXPECT_NE(m1.find("scale"), std::string::npos) << m1;
  const Tensor yb = y.to(Device::cpu());
  for (std::size_t i = 0; i < yb.nbytes(); ++i) ASSERT_EQ(static_cast<unsigned char*>(yb.view().data)[i], 0xA5);
  // A negative running_var in device memory is found too (the fold reads the statistics).
  std::vector<double> v = {1.0, -0.5, 2.0};
  const Tensor w = param({1, 1, 1}, DType::kFloat32, gpu), b = param({0, 0, 0}, DType::kFloat32, gpu),
               m = param({0, 0, 0}, DType::kFloat32, gpu), rv = param(v, DType::kFloat32, gpu);
  Tensor s = Tensor::empty({3}, DType::kFloat32, gpu), h = Tensor::empty({3}, DType::kFloat32, gpu);
  s.fill_bytes(0xA5);
  const std::string m2 = what_of([&] { frozen_batch_norm_fold(BatchNormState{w, b, m, rv, 1e-5}, s, h); });
  EXPECT_NE(m2.find("frozen_batch_norm_fold"), std::string::npos) << m2;
  EXPECT_NE(m2.find("running_var"), std::string::npos) << m2;
  const Tensor sb = s.to(Device::cpu());
  for (std::size_t i = 0; i < sb.nbytes(); ++i) ASSERT_EQ(static_cast<unsigned char*>(sb.view().data)[i], 0xA5);
}

TEST(FrozenBnCudaSemantics, EmptyProblemsLaunchNothing) {
  DETOPS_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Tensor scale = param({1, 2, 3}, DType::kFloat32, gpu), shift = param({0, 0, 0}, DType::kFloat32, gpu);
  const Tensor x = Tensor::empty({0, 3, 4, 5}, DType::kFloat32, gpu);
  Tensor y = Tensor::empty({0, 3, 4, 5}, DType::kFloat32, gpu);
  EXPECT_EQ(what_of([&] { frozen_batch_norm_forward(x, scale, shift, y, Epi::kRelu); }), "no error");
  EXPECT_EQ(what_of([&] { frozen_batch_norm_backward(x, scale, y, Epi::kRelu, x); }), "no error");
}

}  // namespace
}  // namespace detops
