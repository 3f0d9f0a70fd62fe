// RoIAlignRotated's own tests on the CPU: mmcv's options (radians, clockwise, legacy alignment)
// against the reference; the properties (a zero angle is RoIAlign with aligned = true, bit for
// bit on dyadic boxes; a 90-degree rotation of map and box gives the same pooled values); the
// instruction-set variants; the exact mode's chunks of images (each image's bits as if alone, a
// workspace bounded by the largest image); quarter turns; unchecked rows and legacy clamping.
// What it shares with RoIAlign (the float64 reference over every dtype x layout x mode,
// bitwise reproducibility, empty problems, caller workspaces, the bad-input matrix) is written
// once for both in tests/roi_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "detops/detail/gather_backward.h"
#include "detops/detail/roi_align_rotated_math.h"
#include "roi_test_harness.h"

namespace detops {
namespace {

using test::make_tensor;
using test::to_vector;
using G = test::RotatedRois;
using Problem = test::Problem<G>;

/// The small problem of tests/roi_test_harness.h (12 rois pooled 3 x 4 from two 13 x 17 maps).
Problem make_problem(std::int64_t sampling_ratio, std::uint64_t seed) {
  return test::make_problem<G>(sampling_ratio, true, PoolMode::kAvg, seed);
}

/// K random rotated rois over an image of img_h x img_w, with the edge cases in the first rows.
std::vector<double> random_rotated_rois(std::int64_t K, std::int64_t N, double img_h, double img_w, std::uint64_t seed,
                                        double max_size) {
  return test::rois_with_edges<G>(K, N, img_h, img_w, seed, 1.0, max_size);
}

bool same_doubles(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// ---------------------------------------------------------------------------------------------
// mmcv's options (mmrotate): radians, clockwise, legacy alignment.

TEST(RoiAlignRotatedOptions, MmcvVariantsMatchTheReference) {
  for (const bool aligned : {true, false})
    for (const bool clockwise : {false, true}) {
      SCOPED_TRACE(std::string(aligned ? "aligned" : "legacy") + (clockwise ? " clockwise" : " ccw"));
      Problem p = make_problem(2, 99);
      p.opt.angle_unit = AngleUnit::kRadians;
      p.opt.aligned = aligned;
      p.opt.clockwise = clockwise;
      for (std::int64_t k = 0; k < p.K; ++k) p.rois[static_cast<std::size_t>(k * 6 + 5)] *= M_PI / 180.0;
      if (!aligned) p.rois[1 * 6 + 3] = -3;  // legacy mode clamps a negative width to 1
      test::check_against_reference(p, DType::kFloat64, Layout::kNCHW, BackwardMode::kExact);
      test::check_against_reference(p, DType::kFloat32, Layout::kNHWC, BackwardMode::kExact);
    }
}

/// Forward output (as doubles) of p with options o.
std::vector<double> forward_values(const Problem& p, const RoiAlignRotatedOptions& o, const std::vector<double>& rois,
                                   DType dt = DType::kFloat32) {
  Tensor input = make_tensor({p.N, p.C, p.H, p.W}, dt, p.input);
  Tensor r = make_tensor({p.K, 6}, DType::kFloat64, rois);
  Tensor out = Tensor::empty({p.K, p.C, o.pooled_height, o.pooled_width}, dt);
  roi_align_rotated_forward(input, r, out, o);
  return to_vector(out);
}

TEST(RoiAlignRotatedOptions, ClockwiseIsTheNegatedAngleBitwise) {
  const Problem p = make_problem(0, 7);
  RoiAlignRotatedOptions cw = p.opt;
  cw.clockwise = true;
  std::vector<double> negated = p.rois;
  for (std::int64_t k = 0; k < p.K; ++k) negated[static_cast<std::size_t>(k * 6 + 5)] *= -1;
  const std::vector<double> a = forward_values(p, cw, p.rois), b = forward_values(p, p.opt, negated);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(double)));
}

TEST(RoiAlignRotatedOptions, RadiansAgreeWithDegrees) {
  const Problem p = make_problem(2, 8);
  RoiAlignRotatedOptions rad = p.opt;
  rad.angle_unit = AngleUnit::kRadians;
  std::vector<double> in_radians = p.rois;
  for (std::int64_t k = 0; k < p.K; ++k) in_radians[static_cast<std::size_t>(k * 6 + 5)] *= M_PI / 180.0;
  EXPECT_LE(test::max_rel_error(forward_values(p, rad, in_radians, DType::kFloat64),
                                forward_values(p, p.opt, p.rois, DType::kFloat64)),
            1e-12);
}

// ---------------------------------------------------------------------------------------------
// Properties

/// RoIAlign (aligned) rows (b, cx - w/2, cy - h/2, cx + w/2, cy + h/2) of rotated rows.
std::vector<double> axis_aligned_rows(const std::vector<double>& rot, std::int64_t K) {
  std::vector<double> r(static_cast<std::size_t>(K * 5));
  for (std::int64_t k = 0; k < K; ++k) {
    const double* s = &rot[static_cast<std::size_t>(k * 6)];
    double* d = &r[static_cast<std::size_t>(k * 5)];
    d[0] = s[0], d[1] = s[1] - s[3] / 2, d[2] = s[2] - s[4] / 2, d[3] = s[1] + s[3] / 2, d[4] = s[2] + s[4] / 2;
  }
  return r;
}

/// Forward and exact backward of both ops on the same boxes (angle 0): the rotated op's values,
/// then RoIAlign's, as doubles.
struct BothOps {
  std::vector<double> rot_out, ra_out, rot_grad, ra_grad;
};
BothOps run_both(const Problem& p, DType dt, Layout layout, BackwardMode mode) {
  const std::int64_t PH = p.opt.pooled_height, PW = p.opt.pooled_width;
  Tensor input = make_tensor({p.N, p.C, p.H, p.W}, dt, p.input, layout);
  Tensor rot_rois = make_tensor({p.K, 6}, DType::kFloat32, p.rois);
  Tensor ra_rois = make_tensor({p.K, 5}, DType::kFloat32, axis_aligned_rows(p.rois, p.K));
  Tensor go = make_tensor({p.K, p.C, PH, PW}, dt, p.grad, layout);
  RoiAlignOptions ra;
  ra.pooled_height = PH;
  ra.pooled_width = PW;
  ra.spatial_scale = p.opt.spatial_scale;
  ra.sampling_ratio = p.opt.sampling_ratio;
  ra.aligned = true;
  RoiAlignBackwardOptions b;
  b.mode = mode;
  BothOps r;
  Tensor out = Tensor::empty({p.K, p.C, PH, PW}, dt, Device::cpu(), layout);
  Tensor gi = Tensor::empty({p.N, p.C, p.H, p.W}, dt, Device::cpu(), layout);
  roi_align_rotated_forward(input, rot_rois, out, p.opt);
  r.rot_out = to_vector(out);
  roi_align_rotated_backward(go, rot_rois, gi, p.opt, b);
  r.rot_grad = to_vector(gi);
  roi_align_forward(input, ra_rois, out, ra);
  r.ra_out = to_vector(out);
  roi_align_backward(go, ra_rois, gi, ra, b);
  r.ra_grad = to_vector(gi);
  return r;
}


TEST(RoiAlignRotatedProperties, ZeroAngleIsRoiAlignBitwiseOnDyadicBoxes) {
  // centres and sizes on a grid of 1/4, spatial scale 1/2, pooled sizes and grids powers of two:
  // every coordinate is exact in either association, so the two ops must agree to the bit
  Problem p = make_problem(2, 11);
  p.opt.pooled_height = 4;
  p.opt.pooled_width = 2;
  std::mt19937_64 rng(12);
  for (std::int64_t k = 0; k < p.K; ++k) {
    double* r = &p.rois[static_cast<std::size_t>(k * 6)];
    r[1] = static_cast<double>(rng() % 160) / 4 - 4, r[2] = static_cast<double>(rng() % 120) / 4 - 4;
    r[3] = static_cast<double>(rng() % 64 + 1) / 4, r[4] = static_cast<double>(rng() % 64 + 1) / 4, r[5] = 0;
  }
  p.grad = test::random_values(static_cast<std::size_t>(p.K * p.C * 8), 13);
  for (std::int64_t sr : {std::int64_t{2}, std::int64_t{0}}) {
    p.opt.sampling_ratio = sr;
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16})
      for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + to_string(mode) + " sr " + std::to_string(sr));
        const BothOps r = run_both(p, dt, Layout::kNCHW, mode);
        EXPECT_TRUE(same_doubles(r.rot_out, r.ra_out));
        EXPECT_TRUE(same_doubles(r.rot_grad, r.ra_grad));
      }
  }
}

