// SyncBatchNorm on the CPU: against a float64 reference and finite differences, bitwise
// invariance (layouts, thread counts, repeated runs, ranks), in-process groups of 1-4 ranks with
// unequal and empty splits (exact mode: the same bits as one process), large means, the edge
// counts 0 and 1, the rank-agreement header, failing ranks and timeouts, the phases API, and the
// bad-input matrix.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "detops/detail/sync_batch_norm_math.h"
#include "detops/detops.h"
#include "test_util.h"

namespace detops {
namespace {

using test::make_tensor;
using test::random_values;
using test::same_bytes;
using test::to_vector;

// ---------------------------------------------------------------------------------------------
// A problem and its float64 reference

struct Problem {
  std::int64_t N, C, H, W;
  std::vector<double> x, dy, weight, bias, rm, rv;
};

Problem make_problem(std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, std::uint64_t seed,
                     double mean_offset = 0.0) {
  Problem p{N, C, H, W, {}, {}, {}, {}, {}, {}};
  const auto n = static_cast<std::size_t>(N * C * H * W);
  p.x = random_values(n, seed, -2.0, 3.0);
  // channel c has its own scale and offset; channel 0 gets mean_offset (large-mean tests)
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t c = (static_cast<std::int64_t>(i) / (H * W)) % C;
    p.x[i] = p.x[i] * (0.5 + 0.25 * static_cast<double>(c % 4)) + (c == 0 ? mean_offset : 0.1 * static_cast<double>(c));
  }
  p.dy = random_values(n, seed + 1, -1.0, 1.0);
  p.weight = random_values(static_cast<std::size_t>(C), seed + 2, 0.5, 1.5);
  p.bias = random_values(static_cast<std::size_t>(C), seed + 3, -0.5, 0.5);
  p.rm = random_values(static_cast<std::size_t>(C), seed + 4, -0.1, 0.1);
  p.rv = random_values(static_cast<std::size_t>(C), seed + 5, 0.5, 2.0);
  return p;
}

struct Reference {
  std::vector<double> mean, invstd, y, dx, dw, db, rm, rv;
};

Reference reference(const Problem& p, double eps, double momentum) {
  Reference r;
  const std::int64_t HW = p.H * p.W, n = p.N * HW;
  auto at = [&](const std::vector<double>& v, std::int64_t b, std::int64_t c, std::int64_t s) {
    return v[static_cast<std::size_t>((b * p.C + c) * HW + s)];
  };
  r.y.resize(p.x.size());
  r.dx.resize(p.x.size());
  for (std::int64_t c = 0; c < p.C; ++c) {
    long double s = 0;
    for (std::int64_t b = 0; b < p.N; ++b)
      for (std::int64_t q = 0; q < HW; ++q) s += at(p.x, b, c, q);
    const double mean = n ? static_cast<double>(s / n) : 0.0;
    long double m2 = 0, sdy = 0, sdyx = 0;
    for (std::int64_t b = 0; b < p.N; ++b)
      for (std::int64_t q = 0; q < HW; ++q) {
        const long double d = static_cast<long double>(at(p.x, b, c, q)) - mean;
        m2 += d * d;
        sdy += at(p.dy, b, c, q);
        sdyx += at(p.dy, b, c, q) * d;
      }
    const double var = n ? static_cast<double>(m2 / n) : 0.0;
    const double invstd = n ? 1.0 / std::sqrt(var + eps) : 0.0;
    r.mean.push_back(mean);
    r.invstd.push_back(invstd);
    const double w = p.weight[static_cast<std::size_t>(c)], bb = p.bias[static_cast<std::size_t>(c)];
    for (std::int64_t b = 0; b < p.N; ++b)
      for (std::int64_t q = 0; q < HW; ++q) {
        const auto i = static_cast<std::size_t>((b * p.C + c) * HW + q);
        r.y[i] = (p.x[i] - mean) * invstd * w + bb;
        r.dx[i] = static_cast<double>((p.dy[i] - sdy / n - (p.x[i] - mean) * invstd * invstd * sdyx / n) * w * invstd);
      }
    r.dw.push_back(static_cast<double>(sdyx) * invstd);
    r.db.push_back(static_cast<double>(sdy));
    const double unbiased = n > 1 ? static_cast<double>(m2 / (n - 1)) : 0.0;
    r.rm.push_back(n > 1 ? (1 - momentum) * p.rm[static_cast<std::size_t>(c)] + momentum * mean : p.rm[static_cast<std::size_t>(c)]);
    r.rv.push_back(n > 1 ? (1 - momentum) * p.rv[static_cast<std::size_t>(c)] + momentum * unbiased : p.rv[static_cast<std::size_t>(c)]);
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Running detops on a problem, one rank's slice of the batch

struct Result {
  Tensor y, mean, invstd, dx, dw, db, rm, rv, nbt;
};

/// Tensors of the whole problem in one dtype and layout; a rank uses a view of images [n0, n1).
struct Inputs {
  Tensor x, dy;
  Inputs(const Problem& p, DType dt, Layout layout)
      : x(make_tensor({p.N, p.C, p.H, p.W}, dt, p.x, layout)), dy(make_tensor({p.N, p.C, p.H, p.W}, dt, p.dy, layout)) {}
};

TensorView slice(const TensorView& v, std::int64_t n0, std::int64_t n1) {
  TensorView s = v;
  s.sizes[0] = n1 - n0;
  if (n1 > n0) s.data = static_cast<char*>(v.data) + n0 * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  return s;
}

/// Where the one-call path's scratch comes from.
enum class Scratch {
  kAllocator,        ///< ctx.allocator (the default one)
  kCallerWorkspace,  ///< a caller Workspace of exactly the queried size, 8 bytes past a 256-byte boundary
  kOffsetAllocator,  ///< an allocator whose blocks start 8 bytes past a 256-byte boundary
};

/// Hands out blocks 8 bytes past a 256-byte boundary (the alignment finding: the carved records
/// need more than the allocator promises) and counts them.
class OffsetAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device, void*) override {
    auto* p = static_cast<unsigned char*>(::operator new(bytes + 264, std::align_val_t{256}));
    ++count;
    return p + 8;
  }
  void deallocate(void* ptr, std::size_t, Device, void*) override {
    ::operator delete(static_cast<unsigned char*>(ptr) - 8, std::align_val_t{256});
  }
  std::atomic<int> count{0};
};

/// A caller workspace of `bytes`, starting 8 bytes past a 256-byte boundary.
struct CallerWorkspace {
  std::vector<unsigned char> storage;
  Workspace ws;
  explicit CallerWorkspace(std::size_t bytes) : storage(bytes + 512) {
    const auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    ws = {storage.data() + (256 - addr % 256) % 256 + 8, bytes};
  }
};

/// Forward + backward on images [n0, n1) of `in` over comm.
Result run(const Problem& p, const Inputs& in, std::int64_t n0, std::int64_t n1, Communicator* comm,
           const SyncBnOptions& o, const Context& ctx_in = {}, DType param_dtype = DType::kFloat32,
           Scratch scratch = Scratch::kAllocator) {
  Context ctx = ctx_in;
  OffsetAllocator offset_allocator;
  if (scratch == Scratch::kOffsetAllocator) ctx.allocator = &offset_allocator;
  const TensorView xs = slice(in.x, n0, n1), dys = slice(in.dy, n0, n1);
  Result r;
  const Layout layout = in.x.view().layout();
  r.y = Tensor::zeros({n1 - n0, p.C, p.H, p.W}, xs.dtype, Device::cpu(), layout);
  r.dx = Tensor::zeros({n1 - n0, p.C, p.H, p.W}, xs.dtype, Device::cpu(), layout);
  r.mean = Tensor::zeros({p.C}, DType::kFloat64);
  r.invstd = Tensor::zeros({p.C}, DType::kFloat64);
  r.dw = Tensor::zeros({p.C}, param_dtype);
  r.db = Tensor::zeros({p.C}, param_dtype);
  r.rm = make_tensor({p.C}, param_dtype, p.rm);
  r.rv = make_tensor({p.C}, param_dtype, p.rv);
  r.nbt = Tensor::zeros({1}, DType::kInt64);
  const Tensor w = make_tensor({p.C}, param_dtype, p.weight), b = make_tensor({p.C}, param_dtype, p.bias);
  SyncBnParams params{w, b, r.rm, r.rv, r.nbt};
  if (scratch == Scratch::kCallerWorkspace) {
    CallerWorkspace fw(sync_batch_norm_forward_workspace_size(xs, comm, o));
    sync_batch_norm_forward(xs, params, r.y, r.mean, r.invstd, comm, o, ctx, fw.ws);
    CallerWorkspace bw(sync_batch_norm_backward_workspace_size(xs, r.dx, comm, o));
    sync_batch_norm_backward(dys, xs, w, r.mean, r.invstd, r.dx, r.dw, r.db, comm, o, ctx, bw.ws);
    return r;
  }
  sync_batch_norm_forward(xs, params, r.y, r.mean, r.invstd, comm, o, ctx);
  sync_batch_norm_backward(dys, xs, w, r.mean, r.invstd, r.dx, r.dw, r.db, comm, o, ctx);
  if (scratch == Scratch::kOffsetAllocator) {
    EXPECT_GT(offset_allocator.count.load(), 0);
  }
  return r;
}

/// Runs `ranks` threads of a ThreadGroup, rank r on images [split[r], split[r + 1]).
std::vector<Result> run_group(const Problem& p, const Inputs& in, const std::vector<std::int64_t>& split,
                              const SyncBnOptions& o, Scratch scratch = Scratch::kAllocator) {
  const int ranks = static_cast<int>(split.size()) - 1;
  ThreadGroup group(ranks, std::chrono::seconds(30));
  std::vector<Result> out(static_cast<std::size_t>(ranks));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = group.communicator(r);
        Context ctx;
        ctx.num_threads = 1;
        out[static_cast<std::size_t>(r)] =
            run(p, in, split[static_cast<std::size_t>(r)], split[static_cast<std::size_t>(r) + 1], comm.get(), o, ctx,
                DType::kFloat32, scratch);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        group.abort("a rank failed");
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1.0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(got[i] - want[i]);
    if (!(e <= worst)) worst = e, at = i;
  }
  EXPECT_LE(worst, tol * scale) << what << ": worst at " << at << " got " << got[at] << " want " << want[at];
}

/// Images [n0, n1) of an NCHW-ordered vector.
std::vector<double> images(const Problem& p, const std::vector<double>& v, std::int64_t n0, std::int64_t n1) {
  const std::int64_t per = p.C * p.H * p.W;
  return {v.begin() + n0 * per, v.begin() + n1 * per};
}

double tolerance(DType dt) {
  switch (dt) {
    case DType::kFloat64: return 1e-12;
    case DType::kFloat32: return 2e-6;
    case DType::kFloat16: return 2e-3;
    default: return 1.6e-2;
  }
}

// ---------------------------------------------------------------------------------------------
// Against the float64 reference

struct RefCase {
  DType dtype;
  Layout layout;
  SyncBnMode mode;
};

class SyncBnReference : public ::testing::TestWithParam<RefCase> {};

TEST_P(SyncBnReference, MatchesFloat64Reference) {
  const RefCase k = GetParam();
  for (const auto& shape : std::vector<std::array<std::int64_t, 4>>{{2, 5, 7, 9}, {3, 3, 17, 19}, {1, 2, 1, 2}, {4, 16, 4, 4}}) {
    const Problem p = make_problem(shape[0], shape[1], shape[2], shape[3], 7 + shape[2]);
    // compare against the reference of the values as stored (rounded to the dtype)
    Problem q = p;
    const Inputs in(p, k.dtype, k.layout);
    q.x = to_vector(in.x);
    q.dy = to_vector(in.dy);
    q.weight = to_vector(make_tensor({p.C}, DType::kFloat32, p.weight));
    q.bias = to_vector(make_tensor({p.C}, DType::kFloat32, p.bias));
    q.rm = to_vector(make_tensor({p.C}, DType::kFloat32, p.rm));
    q.rv = to_vector(make_tensor({p.C}, DType::kFloat32, p.rv));
    SyncBnOptions o;
    o.mode = k.mode;
    const Reference ref = reference(q, o.eps, 0.1);
    const Result r = run(p, in, 0, p.N, nullptr, o);
    const double stat_tol = k.mode == SyncBnMode::kExact ? 1e-12 : 1e-14;
    expect_close(to_vector(r.mean), ref.mean, stat_tol, "mean");
    expect_close(to_vector(r.invstd), ref.invstd, 1e-12, "invstd");
    // the exact mode rounds values to 2^-44 of the channel's max |x|: float64 results carry that
    // (relative to max |x| / std, large for the two-element channels of [1, 2, 1, 2])
    const double tol = k.mode == SyncBnMode::kExact && k.dtype == DType::kFloat64 ? 1e-9 : tolerance(k.dtype);
    expect_close(to_vector(r.y), ref.y, tol, "y");
    expect_close(to_vector(r.dx), ref.dx, tol, "grad_x");
    expect_close(to_vector(r.dw), ref.dw, 2e-6, "grad_weight");
    expect_close(to_vector(r.db), ref.db, 2e-6, "grad_bias");
    expect_close(to_vector(r.rm), ref.rm, 2e-7, "running_mean");
    expect_close(to_vector(r.rv), ref.rv, 2e-7, "running_var");
    EXPECT_EQ(to_vector(r.nbt)[0], 1.0);
  }
}

