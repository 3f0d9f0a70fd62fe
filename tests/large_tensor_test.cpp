// Large-tensor safety (label large): RoIAlign forward and exact backward, FrozenBatchNorm2d
// forward and SyncBatchNorm forward (one channel of 2.18e9 elements) on a float16 feature map of more than 2^31 elements (1 x 2 x 33000 x 33000 =
// 2,178,000,000 elements, 4.36 GB per tensor, two tensors at a time: ~8.7 GB at peak), with rois
// at the end of the map so that element offsets, exact-mode position keys and zero-fill sizes all
// pass 2^31. Values follow a pattern of period 4093 (prime, so an offset wrapped at 2^31 or 2^32
// reads a different value), and the results are checked against a direct float64 computation:
// every output element, every gradient position the rois touch, every other gradient element
// (must be exactly zero: a scan of the whole tensor), and every FrozenBatchNorm2d output element.
// Roi coordinates are dyadic so that float32 sample positions are exact (no tolerance for them).
//
// Opt-in: it skips unless DETOPS_LARGE_TESTS=1 (the "large" test preset and scripts/test.sh set
// it), and skips when /proc/meminfo's MemAvailable is below what it needs. DETOPS_LARGE_SIDE=<n>
// shrinks H = W for a quick check of the test itself (then the map is not > 2^31 elements).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "detops/detops.h"
#include "reference/roi_align_reference.h"