TEST(RoiAlignRotatedProperties, ZeroAngleIsRoiAlignWithinAFewUlps) {
  // arbitrary boxes: the sample coordinates associate differently ((-w/2 + p*bin + off) + c
  // against (c - w/2) + p*bin + off), so they differ by a few ulps of the coordinates
  Problem p = make_problem(2, 21);
  p.opt.pooled_height = p.opt.pooled_width = 7;
  for (std::int64_t k = 0; k < p.K; ++k) p.rois[static_cast<std::size_t>(k * 6 + 5)] = 0;
  p.grad = test::random_values(static_cast<std::size_t>(p.K * p.C * 49), 22);
  const BothOps r = run_both(p, DType::kFloat32, Layout::kNCHW, BackwardMode::kExact);
  EXPECT_LE(test::max_error_to_peak(r.rot_out, r.ra_out), 4e-6);
  EXPECT_LE(test::max_error_to_peak(r.rot_grad, r.ra_grad), 4e-6);
  EXPECT_FALSE(same_doubles(r.rot_out, std::vector<double>(r.rot_out.size(), 0.0)));
}

TEST(RoiAlignRotatedProperties, RotatingMapAndBoxBy90DegreesAgrees) {
  // X'[i][j] = X[j][W-1-i] (H' = W, W' = H) maps a map point (y', x') to (y, x) = (x', W-1-y'); a
  // box (cx, cy, w, h, t) on X samples what the box (cy, W - cx, w, h, t + 90) samples on X'
  // (centres in pixel units before the half-pixel offset, spatial_scale 1).
  Problem p = make_problem(0, 31);
  p.opt.spatial_scale = 1.0;
  p.rois = random_rotated_rois(p.K, p.N, p.H, p.W, 32, 10.0);
  std::vector<double> x2(p.input.size());
  for (std::int64_t n = 0; n < p.N * p.C; ++n)
    for (std::int64_t i = 0; i < p.W; ++i)
      for (std::int64_t j = 0; j < p.H; ++j)
        x2[static_cast<std::size_t>((n * p.W + i) * p.H + j)] = p.input[static_cast<std::size_t>((n * p.H + j) * p.W + p.W - 1 - i)];
  std::vector<double> r2 = p.rois;
  for (std::int64_t k = 0; k < p.K; ++k) {
    double* r = &r2[static_cast<std::size_t>(k * 6)];
    const double* s = &p.rois[static_cast<std::size_t>(k * 6)];
    r[1] = s[2], r[2] = static_cast<double>(p.W) - s[1], r[5] = s[5] + 90;
  }
  const std::int64_t PH = p.opt.pooled_height, PW = p.opt.pooled_width;
  Tensor rois_a = make_tensor({p.K, 6}, DType::kFloat64, p.rois), rois_b = make_tensor({p.K, 6}, DType::kFloat64, r2);
  Tensor xa = make_tensor({p.N, p.C, p.H, p.W}, DType::kFloat64, p.input);
  Tensor xb = make_tensor({p.N, p.C, p.W, p.H}, DType::kFloat64, x2);
  Tensor oa = Tensor::empty({p.K, p.C, PH, PW}, DType::kFloat64), ob = Tensor::empty({p.K, p.C, PH, PW}, DType::kFloat64);
  roi_align_rotated_forward(xa, rois_a, oa, p.opt);
  roi_align_rotated_forward(xb, rois_b, ob, p.opt);
  EXPECT_LE(test::max_error_to_peak(to_vector(ob), to_vector(oa)), 1e-12);
  // the gradients rotate with the map
  Tensor go = make_tensor({p.K, p.C, PH, PW}, DType::kFloat64, p.grad);
  Tensor ga = Tensor::empty({p.N, p.C, p.H, p.W}, DType::kFloat64), gb = Tensor::empty({p.N, p.C, p.W, p.H}, DType::kFloat64);
  RoiAlignBackwardOptions b;
  roi_align_rotated_backward(go, rois_a, ga, p.opt, b);
  roi_align_rotated_backward(go, rois_b, gb, p.opt, b);
  const std::vector<double> va = to_vector(ga), vb = to_vector(gb);
  std::vector<double> va_rotated(va.size());
  for (std::int64_t n = 0; n < p.N * p.C; ++n)
    for (std::int64_t i = 0; i < p.W; ++i)
      for (std::int64_t j = 0; j < p.H; ++j)
        va_rotated[static_cast<std::size_t>((n * p.W + i) * p.H + j)] = va[static_cast<std::size_t>((n * p.H + j) * p.W + p.W - 1 - i)];
  EXPECT_LE(test::max_error_to_peak(vb, va_rotated), 1e-12);
  EXPECT_GT(test::max_abs(va), 0.0);
}