std::vector<RefCase> ref_cases() {
  std::vector<RefCase> v;
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16})
    for (Layout l : {Layout::kNCHW, Layout::kNHWC})
      for (SyncBnMode m : {SyncBnMode::kDefault, SyncBnMode::kExact}) v.push_back({dt, l, m});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, SyncBnReference, ::testing::ValuesIn(ref_cases()), [](const auto& info) {
  return std::string(dtype_name(info.param.dtype)) + (info.param.layout == Layout::kNHWC ? "_nhwc" : "_nchw") +
         (info.param.mode == SyncBnMode::kExact ? "_exact" : "_default");
});

// Finite differences of L = sum(y * g) in float64.
TEST(SyncBn, GradientsMatchFiniteDifferences) {
  const Problem p = make_problem(2, 3, 3, 4, 99);
  const std::vector<double> g = p.dy;
  auto loss = [&](const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b) {
    const Tensor xt = make_tensor({p.N, p.C, p.H, p.W}, DType::kFloat64, x);
    const Tensor y = Tensor::zeros({p.N, p.C, p.H, p.W}, DType::kFloat64);
    const Tensor m = Tensor::zeros({p.C}, DType::kFloat64), is = Tensor::zeros({p.C}, DType::kFloat64);
    const Tensor wt = make_tensor({p.C}, DType::kFloat64, w), bt = make_tensor({p.C}, DType::kFloat64, b);
    sync_batch_norm_forward(xt, SyncBnParams{wt, bt, {}, {}, {}}, y, m, is);
    const auto yv = to_vector(y);
    long double s = 0;
    for (std::size_t i = 0; i < yv.size(); ++i) s += yv[i] * g[i];
    return static_cast<double>(s);
  };
  const Tensor x = make_tensor({p.N, p.C, p.H, p.W}, DType::kFloat64, p.x);
  const Tensor dy = make_tensor({p.N, p.C, p.H, p.W}, DType::kFloat64, g);
  const Tensor w = make_tensor({p.C}, DType::kFloat64, p.weight), b = make_tensor({p.C}, DType::kFloat64, p.bias);
  const Tensor y = Tensor::zeros({p.N, p.C, p.H, p.W}, DType::kFloat64), dx = Tensor::zeros({p.N, p.C, p.H, p.W}, DType::kFloat64);
  const Tensor m = Tensor::zeros({p.C}, DType::kFloat64), is = Tensor::zeros({p.C}, DType::kFloat64);
  const Tensor dw = Tensor::zeros({p.C}, DType::kFloat64), db = Tensor::zeros({p.C}, DType::kFloat64);
  sync_batch_norm_forward(x, SyncBnParams{w, b, {}, {}, {}}, y, m, is);
  sync_batch_norm_backward(dy, x, w, m, is, dx, dw, db);
  const double h = 1e-6;
  const auto gx = to_vector(dx), gw = to_vector(dw), gb = to_vector(db);
  for (std::size_t i = 0; i < p.x.size(); i += 5) {
    auto xp = p.x, xm = p.x;
    xp[i] += h, xm[i] -= h;
    EXPECT_NEAR(gx[i], (loss(xp, p.weight, p.bias) - loss(xm, p.weight, p.bias)) / (2 * h), 1e-6) << "x[" << i << "]";
  }
  for (std::size_t c = 0; c < static_cast<std::size_t>(p.C); ++c) {
    auto wp = p.weight, wm = p.weight, bp = p.bias, bm = p.bias;
    wp[c] += h, wm[c] -= h, bp[c] += h, bm[c] -= h;
    EXPECT_NEAR(gw[c], (loss(p.x, wp, p.bias) - loss(p.x, wm, p.bias)) / (2 * h), 1e-6) << "weight[" << c << "]";
    EXPECT_NEAR(gb[c], (loss(p.x, p.weight, bp) - loss(p.x, p.weight, bm)) / (2 * h), 1e-6) << "bias[" << c << "]";
  }
}

// ---------------------------------------------------------------------------------------------
// Bitwise invariance

void expect_same(const Result& a, const Result& b, const std::string& what, bool outputs = true) {
  EXPECT_TRUE(same_bytes(a.mean, b.mean)) << what << ": save_mean";
  EXPECT_TRUE(same_bytes(a.invstd, b.invstd)) << what << ": save_invstd";
  EXPECT_TRUE(same_bytes(a.rm, b.rm)) << what << ": running_mean";
  EXPECT_TRUE(same_bytes(a.rv, b.rv)) << what << ": running_var";
  if (!outputs) return;
  EXPECT_EQ(to_vector(a.y), to_vector(b.y)) << what << ": y";
  EXPECT_EQ(to_vector(a.dx), to_vector(b.dx)) << what << ": grad_x";
  EXPECT_TRUE(same_bytes(a.dw, b.dw)) << what << ": grad_weight";
  EXPECT_TRUE(same_bytes(a.db, b.db)) << what << ": grad_bias";
}

TEST(SyncBn, LayoutsThreadsAndRunsGiveTheSameBits) {
  // 300 positions per image (chunks spanning images, the CPU's channel-block walk); 530 channels
  // (the channels-inner walk's blocks of 512 and a partial one); 575 positions (the CPU's
  // per-plane walk)
  for (const Problem& p : {make_problem(3, 20, 15, 20, 5), make_problem(2, 530, 17, 17, 6), make_problem(3, 5, 23, 25, 7)})
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat64})
    for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
      SyncBnOptions o;
      o.mode = mode;
      const Inputs nchw(p, dt, Layout::kNCHW), nhwc(p, dt, Layout::kNHWC);
      Context one, three;
      one.num_threads = 1;
      three.num_threads = 3;
      Context two;
      two.num_threads = 2;  // work-item ranges that start inside a chunk (530 channels: 2 blocks)
      const Result a = run(p, nchw, 0, p.N, nullptr, o, one);
      expect_same(a, run(p, nchw, 0, p.N, nullptr, o, three), "NCHW 1 vs 3 threads");
      expect_same(a, run(p, nhwc, 0, p.N, nullptr, o, two), "NCHW vs NHWC 2 threads");
      expect_same(a, run(p, nhwc, 0, p.N, nullptr, o, one), "NCHW vs NHWC");
      expect_same(a, run(p, nhwc, 0, p.N, nullptr, o, three), "NCHW vs NHWC 3 threads");
      for (int i = 0; i < 3; ++i) expect_same(a, run(p, nchw, 0, p.N, nullptr, o, three), "repeat");
    }
}

TEST(SyncBn, StridedViewsGiveTheSameBits) {
  const Problem p = make_problem(2, 4, 9, 11, 17);
  // x as a [2, 4, 9, 11] view into a [2, 4, 9, 13] buffer (padded rows)
  const Tensor big = make_tensor({2, 4, 9, 13}, DType::kFloat32, random_values(2 * 4 * 9 * 13, 3));
  TensorView xv = big.view();
  xv.sizes[3] = 11;
  const Tensor dense = make_tensor({2, 4, 9, 11}, DType::kFloat32, to_vector(xv));
  const Tensor w = make_tensor({p.C}, DType::kFloat32, p.weight), b = make_tensor({p.C}, DType::kFloat32, p.bias);
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    SyncBnOptions o;
    o.mode = mode;
    const Tensor y1 = Tensor::zeros({2, 4, 9, 11}, DType::kFloat32), y2 = Tensor::zeros({2, 4, 9, 11}, DType::kFloat32);
    const Tensor m1 = Tensor::zeros({4}, DType::kFloat64), m2 = Tensor::zeros({4}, DType::kFloat64);
    const Tensor i1 = Tensor::zeros({4}, DType::kFloat64), i2 = Tensor::zeros({4}, DType::kFloat64);
    sync_batch_norm_forward(xv, SyncBnParams{w, b, {}, {}, {}}, y1, m1, i1, nullptr, o);
    sync_batch_norm_forward(dense, SyncBnParams{w, b, {}, {}, {}}, y2, m2, i2, nullptr, o);
    EXPECT_TRUE(same_bytes(m1, m2));
    EXPECT_TRUE(same_bytes(i1, i2));
    EXPECT_TRUE(same_bytes(y1, y2));
  }
}

// Channels-last views with padded rows (x and grad_y as [3, 530, 9, 11] inside [3, 9, 13, 530]
// buffers): the channels-inner walks with strides that are not the dense ones, chunks spanning
// images, 1-3 threads; forward and backward give the dense NCHW bits.
TEST(SyncBn, PaddedChannelsLastViewsGiveTheSameBits) {
  constexpr std::int64_t N = 3, C = 530, H = 9, W = 11, Wp = 13;
  const Tensor xbuf = make_tensor({N, H, Wp, C}, DType::kFloat32, random_values(N * H * Wp * C, 21, -3.0, 3.0));
  const Tensor gbuf = make_tensor({N, H, Wp, C}, DType::kFloat32, random_values(N * H * Wp * C, 22));
  auto padded_view = [&](const Tensor& buf) {
    return TensorView(buf.view().data, DType::kFloat32, Device::cpu(), {N, C, H, W}, {H * Wp * C, 1, Wp * C, C});
  };
  const TensorView xv = padded_view(xbuf), gv = padded_view(gbuf);
  const Tensor x = make_tensor({N, C, H, W}, DType::kFloat32, to_vector(xv));
  const Tensor g = make_tensor({N, C, H, W}, DType::kFloat32, to_vector(gv));
  const Tensor w = make_tensor({C}, DType::kFloat32, random_values(C, 23, 0.5, 1.5));
  const Tensor b = make_tensor({C}, DType::kFloat32, random_values(C, 24));
  struct Out {
    Tensor y, mean, invstd, dx, dw, db;
  };
  auto step = [&](const TensorView& xs, const TensorView& gs, SyncBnMode mode, int threads) {
    SyncBnOptions o;
    o.mode = mode;
    Context ctx;
    ctx.num_threads = threads;
    Out r{Tensor::zeros({N, C, H, W}, DType::kFloat32), Tensor::zeros({C}, DType::kFloat64),
          Tensor::zeros({C}, DType::kFloat64),         Tensor::zeros({N, C, H, W}, DType::kFloat32),
          Tensor::zeros({C}, DType::kFloat32),         Tensor::zeros({C}, DType::kFloat32)};
    sync_batch_norm_forward(xs, SyncBnParams{w, b, {}, {}, {}}, r.y, r.mean, r.invstd, nullptr, o, ctx);
    sync_batch_norm_backward(gs, xs, w, r.mean, r.invstd, r.dx, r.dw, r.db, nullptr, o, ctx);
    return r;
  };
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    const Out a = step(x, g, mode, 1);
    for (int threads : {1, 2, 3}) {
      const Out c = step(xv, gv, mode, threads);
      const std::string what = std::string(mode == SyncBnMode::kExact ? "exact " : "default ") + std::to_string(threads) + " threads";
      EXPECT_TRUE(same_bytes(a.mean, c.mean)) << what;
      EXPECT_TRUE(same_bytes(a.invstd, c.invstd)) << what;
      EXPECT_TRUE(same_bytes(a.y, c.y)) << what;
      EXPECT_TRUE(same_bytes(a.dx, c.dx)) << what;
      EXPECT_TRUE(same_bytes(a.dw, c.dw)) << what;
      EXPECT_TRUE(same_bytes(a.db, c.db)) << what;
    }
  }
}

