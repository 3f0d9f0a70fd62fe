// 04_ms_deform_attn: multi-scale deformable attention (Deformable DETR) forward and exact
// backward on caller-owned memory, with the level table the DETR codebases pass. Checks its own
// result and exits nonzero when a check fails:
//   * value is constant per head, every sample lies inside its level and the attention weights of
//     a (query, head) sum to 1, so each output channel equals its head's constant;
//   * grad_value sums, per head and channel, to the sum of grad_output over the queries (the
//     bilinear weights of a sample add to 1);
//   * the exact backward gives the same bytes on a second run with another thread count.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <detops/detops.h>

int main() {
  using namespace detops;
  // [readme:ms_deform_attn]
  constexpr std::int64_t B = 1, M = 2, D = 4, L = 2, P = 2, Q = 3;  // heads, channels per head, levels, points
  std::vector<std::int64_t> shapes = {8, 8, 4, 4};  // (H, W) per level
  std::vector<std::int64_t> starts = {0, 64};        // first row of each level in value
  constexpr std::int64_t S = 8 * 8 + 4 * 4;
  std::vector<float> value(B * S * M * D), locations(B * Q * M * L * P * 2), weights(B * Q * M * L * P, 0.25f);
  for (std::int64_t i = 0; i < B * S * M * D; ++i) value[i] = (i / D) % M == 0 ? 1.5f : -2.0f;  // per head
  for (std::int64_t i = 0; i < B * Q * M * L * P * 2; ++i) locations[i] = 0.2f + 0.6f * float(i % 7) / 7.0f;
  std::vector<float> out(B * Q * M * D), grad_out(B * Q * M * D, 1.0f), grad_value(value.size()),
      grad_loc(locations.size()), grad_weights(weights.size());
  TensorView v(value.data(), DType::kFloat32, Device::cpu(), {B, S, M, D});
  TensorView spatial_shapes(shapes.data(), DType::kInt64, Device::cpu(), {L, 2});
  TensorView level_start_index(starts.data(), DType::kInt64, Device::cpu(), {L});
  TensorView loc(locations.data(), DType::kFloat32, Device::cpu(), {B, Q, M, L, P, 2});  // (x, y) in [0, 1]
  TensorView attn(weights.data(), DType::kFloat32, Device::cpu(), {B, Q, M, L, P});
  TensorView output(out.data(), DType::kFloat32, Device::cpu(), {B, Q, M * D});
  TensorView grad_output(grad_out.data(), DType::kFloat32, Device::cpu(), {B, Q, M * D});
  TensorView gv(grad_value.data(), DType::kFloat32, Device::cpu(), {B, S, M, D});
  TensorView gl(grad_loc.data(), DType::kFloat32, Device::cpu(), {B, Q, M, L, P, 2});
  TensorView ga(grad_weights.data(), DType::kFloat32, Device::cpu(), {B, Q, M, L, P});

  ms_deform_attn_forward(v, spatial_shapes, level_start_index, loc, attn, output);

  MsDeformAttnBackwardOptions bwd;  // BackwardMode::kExact is the default
  std::vector<unsigned char> scratch(
      ms_deform_attn_backward_workspace_size(v, spatial_shapes, level_start_index, loc, attn, bwd));
  ms_deform_attn_backward(v, spatial_shapes, level_start_index, loc, attn, grad_output, gv, gl, ga, bwd, Context{},
                          Workspace{scratch.data(), scratch.size()});
  // [/readme:ms_deform_attn]

  int failures = 0;
  for (std::int64_t i = 0; i < B * Q * M * D; ++i) {
    const float expect = (i / D) % M == 0 ? 1.5f : -2.0f;
    if (std::fabs(out[i] - expect) > 1e-5f) ++failures;
  }
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t d = 0; d < D; ++d) {
      double sum = 0;
      for (std::int64_t s = 0; s < S; ++s) sum += grad_value[(s * M + m) * D + d];
      if (std::fabs(sum - double(Q)) > 1e-5) {  // each query's weights sum to 1, grad_output is 1
        std::printf("head %lld channel %lld: grad_value sums to %.9g, expected %lld\n", (long long)m, (long long)d,
                    sum, (long long)Q);
        ++failures;
      }
    }

  // Exact mode: the same bytes on every run and thread count.
  std::vector<float> again(grad_value.size(), -1.0f);
  Context one_thread;
  one_thread.num_threads = 1;
  ms_deform_attn_backward(v, spatial_shapes, level_start_index, loc, attn, grad_output,
                          TensorView(again.data(), DType::kFloat32, Device::cpu(), {B, S, M, D}), {}, {}, bwd,
                          one_thread);
  const bool same = std::memcmp(again.data(), grad_value.data(), again.size() * sizeof(float)) == 0;
  if (!same) ++failures;

  std::printf("04_ms_deform_attn: output[0] = %g, workspace %zu bytes, exact backward %s; %s\n", out[0],
              scratch.size(), same ? "same bytes twice" : "DIFFERENT bytes", failures ? "FAILED" : "ok");
  return failures == 0 ? 0 : 1;
}
