// The schemas of torch.ops.detops.*: the one TORCH_LIBRARY(detops) block. Kernels are registered
// per dispatch key next to their code (roi_align.cpp, roi_align_rotated.cpp, grid_sample.cpp,
// ms_deform_attn.cpp, deform_conv2d.cpp, frozen_batch_norm.cpp, sync_batch_norm.cpp).
//
// Written to parse on torch 1.13 and 2.x alike: plain `int` sizes (not SymInt), defaults only on
// trailing arguments, so torchvision-style positional calls work unchanged.
//
// Autocast: nothing is registered for the Autocast keys. Ops without an Autocast kernel fall
// through autocast untouched, so under torch.autocast a float16 or bfloat16 input runs natively in
// its own dtype (detops computes in float32 or wider and rounds once), and float32 inputs stay
// float32: nothing is silently up- or down-cast. (torchvision instead casts roi_align's inputs to
// float32 and the output back.) Mixed dtypes that detops does not take (e.g. a float16 input with
// float16 rois is fine, a float32 input with float16 rois is not) raise ValueError.
#include "common.h"

namespace {
// No tensor argument: nothing to dispatch on, so it is defined with its one kernel (catch-all).
int64_t sync_batch_norm_record_words(int64_t channels, c10::string_view mode) {
  return detops::torch::guarded([&] {
    const auto m = detops::torch_ops::parse_sync_mode("detops::sync_batch_norm_record_words", mode);
    return detops::sync_batch_norm_record_words(channels, m);
  });
}
}  // namespace