TEST(SyncBn, InstructionSetVariantsGiveTheSameBits) {
  // Every variant of the CPU loops (src/internal/cpu_isa.h) against the baseline, bit for bit,
  // over the three walks, every dtype, both modes and both layouts; one case with inf and NaN
  // (the NaN payloads must agree too). Variants this CPU lacks run as the widest it has (the
  // request is lowered), so they are reported, not skipped silently.
  std::vector<CpuIsa> variants;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(cpu_isa_supported())) variants.push_back(isa);
    else std::printf("[ note ] this CPU has no %s: that variant is not compared\n", cpu_isa_name(isa));
  }
  Problem special = make_problem(2, 37, 9, 29, 8);
  special.x[5] = std::numeric_limits<double>::infinity();
  special.x[900] = std::numeric_limits<double>::quiet_NaN();
  special.dy[7] = -std::numeric_limits<double>::infinity();
  for (const Problem& p : {make_problem(3, 20, 15, 20, 5), make_problem(2, 530, 17, 17, 6), make_problem(3, 5, 23, 25, 7), special})
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64})
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
        for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
          SyncBnOptions o;
          o.mode = mode;
          const Inputs in(p, dt, layout);
          Context base;
          base.num_threads = 2;
          base.cpu_isa = CpuIsa::kBaseline;
          ASSERT_EQ(base.resolved_cpu_isa(), CpuIsa::kBaseline);
          const Result a = run(p, in, 0, p.N, nullptr, o, base);
          for (CpuIsa isa : variants) {
            Context ctx = base;
            ctx.cpu_isa = isa;
            ASSERT_EQ(ctx.resolved_cpu_isa(), isa);
            const Result b = run(p, in, 0, p.N, nullptr, o, ctx);
            const std::string what = std::string(cpu_isa_name(isa)) + " vs baseline, " + std::string(dtype_name(dt)) +
                                     (layout == Layout::kNHWC ? " NHWC" : " NCHW") +
                                     (mode == SyncBnMode::kExact ? " exact" : " default") + ", C=" +
                                     std::to_string(p.C);
            expect_same(a, b, what, /*outputs=*/false);
            EXPECT_TRUE(same_bytes(a.y, b.y)) << what << ": y";
            EXPECT_TRUE(same_bytes(a.dx, b.dx)) << what << ": grad_x";
            EXPECT_TRUE(same_bytes(a.dw, b.dw)) << what << ": grad_weight";
            EXPECT_TRUE(same_bytes(a.db, b.db)) << what << ": grad_bias";
          }
        }
}

TEST(CpuIsa, RequestsAreLoweredToWhatTheCpuSupports) {
  const CpuIsa best = cpu_isa_supported();
  EXPECT_NE(best, CpuIsa::kAuto);
  Context ctx;
  EXPECT_EQ(ctx.cpu_isa, CpuIsa::kAuto);
  EXPECT_EQ(ctx.resolved_cpu_isa(), best);
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    ctx.cpu_isa = isa;
    EXPECT_EQ(ctx.resolved_cpu_isa(), static_cast<int>(isa) <= static_cast<int>(best) ? isa : best);
  }
  ctx.cpu_isa = static_cast<CpuIsa>(-7);  // not an enumerator: the baseline, never a crash
  EXPECT_EQ(ctx.resolved_cpu_isa(), CpuIsa::kBaseline);
  ctx.cpu_isa = static_cast<CpuIsa>(99);
  EXPECT_EQ(ctx.resolved_cpu_isa(), best);
  EXPECT_STREQ(cpu_isa_name(CpuIsa::kAuto), "auto");
  EXPECT_STREQ(cpu_isa_name(CpuIsa::kBaseline), "baseline");
  EXPECT_STREQ(cpu_isa_name(CpuIsa::kAvx2), "avx2");
  EXPECT_STREQ(cpu_isa_name(CpuIsa::kAvx512), "avx512");
  EXPECT_STREQ(cpu_isa_name(static_cast<CpuIsa>(42)), "unknown");
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // what the machine says (the variants exist on x86-64 builds with GCC or clang)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw")) {
    EXPECT_EQ(best, CpuIsa::kAvx512);
  } else if (__builtin_cpu_supports("avx2")) {
    EXPECT_EQ(best, CpuIsa::kAvx2);
  }
#endif
}

// ---------------------------------------------------------------------------------------------
// In-process groups

struct GroupCase {
  std::vector<std::int64_t> split;  // image boundaries, one more than the ranks
};

class SyncBnGroup : public ::testing::TestWithParam<GroupCase> {};

TEST_P(SyncBnGroup, MatchesOneProcess) {
  const auto& split = GetParam().split;
  const Problem p = make_problem(split.back(), 6, 7, 5, 1234, 50.0);
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
    for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
      SyncBnOptions o;
      o.mode = mode;
      const Inputs in(p, DType::kFloat32, layout);
      const Result whole = run(p, in, 0, p.N, nullptr, o);
      const std::vector<Result> parts = run_group(p, in, split, o);
      const std::vector<Result> again = run_group(p, in, split, o);
      const auto want_y = to_vector(whole.y), want_dx = to_vector(whole.dx);
      for (std::size_t r = 0; r < parts.size(); ++r) {
        const std::string what = "rank " + std::to_string(r) + (mode == SyncBnMode::kExact ? " exact" : " default");
        // every rank holds the same statistics, and repeated runs give the same bits
        expect_same(parts[r], parts[0], what + " vs rank 0", false);
        expect_same(parts[r], again[r], what + " repeated");
        const std::int64_t n0 = split[r], n1 = split[r + 1];
        const auto wy = images(p, want_y, n0, n1), wdx = images(p, want_dx, n0, n1);
        if (mode == SyncBnMode::kExact) {
          expect_same(parts[r], whole, what + " vs one process", false);
          EXPECT_EQ(to_vector(parts[r].y), wy) << what;
          EXPECT_EQ(to_vector(parts[r].dx), wdx) << what;
        } else {
          expect_close(to_vector(parts[r].mean), to_vector(whole.mean), 1e-14, "mean");
          expect_close(to_vector(parts[r].invstd), to_vector(whole.invstd), 1e-13, "invstd");
          expect_close(to_vector(parts[r].rv), to_vector(whole.rv), 1e-7, "running_var");
          expect_close(to_vector(parts[r].y), wy, 1e-6, "y");
          expect_close(to_vector(parts[r].dx), wdx, 1e-6, "grad_x");
        }
      }
      // the ranks' parameter gradients add up to the whole batch's
      std::vector<double> dw(static_cast<std::size_t>(p.C)), db(static_cast<std::size_t>(p.C));
      for (const auto& r : parts) {
        const auto a = to_vector(r.dw), b = to_vector(r.db);
        for (std::size_t c = 0; c < dw.size(); ++c) dw[c] += a[c], db[c] += b[c];
      }
      expect_close(dw, to_vector(whole.dw), 1e-5, "sum of grad_weight");
      expect_close(db, to_vector(whole.db), 1e-5, "sum of grad_bias");
    }
}

INSTANTIATE_TEST_SUITE_P(Splits, SyncBnGroup,
                         ::testing::Values(GroupCase{{0, 5}}, GroupCase{{0, 2, 5}}, GroupCase{{0, 1, 1, 5}},
                                           GroupCase{{0, 0, 3, 4, 5}}, GroupCase{{0, 4, 4, 4, 5}}),
                         [](const auto& info) {
                           std::string s = "ranks" + std::to_string(info.param.split.size() - 1);
                           for (std::size_t i = 1; i < info.param.split.size(); ++i)
                             s += "_" + std::to_string(info.param.split[i] - info.param.split[i - 1]);
                           return s;
                         });

// ---------------------------------------------------------------------------------------------
// Numerics and edge counts

TEST(SyncBn, LargeMeanHasNoCancellation) {
  // mean 1e4, std ~0.7: E[x^2] - E[x]^2 in float32 would lose every digit of the variance
  const Problem p = make_problem(4, 2, 16, 16, 77, 1e4);
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    SyncBnOptions o;
    o.mode = mode;
    const Inputs in(p, DType::kFloat32, Layout::kNCHW);
    Problem q = p;
    q.x = to_vector(in.x);
    const Reference ref = reference(q, o.eps, 0.1);
    const Result r = run(p, in, 0, p.N, nullptr, o);
    const auto invstd = to_vector(r.invstd);
    EXPECT_NEAR(invstd[0], ref.invstd[0], 1e-12 * ref.invstd[0]);
    const auto split = run_group(p, in, {0, 1, 3, 4}, o);
    EXPECT_NEAR(to_vector(split[1].invstd)[0], ref.invstd[0], 1e-12 * ref.invstd[0]);
  }
}

TEST(SyncBn, EmptyGlobalBatchAndSingleElement) {
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    SyncBnOptions o;
    o.mode = mode;
    // every rank empty: statistics 0, running statistics untouched, no NaN
    const Problem p = make_problem(2, 3, 2, 2, 3);
    const Inputs in(p, DType::kFloat32, Layout::kNCHW);
    for (const auto& r : run_group(p, in, {0, 0, 0}, o)) {
      EXPECT_EQ(to_vector(r.mean), std::vector<double>(3, 0.0));
      EXPECT_EQ(to_vector(r.invstd), std::vector<double>(3, 0.0));
      EXPECT_EQ(to_vector(r.rm), to_vector(make_tensor({3}, DType::kFloat32, p.rm)));
      EXPECT_EQ(to_vector(r.nbt)[0], 0.0);
    }
    // one element per channel in all: var 0, y = bias, running statistics untouched
    const Problem one = make_problem(1, 3, 1, 1, 4);
    const Inputs in1(one, DType::kFloat32, Layout::kNCHW);
    const auto rs = run_group(one, in1, {0, 0, 1}, o);
    for (const auto& r : rs) {
      EXPECT_EQ(to_vector(r.mean), to_vector(in1.x));
      EXPECT_EQ(to_vector(r.rv), to_vector(make_tensor({3}, DType::kFloat32, one.rv)));
      EXPECT_EQ(to_vector(r.nbt)[0], 0.0);
    }
    EXPECT_EQ(to_vector(rs[1].y), to_vector(make_tensor({3}, DType::kFloat32, one.bias)));
    for (double v : to_vector(rs[1].dx)) EXPECT_EQ(v, 0.0);
  }
}

TEST(SyncBn, CumulativeAverageWithoutMomentum) {
  const Problem a = make_problem(2, 2, 3, 3, 10), b = make_problem(2, 2, 3, 3, 11);
  SyncBnOptions o;
  o.momentum.reset();
  const Tensor rm = Tensor::zeros({2}, DType::kFloat64), rv = make_tensor({2}, DType::kFloat64, {1.0, 1.0});
  const Tensor nbt = Tensor::zeros({1}, DType::kInt64);
  const Tensor m = Tensor::zeros({2}, DType::kFloat64), is = Tensor::zeros({2}, DType::kFloat64);
  std::vector<double> means[2];
  int i = 0;
  for (const Problem* p : {&a, &b}) {
    const Tensor x = make_tensor({2, 2, 3, 3}, DType::kFloat64, p->x), y = Tensor::zeros({2, 2, 3, 3}, DType::kFloat64);
    sync_batch_norm_forward(x, SyncBnParams{{}, {}, rm, rv, nbt}, y, m, is, nullptr, o);
    means[i++] = to_vector(m);
  }
  EXPECT_EQ(to_vector(nbt)[0], 2.0);
  const auto got = to_vector(rm);
  for (std::size_t c = 0; c < 2; ++c) EXPECT_NEAR(got[c], (means[0][c] + means[1][c]) / 2, 1e-15);
}

TEST(SyncBn, BatchCounterSaturatesInsteadOfOverflowing) {
  const Problem a = make_problem(2, 2, 3, 3, 12);
  SyncBnOptions o;
  o.momentum.reset();
  const Tensor rm = Tensor::zeros({2}, DType::kFloat64), rv = make_tensor({2}, DType::kFloat64, {1.0, 1.0});
  Tensor nbt = Tensor::zeros({1}, DType::kInt64);
  nbt.data<std::int64_t>()[0] = std::numeric_limits<std::int64_t>::max();
  const Tensor m = Tensor::zeros({2}, DType::kFloat64), is = Tensor::zeros({2}, DType::kFloat64);
  const Tensor x = make_tensor({2, 2, 3, 3}, DType::kFloat64, a.x), y = Tensor::zeros({2, 2, 3, 3}, DType::kFloat64);
  sync_batch_norm_forward(x, SyncBnParams{{}, {}, rm, rv, nbt}, y, m, is, nullptr, o);
  EXPECT_EQ(nbt.data<std::int64_t>()[0], std::numeric_limits<std::int64_t>::max());
  for (double v : to_vector(rv)) EXPECT_NEAR(v, 1.0, 1e-15);  // factor 1 / INT64_MAX
}

TEST(SyncBn, EvaluationModeUsesRunningStatistics) {
  const Problem p = make_problem(2, 3, 4, 5, 8);
  const Tensor x = make_tensor({2, 3, 4, 5}, DType::kFloat64, p.x), dy = make_tensor({2, 3, 4, 5}, DType::kFloat64, p.dy);
  const Tensor w = make_tensor({3}, DType::kFloat64, p.weight), b = make_tensor({3}, DType::kFloat64, p.bias);
  const Tensor rm = make_tensor({3}, DType::kFloat64, p.rm), rv = make_tensor({3}, DType::kFloat64, p.rv);
  const Tensor y = Tensor::zeros({2, 3, 4, 5}, DType::kFloat64), dx = Tensor::zeros({2, 3, 4, 5}, DType::kFloat64);
  const Tensor m = Tensor::zeros({3}, DType::kFloat64), is = Tensor::zeros({3}, DType::kFloat64);
  SyncBnOptions o;
  o.training = false;
  ThreadGroup never(2, std::chrono::milliseconds(200));  // evaluation never communicates: one rank
  auto comm = never.communicator(0);                       // alone must not block (nor time out)
  sync_batch_norm_forward(x, SyncBnParams{w, b, rm, rv, {}}, y, m, is, comm.get(), o);
  sync_batch_norm_backward(dy, x, w, m, is, dx, {}, {}, comm.get(), o);
  const auto yv = to_vector(y), dxv = to_vector(dx);
  for (std::size_t i = 0; i < p.x.size(); ++i) {
    const std::size_t c = (i / 20) % 3;
    const double invstd = 1.0 / std::sqrt(p.rv[c] + 1e-5);
    EXPECT_NEAR(yv[i], (p.x[i] - p.rm[c]) * invstd * p.weight[c] + p.bias[c], 1e-14);
    EXPECT_NEAR(dxv[i], p.dy[i] * p.weight[c] * invstd, 1e-14);
  }
  EXPECT_EQ(to_vector(rm), p.rm);  // untouched
}

