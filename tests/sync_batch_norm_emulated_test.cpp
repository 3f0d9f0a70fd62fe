// SyncBatchNorm's CUDA backend run on the CPU: its own launch sequences
// (internal/sync_batch_norm_device.h, the code cuda/sync_batch_norm_cuda.cu runs on CudaDevice) of
// the kernel bodies (detops/detail/sync_batch_norm_kernels.h) on an emulated device, against the
// CPU backend, byte for byte, from poisoned scratch. Warps run their 32 lanes in lockstep (the butterfly of the shuffle
// reduction), blocks run phase by phase (the barriers); each case runs four times: with the
// launchers' grids and threads in order; with one block (every grid-stride and block-stride loop
// wraps, a block kernel's shared memory is reused) and every phase's threads last to first (a read of a value that the
// same phase writes would change the bits); and, in both of these, once more with each block
// kernel's warps as host threads taking turns at the barriers, in order and reversed (a missing
// barrier would let a warp read before the writer ran, or overwrite before the reader ran). The CPU backend uses its own loop structure, so
// agreement checks the kernels' indexing, the lane/warp/block decomposition and the claim that
// both backends evaluate the same arithmetic. Every dtype, NCHW / NHWC / strided views, both
// modes; partial chunks and warps (lengths not multiples of 32), more chunks than a block has
// threads (K = 522), an empty local batch, inf and NaN inputs, exact-mode exponents that do not
// cover the data; the finalize kernels for rank counts on both sides of their stack depths. No
// GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "detops/detail/sync_batch_norm_kernels.h"
#include "detops/sync_batch_norm.h"
#include "emulated_device.h"
#include "internal/common.h"
#include "internal/sync_batch_norm_backend.h"
#include "internal/sync_batch_norm_device.h"
#include "sync_batch_norm_test_util.h"
#include "test_util.h"

namespace detops {

namespace {

using namespace test::sync_bn;
using detail::SbnShape;
using detail::SbnSrc;

// ---------------------------------------------------------------------------------------------
// The emulated grid

constexpr int kBlock = detail::kSbnBlock;

/// How a kernel is emulated: the launcher's grid or one block; threads of a phase in
/// order or last to first; block kernels as one lockstep group or as warps taking turns.
struct Emu {
  bool small_grid = false;
  bool reverse = false;
  bool warp_turns = false;
  unsigned grid(unsigned launcher_blocks) const { return small_grid ? 1u : launcher_blocks; }
};

/// A warp-level kernel: each warp of each block, its 32 lanes in lockstep.
template <class F>
void run_warps(unsigned blocks, bool reverse, F&& f) {
  for (unsigned b = 0; b < blocks; ++b)
    for (int w = 0; w < detail::kSbnWarpsPerBlock; ++w) {
      detail::SbnLockstep<detail::kSbnLanes> grp;
      grp.first = w * detail::kSbnLanes;
      grp.block_index = b;
      grp.grid_blocks = blocks;
      grp.reverse = reverse;
      f(grp);
    }
}

/// A block whose warps are host threads of which one runs at a time: the first warp in turn
/// order (0, 1, ..., 7, or 7, 6, ..., 0 reversed) runs until its next sync() and hands the turn
/// to the next warp that has not reached that barrier; when every warp has, the first goes on.
/// A barrier missing between a write and another warp's read lets the reader run first in one
/// of the two orders. Also counts each warp's barriers (a barrier that not every warp reaches is
/// undefined on the device).
class WarpTurns final : public detail::SbnBlockHooks {
 public:
  static constexpr int kWarps = detail::kSbnWarpsPerBlock;
  explicit WarpTurns(bool reverse) : reverse_(reverse), turn_(reverse ? kWarps - 1 : 0) {
    std::memset(shared_, 0xCD, sizeof(shared_));
  }

  template <class F>
  void run(F&& f) {
    std::vector<std::thread> threads;
    for (int w = 0; w < kWarps; ++w)
      threads.emplace_back([this, w, &f] {
        {
          std::unique_lock<std::mutex> lock(mutex_);
          cv_.wait(lock, [&] { return turn_ == w; });
        }
        f(w);
        std::lock_guard<std::mutex> lock(mutex_);
        done_[w] = true;
        pass_turn();
      });
    for (auto& t : threads) t.join();
  }
  void sync() override {
    std::unique_lock<std::mutex> lock(mutex_);
    const int w = turn_;
    ++barriers[w];
    arrived_[w] = true;
    pass_turn();
    cv_.wait(lock, [&] { return turn_ == w; });
  }
  void* shared(std::size_t bytes) override {
    EXPECT_LE(bytes, sizeof(shared_));
    return shared_;  // poisoned once: warps that ran earlier may have written it already
  }

  int barriers[kWarps] = {};

 private:
  int warp_at(int i) const { return reverse_ ? kWarps - 1 - i : i; }
  void pass_turn() {  // under mutex_
    turn_ = -1;
    for (int i = 0; i < kWarps && turn_ < 0; ++i)
      if (!arrived_[warp_at(i)] && !done_[warp_at(i)]) turn_ = warp_at(i);
    if (turn_ < 0) {  // every warp at the barrier (or finished): release it
      std::fill(arrived_, arrived_ + kWarps, false);
      for (int i = 0; i < kWarps && turn_ < 0; ++i)
        if (!done_[warp_at(i)]) turn_ = warp_at(i);
    }
    cv_.notify_all();
  }