namespace detops {
namespace {

constexpr std::int64_t kPeriod = 4093;  // prime: 2^31 and 2^32 are not multiples of it

std::int64_t side() {
  const char* s = std::getenv("DETOPS_LARGE_SIDE");
  return s ? std::atoll(s) : 33000;
}

/// MemAvailable in bytes (0 if unknown).
std::int64_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

/// Skips the test unless opted in and enough memory is available for `tensors` feature maps.
bool skip_unless_possible(int tensors, std::string* why) {
  const char* opt = std::getenv("DETOPS_LARGE_TESTS");
  if (!opt || std::string(opt) != "1") {
    *why = "set DETOPS_LARGE_TESTS=1 to run the large-tensor tests (~9 GB; ctest --preset large)";
    return true;
  }
  const std::int64_t S = side();
  const std::int64_t need = tensors * 2 * S * S * 2 + (std::int64_t{512} << 20);
  const std::int64_t have = mem_available();
  if (have < need) {
    *why = "needs " + std::to_string(need >> 20) + " MiB of MemAvailable, have " + std::to_string(have >> 20) + " MiB";
    return true;
  }
  return false;
}

/// The pattern value of element offset o: k/64 - 2 for k = (37 j) mod 256, j = o mod 4093.
double pattern(std::int64_t o) {
  const std::int64_t j = o % kPeriod;
  return static_cast<double>((j * 37) % 256 - 128) / 64.0;
}

/// Fills `count` float16 elements with the pattern (exact in float16), by copying a block whose
/// length is a multiple of the period.
void fill_pattern(Half* p, std::int64_t count) {
  const std::int64_t block = kPeriod * 256;
  std::vector<Half> b(static_cast<std::size_t>(block));
  for (std::int64_t i = 0; i < block; ++i) b[static_cast<std::size_t>(i)] = Half(static_cast<float>(pattern(i)));
  for (std::int64_t i = 0; i < count; i += block)
    std::memcpy(p + i, b.data(), static_cast<std::size_t>(std::min(block, count - i)) * sizeof(Half));
}

double value_at(const TensorView& v, std::int64_t n, std::int64_t c, std::int64_t y, std::int64_t x) {
  const std::int64_t o = n * v.strides[0] + c * v.strides[1] + y * v.strides[2] + x * v.strides[3];
  return static_cast<float>(static_cast<const Half*>(v.data)[o]);
}

std::int64_t offset_of(const TensorView& v, std::int64_t n, std::int64_t c, std::int64_t y, std::int64_t x) {
  return n * v.strides[0] + c * v.strides[1] + y * v.strides[2] + x * v.strides[3];
}

/// A 4-d view of a dense buffer: sizes and strides.
TensorView view_of(void* data, std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, bool nhwc) {
  TensorView v;
  v.data = data;
  v.dtype = DType::kFloat16;
  v.device = Device::cpu();
  v.rank = 4;
  v.sizes[0] = N, v.sizes[1] = C, v.sizes[2] = H, v.sizes[3] = W;
  contiguous_strides(4, v.sizes, v.strides, nhwc ? Layout::kNHWC : Layout::kNCHW);
  return v;
}

/// RoIAlign forward + exact backward on one view of the map; see the file comment.
void run_roi_align(std::int64_t N, std::int64_t C, bool nhwc) {
  std::string why;
  if (skip_unless_possible(2, &why)) GTEST_SKIP() << why;
  const std::int64_t S = side(), H = S, W = S;
  const std::int64_t total = N * C * H * W;
  if (S == 33000) {
    ASSERT_GT(total, std::int64_t{1} << 31);
  }
  std::printf("feature map [%lld, %lld, %lld, %lld] float16 %s: %lld elements, %.2f GB\n", static_cast<long long>(N),
              static_cast<long long>(C), static_cast<long long>(H), static_cast<long long>(W), nhwc ? "NHWC" : "NCHW",
              static_cast<long long>(total), static_cast<double>(total) * 2e-9);

  Tensor feat = Tensor::empty({total}, DType::kFloat16);
  fill_pattern(feat.data<Half>(), total);
  const TensorView input = view_of(feat.view().data, N, C, H, W, nhwc);

  // Rois (batch, x1, y1, x2, y2), dyadic: 8x8 boxes with 2x2 bins of 2x2 samples at odd
  // quarter-pixel positions; at the end of the last batch (offsets > 2^31), over the map's edge
  // (samples beyond the apron are zero, those within it are clamped), and one at the start.
  const double n_last = static_cast<double>(N - 1), w = static_cast<double>(W), h = static_cast<double>(H);
  const std::vector<double> rois_v = {
      n_last, w - 9.25, h - 9.75, w - 1.25, h - 1.75,  // last 9 rows and columns
      n_last, w - 3.5,  h - 4.25, w + 4.5,  h + 3.75,  // over the bottom-right edge
      n_last, w - 8.75, h - 1.5,  w - 0.75, h + 6.5,   // over the bottom edge
      0,      1.25,     2.75,     9.25,     10.75,     // the start of the map
  };
  const std::int64_t K = 4, PH = 2, PW = 2;
  Tensor rois = Tensor::empty({K, 5}, DType::kFloat32);
  for (std::int64_t i = 0; i < K * 5; ++i) rois.data<float>()[i] = static_cast<float>(rois_v[static_cast<std::size_t>(i)]);
  RoiAlignOptions opt;
  opt.pooled_height = PH;
  opt.pooled_width = PW;
  opt.spatial_scale = 1.0;
  opt.sampling_ratio = 2;
  opt.aligned = false;
  Context ctx;  // all cores

  Tensor out = Tensor::empty({K, C, PH, PW}, DType::kFloat16, Device::cpu(), nhwc ? Layout::kNHWC : Layout::kNCHW);
  roi_align_forward(input, rois, out, opt, ctx);

  // Forward: every output element against float64 (positions and weights are exact in float32).
  for (std::int64_t k = 0; k < K; ++k) {
    const ref::RoiGeometryRef g = ref::roi_geometry_ref(&rois_v[static_cast<std::size_t>(k * 5)], PH, PW, 1.0, 2, false);
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t ph = 0; ph < PH; ++ph)
        for (std::int64_t pw = 0; pw < PW; ++pw) {
          double sum = 0;
          for (std::int64_t iy = 0; iy < g.grid_h; ++iy)
            for (std::int64_t ix = 0; ix < g.grid_w; ++ix) {
              ref::BilinearRef b;
              if (!ref::bilinear_ref(H, W, ref::sample_y_ref(g, ph, iy), ref::sample_x_ref(g, pw, ix), &b)) continue;
              for (int q = 0; q < 4; ++q) sum += b.w[q] * value_at(input, g.batch, c, b.pos[q] / W, b.pos[q] % W);
            }
          const double want = sum / static_cast<double>(g.grid_h * g.grid_w);
          const double got = value_at(out.view(), k, c, ph, pw);
          EXPECT_NEAR(got, want, 1e-3 * std::fabs(want) + 1e-7) << "output[" << k << ", " << c << ", " << ph << ", " << pw << "]";
        }
  }