TEST(SyncBn, NonFiniteInputGivesNaNStatistics) {
  Problem p = make_problem(1, 2, 2, 2, 21);
  p.x[1] = std::numeric_limits<double>::infinity();
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    SyncBnOptions o;
    o.mode = mode;
    const Inputs in(p, DType::kFloat32, Layout::kNCHW);
    const Result r = run(p, in, 0, 1, nullptr, o);
    const auto m = to_vector(r.mean);
    EXPECT_FALSE(std::isfinite(m[0]));
    EXPECT_TRUE(std::isfinite(m[1]));
  }
}

// ---------------------------------------------------------------------------------------------
// The shared math

TEST(SyncBnMath, RankMergeEqualsThePairwiseTree) {
  // sbn_global_moments merges ranks with a stack; it must equal sbn_tree_reduce's tree
  for (std::int64_t ranks = 1; ranks <= 70; ++ranks) {
    const std::int64_t C = 1, words = detail::sbn_record_words(C, false);
    std::vector<std::int64_t> gathered(static_cast<std::size_t>(ranks * words));
    std::vector<detail::SbnMoments> tree;
    const auto v = random_values(static_cast<std::size_t>(3 * ranks), 1000 + ranks);
    for (std::int64_t r = 0; r < ranks; ++r) {
      const detail::SbnMoments m{1 + r % 7, v[3 * r] * 100, std::abs(v[3 * r + 1])};
      tree.push_back(m);
      gathered[r * words] = m.n;
      gathered[r * words + 1] = detail::sbn_double_word(m.mean);
      gathered[r * words + 2] = detail::sbn_double_word(m.m2);
    }
    detail::SbnFinalizeArgs a{};
    a.gathered = gathered.data(), a.ranks = ranks, a.words = words, a.channels = C;
    const detail::SbnMoments s = detail::sbn_global_moments(a, 0);
    const detail::SbnMoments t = detail::sbn_tree_reduce(tree.data(), ranks, detail::SbnMoments{0, 0.0, 0.0});
    EXPECT_EQ(s.n, t.n) << ranks;
    EXPECT_EQ(detail::sbn_double_word(s.mean), detail::sbn_double_word(t.mean)) << ranks;
    EXPECT_EQ(detail::sbn_double_word(s.m2), detail::sbn_double_word(t.m2)) << ranks;
  }
}

TEST(SyncBnMath, FixedPointConversionsAreCorrectlyRounded) {
  using detail::sbn_i128;
  EXPECT_EQ(detail::sbn_i128_to_double(0), 0.0);
  EXPECT_EQ(detail::sbn_i128_to_double(-5), -5.0);
  const sbn_i128 big = (static_cast<sbn_i128>(1) << 100) + 1;  // rounds down to 2^100
  EXPECT_EQ(detail::sbn_i128_to_double(big), std::ldexp(1.0, 100));
  // 2^60 + 2^7 + 1: above the halfway point 2^7 of the 53-bit grid -> rounds up (sticky bit)
  const sbn_i128 up = (static_cast<sbn_i128>(1) << 60) + (1 << 7) + 1;
  EXPECT_EQ(detail::sbn_i128_to_double(up), std::ldexp(1.0, 60) + 256.0);
  // exactly halfway with an even neighbour -> ties to even (down)
  const sbn_i128 tie = (static_cast<sbn_i128>(1) << 60) + (1 << 7);
  EXPECT_EQ(detail::sbn_i128_to_double(tie), std::ldexp(1.0, 60));
  const sbn_i128 s70 = (static_cast<sbn_i128>(3) << 70) + 12345;
  EXPECT_EQ(detail::sbn_i128_to_double(-s70), -static_cast<double>(static_cast<long double>(s70)));
  // n * S2 - S1^2 for q = {1, 2, 3, 4}: 4 * 30 - 100 = 20
  EXPECT_EQ(detail::sbn_exact_var_numerator(4, 10, 30), 20.0);
  // large values: q = 2^44 - 1 repeated: variance 0 exactly
  const std::int64_t q = (std::int64_t{1} << 44) - 1;
  const sbn_i128 n = 1000;
  EXPECT_EQ(detail::sbn_exact_var_numerator(1000, n * q, n * q * q), 0.0);
  EXPECT_EQ(detail::sbn_exponent(1.0), 1);
  EXPECT_EQ(detail::sbn_exponent(0.75), 0);
  EXPECT_EQ(detail::sbn_exponent(0.0), detail::kSbnZeroExponent);
  EXPECT_EQ(detail::sbn_exponent(std::nan("")), detail::kSbnNonFiniteExponent);
  EXPECT_EQ(detail::sbn_quantize(0.5, 1), std::int64_t{1} << 42);
}

// ---------------------------------------------------------------------------------------------
// The phases API, driven by hand for two simulated ranks, equals the one-call group

TEST(SyncBnPhases, HandDrivenTwoRanksEqualTheOneCallGroup) {
  const Problem p = make_problem(3, 4, 5, 6, 31);
  const Inputs in(p, DType::kFloat32, Layout::kNCHW);
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    SyncBnOptions o;
    o.mode = mode;
    const auto group = run_group(p, in, {0, 1, 3}, o);
    const std::int64_t C = p.C, words = sync_batch_norm_record_words(C, mode);
    const TensorView xs[2] = {slice(in.x, 0, 1), slice(in.x, 1, 3)};
    const TensorView dys[2] = {slice(in.dy, 0, 1), slice(in.dy, 1, 3)};
    const bool exact = mode == SyncBnMode::kExact;
    // forward
    Tensor scales = Tensor::zeros({C}, DType::kInt64);
    if (exact) {
      Tensor all = Tensor::zeros({2, C}, DType::kInt64);
      for (int r = 0; r < 2; ++r) {
        TensorView row = all.view();
        row.rank = 1, row.sizes[0] = C, row.strides[0] = 1;
        row.data = all.data<std::int64_t>() + r * C;
        sync_batch_norm_local_scales(xs[r], {}, {}, row);
      }
      sync_batch_norm_merge_scales(all, scales);
    }
    Tensor gathered = Tensor::zeros({2, words}, DType::kInt64);
    for (int r = 0; r < 2; ++r) {
      TensorView row = gathered.view();
      row.rank = 1, row.sizes[0] = words, row.strides[0] = 1;
      row.data = gathered.data<std::int64_t>() + r * words;
      sync_batch_norm_local_stats(xs[r], row, mode, exact ? scales.view() : TensorView{});
    }
    const Tensor w = make_tensor({C}, DType::kFloat32, p.weight), b = make_tensor({C}, DType::kFloat32, p.bias);
    const Tensor rm = make_tensor({C}, DType::kFloat32, p.rm), rv = make_tensor({C}, DType::kFloat32, p.rv);
    const Tensor nbt = Tensor::zeros({1}, DType::kInt64);
    const Tensor mean = Tensor::zeros({C}, DType::kFloat64), invstd = Tensor::zeros({C}, DType::kFloat64);
    const SyncBnParams params{w, b, rm, rv, nbt};
    sync_batch_norm_finalize_stats(gathered, params, mean, invstd, o, exact ? scales.view() : TensorView{});
    EXPECT_TRUE(same_bytes(mean, group[0].mean));
    EXPECT_TRUE(same_bytes(invstd, group[0].invstd));
    EXPECT_TRUE(same_bytes(rv, group[0].rv));
    const Tensor y1 = Tensor::zeros({2, C, p.H, p.W}, DType::kFloat32);
    sync_batch_norm_apply(xs[1], params, mean, invstd, y1);
    EXPECT_TRUE(same_bytes(y1, group[1].y));
    // backward
    Tensor bscales = Tensor::zeros({2 * C}, DType::kInt64);
    if (exact) {
      Tensor all = Tensor::zeros({2, 2 * C}, DType::kInt64);
      for (int r = 0; r < 2; ++r) {
        TensorView row = all.view();
        row.rank = 1, row.sizes[0] = 2 * C, row.strides[0] = 1;
        row.data = all.data<std::int64_t>() + r * 2 * C;
        sync_batch_norm_local_scales(xs[r], dys[r], mean, row);
      }
      sync_batch_norm_merge_scales(all, bscales);
    }
    Tensor bg = Tensor::zeros({2, words}, DType::kInt64);
    for (int r = 0; r < 2; ++r) {
      TensorView row = bg.view();
      row.rank = 1, row.sizes[0] = words, row.strides[0] = 1;
      row.data = bg.data<std::int64_t>() + r * words;
      sync_batch_norm_local_backward(dys[r], xs[r], mean, row, mode, exact ? bscales.view() : TensorView{});
    }
    const Tensor sums = Tensor::zeros({2 * C + 1}, DType::kFloat64);
    const Tensor dw = Tensor::zeros({C}, DType::kFloat32), db = Tensor::zeros({C}, DType::kFloat32);
    sync_batch_norm_finalize_backward(bg, 1, mode, invstd, sums, dw, db, exact ? bscales.view() : TensorView{});
    EXPECT_TRUE(same_bytes(dw, group[1].dw));
    EXPECT_TRUE(same_bytes(db, group[1].db));
    EXPECT_EQ(to_vector(sums)[static_cast<std::size_t>(2 * C)], static_cast<double>(3 * p.H * p.W));
    const Tensor dx1 = Tensor::zeros({2, C, p.H, p.W}, DType::kFloat32);
    sync_batch_norm_backward_apply(dys[1], xs[1], w, mean, invstd, sums, dx1);
    EXPECT_TRUE(same_bytes(dx1, group[1].dx));
  }
}

/// Views of rows of an int64 [rows, words] tensor, and of a [n] prefix of a float64 tensor.
TensorView row_of(const Tensor& t, std::int64_t r) {
  TensorView row = t.view();
  row.rank = 1, row.sizes[0] = t.view().sizes[1], row.strides[0] = 1;
  row.data = const_cast<std::int64_t*>(t.data<std::int64_t>()) + r * row.sizes[0];
  return row;
}

// Regressions found by the sync_bn_phases fuzz target (tests/fuzz/regressions/sync_bn_phases/):
// finalize on gathered words that no local_stats wrote must not overflow (undefined behaviour)
// and must not pass garbage off as statistics.
TEST(SyncBnPhases, GarbageCountsGiveNaNStatisticsAndUpdateNothing) {
  const std::int64_t C = 2;
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    const bool exact = mode == SyncBnMode::kExact;
    const std::int64_t words = sync_batch_norm_record_words(C, mode);
    SyncBnOptions o;
    o.mode = mode;
    const Tensor scales = make_tensor({C}, DType::kInt64, {3.0, 3.0});
    // negative count; counts whose sum overflows int64; a count of INT64_MIN
    const std::int64_t cases[][2] = {{-1, 5}, {std::numeric_limits<std::int64_t>::max(), 2},
                                     {std::int64_t{1} << 62, std::int64_t{1} << 62},
                                     {std::numeric_limits<std::int64_t>::min(), 3}};
    for (const auto& counts : cases) {
      Tensor gathered = Tensor::zeros({2, words}, DType::kInt64);
      std::int64_t* g = gathered.data<std::int64_t>();
      for (std::int64_t i = 0; i < 2 * words; ++i) g[i] = std::numeric_limits<std::int64_t>::max();  // i128 sums overflow too
      g[0] = counts[0], g[words] = counts[1];
      const Tensor rm = make_tensor({C}, DType::kFloat32, {1.0, 2.0}), rv = make_tensor({C}, DType::kFloat32, {3.0, 4.0});
      const Tensor nbt = Tensor::zeros({1}, DType::kInt64);
      const Tensor mean = Tensor::zeros({C}, DType::kFloat64), invstd = Tensor::zeros({C}, DType::kFloat64);
      sync_batch_norm_finalize_stats(gathered, SyncBnParams{{}, {}, rm, rv, nbt}, mean, invstd, o,
                                     exact ? scales.view() : TensorView{});
      for (double v : to_vector(mean)) EXPECT_TRUE(std::isnan(v)) << counts[0] << " " << counts[1];
      for (double v : to_vector(invstd)) EXPECT_TRUE(std::isnan(v));
      EXPECT_EQ(to_vector(rm), (std::vector<double>{1.0, 2.0}));
      EXPECT_EQ(to_vector(rv), (std::vector<double>{3.0, 4.0}));
      EXPECT_EQ(nbt.data<std::int64_t>()[0], 0);
      const Tensor sums = Tensor::zeros({2 * C + 1}, DType::kFloat64), invstd1 = make_tensor({C}, DType::kFloat64, {1.0, 1.0});
      const Tensor bscales = make_tensor({2 * C}, DType::kInt64, {3.0, 3.0, 3.0, 3.0});
      sync_batch_norm_finalize_backward(gathered, 1, mode, invstd1, sums, {}, {}, exact ? bscales.view() : TensorView{});
      EXPECT_TRUE(std::isnan(to_vector(sums)[static_cast<std::size_t>(2 * C)]));
      // a NaN count gives NaN gradients (not the evaluation-mode formula)
      const Tensor x = Tensor::zeros({1, C, 1, 1}, DType::kFloat32), dy = make_tensor({1, C, 1, 1}, DType::kFloat32, {1.0, 1.0});
      const Tensor dx = Tensor::zeros({1, C, 1, 1}, DType::kFloat32);
      sync_batch_norm_backward_apply(dy, x, {}, Tensor::zeros({C}, DType::kFloat64), invstd1, sums, dx);
      for (double v : to_vector(dx)) EXPECT_TRUE(std::isnan(v));
    }
  }
}