  const bool reverse_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int turn_;
  bool arrived_[kWarps] = {}, done_[kWarps] = {};
  alignas(64) unsigned char shared_[1024];
};

/// A block-level kernel: each block, all its threads phase by phase (or its warps taking turns).
template <class F>
void run_blocks(unsigned blocks, const Emu& e, F&& f) {
  for (unsigned b = 0; b < blocks; ++b) {
    if (e.warp_turns) {
      WarpTurns turns(e.reverse);
      turns.run([&](int w) {
        detail::SbnLockstep<detail::kSbnLanes> grp;
        grp.first = w * detail::kSbnLanes;
        grp.block_index = b;
        grp.grid_blocks = blocks;
        grp.hooks = &turns;
        f(grp);
      });
      for (int w = 1; w < WarpTurns::kWarps; ++w)
        EXPECT_EQ(turns.barriers[w], turns.barriers[0]) << "warp " << w << " of block " << b << " reached other barriers";
      continue;
    }
    detail::SbnLockstep<kBlock> grp;
    grp.block_index = b;
    grp.grid_blocks = blocks;
    grp.reverse = e.reverse;
    f(grp);
  }
}

detail::SbnParam param_of(const TensorView& v) {
  if (!v.defined()) return {nullptr, false, 0};
  return {v.data, v.dtype == DType::kFloat64, v.strides[0]};
}

// ---------------------------------------------------------------------------------------------
// The CUDA backend's own launch sequences (internal/sync_batch_norm_device.h) on the emulated device

/// The emulated device with SyncBatchNorm's thread groups: grid-stride launches on the launcher's
/// grid (or one block), warp bodies lockstep per warp, block bodies lockstep per block or as warps
/// taking turns at the barriers, threads of a phase in order or last to first (Emu).
struct SbnEmulatedDevice : test::EmulatedDevice {
  Emu e;
  struct MaxI64 {  // atomicMax
    void operator()(std::int64_t* p, std::int64_t v) const { *p = std::max(*p, v); }
  };
  explicit SbnEmulatedDevice(const Emu& emu) : e(emu) {
    op = "emulated";
    if (e.small_grid) block = kBlock, blocks = 1;  // grid-stride loops over one block
  }
  template <class Body>
  void launch_occupied(const char* name, std::int64_t n, const Body& body) const {
    launch(name, n, body);
  }
  template <class Body>
  void launch_warps(const char*, unsigned grid, const Body& body) const {
    run_warps(e.grid(grid), e.reverse, body);
  }
  template <class Body>
  void launch_blocks(const char*, unsigned grid, const Body& body) const {
    run_blocks(e.grid(grid), e, body);
  }
};

/// A pass's scratch (the backend's layout), poisoned: a read of a slot no kernel wrote shows.
test::PoisonedWorkspace pass_scratch(internal::SbnPass pass, const TensorView& x, bool exact) {
  return test::PoisonedWorkspace(internal::sbn_pass_layout(pass, x, exact).bytes());
}

/// local_stats (dy absent) or local_backward.
void emu_local(const TensorView& x, const TensorView& dy, const double* mean, bool exact, const std::int64_t* scales,
               std::int64_t* rec, const Emu& e) {
  internal::SbnLocalCall call{x, dy, mean, exact, scales, rec};
  const bool backward = dy.defined();
  test::PoisonedWorkspace ws =
      pass_scratch(backward ? internal::SbnPass::kLocalBackward : internal::SbnPass::kLocalStats, x, exact);
  if (backward) internal::sbn_local_backward_on(SbnEmulatedDevice(e), call, ws.ws);
  else internal::sbn_local_stats_on(SbnEmulatedDevice(e), call, ws.ws);
}

void emu_scales(const TensorView& x, const TensorView& dy, const double* mean, std::int64_t* scales, const Emu& e) {
  internal::sbn_local_scales_on(SbnEmulatedDevice(e), internal::SbnLocalCall{x, dy, mean, false, nullptr, scales});
}

void emu_merge_scales(const std::int64_t* gathered, std::int64_t ranks, std::int64_t words, std::int64_t* scales,
                      const Emu& e) {
  internal::sbn_merge_scales_on(SbnEmulatedDevice(e), internal::SbnMergeCall{gathered, ranks, words, scales,
                                                                              Device::cpu()});
}

void emu_finalize(const detail::SbnFinalizeArgs& a, const Emu& e) { internal::sbn_finalize_on(SbnEmulatedDevice(e), a); }

void emu_finalize_backward(const detail::SbnBackwardFinalizeArgs& a, const Emu& e) {
  internal::sbn_finalize_backward_on(SbnEmulatedDevice(e), a);
}

/// The finalize bodies at a rank-tree depth the launcher would not pick for these ranks (every
/// depth must give the same bits), launched as the sequence launches them.
template <int D>
void emu_finalize_depth(const detail::SbnFinalizeArgs& a, const Emu& e) {
  const SbnEmulatedDevice dev(e);
  dev.launch("sbn_finalize", a.channels, internal::sbn_device::FinalizeBody<D>{a});
  if (a.num_batches_tracked && a.running_mean.data) dev.launch("sbn_bump_batches", 1, internal::sbn_device::BumpBatchesBody{a});
}
template <int D>
void emu_finalize_backward_depth(const detail::SbnBackwardFinalizeArgs& a, const Emu& e) {
  SbnEmulatedDevice(e).launch("sbn_finalize_backward", a.channels > 0 ? a.channels : 1,
                              internal::sbn_device::FinalizeBackwardBody<D>{a});
}

void emu_eval_stats(const detail::SbnParam& rm, const detail::SbnParam& rv, double eps, std::int64_t C, double* mean,
                    double* invstd, const Emu& e) {
  internal::sbn_eval_stats_on(SbnEmulatedDevice(e), internal::SbnEvalCall{rm, rv, eps, C, mean, invstd, Device::cpu()});
}

void emu_apply(const TensorView& x, const TensorView& weight, const TensorView& bias, const double* mean,
               const double* invstd, const TensorView& y, const Emu& e) {
  internal::sbn_apply_on(SbnEmulatedDevice(e),
                         internal::SbnApplyCall{x, param_of(weight), param_of(bias), mean, invstd, y});
}

/// sums == nullptr: evaluation mode.
void emu_backward_apply(const TensorView& dy, const TensorView& x, const TensorView& weight, const double* mean,
                        const double* invstd, const double* sums, const TensorView& dx, const Emu& e) {
  test::PoisonedWorkspace ws = pass_scratch(internal::SbnPass::kBackwardApply, x, false);
  internal::sbn_backward_apply_on(SbnEmulatedDevice(e),
                                  internal::SbnBackwardApplyCall{dy, x, param_of(weight), mean, invstd, sums, dx},
                                  ws.ws);
}

// ---------------------------------------------------------------------------------------------
// Problems

// 221 positions per image (a partial chunk of 221 = 6 * 32 + 29, chunks spanning images); one
// element per image (a warp with 3 busy lanes); no element; C = 1 (channels-last views take the
// warp path); an odd number of chunks; K = 522 chunks (two strides of a block in the tree's first
// level and in the exact sum).
constexpr Shape kShapes[] = {{2, 5, 13, 17}, {3, 3, 1, 1}, {1, 3, 0, 4}, {2, 1, 9, 15}, {5, 4, 17, 31}, {3, 2, 211, 211}};

/// A 4-d view into a 1-d storage poisoned with 0xCD (make_buf picks the layout's strides).
using Buf = test::StridedBuf;

Tensor vec(const std::vector<double>& v, DType dt) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, dt, Device::cpu());
  test::fill_from(t.view(), v);
  return t;
}
Tensor words(std::int64_t n) {
  Tensor t = Tensor::empty({n}, DType::kInt64, Device::cpu());
  t.fill_bytes(0xCD);
  return t;
}
Tensor doubles(std::int64_t n) {
  Tensor t = Tensor::empty({n}, DType::kFloat64, Device::cpu());
  t.fill_bytes(0xCD);
  return t;
}
Tensor copy(const Tensor& t) {
  Tensor c = Tensor::empty({t.numel()}, t.view().dtype, Device::cpu());
  std::memcpy(c.view().data, t.view().data, t.nbytes());
  return c;
}
std::int64_t* i64(Tensor& t) { return static_cast<std::int64_t*>(t.view().data); }
const double* f64(const Tensor& t) { return static_cast<const double*>(t.view().data); }
double* f64(Tensor& t) { return static_cast<double*>(t.view().data); }

