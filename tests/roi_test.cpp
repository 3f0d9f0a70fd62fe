// What RoIAlign and RoIAlignRotated promise alike on the CPU, written once over a geometry
// (tests/roi_test_harness.h) and run for both ops: every dtype x layout x backward mode x
// alignment x sampling (x pool mode) against the float64 reference; bitwise reproducibility of
// every mode (runs, thread counts, layouts, views with gaps); empty problems; caller workspaces
// (any alignment, one byte short, overlapping a tensor); and the bad-input matrix with outputs
// left byte for byte as they were. Each op's own tests: tests/roi_align{,_rotated}_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "roi_test_harness.h"

namespace detops {
namespace {

using namespace test;  // NOLINT: the harness and the helpers it builds on

constexpr BackwardMode kModes[] = {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact};

// ---------------------------------------------------------------------------------------------
// Against the float64 reference

class RoiReference : public ::testing::TestWithParam<RoiParam> {};

TEST_P(RoiReference, MatchesFloat64Reference) {
  const RoiParam& c = GetParam();
  with_geometry(c.op, [&](auto g) {
    using G = decltype(g);
    const std::uint64_t seed = 1234 + static_cast<std::uint64_t>(c.sr) * 7 + (c.aligned ? 1 : 0);
    check_against_reference(make_problem<G>(c.sr, c.aligned, c.pool, seed), c.dt, c.layout, c.mode);
  });
}

const RoiGrid kReferenceGrid{kRoiDtypes, kRoiLayouts, kRoiModes, kRoiPools, {true, false}, {0, 2}};
DETOPS_ROI_INSTANTIATE(RoiReference, kReferenceGrid);

// ---------------------------------------------------------------------------------------------
// Bitwise reproducibility: runs, thread counts, layouts

class RoiReproducible : public ::testing::TestWithParam<RoiParam> {};

TEST_P(RoiReproducible, TwentyRunsSameBytes) {
  const RoiParam& c = GetParam();
  with_geometry(c.op, [&](auto g) {
    using G = decltype(g);
    const Workload<G> w = detection_workload<G>(c.dt, Layout::kNCHW, c.pool, c.sr);
    for (BackwardMode mode : {BackwardMode::kTruncated, BackwardMode::kExact}) {
      const Tensor first = run_backward(w, mode, 2, Layout::kNCHW, c.dt);
      for (int run = 1; run < 20; ++run)
        ASSERT_TRUE(same_bytes(first, run_backward(w, mode, 2, Layout::kNCHW, c.dt)))
            << to_string(mode) << " run " << run;
    }
  });
}

TEST_P(RoiReproducible, ExactSameBytesForAnyThreadCountAndLayout) {
  const RoiParam& c = GetParam();
  with_geometry(c.op, [&](auto g) {
    using G = decltype(g);
    const Workload<G> w = detection_workload<G>(c.dt, Layout::kNCHW, c.pool, c.sr);
    const Tensor one = run_backward(w, BackwardMode::kExact, 1, Layout::kNCHW, c.dt);
    for (int threads : {2, 3, 8})
      EXPECT_TRUE(same_bytes(one, run_backward(w, BackwardMode::kExact, threads, Layout::kNCHW, c.dt)))
          << threads << " threads";
    // NHWC output of the same problem holds the same values, bit for bit.
    const Tensor nhwc = run_backward(w, BackwardMode::kExact, 2, Layout::kNHWC, c.dt);
    EXPECT_TRUE(same_bytes(one, nhwc.contiguous(Layout::kNCHW)));
    // ... and so does an NHWC grad_output (the gather reads it channel-contiguous).
    const Workload<G> w2 = detection_workload<G>(c.dt, Layout::kNHWC, c.pool, c.sr);
    EXPECT_TRUE(same_bytes(one, run_backward(w2, BackwardMode::kExact, 2, Layout::kNCHW, c.dt)));
  });
}

// The scatter modes on the CPU add into each element in one order (rois, bins, samples, corners)
// whatever the walk: thread counts, NHWC grad_input (the truncated mode's double buffer then is
// NHWC too), NHWC grad_output and a channels-last grad_input with padded channels all give the
// bits of the one-thread NCHW run.
TEST_P(RoiReproducible, ScatterModesSameBytesForAnyThreadCountAndLayout) {
  const RoiParam& c = GetParam();
  with_geometry(c.op, [&](auto g) {
    using G = decltype(g);
    const DType dt = c.dt;
    const Workload<G> w = detection_workload<G>(dt, Layout::kNCHW, c.pool, c.sr);
    const Workload<G> w_nhwc = detection_workload<G>(dt, Layout::kNHWC, c.pool, c.sr);
    const std::int64_t N = w.N(), C = w.C(), H = w.H(), W = w.W();
    constexpr std::int64_t kPad = 2;
    for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated}) {
      const Tensor one = run_backward(w, mode, 1, Layout::kNCHW, dt);
      for (int threads : {2, 3}) {
        EXPECT_TRUE(same_bytes(one, run_backward(w, mode, threads, Layout::kNCHW, dt)))
            << to_string(mode) << " " << threads << " threads";
        EXPECT_TRUE(same_bytes(one, run_backward(w, mode, threads, Layout::kNHWC, dt).contiguous(Layout::kNCHW)))
            << to_string(mode) << " NHWC, " << threads << " threads";
        EXPECT_TRUE(same_bytes(one, run_backward(w_nhwc, mode, threads, Layout::kNHWC, dt).contiguous(Layout::kNCHW)))
            << to_string(mode) << " NHWC grad_output, " << threads << " threads";
      }
      EXPECT_TRUE(same_bytes(one, run_backward(w, mode, 1, Layout::kNHWC, dt).contiguous(Layout::kNCHW)))
          << to_string(mode) << " NHWC, 1 thread";
      // channels-last with C + kPad channels per position; the padding stays untouched
      Tensor buf = Tensor::empty({N, H, W, C + kPad}, dt);
      buf.fill_bytes(0xCD);
      const TensorView gi(buf.view().data, dt, Device::cpu(), {N, C, H, W},
                          {H * W * (C + kPad), 1, W * (C + kPad), C + kPad});
      Context ctx;
      ctx.num_threads = 2;
      RoiAlignBackwardOptions b;
      b.mode = mode;
      G::backward(w.grad_output, w.rois, gi, w.opt, b, ctx, w.argmax);
      Tensor dense = Tensor::empty({N, C, H, W}, dt);
      fill_from(dense.view(), to_vector(gi));
      EXPECT_TRUE(same_bytes(one, dense)) << to_string(mode) << " padded channels-last";
      const auto* bytes = static_cast<const unsigned char*>(buf.view().data);
      const std::int64_t es = static_cast<std::int64_t>(dtype_size(dt));
      bool untouched = true;
      for (std::int64_t pos = 0; pos < N * H * W; ++pos)
        for (std::int64_t i = C * es; i < (C + kPad) * es; ++i)
          untouched = untouched && bytes[pos * (C + kPad) * es + i] == 0xCD;
      EXPECT_TRUE(untouched) << to_string(mode) << " padding written";
    }
  });
}