// The channels-last forward is compiled once per instruction set (src/cpu/roi_align_rotated_cpu_kernels.inc,
// RoIAlign's add_bin_rows) and walks channels in chunks of 256: every variant gives the
// baseline's bits, and those equal the NCHW walk's, for every dtype, with inf and NaN in the data,
// and 300 channels (a partial chunk, not a multiple of any vector width).
TEST(RoiAlignRotatedCpu, InstructionSetVariantsGiveTheSameBits) {
  std::vector<CpuIsa> variants;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(cpu_isa_supported())) variants.push_back(isa);
    else std::printf("[ note ] this CPU has no %s: that variant is not compared\n", cpu_isa_name(isa));
  }
  Problem p = make_problem(0, 51);
  p.C = 300;
  p.input = test::random_values(static_cast<std::size_t>(p.N * p.C * p.H * p.W), 52);
  p.input[17] = std::numeric_limits<double>::infinity();
  p.input[4000] = std::numeric_limits<double>::quiet_NaN();
  const std::int64_t PH = p.opt.pooled_height, PW = p.opt.pooled_width;
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    auto forward = [&](CpuIsa isa, Layout layout) {
      Tensor input = make_tensor({p.N, p.C, p.H, p.W}, dt, p.input, layout);
      Tensor rois = make_tensor({p.K, 6}, DType::kFloat32, p.rois);
      Tensor out = Tensor::empty({p.K, p.C, PH, PW}, dt, Device::cpu(), layout);
      Context ctx;
      ctx.num_threads = 2;
      ctx.cpu_isa = isa;
      EXPECT_EQ(ctx.resolved_cpu_isa(), isa);
      roi_align_rotated_forward(input, rois, out, p.opt, ctx);
      return to_vector(out);
    };
    const std::vector<double> base = forward(CpuIsa::kBaseline, Layout::kNHWC);
    EXPECT_TRUE(same_doubles(base, forward(CpuIsa::kBaseline, Layout::kNCHW))) << dtype_name(dt) << " nchw";
    for (CpuIsa isa : variants)
      EXPECT_TRUE(same_doubles(base, forward(isa, Layout::kNHWC))) << dtype_name(dt) << " " << cpu_isa_name(isa);
  }
}