/// The exact mode's local phases by their definition (sync_batch_norm_math.h), element by
/// element in 128-bit integers: the exponents, and the records [count, (S1, S2) per channel]
/// (forward: q(x), q(x)^2; backward: q(dy), q(dy (x - mean))).
struct ExactRef {
  std::vector<std::int64_t> scales, record;
};
ExactRef exact_reference(const Problem& p, const std::vector<double>& x, const std::vector<double>* dy,
                         const std::vector<double>& mean, const std::vector<std::int64_t>* given_scales) {
  const std::int64_t HW = p.H * p.W, C = p.C;
  const bool bwd = dy != nullptr;
  ExactRef r;
  r.scales.assign(static_cast<std::size_t>(bwd ? 2 * C : C), 0);
  r.record.assign(static_cast<std::size_t>(1 + 4 * C), 0);
  r.record[0] = p.N * HW;
  auto value = [&](int which, std::int64_t c, std::size_t i) {
    return which == 0 ? (bwd ? (*dy)[i] : x[i]) : (*dy)[i] * (x[i] - mean[static_cast<std::size_t>(c)]);
  };
  for (std::int64_t c = 0; c < C; ++c)
    for (int which = 0; which < (bwd ? 2 : 1); ++which) {
      double m = 0.0;
      bool bad = false;
      for (std::int64_t n = 0; n < p.N; ++n)
        for (std::int64_t q = 0; q < HW; ++q) {
          const double a = std::fabs(value(which, c, static_cast<std::size_t>((n * C + c) * HW + q)));
          if (!(a <= std::numeric_limits<double>::max())) bad = true;
          else m = std::max(m, a);
        }
      r.scales[static_cast<std::size_t>(which * C + c)] = bad ? detail::kSbnNonFiniteExponent : detail::sbn_exponent(m);
    }
  const std::vector<std::int64_t>& sc = given_scales ? *given_scales : r.scales;
  for (std::int64_t c = 0; c < C; ++c) {
    detail::sbn_i128 a = 0, b = 0;
    for (std::int64_t n = 0; n < p.N; ++n)
      for (std::int64_t q = 0; q < HW; ++q) {
        const auto i = static_cast<std::size_t>((n * C + c) * HW + q);
        const std::int64_t q0 = detail::sbn_quantize(value(0, c, i), sc[static_cast<std::size_t>(c)]);
        a = detail::sbn_add_i128(a, q0);
        if (bwd) b = detail::sbn_add_i128(b, detail::sbn_quantize(value(1, c, i), sc[static_cast<std::size_t>(C + c)]));
        else b = detail::sbn_add_i128(b, static_cast<detail::sbn_i128>(q0) * q0);
      }
    detail::sbn_store_i128(a, r.record.data() + 1 + 4 * c);
    detail::sbn_store_i128(b, r.record.data() + 3 + 4 * c);
  }
  return r;
}

std::vector<std::int64_t> int64_values(const Tensor& t) {
  return std::vector<std::int64_t>(t.data<std::int64_t>(), t.data<std::int64_t>() + t.numel());
}

TEST(SyncBnPhases, ExactLocalPhasesEqualTheirDefinitionBitForBit) {
  // the three CPU walks (per plane, small planes, channels last), every dtype, every
  // instruction-set variant; exponents from local_scales, and given by hand: too small for the
  // data (quantized values clamp at 2^51, past the fast paths' 2^44), the two sentinels and a
  // garbage word
  Problem special = make_problem(2, 6, 9, 29, 12);
  special.x[3] = std::numeric_limits<double>::infinity();
  special.dy[40] = std::numeric_limits<double>::quiet_NaN();
  std::vector<CpuIsa> isas = {CpuIsa::kBaseline};
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (static_cast<int>(isa) <= static_cast<int>(cpu_isa_supported())) isas.push_back(isa);
  for (const Problem& p : {make_problem(3, 20, 15, 20, 5), make_problem(2, 530, 3, 5, 6), make_problem(3, 5, 23, 25, 7),
                           special})
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64})
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
        const Inputs in(p, dt, layout);
        const std::vector<double> x = to_vector(in.x), dy = to_vector(in.dy);
        std::vector<double> mean(static_cast<std::size_t>(p.C));
        for (std::size_t c = 0; c < mean.size(); ++c) mean[c] = 0.25 * static_cast<double>(c) - 0.5;
        const Tensor mean_t = make_tensor({p.C}, DType::kFloat64, mean);
        for (int bwd = 0; bwd < 2; ++bwd) {
          const ExactRef def = exact_reference(p, x, bwd ? &dy : nullptr, mean, nullptr);
          std::vector<std::vector<std::int64_t>> scale_sets = {def.scales};
          std::vector<std::int64_t> small = def.scales, special_words = def.scales;
          for (std::size_t i = 0; i < small.size(); ++i) {
            if (detail::sbn_finite_exponent(small[i])) small[i] -= 12;  // |q| up to 2^56 -> clamped at 2^51
            special_words[i] = i % 3 == 0 ? detail::kSbnZeroExponent
                                          : i % 3 == 1 ? detail::kSbnNonFiniteExponent : std::int64_t{77777};
          }
          scale_sets.push_back(small);
          scale_sets.push_back(special_words);
          for (CpuIsa isa : isas) {
            Context ctx;
            ctx.cpu_isa = isa;
            ctx.num_threads = 2;
            const std::string what = std::string(cpu_isa_name(isa)) + " " + std::string(dtype_name(dt)) +
                                     (layout == Layout::kNHWC ? " NHWC" : " NCHW") + (bwd ? " backward" : " forward") +
                                     " C=" + std::to_string(p.C);
            Tensor scales = Tensor::zeros({static_cast<std::int64_t>(def.scales.size())}, DType::kInt64);
            sync_batch_norm_local_scales(in.x, bwd ? in.dy.view() : TensorView{}, bwd ? mean_t.view() : TensorView{},
                                         scales, ctx);
            EXPECT_EQ(int64_values(scales), def.scales) << what << ": scales";
            for (std::size_t k = 0; k < scale_sets.size(); ++k) {
              const std::vector<std::int64_t>& sc = scale_sets[k];
              const ExactRef want = exact_reference(p, x, bwd ? &dy : nullptr, mean, &sc);
              Tensor given = Tensor::zeros({static_cast<std::int64_t>(sc.size())}, DType::kInt64);
              std::copy(sc.begin(), sc.end(), given.data<std::int64_t>());
              Tensor record = Tensor::zeros({1 + 4 * p.C}, DType::kInt64);
              if (bwd) sync_batch_norm_local_backward(in.dy, in.x, mean_t, record, SyncBnMode::kExact, given, ctx);
              else sync_batch_norm_local_stats(in.x, record, SyncBnMode::kExact, given, ctx);
              EXPECT_EQ(int64_values(record), want.record) << what << ", exponent set " << k;
            }
          }
        }
      }
}

TEST(SyncBnPhases, ExactTotalCountOfTwoToThe39GivesNaNStatistics) {
  // Two ranks of 2^38 elements each: valid records (zero sums) whose total reaches the exact
  // mode's limit; the default mode takes the same counts.
  const std::int64_t C = 2, half = std::int64_t{1} << 38;
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    for (std::int64_t second : {half - 1, half}) {
      const std::int64_t words = sync_batch_norm_record_words(C, mode);
      Tensor gathered = Tensor::zeros({2, words}, DType::kInt64);
      gathered.data<std::int64_t>()[0] = half;
      gathered.data<std::int64_t>()[words] = second;
      SyncBnOptions o;
      o.mode = mode;
      const Tensor scales = make_tensor({C}, DType::kInt64, {3.0, 3.0});
      const Tensor rm = make_tensor({C}, DType::kFloat32, {1.0, 2.0}), rv = make_tensor({C}, DType::kFloat32, {3.0, 4.0});
      const Tensor nbt = Tensor::zeros({1}, DType::kInt64);
      const Tensor mean = Tensor::zeros({C}, DType::kFloat64), invstd = Tensor::zeros({C}, DType::kFloat64);
      sync_batch_norm_finalize_stats(gathered, SyncBnParams{{}, {}, rm, rv, nbt}, mean, invstd, o,
                                     mode == SyncBnMode::kExact ? scales.view() : TensorView{});
      const bool over = mode == SyncBnMode::kExact && second == half;
      for (double v : to_vector(mean)) EXPECT_EQ(std::isnan(v), over) << second;
      EXPECT_EQ(nbt.data<std::int64_t>()[0], over ? 0 : 1);
      if (over) {
        EXPECT_EQ(to_vector(rm), (std::vector<double>{1.0, 2.0}));
        EXPECT_EQ(to_vector(rv), (std::vector<double>{3.0, 4.0}));
      }
    }
  }
}

/// Rank 0 of a 2-rank group whose other rank is simulated: every all-gather returns this rank's
/// bytes twice, word `word` of the second copy of the first gather (the header) replaced.
class FakePeer final : public Communicator {
 public:
  FakePeer(std::size_t word, std::int64_t value) : word_(word), value_(value) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_gather(const void* send, void* recv, std::size_t bytes, Device, void*) override {
    std::memcpy(recv, send, bytes);
    std::memcpy(static_cast<char*>(recv) + bytes, send, bytes);
    if (calls_++ == 0 && (word_ + 1) * 8 <= bytes)
      std::memcpy(static_cast<char*>(recv) + bytes + 8 * word_, &value_, 8);
  }
  bool accepts_device_memory() const override { return false; }
  const char* name() const override { return "fake peer"; }

 private:
  std::size_t word_;
  std::int64_t value_;
  int calls_ = 0;
};

TEST(SyncBnRanks, ExactForwardChecksTheTotalCountInTheHeader) {
  // the header's word 5 is the rank's count N*H*W (src/sync_batch_norm.cpp, Header): the
  // simulated rank claims 2^39 - 8 elements, this rank holds 8
  const Problem p = make_problem(2, 3, 2, 2, 31);
  const Inputs in(p, DType::kFloat32, Layout::kNCHW);
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    SyncBnOptions o;
    o.mode = mode;
    FakePeer peer(5, (std::int64_t{1} << 39) - 8);
    if (mode == SyncBnMode::kExact) {
      try {
        run(p, in, 0, p.N, &peer, o);
        ADD_FAILURE() << "expected an error";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("2^39"), std::string::npos) << e.what();
      }
      FakePeer below(5, (std::int64_t{1} << 39) - 9);  // one element fewer in total: accepted
      EXPECT_NO_THROW(run(p, in, 0, p.N, &below, o));
    } else {
      EXPECT_NO_THROW(run(p, in, 0, p.N, &peer, o));  // the default mode has no such limit
    }
  }
}

/// Records the first all-gather's send buffer (the header) and answers with two copies of it.
class HeaderTap final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_gather(const void* send, void* recv, std::size_t bytes, Device, void*) override {
    if (sent.empty()) sent.assign(static_cast<const std::int64_t*>(send), static_cast<const std::int64_t*>(send) + bytes / 8);
    std::memcpy(recv, send, bytes);
    std::memcpy(static_cast<char*>(recv) + bytes, send, bytes);
  }
  bool accepts_device_memory() const override { return false; }
  const char* name() const override { return "header tap"; }
  std::vector<std::int64_t> sent;
};

