// Argument checks shared by every op's entry point. Each raises detops::Error (kInvalidArgument)
// with "<op>: <argument> <what was given>; expected <what>".
#pragma once

#include <string>

#include "detops/tensor.h"

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

}  // namespace internal
}  // namespace detops
