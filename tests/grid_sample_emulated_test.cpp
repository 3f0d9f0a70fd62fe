// The CUDA backend of grid_sample run on the CPU: its own steps (internal/grid_sample_device.h,
// the code cuda/grid_sample_cuda.cu runs on CudaDevice) on the emulated device
// (tests/emulated_device.h: every thread index in order, CUB's contracts), byte for byte against
// the CPU backend, the backward from a poisoned grad_input and workspace. The CPU backend uses its
// own loops (points with channels inside, planes for the scatter, the engine's counting sort), so
// agreement to the bit checks both the CUDA sequence and the claim that the two backends evaluate
// the same arithmetic. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "emulated_device.h"
#include "grid_sample_test_util.h"
#include "internal/grid_sample_backend.h"
#include "internal/grid_sample_device.h"

namespace detops {
namespace {

struct Case {
  test::GridSampleProblem p;
  test::GridSampleTensors t;
  detail::GridSampleShape shape;
};

/// Sizes of a case: [N, C, H, W] sampled at [N, Ho, Wo].
struct Sizes {
  std::int64_t N, C, H, W, Ho, Wo;
};

// By default many points outside a small map: long runs on the border pixels with border padding.
Case make_case(DType dt, DType gdt, Layout layout, const GridSampleOptions& o, const Sizes& z = {2, 5, 6, 7, 9, 11}) {
  Case c;
  c.p = test::make_grid_problem(z.N, z.C, z.H, z.W, z.Ho, z.Wo, o, 500, 2.5);
  c.t = test::grid_tensors(c.p, dt, gdt, layout);
  c.shape = {z.N, z.C, z.H, z.W, z.Ho, z.Wo, o.interpolation == GridSampleInterpolation::kNearest,
             static_cast<int>(o.padding), o.align_corners, o.coordinates == GridSampleCoordinates::kUnit};
  return c;
}

internal::GridSampleCall make_call(const Case& c) {
  internal::GridSampleCall call{};
  call.op = "emulated";
  call.input = c.t.input.view();
  call.grid = c.t.grid.view();
  call.grad_output = c.t.grad_output.view();
  call.shape = c.shape;
  return call;
}

template <class T>
void check_forward(const Case& c, Layout layout, const std::string& what) {
  const test::GridSampleProblem& p = c.p;
  Tensor want = Tensor::empty({p.N, p.C, p.Ho, p.Wo}, c.t.input.view().dtype, Device::cpu(), layout);
  grid_sample_forward(c.t.input, c.t.grid, want, p.opt);
  Tensor got = Tensor::empty({p.N, p.C, p.Ho, p.Wo}, c.t.input.view().dtype, Device::cpu(), layout);
  got.fill_bytes(0xCD);
  internal::GridSampleCall call = make_call(c);
  call.output = got.view();
  internal::grid_sample_forward_on<T>(test::EmulatedDevice{}, call);
  EXPECT_TRUE(test::same_bytes(got, want)) << what << " forward";
}

/// The CUDA backend's backward in `mode`: grad_input (poisoned first: the zero fill must clear
/// it) and grad_grid, against the CPU backend's.
template <class T>
void check_backward(const Case& c, DType gdt, Layout layout, BackwardMode mode, const std::string& what) {
  const test::GridSampleProblem& p = c.p;
  const DType dt = c.t.input.view().dtype;
  Tensor want_gi = Tensor::empty({p.N, p.C, p.H, p.W}, dt, Device::cpu(), layout);
  Tensor want_gg = Tensor::empty({p.N, p.Ho, p.Wo, 2}, gdt);
  GridSampleBackwardOptions b;
  b.mode = mode;
  grid_sample_backward(c.t.grad_output, c.t.input, c.t.grid, want_gi, want_gg, p.opt, b);
  Tensor got_gi = Tensor::empty({p.N, p.C, p.H, p.W}, dt, Device::cpu(), layout);
  Tensor got_gg = Tensor::empty({p.N, p.Ho, p.Wo, 2}, gdt);
  got_gi.fill_bytes(0xCD);
  got_gg.fill_bytes(0xCD);
  internal::GridSampleCall call = make_call(c);
  call.grad_input = got_gi.view();
  call.grad_grid = got_gg.view();
  const test::EmulatedDevice dev;
  test::PoisonedWorkspace ws(internal::grid_sample_backward_workspace_on(dev, call, mode));
  internal::grid_sample_backward_on<T>(dev, call, mode, ws.ws);
  EXPECT_TRUE(test::same_bytes(got_gi, want_gi)) << what << " " << to_string(mode) << " grad_input";
  EXPECT_TRUE(test::same_bytes(got_gg, want_gg)) << what << " " << to_string(mode) << " grad_grid";
}

template <class T>
void check_all(const Case& c, DType gdt, Layout layout, const std::string& what) {
  check_forward<T>(c, layout, what);
  for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) check_backward<T>(c, gdt, layout, mode, what);
}

TEST(GridSampleEmulated, KernelBodiesMatchTheCpuBackendBitwise) {
  std::vector<GridSampleOptions> options = test::all_grid_options();
  for (GridSampleOptions o : test::all_grid_options()) {  // and point_sample's unit coordinates
    o.coordinates = GridSampleCoordinates::kUnit;
    options.push_back(o);
  }
  for (const GridSampleOptions& o : options) {
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      const DType gdt = dt == DType::kFloat64 ? DType::kFloat32 : dt;  // a mixed pair for float64
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
        const Case c = make_case(dt, gdt, layout, o);
        const std::string what = std::string(to_string(o.interpolation)) + "/" + to_string(o.padding) + "/ac" +
                                 std::to_string(o.align_corners) + "/" + to_string(o.coordinates) + "/" +
                                 std::string(dtype_name(dt)) + (layout == Layout::kNHWC ? "/nhwc" : "/nchw");
        internal::dispatch_floating(dt, [&](auto tag) {
          using T = decltype(tag);
          check_all<T>(c, gdt, layout, what);
        });
      }
    }
  }
}