// The forward (and max pooling's argmax) in either layout with any thread count.
TEST_P(RoiReproducible, ForwardSameBytesForAnyThreadCountAndLayout) {
  const RoiParam& c = GetParam();
  with_geometry(c.op, [&](auto g) {
    using G = decltype(g);
    const Workload<G> w = detection_workload<G>(c.dt, Layout::kNCHW, c.pool, c.sr);
    const std::int64_t PH = w.opt.pooled_height, PW = w.opt.pooled_width;
    auto run = [&](int threads, Layout layout, Tensor* argmax) {
      Tensor out = Tensor::empty({w.K(), w.C(), PH, PW}, c.dt, Device::cpu(), layout);
      Tensor am = Tensor::empty({w.K(), w.C(), PH, PW}, DType::kInt32, Device::cpu(), layout);
      Context ctx;
      ctx.num_threads = threads;
      G::forward(w.input, w.rois, out, w.opt, ctx, G::max_pool(w.opt) ? am.view() : TensorView{});
      *argmax = am.contiguous(Layout::kNCHW);
      return out.contiguous(Layout::kNCHW);
    };
    Tensor am0, am;
    const Tensor a = run(1, Layout::kNCHW, &am0);
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
      for (int threads : {layout == Layout::kNCHW ? 4 : 1, 3, 8}) {
        EXPECT_TRUE(same_bytes(a, run(threads, layout, &am)))
            << threads << " threads" << (layout == Layout::kNHWC ? ", nhwc" : "");
        if (G::max_pool(w.opt)) {
          EXPECT_TRUE(same_bytes(am0, am)) << "argmax";
        }
      }
  });
}

