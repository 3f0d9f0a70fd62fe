// FrozenBatchNorm2d's CUDA backend run on the CPU: its own steps (internal/frozen_batch_norm_device.h,
// the code cuda/frozen_batch_norm_cuda.cu runs on CudaDevice: the dense 16-byte vector bodies where
// frozen_bn_vec_plan takes them, the generic element bodies otherwise) on the emulated device over
// several grids (every block and thread index of a grid-stride launch, in order), against the CPU
// backend, byte for byte over whole poisoned storages (so gaps a kernel must not touch are compared
// too). The CPU backend walks planes and channel rows with its own loops (and F16C staging for
// float16), so agreement checks the kernels' lane-to-channel indexing and the claim that both
// backends do the same arithmetic. The generic bodies also run on the dense layouts. No GPU needed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "detops/detail/frozen_batch_norm_math.h"
#include "detops/frozen_batch_norm.h"
#include "emulated_device.h"
#include "internal/frozen_batch_norm_backend.h"
#include "internal/frozen_batch_norm_device.h"
#include "frozen_batch_norm_test_util.h"
#include "test_util.h"

namespace detops {

namespace {

using namespace test::frozen_bn;
using internal::FrozenBnCall;

// ---------------------------------------------------------------------------------------------
// The emulated launch

/// A 1-d launch: threads per block and blocks.
struct Grid {
  std::int64_t block, blocks;
};

/// The launcher's grid for n items (cuda/cuda_check.cuh's kBlock and grid_for, which a CPU build
/// cannot include: it needs the CUDA runtime).
Grid launcher_grid(std::int64_t n) {
  constexpr std::int64_t kBlock = 256;
  return {kBlock, std::min<std::int64_t>(std::max<std::int64_t>((n + kBlock - 1) / kBlock, 1), 1 << 20)};
}

/// The grids each case runs on: the launcher's; three warp-sized blocks, so that threads loop
/// and the last pass covers part of the grid; two blocks of 7 threads (partial warps).
std::vector<Grid> grids_for(std::int64_t n) { return {launcher_grid(n), {32, 3}, {7, 2}}; }

/// The emulated device running its launches on grid g.
test::EmulatedDevice device_on(Grid g) {
  test::EmulatedDevice dev;
  dev.block = g.block;
  dev.blocks = g.blocks;
  return dev;
}

// ---------------------------------------------------------------------------------------------
// Tensors in poisoned storages

/// A 4-d view into a 1-d storage poisoned with 0xCD (make_buf picks the layout's strides).
using Buf = test::StridedBuf;

/// Whole storages equal byte for byte; says how many bytes differ if not.
::testing::AssertionResult same_storage(const Buf& want, const Buf& got) {
  if (want.storage.nbytes() != got.storage.nbytes()) return ::testing::AssertionFailure() << "storage sizes differ";
  const auto* a = static_cast<const unsigned char*>(want.storage.view().data);
  const auto* b = static_cast<const unsigned char*>(got.storage.view().data);
  std::int64_t differ = 0, first = -1;
  for (std::size_t i = 0; i < want.storage.nbytes(); ++i)
    if (a[i] != b[i]) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++differ;
    }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ << " of " << want.storage.nbytes() << " bytes differ, the first at byte "
                                       << first;
}

/// Random values with specials mixed in: NaN, +-inf, -0 and exact zeros (the ReLU's edge).
std::vector<double> values(std::size_t n, std::uint64_t seed, double lo, double hi) {
  std::vector<double> v = test::random_values(n, seed, lo, hi);
  for (std::size_t i = 3; i < v.size(); i += 41) v[i] = std::numeric_limits<double>::quiet_NaN();
  for (std::size_t i = 5; i < v.size(); i += 43) v[i] = std::numeric_limits<double>::infinity();
  for (std::size_t i = 7; i < v.size(); i += 47) v[i] = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 11; i < v.size(); i += 29) v[i] = -0.0;
  for (std::size_t i = 13; i < v.size(); i += 31) v[i] = 0.0;
  return v;
}

Tensor param(const std::vector<double>& v, DType dt) {
  return test::make_tensor({static_cast<std::int64_t>(v.size())}, dt, v);
}

// ---------------------------------------------------------------------------------------------
// The kernels, emulated