/// The CPU backend's other loop shapes: one channel (point by point), one image and several, more
/// channel groups than one (16 channels each) and more points than one piece of grad_grid's
/// channel-outer walk (4096), each against the bodies.
TEST(GridSampleEmulated, CpuLoopShapesMatchTheBodies) {
  const GridSampleOptions bilinear_zeros{GridSampleInterpolation::kBilinear, GridSamplePadding::kZeros, false};
  const GridSampleOptions bilinear_border{GridSampleInterpolation::kBilinear, GridSamplePadding::kBorder, true};
  for (const Sizes& z : {Sizes{1, 1, 9, 10, 70, 71}, Sizes{3, 1, 9, 10, 20, 21}, Sizes{2, 40, 8, 9, 70, 71},
                         Sizes{3, 20, 7, 8, 12, 13}}) {
    for (const GridSampleOptions& o : {bilinear_zeros, bilinear_border}) {
      for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
        for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
          const Case c = make_case(dt, dt, layout, o, z);
          const std::string what = "N" + std::to_string(z.N) + " C" + std::to_string(z.C) + " " +
                                   to_string(o.padding) + "/" + std::string(dtype_name(dt)) +
                                   (layout == Layout::kNHWC ? "/nhwc" : "/nchw");
          internal::dispatch_floating(dt, [&](auto tag) {
            using T = decltype(tag);
            check_all<T>(c, dt, layout, what);
          });
        }
      }
    }
  }
}

TEST(GridSampleEmulated, GradGridLanesMatchTheBodiesOnEveryIsa) {
  // float32 bilinear grad_grid runs in lanes for NCHW planes and for one channel in either layout
  // (grad_grid_points, then lane_grad_grid per channel): on every instruction set, every padding,
  // alignment and coordinate form, through non-finite and far-away points, byte for byte the
  // bodies' grid_sample_grad_grid_element.
  std::vector<CpuIsa> variants{CpuIsa::kBaseline};
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (static_cast<int>(isa) <= static_cast<int>(cpu_isa_supported())) variants.push_back(isa);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  std::vector<GridSampleOptions> options;
  for (GridSampleOptions o : test::all_grid_options()) {
    if (o.interpolation != GridSampleInterpolation::kBilinear) continue;
    options.push_back(o);
    o.coordinates = GridSampleCoordinates::kUnit;
    options.push_back(o);
  }
  for (const GridSampleOptions& o : options) {
    for (const Sizes& z : {Sizes{2, 1, 9, 10, 700, 1}, Sizes{2, 1, 7, 8, 23, 37}, Sizes{1, 3, 7, 8, 23, 37}}) {
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
        Case c;
        c.p = test::make_grid_problem(z.N, z.C, z.H, z.W, z.Ho, z.Wo, o, 530, 1.4);
        const double odd[] = {nan, inf, -inf, 1e30, -1e30, 1e-30, -0.0, 1.0 + 1e-7};
        for (std::size_t i = 3; i < c.p.grid.size(); i += 11) c.p.grid[i] = odd[(i / 11) % 8];
        c.t = test::grid_tensors(c.p, DType::kFloat32, DType::kFloat32, layout);
        c.shape = {z.N, z.C, z.H, z.W, z.Ho, z.Wo, false, static_cast<int>(o.padding), o.align_corners,
                   o.coordinates == GridSampleCoordinates::kUnit};
        Tensor want = Tensor::empty({z.N, z.Ho, z.Wo, 2}, DType::kFloat32);
        want.fill_bytes(0xCD);
        internal::GridSampleCall call = make_call(c);
        call.grad_grid = want.view();
        internal::grid_sample_backward_on<float>(test::EmulatedDevice{}, call, BackwardMode::kAtomic, {});
        for (CpuIsa isa : variants) {
          Tensor got = Tensor::empty({z.N, z.Ho, z.Wo, 2}, DType::kFloat32);
          got.fill_bytes(0xCD);
          Context ctx;
          ctx.num_threads = 2;
          ctx.cpu_isa = isa;
          grid_sample_backward(c.t.grad_output, c.t.input, c.t.grid, {}, got, o, {}, ctx);
          EXPECT_TRUE(test::same_bytes(got, want))
              << to_string(o.padding) << " ac" << o.align_corners << " " << to_string(o.coordinates) << " C" << z.C
              << " " << z.Ho << "x" << z.Wo << (layout == Layout::kNHWC ? " nhwc " : " nchw ") << cpu_isa_name(isa);
        }
      }
    }
  }
}

TEST(GridSampleEmulated, ChunkedBatchMatchesTheCpuBackendBitwise) {
  // 65536 points of 4 records per image: the engine's 2^19-record chunk holds 2 images, so the
  // exact mode runs 3 images as a chunk of 2 and a chunk of 1 (destinations offset by n0).
  const GridSampleOptions o{GridSampleInterpolation::kBilinear, GridSamplePadding::kZeros, false};
  const Sizes z{3, 2, 8, 9, 256, 256};
  static_assert(2 * 256 * 256 * 4 <= (1 << 19) && 3 * 256 * 256 * 4 > (1 << 19), "two chunks");
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
    const Case c = make_case(DType::kFloat32, DType::kFloat32, layout, o, z);
    ASSERT_EQ(internal::grid_sample_chunk_images(c.shape), 2);
    check_backward<float>(c, DType::kFloat32, layout, BackwardMode::kExact,
                          layout == Layout::kNHWC ? "chunked nhwc" : "chunked nchw");
  }
}

}  // namespace
}  // namespace detops
