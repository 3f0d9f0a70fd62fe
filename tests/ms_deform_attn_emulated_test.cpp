// The CUDA kernels' bodies of multi-scale deformable attention (include/detops/detail/
// ms_deform_attn_kernels.h) and of the gather-backward engine (detail/gather_backward.h), run on
// the CPU over an emulated grid, byte for byte against the CPU backend: forward, location and
// attention-weight gradients, the atomic scatter (serially, which is the CPU's order of adds per
// element), and the exact mode's three phases as cuda/ms_deform_attn_cuda.cu and
// cuda/gather_backward.cuh run them (records per chunk of planes, a stable sort by key, runs,
// one (run, channel) per thread), with one plane per chunk so that every plane0 is exercised.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "detops/detail/gather_backward.h"
#include "detops/detail/ms_deform_attn_kernels.h"
#include "internal/ms_deform_attn_backend.h"
#include "ms_deform_attn_test_util.h"

namespace detops {
namespace {

/// The validated call the backends would get for these tensors.
internal::MsdaCall make_call(const test::MsdaTensors& t, const ref::MsdaProblemRef& pr) {
  internal::MsdaCall c{};
  c.op = "emulated";
  c.value = t.value.view;
  c.spatial_shapes = t.shapes.view;
  c.level_start_index = t.starts.view;
  c.sampling_locations = t.loc.view;
  c.attention_weights = t.attn.view;
  c.shape = {t.B, t.S, t.M, t.D, t.Q, t.L, t.P};
  for (std::int64_t l = 0; l < t.L; ++l) c.levels.push_back({pr.shapes[2 * l], pr.shapes[2 * l + 1], pr.start(l)});
  return c;
}

/// The exact mode's phases 1-3 over an emulated grid, into a.grad_value (already zeroed).
template <class T, class Loc>
void emulated_exact(const internal::MsdaCall& call, const detail::MsdaBackwardArgs<T, Loc>& a, bool channels_fastest) {
  using A = acc_t<T>;
  const detail::MsdaShape& sh = call.shape;
  const std::int64_t per_plane = sh.Q * sh.L * sh.P, n = per_plane * 4;
  std::vector<std::uint64_t> keys(n);
  std::vector<std::int64_t> ids(n), sources(n), sorted_ids(n), sorted_sources(n);
  std::vector<A> weights(n), sorted_weights(n);
  const detail::GatherRecords<A> rec{keys.data(), ids.data(), weights.data(), sources.data()};
  for (std::int64_t plane0 = 0; plane0 < sh.B * sh.M; ++plane0) {  // one plane per chunk
    const std::uint64_t sentinel = static_cast<std::uint64_t>(sh.S);
    // the engine's initialisation (gather_init_cuda), then phase 1, which writes every record anyway:
    // a skipped sample's or outside corner's own sentinel
    for (std::int64_t j = 0; j < n; ++j) detail::gather_init_record(j, rec, sentinel);
    for (std::int64_t t = 0; t < per_plane; ++t) detail::msda_exact_records_element(t, a, plane0, sentinel, rec);
    // CUB's stable radix sort of (key, id) pairs, the permutation, run-length encode and scan
    std::vector<std::uint64_t> sorted_keys(keys);
    std::iota(sorted_ids.begin(), sorted_ids.end(), std::int64_t{0});
    std::stable_sort(sorted_ids.begin(), sorted_ids.end(), [&](std::int64_t x, std::int64_t y) { return keys[x] < keys[y]; });
    for (std::int64_t r = 0; r < n; ++r) {
      sorted_keys[r] = keys[ids[sorted_ids[r]]];
      detail::gather_permute_record(r, sorted_ids.data(), weights.data(), sources.data(), sorted_weights.data(),
                                    sorted_sources.data());
    }
    std::vector<std::uint64_t> run_keys;
    std::vector<std::int64_t> run_offsets, run_lengths;
    for (std::int64_t r = 0; r < n; ++r) {
      if (r == 0 || sorted_keys[r] != sorted_keys[r - 1]) {
        run_keys.push_back(sorted_keys[r]);
        run_offsets.push_back(r);
        run_lengths.push_back(0);
      }
      ++run_lengths.back();
    }
    const std::int64_t runs = static_cast<std::int64_t>(run_keys.size());  // the sentinel's run included
    const detail::GatherSorted<A> sorted{run_keys.data(), run_offsets.data(), run_lengths.data(), sorted_weights.data(),
                                         sorted_sources.data()};
    const detail::GatherSumArgs<T, A> sum{sorted,     a.grad_out, a.gos[2], a.grad_value, a.gvs[3], sh.D, sentinel,
                                          detail::kGatherPartial};
    const detail::MsdaValueTarget target = internal::msda_value_target(call, plane0);
    for (std::int64_t t = 0; t < runs * sh.D; ++t) detail::gather_run_element(t, sum, runs, channels_fastest, target);
  }
}

template <class T, class Loc>
void check_dtype(DType dt, DType loc_dt, bool strided) {
  // a 1x1 level all samples reach: runs of 320 records, longer than one partial (256)
  const ref::MsdaProblemRef pr = test::msda_random_problem(2, 2, 5, 80, 4, {3, 5, 4, 4, 1, 1}, 91);
  const test::MsdaTensors t(pr, dt, loc_dt, strided);
  const internal::MsdaCall call0 = make_call(t, pr);
  const test::MsdaBuf go = test::msda_filled({t.B, t.Q, t.M * t.D}, dt, test::random_values(t.B * t.Q * t.M * t.D, 3),
                                             strided);
  // forward
  const test::MsdaBuf cpu_out = test::msda_run_forward(t, strided);
  test::MsdaBuf emu_out = test::msda_buf({t.B, t.Q, t.M * t.D}, dt, strided);
  detail::MsdaForwardArgs<T, Loc> fa{};
  fa.in = internal::msda_inputs<T, Loc>(call0, call0.levels.data());
  fa.out = static_cast<T*>(emu_out.view.data);
  internal::copy_strides(emu_out.view, fa.os);
  for (std::int64_t i = 0; i < emu_out.view.numel(); ++i) detail::msda_forward_element(i, fa);
  EXPECT_TRUE(test::msda_same(cpu_out, emu_out)) << "forward";

  for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
    SCOPED_TRACE(to_string(mode));
    const test::MsdaGrads cpu = test::msda_run_backward(t, go, mode, strided);
    for (bool channels_fastest : {true, false}) {
      if (mode == BackwardMode::kAtomic && !channels_fastest) continue;
      test::MsdaGrads emu;
      emu.value = test::msda_buf({t.B, t.S, t.M, t.D}, dt, strided);
      emu.loc = test::msda_buf({t.B, t.Q, t.M, t.L, t.P, 2}, loc_dt, strided);
      emu.attn = test::msda_buf({t.B, t.Q, t.M, t.L, t.P}, dt, strided);
      internal::MsdaCall call = call0;
      call.grad_output = go.view;
      call.grad_value = emu.value.view;
      call.grad_sampling_locations = emu.loc.view;
      call.grad_attention_weights = emu.attn.view;
      const detail::MsdaBackwardArgs<T, Loc> a = internal::msda_backward_args<T, Loc>(call, call.levels.data());
      for (std::int64_t i = 0; i < t.B * t.Q * t.M * t.L * t.P; ++i) detail::msda_location_grad_element(i, a);
      for (std::int64_t i = 0; i < emu.value.view.numel(); ++i)
        detail::msda_zero_value_element(i, a.grad_value, a.gvs[0], a.gvs[1], a.gvs[2], a.gvs[3], call.shape);
      if (mode == BackwardMode::kExact) {
        emulated_exact(call, a, channels_fastest);
      } else {
        for (std::int64_t i = 0; i < t.B * t.Q * t.M * t.D; ++i)
          detail::msda_value_scatter_element(i, a, [&](std::int64_t off, acc_t<T> v) {
            a.grad_value[off] = from_acc<T>(to_acc(a.grad_value[off]) + v);
          });
      }
      EXPECT_TRUE(test::msda_same(cpu.value, emu.value)) << "grad_value, channels_fastest " << channels_fastest;
      EXPECT_TRUE(test::msda_same(cpu.loc, emu.loc)) << "grad_sampling_locations";
      EXPECT_TRUE(test::msda_same(cpu.attn, emu.attn)) << "grad_attention_weights";
    }
  }
}

TEST(MsDeformAttnEmulated, KernelBodiesMatchTheCpuBackendByteForByte) {
  for (bool strided : {false, true}) {
    SCOPED_TRACE(strided ? "strided" : "contiguous");
    check_dtype<float, float>(DType::kFloat32, DType::kFloat32, strided);
    check_dtype<double, float>(DType::kFloat64, DType::kFloat32, strided);
    check_dtype<Half, Half>(DType::kFloat16, DType::kFloat16, strided);
    check_dtype<BFloat16, double>(DType::kBFloat16, DType::kFloat64, strided);
  }
}

}  // namespace
}  // namespace detops
