// detops::Error, the one exception type of the library, and its ErrorCode.
// Messages name the op, the argument, what was expected and what was given, e.g.
//   "roi_align_forward: rois[3] has batch index 2.5; expected an integer in [0, 2)".
#pragma once

#include <stdexcept>
#include <string>

namespace detops {

/// What went wrong, for callers that branch on it. Every Error carries one.
enum class ErrorCode {
  kInvalidArgument,  ///< an argument's shape, dtype, device, layout or value is wrong
  kOutOfMemory,      ///< an allocation failed, or a problem would need more memory than allowed
  kCudaError,        ///< a CUDA runtime call or kernel launch failed
  kNotCompiled,      ///< the backend needed (CUDA, MPI, NCCL) is not part of this build
  kCommunication,    ///< a collective failed or timed out, or the ranks disagree (SyncBatchNorm)
};

/// The exception detops throws. Thrown before any output is written: a failed call leaves its
/// outputs exactly as they were.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace detops