// The exact mode runs one chunk of whole images at a time (as many as fit in max(one image's
// records, 2^19)): a batch whose records exceed one chunk gives, image by image, the bytes of each
// image run alone, and its workspace follows its largest image, not the batch.
namespace chunks {

constexpr std::int64_t kPooled = 7, kRatio = 8;
constexpr std::int64_t kRecordsPerRoi = 4 * kPooled * kPooled * kRatio * kRatio;  // 4 corners per sample
constexpr std::int64_t kRoisPerImage[3] = {24, 19, 24};
// A chunk holds max(the largest image's records, 2^19) / the largest image's records images: one
// here, so the batch runs as three chunks (a chunk never splits an image).
static_assert(2 * kRoisPerImage[0] * kRecordsPerRoi > detail::kGatherChunkRecords &&
                  kRoisPerImage[0] >= kRoisPerImage[1] && kRoisPerImage[0] >= kRoisPerImage[2],
              "every image must take its own chunk");
constexpr std::int64_t kC = 3, kH = 40, kW = 40;

/// The rois (batch index n for every image, or 0 when `alone` is n: that image's rois only), with
/// the images' rois interleaved in k order; boxes of 49 < w, h <= 56 take an 8x8 adaptive grid.
std::vector<double> rois_of(std::int64_t alone, std::int64_t images, std::vector<std::int64_t>* rows = nullptr) {
  std::vector<double> r;
  std::mt19937_64 rng(77);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::int64_t k = 0;
  for (std::int64_t i = 0; i < 24; ++i)
    for (std::int64_t n = 0; n < images; ++n, ++k) {
      const double row[6] = {static_cast<double>(n), kW * u(rng), kH * u(rng), 50 + 6 * u(rng), 50 + 6 * u(rng),
                             -180 + 360 * u(rng)};
      if (i >= kRoisPerImage[n % 3] || (alone >= 0 && n != alone)) continue;
      r.insert(r.end(), row, row + 6);
      if (alone >= 0) r[r.size() - 6] = 0;
      if (rows) rows->push_back(k);
    }
  return r;
}

/// grad_output rows: row k of the batch has the values of seed k, whichever call it is in.
std::vector<double> grads_of(const std::vector<std::int64_t>& rows) {
  std::vector<double> g;
  for (std::int64_t k : rows) {
    const std::vector<double> v = test::random_values(kC * kPooled * kPooled, 1000 + static_cast<std::uint64_t>(k));
    g.insert(g.end(), v.begin(), v.end());
  }
  return g;
}

std::size_t exact_workspace(const Tensor& go, const Tensor& rois, const Tensor& gi, const RoiAlignRotatedOptions& o) {
  RoiAlignBackwardOptions b;
  b.mode = BackwardMode::kExact;
  return roi_align_rotated_backward_workspace_size(go, rois, gi, o, b);
}

}  // namespace chunks

