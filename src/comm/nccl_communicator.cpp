// NcclCommunicator (detops/nccl.h): the all-gather of detops collectives over a borrowed
// ncclComm_t. Host code only (NCCL and CUDA runtime calls, no kernels), compiled by the C++
// compiler.
#include "detops/nccl.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>

#include "internal/common.h"

namespace detops {
namespace {

[[noreturn]] void nccl_fail(ncclResult_t result, const char* what, ncclComm_t comm, int rank, int size) {
  std::string detail;
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  // System and remote errors carry their cause (a socket, a peer) only in the last-error text.
  if (result == ncclSystemError || result == ncclRemoteError) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') detail = fmt::format(": {}", last);
  }
#else
  (void)comm;
#endif
  internal::fail(ErrorCode::kCommunication, "nccl rank {} of {}: {} failed: {} (ncclResult_t {}){}", rank, size,
                 what, ncclGetErrorString(result), static_cast<int>(result), detail);
}

/// NCCL calls on a non-blocking communicator may return ncclInProgress; poll the communicator's
/// state until the call has completed or failed.
ncclResult_t settle(ncclComm_t comm, ncclResult_t result) {
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  while (result == ncclInProgress) {
    std::this_thread::yield();
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    result = query != ncclSuccess ? query : state;
  }
#else
  (void)comm;
#endif
  return result;
}

void cuda_check(cudaError_t status, const char* what, int rank, int size) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so the caller's next call starts clean
  const ErrorCode code = status == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kCudaError;
  internal::fail(code, "nccl rank {} of {}: {} failed: {} ({})", rank, size, what, cudaGetErrorString(status),
                 cudaGetErrorName(status));
}

/// Makes the communicator's device current for a scope; restores the caller's afterwards.
class CurrentDevice {
 public:
  CurrentDevice(int device, int rank, int size) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice", rank, size);
    if (previous_ != device) cuda_check(cudaSetDevice(device), "cudaSetDevice", rank, size);
  }
  ~CurrentDevice() {
    int now = 0;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

NcclCommunicator::NcclCommunicator(ncclComm_t comm) : comm_(comm) {
  if (comm == nullptr) internal::fail(ErrorCode::kInvalidArgument, "NcclCommunicator: comm is null");
  ncclResult_t result = settle(comm_, ncclCommCount(comm_, &size_));
  if (result != ncclSuccess) nccl_fail(result, "ncclCommCount", comm_, -1, -1);
  result = settle(comm_, ncclCommUserRank(comm_, &rank_));
  if (result != ncclSuccess) nccl_fail(result, "ncclCommUserRank", comm_, -1, size_);
  result = settle(comm_, ncclCommCuDevice(comm_, &device_));
  if (result != ncclSuccess) nccl_fail(result, "ncclCommCuDevice", comm_, rank_, size_);
}

NcclCommunicator::~NcclCommunicator() {
  // Pending work (a failed peer's hung gather) does not block this: the stream is released once
  // its work is done.
  if (staging_stream_ != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(staging_stream_));
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t bytes, Device device,
                                  void* cuda_stream) {
  if (device.is_cuda() && device.index != device_)
    internal::fail(ErrorCode::kInvalidArgument,
                   "NcclCommunicator::all_gather: buffers on {}; the NCCL communicator (rank {} of {}) is on cuda:{}",
                   to_string(device), rank_, size_, device_);
  if (bytes == 0) return;  // every rank passes the same bytes, so every rank returns here
  if (device.is_cuda())
    gather_device(send, recv, bytes, cuda_stream);
  else
    gather_host(send, recv, bytes);
}

void NcclCommunicator::gather_device(const void* send, void* recv, std::size_t bytes, void* stream) {
  CurrentDevice current(device_, rank_, size_);
  const ncclResult_t result =
      settle(comm_, ncclAllGather(send, recv, bytes, ncclUint8, comm_, static_cast<cudaStream_t>(stream)));
  if (result != ncclSuccess) nccl_fail(result, "ncclAllGather", comm_, rank_, size_);
}

void NcclCommunicator::gather_host(const void* send, void* recv, std::size_t bytes) {
  if (bytes > std::numeric_limits<std::size_t>::max() / (static_cast<std::size_t>(size_) + 1))
    internal::fail(ErrorCode::kInvalidArgument, "NcclCommunicator::all_gather: {} bytes from {} ranks overflow size_t",
                   bytes, size_);
  CurrentDevice current(device_, rank_, size_);
  if (staging_stream_ == nullptr) {
    cudaStream_t created = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", rank_, size_);
    staging_stream_ = created;
  }
  const auto stream = static_cast<cudaStream_t>(staging_stream_);

  // NCCL runs the operations of one communicator in the order they are issued, whatever their
  // streams (each launch waits for the previous one on the communicator's internal stream), so
  // this gather on the staging stream follows a gather enqueued earlier on the op's stream on
  // every rank alike: no reordering between ranks, and no cycle (that gather never waits for
  // this stream). It does make the host wait here until that earlier gather has run.
  // One device buffer: this rank's bytes, then the gathered size * bytes.
  const std::size_t gathered = bytes * static_cast<std::size_t>(size_);
  unsigned char* buffer = nullptr;
  cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&buffer), bytes + gathered, stream), "cudaMallocAsync", rank_,
             size_);
  struct Release {  // on every exit, errors included; freed in stream order
    unsigned char* ptr;
    cudaStream_t stream;
    ~Release() { (void)cudaFreeAsync(ptr, stream); }
  } release{buffer, stream};

  cuda_check(cudaMemcpyAsync(buffer, send, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (to device)",
             rank_, size_);
  const ncclResult_t result = settle(comm_, ncclAllGather(buffer, buffer + bytes, bytes, ncclUint8, comm_, stream));
  if (result != ncclSuccess) nccl_fail(result, "ncclAllGather", comm_, rank_, size_);

  // Wait for the gather by polling, not by a blocking copy or synchronize: a peer that failed
  // leaves the NCCL kernel waiting forever, and only ncclCommGetAsyncError tells.
  for (int spins = 0;; ++spins) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) break;
    if (state != cudaErrorNotReady) cuda_check(state, "cudaStreamQuery", rank_, size_);
    ncclResult_t async = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &async);
    if (query != ncclSuccess) nccl_fail(query, "ncclCommGetAsyncError", comm_, rank_, size_);
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    if (async == ncclInProgress) async = ncclSuccess;
#endif
    if (async != ncclSuccess) nccl_fail(async, "ncclAllGather (asynchronous error)", comm_, rank_, size_);
    if (spins < 1000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  cuda_check(cudaMemcpyAsync(recv, buffer + bytes, gathered, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync (to host)", rank_, size_);
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", rank_, size_);
}

}  // namespace detops
