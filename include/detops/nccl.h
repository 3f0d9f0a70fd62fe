// NcclCommunicator: detops collectives (SyncBatchNorm) over a caller-owned NCCL communicator, for
// CUDA ranks. Optional component: link detops::nccl (built with the CUDA backend when CMake finds
// nccl.h and libnccl; DETOPS_NCCL=AUTO/ON/OFF).
//
//   ncclComm_t nccl;                                   // created by the caller, e.g. with
//   ncclCommInitRank(&nccl, world, id, rank);          // ncclGetUniqueId + MPI_Bcast of the id
//   detops::NcclCommunicator comm(nccl);               // borrows it
//   detops::Context ctx;  ctx.cuda_stream = stream;    // the collective is ordered on this stream
//   detops::sync_batch_norm_forward(x, params, y, save_mean, save_invstd, &comm, {}, ctx);
//   ...                                                // destroy comm before ncclCommDestroy
//
// Determinism: the only collective is ncclAllGather of bytes (ncclUint8), which performs no
// arithmetic, so results do not depend on NCCL_ALGO, NCCL_PROTO, NVLS, CollNet, the channel count,
// the topology or the NCCL version: every rank receives the same bytes and merges them itself in
// rank order.
//
// Memory: device buffers (accepts_device_memory() is true) go straight to ncclAllGather on the
// caller's stream, asynchronously. Host buffers (Device::cpu(), e.g. SyncBatchNorm on CPU tensors
// over a NCCL communicator) are staged through a temporary device buffer on the communicator's
// device: copied in, gathered and copied back on an internal stream, and the call returns when
// recv is complete (as the Communicator contract asks for host memory).
//
// Failures: ncclResult_t errors are thrown as detops::Error(kCommunication) with
// ncclGetErrorString and, for ncclSystemError and ncclRemoteError, ncclGetLastError's detail; CUDA
// errors of the staging path as Error(kCudaError). While waiting for a staged gather the call polls
// ncclCommGetAsyncError, so a peer that failed is reported instead of waiting forever; the NCCL
// communicator is then unusable and the caller must ncclCommAbort it (detops never aborts or
// destroys a communicator it does not own). Device-memory gathers do not wait: their asynchronous
// errors surface in the caller's own ncclCommGetAsyncError checks or stream synchronization.
#pragma once

#include <nccl.h>

#include "detops/communicator.h"

namespace detops {

class NcclCommunicator final : public Communicator {
 public:
  /// Borrows `comm` (not owned; it must outlive this object and is never destroyed or aborted
  /// here). Reads rank and size with ncclCommUserRank / ncclCommCount and the communicator's
  /// device with ncclCommCuDevice. Throws Error(kInvalidArgument) for a null comm,
  /// Error(kCommunication) when NCCL fails.
  explicit NcclCommunicator(ncclComm_t comm);
  /// Releases the staging stream, if one was created. Never touches the NCCL communicator.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  /// Device buffers (device must be the communicator's device): ncclAllGather(send, recv, bytes,
  /// ncclUint8, comm, cuda_stream), enqueued and not waited for. Host buffers: staged as described
  /// at the top of this file; returns when recv is complete. With a non-blocking communicator
  /// (ncclConfig_t::blocking = 0) an ncclInProgress enqueue is polled to completion. Throws
  /// Error(kInvalidArgument) for a device other than the communicator's, Error(kCommunication)
  /// for NCCL errors, Error(kCudaError) / kOutOfMemory for the staging copies.
  void all_gather(const void* send, void* recv, std::size_t bytes, Device device, void* cuda_stream) override;
  bool accepts_device_memory() const override { return true; }
  const char* name() const override { return "nccl"; }

  /// The borrowed NCCL communicator and its CUDA device ordinal.
  ncclComm_t comm() const { return comm_; }
  int cuda_device() const { return device_; }

 private:
  void gather_device(const void* send, void* recv, std::size_t bytes, void* stream);
  void gather_host(const void* send, void* recv, std::size_t bytes);

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  void* staging_stream_ = nullptr;  // cudaStream_t, created on the first host-memory gather
};

}  // namespace detops