  // Exact backward into a second map-sized tensor, poisoned first (it must be fully overwritten).
  Tensor grad_out = Tensor::empty({K, C, PH, PW}, DType::kFloat16, Device::cpu(), nhwc ? Layout::kNHWC : Layout::kNCHW);
  auto g_of = [](std::int64_t k, std::int64_t c, std::int64_t ph, std::int64_t pw) {
    return static_cast<double>((k * 7 + c * 3 + ph * 5 + pw) % 17 - 8) / 8.0;
  };
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t ph = 0; ph < PH; ++ph)
        for (std::int64_t pw = 0; pw < PW; ++pw)
          grad_out.data<Half>()[offset_of(grad_out.view(), k, c, ph, pw)] = Half(static_cast<float>(g_of(k, c, ph, pw)));
  feat = Tensor();  // release the input: the backward needs only the rois
  Tensor gin = Tensor::empty({total}, DType::kFloat16);
  std::memset(gin.view().data, 0xCD, static_cast<std::size_t>(total) * 2);
  const TensorView grad_input = view_of(gin.view().data, N, C, H, W, nhwc);
  RoiAlignBackwardOptions bwd;
  bwd.mode = BackwardMode::kExact;
  roi_align_backward(grad_out, rois, grad_input, opt, bwd, ctx);

  std::map<std::int64_t, double> want;  // element offset -> float64 gradient
  for (std::int64_t k = 0; k < K; ++k) {
    const ref::RoiGeometryRef g = ref::roi_geometry_ref(&rois_v[static_cast<std::size_t>(k * 5)], PH, PW, 1.0, 2, false);
    const double count = static_cast<double>(g.grid_h * g.grid_w);
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t ph = 0; ph < PH; ++ph)
        for (std::int64_t pw = 0; pw < PW; ++pw)
          for (std::int64_t iy = 0; iy < g.grid_h; ++iy)
            for (std::int64_t ix = 0; ix < g.grid_w; ++ix) {
              ref::BilinearRef b;
              if (!ref::bilinear_ref(H, W, ref::sample_y_ref(g, ph, iy), ref::sample_x_ref(g, pw, ix), &b)) continue;
              for (int q = 0; q < 4; ++q)
                want[offset_of(grad_input, g.batch, c, b.pos[q] / W, b.pos[q] % W)] += g_of(k, c, ph, pw) * b.w[q] / count;
            }
  }
  std::int64_t expected_nonzero = 0, max_offset = 0;
  for (const auto& [o, v] : want) {
    const double got = static_cast<float>(gin.data<Half>()[o]);
    EXPECT_NEAR(got, v, 1e-3 * std::fabs(v) + 1e-7) << "grad_input at element offset " << o;
    if (v != 0) ++expected_nonzero;
    max_offset = std::max(max_offset, o);
  }
  if (S == 33000) {
    EXPECT_GT(max_offset, std::int64_t{1} << 31) << "the rois should reach past 2^31";
  }
  // Everything else is zero: count the non-zero elements of the whole map (+0 and -0 are zero).
  std::int64_t nonzero = 0;
  const auto* words = static_cast<const std::uint64_t*>(gin.view().data);
  const std::int64_t nwords = total / 4;
  for (std::int64_t i = 0; i < nwords; ++i) {
    const std::uint64_t u = words[i];
    if (u == 0) continue;
    for (int q = 0; q < 4; ++q)
      if (((u >> (16 * q)) & 0x7fffu) != 0) ++nonzero;
  }
  for (std::int64_t i = nwords * 4; i < total; ++i)
    if ((gin.data<Half>()[i].bits & 0x7fffu) != 0) ++nonzero;
  EXPECT_EQ(nonzero, expected_nonzero) << "grad_input elements written outside the rois' footprint (or not zeroed)";
  std::printf("checked %zu gradient positions (largest offset %lld) and %lld zeros\n", want.size(),
              static_cast<long long>(max_offset), static_cast<long long>(total - nonzero));
}