/// Byte equality, with the first differing byte in the failure message.
::testing::AssertionResult same_bytes(const Tensor& cpu, const Tensor& emu, const char* what) {
  if (cpu.nbytes() != emu.nbytes()) return ::testing::AssertionFailure() << what << ": sizes differ";
  const auto* a = static_cast<const unsigned char*>(cpu.view().data);
  const auto* b = static_cast<const unsigned char*>(emu.view().data);
  for (std::size_t i = 0; i < cpu.nbytes(); ++i)
    if (a[i] != b[i])
      return ::testing::AssertionFailure() << what << ": byte " << i << " of " << cpu.nbytes() << " differs (element "
                                           << i / dtype_size(cpu.view().dtype) << ")";
  return ::testing::AssertionSuccess();
}

/// x and dy with values around a channel-dependent offset; the first shape gets an inf in
/// channel 1 and a NaN in channel 2 of x, and an inf in channel 3 of dy (exponents, NaN
/// propagation through every pass).
struct Problem {
  Buf x, dy;
  Tensor mean;  // [C] float64: the backward's save_mean
};
Problem make_problem(const Shape& s, DType dt, Lay lay, std::uint64_t seed, bool specials) {
  Problem p;
  p.x = make_buf(s, dt, lay);
  p.dy = make_buf(s, dt, lay);
  const auto n = static_cast<std::size_t>(s.N * s.C * s.H * s.W);
  std::vector<double> xv = test::random_values(n, seed, -1.0, 1.0), gv = test::random_values(n, seed + 1, -0.5, 0.5);
  const std::size_t plane = static_cast<std::size_t>(s.H * s.W);
  for (std::size_t i = 0; i < n; ++i) xv[i] = xv[i] * 2.0 + static_cast<double>((i / plane) % static_cast<std::size_t>(s.C)) - 1.5;
  if (specials && plane > 1 && s.C >= 4) {
    xv[1 * plane + 3] = std::numeric_limits<double>::infinity();
    xv[2 * plane + 7] = std::numeric_limits<double>::quiet_NaN();
    gv[3 * plane + 1] = -std::numeric_limits<double>::infinity();
  }
  test::fill_from(p.x.view, xv);
  test::fill_from(p.dy.view, gv);
  p.mean = vec(test::random_values(static_cast<std::size_t>(s.C), seed + 2, -2.0, 2.0), DType::kFloat64);
  return p;
}

const Emu kEmus[] = {{false, false, false}, {true, true, false}, {false, false, true}, {true, true, true}};

