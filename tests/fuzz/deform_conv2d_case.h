// The decoded case of the deform_conv2d fuzz targets: a dtype, small shapes (groups, offset
// groups, kernel, stride, padding, dilation), mask and bias present or absent, strides of any form
// for every tensor, injected errors (sizes, ranks, dtypes, options, negative or overlapping
// strides, an output inside another tensor's buffer), and values: moderate k/32 (offsets k/32,
// integers and far jumps, so samples fall inside the map, outside it and exactly on its rows,
// columns and borders), or, in a quarter of the cases, specials now and then. Whether the call must
// raise (Expect) follows from the sizes, ranks, dtypes and options the header documents as errors,
// checked on what was decoded (an injected size that happens to be valid again is simply a valid
// call), and from the placement. Also: the float64 reference problem of a case and the error
// bounds of its results.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "reference/deform_conv2d_reference.h"

namespace detops {
namespace fuzz {

/// A former gap (see README.md in this directory), found by this harness: deform_conv2d_backward
/// with Cin = 0 and Cout = 0 (N > 0) returned without writing grad_offset and grad_mask (nothing
/// needed workspace and the entry point returned early). true: they are compared (zeros); false
/// tolerates the old behaviour. Regression input: regressions/deform_conv2d_backward/.
constexpr bool kDeformZeroFillsWithoutChannels = true;

struct DeformConv2dCase {
  DType dt = DType::kFloat32;
  DeformConv2dOptions opt;
  DeformConv2dBackwardOptions backward;
  // result: output (forward) or grad_output (backward)
  Tensor4 input, weight, offset, mask, bias, result;
  Tensor4 grad_input, grad_weight, grad_offset, grad_mask, grad_bias;
  bool has_mask = true, has_bias = true;  // backward: has_bias = grad_bias requested
  bool has_grad[5] = {true, true, true, true, true};  // grad_input, _weight, _offset, _mask, _bias
  // The shape as the library infers it from the decoded sizes (meaningful when the sizes are valid).
  std::int64_t N = 0, Cin = 0, H = 0, W = 0, Cout = 0, kh = 0, kw = 0, groups = 1, offset_groups = 1, Ho = 0, Wo = 0;
  bool moderate_values = true;  // every value read is a moderate k/32 (offsets: see decode_offsets)
  bool cross_overlap = false;   // an output was placed inside another tensor's buffer, sharing bytes
  Expect expect = Expect::kSuccess;
};

/// The output extent torchvision's formula gives (<= 0: no output position), or 0 for options the
/// library refuses anyway (the specs still need a size), including an in + 2 * pad or a dilated
/// kernel beyond int64 (the library's error: it must never wrap them).
inline std::int64_t deform_out_size(std::int64_t in, std::int64_t pad, std::int64_t k, std::int64_t stride,
                                    std::int64_t dilation) {
  if (stride <= 0 || dilation <= 0 || pad < 0 || k <= 0) return 0;
  std::int64_t padded = 0, eff = 0;
  if (__builtin_mul_overflow(pad, 2, &padded) || __builtin_add_overflow(padded, in, &padded) ||
      __builtin_mul_overflow(dilation, k - 1, &eff) || __builtin_add_overflow(eff, 1, &eff))
    return 0;
  if (padded < eff) return 0;
  return (padded - eff) / stride + 1;
}

/// The extent the unchecked formula gave, every step modulo 2^64 as the wrap did (pad = INT64_MAX:
/// a small positive Ho): the decoder sizes the tensors by it, so only the library's overflow check
/// can refuse such a call.
inline std::int64_t deform_wrapped_out_size(std::int64_t in, std::int64_t pad, std::int64_t k, std::int64_t stride,
                                            std::int64_t dilation) {
  if (stride <= 0 || dilation <= 0 || pad < 0 || k <= 0) return 0;
  const std::uint64_t padded = static_cast<std::uint64_t>(in) + 2u * static_cast<std::uint64_t>(pad);
  const std::uint64_t eff = static_cast<std::uint64_t>(dilation) * static_cast<std::uint64_t>(k - 1) + 1u;
  const auto diff = static_cast<std::int64_t>(padded - eff);
  if (diff < 0 || diff / stride == std::numeric_limits<std::int64_t>::max()) return 0;
  return diff / stride + 1;
}

/// The size the decoder gives the Ho / Wo dimensions: the true extent when it is small, else the
/// wrapped one when that is small, else 1 (a mismatch the library must refuse).
inline std::int64_t deform_spec_out_size(std::int64_t in, std::int64_t pad, std::int64_t k, std::int64_t stride,
                                         std::int64_t dilation) {
  const std::int64_t exact = deform_out_size(in, pad, k, stride, dilation);
  if (exact >= 1 && exact <= 16) return exact;
  const std::int64_t wrapped = deform_wrapped_out_size(in, pad, k, stride, dilation);
  return wrapped >= 1 && wrapped <= 16 ? wrapped : 1;
}

/// An option value far beyond any map: ones whose 2 * pad or dilation * (k - 1) wrapped int64
/// once, and ones that fit but give a huge output (or, as a stride, one output position).
inline std::int64_t deform_huge_option(Reader& r) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  static const std::int64_t kHuge[] = {kMax,      kMax - 1, kMax / 2, kMax / 2 + 1, std::int64_t{1} << 61,
                                       std::int64_t{1} << 40, (std::int64_t{1} << 32) + 3};
  return kHuge[r.u8() % (sizeof(kHuge) / sizeof(kHuge[0]))];
}

/// The documented argument rules (include/detops/deform_conv2d.h) applied to the decoded specs:
/// sets the inferred shape, and e to an error for anything the header calls one. specs: input,
/// weight, offset, mask, bias (forward) or nothing, output / grad_output, then the five gradients
/// (backward); `present[i]` says whether spec i is passed (an absent one is an empty view).
inline void deform_validate(const Spec* s, const bool* present, bool backward, DeformConv2dCase* c, Expect* e) {
  const DeformConv2dOptions& o = c->opt;
  if (o.stride_h <= 0 || o.stride_w <= 0 || o.dilation_h <= 0 || o.dilation_w <= 0 || o.pad_h < 0 || o.pad_w < 0)
    expect_error(e);
  if (backward && c->backward.mode != BackwardMode::kAtomic && c->backward.mode != BackwardMode::kExact)
    expect_error(e);
  if (backward && c->backward.border_rule != DeformBorderRule::kTorchvision &&
      c->backward.border_rule != DeformBorderRule::kMmcv)
    expect_error(e);
  const Spec &in = s[0], &wt = s[1], &off = s[2], &mk = s[3], &bs = s[4], &res = s[5];
  // dtypes: a float input, every other tensor of its dtype
  if (!is_float_dtype(in.dtype)) {
    if (in.dtype == DType::kInt32) expect_error(e);
    else expect_unknown_dtype(e);
  }
  for (int i = 1; i < 11; ++i)
    if (present[i] && s[i].dtype != in.dtype) expect_error(e);
  // ranks
  for (int i = 0; i < 11; ++i)
    if (present[i] && s[i].rank != (i == 4 || i == 10 ? 1 : 4)) {
      expect_error(e);
      return;  // the sizes below assume the ranks
    }
  c->N = in.sizes[0], c->Cin = in.sizes[1], c->H = in.sizes[2], c->W = in.sizes[3];
  c->Cout = wt.sizes[0], c->kh = wt.sizes[2], c->kw = wt.sizes[3];
  if (c->kh <= 0 || c->kw <= 0) {
    expect_error(e);
    return;
  }
  const std::int64_t per_group = wt.sizes[1];
  if (c->Cin == 0 ? per_group != 0 : (per_group <= 0 || c->Cin % per_group != 0)) {
    expect_error(e);
    return;
  }
  c->groups = c->Cin == 0 ? 1 : c->Cin / per_group;
  if (c->Cout % c->groups != 0) expect_error(e);
  c->Ho = deform_out_size(c->H, o.pad_h, c->kh, o.stride_h, o.dilation_h);
  c->Wo = deform_out_size(c->W, o.pad_w, c->kw, o.stride_w, o.dilation_w);
  if (c->Ho <= 0 || c->Wo <= 0) {
    expect_error(e);
    return;
  }
  const std::int64_t taps = c->kh * c->kw;
  std::int64_t columns = 0;  // one image's columns: more than 2^55 elements is an error
  if (__builtin_mul_overflow(c->Cin, taps, &columns) || __builtin_mul_overflow(columns, c->Ho, &columns) ||
      __builtin_mul_overflow(columns, c->Wo, &columns) || columns > (std::int64_t{1} << 55)) {
    expect_error(e);
    return;
  }
  if (off.sizes[0] != c->N || off.sizes[2] != c->Ho || off.sizes[3] != c->Wo || off.sizes[1] <= 0 ||
      off.sizes[1] % (2 * taps) != 0) {
    expect_error(e);
    return;
  }
  c->offset_groups = off.sizes[1] / (2 * taps);
  if (c->Cin % c->offset_groups != 0) expect_error(e);
  const std::int64_t mask_sizes[4] = {c->N, c->offset_groups * taps, c->Ho, c->Wo};
  const std::int64_t result_sizes[4] = {c->N, c->Cout, c->Ho, c->Wo};
  auto sizes_are = [](const Spec& t, const std::int64_t* want) {
    for (int d = 0; d < t.rank; ++d)
      if (t.sizes[d] != want[d]) return false;
    return true;
  };
  if (present[3] && !sizes_are(mk, mask_sizes)) expect_error(e);
  if (present[4] && bs.sizes[0] != c->Cout) expect_error(e);
  if (!sizes_are(res, result_sizes)) expect_error(e);
  // gradients: the sizes of what they differentiate; grad_mask only with a mask
  for (int i = 6; i < 10; ++i)
    if (present[i] && !sizes_are(s[i], s[i - 6].sizes)) expect_error(e);
  if (present[9] && !present[3]) expect_error(e);
  if (present[10] && s[10].sizes[0] != c->Cout) expect_error(e);
}

/// Moderate k/32 values, or (when `specials`) a special now and then.
inline std::vector<double> deform_values(Reader& r, std::int64_t n, double scale, bool specials, bool* moderate_values) {
  std::vector<double> v(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (double& x : v) {
    if (specials && r.one_in(24)) {
      x = special(r);
      *moderate_values = false;
    } else {
      x = moderate(r) * scale;
    }
  }
  return v;
}

/// Offsets: k/32 in [-4, 4) (inside the map and across its edges), integers in [-3, 3] (a sample
/// exactly on a pixel row or column, on row 0 or H - 1, or at -1 or H where torchvision's bilinear
/// and its derivative part ways), half-integers, far jumps of up to +-12 (no corner on the map),
/// or a special now and then.
inline std::vector<double> decode_offsets(Reader& r, std::int64_t n, bool specials, bool* moderate_values) {
  std::vector<double> v(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (double& x : v) {
    const int kind = r.u8() % 16;
    if (kind < 9) x = moderate(r);
    else if (kind < 13) x = static_cast<double>(r.range(-3, 3));
    else if (kind < 14) x = static_cast<double>(r.range(-12, 11)) + 0.5;
    else if (kind < 15) x = static_cast<double>(r.range(-12, 12));
    else if (specials) x = special(r), *moderate_values = false;
    else x = moderate(r) / 8;  // fine fractions, k/256
  }
  return v;
}

inline DeformConv2dCase decode_deform_conv2d(Reader& r, Arena& arena, bool backward) {
  DeformConv2dCase c;
  Expect& e = c.expect;
  c.dt = decode_float_dtype(r, &e);
  // nominal shape: groups x (Cin / groups) input channels, groups x (Cout / groups) outputs
  const std::int64_t N = r.range(0, 2), groups = r.range(1, 3), cpg = r.range(0, 3), opg = r.range(0, 2);
  const std::int64_t Cin = groups * cpg, Cout = groups * opg;
  const std::int64_t kh = r.range(1, 3), kw = r.range(1, 3);
  std::int64_t og = r.range(1, 3);
  if (Cin % og != 0) og = 1;
  const std::int64_t H = r.range(r.one_in(16) ? 0 : 1, 5), W = r.range(r.one_in(16) ? 0 : 1, 5);
  DeformConv2dOptions& o = c.opt;
  o.stride_h = r.one_in(8) ? 3 : r.range(1, 2);
  o.stride_w = r.one_in(8) ? 3 : r.range(1, 2);
  o.pad_h = r.range(0, 2), o.pad_w = r.range(0, 2);
  o.dilation_h = r.range(1, 2), o.dilation_w = r.range(1, 2);
  auto set_option = [&o](std::uint8_t which, std::int64_t v) {
    switch (which % 6) {
      case 0: o.stride_h = v; break;
      case 1: o.stride_w = v; break;
      case 2: o.dilation_h = v; break;
      case 3: o.dilation_w = v; break;
      case 4: o.pad_h = v; break;
      default: o.pad_w = v; break;
    }
  };
  if (r.one_in(32)) {  // an option the library refuses (or, for a zero pad, a valid one)
    const std::int64_t v = r.range(-2, 0);
    set_option(r.u8(), v);
  }
  for (int huge = r.one_in(16) ? 1 + r.u8() % 2 : 0; huge > 0; --huge) {  // checked size arithmetic
    const std::int64_t v = deform_huge_option(r);
    set_option(r.u8(), v);
  }
  if (backward) {
    // one byte: the mode from its low 5 bits, the border rule from the top 3 (so the seeds
    // written before the rule existed decode as they did, their top bits picking a rule)
    const int byte = r.u8(), m = byte % 32, rule = byte >> 5;
    c.backward.mode = m < 15 ? BackwardMode::kExact : m < 30 ? BackwardMode::kAtomic
                      : m == 30 ? BackwardMode::kTruncated  // refused: kExact is exact
                                : static_cast<BackwardMode>(7);
    c.backward.border_rule = rule < 4   ? DeformBorderRule::kTorchvision
                             : rule < 7 ? DeformBorderRule::kMmcv
                                        : static_cast<DeformBorderRule>(2);  // refused
  }
  c.has_mask = !r.one_in(3);
  c.has_bias = backward ? !r.one_in(3) : r.one_in(2);
  if (backward)
    for (int i = 0; i < 5; ++i) c.has_grad[i] = !r.one_in(5);
  c.has_grad[3] = c.has_grad[3] && c.has_mask;
  c.has_grad[4] = c.has_bias;
  if (backward && !c.has_mask && r.one_in(24)) c.has_grad[3] = true;  // grad_mask without mask: an error
  const std::int64_t Ho = deform_spec_out_size(H, o.pad_h, kh, o.stride_h, o.dilation_h);
  const std::int64_t Wo = deform_spec_out_size(W, o.pad_w, kw, o.stride_w, o.dilation_w);

  // nominal sizes, then one size, rank or dtype changed now and then
  std::int64_t sizes[11][4] = {{N, Cin, H, W},           {Cout, cpg, kh, kw},      {N, 2 * og * kh * kw, Ho, Wo},
                               {N, og * kh * kw, Ho, Wo}, {Cout, 0, 0, 0},          {N, Cout, Ho, Wo},
                               {N, Cin, H, W},           {Cout, cpg, kh, kw},      {N, 2 * og * kh * kw, Ho, Wo},
                               {N, og * kh * kw, Ho, Wo}, {Cout, 0, 0, 0}};
  int ranks[11] = {4, 4, 4, 4, 1, 4, 4, 4, 4, 4, 1};
  bool present[11] = {true, true, true, c.has_mask, !backward && c.has_bias, true};
  for (int i = 6; i < 11; ++i) present[i] = backward && c.has_grad[i - 6];
  DType dtypes[11];
  for (DType& d : dtypes) d = c.dt;
  if (r.one_in(12)) {
    const int t = r.u8() % 11, d = r.u8() % ranks[t];
    if (present[t]) sizes[t][d] = sizes[t][d] == 0 || r.one_in(2) ? sizes[t][d] + 1 : sizes[t][d] - 1;
  }
  if (r.one_in(48)) {  // mask / grad_mask of rank 3, bias / grad_bias of rank 2
    const int t = (r.u8() % 2 ? 3 : 4) + (backward && r.one_in(2) ? 6 : 0);
    if (ranks[t] == 1) ranks[t] = 2, sizes[t][1] = 1;
    else ranks[t] = 3, sizes[t][2] *= sizes[t][3];
  }
  if (r.one_in(40)) {  // one tensor of another floating dtype than input's
    static const DType kinds[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
    const int t = 1 + r.u8() % 10;
    const DType other = kinds[r.u8() % 4];
    if (other != c.dt) dtypes[t] = other;
  }

  static const char* const names[2][11] = {
      {"input", "weight", "offset", "mask", "bias", "output", "grad_input", "grad_weight", "grad_offset", "grad_mask",
       "grad_bias"},
      {"input", "weight", "offset", "mask", "bias", "grad_output", "grad_input", "grad_weight", "grad_offset",
       "grad_mask", "grad_bias"}};
  // broadcast, overlapping and negative strides in a third of the cases (with eleven tensors,
  // always allowing them would make most calls errors)
  const bool odd_strides = r.one_in(3);
  Spec specs[11];
  for (int i = 0; i < 11; ++i) {
    const bool output = backward ? i >= 6 : i == 5;
    specs[i] = make_spec(r, names[backward][i], dtypes[i], ranks[i], sizes[i], output, odd_strides);
  }
  deform_validate(specs, present, backward, &c, &e);

  Tensor4* ts[11] = {&c.input, &c.weight, &c.offset, &c.mask, &c.bias, &c.result,
                     &c.grad_input, &c.grad_weight, &c.grad_offset, &c.grad_mask, &c.grad_bias};
  for (int i = 0; i < 11; ++i) {
    if (!present[i]) continue;
    *ts[i] = place(arena, specs[i], r.u8() % 2);
    for (int d = 0; d < specs[i].rank; ++d)
      if (specs[i].strides[d] < 0) expect_error(&e);  // the library takes non-negative strides only
    // outputs: two indices on one element are refused; the library's test is conservative
    if (specs[i].output && self_overlapping_exact(ts[i]->view)) expect_error(&e);
    if (specs[i].output && self_overlapping_conservative(ts[i]->view)) expect_maybe(&e);
  }
  if (r.one_in(12)) {  // an output inside another tensor's buffer (sharing bytes with it: an error)
    std::vector<int> outs, hosts;
    for (int i = 0; i < 11; ++i)
      if (present[i]) (specs[i].output ? outs : hosts).push_back(i);
    if (!outs.empty()) {
      const int out = outs[r.u8() % outs.size()];
      for (int i : outs)
        if (i != out) hosts.push_back(i);
      // the first host from a decoded one on whose buffer the output fits, at a decoded offset
      const std::size_t first = r.u8() % hosts.size();
      const std::int64_t at = r.u8();
      for (std::size_t k = 0; k < hosts.size(); ++k) {
        const int host = hosts[(first + k) % hosts.size()];
        const std::int64_t room = static_cast<std::int64_t>(arena[ts[host]->buffer].region) - specs[out].span_bytes();
        Tensor4 moved;
        if (room < 0 || !place_inside(arena, *ts[host], specs[out], at % (room + 1), &moved)) continue;
        *ts[out] = moved;
        if (spans_intersect(moved.view, ts[host]->view)) c.cross_overlap = true, expect_error(&e);
        break;
      }
    }
  }

  // values (inputs), then the poisoned outputs (after: an output inside an input's buffer
  // overwrites its bytes, as it would in the caller's memory)
  const bool specials = r.one_in(4);
  write_values(c.input.view, deform_values(r, count(c.input.view), 1.0, specials, &c.moderate_values));
  write_values(c.weight.view, deform_values(r, count(c.weight.view), 1.0, specials, &c.moderate_values));
  write_values(c.offset.view, decode_offsets(r, count(c.offset.view), specials, &c.moderate_values));
  if (present[3]) write_values(c.mask.view, deform_values(r, count(c.mask.view), 0.25, specials, &c.moderate_values));
  if (present[4]) write_values(c.bias.view, deform_values(r, count(c.bias.view), 1.0, specials, &c.moderate_values));
  if (backward)
    write_values(c.result.view, deform_values(r, count(c.result.view), 1.0, specials, &c.moderate_values));
  for (int i = 0; i < 11; ++i)
    if (present[i] && specs[i].output) poison(ts[i]->view);

  describe("deform_conv2d {} dtype {} stride ({}, {}) pad ({}, {}) dilation ({}, {}) mask {} bias {}{}",
           backward ? "backward" : "forward", dtype_name(c.dt), o.stride_h, o.stride_w, o.pad_h, o.pad_w, o.dilation_h,
           o.dilation_w, c.has_mask, c.has_bias,
           backward ? fmt::format(" mode {} border rule {}", to_string(c.backward.mode),
                                  static_cast<int>(c.backward.border_rule))
                    : std::string());
  describe("  inferred: N {} Cin {} H {} W {} Cout {} kernel {}x{} groups {} offset_groups {} output {}x{}", c.N, c.Cin,
           c.H, c.W, c.Cout, c.kh, c.kw, c.groups, c.offset_groups, c.Ho, c.Wo);
  for (int i = 0; i < 11; ++i)
    if (present[i]) describe("  {}: {} ({})", names[backward][i], describe_view(ts[i]->view), form_name(specs[i].form));
  describe("  values {} expect {}{}", c.moderate_values ? "moderate" : "with specials", expect_name(e),
           c.cross_overlap ? " (an output shares bytes with another tensor)" : "");
  note_expect(e, false, c.cross_overlap);
  return c;
}

// ---------------------------------------------------------------------------------------------
// The reference and the error bounds

/// The float64 reference problem of a valid case (NCHW-ordered values as the library reads them).
/// `absolute`: every value but the offsets replaced by its magnitude, so that each result is the
/// sum of the magnitudes of its terms (bilinear and col2im weights are >= 0), which bounds the
/// rounding error of any order of summation. grad_offset's terms are corner differences, which
/// this does not bound: see deform_offset_magnitudes.
inline test::DeformConv2dProblem deform_problem(const DeformConv2dCase& c, bool backward, bool absolute = false) {
  test::DeformConv2dProblem p{};
  p.N = c.N, p.Cin = c.Cin, p.H = c.H, p.W = c.W, p.Cout = c.Cout, p.kh = c.kh, p.kw = c.kw;
  p.groups = c.groups, p.offset_groups = c.offset_groups, p.opt = c.opt;
  p.border_rule = c.backward.border_rule;
  p.has_mask = c.has_mask;
  p.has_bias = c.has_bias;
  p.input = read_values(c.input.view);
  p.weight = read_values(c.weight.view);
  p.offset = read_values(c.offset.view);
  if (c.has_mask) p.mask = read_values(c.mask.view);
  if (c.has_bias && !backward) p.bias = read_values(c.bias.view);
  if (c.has_bias && backward) p.bias.assign(static_cast<std::size_t>(c.Cout), 0.0);
  if (backward) p.grad_output = read_values(c.result.view);
  if (absolute)
    for (std::vector<double>* v : {&p.input, &p.weight, &p.mask, &p.bias, &p.grad_output})
      for (double& x : *v) x = std::fabs(x);
  // The reference forms a plane's address even for an empty map (it reads no element there), and
  // takes an empty grad_output for "forward only": give empty vectors one unread element.
  for (std::vector<double>* v : {&p.input, &p.weight, &p.offset, &p.grad_output})
    if (v->empty() && (backward || v != &p.grad_output)) v->push_back(0.0);
  return p;
}

/// What the reference does not give: for every grad_offset element, the sum over its terms of
/// |m| * (the corner magnitudes its coordinate weight combines) * |grad_columns| (with
/// |grad_columns| = sum of |weight| |grad_output|); and for every input pixel, how many samples add
/// into it (the atomic mode's roundings in 16-bit dtypes). Follows the reference's conventions.
struct DeformBounds {
  std::vector<double> offset_mag;
  std::vector<double> input_adds;
};

inline DeformBounds deform_bounds(const test::DeformConv2dProblem& p) {
  const std::int64_t N = p.N, C = p.Cin, H = p.H, W = p.W, O = p.Cout, kh = p.kh, kw = p.kw;
  const std::int64_t Ho = p.Ho(), Wo = p.Wo(), K = kh * kw, og = p.offset_groups;
  const std::int64_t cpg = C / p.groups, opg = O / p.groups, cpog = og > 0 ? C / og : 0;
  const auto sz = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  DeformBounds b;
  b.offset_mag.assign(sz(N * 2 * og * K * Ho * Wo), 0.0);
  b.input_adds.assign(sz(N * C * H * W), 0.0);
  const DeformConv2dOptions& o = p.opt;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t g = c / cpg, cl = c % cpg, t0 = (c / cpog) * K;
      for (std::int64_t i = 0; i < kh; ++i)
        for (std::int64_t j = 0; j < kw; ++j)
          for (std::int64_t ho = 0; ho < Ho; ++ho)
            for (std::int64_t wo = 0; wo < Wo; ++wo) {
              const std::int64_t t = t0 + i * kw + j;
              const std::size_t oy = sz(((n * 2 * og * K + 2 * t) * Ho + ho) * Wo + wo), ox = oy + sz(Ho * Wo);
              const double y = static_cast<double>(ho * o.stride_h - o.pad_h + i * o.dilation_h) + p.offset[oy];
              const double x = static_cast<double>(wo * o.stride_w - o.pad_w + j * o.dilation_w) + p.offset[ox];
              const double m = p.has_mask ? std::fabs(p.mask[sz(((n * og * K + t) * Ho + ho) * Wo + wo)]) : 1.0;
              double gc = 0;
              for (std::int64_t oc = g * opg; oc < (g + 1) * opg; ++oc)
                gc += std::fabs(p.weight[sz(((oc * cpg + cl) * kh + i) * kw + j)]) *
                      std::fabs(p.grad_output[sz(((n * O + oc) * Ho + ho) * Wo + wo)]);
              const double fy = std::floor(y), fx = std::floor(x);
              auto at = [&](double yy, double xx) {
                if (!(yy >= 0 && yy < static_cast<double>(H) && xx >= 0 && xx < static_cast<double>(W))) return 0.0;
                return std::fabs(p.input[sz((n * C + c) * H * W) + sz(static_cast<std::int64_t>(yy) * W +
                                                                        static_cast<std::int64_t>(xx))]);
              };
              const double v00 = at(fy, fx), v01 = at(fy, fx + 1), v10 = at(fy + 1, fx), v11 = at(fy + 1, fx + 1);
              const double dy = y - fy, dx = x - fx;
              b.offset_mag[oy] += m * (dx * (v11 + v01) + (1 - dx) * (v10 + v00)) * gc;
              b.offset_mag[ox] += m * (dy * (v11 + v10) + (1 - dy) * (v01 + v00)) * gc;
              if (!(y > -1 && y < static_cast<double>(H) && x > -1 && x < static_cast<double>(W))) continue;
              for (std::int64_t yp = static_cast<std::int64_t>(fy); yp <= static_cast<std::int64_t>(fy) + 1; ++yp)
                for (std::int64_t xp = static_cast<std::int64_t>(fx); xp <= static_cast<std::int64_t>(fx) + 1; ++xp)
                  if (yp >= 0 && yp < H && xp >= 0 && xp < W && std::fabs(y - static_cast<double>(yp)) < 1 &&
                      std::fabs(x - static_cast<double>(xp)) < 1)
                    b.input_adds[sz((n * C + c) * H * W + yp * W + xp)] += 1;
            }
    }
  return b;
}

/// (1 + u)^n - 1: the largest relative change n roundings of unit roundoff u make to a term (for
/// any n: no first-order approximation).
inline double deform_growth(double n, double u) { return std::expm1(n * std::log1p(u)); }

/// The bound on |got - want| for a result whose terms (magnitudes summing to `mag`) each went
/// through `acc_roundings` roundings in the accumulation type and `t_roundings` in the dtype before
/// the final rounding to the dtype: each term is off by at most the growth factor of its roundings,
/// the stored result by one more rounding of the dtype, and a 16-bit dtype's subnormal spacing
/// adds an absolute half step per rounding. Twice that, for margin.
inline double deform_tolerance(DType dt, double mag, double want, double acc_roundings, double t_roundings) {
  const double ea = acc_roundoff(dt), ut = unit_roundoff(dt);
  const double f = (1 + deform_growth(acc_roundings, ea)) * (1 + deform_growth(t_roundings, ut)) - 1;
  const double tiny = dtype_min_normal(dt) * ut;  // half the smallest subnormal step
  return 2 * (f * mag * (1 + ut) + ut * std::fabs(want) + (t_roundings + 1) * tiny);
}

/// Compares a result with the reference, element by element, where every term is small enough
/// that no partial sum comes near the dtype's overflow (then the bound holds).
template <class Tol>
void deform_compare(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                    const std::vector<double>& mag, DType dt, const Tol& tol_of) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(mag[i] < dtype_max(dt) / 16)) continue;
    const double tol = tol_of(i);
    FUZZ_CHECK(close(got[i], want[i], tol), "{}[{}] = {} but the float64 reference gives {} (tol {:.3g}, terms' "
               "magnitude {:.3g})", what, i, got[i], want[i], tol, mag[i]);
  }
}

