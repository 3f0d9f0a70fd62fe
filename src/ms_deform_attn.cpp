// Multi-scale deformable attention entry points: validate every argument, read and check the
// level table (spatial_shapes, level_start_index) on the host, then hand an MsdaCall to the CPU or
// CUDA backend. Nothing is allocated, launched or written before the checks pass.
#include "detops/ms_deform_attn.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "internal/backend.h"
#include "internal/common.h"
#include "internal/ms_deform_attn_backend.h"
#include "internal/scratch.h"
#include "internal/validate.h"

namespace detops {

namespace {

using internal::check_same_device;
using internal::check_tensor;
using internal::fail;
using internal::sizes_str;
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;

constexpr internal::OpBackends<internal::MsdaBackend> kBackends{&internal::kMsDeformAttnCpu,
                                                                DETOPS_CUDA_BACKEND(internal::kMsDeformAttnCuda)};

const internal::MsdaBackend& backend(const internal::MsdaCall& call) {
  return internal::backend_for(kBackends, call.value.device, call.op);
}

void check_dtype(const char* op, const char* name, const TensorView& v, DType want) {
  if (v.dtype != want) fail(kBad, "{}: {} has dtype {}; expected {}", op, name, dtype_name(v.dtype), dtype_name(want));
}

/// A small tensor that may live on the host or on value's device.
void check_host_or_same_device(const char* op, const char* name, const TensorView& v, const TensorView& value) {
  if (!v.device.is_cpu()) check_same_device(op, name, v, "value", value);
}

void check_sizes(const char* op, const char* name, const TensorView& v, std::initializer_list<std::int64_t> want,
                 const char* what) {
  int d = 0;
  bool same = true;
  for (std::int64_t w : want) same = same && v.sizes[d++] == w;
  if (!same) {
    std::string s = "[";
    d = 0;
    for (std::int64_t w : want) s += (d++ ? ", " : "") + std::to_string(w);
    fail(kBad, "{}: {} has sizes {}; expected {} = {}]", op, name, sizes_str(v), what, s);
  }
}

/// The inputs every entry point takes; fills the call's views and shape (not the levels).
void check_inputs(internal::MsdaCall& c, const TensorView& value, const TensorView& spatial_shapes,
                  const TensorView& level_start_index, const TensorView& loc, const TensorView& attn) {
  const char* op = c.op;
  check_tensor(op, "value", value, 4);
  internal::check_floating(op, "value", value);
  check_tensor(op, "spatial_shapes", spatial_shapes, 2);
  check_dtype(op, "spatial_shapes", spatial_shapes, DType::kInt64);
  if (spatial_shapes.sizes[1] != 2)
    fail(kBad, "{}: spatial_shapes has sizes {}; expected [L, 2] rows (H, W)", op, sizes_str(spatial_shapes));
  check_host_or_same_device(op, "spatial_shapes", spatial_shapes, value);
  const std::int64_t L = spatial_shapes.sizes[0];
  check_tensor(op, "level_start_index", level_start_index, 1);
  check_dtype(op, "level_start_index", level_start_index, DType::kInt64);
  check_sizes(op, "level_start_index", level_start_index, {L}, "[L]");
  check_host_or_same_device(op, "level_start_index", level_start_index, value);
  check_tensor(op, "sampling_locations", loc, 6);
  if (loc.dtype != value.dtype && loc.dtype != DType::kFloat32 && loc.dtype != DType::kFloat64)
    fail(kBad, "{}: sampling_locations has dtype {}; expected float32, float64 or {} (the dtype of value)", op,
         dtype_name(loc.dtype), dtype_name(value.dtype));
  const std::int64_t B = value.sizes[0], S = value.sizes[1], M = value.sizes[2], D = value.sizes[3];
  const std::int64_t Q = loc.sizes[1], P = loc.sizes[4];
  check_sizes(op, "sampling_locations", loc, {B, Q, M, L, P, 2}, "[B, Q, M, L, P, 2]");
  check_same_device(op, "sampling_locations", loc, "value", value);
  check_tensor(op, "attention_weights", attn, 5);
  check_sizes(op, "attention_weights", attn, {B, Q, M, L, P}, "[B, Q, M, L, P]");
  check_dtype(op, "attention_weights", attn, value.dtype);
  check_same_device(op, "attention_weights", attn, "value", value);
  c.value = value;
  c.spatial_shapes = spatial_shapes;
  c.level_start_index = level_start_index;
  c.sampling_locations = loc;
  c.attention_weights = attn;
  c.shape = {B, S, M, D, Q, L, P};
}

/// [B, Q, M * D] in value's dtype (output, grad_output).
void check_rows(const internal::MsdaCall& c, const char* name, const TensorView& v) {
  const detail::MsdaShape& s = c.shape;
  check_tensor(c.op, name, v, 3);
  check_sizes(c.op, name, v, {s.B, s.Q, s.M * s.D}, "[B, Q, M * D]");
  check_dtype(c.op, name, v, c.value.dtype);
  check_same_device(c.op, name, v, "value", c.value);
}

/// Reads the level table to the host (one wait for device tensors) and checks it: H, W >= 0,
/// H * W without overflow, level_start_index the exclusive prefix sum of H * W, and the sum S.
void read_levels(internal::MsdaCall& c, const Context& ctx) {
  const char* op = c.op;
  const std::int64_t L = c.shape.L;
  std::vector<std::int64_t> shapes(static_cast<std::size_t>(2 * L)), starts(static_cast<std::size_t>(L));
  if (L > 0) {
    if (c.spatial_shapes.device.is_cpu() && c.level_start_index.device.is_cpu()) {
      internal::kMsDeformAttnCpu.read_levels(c, shapes.data(), starts.data(), ctx);
    } else {
      backend(c).read_levels(c, shapes.data(), starts.data(), ctx);
    }
  }
  c.levels.resize(static_cast<std::size_t>(L));
  std::int64_t total = 0;
  for (std::int64_t l = 0; l < L; ++l) {
    const std::int64_t H = shapes[2 * l], W = shapes[2 * l + 1];
    if (H < 0 || W < 0)
      fail(kBad, "{}: spatial_shapes[{}] is ({}, {}); expected H >= 0 and W >= 0", op, l, H, W);
    if (W > 0 && H > std::numeric_limits<std::int64_t>::max() / W)
      fail(kBad, "{}: spatial_shapes[{}] is ({}, {}); expected H * W to fit in int64", op, l, H, W);
    if (starts[l] != total)
      fail(kBad, "{}: level_start_index[{}] is {}; expected {} (the sum of H * W over the levels before it)", op, l,
           starts[l], total);
    if (H * W > c.shape.S - total)
      fail(kBad, "{}: spatial_shapes gives levels 0..{} {} + {} rows; expected at most S = {} (value's dim 1)", op, l,
           total, H * W, c.shape.S);
    c.levels[l] = {H, W, total};
    total += H * W;
  }
  if (total != c.shape.S)
    fail(kBad, "{}: spatial_shapes gives {} rows in all (sum of H * W); expected S = {} (value's dim 1)", op, total,
         c.shape.S);
}

internal::MsdaCall validate_backward(const char* op, const TensorView& value, const TensorView& spatial_shapes,
                                     const TensorView& level_start_index, const TensorView& loc,
                                     const TensorView& attn, const MsDeformAttnBackwardOptions& b) {
  internal::check_backward_mode(op, kMsDeformAttnCapabilities, b.mode);
  internal::MsdaCall c{};
  c.op = op;
  check_inputs(c, value, spatial_shapes, level_start_index, loc, attn);
  return c;
}

/// Bytes of the backward's workspace layout (without the alignment slack).
std::size_t layout_bytes(const internal::MsdaCall& c, BackwardMode mode) {
  if (mode != BackwardMode::kExact || c.value.numel() == 0 || !internal::msda_has_samples(c.shape)) return 0;
  // one chunk holds at least one plane's records (4 per sample); sized in double first so that a
  // huge problem (broadcast locations can claim any Q) is an error, not an overflow
  const detail::MsdaShape& s = c.shape;
  const double plane_records = 4.0 * static_cast<double>(s.Q) * static_cast<double>(s.L) * static_cast<double>(s.P);
  if (plane_records > static_cast<double>(std::int64_t{1} << 40))
    fail(ErrorCode::kOutOfMemory, "{}: the exact mode would need {} records for one (b, m) plane; expected at most "
         "2^40 (use fewer queries per call)", c.op, plane_records);
  return backend(c).backward_workspace(c, mode);
}

}  // namespace

void ms_deform_attn_forward(const TensorView& value, const TensorView& spatial_shapes,
                            const TensorView& level_start_index, const TensorView& sampling_locations,
                            const TensorView& attention_weights, const TensorView& output, const Context& ctx) {
  internal::MsdaCall c{};
  c.op = "ms_deform_attn_forward";
  check_inputs(c, value, spatial_shapes, level_start_index, sampling_locations, attention_weights);
  check_rows(c, "output", output);
  internal::check_outputs(c.op, {{"output", &output}});
  internal::check_disjoint(c.op, {"output", &output},
                           {{"value", &value}, {"spatial_shapes", &spatial_shapes},
                            {"level_start_index", &level_start_index}, {"sampling_locations", &sampling_locations},
                            {"attention_weights", &attention_weights}});
  c.output = output;
  read_levels(c, ctx);
  if (output.numel() == 0) return;
  backend(c).forward(c, ctx);
}

std::size_t ms_deform_attn_backward_workspace_size(const TensorView& value, const TensorView& spatial_shapes,
                                                   const TensorView& level_start_index,
                                                   const TensorView& sampling_locations,
                                                   const TensorView& attention_weights,
                                                   const MsDeformAttnBackwardOptions& backward, const Context& ctx) {
  internal::MsdaCall c = validate_backward("ms_deform_attn_backward_workspace_size", value, spatial_shapes,
                                           level_start_index, sampling_locations, attention_weights, backward);
  read_levels(c, ctx);
  return internal::workspace_size_with_slack(layout_bytes(c, backward.mode));
}

void ms_deform_attn_backward(const TensorView& value, const TensorView& spatial_shapes,
                             const TensorView& level_start_index, const TensorView& sampling_locations,
                             const TensorView& attention_weights, const TensorView& grad_output,
                             const TensorView& grad_value, const TensorView& grad_sampling_locations,
                             const TensorView& grad_attention_weights, const MsDeformAttnBackwardOptions& backward,
                             const Context& ctx, Workspace workspace) {
  internal::MsdaCall c = validate_backward("ms_deform_attn_backward", value, spatial_shapes, level_start_index,
                                           sampling_locations, attention_weights, backward);
  const char* op = c.op;
  check_rows(c, "grad_output", grad_output);
  if (grad_value.defined()) internal::check_like(op, "grad_value", grad_value, "value", value);
  if (grad_sampling_locations.defined())
    internal::check_like(op, "grad_sampling_locations", grad_sampling_locations, "sampling_locations",
                         sampling_locations);
  if (grad_attention_weights.defined())
    internal::check_like(op, "grad_attention_weights", grad_attention_weights, "attention_weights",
                         attention_weights);
  internal::check_outputs(op, {{"grad_value", &grad_value},
                               {"grad_sampling_locations", &grad_sampling_locations},
                               {"grad_attention_weights", &grad_attention_weights}});
  for (const internal::NamedView out : {internal::NamedView{"grad_value", &grad_value},
                                        internal::NamedView{"grad_sampling_locations", &grad_sampling_locations},
                                        internal::NamedView{"grad_attention_weights", &grad_attention_weights}}) {
    internal::check_disjoint(op, out,
                             {{"value", &value}, {"spatial_shapes", &spatial_shapes},
                              {"level_start_index", &level_start_index}, {"sampling_locations", &sampling_locations},
                              {"attention_weights", &attention_weights}, {"grad_output", &grad_output}});
  }
  c.grad_output = grad_output;
  c.grad_value = grad_value;
  c.grad_sampling_locations = grad_sampling_locations;
  c.grad_attention_weights = grad_attention_weights;
  read_levels(c, ctx);
  const std::size_t bytes = grad_value.defined() ? layout_bytes(c, backward.mode) : 0;
  const internal::Scratch scratch(op, bytes, value.device, ctx, workspace,
                                  {{"value", &value}, {"spatial_shapes", &spatial_shapes},
                                   {"level_start_index", &level_start_index},
                                   {"sampling_locations", &sampling_locations},
                                   {"attention_weights", &attention_weights}, {"grad_output", &grad_output},
                                   {"grad_value", &grad_value}, {"grad_sampling_locations", &grad_sampling_locations},
                                   {"grad_attention_weights", &grad_attention_weights}},
                                  "ms_deform_attn_backward_workspace_size");
  const bool any = (grad_value.defined() && grad_value.numel() > 0) ||
                   (grad_sampling_locations.defined() && grad_sampling_locations.numel() > 0) ||
                   (grad_attention_weights.defined() && grad_attention_weights.numel() > 0);
  if (!any) return;
  backend(c).backward(c, backward.mode, ctx, scratch.workspace(bytes));
}

}  // namespace detops