TEST(RoiAlignRotatedSemantics, ExactModeChunksByImageWithTheBitsOfEachImageAlone) {
  using namespace chunks;
  for (const auto& [dt, layout] : {std::pair{DType::kFloat32, Layout::kNCHW}, std::pair{DType::kFloat64, Layout::kNHWC},
                                   std::pair{DType::kBFloat16, Layout::kNCHW}})
    for (const std::int64_t sr : {kRatio, std::int64_t{0}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (sr > 0 ? " fixed ratio" : " adaptive"));
      RoiAlignRotatedOptions o;
      o.pooled_height = o.pooled_width = kPooled;
      o.sampling_ratio = sr;
      RoiAlignBackwardOptions b;
      b.mode = BackwardMode::kExact;
      std::vector<std::int64_t> rows;
      const std::vector<double> r = rois_of(-1, 3, &rows);
      const auto K = static_cast<std::int64_t>(rows.size());
      Tensor rois = make_tensor({K, 6}, DType::kFloat32, r);
      Tensor go = make_tensor({K, kC, kPooled, kPooled}, dt, grads_of(rows), layout);
      Tensor gi = Tensor::empty({3, kC, kH, kW}, dt, Device::cpu(), layout);
      gi.fill_bytes(0xCD);
      Context ctx;
      ctx.num_threads = 2;
      roi_align_rotated_backward(go, rois, gi, o, b, ctx);
      const std::size_t batch_ws = exact_workspace(go, rois, gi, o);

      std::size_t largest_alone_ws = 0;
      const std::size_t image_bytes = gi.nbytes() / 3;  // both layouts keep an image's bytes together
      for (std::int64_t n = 0; n < 3; ++n) {
        std::vector<std::int64_t> rows_n;
        const std::vector<double> r_n = rois_of(n, 3, &rows_n);
        const auto K_n = static_cast<std::int64_t>(rows_n.size());
        ASSERT_EQ(K_n, kRoisPerImage[n]);
        Tensor rois_n = make_tensor({K_n, 6}, DType::kFloat32, r_n);
        Tensor go_n = make_tensor({K_n, kC, kPooled, kPooled}, dt, grads_of(rows_n), layout);
        Tensor gi_n = Tensor::empty({1, kC, kH, kW}, dt, Device::cpu(), layout);
        roi_align_rotated_backward(go_n, rois_n, gi_n, o, b, ctx);
        const auto* batch_bytes = static_cast<const unsigned char*>(gi.view().data) + n * image_bytes;
        EXPECT_EQ(std::memcmp(batch_bytes, gi_n.view().data, image_bytes), 0) << "image " << n;
        largest_alone_ws = std::max(largest_alone_ws, exact_workspace(go_n, rois_n, gi_n, o));
      }
      // One image's records at a time: all three at once would need about 2.8 times the largest
      // image's arrays (67 rois against 24), and the extra per-roi offsets are 8 bytes a roi.
      EXPECT_LT(batch_ws, 2 * largest_alone_ws);
      EXPECT_LE(batch_ws, largest_alone_ws + 8 * static_cast<std::size_t>(K) + 1024);

      // Twice the batch: the same chunks, so the same workspace but for the per-roi offsets.
      std::vector<std::int64_t> rows6;
      const std::vector<double> r6 = rois_of(-1, 6, &rows6);
      const auto K6 = static_cast<std::int64_t>(rows6.size());
      Tensor rois6 = make_tensor({K6, 6}, DType::kFloat32, r6);
      Tensor go6 = Tensor::empty({K6, kC, kPooled, kPooled}, dt, Device::cpu(), layout);
      Tensor gi6 = Tensor::empty({6, kC, kH, kW}, dt, Device::cpu(), layout);
      EXPECT_LE(exact_workspace(go6, rois6, gi6, o), batch_ws + 8 * static_cast<std::size_t>(K6 - K) + 1024);
    }
}