/// The CUDA backend's own steps (internal/frozen_batch_norm_device.h) over grid g: the vector
/// bodies where frozen_bn_vec_plan takes them, the generic ones otherwise.
void emulate_cuda(const FrozenBnCall& call, Grid g) { internal::frozen_bn_run_on(device_on(g), call); }

/// The generic bodies (any strides) over grid g, also where the launcher takes the vector ones.
template <class T>
void emulate_generic(const FrozenBnCall& call, Grid g) {
  const TensorView& r = call.input;
  const std::int64_t n = r.sizes[0] * r.sizes[1] * r.sizes[2] * r.sizes[3];
  internal::dispatch_epilogue(call, [&](auto add, auto relu) {
    const detail::FrozenBnArgs<T> p = internal::make_frozen_bn_args<T>(call, add(), relu());
    if (!call.backward) device_on(g).launch("generic", n, internal::frozen_bn_device::ForwardBody<T>{p});
    else device_on(g).launch("generic", n, internal::frozen_bn_device::BackwardBody<T>{p});
  });
}

/// Whether the launcher must take the vector bodies, decided here from the layout alone: dense
/// views at the start of a (64-byte aligned) storage whose lanes fit. With C = 1 or H*W = 1 the
/// two dense layouts have the same strides, and frozen_bn_dense_layout calls them NCHW.
bool expect_vector(Lay lay, const Shape& s, int V) {
  if (lay != Lay::kNchw && lay != Lay::kNhwc) return false;
  const bool nchw = lay == Lay::kNchw || s.C == 1 || s.H * s.W == 1;
  return nchw ? (s.H * s.W) % V == 0 : s.C % V == 0;
}

// H*W and C multiples of each vector width (2, 4, 8) or not, C = 1, H*W = 1, a vector count
// that fills its last block exactly (2 x 8 x 16 x 16) and ones that leave it partial.
constexpr Shape kShapes[] = {{2, 19, 5, 7}, {2, 16, 4, 8}, {1, 64, 7, 7},  {3, 3, 1, 1},
                             {1, 1, 6, 11}, {2, 24, 3, 5}, {2, 40, 9, 12}, {2, 8, 16, 16}};

using Param = std::tuple<DType, Lay, Epi>;
class FrozenBnEmulatedGrid : public ::testing::TestWithParam<Param> {};

