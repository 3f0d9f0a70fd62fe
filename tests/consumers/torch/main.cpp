// LibTorch C++ consumer of the op library (no Python): calls torch.ops.detops.roi_align through
// the dispatcher with autograd, trains a few SGD steps through it, and checks that the loss goes
// down, that gradients are the same bits over two runs and over 1 and 2 threads (exact mode), that
// the adapter header gives the op's bits, and that a bad argument is a c10::ValueError.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "detops/roi_align.h"
#include "detops/torch.h"

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

using RoiAlignFn = at::Tensor(const at::Tensor&, const at::Tensor&, double, int64_t, int64_t, int64_t, bool,
                              c10::string_view, c10::string_view);

at::Tensor roi_align(const at::Tensor& input, const at::Tensor& rois, const char* mode) {
  // The registration lives in the linked op library; findSchemaOrThrow fails if it is not loaded.
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("detops::roi_align", "").typed<RoiAlignFn>();
  return op.call(input, rois, 0.5, 4, 4, /*sampling_ratio=*/0, /*aligned=*/true, mode, "float16");
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

struct Run {
  std::vector<double> losses;
  std::vector<at::Tensor> grads;  // the feature map's gradient at every step
};

// A learnable feature map pooled over fixed boxes, fitted to a target by plain SGD.
Run train(int threads, const char* mode, int steps = 5) {
  at::set_num_threads(threads);
  at::manual_seed(0);
  at::Tensor features = at::randn({2, 8, 32, 32}, at::kFloat).set_requires_grad(true);
  at::Tensor rois = at::tensor({0.f, 2.f, 3.f, 40.f, 50.f, 1.f, 10.f, 0.f, 63.f, 30.f, 0.f, 5.f, 5.f, 9.f, 60.f,
                                1.f, 0.f, 0.f, 63.f, 63.f, 0.f, 30.f, 30.f, 34.f, 33.f})
                       .reshape({5, 5});
  at::Tensor target = at::randn({5, 8, 4, 4}, at::kFloat);
  Run run;
  for (int step = 0; step < steps; ++step) {
    at::Tensor loss = (roi_align(features, rois, mode) - target).pow(2).mean();
    at::Tensor grad = torch::autograd::grad({loss}, {features})[0];
    run.losses.push_back(loss.item<double>());
    run.grads.push_back(grad.clone());
    at::NoGradGuard no_grad;
    features.sub_(grad, /*alpha=*/50.0);
  }
  return run;
}

}  // namespace

int main() {
  // Training through the dispatcher and autograd.
  const Run a = train(1, "exact");
  std::printf("losses:");
  for (double l : a.losses) std::printf(" %.6f", l);
  std::printf("\n");
  bool decreasing = true;
  for (size_t i = 1; i < a.losses.size(); ++i) decreasing = decreasing && a.losses[i] < a.losses[i - 1];
  check(decreasing, "the loss goes down at every SGD step");

  // Bitwise reproducibility of the exact backward: a second run, and a run on 2 threads.
  for (int threads : {1, 2}) {
    const Run b = train(threads, "exact");
    bool same = b.losses == a.losses;
    for (size_t i = 0; i < a.grads.size(); ++i) same = same && same_bits(a.grads[i], b.grads[i]);
    check(same, "exact mode: losses and gradients bitwise equal to run 1 (" + std::to_string(threads) + " thread(s))");
  }
  // The other modes train too (values differ from exact by rounding only).
  const Run t = train(1, "truncated");
  check(t.losses.back() < t.losses.front(), "truncated mode trains");

  // The adapter header gives the same bits as the registered op.
  at::manual_seed(1);
  at::Tensor input = at::randn({1, 3, 12, 12}, at::kDouble).contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor rois = at::tensor({0.0, 1.0, 1.0, 20.0, 18.0}, at::kDouble).reshape({1, 5});
  at::Tensor via_op = roi_align(input, rois, "exact");
  at::Tensor direct = at::empty({1, 3, 4, 4}, input.options());
  detops::RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 4;
  o.spatial_scale = 0.5;
  o.sampling_ratio = 0;
  o.aligned = true;
  detops::torch::guarded([&] {
    detops::roi_align_forward(detops::torch::view(input, "input"), detops::torch::view(rois, "rois"),
                              detops::torch::view(direct, "output"), o, detops::torch::context(input));
  });
  check(same_bits(via_op, direct), "adapter (channels_last view, no copy) == dispatcher op, bitwise");

  // Errors: a bad mode string fails in the forward as c10::ValueError with detops' message.
  bool value_error = false;
  try {
    roi_align(input, rois, "fastest");
  } catch (const c10::ValueError& e) {
    value_error = std::string(e.what()).find("backward_mode is 'fastest'") != std::string::npos;
  }
  check(value_error, "a bad backward_mode raises c10::ValueError naming it");

  std::printf("%s\n", failures == 0 ? "PASSED" : "FAILED");
  return failures == 0 ? 0 : 1;
}