TEST(LargeTensor, RoiAlignExactNCHW) { run_roi_align(1, 2, false); }
TEST(LargeTensor, RoiAlignExactNHWC) { run_roi_align(1, 2, true); }
// Two images of one channel: exact-mode position keys (n*H*W + y*W + x) pass 2^31 too.
TEST(LargeTensor, RoiAlignExactTwoImages) { run_roi_align(2, 1, false); }

/// FrozenBatchNorm2d forward over the whole map: out of place NCHW (the plane path), then in
/// place on the NHWC view of the same bytes with ReLU (the channel-row path). Every element is
/// checked; scale and shift are dyadic, so the float16 results are exact.
TEST(LargeTensor, FrozenBatchNormForward) {
  std::string why;
  if (skip_unless_possible(2, &why)) GTEST_SKIP() << why;
  const std::int64_t S = side(), N = 1, C = 2, H = S, W = S, total = N * C * H * W;
  if (S == 33000) {
    ASSERT_GT(total, std::int64_t{1} << 31);
  }
  Tensor xbuf = Tensor::empty({total}, DType::kFloat16);
  fill_pattern(xbuf.data<Half>(), total);
  Tensor ybuf = Tensor::empty({total}, DType::kFloat16);
  std::memset(ybuf.view().data, 0xCD, static_cast<std::size_t>(total) * 2);
  const float sv[2] = {0.5f, -1.25f}, tv[2] = {0.25f, 1.0f};
  Tensor scale = Tensor::empty({C}, DType::kFloat32), shift = Tensor::empty({C}, DType::kFloat32);
  for (int c = 0; c < 2; ++c) scale.data<float>()[c] = sv[c], shift.data<float>()[c] = tv[c];
  Context ctx;

  // Expected values per (channel, pattern index): y = x * s + t, ReLU optional.
  auto expected = [&](bool relu) {
    std::vector<std::uint16_t> e(static_cast<std::size_t>(2 * kPeriod));
    for (int c = 0; c < 2; ++c)
      for (std::int64_t j = 0; j < kPeriod; ++j) {
        double v = pattern(j) * sv[c] + tv[c];
        if (relu && !(v > 0)) v = 0;
        e[static_cast<std::size_t>(c * kPeriod + j)] = Half(static_cast<float>(v)).bits;
      }
    return e;
  };
  // (a) out of place, NCHW: element o is channel o / (H*W).
  const TensorView x = view_of(xbuf.view().data, N, C, H, W, false), y = view_of(ybuf.view().data, N, C, H, W, false);
  frozen_batch_norm_forward(x, scale, shift, y, FrozenBnEpilogue::kNone, {}, ctx);
  {
    const std::vector<std::uint16_t> e = expected(false);
    const std::uint16_t* p = static_cast<const std::uint16_t*>(y.data);
    std::int64_t bad = 0, first_bad = -1;
    for (std::int64_t o = 0, j = 0; o < total; ++o) {
      const std::int64_t c = o / (H * W);
      if (p[o] != e[static_cast<std::size_t>(c * kPeriod + j)]) {
        if (first_bad < 0) first_bad = o;
        ++bad;
      }
      if (++j == kPeriod) j = 0;
    }
    EXPECT_EQ(bad, 0) << "NCHW out of place: first wrong element at offset " << first_bad;
  }
  ybuf = Tensor();
  // (b) in place, NHWC view of x, ReLU: element o is channel o % 2.
  const TensorView xn = view_of(xbuf.view().data, N, C, H, W, true);
  frozen_batch_norm_forward(xn, scale, shift, xn, FrozenBnEpilogue::kRelu, {}, ctx);
  {
    const std::vector<std::uint16_t> e = expected(true);
    const std::uint16_t* p = static_cast<const std::uint16_t*>(xn.data);
    std::int64_t bad = 0, first_bad = -1;
    for (std::int64_t o = 0, j = 0; o < total; ++o) {
      if (p[o] != e[static_cast<std::size_t>((o & 1) * kPeriod + j)]) {
        if (first_bad < 0) first_bad = o;
        ++bad;
      }
      if (++j == kPeriod) j = 0;
    }
    EXPECT_EQ(bad, 0) << "NHWC in place with ReLU: first wrong element at offset " << first_bad;
  }
}