template <class T>
void check_all(DType dt, Lay lay, Epi epi) {
  const DType pdt = dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  constexpr int V = internal::frozen_bn_vector_width<T>();
  const bool add = epi == Epi::kAddRelu, relu = epi != Epi::kNone;
  Context ctx;
  ctx.num_threads = 2;
  std::uint64_t seed = 900;
  int vector_cases = 0;
  for (const Shape& s : kShapes) {
    seed += 10;
    SCOPED_TRACE(::testing::Message() << "shape [" << s.N << ", " << s.C << ", " << s.H << ", " << s.W << "]");
    const std::size_t n = static_cast<std::size_t>(s.N * s.C * s.H * s.W);
    std::vector<double> sc = test::random_values(static_cast<std::size_t>(s.C), seed, -2, 2);
    std::vector<double> sh = test::random_values(static_cast<std::size_t>(s.C), seed + 1, -1, 1);
    sc[0] = 0.0, sh[0] = 0.0;  // channel 0: inf * 0 = NaN, and exact zeros into the ReLU
    const Tensor scale = param(sc, pdt), shift = param(sh, pdt);
    Buf x = make_buf(s, dt, lay), r = make_buf(s, dt, lay), gy = make_buf(s, dt, lay);
    test::fill_from(x.view, values(n, seed + 2, -3, 3));
    test::fill_from(r.view, values(n, seed + 3, -2, 2));
    test::fill_from(gy.view, values(n, seed + 4, -1, 1));
    const TensorView res = add ? r.view : TensorView{};
    const bool vec = expect_vector(lay, s, V);

    // Forward: the CPU backend, then each body on each grid into fresh poisoned storages.
    const Buf poison = make_buf(s, dt, lay);
    Buf y = poison.clone();
    frozen_batch_norm_forward(x.view, scale, shift, y.view, epi, res, ctx);
    for (const Grid& g : grids_for(static_cast<std::int64_t>(n))) {
      SCOPED_TRACE(::testing::Message() << "grid " << g.blocks << " x " << g.block);
      Buf yv = poison.clone(), yg = poison.clone();
      const auto cv = FrozenBnCall::for_forward("emulated", x.view, scale, shift, yv.view, epi, res);
      EXPECT_EQ(internal::frozen_bn_vec_plan<T>(cv).use, vec) << "the launcher's choice of the vector bodies";
      emulate_cuda(cv, g);
      EXPECT_TRUE(same_storage(y, yv)) << (vec ? "the CUDA steps (vector bodies)" : "the CUDA steps (generic bodies)");
      vector_cases += vec;
      if (vec) {
        emulate_generic<T>(FrozenBnCall::for_forward("emulated", x.view, scale, shift, yg.view, epi, res), g);
        EXPECT_TRUE(same_storage(y, yg)) << "generic bodies on a dense layout";
      }
    }

    // Backward from the CPU forward's y; with add_relu, with and without grad_residual.
    for (bool with_gr : add ? std::vector<bool>{true, false} : std::vector<bool>{false}) {
      SCOPED_TRACE(with_gr ? "with grad_residual" : "without grad_residual");
      const TensorView yv = relu ? y.view : TensorView{};
      Buf gx = poison.clone(), gr = poison.clone();
      frozen_batch_norm_backward(gy.view, scale, gx.view, epi, yv, with_gr ? gr.view : TensorView{}, ctx);
      for (const Grid& g : grids_for(static_cast<std::int64_t>(n))) {
        SCOPED_TRACE(::testing::Message() << "grid " << g.blocks << " x " << g.block);
        for (bool vector_body : {true, false}) {
          if (vector_body && !vec) continue;
          Buf gx2 = poison.clone(), gr2 = poison.clone();
          const auto call = FrozenBnCall::for_backward("emulated", gy.view, scale, gx2.view, epi, yv,
                                                       with_gr ? gr2.view : TensorView{});
          EXPECT_EQ(internal::frozen_bn_vec_plan<T>(call).use, vec) << "the launcher's choice of the vector bodies";
          if (vector_body) {
            emulate_cuda(call, g);
            ++vector_cases;
          } else if (vec) {
            emulate_generic<T>(call, g);
          } else {
            emulate_cuda(call, g);
          }
          const char* body = vector_body ? "the CUDA steps (vector bodies)"
                                         : vec ? "generic bodies on a dense layout" : "the CUDA steps (generic bodies)";
          EXPECT_TRUE(same_storage(gx, gx2)) << body << ": grad_x";
          EXPECT_TRUE(same_storage(gr, gr2)) << body << ": grad_residual";
        }
      }
    }
  }
  // The dense layouts must have reached the vector bodies on some shapes (2 x 16 x 4 x 8 fits
  // every width in both), the others never.
  if (lay == Lay::kNchw || lay == Lay::kNhwc) EXPECT_GT(vector_cases, 0);
  else EXPECT_EQ(vector_cases, 0);
}

TEST_P(FrozenBnEmulatedGrid, KernelBodiesMatchCpuBackendBitwise) {
  const auto [dt, lay, epi] = GetParam();
  switch (dt) {
    case DType::kFloat32: check_all<float>(dt, lay, epi); break;
    case DType::kFloat64: check_all<double>(dt, lay, epi); break;
    case DType::kFloat16: check_all<Half>(dt, lay, epi); break;
    default: check_all<BFloat16>(dt, lay, epi); break;
  }
}

std::string case_name(const ::testing::TestParamInfo<Param>& i) {
  const auto [dt, lay, epi] = i.param;
  return std::string(dtype_name(dt)) + "_" + lay_name(lay) + "_" + epi_name(epi);
}

INSTANTIATE_TEST_SUITE_P(
    All, FrozenBnEmulatedGrid,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(Lay::kNchw, Lay::kNhwc, Lay::kNchwOffset1, Lay::kNhwcOffset1, Lay::kSlice,
                                         Lay::kChannelSlice),
                       ::testing::Values(Epi::kNone, Epi::kRelu, Epi::kAddRelu)),
    case_name);

}  // namespace
}  // namespace detops