TEST(RoiAlignRotatedSemantics, UncheckedInvalidRowsPoolToZero) {
  Tensor input = make_tensor({1, 1, 4, 4}, DType::kFloat32, std::vector<double>(16, 1.0));
  Tensor rois = make_tensor({2, 6}, DType::kFloat32, {0, 2, 2, 2, 2, 30, 5, 2, 2, 2, 2, 30});  // row 1: batch 5
  Tensor out = Tensor::empty({2, 1, 2, 2}, DType::kFloat32);
  RoiAlignRotatedOptions o;
  o.pooled_height = o.pooled_width = 2;
  o.check_rois = false;
  roi_align_rotated_forward(input, rois, out, o);
  const std::vector<double> v = to_vector(out);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(v[static_cast<std::size_t>(i)], 1.0f);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(v[static_cast<std::size_t>(i)], 0.0);
}

TEST(RoiAlignRotatedSemantics, QuarterTurnsAreExact) {
  // multiples of 90 degrees give exactly 0 and +-1 (reduced in degrees, not through pi) ...
  for (const double turns : {0.0, 1.0, 2.0, 3.0, -1.0, 5.0, 40.0, -41.0}) {
    const detail::SinCos t = detail::rotation_sincos(90.0 * turns, false, false);
    const int q = ((static_cast<int>(turns) % 4) + 4) % 4;
    const double want_sin[4] = {0, 1, 0, -1}, want_cos[4] = {1, 0, -1, 0};
    EXPECT_EQ(t.sin, want_sin[q]) << turns;
    EXPECT_EQ(t.cos, want_cos[q]) << turns;
  }
  // ... so a square box with one sample per bin turned by a quarter samples the same points as
  // the unturned box, its bins permuted: out90[ph][pw] = out0[1 - pw][ph], bit for bit
  Tensor input = make_tensor({1, 1, 6, 7}, DType::kFloat32, test::random_values(42, 17));
  Tensor rois = make_tensor({3, 6}, DType::kFloat32, {0, 3.25, 2.75, 3, 3, 0, 0, 3.25, 2.75, 3, 3, 90,
                                                     0, 3.25, 2.75, 3, 3, -270});
  RoiAlignRotatedOptions o;
  o.pooled_height = o.pooled_width = 2;
  o.sampling_ratio = 1;
  Tensor out = Tensor::empty({3, 1, 2, 2}, DType::kFloat32);
  roi_align_rotated_forward(input, rois, out, o);
  const std::vector<double> v = to_vector(out);
  for (int k = 1; k < 3; ++k)
    for (int ph = 0; ph < 2; ++ph)
      for (int pw = 0; pw < 2; ++pw)
        EXPECT_EQ(v[static_cast<std::size_t>(k * 4 + ph * 2 + pw)], v[static_cast<std::size_t>((1 - pw) * 2 + ph)])
            << k << " " << ph << " " << pw;
}