TORCH_LIBRARY(detops, m) {
  // RoIAlign, average pooling: torchvision's positional order, detops' modes trailing.
  m.def("roi_align(Tensor input, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, "
        "int sampling_ratio, bool aligned, str backward_mode=\"exact\", str truncation=\"float16\") -> Tensor");
  m.def("_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, int pooled_height, "
        "int pooled_width, int batch_size, int channels, int height, int width, int sampling_ratio, "
        "bool aligned, str backward_mode=\"exact\", str truncation=\"float16\", bool channels_last=False) -> Tensor");
  // RoIAlign, max pooling (mmcv pool_mode="max"): argmax is int32, detops' layout.
  m.def("roi_align_max(Tensor input, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, "
        "int sampling_ratio, bool aligned, str backward_mode=\"exact\", str truncation=\"float16\") "
        "-> (Tensor output, Tensor argmax)");
  m.def("_roi_align_max_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
        "int pooled_height, int pooled_width, int batch_size, int channels, int height, int width, "
        "int sampling_ratio, bool aligned, str backward_mode=\"exact\", str truncation=\"float16\", "
        "bool channels_last=False) -> Tensor");

  // RoIAlignRotated: detectron2's positional order (its roi_align_rotated_forward/_backward
  // schemas), then mmcv's options (aligned, clockwise; angle_unit "radians" for its angles) and
  // detops' modes. Rois [K, 6]: (batch_index, cx, cy, w, h, angle).
  m.def("roi_align_rotated(Tensor input, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, "
        "int sampling_ratio, bool aligned=True, bool clockwise=False, str angle_unit=\"degrees\", "
        "str backward_mode=\"exact\", str truncation=\"float16\") -> Tensor");
  m.def("_roi_align_rotated_backward(Tensor grad, Tensor rois, float spatial_scale, int pooled_height, "
        "int pooled_width, int batch_size, int channels, int height, int width, int sampling_ratio, "
        "bool aligned=True, bool clockwise=False, str angle_unit=\"degrees\", str backward_mode=\"exact\", "
        "str truncation=\"float16\", bool channels_last=False) -> Tensor");

  // grid_sample, 2-d: torch.nn.functional.grid_sample's options (its `mode` is `interpolation`
  // here), then detops' backward mode, "exact" or "atomic". The backward op computes the gradients
  // asked for (input_grad, grid_grad) and returns None for the others.
  m.def("grid_sample(Tensor input, Tensor grid, str interpolation=\"bilinear\", str padding_mode=\"zeros\", "
        "bool align_corners=False, str mode=\"exact\") -> Tensor");
  m.def("_grid_sample_backward(Tensor grad_output, Tensor input, Tensor grid, str interpolation, "
        "str padding_mode, bool align_corners, str mode, bool input_grad, bool grid_grad) "
        "-> (Tensor grad_input, Tensor grad_grid)");
  // Multi-scale deformable attention: the argument order of Deformable-DETR's and mmcv's
  // ms_deform_attn_forward (without im2col_step), then the backward mode; the backward op as
  // grid_sample's (value_grad, locations_grad, weights_grad).
  m.def("ms_deform_attn(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
        "Tensor sampling_locations, Tensor attention_weights, str mode=\"exact\") -> Tensor");
  m.def("_ms_deform_attn_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, "
        "Tensor level_start_index, Tensor sampling_locations, Tensor attention_weights, str mode, "
        "bool value_grad, bool locations_grad, bool weights_grad) "
        "-> (Tensor grad_value, Tensor grad_sampling_locations, Tensor grad_attention_weights)");

  // Deformable convolution (v1; v2 with a mask): torchvision::deform_conv2d's schema and order
  // (groups and offset_groups are redundant with the shapes and must agree with them; mask and
  // bias may also be None), then the backward mode. The backward op as grid_sample's: the
  // gradients asked for, None for the others (no bias argument: its gradient sums grad_output).
  m.def("deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor? mask, Tensor? bias, int stride_h, "
        "int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, int offset_groups, "
        "bool use_mask, str mode=\"exact\") -> Tensor");
  m.def("_deform_conv2d_backward(Tensor grad_output, Tensor input, Tensor weight, Tensor offset, Tensor? mask, "
        "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, "
        "int offset_groups, str mode, bool input_grad, bool weight_grad, bool offset_grad, bool mask_grad, "
        "bool bias_grad) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_offset, Tensor grad_mask, "
        "Tensor grad_bias)");

  // FrozenBatchNorm2d.
  m.def("frozen_batch_norm_fold(Tensor weight, Tensor bias, Tensor running_mean, Tensor running_var, "
        "float eps) -> (Tensor scale, Tensor shift)");
  m.def("frozen_batch_norm(Tensor x, Tensor scale, Tensor shift, str epilogue=\"none\", "
        "Tensor? residual=None) -> Tensor");
  m.def("_frozen_batch_norm_backward(Tensor grad_y, Tensor scale, str epilogue, Tensor? y) "
        "-> (Tensor grad_x, Tensor grad_residual)");

  // SyncBatchNorm's phases, driven by detops_torch.distributed with torch.distributed.
  m.def("sync_batch_norm_record_words(int channels, str mode) -> int", &sync_batch_norm_record_words);
  m.def("sync_batch_norm_local_scales(Tensor x, Tensor? grad_y, Tensor? save_mean) -> Tensor");
  m.def("sync_batch_norm_merge_scales(Tensor gathered) -> Tensor");
  m.def("sync_batch_norm_local_stats(Tensor x, str mode, Tensor? scales) -> Tensor");
  // The mode argument is named sync_mode here (mode elsewhere): this op mutates its arguments, and
  // torch.compile wraps such ops in auto_functionalized(_mutable_op, mode?, **kwargs), whose own
  // `mode` parameter collides with an argument of that name (measured on torch 2.11: opcheck's
  // test_aot_dispatch_dynamic failed). Positional calls are unaffected.
  m.def("sync_batch_norm_finalize_stats(Tensor gathered, Tensor? weight, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, float eps, float? momentum, str sync_mode, "
        "Tensor? scales) -> (Tensor save_mean, Tensor save_invstd)");
  m.def("sync_batch_norm_apply(Tensor x, Tensor? weight, Tensor? bias, Tensor save_mean, "
        "Tensor save_invstd) -> Tensor");
  m.def("sync_batch_norm_local_backward(Tensor grad_y, Tensor x, Tensor save_mean, str mode, "
        "Tensor? scales) -> Tensor");
  m.def("sync_batch_norm_finalize_backward(Tensor gathered, int rank, str mode, Tensor save_invstd, "
        "Tensor? scales, bool weight_grad) -> (Tensor sums, Tensor grad_weight, Tensor grad_bias)");
  m.def("sync_batch_norm_backward_apply(Tensor grad_y, Tensor x, Tensor? weight, Tensor save_mean, "
        "Tensor save_invstd, Tensor sums) -> Tensor");
}