// RoIAlign's workload is at detection scale: its grid leaves bfloat16 out; RoIAlignRotated's
// (every sample rotated) runs adaptive sampling only.
const RoiGrid kAxisAlignedRuns{{DType::kFloat32, DType::kFloat16, DType::kFloat64}, {}, {}, kRoiPools, {}, {0, 2}};
const RoiGrid kRotatedRuns{kRoiDtypes, {}, {}, {}, {}, {0}};
INSTANTIATE_TEST_SUITE_P(RoiAlign, RoiReproducible, ::testing::ValuesIn(roi_cases<AxisAlignedRois>(kAxisAlignedRuns)),
                         roi_param_name);
INSTANTIATE_TEST_SUITE_P(RoiAlignRotated, RoiReproducible, ::testing::ValuesIn(roi_cases<RotatedRois>(kRotatedRuns)),
                         roi_param_name);

// ---------------------------------------------------------------------------------------------
// Semantics: empty problems, caller workspaces, views with gaps, huge thread counts

template <class G>
class RoiCpu : public ::testing::Test {};
TYPED_TEST_SUITE(RoiCpu, RoiGeometries, RoiNames);

TYPED_TEST(RoiCpu, EmptyRoisAndZeroChannels) {
  using G = TypeParam;
  Tensor input = make_tensor({1, 3, 4, 4}, DType::kFloat32, random_values(48, 1));
  Tensor rois = Tensor::empty({0, G::kColumns}, DType::kFloat32);
  Tensor out = Tensor::empty({0, 3, 7, 7}, DType::kFloat32);
  typename G::Options o;
  EXPECT_NO_THROW(G::forward(input, rois, out, o));
  for (BackwardMode m : kModes) {
    Tensor gi = Tensor::empty({1, 3, 4, 4}, DType::kFloat32);
    gi.fill_bytes(0xCD);
    RoiAlignBackwardOptions b;
    b.mode = m;
    G::backward(out, rois, gi, o, b);
    for (double x : to_vector(gi)) EXPECT_EQ(x, 0.0) << to_string(m);
  }
  // rois but no channels: nothing to pool, nothing to write
  Tensor none = Tensor::empty({1, 0, 4, 4}, DType::kFloat32);
  Tensor one_roi = small_rois<G>(1);
  Tensor pooled = Tensor::empty({1, 0, 7, 7}, DType::kFloat32);
  EXPECT_NO_THROW(G::forward(none, one_roi, pooled, o));
  for (BackwardMode m : kModes) {
    RoiAlignBackwardOptions b;
    b.mode = m;
    EXPECT_NO_THROW(G::backward(pooled, one_roi, none, o, b)) << to_string(m);
  }
}

/// The exact backward (the default mode) of the float32 workload, and its workspace's size.
template <class G>
struct ExactWorkspace {
  const Workload<G> w = detection_workload<G>(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 0);
  const RoiAlignBackwardOptions b{};
  Tensor gi = Tensor::empty({w.N(), w.C(), w.H(), w.W()}, DType::kFloat32);
  const std::size_t bytes = G::workspace_size(w.grad_output, w.rois, gi, w.opt, b);
  /// The backward with the allocator's workspace (2 threads): what a caller's must give.
  Tensor allocated() const { return run_backward(w, BackwardMode::kExact, 2, Layout::kNCHW, DType::kFloat32); }
};

TYPED_TEST(RoiCpu, CallerWorkspaceMatchesAllocatedOne) {
  using G = TypeParam;
  ExactWorkspace<G> e;
  const Workload<G>& w = e.w;
  const std::size_t bytes = e.bytes;
  ASSERT_GT(bytes, 0u);
  std::vector<unsigned char> buf(bytes);
  G::backward(w.grad_output, w.rois, e.gi, w.opt, e.b, {}, {}, Workspace{buf.data(), buf.size()});
  EXPECT_TRUE(same_bytes(e.gi, e.allocated()));
  Tensor gi2 = Tensor::empty({w.N(), w.C(), w.H(), w.W()}, DType::kFloat32);
  gi2.fill_bytes(0xCD);
  EXPECT_THROW(G::backward(w.grad_output, w.rois, gi2, w.opt, e.b, {}, {}, Workspace{buf.data(), bytes - 1}), Error);
  for (double x : to_vector(gi2)) ASSERT_TRUE(std::isnan(x) || x != 0.0);  // untouched poison
}