TEST(RoiAlignRotatedBadInputViews, LegacyAlignmentClampsNegativeSizes) {
  // mmcv's aligned = false clamps sizes to 1 instead of rejecting them
  Tensor input = make_tensor({1, 1, 6, 6}, DType::kFloat32, test::random_values(36, 9));
  Tensor neg = make_tensor({1, 6}, DType::kFloat32, {0, 3, 3, -4, -2, 20});
  Tensor one = make_tensor({1, 6}, DType::kFloat32, {0, 3, 3, 1, 1, 20});
  RoiAlignRotatedOptions o;
  o.aligned = false;
  o.pooled_height = o.pooled_width = 2;
  Tensor a = Tensor::empty({1, 1, 2, 2}, DType::kFloat32), b = Tensor::empty({1, 1, 2, 2}, DType::kFloat32);
  roi_align_rotated_forward(input, neg, a, o);
  roi_align_rotated_forward(input, one, b, o);
  EXPECT_TRUE(test::same_bytes(a, b));
  o.aligned = true;
  EXPECT_THROW(roi_align_rotated_forward(input, neg, a, o), Error);
}

TEST(RoiAlignRotatedBadInputViews, GradInputOverlappingGradOutputIsRejected) {
  Tensor gi = Tensor::zeros({1, 1, 8, 8}, DType::kFloat32);
  Tensor rois = make_tensor({1, 6}, DType::kFloat32, {0, 3, 3, 2, 2, 0});
  TensorView go = gi.view();  // the first 4 elements of grad_input as a [1, 1, 2, 2] grad_output
  go.rank = 4;
  go.sizes[0] = go.sizes[1] = 1, go.sizes[2] = go.sizes[3] = 2;
  go.strides[0] = go.strides[1] = 4, go.strides[2] = 2, go.strides[3] = 1;
  RoiAlignRotatedOptions o;
  o.pooled_height = o.pooled_width = 2;
  try {
    roi_align_rotated_backward(go, rois, gi, o, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grad_input"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace detops
