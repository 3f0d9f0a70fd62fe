// Each op's capabilities (include/detops/<op>.h: k<Op>Capabilities) and what derives from them:
// the front ends' mode check with its messages (internal::check_backward_mode, used by every
// op's backward), and the workspace queries that exist for the passes marked as taking scratch.
#include <gtest/gtest.h>

#include <string>

#include "detops/detops.h"
#include "internal/validate.h"

namespace detops {
namespace {

std::string rejection(const OpCapabilities& caps, BackwardMode mode) {
  try {
    internal::check_backward_mode("op", caps, mode);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(OpCapabilities, ModesAreStatedOnceAndChecked) {
  for (const OpCapabilities* c : {&kRoiAlignCapabilities, &kRoiAlignRotatedCapabilities}) {
    for (BackwardMode m : kAllBackwardModes) EXPECT_EQ(rejection(*c, m), "") << c->name << " " << to_string(m);
    EXPECT_EQ(rejection(*c, static_cast<BackwardMode>(7)), "op: backward mode 7 is unknown; expected atomic, truncated or exact");
  }
  for (const OpCapabilities* c : {&kGridSampleCapabilities, &kMsDeformAttnCapabilities, &kDeformConv2dCapabilities}) {
    EXPECT_EQ(rejection(*c, BackwardMode::kAtomic), "") << c->name;
    EXPECT_EQ(rejection(*c, BackwardMode::kExact), "") << c->name;
    EXPECT_EQ(rejection(*c, BackwardMode::kTruncated),
              std::string("op: backward mode truncated is not offered by ") + c->name +
                  "; expected atomic or exact (exact is bitwise reproducible)");
    EXPECT_EQ(rejection(*c, static_cast<BackwardMode>(200)), "op: backward mode 200 is unknown; expected atomic or exact");
  }
  EXPECT_FALSE(kGridSampleCapabilities.offers(static_cast<BackwardMode>(9)));  // beyond the 8 bits
}

TEST(OpCapabilities, ThePublicEntryPointsCheckThroughThem) {
  // grid_sample's backward with a mode it does not offer: the message names the modes it does
  Tensor x = Tensor::empty({1, 1, 2, 2}, DType::kFloat32), grid = Tensor::empty({1, 1, 1, 2}, DType::kFloat32);
  Tensor go = Tensor::empty({1, 1, 1, 1}, DType::kFloat32), gi = Tensor::empty({1, 1, 2, 2}, DType::kFloat32);
  GridSampleBackwardOptions b;
  b.mode = BackwardMode::kTruncated;
  try {
    grid_sample_backward(go, x, grid, gi, TensorView(), GridSampleOptions{}, b);
    ADD_FAILURE() << "truncated was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not offered by grid_sample; expected atomic or exact"), std::string::npos)
        << e.what();
  }
  // the passes marked as taking scratch have their query (compiles = exists), the others none
  static_assert(kDeformConv2dCapabilities.forward_workspace && kDeformConv2dCapabilities.backward_workspace);
  static_assert(!kGridSampleCapabilities.forward_workspace && kGridSampleCapabilities.backward_workspace);
  static_assert(!kRoiAlignCapabilities.forward_workspace && kRoiAlignCapabilities.backward_workspace);
  (void)&deform_conv2d_forward_workspace_size;
  (void)&deform_conv2d_backward_workspace_size;
  (void)&grid_sample_backward_workspace_size;
  (void)&ms_deform_attn_backward_workspace_size;
  (void)&roi_align_backward_workspace_size;
  (void)&roi_align_rotated_backward_workspace_size;
}

}  // namespace
}  // namespace detops