// One copy of the protocol: the header the one-call API exchanges is sync_batch_norm_header's,
// word for word (the phase drivers, detops_torch's SyncBatchNorm, send the same).
TEST(SyncBnHeaders, OneCallApiSendsThePhaseDriversHeader) {
  const Problem p = make_problem(2, 3, 2, 2, 33);
  const Inputs in(p, DType::kFloat32, Layout::kNCHW);
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    SyncBnOptions o;
    o.mode = mode;
    o.eps = 1e-3;
    o.momentum = std::nullopt;
    HeaderTap tap;
    run(p, in, 0, p.N, &tap, o);
    ASSERT_EQ(tap.sent.size(), static_cast<std::size_t>(kSyncBnHeaderWords));
    std::vector<std::int64_t> want(static_cast<std::size_t>(kSyncBnHeaderWords));
    SyncBnCall call;
    call.parts[0] = true;  // run() passes weight/bias and running statistics
    call.parts[1] = true;
    sync_batch_norm_header(in.x, call, o, /*sequence=*/1, /*failed=*/false, want.data());
    EXPECT_EQ(tap.sent, want);
    EXPECT_NO_THROW(sync_batch_norm_check_headers("test", tap.sent.data(), 1));
  }
}

/// Two ranks' headers, rank 1's made by `change` from rank 0's call.
std::vector<std::int64_t> two_headers(const TensorView& x0, const TensorView& x1, const SyncBnCall& c0,
                                      const SyncBnCall& c1, const SyncBnOptions& o0, const SyncBnOptions& o1,
                                      bool failed1 = false, std::int64_t seq1 = 0) {
  std::vector<std::int64_t> h(static_cast<std::size_t>(2 * kSyncBnHeaderWords));
  sync_batch_norm_header(x0, c0, o0, 0, false, h.data());
  sync_batch_norm_header(x1, c1, o1, seq1, failed1, h.data() + kSyncBnHeaderWords);
  return h;
}

