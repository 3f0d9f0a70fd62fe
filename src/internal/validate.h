// Argument checks shared by every op's entry point. Each raises detops::Error (kInvalidArgument)
// with "<op>: <argument> <what was given>; expected <what>".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "detops/backward_mode.h"
#include "detops/tensor.h"
#include "internal/scratch.h"

namespace detops {
namespace internal {

bool is_floating(DType t);
std::string sizes_str(const TensorView& v);
/// Rank, non-negative sizes and strides, non-null data when non-empty, a valid device index.
void check_tensor(const char* op, const char* name, const TensorView& v, int rank);
/// Outputs must not have two indices that alias one element (they are written in parallel).
void check_non_overlapping(const char* op, const char* name, const TensorView& v);
void check_same_device(const char* op, const char* name, const TensorView& v, const char* ref_name,
                       const TensorView& ref);
/// `out` either is `in` exactly (same data and strides: an in-place call) or shares no byte with it.
void check_no_partial_overlap(const char* op, const char* out_name, const TensorView& out, const char* in_name,
                              const TensorView& in, bool allow_in_place);

/// a * b + c in int64 into *out, or false when a step does not fit: size arithmetic from options
/// (padding, dilation, pooled sizes) checked as TensorView's own sizes are.
bool checked_affine(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t* out);
/// The product of non-negative factors into *out (0 when one is 0, whatever the others), or false
/// when it does not fit in int64.
bool checked_product(std::initializer_list<std::int64_t> factors, std::int64_t* out);

/// `mode` is one of the backward modes `caps` offers; the error names the ones it does.
void check_backward_mode(const char* op, const OpCapabilities& caps, BackwardMode mode);
/// A floating dtype (float32, float64, float16, bfloat16).
void check_floating(const char* op, const char* name, const TensorView& v);
/// `v` has the rank, sizes, dtype and device of `ref` (an x-like argument).
void check_like(const char* op, const char* name, const TensorView& v, const char* ref_name, const TensorView& ref);
/// `out` shares no byte with any defined view of `others` (not even as an exact alias).
void check_disjoint(const char* op, NamedView out, std::initializer_list<NamedView> others);
/// Outputs written together: each non-overlapping in itself, and no two sharing a byte.
void check_outputs(const char* op, std::initializer_list<NamedView> outputs);

}  // namespace internal
}  // namespace detops
