// A non-blocking CUDA stream of the test's own, for the gpu suites: the library's work must be
// ordered on Context::cuda_stream alone, which the legacy default stream (it synchronizes with
// every other stream) would hide. Needs the CUDA runtime: DETOPS_TEST_CUDART builds (the gpu
// suites in a CUDA build, tests/CMakeLists.txt); elsewhere ok() is false and the tests skip.
#pragma once

#if DETOPS_TEST_CUDART
#include <cuda_runtime.h>
#endif

namespace detops {
namespace test {

class NonBlockingStream {
 public:
  NonBlockingStream() {
#if DETOPS_TEST_CUDART
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) stream_ = s;
#endif
  }
  ~NonBlockingStream() {
#if DETOPS_TEST_CUDART
    if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
  }
  NonBlockingStream(const NonBlockingStream&) = delete;
  NonBlockingStream& operator=(const NonBlockingStream&) = delete;

  bool ok() const { return stream_ != nullptr; }
  /// The handle for Context::cuda_stream.
  void* get() const { return stream_; }
  /// Waits for the stream's work (before results are copied with the legacy stream's copies).
  bool synchronize() const {
#if DETOPS_TEST_CUDART
    return stream_ && cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)) == cudaSuccess;
#else
    return false;
#endif
  }

 private:
  void* stream_ = nullptr;
};

}  // namespace test
}  // namespace detops