std::string check_error(const std::vector<std::int64_t>& h, ErrorCode code) {
  try {
    sync_batch_norm_check_headers("SyncBatchNorm forward", h.data(), static_cast<int>(h.size() / kSyncBnHeaderWords));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(SyncBnHeaders, CheckNamesEveryDisagreement) {
  const Tensor x4 = Tensor::zeros({2, 4, 3, 3}, DType::kFloat32), x5 = Tensor::zeros({2, 5, 3, 3}, DType::kFloat32);
  const Tensor x16 = Tensor::zeros({2, 4, 3, 3}, DType::kFloat16);
  const SyncBnCall fwd{}, bwd{true, {true, false, false}};
  SyncBnCall affine;
  affine.parts[0] = true;
  const SyncBnOptions o;
  SyncBnOptions exact, eps, no_momentum, eval;
  exact.mode = SyncBnMode::kExact;
  eps.eps = 1e-3;
  no_momentum.momentum = std::nullopt;
  eval.training = false;
  EXPECT_NO_THROW(sync_batch_norm_check_headers("t", two_headers(x4, x4, fwd, fwd, o, o).data(), 2));
  const ErrorCode comm = ErrorCode::kCommunication;
  auto has = [](const std::string& msg, const char* part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  has(check_error(two_headers(x4, x5, fwd, fwd, o, o), comm), "the ranks disagree on the channel count: rank 0 has 4, rank 1 has 5");
  has(check_error(two_headers(x4, x4, fwd, fwd, o, exact), comm), "exact mode");
  has(check_error(two_headers(x4, x16, fwd, fwd, o, o), comm), "float16");
  has(check_error(two_headers(x4, x4, fwd, bwd, o, o), comm), "rank 1 runs backward");
  has(check_error(two_headers(x4, x4, fwd, affine, o, o), comm), "weight/bias given");
  has(check_error(two_headers(x4, x4, fwd, fwd, o, eval), comm), "evaluation");
  has(check_error(two_headers(x4, x4, fwd, fwd, o, eps), comm), "eps: rank 0 has 1e-05, rank 1 has 0.001");
  has(check_error(two_headers(x4, x4, fwd, fwd, o, no_momentum), comm), "momentum: rank 0 has 0.1, rank 1 has None");
  has(check_error(two_headers(x4, x4, fwd, fwd, o, o, false, 3), comm), "different calls");
  // a failed rank (its x may be anything) is reported before any field
  has(check_error(two_headers(x4, TensorView{}, fwd, fwd, o, o, true), comm), "rank 1 of 2 failed its argument checks");
  // not a header of this version
  std::vector<std::int64_t> h = two_headers(x4, x4, fwd, fwd, o, o);
  h[static_cast<std::size_t>(kSyncBnHeaderWords)] ^= 1;
  has(check_error(h, comm), "rank 1 of 2 is not in a detops SyncBatchNorm call of this version");
  // the exact forward's total count
  const Tensor big = Tensor::zeros({2, 1, 1, 1}, DType::kFloat32);
  h = two_headers(big, big, fwd, fwd, exact, exact);
  h[5] = (std::int64_t{1} << 39) - 2;
  has(check_error(h, ErrorCode::kInvalidArgument), "2^39");
  h[5] = (std::int64_t{1} << 39) - 3;
  EXPECT_NO_THROW(sync_batch_norm_check_headers("t", h.data(), 2));
  // bad arguments
  has(check_error({}, ErrorCode::kInvalidArgument), "expected [ranks >= 1, 8] int64 words");
  EXPECT_THROW(sync_batch_norm_header(x4, fwd, o, 0, false, nullptr), Error);
}

TEST(SyncBnPhases, ExponentsOutsideTheSentinelRangeAreDefined) {
  // exponents no local_scales can give (it gives -1073..1024 and the two sentinels): records
  // quantize to 0 and the statistics are NaN, without the int conversions overflowing
  const std::int64_t C = 1;
  const Tensor x = make_tensor({2, C, 1, 1}, DType::kFloat32, {1.0, 2.0});
  for (std::int64_t e : {std::int64_t{1100}, std::int64_t{-1100}, std::int64_t{2147483647}, std::int64_t{-2147483648LL},
                         std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min(),
                         detail::kSbnNonFiniteExponent + 1, detail::kSbnZeroExponent - 1}) {
    const Tensor scales = make_tensor({C}, DType::kInt64, {0.0});
    scales.data<std::int64_t>()[0] = e;
    const std::int64_t words = sync_batch_norm_record_words(C, SyncBnMode::kExact);
    Tensor gathered = Tensor::zeros({1, words}, DType::kInt64);
    sync_batch_norm_local_stats(x, row_of(gathered, 0), SyncBnMode::kExact, scales);
    std::int64_t* g = gathered.data<std::int64_t>();
    EXPECT_EQ(g[0], 2);
    for (std::int64_t i = 1; i < words; ++i) EXPECT_EQ(g[i], 0) << e;
    g[1] = 12345;  // a non-zero sum with that exponent
    SyncBnOptions o;
    o.mode = SyncBnMode::kExact;
    const Tensor mean = Tensor::zeros({C}, DType::kFloat64), invstd = Tensor::zeros({C}, DType::kFloat64);
    sync_batch_norm_finalize_stats(gathered, SyncBnParams{}, mean, invstd, o, scales);
    EXPECT_TRUE(std::isnan(to_vector(mean)[0])) << e;
    EXPECT_TRUE(std::isnan(to_vector(invstd)[0])) << e;
  }
  // the valid extremes still work: 2^-1074 and DBL_MAX
  EXPECT_EQ(detail::sbn_exponent(std::numeric_limits<double>::denorm_min()), detail::kSbnMinExponent);
  EXPECT_EQ(detail::sbn_exponent(std::numeric_limits<double>::max()), detail::kSbnMaxExponent);
}

TEST(SyncBnPhases, WordCountsThatOverflowAreRejected) {
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(sync_batch_norm_record_words((big - 1) / 4, SyncBnMode::kExact), 1 + 4 * ((big - 1) / 4));
  EXPECT_EQ(sync_batch_norm_record_words((big - 1) / 2, SyncBnMode::kDefault), 1 + 2 * ((big - 1) / 2));
  EXPECT_EQ(sync_batch_norm_scale_words(big / 2, true), 2 * (big / 2));
  EXPECT_EQ(sync_batch_norm_scale_words(big, false), big);
  for (auto f : std::vector<std::function<void()>>{[&] { sync_batch_norm_record_words((big - 1) / 4 + 1, SyncBnMode::kExact); },
                                                   [&] { sync_batch_norm_record_words(big / 2 + 1, SyncBnMode::kDefault); },
                                                   [&] { sync_batch_norm_record_words(big, SyncBnMode::kExact); },
                                                   [&] { sync_batch_norm_scale_words(big / 2 + 1, true); }}) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
}

TEST(SyncBnPhases, FinalizeBackwardWritesTheCountWithNoChannels) {
  const Tensor gathered = make_tensor({2, 1}, DType::kInt64, {3.0, 4.0});
  const Tensor sums = make_tensor({1}, DType::kFloat64, {-1.0});
  sync_batch_norm_finalize_backward(gathered, 0, SyncBnMode::kDefault, Tensor::zeros({0}, DType::kFloat64), sums, {}, {});
  EXPECT_EQ(to_vector(sums)[0], 7.0);
}

TEST(SyncBnPhases, OutputsSharingBytesWithOtherArgumentsAreRejected) {
  // found by the fuzz target: grad_weight inside sums gave wrong sums; the phases now reject
  // what the one-call path never does (an output sharing bytes with another tensor of the call)
  const std::int64_t C = 2, words = sync_batch_norm_record_words(C, SyncBnMode::kDefault);
  const Tensor gathered = Tensor::zeros({1, words}, DType::kInt64);
  const Tensor invstd = make_tensor({C}, DType::kFloat64, {1.0, 1.0});
  const Tensor sums = Tensor::zeros({2 * C + 1}, DType::kFloat64);
  TensorView gw_in_sums = sums.view();
  gw_in_sums.sizes[0] = C;
  const Tensor gw = Tensor::zeros({C}, DType::kFloat64);
  auto expect_bad = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_bad([&] { sync_batch_norm_finalize_backward(gathered, 0, SyncBnMode::kDefault, invstd, sums, gw_in_sums, {}); },
             "grad_weight overlaps sums");
  expect_bad([&] { sync_batch_norm_finalize_backward(gathered, 0, SyncBnMode::kDefault, invstd, sums, gw, gw); },
             "grad_bias overlaps grad_weight");
  TensorView sums_in_gathered = gathered.view();
  sums_in_gathered.rank = 1, sums_in_gathered.sizes[0] = 2 * C + 1, sums_in_gathered.strides[0] = 1;
  sums_in_gathered.dtype = DType::kFloat64;
  expect_bad([&] { sync_batch_norm_finalize_backward(gathered, 0, SyncBnMode::kDefault, invstd, sums_in_gathered, {}, {}); },
             "sums overlaps gathered");
  const Tensor x = make_tensor({1, C, 1, 1}, DType::kFloat64, {1.0, 2.0});
  const Tensor mean = Tensor::zeros({C}, DType::kFloat64);
  TensorView y_on_mean = x.view();
  y_on_mean.data = mean.view().data;
  expect_bad([&] { sync_batch_norm_apply(x, SyncBnParams{}, mean, invstd, y_on_mean); }, "y overlaps save_mean");
  const Tensor big_x = Tensor::zeros({1, C, 2, 2}, DType::kFloat64);
  TensorView record_in_big_x = big_x.view();
  record_in_big_x.rank = 1, record_in_big_x.sizes[0] = words, record_in_big_x.strides[0] = 1;
  record_in_big_x.dtype = DType::kInt64;
  expect_bad([&] { sync_batch_norm_local_stats(big_x, record_in_big_x, SyncBnMode::kDefault); }, "record overlaps x");
}

// ---------------------------------------------------------------------------------------------
// Rank agreement, failing ranks, timeouts

/// Runs f(rank, comm) on `ranks` threads of one group and returns each rank's error code
/// (-1 when it returned normally) and message.
std::vector<std::pair<int, std::string>> on_group(int ranks, std::chrono::milliseconds timeout,
                                                  const std::function<void(int, Communicator*)>& f) {
  ThreadGroup group(ranks, timeout);
  std::vector<std::pair<int, std::string>> out(static_cast<std::size_t>(ranks), {-1, ""});
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      auto comm = group.communicator(r);
      try {
        f(r, comm.get());
      } catch (const Error& e) {
        out[static_cast<std::size_t>(r)] = {static_cast<int>(e.code()), e.what()};
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

struct Layer {
  Tensor x, y, mean, invstd, w, b;
  explicit Layer(std::int64_t C, DType dt = DType::kFloat32)
      : x(make_tensor({2, C, 3, 3}, dt, random_values(static_cast<std::size_t>(18 * C), 5))),
        y(Tensor::zeros({2, C, 3, 3}, dt)), mean(Tensor::zeros({C}, DType::kFloat64)),
        invstd(Tensor::zeros({C}, DType::kFloat64)), w(make_tensor({C}, DType::kFloat32, std::vector<double>(C, 1.0))),
        b(Tensor::zeros({C}, DType::kFloat32)) {}
  void forward(Communicator* comm, const SyncBnOptions& o = {}) {
    sync_batch_norm_forward(x, SyncBnParams{w, b, {}, {}, {}}, y, mean, invstd, comm, o);
  }
};

TEST(SyncBnRanks, DisagreementRaisesOnEveryRank) {
  const int comm_code = static_cast<int>(ErrorCode::kCommunication);
  // channels
  auto res = on_group(2, std::chrono::seconds(20), [](int r, Communicator* c) { Layer(r == 0 ? 4 : 5).forward(c); });
  for (const auto& e : res) {
    EXPECT_EQ(e.first, comm_code) << e.second;
    EXPECT_NE(e.second.find("channel count"), std::string::npos) << e.second;
  }
  // mode
  res = on_group(3, std::chrono::seconds(20), [](int r, Communicator* c) {
    SyncBnOptions o;
    o.mode = r == 2 ? SyncBnMode::kExact : SyncBnMode::kDefault;
    Layer(4).forward(c, o);
  });
  for (const auto& e : res) EXPECT_EQ(e.first, comm_code) << e.second;
  // dtype
  res = on_group(2, std::chrono::seconds(20),
                 [](int r, Communicator* c) { Layer(4, r ? DType::kFloat16 : DType::kFloat32).forward(c); });
  for (const auto& e : res) EXPECT_EQ(e.first, comm_code) << e.second;
  // a rank that skipped a call: its sequence number is behind
  res = on_group(2, std::chrono::seconds(20), [](int r, Communicator* c) {
    if (r == 1) c->next_sequence();
    Layer(4).forward(c);
  });
  for (const auto& e : res) {
    EXPECT_EQ(e.first, comm_code) << e.second;
    EXPECT_NE(e.second.find("different calls"), std::string::npos) << e.second;
  }
  // forward on one rank, backward on the other
  res = on_group(2, std::chrono::seconds(20), [](int r, Communicator* c) {
    Layer l(4);
    if (r == 0) {
      l.forward(c);
    } else {
      const Tensor dx = Tensor::zeros({2, 4, 3, 3}, DType::kFloat32);
      sync_batch_norm_backward(l.x, l.x, l.w, l.mean, l.invstd, dx, {}, {}, c);
    }
  });
  for (const auto& e : res) EXPECT_EQ(e.first, comm_code) << e.second;
}

TEST(SyncBnRanks, EvaluationOnOneRankDoesNotDesynchronizeTraining) {
  // only rank 0 evaluates (no communication, no sequence number); then both train together
  auto res = on_group(2, std::chrono::seconds(20), [](int r, Communicator* c) {
    Layer l(4);
    const Tensor rm = Tensor::zeros({4}, DType::kFloat32), rv = make_tensor({4}, DType::kFloat32, {1, 1, 1, 1});
    if (r == 0) {
      SyncBnOptions eval;
      eval.training = false;
      sync_batch_norm_forward(l.x, SyncBnParams{l.w, l.b, rm, rv, {}}, l.y, l.mean, l.invstd, c, eval);
    }
    l.forward(c);
  });
  for (const auto& e : res) EXPECT_EQ(e.first, -1) << e.second;
}

TEST(SyncBnRanks, AFailingRankMakesEveryRankRaise) {
  auto res = on_group(3, std::chrono::seconds(20), [](int r, Communicator* c) {
    Layer l(4);
    const Tensor bad_w = Tensor::zeros({5}, DType::kFloat32);
    sync_batch_norm_forward(l.x, SyncBnParams{r == 1 ? bad_w.view() : l.w.view(), l.b, {}, {}, {}}, l.y, l.mean,
                            l.invstd, c);
  });
  EXPECT_EQ(res[1].first, static_cast<int>(ErrorCode::kInvalidArgument)) << res[1].second;
  EXPECT_NE(res[1].second.find("weight"), std::string::npos) << res[1].second;
  for (int r : {0, 2}) {
    EXPECT_EQ(res[static_cast<std::size_t>(r)].first, static_cast<int>(ErrorCode::kCommunication));
    EXPECT_NE(res[static_cast<std::size_t>(r)].second.find("rank 1"), std::string::npos) << res[static_cast<std::size_t>(r)].second;
  }
}

TEST(SyncBnRanks, AMissingRankTimesOutInsteadOfHanging) {
  const auto start = std::chrono::steady_clock::now();
  auto res = on_group(2, std::chrono::milliseconds(300), [](int r, Communicator* c) {
    if (r == 0) Layer(4).forward(c);  // rank 1 never comes
  });
  EXPECT_EQ(res[0].first, static_cast<int>(ErrorCode::kCommunication)) << res[0].second;
  EXPECT_NE(res[0].second.find("not arrived: 1"), std::string::npos) << res[0].second;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(SyncBnRanks, ThreadGroupGathersInRankOrderRepeatedly) {
  auto res = on_group(4, std::chrono::seconds(20), [](int r, Communicator* c) {
    for (int round = 0; round < 50; ++round) {
      const std::int64_t mine[2] = {r, round};
      std::int64_t all[8];
      c->all_gather(mine, all, sizeof(mine), Device::cpu(), nullptr);
      for (int q = 0; q < 4; ++q)
        if (all[2 * q] != q || all[2 * q + 1] != round) throw Error(ErrorCode::kInvalidArgument, "wrong gather");
    }
  });
  for (const auto& e : res) EXPECT_EQ(e.first, -1) << e.second;
}

// ---------------------------------------------------------------------------------------------
// Workspace: validate -> workspace size -> run

bool same_result(const Result& a, const Result& b) {
  return same_bytes(a.y, b.y) && same_bytes(a.mean, b.mean) && same_bytes(a.invstd, b.invstd) &&
         same_bytes(a.dx, b.dx) && same_bytes(a.dw, b.dw) && same_bytes(a.db, b.db) && same_bytes(a.rm, b.rm) &&
         same_bytes(a.rv, b.rv) && same_bytes(a.nbt, b.nbt);
}

TEST(SyncBnWorkspace, CallerWorkspaceAndUnalignedAllocatorGiveTheAllocatorsBits) {
  const Problem p = make_problem(5, 6, 7, 9, 41);
  for (const Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
    const Inputs in(p, DType::kFloat32, layout);
    for (const SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
      SyncBnOptions o;
      o.mode = mode;
      for (const std::vector<std::int64_t>& split :
           {std::vector<std::int64_t>{0, 5}, std::vector<std::int64_t>{0, 2, 5}, std::vector<std::int64_t>{0, 1, 1, 5}}) {
        const auto want = run_group(p, in, split, o);
        for (const Scratch scratch : {Scratch::kCallerWorkspace, Scratch::kOffsetAllocator}) {
          const auto got = run_group(p, in, split, o, scratch);
          for (std::size_t r = 0; r < want.size(); ++r)
            EXPECT_TRUE(same_result(got[r], want[r]))
                << "ranks " << want.size() << " rank " << r << " mode " << static_cast<int>(mode) << " scratch "
                << static_cast<int>(scratch);
        }
      }
    }
  }
}

TEST(SyncBnWorkspace, SizeCoversTheRecordsOfEveryRank) {
  const Tensor x = Tensor::zeros({2, 8, 3, 3}, DType::kFloat32), dx = Tensor::zeros({2, 8, 3, 3}, DType::kFloat32);
  SyncBnOptions exact;
  exact.mode = SyncBnMode::kExact;
  ThreadGroup group(3, std::chrono::seconds(5));
  auto comm = group.communicator(0);
  const std::size_t one = sync_batch_norm_forward_workspace_size(x), three = sync_batch_norm_forward_workspace_size(x, comm.get());
  EXPECT_GE(one, static_cast<std::size_t>(sync_batch_norm_record_words(8, SyncBnMode::kDefault)) * 8);
  EXPECT_GT(three, one);
  EXPECT_GT(sync_batch_norm_forward_workspace_size(x, nullptr, exact), one);
  SyncBnOptions eval;
  eval.training = false;
  EXPECT_EQ(sync_batch_norm_forward_workspace_size(x, comm.get(), eval), 0u);
  EXPECT_GT(sync_batch_norm_backward_workspace_size(x), 0u);  // the sums
  EXPECT_GT(sync_batch_norm_backward_workspace_size(x, dx, comm.get()), sync_batch_norm_backward_workspace_size(x));
  try {
    sync_batch_norm_forward_workspace_size(Tensor::zeros({2, 8, 3, 3}, DType::kInt32));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sync_batch_norm_forward_workspace_size: x has dtype int32"), std::string::npos)
        << e.what();
  }
}

TEST(SyncBnWorkspace, TooSmallOrOverlappingWorkspaceIsRejectedBeforeAnythingIsWritten) {
  Layer l(3);
  const std::size_t fw = sync_batch_norm_forward_workspace_size(l.x);
  const Tensor dx = Tensor::zeros({2, 3, 3, 3}, DType::kFloat32);
  const std::size_t bw = sync_batch_norm_backward_workspace_size(l.x, dx);
  CallerWorkspace small(fw - 1), small_b(bw - 1);
  auto expect_bad = [](const std::function<void()>& f, const std::vector<const char*>& what) {
    try {
      f();
      ADD_FAILURE() << what[0] << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      for (const char* w : what) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  };
  l.y.fill_bytes(0xAB);
  expect_bad([&] { sync_batch_norm_forward(l.x, {l.w, l.b, {}, {}, {}}, l.y, l.mean, l.invstd, nullptr, {}, {}, small.ws); },
             {"sync_batch_norm_forward: workspace has", "sync_batch_norm_forward_workspace_size"});
  for (std::size_t i = 0; i < l.y.nbytes(); ++i) ASSERT_EQ(static_cast<const unsigned char*>(l.y.view().data)[i], 0xAB);
  l.forward(nullptr);
  expect_bad([&] { sync_batch_norm_backward(l.y, l.x, l.w, l.mean, l.invstd, dx, {}, {}, nullptr, {}, {}, small_b.ws); },
             {"sync_batch_norm_backward: workspace has", "sync_batch_norm_backward_workspace_size"});
  // a workspace over y (forward) or grad_x (backward): as big as asked, but not disjoint
  const Tensor big = Tensor::zeros({static_cast<std::int64_t>((fw + bw) / 8 + 64)}, DType::kInt64);
  TensorView y_in_big = l.y.view();
  y_in_big.data = big.view().data;
  expect_bad([&] {
    sync_batch_norm_forward(l.x, {l.w, l.b, {}, {}, {}}, y_in_big, l.mean, l.invstd, nullptr, {}, {},
                            Workspace{big.view().data, fw});
  }, {"workspace", "overlaps y"});
  TensorView dx_in_big = dx.view();
  dx_in_big.data = big.view().data;
  expect_bad([&] {
    sync_batch_norm_backward(l.y, l.x, l.w, l.mean, l.invstd, dx_in_big, {}, {}, nullptr, {}, {},
                             Workspace{static_cast<unsigned char*>(big.view().data) + 8, bw});
  }, {"workspace", "overlaps grad_x"});
}

TEST(SyncBnWorkspace, ABadWorkspaceOnOneRankMakesEveryRankRaise) {
  auto res = on_group(2, std::chrono::seconds(20), [](int r, Communicator* c) {
    Layer l(4);
    CallerWorkspace ws(r == 1 ? 16 : sync_batch_norm_forward_workspace_size(l.x, c));
    sync_batch_norm_forward(l.x, {l.w, l.b, {}, {}, {}}, l.y, l.mean, l.invstd, c, {}, {}, ws.ws);
  });
  EXPECT_EQ(res[1].first, static_cast<int>(ErrorCode::kInvalidArgument)) << res[1].second;
  EXPECT_NE(res[1].second.find("workspace has 16 bytes"), std::string::npos) << res[1].second;
  EXPECT_EQ(res[0].first, static_cast<int>(ErrorCode::kCommunication)) << res[0].second;
}

TEST(SyncBnRanks, DisagreementNamesTheOptionalTensors) {
  auto res = on_group(2, std::chrono::seconds(20), [](int r, Communicator* c) {
    Layer l(4);
    sync_batch_norm_forward(l.x, SyncBnParams{r ? TensorView{} : l.w.view(), r ? TensorView{} : l.b.view(), {}, {}, {}},
                            l.y, l.mean, l.invstd, c);
  });
  for (const auto& e : res) {
    EXPECT_EQ(e.first, static_cast<int>(ErrorCode::kCommunication)) << e.second;
    EXPECT_NE(e.second.find("weight/bias given"), std::string::npos) << e.second;
    EXPECT_NE(e.second.find("weight/bias absent"), std::string::npos) << e.second;
    EXPECT_EQ(e.second.find("+a"), std::string::npos) << e.second;
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input: a clear error naming the argument, nothing written

TEST(SyncBnBadInput, RejectedBeforeAnythingIsWritten) {
  const std::int64_t C = 3;
  const Tensor x = make_tensor({2, C, 4, 4}, DType::kFloat32, random_values(96, 1));
  const Tensor w = make_tensor({C}, DType::kFloat32, {1.0, 2.0, 3.0}), b = Tensor::zeros({C}, DType::kFloat32);
  const Tensor w_bad = Tensor::zeros({C + 1}, DType::kFloat32), w_half = Tensor::zeros({C}, DType::kFloat16);
  const Tensor rm = Tensor::zeros({C}, DType::kFloat32), rv = make_tensor({C}, DType::kFloat32, {1, 1, 1});
  const Tensor x_int = Tensor::zeros({2, C, 4, 4}, DType::kInt32);
  const Tensor y_small = Tensor::zeros({2, C, 4, 3}, DType::kFloat32), y_f64 = Tensor::zeros({2, C, 4, 4}, DType::kFloat64);
  const Tensor m32 = Tensor::zeros({C}, DType::kFloat32), nbt32 = Tensor::zeros({1}, DType::kInt32);
  struct Case {
    const char* name;
    std::function<void(const Tensor& y, const Tensor& mean, const Tensor& invstd, SyncBnParams& p, SyncBnOptions& o,
                       TensorView& xv, TensorView& yv, TensorView& mv)>
        tweak;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"x int32", [&](auto&, auto&, auto&, auto&, auto&, auto& xv, auto&, auto&) { xv = x_int; }, "x has dtype int32"},
      {"y sizes", [&](auto&, auto&, auto&, auto&, auto&, auto&, auto& yv, auto&) { yv = y_small; }, "y has sizes"},
      {"y dtype", [&](auto&, auto&, auto&, auto&, auto&, auto&, auto& yv, auto&) { yv = y_f64; }, "y has dtype"},
      {"weight size", [&](auto&, auto&, auto&, auto& p, auto&, auto&, auto&, auto&) { p.weight = w_bad; }, "weight has sizes"},
      {"weight dtype", [&](auto&, auto&, auto&, auto& p, auto&, auto&, auto&, auto&) { p.weight = w_half; }, "weight has dtype"},
      {"weight alone", [&](auto&, auto&, auto&, auto& p, auto&, auto&, auto&, auto&) { p.bias = {}; }, "expected both"},
      {"running alone", [&](auto&, auto&, auto&, auto& p, auto&, auto&, auto&, auto&) { p.running_var = {}; }, "running_var is absent"},
      {"nbt dtype", [&](auto&, auto&, auto&, auto& p, auto&, auto&, auto&, auto&) { p.num_batches_tracked = nbt32; }, "num_batches_tracked has dtype"},
      {"no nbt for average", [&](auto&, auto&, auto&, auto&, auto& o, auto&, auto&, auto&) { o.momentum.reset(); }, "num_batches_tracked is absent"},
      {"momentum", [&](auto&, auto&, auto&, auto&, auto& o, auto&, auto&, auto&) { o.momentum = 1.5; }, "momentum is 1.5"},
      {"eps", [&](auto&, auto&, auto&, auto&, auto& o, auto&, auto&, auto&) { o.eps = -1; }, "eps is -1"},
      {"mode", [&](auto&, auto&, auto&, auto&, auto& o, auto&, auto&, auto&) { o.mode = static_cast<SyncBnMode>(7); }, "mode 7"},
      {"eval without running", [&](auto&, auto&, auto&, auto& p, auto& o, auto&, auto&, auto&) {
         o.training = false;
         p.running_mean = {};
         p.running_var = {};
       }, "expected them in evaluation mode"},
      {"save_mean dtype", [&](auto&, auto&, auto&, auto&, auto&, auto&, auto&, auto& mv) { mv = m32; }, "save_mean has dtype"},
      {"save_mean is running_mean", [&](auto&, auto&, auto&, auto& p, auto&, auto&, auto&, auto& mv) {
         mv = p.running_mean;
       }, "save_mean has dtype"},
      {"y overlaps save_mean", [&](auto&, auto& mean, auto&, auto&, auto&, auto&, auto& yv, auto&) {
         yv = Tensor::zeros({2, C, 4, 4}, DType::kFloat32);
         yv.data = mean.view().data;
       }, "overlap"},
  };
  for (const auto& k : cases) {
    Tensor y = Tensor::empty({2, C, 4, 4}, DType::kFloat32);
    Tensor mean = Tensor::empty({C}, DType::kFloat64), invstd = Tensor::empty({C}, DType::kFloat64);
    y.fill_bytes(0xAB), mean.fill_bytes(0xAB), invstd.fill_bytes(0xAB);
    Tensor rm2 = Tensor::empty({C}, DType::kFloat32), rv2 = Tensor::empty({C}, DType::kFloat32);
    rm2.fill_bytes(0xCD), rv2.fill_bytes(0xCD);
    SyncBnParams p{w, b, rm2, rv2, {}};
    SyncBnOptions o;
    TensorView xv = x, yv = y, mv = mean;
    k.tweak(y, mean, invstd, p, o, xv, yv, mv);
    try {
      sync_batch_norm_forward(xv, p, yv, mv, invstd, nullptr, o);
      ADD_FAILURE() << k.name << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << k.name;
      EXPECT_NE(std::string(e.what()).find(k.expect), std::string::npos) << k.name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("sync_batch_norm_forward"), std::string::npos) << e.what();
    }
    const auto untouched = [](const Tensor& t, unsigned char v) {
      const auto* q = static_cast<const unsigned char*>(t.view().data);
      for (std::size_t i = 0; i < t.nbytes(); ++i)
        if (q[i] != v) return false;
      return true;
    };
    EXPECT_TRUE(untouched(y, 0xAB)) << k.name;
    EXPECT_TRUE(untouched(mean, 0xAB)) << k.name;
    EXPECT_TRUE(untouched(invstd, 0xAB)) << k.name;
    EXPECT_TRUE(untouched(rm2, 0xCD)) << k.name;
    EXPECT_TRUE(untouched(rv2, 0xCD)) << k.name;
  }
}

// Fuzz finding (tests/fuzz/regressions/sync_bn_forward/running_var_overlaps_x): the running
// statistics are updated between the two reads of x, weight and bias, and num_batches_tracked is
// read by every channel's update; in training the forward must reject them sharing bytes with
// those (it used to return, with running_var written over x), and write nothing.
TEST(SyncBnBadInput, RunningStatisticsMustNotOverlapWhatTheyAreUpdatedBetween) {
  const std::int64_t C = 3;
  const std::vector<double> xs = random_values(96, 7);
  const Tensor w = make_tensor({C}, DType::kFloat32, {1.0, 2.0, 3.0}), b = Tensor::zeros({C}, DType::kFloat32);
  struct Case {
    const char* name;
    const char* expect;
  };
  const Case cases[] = {{"running_var is x's first elements", "running_var overlaps x"},
                        {"running_mean is the weight", "running_mean overlaps weight"},
                        {"num_batches_tracked inside save_mean", "num_batches_tracked overlaps save_mean"},
                        {"num_batches_tracked inside y", "num_batches_tracked overlaps y"},
                        {"num_batches_tracked inside x", "num_batches_tracked overlaps x"}};
  for (int k = 0; k < 5; ++k) {
    for (const bool training : {true, false}) {
      const Tensor x = make_tensor({2, C, 4, 4}, DType::kFloat32, xs);
      Tensor wc = make_tensor({C}, DType::kFloat32, {1.0, 2.0, 3.0});
      Tensor y = Tensor::empty({2, C, 4, 4}, DType::kFloat32);
      Tensor mean = Tensor::empty({C}, DType::kFloat64), invstd = Tensor::empty({C}, DType::kFloat64);
      y.fill_bytes(0xAB), mean.fill_bytes(0xAB), invstd.fill_bytes(0xAB);
      Tensor rm = make_tensor({C}, DType::kFloat32, {0, 0, 0}), rv = make_tensor({C}, DType::kFloat32, {1, 1, 1});
      Tensor nbt = Tensor::zeros({1}, DType::kInt64);
      SyncBnParams p{wc, b, rm, rv, nbt};
      const auto at = [](const Tensor& t, DType dt, std::int64_t n) {
        return TensorView(t.view().data, dt, Device::cpu(), {n});
      };
      if (k == 0) p.running_var = at(x, DType::kFloat32, C);
      if (k == 1) p.running_mean = at(wc, DType::kFloat32, C);
      if (k == 2) p.num_batches_tracked = at(mean, DType::kInt64, 1);
      if (k == 3) p.num_batches_tracked = at(y, DType::kInt64, 1);
      if (k == 4) p.num_batches_tracked = at(x, DType::kInt64, 1);
      const std::vector<double> x_before = to_vector(x), w_before = to_vector(wc);
      SyncBnOptions o;
      o.training = training;
      if (!training) {
        // evaluation reads the running statistics and writes none of them: no conflict
        if (k == 2 || k == 3) continue;  // the counter inside an output: left as it was, but not read either
        EXPECT_NO_THROW(sync_batch_norm_forward(x, p, y, mean, invstd, nullptr, o)) << cases[k].name;
        continue;
      }
      try {
        sync_batch_norm_forward(x, p, y, mean, invstd, nullptr, o);
        ADD_FAILURE() << cases[k].name << ": no error";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << cases[k].name;
        EXPECT_NE(std::string(e.what()).find(cases[k].expect), std::string::npos) << cases[k].name << ": " << e.what();
      }
      EXPECT_EQ(to_vector(x), x_before) << cases[k].name;
      EXPECT_EQ(to_vector(wc), w_before) << cases[k].name;
      for (const Tensor* t : {&y, &mean, &invstd}) {
        const auto* q = static_cast<const unsigned char*>(t->view().data);
        for (std::size_t i = 0; i < t->nbytes(); ++i) ASSERT_EQ(q[i], 0xAB) << cases[k].name;
      }
    }
  }
}

// finalize_stats does not read weight and bias, but an output inside them would corrupt the apply
// phase's parameters (found by the sync_bn_phases fuzz target: save_mean inside bias).
TEST(SyncBnBadInput, FinalizeStatsOutputsMustNotOverlapTheParameters) {
  const std::int64_t C = 2;
  for (const bool in_bias : {false, true}) {
    for (const bool mean_output : {true, false}) {
      Tensor w = make_tensor({C}, DType::kFloat64, {1.0, 2.0}), b = make_tensor({C}, DType::kFloat64, {0.5, -0.5});
      const Tensor x = make_tensor({2, C, 2, 2}, DType::kFloat64, random_values(16, 3));
      Tensor record = Tensor::empty({sync_batch_norm_record_words(C, SyncBnMode::kDefault)}, DType::kInt64);
      sync_batch_norm_local_stats(x, record, SyncBnMode::kDefault);
      const TensorView gathered(record.view().data, DType::kInt64, Device::cpu(), {1, record.view().sizes[0]});
      Tensor other = Tensor::empty({C}, DType::kFloat64);
      other.fill_bytes(0xAB);
      const TensorView inside((in_bias ? b : w).view().data, DType::kFloat64, Device::cpu(), {C});
      const std::vector<double> w_before = to_vector(w), b_before = to_vector(b);
      const char* expect = in_bias ? (mean_output ? "save_mean overlaps bias" : "save_invstd overlaps bias")
                                   : (mean_output ? "save_mean overlaps weight" : "save_invstd overlaps weight");
      try {
        sync_batch_norm_finalize_stats(gathered, SyncBnParams{w, b, {}, {}, {}}, mean_output ? inside : other.view(),
                                       mean_output ? other.view() : inside);
        ADD_FAILURE() << expect << ": no error";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
      }
      EXPECT_EQ(to_vector(w), w_before);
      EXPECT_EQ(to_vector(b), b_before);
      const auto* q = static_cast<const unsigned char*>(other.view().data);
      for (std::size_t i = 0; i < other.nbytes(); ++i) ASSERT_EQ(q[i], 0xAB) << expect;
    }
  }
}

TEST(SyncBnBadInput, BackwardArguments) {
  Layer l(3);
  l.forward(nullptr);
  const Tensor dx = Tensor::zeros({2, 3, 3, 3}, DType::kFloat32), dw = Tensor::zeros({3}, DType::kFloat32);
  const Tensor dy_bad = Tensor::zeros({2, 3, 3, 2}, DType::kFloat32);
  auto expect_error = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([&] { sync_batch_norm_backward(dy_bad, l.x, l.w, l.mean, l.invstd, dx, {}, {}); }, "grad_y has sizes");
  expect_error([&] { sync_batch_norm_backward(l.y, l.x, {}, l.mean, l.invstd, dx, dw, {}); }, "weight is absent");
  expect_error([&] { sync_batch_norm_backward(l.y, l.x, l.w, l.mean, l.invstd, l.x, {}, {}); }, "grad_x");
}

}  // namespace
}  // namespace detops