std::string emu_name(const Emu& e) {
  std::string n = e.small_grid ? "small grid" : "launcher grid";
  n += e.reverse ? ", threads reversed" : "";
  return n + (e.warp_turns ? ", block kernels as warps taking turns" : "");
}

using Param = std::tuple<DType, Lay, SyncBnMode>;
class SyncBnEmulated : public ::testing::TestWithParam<Param> {};

// ---------------------------------------------------------------------------------------------
// Local phases: exponents and records of one rank.

TEST_P(SyncBnEmulated, LocalPhasesEqualCpuBackendBitwise) {
  const auto [dt, lay, mode] = GetParam();
  const bool exact = mode == SyncBnMode::kExact;
  std::uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    seed += 10;
    const Problem p = make_problem(s, dt, lay, seed, &s == &kShapes[0]);
    const std::int64_t C = s.C, rw = sync_batch_norm_record_words(C, mode);
    const std::int64_t fw = sync_batch_norm_scale_words(C, false), bw = sync_batch_norm_scale_words(C, true);
    // the CPU backend
    Tensor fscales = words(fw), bscales = words(bw), fmerged = words(fw), bmerged = words(bw);
    Tensor frec = words(rw), brec = words(rw);
    if (exact) {
      sync_batch_norm_local_scales(p.x.view, TensorView{}, TensorView{}, fscales);
      sync_batch_norm_local_scales(p.x.view, p.dy.view, p.mean, bscales);
      TensorView fg(fscales.view().data, DType::kInt64, Device::cpu(), {1, fw});
      TensorView bg(bscales.view().data, DType::kInt64, Device::cpu(), {1, bw});
      sync_batch_norm_merge_scales(fg, fmerged);
      sync_batch_norm_merge_scales(bg, bmerged);
    }
    sync_batch_norm_local_stats(p.x.view, frec, mode, exact ? fmerged.view() : TensorView{});
    sync_batch_norm_local_backward(p.dy.view, p.x.view, p.mean, brec, mode, exact ? bmerged.view() : TensorView{});
    // exact mode, exponents a caller of the phases got wrong: 5 too small where finite (values
    // beyond the grid's 2^44: the CPU's fallback path), and a garbage word in the last channel
    Tensor flow = copy(fmerged), blow = copy(bmerged), flowrec = words(rw), blowrec = words(rw);
    if (exact) {
      for (Tensor* t : {&flow, &blow}) {
        std::int64_t* w = i64(*t);
        for (std::int64_t i = 0; i < t->numel(); ++i)
          if (detail::sbn_finite_exponent(w[i])) w[i] -= 5;
        w[t->numel() - 1] = 123456789;
      }
      sync_batch_norm_local_stats(p.x.view, flowrec, mode, flow);
      sync_batch_norm_local_backward(p.dy.view, p.x.view, p.mean, blowrec, mode, blow);
    }
    for (const Emu& e : kEmus) {
      SCOPED_TRACE(::testing::Message() << "shape [" << s.N << ", " << s.C << ", " << s.H << ", " << s.W << "], "
                                        << emu_name(e));
      if (exact) {
        Tensor efs = words(fw), ebs = words(bw), efm = words(fw), ebm = words(bw);
        emu_scales(p.x.view, TensorView{}, nullptr, i64(efs), e);
        emu_scales(p.x.view, p.dy.view, f64(p.mean), i64(ebs), e);
        EXPECT_TRUE(same_bytes(fscales, efs, "forward exponents"));
        EXPECT_TRUE(same_bytes(bscales, ebs, "backward exponents"));
        emu_merge_scales(i64(efs), 1, fw, i64(efm), e);
        emu_merge_scales(i64(ebs), 1, bw, i64(ebm), e);
        EXPECT_TRUE(same_bytes(fmerged, efm, "merged forward exponents"));
        EXPECT_TRUE(same_bytes(bmerged, ebm, "merged backward exponents"));
      }
      Tensor efrec = words(rw), ebrec = words(rw);
      emu_local(p.x.view, TensorView{}, nullptr, exact, exact ? i64(fmerged) : nullptr, i64(efrec), e);
      emu_local(p.x.view, p.dy.view, f64(p.mean), exact, exact ? i64(bmerged) : nullptr, i64(ebrec), e);
      EXPECT_TRUE(same_bytes(frec, efrec, "forward record"));
      EXPECT_TRUE(same_bytes(brec, ebrec, "backward record"));
      if (exact) {
        Tensor elf = words(rw), elb = words(rw);
        emu_local(p.x.view, TensorView{}, nullptr, true, i64(flow), i64(elf), e);
        emu_local(p.x.view, p.dy.view, f64(p.mean), true, i64(blow), i64(elb), e);
        EXPECT_TRUE(same_bytes(flowrec, elf, "forward record, exponents too small"));
        EXPECT_TRUE(same_bytes(blowrec, elb, "backward record, exponents too small"));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A training step over ranks: the batch split into rank slices (one of them empty), the CPU
// backend's records gathered; finalize, apply, finalize_backward and backward_apply on both.

TEST_P(SyncBnEmulated, TrainingStepOverRanksEqualsCpuBackendBitwise) {
  const auto [dt, lay, mode] = GetParam();
  const bool exact = mode == SyncBnMode::kExact;
  std::uint64_t seed = 300;
  int index = 0;
  for (const Shape& s : kShapes) {
    seed += 10;
    const Problem p = make_problem(s, dt, lay, seed, &s == &kShapes[0]);
    const std::int64_t C = s.C, rw = sync_batch_norm_record_words(C, mode);
    // rank slices of the images: [0, 0) (empty), then the rest in two (or one) parts
    std::vector<std::pair<std::int64_t, std::int64_t>> slices = {{0, 0}, {0, (s.N + 1) / 2}};
    if ((s.N + 1) / 2 < s.N) slices.push_back({(s.N + 1) / 2, s.N});
    const std::int64_t ranks = static_cast<std::int64_t>(slices.size());
    SyncBnOptions opts;
    opts.mode = mode;
    if (index++ % 2) opts.momentum = std::nullopt;  // cumulative average: num_batches_tracked
    // agreed exponents: those of the whole batch (the maximum over the slices)
    Tensor fexp = words(C), bexp = words(2 * C);
    if (exact) {
      sync_batch_norm_local_scales(p.x.view, TensorView{}, TensorView{}, fexp);
      sync_batch_norm_local_scales(p.x.view, p.dy.view, p.mean, bexp);
    }
    Tensor fgathered = words(ranks * rw);
    for (std::int64_t r = 0; r < ranks; ++r) {
      TensorView rec(i64(fgathered) + r * rw, DType::kInt64, Device::cpu(), {rw});
      sync_batch_norm_local_stats(p.x.images(slices[r].first, slices[r].second), rec, mode,
                                  exact ? fexp.view() : TensorView{});
    }
    const TensorView fg(fgathered.view().data, DType::kInt64, Device::cpu(), {ranks, rw});
    // module state: float32 weight/bias, float64 running statistics
    const Tensor weight = vec(test::random_values(static_cast<std::size_t>(C), seed + 3, 0.5, 1.5), DType::kFloat32);
    const Tensor bias = vec(test::random_values(static_cast<std::size_t>(C), seed + 4, -0.5, 0.5), DType::kFloat32);
    const Tensor rm0 = vec(test::random_values(static_cast<std::size_t>(C), seed + 5, -1, 1), DType::kFloat64);
    const Tensor rv0 = vec(test::random_values(static_cast<std::size_t>(C), seed + 6, 0.5, 2), DType::kFloat64);
    const Tensor nbt0 = vec({41.0}, DType::kInt64);
    SyncBnParams cp;
    Tensor rm = copy(rm0), rv = copy(rv0), nbt = copy(nbt0);
    cp.weight = weight.view(), cp.bias = bias.view(), cp.running_mean = rm.view(), cp.running_var = rv.view();
    cp.num_batches_tracked = nbt.view();
    Tensor save_mean = vec(std::vector<double>(static_cast<std::size_t>(C)), DType::kFloat64), save_invstd = copy(save_mean);
    sync_batch_norm_finalize_stats(fg, cp, save_mean, save_invstd, opts, exact ? fexp.view() : TensorView{});
    Buf y = make_buf(s, dt, lay);
    sync_batch_norm_apply(p.x.view, cp, save_mean, save_invstd, y.view);
    // backward: records of every slice, then rank 1's view of the merge
    Tensor bgathered = words(ranks * rw);
    for (std::int64_t r = 0; r < ranks; ++r) {
      TensorView rec(i64(bgathered) + r * rw, DType::kInt64, Device::cpu(), {rw});
      sync_batch_norm_local_backward(p.dy.images(slices[r].first, slices[r].second),
                                     p.x.images(slices[r].first, slices[r].second), save_mean, rec, mode,
                                     exact ? bexp.view() : TensorView{});
    }
    const TensorView bg(bgathered.view().data, DType::kInt64, Device::cpu(), {ranks, rw});
    Tensor sums = vec(std::vector<double>(static_cast<std::size_t>(2 * C + 1)), DType::kFloat64);
    Tensor gw = vec(std::vector<double>(static_cast<std::size_t>(C)), DType::kFloat64), gb = copy(gw);
    sync_batch_norm_finalize_backward(bg, 1, mode, save_invstd, sums, gw, gb, exact ? bexp.view() : TensorView{});
    Buf dx = make_buf(s, dt, lay);
    sync_batch_norm_backward_apply(p.dy.view, p.x.view, weight, save_mean, save_invstd, sums, dx.view);

    for (const Emu& e : kEmus) {
      SCOPED_TRACE(::testing::Message() << "shape [" << s.N << ", " << s.C << ", " << s.H << ", " << s.W << "], "
                                        << emu_name(e));
      Tensor erm = copy(rm0), erv = copy(rv0), enbt = copy(nbt0), esm = doubles(C), esi = doubles(C);
      detail::SbnFinalizeArgs fa{};
      fa.gathered = i64(fgathered);
      fa.ranks = ranks;
      fa.words = rw;
      fa.channels = C;
      fa.exact = exact;
      fa.exponents = exact ? i64(fexp) : nullptr;
      fa.eps = opts.eps;
      fa.has_momentum = opts.momentum.has_value();
      fa.momentum = opts.momentum.value_or(0.0);
      fa.running_mean = param_of(erm.view());
      fa.running_var = param_of(erv.view());
      fa.num_batches_tracked = i64(enbt);
      fa.save_mean = f64(esm);
      fa.save_invstd = f64(esi);
      emu_finalize(fa, e);
      EXPECT_TRUE(same_bytes(save_mean, esm, "save_mean"));
      EXPECT_TRUE(same_bytes(save_invstd, esi, "save_invstd"));
      EXPECT_TRUE(same_bytes(rm, erm, "running_mean"));
      EXPECT_TRUE(same_bytes(rv, erv, "running_var"));
      EXPECT_TRUE(same_bytes(nbt, enbt, "num_batches_tracked"));
      Buf ey = make_buf(s, dt, lay);
      emu_apply(p.x.view, weight.view(), bias.view(), f64(save_mean), f64(save_invstd), ey.view, e);
      EXPECT_TRUE(same_bytes(y.storage, ey.storage, "y (whole storage)"));

      Tensor esums = doubles(2 * C + 1), egw = doubles(C), egb = doubles(C);
      detail::SbnBackwardFinalizeArgs ba{};
      ba.gathered = i64(bgathered);
      ba.ranks = ranks;
      ba.words = rw;
      ba.channels = C;
      ba.rank = 1;
      ba.exact = exact;
      ba.exponents = exact ? i64(bexp) : nullptr;
      ba.save_invstd = f64(save_invstd);
      ba.sums = f64(esums);
      ba.grad_weight = param_of(egw.view());
      ba.grad_bias = param_of(egb.view());
      emu_finalize_backward(ba, e);
      EXPECT_TRUE(same_bytes(sums, esums, "sums"));
      EXPECT_TRUE(same_bytes(gw, egw, "grad_weight"));
      EXPECT_TRUE(same_bytes(gb, egb, "grad_bias"));
      Buf edx = make_buf(s, dt, lay);
      emu_backward_apply(p.dy.view, p.x.view, weight.view(), f64(save_mean), f64(save_invstd), f64(sums), edx.view, e);
      EXPECT_TRUE(same_bytes(dx.storage, edx.storage, "grad_x (whole storage)"));
    }
  }
}

// Evaluation mode: the running statistics as the saved ones, and the backward's constant
// coefficients (no sums).
TEST_P(SyncBnEmulated, EvaluationModeEqualsCpuBackendBitwise) {
  const auto [dt, lay, mode] = GetParam();
  const Shape s = kShapes[4];
  const Problem p = make_problem(s, dt, lay, 500, false);
  const std::int64_t C = s.C;
  const Tensor weight = vec(test::random_values(static_cast<std::size_t>(C), 503, 0.5, 1.5), DType::kFloat64);
  const Tensor bias = vec(test::random_values(static_cast<std::size_t>(C), 504, -0.5, 0.5), DType::kFloat64);
  const Tensor rm = vec(test::random_values(static_cast<std::size_t>(C), 505, -1, 1), DType::kFloat32);
  const Tensor rv = vec(test::random_values(static_cast<std::size_t>(C), 506, 0.5, 2), DType::kFloat32);
  SyncBnParams params;
  params.weight = weight.view(), params.bias = bias.view(), params.running_mean = rm.view(), params.running_var = rv.view();
  SyncBnOptions opts;
  opts.mode = mode;
  opts.training = false;
  Tensor save_mean = vec(std::vector<double>(static_cast<std::size_t>(C)), DType::kFloat64), save_invstd = copy(save_mean);
  Buf y = make_buf(s, dt, lay), dx = make_buf(s, dt, lay);
  sync_batch_norm_forward(p.x.view, params, y.view, save_mean, save_invstd, nullptr, opts);
  sync_batch_norm_backward(p.dy.view, p.x.view, weight, save_mean, save_invstd, dx.view, TensorView{}, TensorView{},
                           nullptr, opts);
  for (const Emu& e : kEmus) {
    SCOPED_TRACE(emu_name(e));
    Tensor esm = doubles(C), esi = doubles(C);
    emu_eval_stats(param_of(rm.view()), param_of(rv.view()), opts.eps, C, f64(esm), f64(esi), e);
    EXPECT_TRUE(same_bytes(save_mean, esm, "save_mean"));
    EXPECT_TRUE(same_bytes(save_invstd, esi, "save_invstd"));
    Buf ey = make_buf(s, dt, lay), edx = make_buf(s, dt, lay);
    emu_apply(p.x.view, weight.view(), bias.view(), f64(esm), f64(esi), ey.view, e);
    emu_backward_apply(p.dy.view, p.x.view, weight.view(), f64(esm), f64(esi), nullptr, edx.view, e);
    EXPECT_TRUE(same_bytes(y.storage, ey.storage, "y (whole storage)"));
    EXPECT_TRUE(same_bytes(dx.storage, edx.storage, "grad_x (whole storage)"));
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" + lay_name(std::get<1>(info.param)) + "_" +
         (std::get<2>(info.param) == SyncBnMode::kExact ? "exact" : "default");
}

INSTANTIATE_TEST_SUITE_P(All, SyncBnEmulated,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                                              DType::kBFloat16),
                                            ::testing::Values(Lay::kNchw, Lay::kNhwc, Lay::kStrided, Lay::kNhwcStrided),
                                            ::testing::Values(SyncBnMode::kDefault, SyncBnMode::kExact)),
                         param_name);

// ---------------------------------------------------------------------------------------------
// Finalize over many ranks: the kernels' rank tree has a stack of 8, 16 or 64 entries chosen from
// the rank count; every choice must merge as the CPU backend's (64 entries) does.

/// Gathered default-mode records of `ranks` ranks, C channels: counts 0..999 (some 0), means and
/// M2 (or sums) of every sign and size; rank `bad` (if >= 0) gets a negative count.
std::vector<std::int64_t> synthetic_records(std::int64_t ranks, std::int64_t C, std::uint64_t seed, std::int64_t bad) {
  const std::int64_t w = detail::sbn_record_words(C, false);
  std::vector<std::int64_t> g(static_cast<std::size_t>(ranks * w));
  const std::vector<double> v = test::random_values(static_cast<std::size_t>(ranks * w), seed, 0.0, 1.0);
  for (std::int64_t r = 0; r < ranks; ++r) {
    const double u = v[static_cast<std::size_t>(r * w)];
    g[static_cast<std::size_t>(r * w)] = u < 0.1 ? 0 : static_cast<std::int64_t>(u * 1000.0);
    for (std::int64_t c = 0; c < C; ++c) {
      const double a = v[static_cast<std::size_t>(r * w + 1 + 2 * c)], b = v[static_cast<std::size_t>(r * w + 2 + 2 * c)];
      g[static_cast<std::size_t>(r * w + 1 + 2 * c)] = detail::sbn_double_word((a - 0.5) * std::ldexp(1.0, static_cast<int>(c * 7) - 5));
      g[static_cast<std::size_t>(r * w + 2 + 2 * c)] = detail::sbn_double_word(b * 3.0);
    }
  }
  g[0] = std::max<std::int64_t>(g[0], 2);  // a global count of at least 2: the running statistics move
  if (bad >= 0) g[static_cast<std::size_t>(bad * w)] = -5;
  return g;
}

struct FinalizeOut {
  std::vector<double> mean, invstd, rm, rv, sums, gw;
  std::int64_t nbt;
};

/// The CPU backend (through the phases API) or the kernels' body of depth D (0: the launcher's
/// choice) on the same records.
FinalizeOut finalize_with(const std::vector<std::int64_t>& fg, const std::vector<std::int64_t>& bg, std::int64_t ranks,
                          std::int64_t C, int depth) {
  const std::int64_t w = detail::sbn_record_words(C, false);
  FinalizeOut o;
  o.mean.assign(static_cast<std::size_t>(C), 0.0);
  o.invstd = o.mean, o.gw = o.mean;
  o.rm.assign(static_cast<std::size_t>(C), 0.25);
  o.rv.assign(static_cast<std::size_t>(C), 1.5);
  o.sums.assign(static_cast<std::size_t>(2 * C + 1), 0.0);
  o.nbt = 7;
  const std::int64_t rank = ranks - 1;
  if (depth < 0) {
    const Device cpu = Device::cpu();
    SyncBnParams params;
    params.running_mean = TensorView(o.rm.data(), DType::kFloat64, cpu, {C});
    params.running_var = TensorView(o.rv.data(), DType::kFloat64, cpu, {C});
    params.num_batches_tracked = TensorView(&o.nbt, DType::kInt64, cpu, {1});
    SyncBnOptions opts;
    opts.momentum = std::nullopt;
    sync_batch_norm_finalize_stats(TensorView(const_cast<std::int64_t*>(fg.data()), DType::kInt64, cpu, {ranks, w}),
                                   params, TensorView(o.mean.data(), DType::kFloat64, cpu, {C}),
                                   TensorView(o.invstd.data(), DType::kFloat64, cpu, {C}), opts);
    sync_batch_norm_finalize_backward(TensorView(const_cast<std::int64_t*>(bg.data()), DType::kInt64, cpu, {ranks, w}),
                                      static_cast<int>(rank), SyncBnMode::kDefault,
                                      TensorView(o.invstd.data(), DType::kFloat64, cpu, {C}),
                                      TensorView(o.sums.data(), DType::kFloat64, cpu, {2 * C + 1}),
                                      TensorView(o.gw.data(), DType::kFloat64, cpu, {C}), TensorView{});
    return o;
  }
  detail::SbnFinalizeArgs fa{};
  fa.gathered = fg.data();
  fa.ranks = ranks;
  fa.words = w;
  fa.channels = C;
  fa.eps = 1e-5;
  fa.has_momentum = false;
  fa.running_mean = {o.rm.data(), true, 1};
  fa.running_var = {o.rv.data(), true, 1};
  fa.num_batches_tracked = &o.nbt;
  fa.save_mean = o.mean.data();
  fa.save_invstd = o.invstd.data();
  detail::SbnBackwardFinalizeArgs ba{};
  ba.gathered = bg.data();
  ba.ranks = ranks;
  ba.words = w;
  ba.channels = C;
  ba.rank = rank;
  ba.save_invstd = o.invstd.data();
  ba.sums = o.sums.data();
  ba.grad_weight = {o.gw.data(), true, 1};
  ba.grad_bias = {nullptr, false, 0};
  const Emu e{};
  switch (depth) {
    case 0: emu_finalize(fa, e), emu_finalize_backward(ba, e); break;
    case 8: emu_finalize_depth<8>(fa, e), emu_finalize_backward_depth<8>(ba, e); break;
    case 16: emu_finalize_depth<16>(fa, e), emu_finalize_backward_depth<16>(ba, e); break;
    default: emu_finalize_depth<64>(fa, e), emu_finalize_backward_depth<64>(ba, e); break;
  }
  return o;
}

bool same_doubles(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

void expect_same(const FinalizeOut& cpu, const FinalizeOut& emu) {
  EXPECT_TRUE(same_doubles(cpu.mean, emu.mean)) << "save_mean";
  EXPECT_TRUE(same_doubles(cpu.invstd, emu.invstd)) << "save_invstd";
  EXPECT_TRUE(same_doubles(cpu.rm, emu.rm)) << "running_mean";
  EXPECT_TRUE(same_doubles(cpu.rv, emu.rv)) << "running_var";
  EXPECT_EQ(cpu.nbt, emu.nbt) << "num_batches_tracked";
  EXPECT_TRUE(same_doubles(cpu.sums, emu.sums)) << "sums";
  EXPECT_TRUE(same_doubles(cpu.gw, emu.gw)) << "grad_weight";
}

TEST(SyncBnEmulatedFinalize, EveryStackDepthMergesRanksAsTheCpuBackend) {
  const std::int64_t C = 3;
  for (std::int64_t ranks : {1, 2, 3, 5, 7, 8, 13, 31, 32, 33, 100, 255, 256, 257, 1000, 65535, 65536, 70000}) {
    SCOPED_TRACE(::testing::Message() << ranks << " ranks");
    for (std::int64_t bad : {std::int64_t{-1}, ranks / 2}) {
      const auto fg = synthetic_records(ranks, C, 40 + static_cast<std::uint64_t>(ranks), bad);
      const auto bg = synthetic_records(ranks, C, 90 + static_cast<std::uint64_t>(ranks), bad);
      const FinalizeOut cpu = finalize_with(fg, bg, ranks, C, -1);
      if (bad < 0) {
        EXPECT_TRUE(std::isfinite(cpu.mean[0]) && cpu.nbt == 8) << "the records are meant to be valid";
      } else {
        EXPECT_TRUE(std::isnan(cpu.mean[0]) && cpu.nbt == 7) << "a negative count is meant to be garbage";
      }
      expect_same(cpu, finalize_with(fg, bg, ranks, C, 0));  // the launcher's depth
      for (int depth : {8, 16, 64})
        if (ranks < (std::int64_t{1} << std::min(depth, 62))) {
          SCOPED_TRACE(::testing::Message() << "depth " << depth);
          expect_same(cpu, finalize_with(fg, bg, ranks, C, depth));
        }
    }
  }
}

// A depth too small for the rank count (a launcher's mistake) gives NaN statistics and sums and
// leaves the running statistics alone: defined, never a write past the stack.
TEST(SyncBnEmulatedFinalize, TooSmallADepthGivesNaNNotAnOverflow) {
  const std::int64_t C = 2, ranks = 256;
  const auto fg = synthetic_records(ranks, C, 7, -1), bg = synthetic_records(ranks, C, 8, -1);
  ASSERT_EQ(detail::sbn_rank_depth(ranks), 16);
  const FinalizeOut o = finalize_with(fg, bg, ranks, C, 8);
  for (std::int64_t c = 0; c < C; ++c) {
    EXPECT_TRUE(std::isnan(o.mean[static_cast<std::size_t>(c)]));
    EXPECT_TRUE(std::isnan(o.invstd[static_cast<std::size_t>(c)]));
    EXPECT_EQ(o.rm[static_cast<std::size_t>(c)], 0.25);
    EXPECT_TRUE(std::isnan(o.sums[static_cast<std::size_t>(c)]));
  }
  EXPECT_EQ(o.nbt, 8) << "the bump reads the counts only (valid here)";
}

// merge_scales over gathered exponent words of every kind (sentinels, garbage, finite).
TEST(SyncBnEmulatedMerge, MergeScalesEqualsCpuBackend) {
  for (std::int64_t ranks : {1, 2, 5}) {
    const std::int64_t w = 9;
    std::vector<std::int64_t> g(static_cast<std::size_t>(ranks * w));
    const std::vector<double> v = test::random_values(g.size(), 77 + static_cast<std::uint64_t>(ranks), 0.0, 1.0);
    const std::int64_t kinds[] = {detail::kSbnZeroExponent, detail::kSbnNonFiniteExponent, -1073, 1024, 5, -3,
                                  std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()};
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = kinds[static_cast<std::size_t>(v[i] * 8) % 8];
    Tensor cpu = words(w), emu = words(w);
    sync_batch_norm_merge_scales(TensorView(g.data(), DType::kInt64, Device::cpu(), {ranks, w}), cpu);
    for (const Emu& e : kEmus) {
      emu_merge_scales(g.data(), ranks, w, i64(emu), e);
      EXPECT_TRUE(same_bytes(cpu, emu, "merged exponents"));
    }
  }
}

// The lockstep butterfly is a butterfly: lane t ends with op over every lane, each level reading
// the values of the level before (a sequential update would mix levels), and thread order does
// not matter.
TEST(SyncBnEmulatedGroup, LockstepButterflyIsTheShuffleReduction) {
  for (bool reverse : {false, true}) {
    detail::SbnLockstep<64> grp;  // two warps
    grp.block_threads = 64;
    grp.reverse = reverse;
    std::int64_t v[64];
    for (int r = 0; r < 64; ++r) v[r] = std::int64_t{1} << (grp.thread(r) % 32) | (grp.thread(r) / 32 ? std::int64_t{1} << 40 : 0);
    grp.butterfly(v, [](std::int64_t a, std::int64_t b) { return a | b; });
    for (int r = 0; r < 64; ++r)
      EXPECT_EQ(v[r], 0xffffffffll | (grp.thread(r) / 32 ? std::int64_t{1} << 40 : 0)) << "thread " << grp.thread(r);
    // lane t after the first level (off 16) holds op(own, t ^ 16) of the original values
    std::int64_t s[64];
    for (int r = 0; r < 64; ++r) s[r] = grp.thread(r);
    grp.butterfly(s, [](std::int64_t a, std::int64_t b) { return a + b; });
    for (int r = 0; r < 64; ++r) EXPECT_EQ(s[r], grp.thread(r) < 32 ? 496 : 1520);
  }
}

}  // namespace
}  // namespace detops