// A caller workspace at any alignment: the library rounds its base up to 256 bytes (the size it
// reports includes the slack), so int64 and double arrays are never stored misaligned.
TYPED_TEST(RoiCpu, CallerWorkspaceAtAnyAlignment) {
  using G = TypeParam;
  const Workload<G> w = detection_workload<G>(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 0);
  for (BackwardMode m : {BackwardMode::kTruncated, BackwardMode::kExact}) {
    RoiAlignBackwardOptions b;
    b.mode = m;
    Tensor gi0 = Tensor::empty({w.N(), w.C(), w.H(), w.W()}, DType::kFloat32);
    const std::size_t bytes = G::workspace_size(w.grad_output, w.rois, gi0, w.opt, b);
    ASSERT_GT(bytes, 255u);
    G::backward(w.grad_output, w.rois, gi0, w.opt, b);  // allocated workspace
    std::vector<unsigned char> buf(bytes + 512);
    for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{8},
                               std::size_t{255}}) {
      // Start exactly `offset` bytes past a 256-byte boundary.
      const auto addr = reinterpret_cast<std::uintptr_t>(buf.data());
      unsigned char* p = buf.data() + ((256 - addr % 256) % 256) + offset;
      ASSERT_LE(p + bytes, buf.data() + buf.size());
      Tensor gi = Tensor::empty({w.N(), w.C(), w.H(), w.W()}, DType::kFloat32);
      gi.fill_bytes(0xCD);
      G::backward(w.grad_output, w.rois, gi, w.opt, b, {}, {}, Workspace{p, bytes});
      EXPECT_TRUE(same_bytes(gi, gi0)) << to_string(m) << " offset " << offset;
      // One byte short is still an error naming the argument, whatever the alignment.
      gi.fill_bytes(0xCD);
      try {
        G::backward(w.grad_output, w.rois, gi, w.opt, b, {}, {}, Workspace{p, bytes - 1});
        ADD_FAILURE() << "no error for a workspace one byte short";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("workspace has"), std::string::npos) << e.what();
      }
    }
  }
}

// A caller's workspace that overlaps one of the call's tensors would be written while that tensor
// is read (or written): rejected up front, naming the tensor, with grad_input untouched.
TYPED_TEST(RoiCpu, CallerWorkspaceOverlappingATensorIsRejected) {
  using G = TypeParam;
  const ExactWorkspace<G> e;
  const Workload<G>& w = e.w;
  const RoiAlignBackwardOptions& b = e.b;
  const Tensor& gi = e.gi;
  const std::size_t bytes = e.bytes;
  const std::size_t gi_bytes = static_cast<std::size_t>(gi.view().span_bytes());
  // one buffer: grad_input at its start, then room for a workspace
  std::vector<float> buf((gi_bytes + bytes) / sizeof(float) + 64);
  TensorView gi_view = gi.view();
  gi_view.data = buf.data();
  auto* base = reinterpret_cast<unsigned char*>(buf.data());
  for (std::size_t start : {std::size_t{0}, gi_bytes / 2, gi_bytes - 4}) {  // inside grad_input
    std::fill(buf.begin(), buf.end(), -7.0f);
    try {
      G::backward(w.grad_output, w.rois, gi_view, w.opt, b, {}, {}, Workspace{base + start, bytes});
      ADD_FAILURE() << "workspace at +" << start << " overlaps grad_input and was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("grad_input"), std::string::npos) << e.what();
    }
    for (float x : buf) ASSERT_EQ(x, -7.0f);  // nothing written
  }
  // right after grad_input: accepted, and the result is the allocated workspace's
  G::backward(w.grad_output, w.rois, gi_view, w.opt, b, {}, {}, Workspace{base + gi_bytes, bytes});
  EXPECT_EQ(std::memcmp(buf.data(), e.allocated().view().data, gi_bytes), 0);
  // over grad_output and over rois
  auto* go = static_cast<unsigned char*>(w.grad_output.view().data);
  EXPECT_THROW(G::backward(w.grad_output, w.rois, gi, w.opt, b, {}, {}, Workspace{go + 8, bytes}), Error);
  auto* rois = static_cast<unsigned char*>(w.rois.view().data);
  EXPECT_THROW(G::backward(w.grad_output, w.rois, gi, w.opt, b, {}, {}, Workspace{rois, bytes}), Error);
}