// SyncBatchNorm forward (one rank) on a single channel of more than 2^31 elements: the count,
// the chunk indices and every offset pass 2^31. Statistics against the pattern's exact moments
// (computed per pattern index in long double), then y in place against the library's own
// statistics for every element.
TEST(LargeTensor, SyncBatchNormForwardOneChannel) {
  std::string why;
  if (skip_unless_possible(1, &why)) GTEST_SKIP() << why;
  const std::int64_t S = side(), H = S, W = 2 * S, total = H * W;  // [1, 1, H, W]
  if (S == 33000) {
    ASSERT_GT(total, std::int64_t{1} << 31);
  }
  // moments of the pattern over [0, total): q full periods and a partial one
  const std::int64_t q = total / kPeriod, rest = total % kPeriod;
  long double s1 = 0;
  for (std::int64_t j = 0; j < kPeriod; ++j)
    s1 += static_cast<long double>(pattern(j)) * static_cast<long double>(q + (j < rest ? 1 : 0));
  const long double mean = s1 / total;
  long double m2 = 0;
  for (std::int64_t j = 0; j < kPeriod; ++j) {
    const long double d = static_cast<long double>(pattern(j)) - mean;
    m2 += d * d * static_cast<long double>(q + (j < rest ? 1 : 0));
  }
  const double eps = 1e-5;
  const double invstd = static_cast<double>(1.0L / std::sqrt(m2 / total + eps));
  Tensor xbuf = Tensor::empty({total}, DType::kFloat16);
  const TensorView x = view_of(xbuf.view().data, 1, 1, H, W, false);
  Context ctx;
  for (SyncBnMode mode : {SyncBnMode::kExact, SyncBnMode::kDefault}) {
    fill_pattern(xbuf.data<Half>(), total);
    Tensor m = Tensor::empty({1}, DType::kFloat64), is = Tensor::empty({1}, DType::kFloat64);
    SyncBnOptions o;
    o.mode = mode;
    o.eps = eps;
    sync_batch_norm_forward(x, SyncBnParams{}, x, m, is, nullptr, o, ctx);  // in place
    const double gm = m.data<double>()[0], gi = is.data<double>()[0];
    const char* name = mode == SyncBnMode::kExact ? "exact" : "default";
    EXPECT_NEAR(gm, static_cast<double>(mean), 1e-12) << name;
    EXPECT_NEAR(gi, invstd, 1e-12 * invstd) << name;
    std::vector<std::uint16_t> e(static_cast<std::size_t>(kPeriod));
    for (std::int64_t j = 0; j < kPeriod; ++j)
      e[static_cast<std::size_t>(j)] = from_double<Half>((pattern(j) - gm) * gi + 0.0).bits;
    const std::uint16_t* p = static_cast<const std::uint16_t*>(x.data);
    std::int64_t bad = 0, first_bad = -1;
    for (std::int64_t o2 = 0, j = 0; o2 < total; ++o2) {
      if (p[o2] != e[static_cast<std::size_t>(j)]) {
        if (first_bad < 0) first_bad = o2;
        ++bad;
      }
      if (++j == kPeriod) j = 0;
    }
    EXPECT_EQ(bad, 0) << name << ": first wrong element at offset " << first_bad;
  }
}

}  // namespace
}  // namespace detops