inline void check_deform_error_code(ErrorCode code, const std::string& msg, bool oom_possible) {
  FUZZ_CHECK(code == ErrorCode::kInvalidArgument || (oom_possible && code == ErrorCode::kOutOfMemory),
             "unexpected error code {} ({})", static_cast<int>(code), msg);
  FUZZ_CHECK(!msg.empty(), "empty error message");
}

/// The bytes of a view's elements (row-major index order), for bitwise comparisons.
inline std::vector<unsigned char> element_bytes(const TensorView& v) {
  std::vector<unsigned char> out;
  if (!v.data) return out;
  const std::int64_t es = esize(v.dtype);
  for_each_offset(v, [&](std::int64_t, std::int64_t o) {
    const auto* p = static_cast<const unsigned char*>(v.data) + o * es;
    out.insert(out.end(), p, p + es);
  });
  return out;
}

/// A caller workspace for a queried size: 0-4 none (ctx.allocator), 5 exactly the size, 6 larger
/// and at an odd address (the library rounds the base up), 7 one byte short (an error when the
/// size is not 0). The block is exactly as large as handed out, so ASan sees any overrun.
struct DeformWorkspace {
  std::unique_ptr<unsigned char[]> block;
  Workspace ws;
  bool short_by_one = false;
};

inline void make_deform_workspace(int pick, std::size_t bytes, DeformWorkspace* w) {
  if (pick < 5 || bytes == 0) return;
  const std::size_t skew = pick == 6 ? 3 : 0, extra = pick == 6 ? 61 : 0;
  const std::size_t handed = pick == 7 ? bytes - 1 : bytes + extra;
  w->block.reset(new unsigned char[handed + skew]);
  w->ws = Workspace{w->block.get() + skew, handed};
  w->short_by_one = pick == 7;
}

}  // namespace fuzz
}  // namespace detops