// num_threads = INT_MAX once split a tiny forward into ~8.6e9 work items and tried to start a
// thread for each (gigabytes, no return): the context caps the threads, with the same bits.
TYPED_TEST(RoiCpu, HugeThreadCountIsCheapAndGivesTheSameBits) {
  using G = TypeParam;
  Tensor input = make_tensor({1, 2, 4, 4}, DType::kFloat32, random_values(32, 77));
  Tensor rois = small_rois<G>(1);
  typename G::Options o;
  o.pooled_height = o.pooled_width = 2;
  auto run = [&](int threads) {
    Tensor out = Tensor::empty({1, 2, 2, 2}, DType::kFloat32);
    Context ctx;
    ctx.num_threads = threads;
    G::forward(input, rois, out, o, ctx);
    return out;
  };
  const Tensor one = run(1);
  EXPECT_TRUE(same_bytes(one, run(std::numeric_limits<int>::max())));
}

// Views that are neither dense NCHW nor dense NHWC (rows padded to W + 3, the padding holding
// 0xCD bytes): the forward reading and writing them, and every backward mode writing grad_input
// through one, give the dense results bit for bit and never write the padding.
TYPED_TEST(RoiCpu, PaddedViewsGiveTheDenseBits) {
  using G = TypeParam;
  constexpr std::int64_t kPad = 3;
  auto padded = [](std::initializer_list<std::int64_t> sizes, DType dt) {
    std::vector<std::int64_t> s(sizes);
    Tensor buf = Tensor::empty({s[0], s[1], s[2], s[3] + kPad}, dt);
    buf.fill_bytes(0xCD);
    return buf;
  };
  auto view_of = [](const Tensor& buf) {
    TensorView v = buf.view();
    v.sizes[3] -= kPad;
    return v;
  };
  auto padding_untouched = [](const Tensor& buf) {
    const auto* b = static_cast<const unsigned char*>(buf.view().data);
    const std::int64_t row = buf.size(3) * static_cast<std::int64_t>(dtype_size(buf.view().dtype));
    const std::int64_t pad = kPad * static_cast<std::int64_t>(dtype_size(buf.view().dtype));
    for (std::int64_t r = 0; r < buf.numel() / buf.size(3); ++r)
      for (std::int64_t i = row - pad; i < row; ++i)
        if (b[r * row + i] != 0xCD) return false;
    return true;
  };
  for (DType dt : {DType::kFloat32, DType::kFloat16})
    for (PoolMode pool : pool_modes<G>()) {
      const Problem<G> p = make_problem<G>(2, true, pool, 4321);
      const std::int64_t PH = p.opt.pooled_height, PW = p.opt.pooled_width;
      Context ctx;
      ctx.num_threads = 2;
      const Tensor input = make_tensor({p.N, p.C, p.H, p.W}, dt, p.input);
      const Tensor in_buf = padded({p.N, p.C, p.H, p.W}, dt);
      fill_from(view_of(in_buf), p.input);
      const Tensor rois = make_tensor({p.K, G::kColumns}, DType::kFloat32, p.rois);
      Tensor out = Tensor::empty({p.K, p.C, PH, PW}, dt), am = Tensor::empty({p.K, p.C, PH, PW}, DType::kInt32);
      const Tensor out_buf = padded({p.K, p.C, PH, PW}, dt);
      const Tensor am_buf = padded({p.K, p.C, PH, PW}, DType::kInt32);
      const bool max = pool == PoolMode::kMax;
      G::forward(input, rois, out, p.opt, ctx, max ? TensorView(am) : TensorView{});
      G::forward(view_of(in_buf), rois, view_of(out_buf), p.opt, ctx, max ? view_of(am_buf) : TensorView{});
      EXPECT_EQ(to_vector(view_of(out_buf)), to_vector(out)) << dtype_name(dt) << " " << to_string(pool);
      EXPECT_TRUE(padding_untouched(out_buf));
      if (max) {
        EXPECT_EQ(to_vector(view_of(am_buf)), to_vector(am));
        EXPECT_TRUE(padding_untouched(am_buf));
      }
      const Tensor grad = make_tensor({p.K, p.C, PH, PW}, dt, p.grad);
      for (BackwardMode mode : kModes) {
        RoiAlignBackwardOptions b;
        b.mode = mode;
        Tensor gi = Tensor::empty({p.N, p.C, p.H, p.W}, dt);
        const Tensor gi_buf = padded({p.N, p.C, p.H, p.W}, dt);
        G::backward(grad, rois, gi, p.opt, b, ctx, max ? TensorView(am) : TensorView{});
        G::backward(grad, rois, view_of(gi_buf), p.opt, b, ctx, max ? TensorView(am) : TensorView{});
        EXPECT_EQ(to_vector(view_of(gi_buf)), to_vector(gi)) << to_string(mode) << " " << to_string(pool);
        EXPECT_TRUE(padding_untouched(gi_buf)) << to_string(mode);
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input: the documented error, and outputs left byte for byte as they were.

TYPED_TEST(RoiCpu, DeviceMismatchAndOverlapAndNullData) {
  using G = TypeParam;
  Tensor input = make_tensor({1, 2, 4, 4}, DType::kFloat32, random_values(32, 5));
  Tensor rois = small_rois<G>(1);
  Tensor out = Tensor::empty({1, 2, 2, 2}, DType::kFloat32);
  typename G::Options o;
  o.pooled_height = o.pooled_width = 2;
  auto message = [&](const TensorView& in, const TensorView& r, const TensorView& ou) {
    try {
      G::forward(in, r, ou, o);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TensorView r_cuda = rois.view();
  r_cuda.device = Device::cuda(0);
  EXPECT_EQ(message(input, r_cuda, out),
            std::string(G::kForward) + ": rois is on cuda:0; expected the device of input (cpu)");
  TensorView overlapping = out.view();
  overlapping.strides[1] = 0;  // both channels write the same element
  EXPECT_NE(message(input, rois, overlapping).find("overlapping elements"), std::string::npos);
  TensorView null_out = out.view();
  null_out.data = nullptr;
  EXPECT_NE(message(input, rois, null_out).find("null data pointer"), std::string::npos);
  TensorView neg = input.view();
  neg.strides[3] = -1;
  EXPECT_NE(message(neg, rois, out).find("negative stride"), std::string::npos);
  TensorView empty_map = input.view();
  empty_map.sizes[2] = 0;
  EXPECT_NE(message(empty_map, rois, out).find("expected H > 0 and W > 0"), std::string::npos);
}

TYPED_TEST(RoiCpu, UnknownDTypesAreRejected) {
  using G = TypeParam;
  Tensor input = make_tensor({1, 1, 4, 4}, DType::kFloat32, random_values(16, 2));
  Tensor rois = small_rois<G>(1);
  Tensor out = Tensor::empty({1, 1, 2, 2}, DType::kFloat32);
  out.fill_bytes(0xA5);
  const std::vector<unsigned char> poison(out.nbytes(), 0xA5);
  typename G::Options o;
  o.pooled_height = o.pooled_width = 2;
  // int32, the value after the last dtype (a dtype added later must be opted in), far outside.
  for (int raw : {static_cast<int>(DType::kInt32), static_cast<int>(DType::kInt32) + 1, 9, 200, 255}) {
    const DType bad = static_cast<DType>(raw);
    EXPECT_FALSE(dtype_name(bad).empty());
    EXPECT_GT(dtype_size(bad), 0u);
    TensorView in = input.view(), r = rois.view(), ou = out.view();
    in.dtype = ou.dtype = bad;
    try {
      G::forward(in, rois, ou, o);
      ADD_FAILURE() << "no error for dtype " << raw;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("input has dtype"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("expected a floating dtype"), std::string::npos) << e.what();
    }
    r.dtype = bad;
    EXPECT_THROW(G::forward(input, r, out, o), Error) << raw;
    TensorView gi = input.view();
    gi.dtype = bad;
    EXPECT_THROW(G::backward(ou, rois, gi, o, {}), Error) << raw;
    EXPECT_THROW(G::workspace_size(ou, rois, gi, o, {}), Error) << raw;
  }
  EXPECT_EQ(0, std::memcmp(poison.data(), out.view().data, out.nbytes()));  // untouched
}

/// The tensors and options a bad case mutates: rois of 3 valid rows (G::kSmallRois) on a map of
/// [2, 3, 8, 8], pooled 2 x 2 by the default options.
template <class G>
struct BadInput {
  Tensor input, rois, out, argmax;
  typename G::Options o;
};
template <class G>
struct BadCase {
  const char* name;
  std::function<void(BadInput<G>&)> mutate;
  std::string message;  // expected substring
};

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.view().data);
  return std::vector<unsigned char>(p, p + t.nbytes());
}

/// Runs `call`, expecting a detops::Error holding `message` and the name of `op`.
template <class F>
void expect_error(const std::string& message, const char* op, F&& call) {
  try {
    call();
    ADD_FAILURE() << "no error from " << op;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
  }
}

/// The forward rejects the case, output and argmax untouched; the backward (every mode) rejects
/// the same rois, grad_input untouched.
template <class G>
void check_bad_case(const BadCase<G>& bc) {
  BadInput<G> t;
  t.input = make_tensor({2, 3, 8, 8}, DType::kFloat32, random_values(2 * 3 * 64, 3));
  t.rois = small_rois<G>(3);
  t.out = Tensor::empty({3, 3, 2, 2}, DType::kFloat32);
  t.o.pooled_height = t.o.pooled_width = 2;
  bc.mutate(t);
  t.out.fill_bytes(0xA5);
  if (t.argmax.numel() > 0) t.argmax.fill_bytes(0xA5);
  const std::vector<unsigned char> snapshot = bytes_of(t.out), am_snapshot = bytes_of(t.argmax);
  expect_error(bc.message, G::kForward, [&] { G::forward(t.input, t.rois, t.out, t.o, {}, t.argmax); });
  EXPECT_TRUE(snapshot == bytes_of(t.out));
  EXPECT_TRUE(am_snapshot == bytes_of(t.argmax));
  if (std::string(bc.name).rfind("roi_", 0) != 0) return;
  Tensor gi = Tensor::empty({2, 3, 8, 8}, DType::kFloat32);
  gi.fill_bytes(0x5A);
  const std::vector<unsigned char> gsnap = bytes_of(gi);
  Tensor go = make_tensor({3, 3, 2, 2}, DType::kFloat32, std::vector<double>(36, 1.0));
  for (BackwardMode m : kModes) {
    SCOPED_TRACE(to_string(m));
    RoiAlignBackwardOptions b;
    b.mode = m;
    expect_error(bc.message, G::kBackward, [&] { G::backward(go, t.rois, gi, t.o, b, {}, t.argmax); });
    EXPECT_TRUE(gsnap == bytes_of(gi));
  }
}

/// The cases both ops reject alike (rows: G::kSmallRois).
template <class G>
std::vector<BadCase<G>> shared_bad_cases() {
  using B = BadInput<G>;
  const int cols = G::kColumns;
  const std::string columns = "rois has sizes [3, " + std::to_string(cols - 1) + "]; expected [K, " +
                              std::to_string(cols) + "] rows " + G::kGeometry.row;
  return {
      {"roi_batch_fractional", [](B& b) { set_roi<G>(b.rois, 2, 0, 1.5); },
       "rois[2] has batch index 1.5; expected an integer in [0, 2)"},
      {"roi_batch_too_large", [](B& b) { set_roi<G>(b.rois, 1, 0, 2); },
       "rois[1] has batch index 2; expected an integer in [0, 2)"},
      {"roi_batch_negative", [](B& b) { set_roi<G>(b.rois, 0, 0, -1); }, "rois[0] has batch index -1"},
      {"roi_batch_nan", [](B& b) { set_roi<G>(b.rois, 0, 0, NAN); }, "rois[0] has batch index nan"},
      {"roi_batch_huge", [](B& b) { set_roi<G>(b.rois, 0, 0, 1e30); }, "rois[0] has batch index 1.00000001504"},
      {"roi_coord_inf", [](B& b) { set_roi<G>(b.rois, 2, 1, -INFINITY); }, "expected finite values"},
      {"roi_adaptive_grid_too_large",
       [](B& b) {
         b.o.sampling_ratio = 0;
         set_roi<G>(b.rois, 1, 3, 3e7);
       },
       "max_samples_per_roi"},
      {"input_rank", [](B& b) { b.input = Tensor::empty({2, 3, 64}, DType::kFloat32); },
       "input has rank 3 (sizes [2, 3, 64]); expected rank 4"},
      {"rois_columns", [cols](B& b) { b.rois = Tensor::empty({3, cols - 1}, DType::kFloat32); }, columns},
      {"rois_dtype", [cols](B& b) { b.rois = Tensor::zeros({3, cols}, DType::kFloat16); },
       "rois has dtype float16; expected float32"},
      {"output_dtype", [](B& b) { b.out = Tensor::empty({3, 3, 2, 2}, DType::kFloat64); },
       "output has dtype float64; expected float32"},
      {"output_sizes", [](B& b) { b.out = Tensor::empty({3, 3, 2, 3}, DType::kFloat32); },
       "output has sizes [3, 3, 2, 3]; expected [K, C, PH, PW] = [3, 3, 2, 2]"},
      {"output_aliases_input", [](B& b) { b.out = b.input; }, "output"},
      {"pooled_zero", [](B& b) { b.o.pooled_width = 0; }, "expected pooled_height and pooled_width > 0"},
      {"scale_nan", [](B& b) { b.o.spatial_scale = NAN; }, "spatial_scale is nan; expected a finite value > 0"},
      {"scale_negative", [](B& b) { b.o.spatial_scale = -0.25; }, "spatial_scale is -0.25"},
      {"sampling_ratio_huge", [](B& b) { b.o.sampling_ratio = 100000; }, "sampling_ratio 100000"},
  };
}

std::vector<BadCase<AxisAlignedRois>> own_bad_cases(AxisAlignedRois) {
  using B = BadInput<AxisAlignedRois>;
  return {
      {"roi_coord_nan", [](B& b) { set_roi<AxisAlignedRois>(b.rois, 1, 3, NAN); }, "rois[1] has coordinates"},
      {"max_without_argmax", [](B& b) { b.o.pool_mode = PoolMode::kMax; }, "pool_mode max needs argmax"},
      {"argmax_dtype",
       [](B& b) {
         b.o.pool_mode = PoolMode::kMax;
         b.argmax = Tensor::empty({3, 3, 2, 2}, DType::kFloat32);
       },
       "argmax has dtype float32; expected int32"},
  };
}

std::vector<BadCase<RotatedRois>> own_bad_cases(RotatedRois) {
  using B = BadInput<RotatedRois>;
  return {
      {"roi_negative_width", [](B& b) { set_roi<RotatedRois>(b.rois, 1, 3, -2); },
       "rois[1] has size (w, h) = (-2, 7); expected w >= 0 and h >= 0"},
      {"roi_negative_height", [](B& b) { set_roi<RotatedRois>(b.rois, 2, 4, -0.5); },
       "rois[2] has size (w, h) = (3, -0.5)"},
      {"roi_angle_nan", [](B& b) { set_roi<RotatedRois>(b.rois, 0, 5, NAN); },
       "rois[0] has (cx, cy, w, h, angle) = (3, 3, 4, 4, nan); expected finite values"},
      {"roi_centre_inf", [](B& b) { set_roi<RotatedRois>(b.rois, 2, 1, INFINITY); }, "expected finite values"},
      {"angle_unit_unknown", [](B& b) { b.o.angle_unit = static_cast<AngleUnit>(7); },
       "angle_unit 7 is unknown; expected degrees or radians"},
  };
}

/// One bad case of one op, its geometry bound in `run`.
struct BadCaseParam {
  std::string name;
  std::function<void()> run;
};
void PrintTo(const BadCaseParam& p, std::ostream* os) { *os << p.name; }

template <class G>
std::vector<BadCaseParam> bad_cases() {
  std::vector<BadCase<G>> cases = shared_bad_cases<G>();
  for (BadCase<G>& c : own_bad_cases(G{})) cases.push_back(std::move(c));
  std::vector<BadCaseParam> params;
  for (const BadCase<G>& c : cases) params.push_back({c.name, [c] { check_bad_case(c); }});
  return params;
}

class RoiBadInput : public ::testing::TestWithParam<BadCaseParam> {};

TEST_P(RoiBadInput, ThrowsAndLeavesOutputsUntouched) { GetParam().run(); }

// Device, overlap, null-data and stride cases need hand-made views: DeviceMismatchAndOverlapAndNullData.
auto bad_case_name = [](const ::testing::TestParamInfo<BadCaseParam>& i) { return i.param.name; };
INSTANTIATE_TEST_SUITE_P(RoiAlign, RoiBadInput, ::testing::ValuesIn(bad_cases<AxisAlignedRois>()), bad_case_name);
INSTANTIATE_TEST_SUITE_P(RoiAlignRotated, RoiBadInput, ::testing::ValuesIn(bad_cases<RotatedRois>()), bad_case_name);

}  // namespace
}  // namespace detops
